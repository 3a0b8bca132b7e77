"""Normalisation: batchNorm, instanceNorm, layerNorm (channel axis of NCHW), and convBn /
depthwiseConvBn — the conv + BN + activation unit every CNN block is built from.

One normaliser, `normalize` (hloforge/lowering/norm.py), serves all three norms: statistics
over `reduce` axes, γ/β along one axis, and a closed-form backward (a `Builder.custom_vjp`) instead of differentiating
the mean and variance ops:

    x̂ = (x − μ)·σ⁻¹,  σ⁻¹ = rsqrt(var + ε),  y = γ·x̂ + β          (M = elements per statistic)
    ∂β = Σ ḡ,  ∂γ = Σ ḡ·x̂,  ∂x = σ⁻¹/M · (M·ĝ − Σ_R ĝ − x̂·Σ_R ĝ·x̂),  ĝ = γ·ḡ

Batch norm takes the form the strategy kind "bnReduce" picks for the module's target: the
normaliser and its forms (two-pass, blocked, fused) are hloforge/lowering/norm.py.

Batch norm uses the BIASED batch variance (divide by M) to normalise, and reports that same
biased variance as its batch statistic; the trainer's running average (weight 1 − bn_momentum)
is therefore an average of biased variances. PyTorch averages the unbiased one: the two differ
by M/(M−1), under 0.1% once M ≥ 1000 but 3% at batch 32 on a 1×1 map (resnet18's last stage at
32×32), so weights trained here and exported keep the smaller running variance. Eval mode
normalises with the running mean and variance instead, as plain differentiable ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.f32 import F32_RANGE, f32_holds
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape, StatSlot
from hloforge.lowering.conv import conv2d, conv_strategies, is_pointwise
from hloforge.lowering.norm import BN_REDUCE, normalize
from hloforge.plugins.layers.activation import check_act, emit_act, reference_act
from hloforge.plugins.layers.compose import image, is_train

BN_EPS = 1e-5


def batch_norm(b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx, eps: float) -> Value:
    """BN over every axis but the channel's ([B, C, H, W], [B, H, W, C] in an NHWC stretch, or
    [B, C]): batch statistics in training (reported as ctx.batch_stats["mean"/"var"]), running
    statistics in eval."""
    gamma, beta = params["gamma"], params["beta"]
    axis = strategy.channel_axis(ctx.layout, x.type.rank)
    if ctx.train:
        y, mean, var = normalize(b, x, gamma, beta, [d for d in range(x.type.rank) if d != axis], axis, eps,
                                 ctx.sync_replicas, strategy.chosen("bnReduce", b.target), ctx.sync_processes)
        ctx.batch_stats["mean"], ctx.batch_stats["var"] = mean, var
        return y
    scale = gamma * b.rsqrt(ctx.running["var"] + eps)
    shift = beta - ctx.running["mean"] * scale
    return x * b.broadcast_in_dim(scale, x.shape, [axis]) + b.broadcast_in_dim(shift, x.shape, [axis])


def bn_slots(c: int) -> tuple[ParamSlot, ParamSlot]:
    return ParamSlot("gamma", (c,), "ones", False), ParamSlot("beta", (c,), "zeros", False)


def bn_stats(c: int) -> tuple[StatSlot, StatSlot]:
    return StatSlot("mean", (c,), 0.0), StatSlot("var", (c,), 1.0, nonnegative=True)


# ------------------------------------------------------------------ the references (jax.numpy)
def ref_batch_norm(params: Mapping[str, Any], x: Any, ctx: Ctx | None, eps: float) -> Any:
    import jax.numpy as jnp

    axes = tuple(d for d in range(x.ndim) if d != 1)
    bshape = [1] * x.ndim
    bshape[1] = -1
    mean: Any
    var: Any
    if is_train(ctx):
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(bshape)), axis=axes)  # biased
        if ctx is not None:
            ctx.batch_stats["mean"], ctx.batch_stats["var"] = mean, var  # type: ignore[assignment]
    else:
        assert ctx is not None
        mean, var = ctx.running["mean"], ctx.running["var"]
    xhat = (x - mean.reshape(bshape)) / jnp.sqrt(var.reshape(bshape) + eps)
    return xhat * params["gamma"].reshape(bshape) + params["beta"].reshape(bshape)


def ref_conv(x: Any, w: Any, stride: int, pad: int, groups: int = 1) -> Any:
    from jax import lax

    return lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad), (pad, pad)],
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
                                    precision=lax.Precision.HIGHEST)


# ------------------------------------------------------------------ layers
def check_eps(eps: float) -> None:
    """A normaliser's ε: positive, and one f32 holds (1e300 was inf there, 1e-60 zero)."""
    if not (eps > 0 and f32_holds(eps)):
        raise UnsupportedSpec(f"eps must be a positive number that f32 holds ({F32_RANGE}), got {eps}")


