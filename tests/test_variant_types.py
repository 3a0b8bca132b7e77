"""A Variant built directly checks each numeric field's type before its range: a string, None, a list
or a bool is one line naming the field, the value and what it takes, never a TypeError from `<`."""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.variant import Variant


@pytest.mark.parametrize(("field", "value", "message"), [
    ("weight_decay", "0.5", "weight_decay must be a finite number ≥ 0, or None (the optimizer's own), got '0.5' "
                            "(type str)"),
    ("ema", "0.5", "ema must be a decay in [0, 1) (0: no shadow), got '0.5' (type str)"),
    ("ema", None, "ema must be a decay in [0, 1) (0: no shadow), got None (type NoneType)"),
    ("clip", "1", "clip must be a finite norm ≥ 0 (0: no clipping), got '1' (type str)"),
    ("mixup", "0.2", "mixup must be a finite α ≥ 0 (0: off), got '0.2' (type str)"),
    ("cutmix", None, "cutmix must be a finite α ≥ 0 (0: off), got None (type NoneType)"),
    ("bn_eps", "1e-5", "bn_eps must be a positive number, or None (each layer's own), got '1e-5' (type str)"),
    ("label_smoothing", "0.1", "label_smoothing must be a number in [0, 1), got '0.1' (type str)"),
    ("dropout", [0.1], "dropout must be a number in [0, 1), got [0.1] (type list)"),
    ("drop_path", b"0", "drop_path must be a number in [0, 1), got b'0' (type bytes)"),
    ("accum", "2", "accum must be a positive integer (micro-batches per update), got '2' (type str)"),
    ("accum", 2.0, "accum must be a positive integer (micro-batches per update), got 2.0 (type float)"),
    # a bool is no number (True would otherwise be a weight decay of 1)
    ("weight_decay", True, "weight_decay must be a finite number ≥ 0, or None (the optimizer's own), got True "
                           "(type bool)"),
])
def test_a_wrong_type_is_one_line_naming_field_value_and_type(field, value, message):
    with pytest.raises(UnsupportedSpec) as e:
        Variant("adam", **{field: value})
    assert str(e.value) == message


@pytest.mark.parametrize(("field", "value", "message"), [  # the range messages, for values of the right type
    ("weight_decay", -1.0, "weight_decay must be a finite number ≥ 0, got -1.0"),
    ("mixup", float("inf"), "mixup α must be a finite number ≥ 0 (0: off), got inf"),
    ("bn_eps", 0, "bn_eps must be a positive number, got 0"),
    ("ema", 1.0, "ema decay must be in [0, 1) (0: no shadow), got 1.0"),
    ("accum", 0, "accum must be a positive integer (micro-batches per update), got 0"),
])
def test_a_number_out_of_range_keeps_its_range_message(field, value, message):
    with pytest.raises(UnsupportedSpec) as e:
        Variant("adam", **{field: value})
    assert str(e.value) == message


def test_numbers_of_the_right_type_are_taken():
    v = Variant("adam", weight_decay=0, bn_eps=None, ema=np.float32(0.5), clip=1, mixup=0.2, accum=2)
    assert (v.weight_decay, v.bn_eps, v.accum, v.clip) == (0, None, 2, 1)
    assert v.slug == Variant.parse(v.slug).slug
