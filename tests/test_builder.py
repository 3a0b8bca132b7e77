"""The StableHLO builder and the codegen-time autodiff, run through the XLA backend."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from hloforge.backends.xla import default_client
from hloforge.core.autodiff import grad
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value, float_literal


def run(b: Builder, outputs: Sequence[Value], inputs: Sequence[np.ndarray] = ()) -> list[np.ndarray]:
    with default_client().compile(b.module(list(outputs))) as exe:
        return [np.asarray(o) for o in exe.run(list(inputs))]


@pytest.fixture(scope="module")
def jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


# ------------------------------------------------------------------ type rules
def test_type_errors_are_unsupported_spec() -> None:
    b = Builder("f32")
    x, y, z = b.arg((2, 3)), b.arg((3, 2)), b.arg((2, 3), "f64")
    with pytest.raises(UnsupportedSpec, match=r"stablehlo.add operands differ: tensor<2x3xf32> vs tensor<3x2xf32>"):
        b.add(x, y)
    with pytest.raises(UnsupportedSpec, match="tensor<2x3xf32> vs tensor<2x3xf64>"):
        b.multiply(x, z)
    with pytest.raises(UnsupportedSpec, match="operands differ"):
        _ = x - y
    with pytest.raises(UnsupportedSpec, match="dot_general"):
        b.dot_general(x, x, ([1], [0]))
    with pytest.raises(UnsupportedSpec, match="element counts differ"):
        b.reshape(x, (4,))
    with pytest.raises(UnsupportedSpec, match="does not fit"):
        b.broadcast_in_dim(x, (2, 4), [0, 1])
    with pytest.raises(UnsupportedSpec, match="input has 3 channels, kernel expects 2"):
        b.convolution(b.arg((1, 3, 5, 5)), b.arg((4, 2, 3, 3)), strides=(1, 1), padding=[(0, 0), (0, 0)])
    with pytest.raises(UnsupportedSpec, match="output spatial dim 0 is empty"):
        b.convolution(b.arg((1, 3, 2, 5)), b.arg((4, 3, 3, 3)), strides=(1, 1), padding=[(0, 0), (0, 0)])
    with pytest.raises(UnsupportedSpec, match="builder dtype 'f16'"):
        Builder("f16")
    # Nothing half-emitted: the failed ops left no lines behind.
    assert b.lines == [] and b.tape == []


# ------------------------------------------------------------------ literals
def test_float_literals_are_exact_hex() -> None:
    assert float_literal(0.1, "f64") == "0x3FB999999999999A"
    assert float_literal(0.1, "f32") == "0x3DCCCCCD"
    assert float_literal(-math.inf, "f64") == "0xFFF0000000000000"
    assert float_literal(True, "i1") == "true" and float_literal(7, "i32") == "7"


def test_f64_constants_round_trip_bit_exactly() -> None:
    values = [0.1, 1 / 3, math.pi, -2.5e-300, 1e300, 5e-324, -0.0, math.inf, -math.inf]
    b = Builder("f64")
    outs = [b.full(v) for v in values]
    arr = np.random.default_rng(0).standard_normal((3, 4))
    outs.append(b.constant(arr))
    outs.append(b.full(0.1, (), "f32"))
    nan = b.full(math.nan)
    got = run(b, [*outs, nan])
    for v, g in zip(values, got, strict=False):
        assert g.dtype == np.float64 and g.shape == ()
        assert g.tobytes() == np.float64(v).tobytes(), (v, g)
    assert np.array_equal(got[len(values)], arr)
    assert got[len(values) + 1].dtype == np.float32 and got[len(values) + 1] == np.float32(0.1)
    assert np.isnan(got[-1])


# ------------------------------------------------------------------ ops against numpy
def test_slice_with_strides() -> None:
    a = np.arange(7 * 9, dtype=np.float64).reshape(7, 9)
    b = Builder("f64")
    x = b.arg(a.shape)
    s = b.slice(x, [1, 0], [7, 8], [2, 3])
    assert s.shape == (3, 3)
    (got,) = run(b, [s], [a])
    np.testing.assert_array_equal(got, a[1:7:2, 0:8:3])


def test_pad_with_interior() -> None:
    a = np.arange(1, 7, dtype=np.float64).reshape(2, 3)
    b = Builder("f64")
    x = b.arg(a.shape)
    p = b.pad(x, [1, 0], [2, 1], [1, 2], value=-1.0)
    want = np.full((1 + 2 + 3, 0 + 1 + 3 + 2 * 2), -1.0)
    want[1:4:2, 0:7:3] = a
    assert p.shape == want.shape
    (got,) = run(b, [p], [a])
    np.testing.assert_array_equal(got, want)


def test_concatenate_and_transpose() -> None:
    rng = np.random.default_rng(1)
    a, c = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    b = Builder("f64")
    x, y = b.arg(a.shape), b.arg(c.shape)
    cat = b.concatenate([x, y, x], 1)
    t = b.transpose(cat, [2, 0, 1])
    assert cat.shape == (2, 11, 4) and t.shape == (4, 2, 11)
    assert b.transpose(x, [0, 1, 2]) is x and b.concatenate([x], 0) is x
    got_cat, got_t = run(b, [cat, t], [a, c])
    want = np.concatenate([a, c, a], 1)
    np.testing.assert_array_equal(got_cat, want)
    np.testing.assert_array_equal(got_t, want.transpose(2, 0, 1))


def test_reductions() -> None:
    a = np.random.default_rng(2).standard_normal((3, 4, 5))
    b = Builder("f64")
    x = b.arg(a.shape)
    mx, mn, sm = b.reduce(x, [2, 0], "max"), b.reduce(x, [1], "min"), b.sum(x)
    assert mx.shape == (4,) and mn.shape == (3, 5) and sm.shape == ()
    got = run(b, [mx, mn, sm], [a])
    np.testing.assert_array_equal(got[0], a.max(axis=(0, 2)))
    np.testing.assert_array_equal(got[1], a.min(axis=1))
    np.testing.assert_allclose(got[2], a.sum(), rtol=1e-14)


@pytest.mark.parametrize("x_shape, w_shape, strides, padding, lhs_dil, rhs_dil, groups", [
    ((2, 3, 7, 6), (4, 3, 3, 2), (1, 1), [(0, 0), (0, 0)], (1, 1), (1, 1), 1),
    ((1, 4, 9, 8), (6, 2, 3, 3), (2, 3), [(1, 2), (0, 1)], (1, 1), (1, 1), 2),
    ((2, 2, 5, 5), (3, 2, 2, 3), (1, 2), [(2, 1), (1, 1)], (2, 1), (1, 2), 1),
])
def test_convolution_shape_rule_and_values(jax, x_shape, w_shape, strides, padding, lhs_dil, rhs_dil,
                                           groups) -> None:
    from jax import lax

    rng = np.random.default_rng(3)
    xa, wa = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    want = np.asarray(lax.conv_general_dilated(xa, wa, strides, padding, lhs_dilation=lhs_dil,
                                               rhs_dilation=rhs_dil, feature_group_count=groups,
                                               precision=lax.Precision.HIGHEST))
    b = Builder("f64")
    x, w = b.arg(x_shape), b.arg(w_shape)
    y = b.convolution(x, w, strides=strides, padding=padding, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
                      feature_groups=groups)
    assert y.shape == want.shape  # the builder's shape rule; XLA would also refuse a wrong declared type
    (got,) = run(b, [y], [xa, wa])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_convolution_nhwc_dimension_numbers() -> None:
    rng = np.random.default_rng(4)
    xa, wa = rng.standard_normal((2, 5, 5, 3)), rng.standard_normal((3, 3, 3, 4))  # NHWC, HWIO
    b = Builder("f64")
    x, w = b.arg(xa.shape), b.arg(wa.shape)
    y = b.convolution(x, w, strides=(1, 1), padding=[(1, 1), (1, 1)],
                      spec=((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)))
    assert y.shape == (2, 5, 5, 4)
    (got,) = run(b, [y], [xa, wa])
    xp = np.pad(xa, [(0, 0), (1, 1), (1, 1), (0, 0)])
    want = np.zeros((2, 5, 5, 4))
    for i in range(3):
        for j in range(3):
            want += np.einsum("nhwc,co->nhwo", xp[:, i:i + 5, j:j + 5, :], wa[i, j])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ autodiff against jax.grad
def grad_module(shapes: Sequence[tuple[int, ...]], f: Callable[..., Value],
                wrt: Sequence[int] | None = None) -> tuple[Builder, list[Value]]:
    b = Builder("f64")
    args = [b.arg(s) for s in shapes]
    loss = f(b, *args)
    assert loss.shape == ()
    targets = [args[i] for i in (wrt if wrt is not None else range(len(args)))]
    return b, [loss, *grad(b, [loss], [b.full(1.0)], targets)]


def test_grad_with_fan_out_matches_jax(jax) -> None:
    import jax.numpy as jnp

    def ours(b: Builder, x: Value, y: Value) -> Value:
        # x feeds five ops and y three: each use must add its cotangent.
        t = b.tanh(x * y) * x + b.exp(-x) / (1.0 + y * y)
        return b.sum(t * x) + b.sum(b.log(y * y + 1.0))

    def ref(x, y):
        t = jnp.tanh(x * y) * x + jnp.exp(-x) / (1.0 + y * y)
        return jnp.sum(t * x) + jnp.sum(jnp.log(y * y + 1.0))

    rng = np.random.default_rng(5)
    xa, ya = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    b, outs = grad_module([xa.shape, ya.shape], ours)
    val, gx, gy = run(b, outs, [xa, ya])
    want_val, (want_gx, want_gy) = jax.value_and_grad(ref, argnums=(0, 1))(xa, ya)
    np.testing.assert_allclose(val, want_val, rtol=1e-13)
    np.testing.assert_allclose(gx, want_gx, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gy, want_gy, rtol=1e-12, atol=1e-14)


def test_grad_through_contraction_broadcast_and_max(jax) -> None:
    import jax.numpy as jnp

    def ours(b: Builder, x: Value, w: Value, c: Value) -> Value:
        h = b.dot_general(x, w, ([1], [0]))  # [4, 3]
        h = h + b.broadcast_to(c, h.shape)
        m = b.reduce(h, [1], "max")  # [4]
        s = b.transpose(b.slice(h, [0, 0], [4, 3], [2, 1]), [1, 0])  # [3, 2]
        return b.sum(m * m) + b.sum(b.reshape(s, (6,)) * b.reshape(s, (6,)))

    def ref(x, w, c):
        h = x @ w + c
        return jnp.sum(h.max(axis=1) ** 2) + jnp.sum(h[0:4:2].T.reshape(6) ** 2)

    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((4, 5)), rng.standard_normal((5, 3)), rng.standard_normal((3,))]
    b, outs = grad_module([a.shape for a in xs], ours)
    got = run(b, outs, xs)
    want = jax.grad(ref, argnums=(0, 1, 2))(*xs)
    np.testing.assert_allclose(got[0], ref(*xs), rtol=1e-13)
    for g, w in zip(got[1:], want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_stop_gradient_matches_jax(jax) -> None:
    import jax.numpy as jnp
    from jax import lax

    def ours(b: Builder, x: Value) -> Value:
        sg = b.stop_gradient(x)
        m = b.stop_gradient(b.reduce(x, [1], "max"))
        z = x - b.broadcast_in_dim(m, x.shape, [0])
        return b.sum(x * sg) + b.sum(b.exp(z))

    def ref(x):
        m = lax.stop_gradient(x.max(axis=1, keepdims=True))
        return jnp.sum(x * lax.stop_gradient(x)) + jnp.sum(jnp.exp(x - m))

    xa = np.random.default_rng(7).standard_normal((3, 5))
    b, outs = grad_module([xa.shape], ours)
    val, gx = run(b, outs, [xa])
    want = jax.grad(ref)(xa)
    np.testing.assert_allclose(val, ref(xa), rtol=1e-13)
    np.testing.assert_allclose(gx, want, rtol=1e-12, atol=1e-14)
    # Without the stop, x·x would give 2x: make sure the two really differ here.
    assert not np.allclose(gx, jax.grad(lambda x: jnp.sum(x * x) + jnp.sum(jnp.exp(x - x.max(1, keepdims=True))))(xa))


def test_unreached_wrt_gets_zeros() -> None:
    b = Builder("f64")
    x, unused = b.arg((2,)), b.arg((3,))
    loss = b.sum(x * x)
    gx, gu = grad(b, [loss], [b.full(1.0)], [x, unused])
    got = run(b, [gx, gu], [np.array([1.5, -2.0]), np.ones(3)])
    np.testing.assert_array_equal(got[0], [3.0, -4.0])
    np.testing.assert_array_equal(got[1], np.zeros(3))
