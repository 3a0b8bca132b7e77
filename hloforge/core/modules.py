"""Module generators: forward, eval, train step, vjp and optimizer step.

`TrainStepLayout` is the one definition of the train step's argument and
result order; sessions, checkpoints and tests read it rather than restating it.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence

import attrs
import numpy as np

from hloforge.core import autodiff, hlo, strategy
from hloforge.core.errors import PluginError, UnsupportedSpec
from hloforge.core.hlo import FLOAT_DTYPES, Builder, Value
from hloforge.core.registry import Registry, component_label, default_registry
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
from hloforge.core.variant import Optimizer, StateLayout, Variant, Wrappers


def emit_layers(b: Builder, walk: Sequence[LayerShapes], x: Value, params: Sequence[Value], *, train: bool,
                running: Sequence[Value] = (), masks: Sequence[Value] = (),
                sync_replicas: int = 1, sync_processes: int = 1) -> tuple[Value, list[Value]]:
    """The forward walk: each layer's ops, fed its own slots by name. Returns the output and,
    in training, the batch value of every stat slot (qualified_stats order); in eval the
    running values come in through `running` in that same order. `masks` (qualified_masks
    order) are given only by the train step and the gate's modules; without them a
    dropout or drop-path layer is the identity. `sync_replicas` > 1: batch statistics are pooled
    over that many replicas (sync BN; see Ctx), and `sync_processes` > 1 over that many processes.
    With strategy layout=nhwc (core/strategy.py) images run NHWC through every stretch of layers that
    `supports_nhwc`, transposed at its ends."""
    p_it, r_it, m_it = iter(params), iter(running), iter(masks)
    batch_stats: list[Value] = []
    skips: list[Value] = []  # the walk's skip stack (Layer.skip_out / skip_in), one list for every layer
    net_input = x
    nhwc = strategy.chosen("layout", b.target) == "nhwc"
    layout = strategy.NCHW  # of x
    for ls in walk:
        mine = {s.name: next(p_it) for s in ls.slots}
        here = strategy.NHWC if nhwc and len(ls.in_shape) == 3 and ls.layer.supports_nhwc(ls.in_shape) \
            else strategy.NCHW
        x, layout = strategy.to_layout(b, x, layout, here), here
        ctx = Ctx(train=train, running={} if train else {s.name: next(r_it) for s in ls.stats},
                  masks={s.name: next(m_it) for s in ls.masks} if masks else {}, sync_replicas=sync_replicas,
                  sync_processes=sync_processes, skips=skips, net_input=net_input, layout=layout)
        start = len(b.tape)
        with strategy.in_layer(ls.layer, ls.in_shape):  # a `strategy.tuned` plan's choices for this layer
            try:
                x = ls.layer.forward(b, x, mine, ctx)
            except UnsupportedSpec as e:
                if not _raised_by_builder(e):
                    raise
                # the builder's refusal names an op; the author needs the layer whose forward misused it
                raise PluginError(f"{component_label('layer', ls.layer)}: layer {ls.index}'s forward: {e}") from e
        if not isinstance(x, Value):
            raise PluginError(f"{component_label('layer', ls.layer)}: layer {ls.index}'s forward returned {x!r}, "
                              "expected the builder value of its output")
        want = strategy.physical((x.shape[0], *ls.out_shape), layout)
        if x.shape != want:  # the plugin's two rules disagree: say so before the next layer's ops fail on it
            raise PluginError(f"{component_label('layer', ls.layer)}: layer {ls.index}'s forward emitted "
                              f"{list(x.shape)}, but its out_shape declares {list(want)} ({layout}, batch first)")
        if x.dtype != b.dtype:  # else the next layer is blamed, and a lone layer (the gate's) renders and passes
            raise PluginError(f"{component_label('layer', ls.layer)}: layer {ls.index}'s forward emitted {x.type}, "
                              f"expected the module's element type {b.dtype} (its input's)")
        autodiff.claim_custom_ops(b.tape[start:], functools.partial(_backward_of, ls))
        if x.type.rank != 4:
            layout = strategy.NCHW
        if train:
            missing = [s.name for s in ls.stats if s.name not in ctx.batch_stats]
            if missing:
                raise PluginError(f"{component_label('layer', ls.layer)}: layer {ls.index}'s forward did not "
                                  f"report the batch statistics {missing} its stat_slots declare (ctx.batch_stats)")
            batch_stats += [ctx.batch_stats[s.name] for s in ls.stats]
    return strategy.to_layout(b, x, layout, strategy.NCHW), batch_stats


def _backward_of(ls: LayerShapes) -> str:
    """Who a refusal of a closed-form backward (a custom_vjp's bwd) emitted by the layer of `ls` names."""
    return f"{component_label('layer', ls.layer)}: layer {ls.index}'s backward"


# ------------------------------------------------------------------ parameter storage
#: the axes a 4-D parameter (a conv kernel, OIHW) is stored in under paramLayout=hwio
HWIO = (2, 3, 1, 0)
Storage = tuple[tuple[int, ...] | None, ...]


def param_storage(params: Sequence[tuple[str, ParamSlot]], target: str | None) -> Storage:
    """How the compiled modules of `target` carry each parameter: the axis permutation of its
    declared layout it is stored in, or None for the declared layout (strategy paramLayout)."""
    hwio = strategy.chosen(strategy.PARAM_LAYOUT.name, target) == "hwio"
    return tuple(HWIO if hwio and len(s.shape) == 4 else None for _, s in params)


def _inverse(perm: Sequence[int]) -> list[int]:
    return [int(a) for a in np.argsort(perm)]


def stored_shape(shape: Shape, perm: tuple[int, ...] | None) -> Shape:
    return shape if perm is None else tuple(shape[a] for a in perm)


def stored_view(b: Builder, v: Value, perm: tuple[int, ...] | None) -> Value:
    """A stored parameter (or a tensor of its shape) in its declared layout."""
    return v if perm is None else b.transpose(v, _inverse(perm))


def to_stored(b: Builder, v: Value, perm: tuple[int, ...] | None) -> Value:
    """A tensor in a parameter's declared layout, as that parameter is stored."""
    return v if perm is None else b.transpose(v, list(perm))


def host_relaid(a: np.ndarray, perm: Sequence[int] | None) -> np.ndarray:
    """A host array with its axes permuted by `perm` (None: as it is)."""
    return np.asarray(a) if perm is None else np.ascontiguousarray(np.transpose(a, perm))


def host_stored(arrays: Sequence[np.ndarray], storage: Storage) -> list[np.ndarray]:
    """Host arrays in their declared layouts, as the modules carry them (storage[i % len] for the
    i-th: parameters, then each optimizer-state group of one tensor per parameter)."""
    n = len(storage)
    return [host_relaid(a, storage[i % n] if n else None) for i, a in enumerate(arrays)]


def host_declared(arrays: Sequence[np.ndarray], storage: Storage, start: int = 0) -> list[np.ndarray]:
    """Stored arrays (the `start`-th first, counted as in `host_stored`) back in their declared layouts."""
    n = len(storage)
    perms = [storage[i % n] if n else None for i in range(start, start + len(arrays))]
    return [host_relaid(a, None if q is None else _inverse(q)) for a, q in zip(arrays, perms, strict=True)]


def forward_input_roles(spec: NetSpec, eval_mode: bool = False) -> list[tuple[str, str]]:
    """(group, name) of forward_module's inputs, in order: ("x", ""), ("param", θ)…, and in the eval form
    ("stat", running statistic)…; its one output is the net's ("out", "")."""
    walk = spec.walk()
    return [("x", ""), *(("param", n) for n, _ in qualified_params(walk)),
            *((("stat", n) for n, _ in qualified_stats(walk)) if eval_mode else ())]


def forward_module(spec: NetSpec, batch: int, *, dtype: str = "f32", eval_mode: bool = False,
                   target: str | None = None, suffix: str = "") -> str:
    """`@main(x, θ…) -> logits` normalising with batch statistics; the eval form
    `@main(x, θ…, running…) -> logits` takes every stat slot's running value instead. `target`:
    the backend it is rendered for (its layers' lowering strategies, core/strategy.py; θ stored
    as `param_storage` says). `suffix` ends the module's name (`_s224`: the eval graph at another
    size, seed 003's `…_fwd_eval_s<S>`), so its artifacts never share the trained size's name."""
    walk = spec.walk()
    b = Builder(dtype, f"{spec.ident}_fwd" + ("_eval" if eval_mode else "") + suffix, target)
    x = b.arg((batch, *spec.input_shape))
    slots = qualified_params(walk)
    storage = param_storage(slots, target)
    params = [stored_view(b, b.arg(stored_shape(s.shape, perm)), perm)
              for (_, s), perm in zip(slots, storage, strict=True)]
    running = [b.arg(s.shape) for _, s in qualified_stats(walk)] if eval_mode else []
    y, _ = emit_layers(b, walk, x, params, train=not eval_mode, running=running)
    return b.module([y])


@attrs.frozen
class TrainStepLayout:
    """Inputs: θ…, then each state group (all m…, all v…, then G… and E… when the variant's
    wrappers keep them; `state` is `StateLayout.slots`), the schedule (one vector of the scalars
    `StateLayout.scalars` names, in that order: see `schedule_input`), x, y, masks…. Outputs:
    θ'…, state'… (same order), loss, batch stats… (qualified_stats order). Parameter and state
    inputs alias their outputs. A frozen θ (`frozen`) is an input alone: the state groups, θ' and
    the aliasing cover the trained θ (`trained`) only. Each parameter and its state tensors are carried as `storage`
    says (`param_storage`; the host converts with `host_stored` / `host_declared`)."""

    params: tuple[tuple[str, ParamSlot], ...]
    stats: tuple[tuple[str, StatSlot], ...]
    masks: tuple[tuple[str, MaskSlot], ...]
    state: tuple[str, ...]
    scalars: tuple[str, ...]
    x_shape: Shape
    y_shape: Shape
    y_dtype: str
    storage: Storage = ()
    # positions in `params` of the frozen ones (Variant.frozen): inputs that alias no output, never
    # updated, with no state tensors (each state group holds one tensor per *trained* parameter)
    frozen: tuple[int, ...] = ()

    @property
    def n_params(self) -> int:
        return len(self.params)

    @property
    def trained(self) -> tuple[int, ...]:
        """Positions in `params` of the parameters the step updates (all but the frozen ones)."""
        return tuple(i for i in range(self.n_params) if i not in self.frozen)

    @property
    def trained_names(self) -> list[str]:
        return [self.params[i][0] for i in self.trained]

    @property
    def n_carried(self) -> int:
        """Trained θ and optimizer state: the outputs 0..n_carried-1, each aliasing its input."""
        return len(self.trained) * (1 + len(self.state))

    @property
    def n_held(self) -> int:
        """The inputs before the schedule: every θ (frozen ones too), then the state groups."""
        return self.n_params + len(self.trained) * len(self.state)

    @property
    def held_storage(self) -> Storage:
        """How each of the `n_held` inputs is stored (`param_storage`), in their order."""
        return (*self.storage, *(tuple(self.storage[i] for i in self.trained) * len(self.state)))

    @property
    def loss_index(self) -> int:
        return self.n_carried

    def input_roles(self) -> list[tuple[str, str]]:
        """(group, name) of every input, in order: ("param", θ)…, (state slot, trained θ)… per slot,
        ("schedule", ""), ("x", ""), ("y", ""), ("mask", mask)…: what a manifest of the module names."""
        return [*(("param", n) for n, _ in self.params),
                *((slot, n) for slot in self.state for n in self.trained_names),
                ("schedule", ""), ("x", ""), ("y", ""), *(("mask", n) for n, _ in self.masks)]

    def output_roles(self) -> list[tuple[str, str]]:
        """(group, name) of every output, in order: ("param", trained θ')…, (state slot, θ)… per slot,
        ("loss", ""), ("batch_stat", stat)… (this step's batch statistics, which the host averages)."""
        return [*(("param", n) for n in self.trained_names),
                *((slot, n) for slot in self.state for n in self.trained_names),
                ("loss", ""), *(("batch_stat", n) for n, _ in self.stats)]


def label_type(loss: Loss, out_shape: Shape, dtype: str) -> tuple[Shape, str]:
    """The loss's per-example label shape and element type; float targets follow the module's dtype."""
    loss.check(out_shape)
    y_shape, y_dtype = checked_label_spec(loss, out_shape)
    return y_shape, dtype if y_dtype in FLOAT_DTYPES else y_dtype


def checked_label_spec(loss: Loss, out_shape: Shape) -> tuple[Shape, str]:
    """`loss.label_spec(out_shape)`, refused in one line naming the loss unless it is (a shape, 'i32' or 'f32')."""
    spec = loss.label_spec(out_shape)
    # a typo ("float32") would otherwise be written into the module, and a bare shape fail to unpack
    if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], (tuple, list))
            and all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in spec[0])
            and spec[1] in ("i32", *FLOAT_DTYPES)):
        raise PluginError(f"{component_label('loss', loss)}: label_spec({tuple(out_shape)}) returned {spec!r}, "
                          "expected (the per-example label shape as a tuple of positive ints, 'i32' or 'f32')")
    return tuple(int(n) for n in spec[0]), str(spec[1])


