"""Blocks as compositions of layers: one definition of how a block names its sub-layers' slots,
feeds them, routes their statistics and checks its skip — shared by every block plugin
(residual.py, mobile.py, convnext.py).

A block is a main path of `Part`s (a prefix and a layer), an optional shortcut path and an
activation after the sum. A stage is a list of blocks; a block's slots are named
`b{i}.{part prefix}{slot}` ("b0.conv1.w", "b0.conv1.mean"), in walk order, so the stats a
block reports are in its declared `stat_slots` order (the order `qualified_stats` reads).
This module registers no plugin of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.spec import MAX_REPEAT, Ctx, Layer, MaskSlot, ParamSlot, Shape, StatSlot
from hloforge.plugins.layers.activation import check_act, emit_act, reference_act


@attrs.frozen
class Part:
    prefix: str  # e.g. "conv1."; slots become prefix + slot name
    layer: Layer


@attrs.frozen
class Block:
    main: tuple[Part, ...] = attrs.field(converter=tuple)
    # None: no skip connection; (): identity skip; otherwise the projection path.
    short: tuple[Part, ...] | None = None
    act: str = "identity"  # applied after the sum
    # Stochastic depth: in training the main path is scaled per example by a host-drawn mask
    # (MaskSlot "drop", kept with probability 1 − drop_path) before the skip is added.
    drop_path: float = attrs.field(default=0.0)

    @drop_path.validator
    def _check_drop_path(self, attribute: Any, value: float) -> None:
        if not 0.0 <= value < 1.0:
            raise UnsupportedSpec(f"drop_path must be in [0, 1), got {value}")


def is_train(ctx: Ctx | None) -> bool:
    """References may be called with ctx None (plain training-mode forward, as the train-step oracle does)."""
    return ctx is None or ctx.train


def sub_ctx(ctx: Ctx | None, prefix: str, stats: Sequence[StatSlot]) -> Ctx:
    """The part's own view of the block's context: its running values, by unprefixed name."""
    layout = strategy.NCHW if ctx is None else ctx.layout
    if is_train(ctx):
        return Ctx(train=True, sync_replicas=1 if ctx is None else ctx.sync_replicas,
                   sync_processes=1 if ctx is None else ctx.sync_processes, layout=layout)
    assert ctx is not None
    return Ctx(train=False, running={s.name: ctx.running[prefix + s.name] for s in stats}, layout=layout)


def lift_stats(ctx: Ctx | None, prefix: str, sub: Ctx, stats: Sequence[StatSlot]) -> None:
    if ctx is not None and is_train(ctx):
        for s in stats:
            ctx.batch_stats[prefix + s.name] = sub.batch_stats[s.name]


def image(in_shape: Shape, kind: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise UnsupportedSpec(f"{kind} takes an image [C, H, W], got {list(in_shape)}")
    c, h, w = in_shape
    return c, h, w


def check_stride(stride: int, in_shape: Shape) -> None:
    """For a block whose paths meet at an exact multiple (UNet's ×2 upsample onto its skip) or whose
    window would leave the last row out (ConvNeXt's 2×2 downsample of an odd map): the stride must
    divide the input, no silent floor."""
    _, h, w = in_shape
    if stride <= 0:
        raise UnsupportedSpec(f"stride must be positive, got {stride}")
    if h % stride or w % stride:
        raise UnsupportedSpec(f"stride {stride} does not divide the {h}x{w} input")


# ------------------------------------------------------------------ one path of parts
def path_shapes(parts: Sequence[Part], shape: Shape) -> list[Shape]:
    """The input shape of every part, then the path's output shape."""
    shapes = [tuple(shape)]
    for p in parts:
        try:
            shapes.append(p.layer.out_shape(shapes[-1]))
        except UnsupportedSpec as e:
            raise UnsupportedSpec(f"{p.prefix.rstrip('.') or p.layer.kind}: {e}") from None
    return shapes


def path_params(parts: Sequence[Part], shape: Shape, prefix: str) -> list[ParamSlot]:
    shapes = path_shapes(parts, shape)
    return [attrs.evolve(s, name=prefix + p.prefix + s.name)
            for p, sh in zip(parts, shapes, strict=False) for s in p.layer.param_slots(sh)]


def path_stats(parts: Sequence[Part], shape: Shape, prefix: str) -> list[StatSlot]:
    shapes = path_shapes(parts, shape)
    return [attrs.evolve(s, name=prefix + p.prefix + s.name)
            for p, sh in zip(parts, shapes, strict=False) for s in p.layer.stat_slots(sh)]


def path_forward(b: Builder, parts: Sequence[Part], x: Value, params: Mapping[str, Value], ctx: Ctx,
                 prefix: str) -> Value:
    for p in parts:
        shape = strategy.logical(x.shape, ctx.layout)[1:]
        pre = prefix + p.prefix
        stats = p.layer.stat_slots(shape)
        sub = sub_ctx(ctx, pre, stats)
        x = p.layer.forward(b, x, {s.name: params[pre + s.name] for s in p.layer.param_slots(shape)}, sub)
        lift_stats(ctx, pre, sub, stats)
    return x


def path_reference(parts: Sequence[Part], params: Mapping[str, Any], x: Any, ctx: Ctx | None, prefix: str) -> Any:
    for p in parts:
        shape = tuple(x.shape[1:])
        pre = prefix + p.prefix
        stats = p.layer.stat_slots(shape)
        sub = sub_ctx(ctx, pre, stats)
        x = p.layer.reference({s.name: params[pre + s.name] for s in p.layer.param_slots(shape)}, x, sub)
        lift_stats(ctx, pre, sub, stats)
    return x


# ------------------------------------------------------------------ blocks and stages
class BlockLayer(Layer):
    """A layer made of blocks. Subclasses implement `blocks(in_shape)`: the (prefix, Block) list,
    raising UnsupportedSpec for options no input could satisfy; the shape walk here adds the
    block index to every refusal and checks each skip."""

    strategy_kinds = ("layout",)  # gated NHWC where `supports_nhwc` (every part takes it)

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        raise NotImplementedError  # abstract

    def _walk(self, in_shape: Shape) -> list[tuple[str, Block, Shape]]:
        out, shape = [], tuple(in_shape)
        for i, (prefix, blk) in enumerate(self.blocks(in_shape)):
            try:
                check_act(blk.act)
                main = path_shapes(blk.main, shape)[-1]
                if blk.short is not None:
                    short = path_shapes(blk.short, shape)[-1]
                    if short != main:
                        how = "identity skip" if not blk.short else "projection skip"
                        raise UnsupportedSpec(f"{how} gives {list(short)} but the main path gives {list(main)}; "
                                              "channels and stride must match across a skip")
            except UnsupportedSpec as e:
                raise UnsupportedSpec(f"block {i}: {e}") from None
            out.append((prefix, blk, shape))
            shape = main
        return out

    def out_shape(self, in_shape: Shape) -> Shape:
        walk = self._walk(in_shape)
        prefix, blk, shape = walk[-1]
        return path_shapes(blk.main, shape)[-1]

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        out: list[ParamSlot] = []
        for prefix, blk, shape in self._walk(in_shape):
            out += path_params(blk.main, shape, prefix)
            out += path_params(blk.short or (), shape, prefix)
        return tuple(out)

    def stat_slots(self, in_shape: Shape) -> tuple[StatSlot, ...]:
        out: list[StatSlot] = []
        for prefix, blk, shape in self._walk(in_shape):
            out += path_stats(blk.main, shape, prefix)
            out += path_stats(blk.short or (), shape, prefix)
        return tuple(out)

    def mask_slots(self, in_shape: Shape) -> tuple[MaskSlot, ...]:
        return tuple(MaskSlot(prefix + "drop", (), blk.drop_path)
                     for prefix, blk, _ in self._walk(in_shape) if blk.drop_path and blk.short is not None)

    def supports_nhwc(self, in_shape: Shape) -> bool:
        """NHWC through the block when every part of every path takes it (the sum, the drop-path
        scale and the activation are layout-blind)."""
        return all(p.layer.supports_nhwc(sh) for _, blk, shape in self._walk(in_shape)
                   for path in (blk.main, blk.short or ())
                   for p, sh in zip(path, path_shapes(path, shape), strict=False))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        for prefix, blk, _ in self._walk(strategy.logical(x.shape, ctx.layout)[1:]):
            y = path_forward(b, blk.main, x, params, ctx, prefix)
            if prefix + "drop" in ctx.masks:
                y = y * b.broadcast_in_dim(ctx.masks[prefix + "drop"], y.shape, [0])
            if blk.short is not None:
                y = y + path_forward(b, blk.short, x, params, ctx, prefix)
            x = emit_act(b, blk.act, y)
        return x

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        for prefix, blk, _ in self._walk(tuple(x.shape[1:])):
            y = path_reference(blk.main, params, x, ctx, prefix)
            if ctx is not None and prefix + "drop" in ctx.masks:
                m = ctx.masks[prefix + "drop"]
                y = y * m.reshape(m.shape + (1,) * (y.ndim - 1))
            if blk.short is not None:
                y = y + path_reference(blk.short, params, x, ctx, prefix)
            x = reference_act(blk.act, y)
        return x


def stage_blocks(n: int, make: Any, in_shape: Shape, oc: int) -> list[tuple[str, Block]]:
    """n blocks `make(i, ic)`; the first takes the stage's input channels, the rest `oc`."""
    if not 0 < n <= MAX_REPEAT:
        raise UnsupportedSpec(f"a stage needs 1..{MAX_REPEAT} blocks, got n={n}")
    return [(f"b{i}.", make(i, in_shape[0] if i == 0 else oc)) for i in range(n)]


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Channel rounding of the MobileNet/EfficientNet references (torchvision, timm): to the nearest
    multiple of `divisor`, never more than 10% below `v`."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v
