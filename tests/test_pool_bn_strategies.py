"""The maxPool and bnReduce lowering strategies (pool.py, norm.py) and the builder ops under them.

The oracle gate runs every choice on every gate case (tests/test_gate.py); here: the builder's
reduce_window and variadic reduce against jax/numpy, max-pool ties broken exactly as jax breaks
them, the gates going red for a broken written-out backward, the fused BN statistics' f32
accuracy, sync BN in the fused form, and the non-default forms on IREE.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from iree_forms import layer_vjp_on_iree_and_xla

from hloforge.backends.xla import default_client
from hloforge.core import strategy
from hloforge.core.autodiff import grad, inject_fault
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder
from hloforge.core.modules import train_step_module, vjp_module
from hloforge.core.spec import Layer, NetSpec, Shape
from hloforge.core.variant import Variant
from hloforge.lowering.norm import normalize
from hloforge.plugins.layers.dense import Dense, Flatten
from hloforge.plugins.layers.norm import BatchNorm, ConvBn
from hloforge.plugins.layers.pool import MaxPool
from hloforge.testing.gate import HEADER, GateCase, gate_cases


def run(text: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    with default_client().compile(text) as exe:
        return [np.asarray(o) for o in exe.run(list(inputs))]


@pytest.fixture(scope="module")
def jax() -> Any:
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def tied(shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """ReLU'd small integers: most windows hold their max more than once (0 above all)."""
    return np.maximum(np.round(np.random.default_rng(seed).standard_normal(shape)), 0.0)


# ------------------------------------------------------------------ the builder ops
@pytest.mark.parametrize(("shape", "window", "strides", "padding", "kind"), [
    ((2, 3, 6, 6), (1, 1, 2, 2), (1, 1, 2, 2), [(0, 0)] * 4, "max"),  # tiling windows: the interleave
    ((2, 3, 7, 7), (1, 1, 3, 3), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 1), (1, 1)], "max"),  # overlapping, padded
    ((2, 3, 7, 7), (1, 1, 2, 2), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 0), (0, 1)], "max"),  # tiling, padded
    ((1, 2, 7, 7), (1, 1, 2, 2), (1, 1, 3, 3), [(0, 0)] * 4, "max"),  # gaps between windows
    ((2, 5), (2, 2), (1, 2), [(0, 0), (1, 1)], "min"),
    ((2, 3, 7, 5), (1, 2, 3, 1), (1, 1, 2, 3), [(0, 0), (0, 1), (1, 1), (0, 2)], "sum"),
])
def test_reduce_window_and_its_vjp_match_jax_ties_included(jax: Any, shape: tuple[int, ...], window: tuple[int, ...],
                                                           strides: tuple[int, ...], padding: list[tuple[int, int]],
                                                           kind: str) -> None:
    import jax.numpy as jnp
    from jax import lax

    init, fn = {"max": (-jnp.inf, lax.max), "min": (jnp.inf, lax.min), "sum": (0.0, lax.add)}[kind]
    for a in (np.random.default_rng(1).standard_normal(shape), tied(shape)):
        b = Builder("f64")
        x = b.arg(shape)
        y = b.reduce_window(x, window, strides, padding, kind)
        gbar = b.arg(y.shape)
        (dx,) = grad(b, [y], [gbar], [x])
        g = np.random.default_rng(2).standard_normal(y.shape)
        got_y, got_dx = run(b.module([y, dx]), [a, g])
        want_y, pullback = jax.vjp(lambda v: lax.reduce_window(v, init, fn, window, strides, padding), a)
        np.testing.assert_allclose(got_y, want_y, rtol=0, atol=1e-14)
        np.testing.assert_allclose(got_dx, pullback(g)[0], rtol=0, atol=1e-14)


def test_reduce_window_bad_input_is_one_clear_error() -> None:
    b = Builder("f32")
    x = b.arg((2, 4, 4))
    with pytest.raises(UnsupportedSpec, match="needs 3 window sizes, strides and pads"):
        b.reduce_window(x, (2, 2), (2, 2), [(0, 0)] * 2)
    with pytest.raises(UnsupportedSpec, match="must be positive"):
        b.reduce_window(x, (1, 0, 2), (1, 1, 1), [(0, 0)] * 3)
    with pytest.raises(UnsupportedSpec, match="does not fit"):
        b.reduce_window(x, (1, 5, 1), (1, 1, 1), [(0, 0)] * 3)
    assert b.lines == [] and b.tape == []


