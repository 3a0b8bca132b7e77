"""CNN layers beyond the gate: slot names and stat order, refusals, BN train/eval semantics,
the train step's batch statistics, and Grad-CAM.

Every layer here is gated (f64, f32, both BN modes) by tests/test_gate.py, which iterates the registry.
"""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.commands.cam import gradcam, save_overlay
from hloforge.core.cam import cam_module, feature_layer
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder
from hloforge.core.modules import forward_module, train_step_module
from hloforge.core.spec import Ctx, NetSpec, walk_layers
from hloforge.core.variant import Variant
from hloforge.plugins.layers.convnext import ConvNextDownsample, ConvNextStage
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.mobile import MbConv, MbConvV3, SqueezeExcite, Uib
from hloforge.plugins.layers.norm import BatchNorm, ConvBn
from hloforge.plugins.layers.pool import GlobalAvgPool
from hloforge.plugins.layers.residual import BottleneckStage, ResidualStage
from hloforge.testing import gate_cases

jax = pytest.importorskip("jax")


def _client():
    from hloforge.backends.xla import default_client

    return default_client()


def _run(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    exe = _client().compile(text)
    try:
        return [np.asarray(o) for o in exe.run(inputs)]
    finally:
        exe.close()


def tiny_net() -> NetSpec:
    return NetSpec("tiny-bn", (2, 8, 8), [
        ConvBn(4, k=3), ResidualStage(6, n=1, stride=2), MbConvV3(6, mid=8, se=True), GlobalAvgPool(), Dense(3),
    ], 3)


# ------------------------------------------------------------------ names and order
def test_block_slot_names_are_readable_and_unique() -> None:
    (ls,) = walk_layers([ResidualStage(8, n=2, stride=2)], (4, 8, 8))
    names = [s.name for s in ls.slots]
    assert names[:7] == ["b0.conv1.w", "b0.conv1.gamma", "b0.conv1.beta", "b0.conv2.w", "b0.conv2.gamma",
                         "b0.conv2.beta", "b0.down.w"]
    assert "b1.conv2.beta" in names and "b1.down.w" not in names  # the second block keeps an identity skip
    assert [s.name for s in ls.stats][:4] == ["b0.conv1.mean", "b0.conv1.var", "b0.conv2.mean", "b0.conv2.var"]
    assert len(set(names)) == len(names)


STAT_CASES = [c for c in gate_cases() if c.kind == "layer" and c.mode == "eval"]


@pytest.mark.parametrize("case", STAT_CASES, ids=[c.id for c in STAT_CASES])
def test_layers_report_stats_in_declared_order(case) -> None:
    """What the layer writes to ctx.batch_stats, in order, is exactly its stat_slots (qualified_stats reads
    the slots; emit_layers reads the values by name — the two must agree)."""
    (ls,) = walk_layers([case.obj], case.shape)
    b = Builder("f32")
    params = {s.name: b.arg(s.shape) for s in ls.slots}
    ctx = Ctx(train=True)
    case.obj.forward(b, b.arg((2, *case.shape)), params, ctx)
    assert list(ctx.batch_stats) == [s.name for s in ls.stats]
    assert all(ctx.batch_stats[s.name].shape == s.shape for s in ls.stats)


# ------------------------------------------------------------------ bad input: one line, block and rule
@pytest.mark.parametrize("layers, shape, expect", [
    ([ConvBn(8), ResidualStage(16, stride=2)], (1, 7, 7), None),  # 7 → 4 on both paths, as PyTorch's
    ([ConvBn(8), ResidualStage(8, stride=2, project=False)], (1, 7, 7),
     "layer 1 (residualStage(out=8, n=2, stride=2, project=False, eps=1e-05, drop_path=0.0)) on input [8, 7, 7]: "
     "block 0: identity skip gives [8, 7, 7] but the main path gives [8, 4, 4]"),
    ([ResidualStage(16, n=1, project=False)], (8, 4, 4),
     "block 0: identity skip gives [8, 4, 4] but the main path gives [16, 4, 4]"),
    ([ResidualStage(8, n=2, stride=1, project=False)], (8, 4, 4), None),
    ([SqueezeExcite(0)], (8, 4, 4), "squeeze width must be positive, got mid=0 (a zero-width SE)"),
    ([MbConv(8, n=2, stride=2)], (8, 5, 5), None),
    ([BottleneckStage(10)], (8, 4, 4), "expansion 4 must divide out channels 10"),
    ([Uib(8, start_k=0, mid_k=0, stride=2)], (8, 4, 4), "stride 2 needs a depthwise conv to carry it"),
    ([ConvNextDownsample(8)], (4, 7, 7), "block 0: stride 2 does not divide the 7x7 input"),
    ([ConvNextStage(norm="gn")], (4, 4, 4), "norm must be one of ('ln', 'bn'), got 'gn'"),
])
def test_impossible_blocks_are_refused_in_one_line(layers, shape, expect) -> None:
    if expect is None:
        walk_layers(layers, shape)
        return
    with pytest.raises(UnsupportedSpec) as e:
        walk_layers(layers, shape)
    msg = str(e.value)
    assert "\n" not in msg and expect in msg, msg
    assert msg.startswith("layer ")


# ------------------------------------------------------------------ batch norm semantics
def test_batch_norm_train_uses_biased_batch_variance_and_eval_uses_running() -> None:
    spec = NetSpec("bn", (5,), [BatchNorm(eps=1e-3)], 5)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5)) * 3 + 1
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)
    mean, var = rng.standard_normal(5), rng.uniform(0.5, 2.0, 5)
    (y_train,) = _run(forward_module(spec, 4, dtype="f64"), [x, gamma, beta])
    want = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-3) * gamma + beta  # np.var: biased
    np.testing.assert_allclose(y_train, want, rtol=1e-12, atol=1e-12)
    (y_eval,) = _run(forward_module(spec, 4, dtype="f64", eval_mode=True), [x, gamma, beta, mean, var])
    np.testing.assert_allclose(y_eval, (x - mean) / np.sqrt(var + 1e-3) * gamma + beta, rtol=1e-12, atol=1e-12)


