"""U-Net layers (seed 001): bilinearUpsample, pushSkip, concat, unetDown, unetUp.

A U-Net is a flat layer list whose encoder → decoder skips ride the walk's skip stack
(`Layer.skip_out` / `skip_in`, `Ctx.skips`): `unetDown` leaves its pre-pool features there and
the matching `unetUp` (the most recent unconsumed one, so levels nest) concatenates them back.

- bilinearUpsample: ×scale with half-pixel centres (align_corners = false, edges clamped),
  written as two dot_generals with constant interpolation matrices (Wy along H, then Wx along
  W), so its backward is the transposed matmul pair the dot_general rule derives.
- pushSkip: the identity that pushes its input; concat(channels): pops a skip of `channels`
  channels at this resolution and appends it to the input's channels ([x, skip]).
- unetDown(out): convBn(out) → convBn(out) → push skip → maxPool 2.
- unetUp(out): bilinear ×2 → concat the skip (out channels: the matching unetDown's) →
  convBn(out) → convBn(out). The convBns have no conv bias (β follows).

`SkipChain` is the gate's harness for layers that push or pop: a skip-balanced stack of
layers run as one single-input layer (registered as nothing; see each layer's gate_cases).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.resample import bilinear_matrix
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape, StatSlot, walk_layers
from hloforge.plugins.layers.compose import (
    Part,
    check_stride,
    image,
    is_train,
    path_forward,
    path_params,
    path_reference,
    path_shapes,
    path_stats,
)
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.norm import BN_EPS, ConvBn
from hloforge.plugins.layers.pool import MaxPool

POOL = MaxPool(2)


def _positive(name: str, v: int) -> None:
    if v <= 0:
        raise UnsupportedSpec(f"{name} must be positive, got {v}")


def bilinear_upsample(b: Builder, x: Value, scale: int) -> Value:
    """[n, c, h, w] → [n, c, h·s, w·s]: contract H with Wy [h·s, h] (→ [n, c, w, h·s]), then W with
    Wx [w·s, w] (→ [n, c, h·s, w·s]); the second contraction leaves the axes in NCHW order."""
    n, c, h, w = x.shape
    wy = b.constant(bilinear_matrix(h, h * scale), x.dtype)
    wx = b.constant(bilinear_matrix(w, w * scale), x.dtype)
    y = b.dot_general(x, wy, ([2], [1]))
    return b.dot_general(y, wx, ([2], [1]))


def ref_bilinear_upsample(x: Any, scale: int) -> Any:
    import jax

    n, c, h, w = x.shape
    return jax.image.resize(x, (n, c, h * scale, w * scale), "bilinear")


@attrs.frozen
class BilinearUpsample(Layer):
    kind = "bilinearUpsample"
    scale: int = 2

    def out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = image(in_shape, self.kind)
        _positive("scale", self.scale)
        return (c, h * self.scale, w * self.scale)

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return bilinear_upsample(b, x, self.scale)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return ref_bilinear_upsample(x, self.scale)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (2, 3, 4)), (cls(scale=3), (1, 2, 3))]


@attrs.frozen
class PushSkip(Layer):
    """The identity, leaving its input on the skip stack for a later concat / unetUp."""

    kind = "pushSkip"

    def out_shape(self, in_shape: Shape) -> Shape:
        image(in_shape, self.kind)
        return in_shape

    def skip_out(self, in_shape: Shape) -> Shape | None:
        return in_shape

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        ctx.skips.append(x)
        return x

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        _ref_skips(ctx).append(x)
        return x

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(SkipChain((cls(), Conv2d(2, k=1), Concat(3)), cls.kind), (3, 2, 3))]


@attrs.frozen
class Concat(Layer):
    """[x, skip] along channels; the skip (popped) has `channels` channels and x's resolution."""

    kind = "concat"
    channels: int

    def out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = image(in_shape, self.kind)
        _positive("channels", self.channels)
        return (c + self.channels, h, w)

    def skip_in(self, in_shape: Shape) -> Shape | None:
        return (self.channels, *in_shape[1:])

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return b.concatenate([x, ctx.skips.pop()], 1)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        return jnp.concatenate([x, _ref_skips(ctx).pop()], axis=1)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(SkipChain((PushSkip(), Conv2d(3, k=3), Concat(2)), cls.kind), (2, 3, 3))]


def _ref_skips(ctx: Ctx | None) -> list[Any]:
    if ctx is None:
        raise UnsupportedSpec("a skip layer's reference needs the walk's Ctx (its skip stack)")
    return ctx.skips


class _ConvPair(Layer):
    """What unetDown and unetUp share: two convBn(out) parts named c1., c2."""

    out: int
    eps: float

    @property
    def parts(self) -> tuple[Part, ...]:
        return (Part("c1.", ConvBn(self.out, eps=self.eps)), Part("c2.", ConvBn(self.out, eps=self.eps)))

    def conv_input(self, in_shape: Shape) -> Shape:
        raise NotImplementedError  # abstract

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return tuple(path_params(self.parts, self.conv_input(in_shape), ""))

    def stat_slots(self, in_shape: Shape) -> tuple[StatSlot, ...]:
        return tuple(path_stats(self.parts, self.conv_input(in_shape), ""))