def train_step_layout(spec: NetSpec, opt: Optimizer, loss: Loss, batch: int, dtype: str = "f32",
                      state: StateLayout | None = None, target: str | None = None,
                      frozen: Sequence[int] = ()) -> TrainStepLayout:
    """`state` (default: the bare optimizer's) is the variant's `StateLayout`, read, never restated;
    `frozen` the positions `Variant.frozen_indices` gives."""
    walk = spec.walk()
    y_shape, y_dtype = label_type(loss, walk[-1].out_shape, dtype)
    st = state or StateLayout(tuple(opt.state), tuple(opt.scalars))
    params = tuple(qualified_params(walk))
    return TrainStepLayout(params, tuple(qualified_stats(walk)), tuple(qualified_masks(walk)),
                           st.slots, st.scalars,
                           (batch, *spec.input_shape),
                           (batch, *y_shape), y_dtype, param_storage(params, target), tuple(frozen))


def schedule_input(b: Builder, names: Sequence[str]) -> dict[str, Value]:
    """The per-step scalars (lr, bias corrections, …) as ONE vector input, `names` in order, each
    sliced out by name: one host→device transfer per step instead of one per scalar (a transfer
    costs more than the compute of a small step's scalars; `StateLayout.host_schedule` packs it)."""
    vec = b.arg((len(names),))
    return {name: b.reshape(b.slice(vec, [i], [i + 1]), ()) for i, name in enumerate(names)}


