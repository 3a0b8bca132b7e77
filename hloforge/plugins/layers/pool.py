"""Pooling: maxPool (kernel and stride independent, seed 001) and globalAvgPool, on NCHW."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, Shape
from hloforge.plugins.layers.conv import per_axis, resolve_padding, spatial_axes, window_out


@attrs.frozen
class MaxPool(Layer):
    kind = "maxPool"
    strategy_kinds = ("layout",)
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
        # The max of k² strided slices: every op has a plain VJP, and ties have measure zero.
        sp = spatial_axes(ctx.layout)
        pads = resolve_padding(self.pad, (x.shape[sp[0]], x.shape[sp[1]]), self.k, self.s)

        def at(h: int, w: int, rest: int) -> list[int]:
            return per_axis(ctx.layout, h, w, rest)

        if any(lo or hi for lo, hi in pads):
            x = b.pad(x, at(pads[0][0], pads[1][0], 0), at(pads[0][1], pads[1][1], 0), value=-float("inf"))
        h, w = x.shape[sp[0]], x.shape[sp[1]]
        oh, ow = window_out(h, self.k, self.s, (0, 0)), window_out(w, self.k, self.s, (0, 0))
        out = None
        for i, j in itertools.product(range(self.k), repeat=2):
            limit = list(x.shape)
            limit[sp[0]], limit[sp[1]] = i + (oh - 1) * self.s + 1, j + (ow - 1) * self.s + 1
            v = b.slice(x, at(i, j, 0), limit, at(self.s, self.s, 1))
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
        return [(cls(2), (2, 6, 6)), (cls(3, 2, pad=1), (2, 7, 7)), (cls(3, 2), (1, 8, 8))]


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