@attrs.frozen
class UnetDown(_ConvPair):
    kind = "unetDown"
    out: int
    eps: float = BN_EPS

    def conv_input(self, in_shape: Shape) -> Shape:
        return in_shape

    def out_shape(self, in_shape: Shape) -> Shape:
        _positive("out", self.out)
        image(in_shape, self.kind)
        check_stride(2, in_shape)  # the 2×2 pool must halve exactly, or unetUp's ×2 cannot meet the skip
        c, h, w = path_shapes(self.parts, in_shape)[-1]
        return (c, h // 2, w // 2)

    def skip_out(self, in_shape: Shape) -> Shape | None:
        return (self.out, *in_shape[1:])

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        y = path_forward(b, self.parts, x, params, ctx, "")
        ctx.skips.append(y)
        return POOL.forward(b, y, {}, ctx)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        y = path_reference(self.parts, params, x, ctx, "")
        _ref_skips(ctx).append(y)
        return POOL.reference({}, y, Ctx())

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(SkipChain((cls(2), BilinearUpsample(), Concat(2)), cls.kind), (3, 4, 4))]


@attrs.frozen
class UnetUp(_ConvPair):
    kind = "unetUp"
    out: int
    eps: float = BN_EPS

    def conv_input(self, in_shape: Shape) -> Shape:
        c, h, w = in_shape
        return (c + self.out, 2 * h, 2 * w)

    def out_shape(self, in_shape: Shape) -> Shape:
        _positive("out", self.out)
        image(in_shape, self.kind)
        return path_shapes(self.parts, self.conv_input(in_shape))[-1]

    def skip_in(self, in_shape: Shape) -> Shape | None:
        return (self.out, 2 * in_shape[1], 2 * in_shape[2])

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        y = b.concatenate([bilinear_upsample(b, x, 2), ctx.skips.pop()], 1)
        return path_forward(b, self.parts, y, params, ctx, "")

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        y = jnp.concatenate([ref_bilinear_upsample(x, 2), _ref_skips(ctx).pop()], axis=1)
        return path_reference(self.parts, params, y, ctx, "")

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        # up's input (3 channels at 2×2) differs from its skip (2 channels at 4×4)
        return [(SkipChain((PushSkip(), POOL, Conv2d(3, k=1), cls(2)), cls.kind), (2, 4, 4))]


# ------------------------------------------------------------------ the gate's harness
@attrs.frozen
class SkipChain(Layer):
    """A skip-balanced stack of layers as one layer: slots named `{i}.{slot}`, one skip stack
    for the stack's walk, the stack's input as `net_input` (unless an outer walk gives one)."""

    layers: tuple[Layer, ...] = attrs.field(converter=tuple)
    gated: str = ""  # the layer kind this chain gates: its kind, so a gate row names that layer

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.gated or "skipChain"

    def to_dict(self) -> dict[str, Any]:
        def brief(layer: Layer) -> str:
            return f"{layer.kind}({','.join(f'{k}={v}' for k, v in layer.to_dict().items() if k != 'kind')})"

        return {"kind": self.kind, "chain": "+".join(brief(layer) for layer in self.layers)}

    def _walk(self, in_shape: Shape) -> Any:
        return walk_layers(self.layers, in_shape)

    def out_shape(self, in_shape: Shape) -> Shape:
        out: Shape = self._walk(in_shape)[-1].out_shape
        return out

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return tuple(attrs.evolve(s, name=f"{ls.index}.{s.name}") for ls in self._walk(in_shape) for s in ls.slots)

    def stat_slots(self, in_shape: Shape) -> tuple[StatSlot, ...]:
        return tuple(attrs.evolve(s, name=f"{ls.index}.{s.name}") for ls in self._walk(in_shape) for s in ls.stats)

    def _run(self, x: Any, params: Mapping[str, Any], ctx: Ctx | None, call: Any) -> Any:
        train = is_train(ctx)
        skips: list[Any] = []
        net_input = ctx.net_input if ctx is not None and ctx.net_input is not None else x
        for ls in self._walk(tuple(x.shape[1:])):
            pre = f"{ls.index}."
            running = {} if train or ctx is None else {s.name: ctx.running[pre + s.name] for s in ls.stats}
            sub = Ctx(train=train, running=running, skips=skips, net_input=net_input)
            x = call(ls.layer, x, {s.name: params[pre + s.name] for s in ls.slots}, sub)
            if train and ctx is not None:
                ctx.batch_stats.update({pre + k: v for k, v in sub.batch_stats.items()})
        return x

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        out: Value = self._run(x, params, ctx, lambda layer, v, p, c: layer.forward(b, v, p, c))
        return out

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return self._run(x, params, ctx, lambda layer, v, p, c: layer.reference(p, v, c))


def unet_levels(widths: Sequence[int], bottleneck: Sequence[int]) -> list[Layer]:
    """The encoder → bottleneck → decoder body of a U-Net: unetDown per width, convBn per bottleneck
    width, unetUp per width in reverse (each meeting its unetDown's skip)."""
    layers: list[Layer] = [UnetDown(w) for w in widths]
    layers += [ConvBn(w) for w in bottleneck]
    layers += [UnetUp(w) for w in reversed(widths)]
    return layers


@hookimpl
def hloforge_layers() -> list[type]:
    return [BilinearUpsample, PushSkip, Concat, UnetDown, UnetUp]