def emit_stored_update(b: Builder, wrappers: Wrappers, opt: Optimizer, slots: Sequence[ParamSlot],
                       params: Sequence[Value], grads: Sequence[Value], state: dict[str, list[Value]],
                       scalars: dict[str, Value], storage: Sequence[tuple[int, ...] | None]
                       ) -> tuple[list[Value], dict[str, list[Value]]]:
    """`wrappers.emit_update` on parameters, gradients and state carried as `storage` says (one
    permutation or None per parameter), returning them stored the same way. An optimizer that is
    not `layout_free` gets every tensor in its declared layout."""
    perms = [q if not opt.layout_free else None for q in storage]
    p2, s2 = wrappers.emit_update(
        b, opt, slots, [stored_view(b, p, q) for p, q in zip(params, perms, strict=True)],
        [stored_view(b, g, q) for g, q in zip(grads, perms, strict=True)],
        {k: [stored_view(b, v, q) for v, q in zip(vs, perms, strict=True)] for k, vs in state.items()}, scalars)
    return ([to_stored(b, v, q) for v, q in zip(p2, perms, strict=True)],
            {k: [to_stored(b, v, q) for v, q in zip(s2[k], perms, strict=True)] for k in state})


def train_step_module(spec: NetSpec, variant: Variant, batch: int, *, dtype: str = "f32",
                      registry: Registry | None = None, replicas: int = 1,
                      sync_bn: bool = False, target: str | None = None) -> tuple[str, TrainStepLayout]:
    """The fused step at per-replica `batch`. `replicas` > 1 is the data-parallel step: the same
    graph with the loss and every gradient averaged over the replicas (`replica_mean`) before
    the optimizer, compiled for that many replicas. BN normalises with each replica's own batch
    statistics unless `sync_bn`, which pools them over all replicas (forward and backward)."""
    if replicas < 1:
        raise UnsupportedSpec(f"replicas must be at least 1, got {replicas}")
    if sync_bn and replicas == 1:
        raise UnsupportedSpec("sync_bn pools BN statistics across replicas; it needs replicas > 1")
    reg = registry or default_registry()
    spec = variant.apply_to(spec, reg)  # idempotent: dropout, drop_path and BN ε of the variant
    opt, loss = variant.make_optimizer(reg), variant.make_loss(reg)
    walk = spec.walk()
    frozen = variant.frozen_indices([n for n, _ in qualified_params(walk)], f"net {spec.name!r}")
    lay = train_step_layout(spec, opt, loss, batch, dtype, variant.state_layout(opt), target, frozen)
    b = Builder(dtype, f"{spec.ident}_{variant.slug}_train_step", target)
    shapes = [stored_shape(s.shape, perm) for (_, s), perm in zip(lay.params, lay.storage, strict=True)]
    trained = lay.trained  # the frozen θ are inputs alone: no output, no state, no gradient
    rank = {i: j for j, i in enumerate(trained)}
    all_params = [b.arg(shape, alias_output=rank.get(i)) for i, shape in enumerate(shapes)]
    n_tr = len(trained)
    state = {name: [b.arg(shapes[i], alias_output=n_tr * (1 + k) + j) for j, i in enumerate(trained)]
             for k, name in enumerate(lay.state)}
    scalars = schedule_input(b, lay.scalars)
    loss_v, batch_stats = _emit_loss(b, walk, loss, lay, all_params, batch, replicas if sync_bn else 1)
    params = [all_params[i] for i in trained]
    slots = [lay.params[i][1] for i in trained]
    storage = [lay.storage[i] for i in trained]

    def emit_update(idx: Sequence[int], grads: Sequence[Value]) -> tuple[list[Value], dict[str, list[Value]]]:
        """The variant's update of trained parameters `idx` (stored) from their gradients (stored)."""
        return emit_stored_update(b, variant.wrappers, opt, [slots[i] for i in idx], [params[i] for i in idx], grads,
                                  {k: [state[k][i] for i in idx] for k in lay.state}, scalars,
                                  [storage[i] for i in idx])

    # Clipping needs every gradient's norm, and a data-parallel step their replica means, before any update.
    if strategy.chosen(strategy.UPDATE.name, target) == "in_backward" and not variant.wrappers.clip and replicas == 1:
        def update_one(i: int, g: Value) -> list[Value]:
            p2, s2 = emit_update([i], [g])
            return [p2[0], *(s2[k][0] for k in lay.state)]

        grads, finished = autodiff.grad_sequenced(b, [loss_v], [b.full(1.0)], params, update_one)
        updated = [finished.get(i) or update_one(i, g) for i, g in enumerate(grads)]  # (a θ the loss never reaches)
        new_params = [u[0] for u in updated]
        new_state = {k: [u[1 + j] for u in updated] for j, k in enumerate(lay.state)}
    else:
        grads = autodiff.grad(b, [loss_v], [b.full(1.0)], params)
        if replicas > 1:
            *grads, loss_v = replica_mean(b, [*grads, loss_v], replicas)
        # The update (accumulation, clipping, the optimizer, the EMA shadow): the same emitter the gate checks.
        new_params, new_state = emit_update(range(n_tr), grads)
    outs = new_params + [v for n in lay.state for v in new_state[n]] + [loss_v] + batch_stats
    return b.module(outs, num_replicas=replicas), lay