def _reference_forward(spec: NetSpec, params, x, ctx_for):
    it = iter(params)
    for ls in spec.walk():
        x = ls.layer.reference({s.name: next(it) for s in ls.slots}, x, ctx_for(ls))
    return x


def test_train_step_returns_batch_stats_in_qualified_order() -> None:
    spec = tiny_net()
    text, lay = train_step_module(spec, Variant("sgd"), 4, dtype="f64")
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s.shape) * 0.5 for _, s in lay.params]
    x = rng.standard_normal(lay.x_shape)
    y = rng.integers(0, 3, lay.y_shape).astype(np.int32)
    state = [np.zeros(s.shape) for _ in lay.state for _, s in lay.params]
    outs = _run(text, [*params, *state, np.zeros(len(lay.scalars)), x, y])
    got_stats = outs[lay.loss_index + 1:]
    assert len(got_stats) == len(lay.stats) == len(spec.stats())

    jax.config.update("jax_enable_x64", True)
    ctxs = {}

    def ctx_for(ls):
        ctxs[ls.index] = Ctx(train=True)
        return ctxs[ls.index]

    logits = _reference_forward(spec, params, x, ctx_for)
    want = [np.asarray(ctxs[int(q.split(".", 1)[0])].batch_stats[q.split(".", 1)[1]]) for q, _ in lay.stats]
    for (name, _), g, w in zip(lay.stats, got_stats, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name)
    lse = np.log(np.exp(np.asarray(logits)).sum(1))
    loss = float(np.mean(lse - np.asarray(logits)[np.arange(4), y]))
    assert outs[lay.loss_index] == pytest.approx(loss, rel=1e-10)


# ------------------------------------------------------------------ Grad-CAM
def _random_state(spec: NetSpec, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s.shape) * 0.5 for _, s in spec.params()]
    running = [s.init + rng.uniform(-0.3, 0.3, s.shape) for _, s in spec.stats()]
    return params, running


def test_cam_module_gradient_matches_jax() -> None:
    jax.config.update("jax_enable_x64", True)
    spec = tiny_net()
    k = feature_layer(spec)
    assert k == 2  # the mbConvV3 block: the last [C, H, W] output before the global pool
    params, running = _random_state(spec)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, *spec.input_shape))
    sel = np.zeros((2, 3))
    sel[0, 1], sel[1, 2] = 1.0, 1.0
    logits, fmap, grad = _run(cam_module(spec, 2, dtype="f64"), [x, *params, *running, sel])

    walk = spec.walk()
    r_it = iter(running)
    run_of = {ls.index: {s.name: next(r_it) for s in ls.stats} for ls in walk}
    p_it = iter(params)
    per = {ls.index: {s.name: next(p_it) for s in ls.slots} for ls in walk}

    def run(layers, v):
        for ls in layers:
            v = ls.layer.reference(per[ls.index], v, Ctx(train=False, running=run_of[ls.index]))
        return v

    a_ref = run(walk[:k + 1], x)
    logits_ref, pull = jax.vjp(lambda a: run(walk[k + 1:], a), a_ref)
    (g_ref,) = pull(sel)
    np.testing.assert_allclose(fmap, a_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(logits, logits_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad, g_ref, rtol=1e-9, atol=1e-12)


def test_gradcam_heatmap_and_overlay(tmp_path) -> None:
    from hloforge.train.session import make_backend

    spec = tiny_net()
    params, running = _random_state(spec)
    image = np.random.default_rng(5).standard_normal(spec.input_shape).astype(np.float32)
    heat = gradcam(spec, params, running, image, make_backend("xla"))
    assert heat.shape == (8, 8) and np.isfinite(heat).all()
    assert heat.min() >= 0.0 and heat.max() <= 1.0 + 1e-6
    out = tmp_path / "cam.png"
    save_overlay(image, heat, str(out))
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(UnsupportedSpec, match=r"^class 7 is not one of the net's 3 classes; expected 0 to 2$"):
        gradcam(spec, params, running, image, make_backend("xla"), class_index=7)


def test_cam_refuses_a_net_without_a_feature_map() -> None:
    with pytest.raises(UnsupportedSpec, match="no image feature map"):
        feature_layer(NetSpec("mlp", (4,), [Dense(3)], 3))