def test_reduce_sums_is_one_variadic_reduce_with_per_operand_vjps() -> None:
    a = np.random.default_rng(3).standard_normal((3, 4, 5))
    b = Builder("f64")
    x = b.arg(a.shape)
    s1, s2, s3 = b.reduce_sums([x, x * x, x * 3.0], [2, 0])
    gbar = b.arg((4,))
    (dx,) = grad(b, [s1, s2], [gbar, gbar], [x])
    text = b.module([s1, s2, s3, dx])
    assert text.count("stablehlo.reduce") == 1 and "dimensions = array<i64: 0, 2>" in text
    g = np.arange(4.0)
    got = run(text, [a, g])
    np.testing.assert_allclose(got[0], a.sum((0, 2)), rtol=1e-13)
    np.testing.assert_allclose(got[1], (a * a).sum((0, 2)), rtol=1e-13)
    np.testing.assert_allclose(got[2], 3 * a.sum((0, 2)), rtol=1e-13)
    np.testing.assert_allclose(got[3], g[None, :, None] * (1 + 2 * a), rtol=1e-13)
    with pytest.raises(UnsupportedSpec, match="reduce_sums operands must share one type"):
        b.reduce_sums([x, b.arg((3, 4))], [0])


# ------------------------------------------------------------------ max pool: ties as jax breaks them
TIE_CASES = [(MaxPool(2), (3, 6, 6)), (MaxPool(3, 2, pad=1), (2, 7, 7)), (MaxPool(2, pad="same"), (2, 5, 5)),
             (MaxPool(2, 3), (2, 7, 7)), (MaxPool(2), (2, 5, 7))]  # the last: a row and a column no window reads


@pytest.mark.parametrize("form", strategy.kind("maxPool").choices)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_max_pool_ties_go_where_jax_sends_them(jax: Any, form: str, layout: str) -> None:
    """The gate's random inputs never tie (and finite differences cannot judge a tie), so every
    form is held here to jax's VJP on inputs full of ties: the first maximum in the window gets ḡ."""
    for layer, shape in TIE_CASES:
        batch = 2
        with strategy.forced({"maxPool": form, "layout": layout}):
            text = vjp_module([layer], shape, batch, dtype="f64")
        x = tied((batch, *shape))
        g = np.random.default_rng(4).standard_normal((batch, *layer.out_shape(shape)))
        got_y, got_dx = run(text, [x, g])
        want_y, pullback = jax.vjp(lambda v, layer=layer: layer.reference({}, v, None), x)
        want_dx = pullback(g)[0]
        np.testing.assert_array_equal(got_y, want_y)
        np.testing.assert_allclose(got_dx, want_dx, rtol=0, atol=1e-14, err_msg=f"{layer} {shape}")


def test_max_pool_ties_control_every_maximum_differs(jax: Any) -> None:
    """The tie inputs above can tell the rules apart: sending ḡ to every position equal to the
    window's max (an upsampled mask) is not what jax computes on them."""
    from jax import lax

    x = tied((2, 3, 6, 6))
    g = np.ones((2, 3, 3, 3))
    _, pullback = jax.vjp(lambda v: lax.reduce_window(v, -np.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"), x)
    y = x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5))
    every = (x == np.repeat(np.repeat(y, 2, 2), 2, 3)).astype(float)
    assert not np.array_equal(every, pullback(g)[0])


# ------------------------------------------------------------------ the gates go red for a broken backward
def _case(name: str, forced: tuple[tuple[str, str], ...], shape: Shape) -> GateCase:
    return next(c for c in gate_cases(names=[name]) if c.strategy == forced and c.shape == shape and c.mode == "train")


@pytest.mark.parametrize(("name", "forced", "shape", "broken", "absent"), [
    ("maxPool", (("maxPool", "select"),), (2, 7, 7), "custom", "maximum"),
    ("maxPool", (("maxPool", "select"),), (2, 5, 5), "custom", "maximum"),
    ("maxPool", (("maxPool", "window"),), (2, 6, 6), "reduce_window_max", "maximum"),
    ("maxPool", (("maxPool", "window"),), (2, 7, 7), "reduce_window_max", "maximum"),
    ("batchNorm", (("bnReduce", "fused"),), (3, 4, 5), "custom", "reduce_sum"),
    ("convBn", (("bnReduce", "fused"),), (2, 4, 4), "custom", "reduce_sum"),
])
def test_broken_backward_of_each_form_turns_its_gate_red(name: str, forced: tuple[tuple[str, str], ...],
                                                         shape: Shape, broken: str, absent: str) -> None:
    case = _case(name, forced, shape)
    assert case.run().passed
    with inject_fault(broken) as calls:
        result = case.run()
    assert calls[0] > 0
    assert not result.passed, f"\n{HEADER}\n{result.row()}"
    with inject_fault(absent) as calls:  # the autodiff ops of the other form are not on this one's tape
        case.run()
    assert calls[0] == 0