def _emit_loss(b: Builder, walk: Sequence[LayerShapes], loss: Loss, lay: TrainStepLayout, params: Sequence[Value],
               batch: int, sync_replicas: int, sync_processes: int = 1) -> tuple[Value, list[Value]]:
    """x, the labels and the masks as inputs, then the training forward and the loss: the part of a
    train step before its backward (the fused step's and the gradient half's, one emitter)."""
    x = b.arg(lay.x_shape)
    y = b.arg(lay.y_shape, lay.y_dtype)
    masks = [b.arg((batch, *s.shape)) for _, s in lay.masks]
    views = [stored_view(b, p, perm) for p, perm in zip(params, lay.storage, strict=True)]
    logits, batch_stats = emit_layers(b, walk, x, views, train=True, masks=masks, sync_replicas=sync_replicas,
                                      sync_processes=sync_processes)
    return emit_loss(b, loss, logits, y), batch_stats


def gradient_step_module(spec: NetSpec, variant: Variant, batch: int, *, dtype: str = "f32",
                         registry: Registry | None = None, replicas: int = 1, sync_bn: bool = False,
                         processes: int = 1, target: str | None = None) -> tuple[str, TrainStepLayout]:
    """The gradient half of the train step (a step split for a reduction outside the graph, e.g. MPI's):
    `@main(θ…, x, y, masks…) -> (∂θ…, loss, batch stats…)`, the fused step's forward, loss and backward
    (`replicas` > 1: the loss and ∂θ averaged over them, as there) without its update. The update half is
    `optimizer_step_module` with the variant's wrappers and the layout's storage. The layout is the fused
    step's: its `state` and `scalars` name the update half's carried state and schedule. A frozen θ
    (`layout.frozen`) is an input alone, as in the fused step: ∂θ comes for the trained θ only
    (`layout.trained` order), and the update half takes those alone. `sync_bn`: BN statistics pooled
    over the `replicas` and over the run's `processes` (`Builder.process_sum`; the caller registers
    the host call and averages ∂θ over the processes)."""
    if replicas < 1 or processes < 1:
        raise UnsupportedSpec(f"replicas and processes must be at least 1, got {replicas} and {processes}")
    if sync_bn and replicas * processes == 1:
        raise UnsupportedSpec("sync_bn pools BN statistics across replicas; it needs replicas > 1 or processes > 1")
    reg = registry or default_registry()
    spec = variant.apply_to(spec, reg)
    opt, loss = variant.make_optimizer(reg), variant.make_loss(reg)
    walk = spec.walk()
    frozen = variant.frozen_indices([n for n, _ in qualified_params(walk)], f"net {spec.name!r}")
    lay = train_step_layout(spec, opt, loss, batch, dtype, variant.state_layout(opt), target, frozen)
    b = Builder(dtype, f"{spec.ident}_{variant.slug}_gradient_step", target)
    params = [b.arg(stored_shape(s.shape, perm)) for (_, s), perm in zip(lay.params, lay.storage, strict=True)]
    loss_v, batch_stats = _emit_loss(b, walk, loss, lay, params, batch, *((replicas, processes) if sync_bn
                                                                          else (1, 1)))
    grads = autodiff.grad(b, [loss_v], [b.full(1.0)], [params[i] for i in lay.trained])
    if replicas > 1:
        *grads, loss_v = replica_mean(b, [*grads, loss_v], replicas)
    return b.module([*grads, loss_v, *batch_stats], num_replicas=replicas), lay


