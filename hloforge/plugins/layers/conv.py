"""2-D convolution on NCHW with OIHW kernels: strides, same/valid/explicit padding, groups.

The layer's math is here; the forms its ops take per target (NCHW or NHWC, the written, chunked
or autodiff backward, depthwise as shifted products, pointwise as a GEMM) are hloforge/lowering/conv.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
from hloforge.lowering import conv as forms
from hloforge.lowering.conv import conv2d, conv_strategies, is_pointwise, window_out
from hloforge.plugins.layers.activation import check_act, emit_act, reference_act


def same_padding(size: int, k: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """SAME padding (TensorFlow/JAX convention: the odd pixel goes after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def resolve_padding(pad: str | int, hw: tuple[int, int], k: int, stride: int) -> list[tuple[int, int]]:
    if pad == "same":
        return [same_padding(n, k, stride) for n in hw]
    if pad == "valid":
        return [(0, 0), (0, 0)]
    if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0:
        return [(pad, pad), (pad, pad)]
    raise UnsupportedSpec(f"pad must be 'same', 'valid' or a non-negative int, got {pad!r}")


@attrs.frozen
class Conv2d(Layer):
    kind = "conv2d"
    strategy_kinds = ("conv2d", "layout", "convGrad", "depthwise", "pointwise")
    out: int
    k: int = 3
    stride: int = 1
    pad: str | int = "same"
    groups: int = 1
    act: str = "identity"
    bias: bool = True

    def out_shape(self, in_shape: Shape) -> Shape:
        check_act(self.act)
        if len(in_shape) != 3:
            raise UnsupportedSpec(f"conv2d takes an image [C, H, W], got {list(in_shape)}")
        c, h, w = in_shape
        for name in ("out", "k", "stride", "groups"):  # the one that is wrong named, with its value
            if getattr(self, name) <= 0:
                raise UnsupportedSpec(f"{name} must be positive, got {getattr(self, name)}")
        if c % self.groups or self.out % self.groups:
            raise UnsupportedSpec(f"groups={self.groups} must divide in channels {c} and out channels {self.out}")
        pads = resolve_padding(self.pad, (h, w), self.k, self.stride)
        oh, ow = (window_out(n, self.k, self.stride, p) for n, p in zip((h, w), pads, strict=True))
        if oh <= 0 or ow <= 0:
            raise UnsupportedSpec(f"kernel {self.k} does not fit a {h}x{w} input with pad {self.pad!r}")
        return (self.out, oh, ow)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        w = ParamSlot("w", (self.out, in_shape[0] // self.groups, self.k, self.k), "he_fan_out", True)
        return (w, ParamSlot("b", (self.out,), "zeros", False)) if self.bias else (w,)

    def strategies_for(self, in_shape: Shape) -> tuple[str, ...]:
        pads = resolve_padding(self.pad, (in_shape[1], in_shape[2]), self.k, self.stride)
        return conv_strategies(in_shape[0], self.out, self.groups, is_pointwise(self.k, self.stride, self.groups, pads))

    def supports_nhwc(self, in_shape: Shape) -> bool:
        return True

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        pads = resolve_padding(self.pad, strategy.logical(x.shape, ctx.layout)[2:4], self.k, self.stride)
        y = conv2d(b, x, params["w"], stride=self.stride, pads=pads, groups=self.groups, layout=ctx.layout)
        if self.bias:
            y = y + b.broadcast_in_dim(params["b"], y.shape, [strategy.channel_axis(ctx.layout, 4)])
        return emit_act(b, self.act, y)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        from jax import lax

        pads = resolve_padding(self.pad, x.shape[2:4], self.k, self.stride)
        y = lax.conv_general_dilated(x, params["w"], (self.stride, self.stride), pads,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=self.groups,
                                     precision=lax.Precision.HIGHEST)
        if self.bias:
            y = y + params["b"][None, :, None, None]
        return reference_act(self.act, y)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [
            (cls(4, k=3, act="relu"), (3, 6, 6)),
            (cls(3, k=3, pad="valid"), (2, 5, 4)),
            (cls(8, k=2, act="relu"), (8, 3, 4)),  # kernel over activations: chunked ∂x on flipped ḡ; pads (0, 1)
            (cls(8, k=3, stride=2, act="relu"), (4, 4, 4)),  # kernel 2¼× x: chunked is an im2col GEMM; pads (0, 1)
            (cls(4, k=3, stride=2, pad="valid"), (2, 7, 7)),
            (cls(4, k=3, stride=2, pad="same", bias=False), (2, 6, 5)),
            (cls(6, k=3, groups=2, act="swish"), (4, 5, 5)),
            (cls(3, k=3, groups=3, pad=1), (3, 5, 5)),  # depthwise
            (cls(3, k=3, stride=2, groups=3, pad=1), (3, 5, 5)),  # ... its ∂x by phase, the last one short
            (cls(2, k=2, stride=3, groups=2, pad="valid"), (2, 7, 7)),  # ... phases no tap reaches
            (cls(3, k=1, stride=2, pad=1), (2, 5, 5)),  # padding wider than the kernel: ∂x crops ḡ's dilation
            (cls(4, k=1, stride=2, pad="valid"), (3, 5, 6)),  # strided pointwise: chunked is one GEMM
            (cls(5, k=1, act="relu"), (3, 4, 3)),  # pointwise
            (cls(64, k=3), (64, 3, 5)),  # wide 3×3: convGrad=winograd (XLA's) is Winograd's; odd sizes crop its tiles
        ]


@hookimpl
def hloforge_layers() -> list[type]:
    return [Conv2d]


@hookimpl
def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
    return list(forms.KINDS)
