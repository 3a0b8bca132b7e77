"""ConvNeXt: layerScale, convNextStage and convNextDownsample (torchvision's ConvNeXt).

A block: 7×7 depthwise conv (with bias) → channel norm → 1×1 expand (×4, bias) → GELU →
1×1 project (bias) → layer scale → + input. `norm` picks LayerNorm over channels (the paper)
or BatchNorm (running statistics in eval). GELU is the tanh form of activation.py, where
torchvision uses the erf form (same parameters; outputs differ by < 1e-3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
from hloforge.plugins.layers.compose import Block, BlockLayer, Part, check_stride, image, stage_blocks
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.norm import BatchNorm, LayerNorm

NORMS = ("ln", "bn")


@attrs.frozen
class LayerScale(Layer):
    """Per-channel learned scale γ (init 1e-6, no weight decay) on [C, H, W] or [C]."""

    kind = "layerScale"

    def out_shape(self, in_shape: Shape) -> Shape:
        if len(in_shape) not in (1, 3):
            raise UnsupportedSpec(f"layerScale takes [C, H, W] or [C], got {list(in_shape)}")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return (ParamSlot("gamma", (in_shape[0],), "layer_scale", False),)

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return x * b.broadcast_in_dim(params["gamma"], x.shape, [1])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return x * params["gamma"].reshape([1, -1] + [1] * (x.ndim - 2))

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3, 2, 2))]


def channel_norm(norm: str, eps: float) -> Layer:
    if norm not in NORMS:
        raise UnsupportedSpec(f"norm must be one of {NORMS}, got {norm!r}")
    return LayerNorm(eps) if norm == "ln" else BatchNorm(eps)


@attrs.frozen
class ConvNextStage(BlockLayer):
    kind = "convNextStage"
    n: int = 3
    norm: str = "ln"
    k: int = 7
    expand: int = 4
    eps: float = 1e-6
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        c = image(in_shape, self.kind)[0]
        if self.expand <= 0 or self.k <= 0 or self.k % 2 == 0:
            raise UnsupportedSpec(f"k must be odd and positive and expand positive, got k={self.k} "
                                  f"expand={self.expand}")
        norm = channel_norm(self.norm, self.eps)

        def make(i: int, ic: int) -> Block:
            return Block((Part("dw.", Conv2d(c, k=self.k, pad=self.k // 2, groups=c)),
                          Part("norm.", norm),
                          Part("pw1.", Conv2d(self.expand * c, k=1, pad="valid", act="gelu")),
                          Part("pw2.", Conv2d(c, k=1, pad="valid")),
                          Part("scale.", LayerScale())), (), drop_path=self.drop_path)

        return stage_blocks(self.n, make, in_shape, c)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(n=2, k=3, expand=2), (3, 3, 3)), (cls(n=1, norm="bn", k=3, expand=2), (2, 3, 3))]


@attrs.frozen
class ConvNextDownsample(BlockLayer):
    """Channel norm, then a 2×2 stride-2 conv (with bias) to `out` channels."""

    kind = "convNextDownsample"
    out: int
    norm: str = "ln"
    eps: float = 1e-6

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        image(in_shape, self.kind)
        try:
            check_stride(2, in_shape)
        except UnsupportedSpec as e:
            raise UnsupportedSpec(f"block 0: {e}") from None
        return [("", Block((Part("norm.", channel_norm(self.norm, self.eps)),
                            Part("conv.", Conv2d(self.out, k=2, stride=2, pad="valid")))))]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(4), (3, 4, 4)), (cls(3, norm="bn"), (2, 4, 2))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [LayerScale, ConvNextStage, ConvNextDownsample]