REPLICA_MEAN_BEGIN = "replica mean over"  # the block's first line: `// replica mean over N replicas: %g… -> %ar…`
REPLICA_MEAN_END = "replica mean: end"
REPLICA_MEAN_SCOPE = "ar"


def replica_mean(b: Builder, values: Sequence[Value], replicas: int) -> list[Value]:
    """Each value averaged over replicas 0..N-1: one all_reduce (add) of them all, then ÷N. Emitted
    as one marked block under its own name scope, so `strip_replica_mean` recovers the
    single-replica text exactly — the check that the data-parallel step is that step plus this."""
    groups = [list(range(replicas))]
    with b.name_scope(REPLICA_MEAN_SCOPE):
        start = len(b.lines)
        sums = b.all_reduce(values, groups)
        means = [s / float(replicas) for s in sums]
    header = " ".join(v.name for v in values) + " -> " + " ".join(m.name for m in means)
    b.lines.insert(start, f"// {REPLICA_MEAN_BEGIN} {replicas} replicas: {header}")
    b.comment(REPLICA_MEAN_END)
    return means


def strip_replica_mean(text: str) -> str:
    """`text` with its replica-mean block cut out, every use of a mean renamed back to the value
    it averages, and one replica: a data-parallel render (without sync BN) becomes the
    single-replica render of the same net at the same per-replica batch, byte for byte."""
    lines = text.split("\n")
    begin = [i for i, ln in enumerate(lines) if ln.strip().startswith(f"// {REPLICA_MEAN_BEGIN} ")]
    if len(begin) != 1:
        raise UnsupportedSpec(f"expected one replica-mean block, found {len(begin)}")
    end = next(i for i in range(begin[0], len(lines)) if lines[i].strip() == f"// {REPLICA_MEAN_END}")
    sources, _, means = lines[begin[0]].split(": ", 1)[1].partition(" -> ")
    back = dict(zip(means.split(), sources.split(), strict=True))
    rest = "\n".join(lines[:begin[0]] + lines[end + 1:])
    rest = re.sub(rf"%{REPLICA_MEAN_SCOPE}\d+\b", lambda m: back.get(m.group(0), m.group(0)), rest)
    return re.sub(r"mhlo\.num_replicas = \d+ : i32", "mhlo.num_replicas = 1 : i32", rest)


