"""A layer class called without a required option, or with one it does not take (`hf.layers.Dense()`), is
one UnsupportedSpec naming the layer and its options: the line a spec file's layer gets
(hloforge.core.contracts.check_constructor_options), not Python's TypeError. Loss and optimizer classes
alike."""

from __future__ import annotations

import copy
import inspect
import pickle
from typing import Any

import attrs
import pytest

import hloforge as hf
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import Layer, NetSpec, Shape


def _spec_error(layer: dict[str, Any]) -> str:
    with pytest.raises(UnsupportedSpec) as e:
        NetSpec.from_dict({"name": "n", "input_shape": [4], "num_classes": 3, "layers": [layer]})
    return str(e.value)


@pytest.mark.parametrize(("make", "as_spec", "message"), [
    (lambda: hf.layers.Dense(), {"kind": "dense"},
     "layer 'dense' needs option(s) ['units']; its options are ['units', 'act', 'bias']"),
    (lambda: hf.layers.Conv2d(k=3), {"kind": "conv2d", "k": 3},
     "layer 'conv2d' needs option(s) ['out']; its options are ['out', 'k', 'stride', 'pad', 'groups', 'act', 'bias']"),
    (lambda: hf.layers.TransformerBlock(), {"kind": "transformerBlock"},
     "layer 'transformerBlock' needs option(s) ['heads', 'mlp']; its options are"),
    (lambda: hf.layers.PairTile(4), {"kind": "pairTile", "L": 4},  # a positional option counts as given
     "layer 'pairTile' needs option(s) ['D', 'C']; its options are ['L', 'D', 'C', 'p']"),
    (lambda: hf.layers.Dense(3, activation="relu"), {"kind": "dense", "units": 3, "activation": "relu"},
     "layer 'dense' does not take option(s) ['activation']; its options are ['units', 'act', 'bias']"),
], ids=["dense", "conv2d", "transformerBlock", "pairTile", "unknown"])
def test_a_missing_or_unknown_option_is_the_spec_files_line(make, as_spec, message):
    with pytest.raises(UnsupportedSpec) as e:
        make()
    said = str(e.value)
    assert said.startswith(message) and len(said.splitlines()) == 1
    assert _spec_error(as_spec) == f"spec: layer 0: {said}"  # one wording for both ways in


def test_a_call_that_fits_no_constructor_is_one_line_too():
    for make in (lambda: hf.layers.Dense(3, units=3), lambda: hf.layers.Dense(1, "relu", True, 4)):
        with pytest.raises(UnsupportedSpec, match=r"^layer 'dense': Dense\.__init__\(\) (got multiple|takes)"):
            make()


def test_layers_made_rightly_are_unchanged():
    dense = hf.layers.Dense(8, act="relu")
    assert dense == hf.layers.Dense(units=8, act="relu", bias=True) and dense.kind == "dense"
    assert copy.deepcopy(dense) == dense and pickle.loads(pickle.dumps(dense)) == dense
    assert attrs.evolve(dense, units=4).units == 4
    assert hf.layers.PatchEmbed(dim=8, patch=4, cls=True).cls  # an option named like the class's own argument
    assert str(inspect.signature(hf.layers.Dense)).startswith("(units: 'int', act: 'str' = 'identity'")


@attrs.frozen
class _Broken(Layer):
    kind = "brokenForTest"
    n: int

    def __attrs_post_init__(self) -> None:
        raise TypeError("a bug in the layer's own code")

    def out_shape(self, in_shape: Shape) -> Shape:
        return in_shape


def test_a_type_error_of_the_layers_own_code_is_not_taken_for_the_callers():
    with pytest.raises(TypeError, match="a bug in the layer's own code"):
        _Broken(1)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: hf.losses["focalCrossEntropy"](gama=2.0),
     "loss 'focalCrossEntropy' does not take option(s) ['gama']; its options are ['gamma']"),
    (lambda: hf.optimizers["adam"](beta1=0.8),
     "optimizer 'adam' does not take option(s) ['beta1']; its options are ['weight_decay', 'b1', 'b2', 'eps']"),
    (lambda: hf.optimizers["adam"](1, 2, 3, 4, 5),
     "optimizer 'adam': Adam.__init__() takes from 1 to 5 positional arguments but 6 were given"),
], ids=["loss", "optimizer", "optimizer-positional"])
def test_loss_and_optimizer_classes_refuse_alike(make, message):
    with pytest.raises(UnsupportedSpec) as e:
        make()
    assert str(e.value) == message
    assert hf.optimizers["adam"](b1=0.8).b1 == 0.8  # a good call is untouched


def test_a_component_that_takes_no_options_says_so():
    """Was "... does not take option(s) ['foo']; its options are []" (a layer in a spec file, --label-smoothing
    on a language model's loss)."""
    with pytest.raises(UnsupportedSpec) as e:
        hf.losses["tokenCrossEntropy"](label_smoothing=0.1)
    assert str(e.value) == "loss 'tokenCrossEntropy' does not take option(s) ['label_smoothing']; it takes none"
    with pytest.raises(UnsupportedSpec) as e:
        NetSpec.from_dict({"name": "n", "input_shape": [1, 2, 2], "num_classes": 4,
                           "layers": [{"kind": "flatten", "foo": 1}]})
    assert str(e.value).endswith("layer 0: layer 'flatten' does not take option(s) ['foo']; it takes none")
