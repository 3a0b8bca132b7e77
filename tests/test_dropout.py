"""Dropout and stochastic-depth masks: per-example inputs drawn on the host, identity in eval."""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.modules import forward_module, train_step_module
from hloforge.core.spec import MaskSlot, NetSpec
from hloforge.core.variant import Variant
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.dropout import Dropout
from hloforge.plugins.layers.transformer import TransformerBlock
from hloforge.testing.gate import gate_layer
from hloforge.train.session import TrainSession, make_backend
from hloforge.train.trainer import TrainConfig, train


def mlp_with_dropout(rate=0.3) -> NetSpec:
    return NetSpec("mlp-dropout", (784,), [Dense(64, act="relu"), Dropout(rate), Dense(10)], 10)


def test_mask_sampling_is_inverted_dropout():
    m = MaskSlot("m", (1000,), 0.25).sample(np.random.default_rng(0), 20)
    assert m.shape == (20, 1000) and set(np.unique(m)) == {0.0, np.float32(1 / 0.75)}
    assert abs(float((m == 0).mean()) - 0.25) < 0.01 and abs(float(m.mean()) - 1.0) < 0.02
    with pytest.raises(UnsupportedSpec, match="rate must be in"):
        MaskSlot("m", (3,), 1.0)


def test_train_step_takes_masks_after_the_labels_and_eval_has_none():
    spec = mlp_with_dropout()
    text, lay = train_step_module(spec, Variant("sgd"), 8)
    assert [n for n, _ in lay.masks] == ["1.mask"]
    assert text.count("tensor<8x64xf32>") >= 1
    assert "8x64" not in forward_module(spec, 8, eval_mode=True).split("{", 2)[1].split(")")[0]


def test_masks_depend_on_seed_and_step_only():
    spec, be = mlp_with_dropout(), make_backend("xla")
    x = np.random.default_rng(0).standard_normal((16, 784)).astype(np.float32)
    y = np.arange(16, dtype=np.int32) % 10
    a, b = (TrainSession(spec, Variant("sgd"), 16, be, seed=1) for _ in range(2))
    assert all(np.array_equal(m, n) for m, n in zip(a.masks_for_step(3), b.masks_for_step(3), strict=True))
    assert not np.array_equal(a.masks_for_step(3)[0], a.masks_for_step(4)[0])
    for s in (a, b):
        for _ in range(3):
            s.train_step(x, y, 0.1)
    pa, pb = a.read_params(), b.read_params()
    assert all(np.array_equal(p, q) for p, q in zip(pa, pb, strict=True))
    # The same init trained under other masks ends elsewhere: the masks are really applied.
    d = TrainSession(spec, Variant("sgd"), 16, be, seed=1, params=spec.init_params(1))
    d.seed = 2
    for _ in range(3):
        d.train_step(x, y, 0.1)
    assert not np.array_equal(d.read_params()[0], pa[0])


def test_drop_path_declares_one_mask_per_residual_branch_and_is_gated():
    blk = TransformerBlock(1, 4, drop_path=0.5)
    assert [(s.name, s.shape) for s in blk.mask_slots((3, 4))] == [("attn.drop", ()), ("mlp.drop", ())]
    assert TransformerBlock(1, 4).mask_slots((3, 4)) == ()
    assert gate_layer(blk, (3, 4)).passed


def test_drop_path_reaches_convnet_stages_with_a_skip():
    """--drop-path on a ResNet / EfficientNet / ConvNeXt: one mask per block that has a skip, as in
    timm (a ResNet block's projection is a skip; an MBConv block that strides has none), and the
    variant's net trains."""
    from hloforge.plugins.layers.mobile import MbConv
    from hloforge.plugins.layers.residual import ResidualStage
    from hloforge.zoo import get_net

    stage = ResidualStage(8, n=3, stride=2, drop_path=0.2)
    assert [s.name for s in stage.mask_slots((4, 8, 8))] == ["b0.drop", "b1.drop", "b2.drop"]
    assert [s.name for s in MbConv(4, n=2, drop_path=0.2).mask_slots((4, 4, 4))] == ["b0.drop", "b1.drop"]
    assert [s.name for s in MbConv(4, n=2, stride=2, drop_path=0.2).mask_slots((4, 4, 4))] == ["b1.drop"]
    with pytest.raises(UnsupportedSpec, match="drop_path must be in"):
        ResidualStage(8, drop_path=1.0).mask_slots((8, 4, 4))
    spec = Variant("sgd", drop_path=0.1).apply_to(get_net("resnet-mini"))
    session = TrainSession(spec, Variant("sgd", drop_path=0.1), 4, make_backend("xla"))
    assert session.layout.masks
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, *spec.input_shape)).astype(np.float32)
    assert np.isfinite(session.train_step(x, np.arange(4) % spec.num_classes, 0.01))


def test_a_gate_that_ignores_the_mask_fails():
    class Leaky(Dropout):
        kind = "dropout"

        def reference(self, params, x, ctx):  # forgets the mask: the oracle disagrees
            return x

    assert not gate_layer(Leaky(0.5), (3, 5)).passed


def test_dropout_net_trains_on_digits(tmp_path):
    spec = tmp_path / "net.toml"
    spec.write_text(mlp_with_dropout().to_toml())
    m = train(TrainConfig(net=str(spec), epochs=3, run_dir=str(tmp_path / "run")), progress=False)
    assert m["top1"] > 0.9
