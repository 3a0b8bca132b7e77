"""Pooling: maxPool (kernel and stride independent, seed 001) and globalAvgPool, on NCHW.

maxPool takes the form the strategy kind "maxPool" picks for the module's target (its forms:
hloforge/lowering/pool.py). All of them send a window's cotangent to the FIRST position (row-major
in the window) equal to its max, jax's and PyTorch's rule; a ReLU'd input ties at 0 often, so this is checked exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, Shape
from hloforge.lowering.conv import per_axis, spatial_axes, window_out
from hloforge.lowering.pool import MAX_POOL, max_pool
from hloforge.plugins.layers.conv import resolve_padding


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
        return max_pool(b, x, window, strides, edges)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        import jax.numpy as jnp
        from jax import lax

        pads = resolve_padding(self.pad, x.shape[2:4], self.k, self.s)
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, self.k, self.k), (1, 1, self.s, self.s),
                                 [(0, 0), (0, 0), *pads])

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(2), (2, 6, 6)), (cls(3, 2, pad=1), (2, 7, 7)), (cls(3, 2), (1, 8, 8)),
                (cls(2, pad="same"), (2, 5, 5)),
                (cls(2), (2, 5, 7))]  # tiling windows on an odd size: the last row and column no window reads


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


@hookimpl
def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
    return [MAX_POOL]