def vjp_module(layers: Sequence[Layer], in_shape: Shape, batch: int, *, dtype: str = "f32",
               name: str = "vjp", target: str | None = None) -> str:
    """`@main(θ…, x, ḡ, masks…) -> (y, ∂θ…, ∂x)`: sums over the batch, no loss (composable nets
    take ḡ in); the masks (if any layer has mask slots) are fixed inputs, not differentiated."""
    walk = walk_layers(layers, in_shape)
    return _vjp(Builder(dtype, name, target), walk, in_shape, batch, (None,) * len(qualified_params(walk)))


def net_vjp_module(spec: NetSpec, batch: int, *, dtype: str = "f32", target: str | None = None,
                   accumulate: bool = False) -> str:
    """`vjp_module` of a whole net, θ and ∂θ carried as `param_storage(spec.params(), target)`
    says (what its train step and forward take): `@main(θ…, x, ḡ, masks…) -> (y, ∂θ…, ∂x)`.
    `accumulate`: `@main(θ…, x, ḡ, acc…, masks…) -> (y, acc + ∂θ…, ∂x)`, each acc donated to its
    sum, so the gradients of a net applied K times add up on the device."""
    walk = spec.walk()
    b = Builder(dtype, f"{spec.ident}_vjp" + ("_acc" if accumulate else ""), target)
    return _vjp(b, walk, spec.input_shape, batch, param_storage(qualified_params(walk), target), accumulate)