# ------------------------------------------------------------------ blocked BN sums
@pytest.mark.parametrize(("shape", "dims", "stages"), [
    ((128, 28, 28, 16), [0, 1, 2], 4),  # mobilenetv2-mini's BN: W, H, then 128 = 4 blocks of 32
    ((64, 40, 3), [0, 1], 2),  # two long axes, 40 = 2 blocks of 20
    ((3, 66, 5), [1], 2),  # 66 = 3 blocks of 22
    ((37, 28, 5), [0, 1], 2),  # 28 first; 37 has no divisor in 8..32: one plain sum
    ((37, 5), [0], 1),  # the same alone
    ((32, 32, 8), [0, 1], 2),  # nothing over 32: the minor reduced axis, then the other
    ((32, 32, 32, 8), [0, 1, 2], 3),  # resnet18-cifar's BN at batch 32: W, H, then N
    ((32, 8), [0], 1),  # one short axis: one plain sum
])
def test_blocked_sum_is_the_sum(shape: tuple[int, ...], dims: list[int], stages: int) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    b = Builder("f32")
    total = b.blocked_sum(b.arg(shape), dims)
    text = b.module([total])
    assert text.count("stablehlo.reduce") == stages and text.count("optimization_barrier") == stages - 1
    (got,) = run(text, [x])
    np.testing.assert_allclose(got, x.astype(np.float64).sum(tuple(dims)), rtol=1e-5, atol=1e-4)


def test_blocked_bn_is_gated_and_a_wrong_block_sum_turns_it_red(monkeypatch: pytest.MonkeyPatch) -> None:
    """bnReduce=blocked (XLA's default) renders BN's sums in blocks where an axis is over 32 (the
    (2, 3, 40) case) and in stages, minor axis first, where only short axes are (the (3, 4, 5) case); both gate cases
    pass, and the first goes red when the blocked sums are wrong (the last block left out)."""
    def step(shape: Shape, form: str) -> str:
        with strategy.forced({"bnReduce": form}):
            return train_step_module(NetSpec("bn", shape, [BatchNorm(), Flatten(), Dense(2)], 2),
                                     Variant("sgd"), 2)[0]

    for shape in ((3, 4, 5), (2, 3, 40)):
        assert "optimization_barrier" in step(shape, "blocked") and step(shape, "twoPass") != step(shape, "blocked")
    assert _case("batchNorm", (("bnReduce", "blocked"),), (3, 4, 5)).run().passed
    case = _case("batchNorm", (("bnReduce", "blocked"),), (2, 3, 40))
    assert case.run().passed
    real = Builder.blocked_sum

    def short(b: Builder, x: Any, dims: Sequence[int]) -> Any:
        hi = list(x.shape)
        hi[-1] -= 20  # the last axis, which (2, 3, 40) splits into blocks of 20
        return real(b, b.slice(x, [0] * len(hi), hi), dims) if x.shape[-1] == 40 else real(b, x, dims)

    monkeypatch.setattr(Builder, "blocked_sum", short)
    result = case.run()
    assert not result.passed, f"\n{HEADER}\n{result.row()}"


# ------------------------------------------------------------------ fused BN statistics
def _stats(x: np.ndarray, fused: bool, replicas: int = 1) -> tuple[np.ndarray, np.ndarray]:
    b = Builder("f32")
    xv = b.arg(x.shape)
    c = x.shape[1]
    gamma, beta = b.full(1.0, (c,)), b.full(0.0, (c,))
    _, mean, var = normalize(b, xv, gamma, beta, [0, 2, 3], 1, 1e-5, form="fused" if fused else "twoPass")
    got = run(b.module([mean, var]), [x])
    return got[0], got[1]