@attrs.frozen
class BatchNorm(Layer):
    """BN on [C, H, W] (statistics over batch and space) or [C] (over the batch), then `act`."""

    kind = "batchNorm"
    strategy_kinds = ("layout", "bnReduce")
    eps: float = BN_EPS
    act: str = "identity"

    def supports_nhwc(self, in_shape: Shape) -> bool:
        return True

    def out_shape(self, in_shape: Shape) -> Shape:
        check_act(self.act)
        check_eps(self.eps)
        if len(in_shape) not in (1, 3):
            raise UnsupportedSpec(f"batchNorm takes [C, H, W] or [C], got {list(in_shape)}")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return bn_slots(in_shape[0])

    def stat_slots(self, in_shape: Shape) -> tuple[StatSlot, ...]:
        return bn_stats(in_shape[0])

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return emit_act(b, self.act, batch_norm(b, x, params, ctx, self.eps))

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return reference_act(self.act, ref_batch_norm(params, x, ctx, self.eps))

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3, 4, 5)), (cls(eps=1e-3, act="relu"), (6,)),
                (cls(), (2, 3, 40))]  # an axis over SUM_BLOCK: bnReduce=blocked sums blocks of 20 first


@attrs.frozen
class InstanceNorm(Layer):
    """Per-example, per-channel statistics over H×W, with γ/β; no running statistics."""

    kind = "instanceNorm"
    eps: float = BN_EPS

    def out_shape(self, in_shape: Shape) -> Shape:
        check_eps(self.eps)
        image(in_shape, "instanceNorm")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return bn_slots(in_shape[0])

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return normalize(b, x, params["gamma"], params["beta"], [2, 3], 1, self.eps)[0]

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        mean = x.mean(axis=(2, 3), keepdims=True)
        var = jnp.square(x - mean).mean(axis=(2, 3), keepdims=True)
        return (x - mean) / jnp.sqrt(var + self.eps) * params["gamma"][None, :, None, None] + \
            params["beta"][None, :, None, None]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3, 4, 5))]


@attrs.frozen
class LayerNorm(Layer):
    """LayerNorm over the channel axis: of NCHW at every pixel ([C, H, W]), or of a flat [C].

    On an image it transposes to [B, H·W, C] so the reduction lands on the inner axis (seed 001:
    the easy case for every lowerer), normalises, and transposes back."""

    kind = "layerNorm"
    eps: float = 1e-6

    def out_shape(self, in_shape: Shape) -> Shape:
        check_eps(self.eps)
        if len(in_shape) not in (1, 3):
            raise UnsupportedSpec(f"layerNorm takes [C, H, W] or [C], got {list(in_shape)}")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return bn_slots(in_shape[0])

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        if x.type.rank == 2:
            return normalize(b, x, params["gamma"], params["beta"], [1], 1, self.eps)[0]
        n, c, h, w = x.shape
        inner = b.reshape(b.transpose(x, [0, 2, 3, 1]), (n, h * w, c))
        y = normalize(b, inner, params["gamma"], params["beta"], [2], 2, self.eps)[0]
        return b.transpose(b.reshape(y, (n, h, w, c)), [0, 3, 1, 2])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        bshape = [1] * x.ndim
        bshape[1] = -1
        mean = x.mean(axis=1, keepdims=True)
        var = jnp.square(x - mean).mean(axis=1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + self.eps) * params["gamma"].reshape(bshape) + \
            params["beta"].reshape(bshape)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (4, 3, 2)), (cls(eps=1e-5), (5,))]


