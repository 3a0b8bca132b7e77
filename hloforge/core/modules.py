"""Module generators: forward, eval, train step, vjp and optimizer step.

`TrainStepLayout` is the one definition of the train step's argument and
result order; sessions, checkpoints and tests read it rather than restating it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from hloforge.core import autodiff
from hloforge.core.hlo import FLOAT_DTYPES, Builder, Value
from hloforge.core.registry import Registry, default_registry
from hloforge.core.spec import (
    Ctx,
    Layer,
    LayerShapes,
    Loss,
    MaskSlot,
    NetSpec,
    ParamSlot,
    Shape,
    StatSlot,
    qualified_masks,
    qualified_params,
    qualified_stats,
    walk_layers,
)
from hloforge.core.variant import Optimizer, Variant


def emit_layers(b: Builder, walk: Sequence[LayerShapes], x: Value, params: Sequence[Value], *, train: bool,
                running: Sequence[Value] = (), masks: Sequence[Value] = ()) -> tuple[Value, list[Value]]:
    """The forward walk: each layer's ops, fed its own slots by name. Returns the output and,
    in training, the batch value of every stat slot (qualified_stats order); in eval the
    running values come in through `running` in that same order. `masks` (qualified_masks
    order) are given only by the train step and the gate's modules; without them a
    dropout or drop-path layer is the identity."""
    p_it, r_it, m_it = iter(params), iter(running), iter(masks)
    batch_stats: list[Value] = []
    for ls in walk:
        mine = {s.name: next(p_it) for s in ls.slots}
        ctx = Ctx(train=train, running={} if train else {s.name: next(r_it) for s in ls.stats},
                  masks={s.name: next(m_it) for s in ls.masks} if masks else {})
        x = ls.layer.forward(b, x, mine, ctx)
        want = (x.shape[0], *ls.out_shape)
        if x.shape != want:
            raise AssertionError(f"layer {ls.index} ({ls.layer.kind}) emitted {list(x.shape)}, declared {list(want)}")
        if train:
            missing = [s.name for s in ls.stats if s.name not in ctx.batch_stats]
            if missing:
                raise AssertionError(f"layer {ls.index} ({ls.layer.kind}) did not report stats {missing}")
            batch_stats += [ctx.batch_stats[s.name] for s in ls.stats]
    return x, batch_stats


def forward_module(spec: NetSpec, batch: int, *, dtype: str = "f32", eval_mode: bool = False) -> str:
    """`@main(x, θ…) -> logits` normalising with batch statistics; the eval form
    `@main(x, θ…, running…) -> logits` takes every stat slot's running value instead."""
    walk = spec.walk()
    b = Builder(dtype, f"{spec.ident}_fwd" + ("_eval" if eval_mode else ""))
    x = b.arg((batch, *spec.input_shape))
    params = [b.arg(s.shape) for _, s in qualified_params(walk)]
    running = [b.arg(s.shape) for _, s in qualified_stats(walk)] if eval_mode else []
    y, _ = emit_layers(b, walk, x, params, train=not eval_mode, running=running)
    return b.module([y])


@attrs.frozen
class TrainStepLayout:
    """Inputs: θ…, then each state group (all m…, all v…), scalars…, x, y, masks….
    Outputs: θ'…, state'… (same order), loss, batch stats… (qualified_stats order).
    Parameter and state inputs alias their outputs."""

    params: tuple[tuple[str, ParamSlot], ...]
    stats: tuple[tuple[str, StatSlot], ...]
    masks: tuple[tuple[str, MaskSlot], ...]
    state: tuple[str, ...]
    scalars: tuple[str, ...]
    x_shape: Shape
    y_shape: Shape
    y_dtype: str

    @property
    def n_params(self) -> int:
        return len(self.params)

    @property
    def n_carried(self) -> int:
        """θ and optimizer state: the inputs that alias outputs 0..n_carried-1."""
        return self.n_params * (1 + len(self.state))

    @property
    def loss_index(self) -> int:
        return self.n_carried


def label_type(loss: Loss, out_shape: Shape, dtype: str) -> tuple[Shape, str]:
    """The loss's per-example label shape and element type; float targets follow the module's dtype."""
    loss.check(out_shape)
    y_shape, y_dtype = loss.label_spec(out_shape)
    return y_shape, dtype if y_dtype in FLOAT_DTYPES else y_dtype


def train_step_layout(spec: NetSpec, opt: Optimizer, loss: Loss, batch: int, dtype: str = "f32") -> TrainStepLayout:
    walk = spec.walk()
    y_shape, y_dtype = label_type(loss, walk[-1].out_shape, dtype)
    return TrainStepLayout(tuple(qualified_params(walk)), tuple(qualified_stats(walk)), tuple(qualified_masks(walk)),
                           opt.state, opt.scalars,
                           (batch, *spec.input_shape),
                           (batch, *y_shape), y_dtype)