def _vjp(b: Builder, walk: Sequence[LayerShapes], in_shape: Shape, batch: int, storage: Storage,
         accumulate: bool = False) -> str:
    slots = qualified_params(walk)
    params = [b.arg(stored_shape(s.shape, q)) for (_, s), q in zip(slots, storage, strict=True)]
    x = b.arg((batch, *in_shape))
    gbar = b.arg((batch, *walk[-1].out_shape))
    acc = [b.arg(p.shape, alias_output=1 + i) for i, p in enumerate(params)] if accumulate else []
    masks = [b.arg((batch, *s.shape)) for _, s in qualified_masks(walk)]
    views = [stored_view(b, p, q) for p, q in zip(params, storage, strict=True)]
    y, _ = emit_layers(b, walk, x, views, train=True, masks=masks)
    *grads, dx = autodiff.grad(b, [y], [gbar], [*params, x])
    if accumulate:
        grads = [a + g for a, g in zip(acc, grads, strict=True)]
    return b.module([y, *grads, dx])


def layers_forward_module(layers: Sequence[Layer], in_shape: Shape, batch: int, *, dtype: str = "f32",
                          name: str = "fwd", target: str | None = None) -> str:
    """`@main(θ…, x, masks…) -> y` for a bare layer stack: what finite differences probe."""
    walk = walk_layers(layers, in_shape)
    b = Builder(dtype, name, target)
    params = [b.arg(s.shape) for _, s in qualified_params(walk)]
    x = b.arg((batch, *in_shape))
    masks = [b.arg((batch, *s.shape)) for _, s in qualified_masks(walk)]
    return b.module([emit_layers(b, walk, x, params, train=True, masks=masks)[0]])


