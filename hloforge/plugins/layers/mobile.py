"""Mobile blocks: squeezeExcite, invertedResidual (MobileNetV2), mbConv (EfficientNet),
fusedMbConv (EfficientNetV2), mbConvV3 (MobileNetV3) and uib (MobileNetV4).

Every block is composed of convBn / depthwiseConvBn (norm.py) and squeezeExcite parts;
channel rounding follows the references (`make_divisible`). A block has an identity skip
exactly when its stride is 1 and its in and out channels agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
from hloforge.plugins.layers.activation import check_act, emit_act, reference_act
from hloforge.plugins.layers.compose import Block, BlockLayer, Part, image, make_divisible, stage_blocks
from hloforge.plugins.layers.norm import BN_EPS, ConvBn, DepthwiseConvBn


@attrs.frozen
class SqueezeExcite(Layer):
    """x · gate(W₂·act(W₁·GAP(x) + b₁) + b₂): the 1×1 convs on the pooled vector as dense maps.
    `mid` is the squeeze width (absolute; blocks compute it from their own rule)."""

    kind = "squeezeExcite"
    mid: int
    act: str = "relu"
    gate: str = "sigmoid"

    def out_shape(self, in_shape: Shape) -> Shape:
        check_act(self.act)
        check_act(self.gate)
        image(in_shape, self.kind)
        if self.mid <= 0:
            raise UnsupportedSpec(f"squeeze width must be positive, got mid={self.mid} (a zero-width SE)")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        c = in_shape[0]
        return (ParamSlot("w1", (c, self.mid), "glorot", True), ParamSlot("b1", (self.mid,), "zeros", False),
                ParamSlot("w2", (self.mid, c), "glorot", True), ParamSlot("b2", (c,), "zeros", False))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        pooled = b.sum(x, [2, 3]) / float(x.shape[2] * x.shape[3])
        h = b.dot_general(pooled, params["w1"], ([1], [0]))
        h = emit_act(b, self.act, h + b.broadcast_to(params["b1"], h.shape))
        s = b.dot_general(h, params["w2"], ([1], [0]))
        s = emit_act(b, self.gate, s + b.broadcast_to(params["b2"], s.shape))
        return x * b.broadcast_in_dim(s, x.shape, [0, 1])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        h = reference_act(self.act, jnp.einsum("nchw,cm->nm", x, params["w1"]) / (x.shape[2] * x.shape[3])
                          + params["b1"])
        s = reference_act(self.gate, h @ params["w2"] + params["b2"])
        return x * s[:, :, None, None]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(3), (4, 3, 3)), (cls(3, act="swish", gate="hSigmoid"), (5, 2, 2))]


def _skip(ic: int, oc: int, stride: int) -> tuple[Part, ...] | None:
    return () if stride == 1 and ic == oc else None


def _project(oc: int, eps: float) -> Part:
    return Part("project.", ConvBn(oc, k=1, act="identity", eps=eps))


def _check_positive(**kw: float) -> None:
    for k, v in kw.items():
        if not v > 0:
            raise UnsupportedSpec(f"{k} must be positive, got {v}")


@attrs.frozen
class InvertedResidual(BlockLayer):
    """MobileNetV2 stage: n × [1×1 expand (skipped at expand 1) → k×k depthwise → linear 1×1 project]."""

    kind = "invertedResidual"
    out: int
    n: int = 1
    stride: int = 1
    expand: int = 6
    k: int = 3
    act: str = "relu6"
    eps: float = BN_EPS
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        _check_positive(expand=self.expand)

        def make(i: int, ic: int) -> Block:
            s = self.stride if i == 0 else 1
            mid = ic * self.expand
            main = [Part("expand.", ConvBn(mid, k=1, act=self.act, eps=self.eps))] if self.expand != 1 else []
            main += [Part("dw.", DepthwiseConvBn(self.k, s, self.act, self.eps)), _project(self.out, self.eps)]
            return Block(main, _skip(ic, self.out, s), drop_path=self.drop_path)

        return stage_blocks(self.n, make, in_shape, self.out)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(3, n=2, expand=2), (3, 4, 4)), (cls(4, n=1, stride=2, expand=1), (2, 4, 4))]


@attrs.frozen
class MbConv(BlockLayer):
    """EfficientNet stage: n × [1×1 expand → k×k depthwise → SE (squeeze = se_ratio · block input
    channels) → linear 1×1 project], swish throughout."""

    kind = "mbConv"
    out: int
    n: int = 1
    stride: int = 1
    k: int = 3
    expand: float = 6.0
    se_ratio: float = 0.25
    act: str = "swish"
    eps: float = BN_EPS
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        _check_positive(expand=self.expand)
        if self.se_ratio < 0:
            raise UnsupportedSpec(f"se_ratio must be non-negative, got {self.se_ratio}")

        def make(i: int, ic: int) -> Block:
            s = self.stride if i == 0 else 1
            mid = make_divisible(ic * self.expand, 8)
            main = [Part("expand.", ConvBn(mid, k=1, act=self.act, eps=self.eps))] if mid != ic else []
            main.append(Part("dw.", DepthwiseConvBn(self.k, s, self.act, self.eps)))
            if self.se_ratio > 0:
                main.append(Part("se.", SqueezeExcite(max(1, int(ic * self.se_ratio)), self.act, "sigmoid")))
            return Block([*main, _project(self.out, self.eps)], _skip(ic, self.out, s), drop_path=self.drop_path)

        return stage_blocks(self.n, make, in_shape, self.out)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(4, n=2, k=3, expand=2), (4, 4, 4)), (cls(3, n=1, stride=2, k=5, expand=1), (8, 4, 4)),
                (cls(4, n=2, k=3, expand=2, drop_path=0.25), (4, 4, 4)),
                (cls(3, n=2, stride=2, k=3, expand=2), (4, 5, 5))]  # 5 → 3


@attrs.frozen
class FusedMbConv(BlockLayer):
    """EfficientNetV2 stage: n × [k×k convBn expand (carries the stride) → optional SE → linear 1×1
    project]; at expand 1 a single k×k convBn in → out with the activation."""

    kind = "fusedMbConv"
    out: int
    n: int = 1
    stride: int = 1
    k: int = 3
    expand: float = 4.0
    se_ratio: float = 0.0
    act: str = "swish"
    eps: float = BN_EPS
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        _check_positive(expand=self.expand)
        if self.se_ratio < 0:
            raise UnsupportedSpec(f"se_ratio must be non-negative, got {self.se_ratio}")

        def make(i: int, ic: int) -> Block:
            s = self.stride if i == 0 else 1
            mid = make_divisible(ic * self.expand, 8)
            if mid == ic:
                main = [Part("conv.", ConvBn(self.out, k=self.k, stride=s, act=self.act, eps=self.eps))]
            else:
                main = [Part("expand.", ConvBn(mid, k=self.k, stride=s, act=self.act, eps=self.eps))]
                if self.se_ratio > 0:
                    main.append(Part("se.", SqueezeExcite(max(1, int(ic * self.se_ratio)), self.act, "sigmoid")))
                main.append(_project(self.out, self.eps))
            return Block(main, _skip(ic, self.out, s), drop_path=self.drop_path)

        return stage_blocks(self.n, make, in_shape, self.out)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(4, n=2, expand=2, se_ratio=0.25), (4, 4, 4)), (cls(8, n=1, stride=2, expand=1), (8, 4, 4))]


@attrs.frozen
class MbConvV3(BlockLayer):
    """MobileNetV3 block: 1×1 expand to `mid` (skipped when mid = in) → k×k depthwise → SE
    (squeeze make_divisible(mid/4), ReLU, h-sigmoid gate) → linear 1×1 project. act: hSwish or relu."""

    kind = "mbConvV3"
    out: int
    mid: int
    k: int = 3
    stride: int = 1
    se: bool = False
    act: str = "hSwish"
    eps: float = BN_EPS
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        _check_positive(mid=self.mid)
        ic = image(in_shape, self.kind)[0]
        main = [Part("expand.", ConvBn(self.mid, k=1, act=self.act, eps=self.eps))] if self.mid != ic else []
        main.append(Part("dw.", DepthwiseConvBn(self.k, self.stride, self.act, self.eps)))
        if self.se:
            main.append(Part("se.", SqueezeExcite(make_divisible(self.mid // 4, 8), "relu", "hSigmoid")))
        return [("", Block([*main, _project(self.out, self.eps)], _skip(ic, self.out, self.stride),
                            drop_path=self.drop_path))]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(4, mid=8, se=True), (4, 3, 3)), (cls(5, mid=3, k=5, stride=2, act="relu"), (3, 4, 4))]


@attrs.frozen
class Uib(BlockLayer):
    """MobileNetV4 universal inverted bottleneck (timm's UniversalInvertedResidual, seed 001):
    optional start depthwise (BN, NO activation; it carries the stride only when there is no
    mid depthwise) → 1×1 expand to make_divisible(in·expand) + act → optional mid depthwise
    + act (carries the stride) → linear 1×1 project. start_k/mid_k 0 = absent."""

    kind = "uib"
    out: int
    start_k: int = 0
    mid_k: int = 3
    stride: int = 1
    expand: float = 4.0
    act: str = "relu"
    eps: float = BN_EPS
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        _check_positive(expand=self.expand)
        if self.start_k < 0 or self.mid_k < 0:
            raise UnsupportedSpec(f"start_k and mid_k must be non-negative, got {self.start_k}, {self.mid_k}")
        if self.stride != 1 and not (self.start_k or self.mid_k):
            raise UnsupportedSpec(f"stride {self.stride} needs a depthwise conv to carry it (start_k or mid_k)")
        ic = image(in_shape, self.kind)[0]
        main = []
        if self.start_k:
            s = 1 if self.mid_k else self.stride
            main.append(Part("dwStart.", DepthwiseConvBn(self.start_k, s, "identity", self.eps)))
        main.append(Part("expand.", ConvBn(make_divisible(ic * self.expand, 8), k=1, act=self.act, eps=self.eps)))
        if self.mid_k:
            main.append(Part("dwMid.", DepthwiseConvBn(self.mid_k, self.stride, self.act, self.eps)))
        return [("", Block([*main, _project(self.out, self.eps)], _skip(ic, self.out, self.stride),
                            drop_path=self.drop_path))]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(4, start_k=3, mid_k=3, expand=2), (4, 4, 4)),
                (cls(6, start_k=3, mid_k=0, stride=2, expand=2), (4, 4, 4)),
                (cls(3, start_k=0, mid_k=5, stride=2, expand=3), (2, 4, 4))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [SqueezeExcite, InvertedResidual, MbConv, FusedMbConv, MbConvV3, Uib]