def train_step_module(spec: NetSpec, variant: Variant, batch: int, *, dtype: str = "f32",
                      registry: Registry | None = None) -> tuple[str, TrainStepLayout]:
    reg = registry or default_registry()
    opt, loss = variant.make_optimizer(reg), variant.make_loss(reg)
    lay = train_step_layout(spec, opt, loss, batch, dtype)
    walk = spec.walk()
    b = Builder(dtype, f"{spec.ident}_{variant.slug}_train_step")
    params = [b.arg(s.shape, alias_output=i) for i, (_, s) in enumerate(lay.params)]
    state = {name: [b.arg(s.shape, alias_output=lay.n_params * (1 + k) + i) for i, (_, s) in enumerate(lay.params)]
             for k, name in enumerate(lay.state)}
    scalars = {name: b.arg(()) for name in lay.scalars}
    x = b.arg(lay.x_shape)
    y = b.arg(lay.y_shape, lay.y_dtype)
    masks = [b.arg((batch, *s.shape)) for _, s in lay.masks]
    logits, batch_stats = emit_layers(b, walk, x, params, train=True, masks=masks)
    loss_v = loss.forward(b, logits, y)
    grads = autodiff.grad(b, [loss_v], [b.full(1.0)], params)
    new_params: list[Value] = []
    new_state: dict[str, list[Value]] = {name: [] for name in lay.state}
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        p2, s2 = opt.update(b, p, g, {n: state[n][i] for n in lay.state}, scalars, lay.params[i][1])
        new_params.append(p2)
        for n in lay.state:
            new_state[n].append(s2[n])
    outs = new_params + [v for n in lay.state for v in new_state[n]] + [loss_v] + batch_stats
    return b.module(outs), lay


def vjp_module(layers: Sequence[Layer], in_shape: Shape, batch: int, *, dtype: str = "f32",
               name: str = "vjp") -> str:
    """`@main(θ…, x, ḡ, masks…) -> (y, ∂θ…, ∂x)`: sums over the batch, no loss (composable nets
    take ḡ in); the masks (if any layer has mask slots) are fixed inputs, not differentiated."""
    walk = walk_layers(layers, in_shape)
    b = Builder(dtype, name)
    params = [b.arg(s.shape) for _, s in qualified_params(walk)]
    x = b.arg((batch, *in_shape))
    gbar = b.arg((batch, *walk[-1].out_shape))
    masks = [b.arg((batch, *s.shape)) for _, s in qualified_masks(walk)]
    y, _ = emit_layers(b, walk, x, params, train=True, masks=masks)
    cts = autodiff.grad(b, [y], [gbar], [*params, x])
    return b.module([y, *cts])


def layers_forward_module(layers: Sequence[Layer], in_shape: Shape, batch: int, *, dtype: str = "f32",
                          name: str = "fwd") -> str:
    """`@main(θ…, x, masks…) -> y` for a bare layer stack: what finite differences probe."""
    walk = walk_layers(layers, in_shape)
    b = Builder(dtype, name)
    params = [b.arg(s.shape) for _, s in qualified_params(walk)]
    x = b.arg((batch, *in_shape))
    masks = [b.arg((batch, *s.shape)) for _, s in qualified_masks(walk)]
    return b.module([emit_layers(b, walk, x, params, train=True, masks=masks)[0]])


def loss_module(loss: Loss, out_shape: Shape, batch: int, *, dtype: str = "f32") -> str:
    """Probe `@main(logits, y) -> (loss, ∂loss/∂logits)`."""
    y_shape, y_dtype = label_type(loss, out_shape, dtype)
    b = Builder(dtype, f"probe_{loss.name}")
    logits = b.arg((batch, *out_shape))
    y = b.arg((batch, *y_shape), y_dtype)
    lv = loss.forward(b, logits, y)
    (g,) = autodiff.grad(b, [lv], [b.full(1.0)], [logits])
    return b.module([lv, g])


def optimizer_step_module(params: Sequence[ParamSlot], opt: Optimizer, *, dtype: str = "f32",
                          name: str = "optimizer_step") -> str:
    """`@main(θ…, state…, ∂θ…, scalars…) -> (θ'…, state'…)` for a gradient the caller assembled."""
    b = Builder(dtype, name)
    n = len(params)
    ps = [b.arg(s.shape, alias_output=i) for i, s in enumerate(params)]
    st = {name: [b.arg(s.shape, alias_output=n * (1 + k) + i) for i, s in enumerate(params)]
          for k, name in enumerate(opt.state)}
    gs = [b.arg(s.shape) for s in params]
    sc = {name: b.arg(()) for name in opt.scalars}
    new_p: list[Value] = []
    new_s: dict[str, list[Value]] = {name: [] for name in opt.state}
    for i, slot in enumerate(params):
        p2, s2 = opt.update(b, ps[i], gs[i], {k: st[k][i] for k in opt.state}, sc, slot)
        new_p.append(p2)
        for k in opt.state:
            new_s[k].append(s2[k])
    return b.module(new_p + [v for k in opt.state for v in new_s[k]])
