"""What a variant's flags (--dropout, --drop-path, --bn-eps) make of a user's own net: classifier dropout sits
before the classifier wherever the net's last layers are (or is refused where there is no one classifier), and a
per-layer value the spec set itself is replaced with a warning that names it."""

from __future__ import annotations

import warnings

import pytest

import hloforge as hf
from hloforge.core.errors import HloforgeWarning, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.norm import BatchNorm
from hloforge.plugins.layers.pool import GlobalAvgPool
from hloforge.plugins.layers.residual import ResidualStage
from hloforge.zoo import get_net


def kinds(spec: NetSpec) -> list[str]:
    return [layer.kind for layer in spec.layers]


@pytest.mark.parametrize(("layers", "expected"), [
    # a conv classifier pooled at the end (NiN, SqueezeNet): the dropout goes before the 1x1 conv, not on the logits
    ([Conv2d(8, act="relu"), Conv2d(3, k=1), GlobalAvgPool()], ["conv2d", "dropout", "conv2d", "globalAvgPool"]),
    # an activation or a norm after the classifier: still before the classifier
    ([Conv2d(4), GlobalAvgPool(), Dense(3), hf.layers.Act_relu()],
     ["conv2d", "globalAvgPool", "dropout", "dense", "relu"]),
    ([Conv2d(4), BatchNorm(), GlobalAvgPool(), Dense(3), BatchNorm()],
     ["conv2d", "batchNorm", "globalAvgPool", "dropout", "dense", "batchNorm"]),
])
def test_dropout_goes_before_the_classifier_not_the_last_layer(layers, expected) -> None:
    spec = NetSpec("user", (2, 8, 8), layers, 3)
    once = Variant(dropout=0.2).apply_to(spec)
    assert kinds(once) == expected
    assert Variant(dropout=0.2).apply_to(once) == once  # idempotent: the train step applies it again
    assert "dropout" in hf.Model(spec, dropout=0.2).summary()


def test_dropout_where_the_last_layer_is_the_classifier_is_as_before() -> None:
    for name, at in (("mnist-mlp", 2), ("resnet-mini", 5), ("unet-mini", 8), ("yolov1-mini", 5)):
        spec = get_net(name)
        assert Variant(dropout=0.1).apply_to(spec).layers[at].kind == "dropout", name
        assert len(Variant(dropout=0.1).apply_to(spec).layers) == len(spec.layers) + 1


def test_dropout_is_refused_where_the_head_is_a_block_with_no_one_classifier() -> None:
    with pytest.raises(UnsupportedSpec, match=r"dropout 0\.1: net 'fpn-mini' has no one classifier layer.*"
                                              r"layer 3 \(fpnDetect\)"):
        Variant(dropout=0.1).apply_to(get_net("fpn-mini"))
    with pytest.raises(UnsupportedSpec, match="no one classifier layer"):
        Variant(dropout=0.1).apply_to(NetSpec("st", (2, 8, 8), [Conv2d(4), ResidualStage(3), GlobalAvgPool()], 3))


def test_a_flag_replaces_the_specs_own_per_layer_value_and_says_so() -> None:
    spec = NetSpec("own", (2, 8, 8), [Conv2d(4), ResidualStage(4, drop_path=0.05, eps=1e-3), ResidualStage(4),
                                      GlobalAvgPool(), hf.layers.Dropout(0.5), Dense(3)], 3)
    own = r"replaces what net 'own' sets itself: "
    for variant, said in ((Variant(drop_path=0.2), rf"drop_path 0\.2 {own}layer 1 \(residualStage\) drop_path 0\.05$"),
                          (Variant(bn_eps=1e-4), r"bn_eps 0\.0001 replaces .*: layer 1 \(residualStage\) eps 0\.001$"),
                          (Variant(dropout=0.3), r"dropout 0\.3 replaces .*: layer 4 \(dropout\) rate 0\.5$")):
        with pytest.warns(HloforgeWarning, match=said):
            once = variant.apply_to(spec)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert variant.apply_to(once) == once  # applied once: nothing more to say
    with pytest.warns(HloforgeWarning):
        assert kinds(Variant(dropout=0.3).apply_to(spec)).count("dropout") == 1  # the rate set, not a second one
    with warnings.catch_warnings():  # a flag equal to the spec's own value replaces nothing: no word
        warnings.simplefilter("error")
        Variant(drop_path=0.05).apply_to(spec)