def test_fused_statistics_keep_f32_accuracy_under_a_large_mean() -> None:
    """Σd, Σd² about a sample of the data: a mean 10⁴ σ away from 0 costs no accuracy, where the
    textbook E[x²] − E[x]² (the control) loses every digit; a constant channel gets variance 0."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 3, 6, 6)) + np.array([1e4, -3e3, 0.0])[None, :, None, None]).astype(np.float32)
    x[:, 2] = 7.25  # a constant channel
    x64 = x.astype(np.float64)
    want_mean, want_var = x64.mean((0, 2, 3)), x64.var((0, 2, 3))
    for fused in (False, True):
        mean, var = _stats(x, fused)
        np.testing.assert_allclose(mean, want_mean, rtol=1e-6)
        np.testing.assert_allclose(var[:2], want_var[:2], rtol=1e-4)
        assert var[2] == 0.0
    b = Builder("f32")
    xv = b.arg(x.shape)
    m = float(x[:, 0].size)
    mean = b.sum(xv, [0, 2, 3]) / m
    naive = b.sum(xv * xv, [0, 2, 3]) / m - mean * mean
    (got,) = run(b.module([naive]), [x])
    assert abs(got[0] - want_var[0]) / want_var[0] > 1e-2


def test_the_fused_normaliser_refuses_what_is_not_batch_norm() -> None:
    b = Builder("f32")
    x = b.arg((2, 3, 4, 4))
    with pytest.raises(UnsupportedSpec, match=r"statistics over every axis but 1, got \[2, 3\]"):
        normalize(b, x, b.arg((3,)), b.arg((3,)), [2, 3], 1, 1e-5, form="fused")


def test_sync_bn_in_the_fused_form_equals_the_global_batch() -> None:
    """Each replica shifts by its own sample; Chan's pooling of (μ_r, M2_r) still gives the global
    batch's statistics and gradients."""
    from hloforge.backends.xla.backend import XlaBackend
    from hloforge.train.parallel import DataParallelTrainSession
    from hloforge.train.session import TrainSession

    per = 4
    spec = NetSpec("bn-sync", (1, 6, 6), [ConvBn(3), Flatten(), Dense(5)], 5)
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2 * per, 1, 6, 6)) + 3.0).astype(np.float32)
    x[per:] += 2.0  # the replicas' batches differ in mean: the pooled mean is not either's own
    y = rng.integers(0, 5, 2 * per).astype(np.int32)
    be, p0 = XlaBackend(devices=2), spec.init_params(0)
    with strategy.forced({"bnReduce": "fused"}):
        text, _ = train_step_module(spec, Variant("sgd"), per, replicas=2, sync_bn=True)
        assert re.search(r'= "stablehlo.reduce"\(', text) and "stablehlo.all_reduce" in text
        dp = DataParallelTrainSession(spec, Variant("sgd"), 2 * per, be, replicas=2, params=p0, sync_bn=True)
        full = TrainSession(spec, Variant("sgd"), 2 * per, be, params=p0)
    with strategy.forced({"bnReduce": "twoPass"}):
        plain = TrainSession(spec, Variant("sgd"), 2 * per, be, params=p0)
    losses = [s.train_step(x, y, 0.5) for s in (dp, full, plain)]
    for other in (full, plain):
        for a, b in zip(dp.read_params() + dp.batch_stats(), other.read_params() + other.batch_stats(), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) and losses[0] == pytest.approx(losses[2], rel=1e-6)


# ------------------------------------------------------------------ renders
def test_environment_forces_the_forms_into_a_train_step(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = NetSpec("pool-bn", (2, 8, 8), [ConvBn(4), MaxPool(2), BatchNorm(), Flatten(), Dense(3)], 3)
    portable = train_step_module(spec, Variant("adam"), 4)[0]
    assert "reduce_window" not in portable and '"stablehlo.reduce"(' not in portable
    monkeypatch.setenv(strategy.ENV_VAR, "maxPool=window,bnReduce=fused")
    forced = train_step_module(spec, Variant("adam"), 4)[0]
    assert forced.count('"stablehlo.reduce_window"') == 1
    assert forced.count('"stablehlo.reduce"(') == 4  # per BN: the statistics, and the backward's sums


# ------------------------------------------------------------------ IREE computes the forms XLA gates
IREE_FORMS: list[tuple[Layer, Shape, dict[str, str]]] = [
    (MaxPool(3, 2, pad=1), (2, 7, 7), {"maxPool": "select"}),
    (MaxPool(2), (3, 6, 6), {"maxPool": "window"}),
    (ConvBn(4), (2, 5, 5), {"bnReduce": "fused"}),
]


@pytest.mark.parametrize(("layer", "shape", "choice"), IREE_FORMS, ids=str)
def test_iree_runs_each_form_as_xla_runs_the_portable_one(layer: Layer, shape: Shape,
                                                           choice: dict[str, str]) -> None:
    """IREE has no f64: each form, rendered for IREE (NHWC inside), must reproduce in f32 the
    (y, ∂θ, ∂x) of the XLA-gated portable form."""
    pytest.importorskip("iree.runtime")
    _, _, got, want = layer_vjp_on_iree_and_xla(layer, shape, choice)
    for g, w in zip(got, want, strict=True):
        assert np.linalg.norm(g - w) <= 1e-5 * max(np.linalg.norm(w), 1e-30)
