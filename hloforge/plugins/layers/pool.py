"""Pooling: maxPool (kernel and stride independent, seed 001) and globalAvgPool, on NCHW.

maxPool takes the form the strategy kind "maxPool" picks for the module's target:

- "slices": the max of k² strided slices folded with `maximum`; autodiff's backward of that chain
  (a compare and two selects per fold, every tie to the earlier slice).
- "select": the same forward, with a written-out backward (a `Builder.custom_vjp`): per window
  offset a compare of its slice with the max and a select (autodiff.window_extremum_vjp), the
  parts interleaved back by one reshape when the windows tile — no select_and_scatter, and none
  of the k² full-size pads the slices' own VJPs add up.
- "window": one stablehlo.reduce_window max, differentiated by the builder's rule for it (the same
  compare/select backward).

All three send a window's cotangent to the FIRST position (row-major in the window) equal to its max,
jax's and PyTorch's rule; a ReLU'd input ties at 0 often, so this is checked exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.autodiff import window_extremum_vjp
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, Shape
from hloforge.plugins.layers.conv import per_axis, resolve_padding, spatial_axes, window_out

MAX_POOL = strategy.declare("maxPool", ("slices", "select", "window"), {"xla": "select", "iree": "select"},
                            "max pooling as k² strided slices folded with maximum, differentiated by autodiff "
                            "or by compare/select; or one reduce_window (see pool.py)")


@attrs.frozen
class MaxPool(Layer):
    kind = "maxPool"
    strategy_kinds = ("layout", "maxPool")
    k: int = 2
    stride: int | None = None  # defaults to k
    pad: str | int = "valid"

    @property
    def s(self) -> int:
        return self.stride or self.k

    def out_shape(self, in_shape: Shape) -> Shape:
        if len(in_shape) != 3:
            raise UnsupportedSpec(f"maxPool takes an image [C, H, W], got {list(in_shape)}")
        c, h, w = in_shape
        if self.k <= 0 or (self.stride is not None and self.stride <= 0):  # 0 is no stride, not "the default"
            raise UnsupportedSpec(f"k and stride must be positive (stride omitted: k), got k={self.k}, "
                                  f"stride={self.stride}")
        pads = resolve_padding(self.pad, (h, w), self.k, self.s)
        if any(lo >= self.k or hi >= self.k for lo, hi in pads):
            raise UnsupportedSpec(f"padding {pads} would make windows of only padding (k={self.k})")
        oh, ow = (window_out(n, self.k, self.s, p) for n, p in zip((h, w), pads, strict=True))
        if oh <= 0 or ow <= 0:
            raise UnsupportedSpec(f"window {self.k} does not fit a {h}x{w} input")
        return (c, oh, ow)

    def supports_nhwc(self, in_shape: Shape) -> bool:
        return True

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        sp = spatial_axes(ctx.layout)
        pads = resolve_padding(self.pad, (x.shape[sp[0]], x.shape[sp[1]]), self.k, self.s)
        edges = [(0, 0)] * 4
        edges[sp[0]], edges[sp[1]] = pads[0], pads[1]
        window, strides = per_axis(ctx.layout, self.k, self.k, 1), per_axis(ctx.layout, self.s, self.s, 1)
        form = strategy.chosen("maxPool", b.target)
        if form == "window":
            return b.reduce_window(x, window, strides, edges, "max")
        if form == "select":
            def bwd(b: Builder, g: Value) -> list[Value]:
                return [window_extremum_vjp(b, x, y, g, window, strides, edges, -float("inf"))]

            (y,) = b.custom_vjp(lambda x: [self._slices_max(b, x, edges, window, strides)], bwd, x)
            return y
        return self._slices_max(b, x, edges, window, strides)

    def _slices_max(self, b: Builder, x: Value, edges: list[tuple[int, int]], window: list[int],
                    strides: list[int]) -> Value:
        """The max of the k² strided slices of x padded with −inf, folded in row-major window order
        (`maximum`'s VJP sends a tie to its first operand: the earlier slice)."""
        if any(lo or hi for lo, hi in edges):
            x = b.pad(x, [lo for lo, _ in edges], [hi for _, hi in edges], value=-float("inf"))
        out_shape = [(n - w) // s + 1 for n, w, s in zip(x.shape, window, strides, strict=True)]
        out = None
        for offset in itertools.product(*(range(w) for w in window)):
            limit = [o + (m - 1) * s + 1 for o, m, s in zip(offset, out_shape, strides, strict=True)]
            v = b.slice(x, list(offset), limit, strides)
            out = v if out is None else b.maximum(out, v)
        assert out is not None
        return out

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        import jax.numpy as jnp
        from jax import lax

        pads = resolve_padding(self.pad, x.shape[2:4], self.k, self.s)
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, self.k, self.k), (1, 1, self.s, self.s),
                                 [(0, 0), (0, 0), *pads])

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(2), (2, 6, 6)), (cls(3, 2, pad=1), (2, 7, 7)), (cls(3, 2), (1, 8, 8)),
                (cls(2, pad="same"), (2, 5, 5))]


@attrs.frozen
class GlobalAvgPool(Layer):
    kind = "globalAvgPool"
    strategy_kinds = ("layout",)

    def out_shape(self, in_shape: Shape) -> Shape:
        if len(in_shape) != 3:
            raise UnsupportedSpec(f"globalAvgPool takes an image [C, H, W], got {list(in_shape)}")
        return (in_shape[0],)

    def supports_nhwc(self, in_shape: Shape) -> bool:
        return True

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        sp = spatial_axes(ctx.layout)
        return b.sum(x, sp) / float(x.shape[sp[0]] * x.shape[sp[1]])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        return x.mean(axis=(2, 3))

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3, 4, 5))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [MaxPool, GlobalAvgPool]