def _raised_by_builder(e: BaseException) -> bool:
    """Whether `e` was raised inside the builder (core/hlo.py) itself."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(hlo.__file__)


def emit_loss(b: Builder, loss: Loss, logits: Value, y: Value) -> Value:
    """The loss's forward, which must be one scalar of the module's float type (the mean over the batch)."""
    start = len(b.tape)
    lv = loss.forward(b, logits, y)
    autodiff.claim_custom_ops(b.tape[start:], lambda: f"{component_label('loss', loss)}: backward")
    if not isinstance(lv, Value) or lv.shape != () or lv.dtype != logits.dtype:
        got = lv.type if isinstance(lv, Value) else repr(lv)
        raise PluginError(f"{component_label('loss', loss)}: forward returned {got}, expected a scalar "
                          f"tensor<{logits.dtype}> (the mean over the batch)")
    return lv


def loss_module(loss: Loss, out_shape: Shape, batch: int, *, dtype: str = "f32", target: str | None = None,
                cotangent: float = 1.0) -> str:
    """Probe `@main(logits, y) -> (loss, cotangent·∂loss/∂logits)`: the gate seeds another cotangent
    than the train step's 1, so a backward that drops its ḡ (as a weighted or composed loss feeds it) shows."""
    y_shape, y_dtype = label_type(loss, out_shape, dtype)
    b = Builder(dtype, f"probe_{loss.name}", target)
    logits = b.arg((batch, *out_shape))
    y = b.arg((batch, *y_shape), y_dtype)
    lv = emit_loss(b, loss, logits, y)
    (g,) = autodiff.grad(b, [lv], [b.full(cotangent)], [logits])
    return b.module([lv, g])


def optimizer_step_module(params: Sequence[ParamSlot], opt: Optimizer, *, dtype: str = "f32",
                          name: str = "optimizer_step", wrappers: Wrappers | None = None,
                          storage: Storage = (), target: str | None = None) -> str:
    """`@main(θ…, state…, ∂θ…, schedule) -> (θ'…, state'…)` for a gradient the caller assembled;
    state and schedule as `wrappers.layout(opt)` says, the update emitted as the train step emits it.
    θ and state alias θ' and state'. `storage` (default: every tensor declared) carries θ, ∂θ and the
    state as `param_storage` says, as the train step and `net_vjp_module` of `target` carry them."""
    wr = wrappers or Wrappers()
    lay = wr.layout(opt)
    b = Builder(dtype, name, target)
    n = len(params)
    perms = list(storage) if storage else [None] * n
    if len(perms) != n:
        raise UnsupportedSpec(f"optimizer step: {len(perms)} storage entries for {n} parameters")
    shapes = [stored_shape(s.shape, q) for s, q in zip(params, perms, strict=True)]
    ps = [b.arg(shape, alias_output=i) for i, shape in enumerate(shapes)]
    st = {name: [b.arg(shape, alias_output=n * (1 + k) + i) for i, shape in enumerate(shapes)]
          for k, name in enumerate(lay.slots)}
    gs = [b.arg(shape) for shape in shapes]
    sc = schedule_input(b, lay.scalars)
    new_p, new_s = emit_stored_update(b, wr, opt, params, ps, gs, st, sc, perms)
    return b.module(new_p + [v for k in lay.slots for v in new_s[k]])