class _ConvBnUnit(Layer):
    """conv (no bias: β follows) → batch norm → act; what ConvBn and DepthwiseConvBn share.
    `pad` None is PyTorch's (k−1)//2. A stride that does not divide the input gives PyTorch's Conv2d
    size, ⌊(n + 2·pad − k)/stride⌋ + 1 (resnet18 at 28×28: 7 → 4 → 2 → 1); a block whose paths then
    disagree is refused by its skip check."""

    strategy_kinds = ("conv2d", "layout", "convGrad", "depthwise", "pointwise", "bnReduce")

    def strategies_for(self, in_shape: Shape) -> tuple[str, ...]:
        c, groups = in_shape[0], self.group_count(in_shape[0])
        pointwise = is_pointwise(self.k, self.stride, groups, [(self.padding, self.padding)] * 2)
        return (*conv_strategies(c, self.out_channels(c), groups, pointwise), "bnReduce")

    k: int
    stride: int
    act: str
    eps: float
    pad: int | None

    def out_channels(self, c: int) -> int:
        raise NotImplementedError  # abstract

    def group_count(self, c: int) -> int:
        raise NotImplementedError  # abstract

    @property
    def padding(self) -> int:
        return (self.k - 1) // 2 if self.pad is None else self.pad

    def out_shape(self, in_shape: Shape) -> Shape:
        check_act(self.act)
        check_eps(self.eps)
        c, h, w = image(in_shape, self.kind)
        oc, g = self.out_channels(c), self.group_count(c)
        if self.k <= 0 or oc <= 0 or self.padding < 0:
            raise UnsupportedSpec(f"out channels and k must be positive, pad non-negative (out={oc}, k={self.k})")
        if self.stride <= 0:
            raise UnsupportedSpec(f"stride must be positive, got {self.stride}")
        if g <= 0 or c % g or oc % g:
            raise UnsupportedSpec(f"groups={g} must divide in channels {c} and out channels {oc}")
        oh, ow = ((n + 2 * self.padding - self.k) // self.stride + 1 for n in (h, w))
        if oh <= 0 or ow <= 0:
            raise UnsupportedSpec(f"kernel {self.k} does not fit a {h}x{w} input")
        return (oc, oh, ow)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        c = in_shape[0]
        oc = self.out_channels(c)
        return (ParamSlot("w", (oc, c // self.group_count(c), self.k, self.k), "he_fan_out", True), *bn_slots(oc))

    def stat_slots(self, in_shape: Shape) -> tuple[StatSlot, ...]:
        return bn_stats(self.out_channels(in_shape[0]))

    def supports_nhwc(self, in_shape: Shape) -> bool:
        return True

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        p = self.padding
        c = strategy.logical(x.shape, ctx.layout)[1]
        y = conv2d(b, x, params["w"], stride=self.stride, pads=[(p, p), (p, p)], groups=self.group_count(c),
                   layout=ctx.layout)
        return emit_act(b, self.act, batch_norm(b, y, params, ctx, self.eps))

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        y = ref_conv(x, params["w"], self.stride, self.padding, self.group_count(x.shape[1]))
        return reference_act(self.act, ref_batch_norm(params, y, ctx, self.eps))


@attrs.frozen
class ConvBn(_ConvBnUnit):
    kind = "convBn"
    out: int
    k: int = 3
    stride: int = 1
    groups: int = 1
    act: str = "relu"
    eps: float = BN_EPS
    pad: int | None = None

    def out_channels(self, c: int) -> int:
        return self.out

    def group_count(self, c: int) -> int:
        return self.groups

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [
            (cls(4, k=3, act="relu"), (3, 4, 4)),
            (cls(4, k=3, stride=2, act="relu6"), (2, 4, 4)),
            (cls(3, k=3, stride=2, act="relu"), (2, 5, 5)),  # a stride that does not divide: 5 → 3
            (cls(3, k=1, stride=2, act="identity"), (2, 5, 5)),  # ... the 1×1 projection's 3 as well
            (cls(3, k=1, act="swish", eps=1e-3), (2, 3, 3)),
            (cls(4, k=3, groups=2, act="hSwish"), (2, 3, 3)),
            (cls(2, k=1, act="identity"), (3, 2, 2)),
        ]


@attrs.frozen
class DepthwiseConvBn(_ConvBnUnit):
    """Depthwise k×k conv (one filter per channel; out channels = in channels) → BN → act."""

    kind = "depthwiseConvBn"
    k: int = 3
    stride: int = 1
    act: str = "relu6"
    eps: float = BN_EPS
    pad: int | None = None

    def out_channels(self, c: int) -> int:
        return c

    def group_count(self, c: int) -> int:
        return c

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(k=3, act="relu6"), (3, 4, 4)), (cls(k=5, stride=2, act="identity"), (2, 4, 4)),
                (cls(k=3, stride=2, act="relu6"), (2, 7, 5))]


def dw(k: int, stride: int = 1, act: str = "relu", eps: float = BN_EPS) -> DepthwiseConvBn:
    return DepthwiseConvBn(k=k, stride=stride, act=act, eps=eps)


@hookimpl
def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
    return [BN_REDUCE]


@hookimpl
def hloforge_layers() -> list[type]:
    return [BatchNorm, InstanceNorm, LayerNorm, ConvBn, DepthwiseConvBn]
