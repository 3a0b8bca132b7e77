"""Labels of another shape than class ids, in the two forms a researcher's own data most often has them: one-hot
rows (Keras' to_categorical) and a column vector. The one line says how to get the ids, as the input checks say
how to reshape x. Before: "fit labels have shape [64, 4], expected [64]" and no more."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError

NET = hf.NetSpec("tiny", (8,), [hf.layers.Dense(6, act="relu"), hf.layers.Dense(4)], 4)


ARGMAX = "(one-hot rows of the 4 classes? y.argmax(1) gives the ids)"
COLUMN = "(a trailing axis of 1: y[..., 0] drops it)"


@pytest.mark.parametrize("form,said,fixed", [
    (lambda y: np.eye(4, dtype=np.float32)[y], ARGMAX, lambda y: y.argmax(1)),
    (lambda y: np.eye(4, dtype=np.uint8)[y], ARGMAX, lambda y: y.argmax(1)),
    (lambda y: y[:, None], COLUMN, lambda y: y[..., 0]),
])
def test_one_hot_rows_and_a_column_say_how_to_get_the_ids(form, said, fixed) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 4, 64)
    model = hf.Model(NET)
    for call in (lambda: model.fit(x, form(y), epochs=1, batch_size=16, verbose=False),
                 lambda: model.evaluate(x, form(y))):
        with pytest.raises(DataError) as e:
            call()
        assert str(e.value).endswith(f"expected [64] {said}") and len(str(e.value).splitlines()) == 1
    assert model.evaluate(x, fixed(form(y)))["n"] == 64  # what the line says to do is taken


def test_rows_of_another_width_get_no_hint() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    with pytest.raises(DataError, match=r"fit labels have shape \[64, 5\], expected \[64\]$"):
        hf.Model(NET).fit(x, np.eye(5)[rng.integers(0, 5, 64)], epochs=1, batch_size=16, verbose=False)


SEG = hf.NetSpec("tiny-seg", (3, 4, 4), [hf.layers.Conv2d(3, k=1)], 3)  # per-pixel logits [3, 4, 4]


@pytest.mark.parametrize("form,said,fixed", [
    (lambda m: m[:, None], "(an axis of 1 at 1: y.squeeze(1) drops it)", lambda y: y.squeeze(1)),
    (lambda m: np.eye(3, dtype=np.float32)[m].transpose(0, 3, 1, 2),
     "(one-hot rows of the 3 classes? y.argmax(1) gives the ids)", lambda y: y.argmax(1)),
])
def test_masks_with_a_channel_axis_say_how_to_get_the_ids(form, said, fixed) -> None:
    """Masks as torch's loaders give them ([N, 1, H, W]) or one-hot channels first ([N, C, H, W]); before, 'fit
    labels have shape [8, 1, 4, 4], expected [8, 4, 4]' and no more."""
    rng = np.random.default_rng(0)
    x, masks = rng.standard_normal((8, 3, 4, 4)).astype(np.float32), rng.integers(0, 3, (8, 4, 4))
    model = hf.Model(SEG)
    with pytest.raises(DataError) as e:
        model.fit(x, form(masks), epochs=1, batch_size=4, verbose=False)
    assert str(e.value) == f"fit labels have shape [8, {form(masks).shape[1]}, 4, 4], expected [8, 4, 4] {said}"
    assert np.array_equal(fixed(form(masks)), masks)  # what the line says to do gives the masks back


def test_a_binary_mask_image_of_0_and_255_says_how_to_get_ids() -> None:
    """A mask PNG of 0 and 255, as most binary-segmentation sets store it; before, 'labels span 0..255' alone."""
    rng = np.random.default_rng(0)
    x, masks = rng.standard_normal((8, 3, 4, 4)).astype(np.float32), rng.integers(0, 2, (8, 4, 4))
    with pytest.raises(DataError) as e:
        hf.Model(SEG).fit(x, (masks * 255).astype(np.uint8), epochs=1, batch_size=4, verbose=False)
    assert str(e.value) == ("fit labels span 0..255, expected ids 0..2 (the net's 3 classes; a mask image of 0 and "
                            "255? (y > 0) gives ids 0 and 1)")
    other = np.where(masks, 255, 0)
    other[0, 0, 0] = 1  # ids other than 0 and 255 among them: no hint
    with pytest.raises(DataError, match=r"labels span 0\.\.255, expected ids 0\.\.2 \(the net's 3 classes\)$"):
        hf.Model(SEG).fit(x, other, epochs=1, batch_size=4, verbose=False)


@pytest.mark.parametrize("form,said", [
    (lambda y: y.astype(np.float32), "have dtype float32, expected integer ids (int32) (whole numbers: "
                                     "y.astype(np.int64) gives the ids)"),
    (lambda y: np.array(["cat", "dog", "eel", "fox"])[y], "have dtype <U3, expected integer ids (int32) (class "
                                                          "names? names, y = np.unique(y, return_inverse=True) "
                                                          "numbers them in sorted order)"),
    (lambda y: y + 1, "span 1..4, expected ids 0..3 (the net's 4 classes; counted from 1? y - 1 gives ids 0..3)"),
])
def test_ids_stored_as_floats_class_names_and_ids_counted_from_1_say_how_to_get_the_ids(form, said) -> None:
    """Before: the dtype or the span alone ('fit labels span 1..4, expected ids 0..3 (the net's 4 classes)')."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 4, 64)
    y[:4] = np.arange(4)  # every class present
    with pytest.raises(DataError) as e:
        hf.Model(NET).fit(x, form(y), epochs=1, batch_size=16, verbose=False)
    assert str(e.value) == f"fit labels {said}"
    bools = (y > 1).astype(bool)
    with pytest.raises(DataError, match=r"have dtype bool, expected integer ids \(int32\) \(y\.astype\(np\.int64\) "
                                        r"gives ids 0 and 1\)$"):
        hf.Model(NET).evaluate(x, bools)
    assert np.array_equal(np.unique(np.array(["cat", "dog", "eel", "fox"])[y], return_inverse=True)[1], y)


@pytest.mark.parametrize("loss", ["crossEntropy", "bce"])
def test_ids_0_and_1_for_a_head_of_one_output_say_it_takes_two(loss) -> None:
    """Keras' yes/no head (Dense(1) with a sigmoid): before, 'labels span 0..1, expected ids 0..0 (the net's 1
    classes)' and no more."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 2, 64)
    one = hf.NetSpec("yes-no", (8,), [hf.layers.Dense(1)], 1)
    with pytest.raises(DataError) as e:
        hf.Model(one, loss=loss).fit(x, y, epochs=1, batch_size=16, verbose=False)
    assert str(e.value) == ("fit labels span 0..1, expected ids 0..0 (the net's 1 class; a yes/no head of one output? "
                            "ids 0 and 1 take a head of 2 outputs)")
    two = hf.NetSpec("yes-no", (8,), [hf.layers.Dense(2)], 2)
    assert len(hf.Model(two, loss=loss).fit(x, y, epochs=1, batch_size=16, verbose=False)) == 1  # as it says
