"""Lowering strategies: the form a layer's ops take for the backend a module is rendered for.

A layer's math is fixed; its *form* is not. The same convolution can be an NCHW conv with
the backward autodiff derives, or an NHWC conv whose backward is written out (∂x as a
forward-style conv with the flipped kernel, ∂w as k² shifted dot_generals) — equal to
rounding, but one lowerer runs the first 10× faster and another the second (DESIGN.md, "The
builder and the backward"). So a layer consults a *strategy kind* ("conv2d", "maxPool", …),
declared here with its named choices and a default per target; the builder knows its target
(`Builder.target`) and the layer asks `chosen(kind, b.target)`.

Every choice is gated like any other backward: the gate runs each layer case once per
choice of each kind the layer consults (`Layer.strategy_kinds`), under `forced`.

Overrides, for the gate, tests and benchmarks: `with forced({"conv2d": "nhwc"}): …` renders
every module built inside with that choice whatever the target, and the environment
variable HLOFORGE_STRATEGY ("conv2d=nhwc,maxPool=select") does the same for a whole
process (a context override wins over the environment).

Per-layer choices: `with tuned(plan): …` renders each layer whose (layer, input shape) the plan
names with that layer's own choices (what hloforge.train.autotune measured); `emit_layers` marks
the layer being emitted (`in_layer`). Precedence, first that names the kind wins: `forced`,
HLOFORGE_STRATEGY, the plan's choice for the layer being emitted, the target's default. A kind
declared `per_layer=False` ("layout") is decided once per net, outside any layer, and no plan
may name it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Hashable, Iterator, Mapping

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value

ENV_VAR = "HLOFORGE_STRATEGY"
# The backends a module is rendered for (their registered names); None renders the portable
# form: every kind's first choice.
TARGETS = ("xla", "iree")


@attrs.frozen
class StrategyKind:
    """One decision a layer makes at render time: its named choices (the first is the portable
    form, what a module rendered for no target gets) and the choice per target."""

    name: str
    choices: tuple[str, ...]
    defaults: Mapping[str, str] = attrs.field(factory=dict)
    doc: str = ""
    # False: consulted once per net, outside any layer (the activation layout), so not tuned per layer
    per_layer: bool = True

    def __attrs_post_init__(self) -> None:
        if not self.choices:
            raise UnsupportedSpec(f"strategy kind {self.name!r} has no choices")
        bad = {t: c for t, c in self.defaults.items() if c not in self.choices or t not in TARGETS}
        if bad:
            raise UnsupportedSpec(f"strategy kind {self.name!r}: defaults {bad} name an unknown target or choice; "
                                  f"targets {list(TARGETS)}, choices {list(self.choices)}")

    def default(self, target: str | None) -> str:
        return self.defaults.get(target, self.choices[0]) if target is not None else self.choices[0]


KINDS: dict[str, StrategyKind] = {}
_forced: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("hloforge_strategy", default=None)
# A layer as a plan names it: the (frozen, hashable) layer instance and its input shape without the batch.
LayerKey = tuple[Hashable, tuple[int, ...]]
Plan = Mapping[LayerKey, Mapping[str, str]]
_plan: contextvars.ContextVar[Plan | None] = contextvars.ContextVar("hloforge_strategy_plan", default=None)
# The plan's choices for the layer being emitted (set by `in_layer` around its forward).
_layer: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("hloforge_strategy_layer",
                                                                                  default=None)
_consulted: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("hloforge_strategy_consulted",
                                                                             default=None)


def declare(name: str, choices: tuple[str, ...], defaults: Mapping[str, str] | None = None,
            doc: str = "", *, per_layer: bool = True) -> StrategyKind:
    """Declare a strategy kind (once, where the layer that consults it is defined)."""
    kind = StrategyKind(name, tuple(choices), dict(defaults or {}), doc, per_layer)
    if name in KINDS and KINDS[name] != kind:
        raise UnsupportedSpec(f"strategy kind {name!r} is declared twice, differently")
    KINDS[name] = kind
    return kind


def kind(name: str) -> StrategyKind:
    try:
        return KINDS[name]
    except KeyError:
        raise UnsupportedSpec(f"unknown strategy kind {name!r}; declared: {sorted(KINDS)}") from None


def _check(choices: Mapping[str, str], where: str) -> dict[str, str]:
    out = {}
    for k, c in choices.items():
        sk = kind(k)
        if c not in sk.choices:
            raise UnsupportedSpec(f"{where}: strategy {k}={c!r}; expected one of {list(sk.choices)}")
        out[k] = c
    return out


def from_env() -> dict[str, str]:
    """The HLOFORGE_STRATEGY overrides ("kind=choice,kind=choice"), checked."""
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return {}
    pairs = {}
    for item in text.split(","):
        k, sep, c = item.strip().partition("=")
        if not sep or not k or not c:
            raise UnsupportedSpec(f"{ENV_VAR}={text!r}: expected kind=choice[,kind=choice…]")
        pairs[k] = c
    return _check(pairs, ENV_VAR)


def chosen(name: str, target: str | None) -> str:
    """The choice of kind `name` for a module rendered for `target`: a `forced` override, else
    HLOFORGE_STRATEGY, else the `tuned` plan's choice for the layer being emitted, else the
    kind's default for that target."""
    seen = _consulted.get()
    if seen is not None:
        seen.add(name)
    forced_now = _forced.get() or {}
    if name in forced_now:
        return forced_now[name]
    env = from_env()
    if name in env:
        return env[name]
    mine = _layer.get()
    return mine[name] if mine is not None and name in mine else kind(name).default(target)


def pinned() -> set[str]:
    """The kinds a `forced` block or HLOFORGE_STRATEGY fixes here: a plan's choice for them is never used."""
    return set(_forced.get() or {}) | set(from_env())


@contextlib.contextmanager
def forced(choices: Mapping[str, str]) -> Iterator[None]:
    """Render with these choices (kind -> choice) whatever the target, inside the block."""
    merged = {**(_forced.get() or {}), **_check(choices, "forced")}
    token = _forced.set(merged)
    try:
        yield
    finally:
        _forced.reset(token)


@contextlib.contextmanager
def tuned(plan: Plan) -> Iterator[None]:
    """Render each layer the plan names ((layer, input shape) -> {kind: choice}) with its own
    choices, inside the block (under `forced` and HLOFORGE_STRATEGY; see `chosen`)."""
    checked = {}
    for (layer, shape), choices in plan.items():
        where = f"tuned choices of {getattr(layer, 'kind', type(layer).__name__)} at {list(shape)}"
        net_wide = [k for k in choices if not kind(k).per_layer]
        if net_wide:
            raise UnsupportedSpec(f"{where}: strategy kind(s) {net_wide} are decided once per net, not per layer")
        checked[layer, tuple(shape)] = _check(choices, where)
    token = _plan.set(checked)
    try:
        yield
    finally:
        _plan.reset(token)


@contextlib.contextmanager
def in_layer(layer: Hashable, in_shape: tuple[int, ...]) -> Iterator[None]:
    """Emit the layer `layer` (input shape `in_shape`, no batch) with the plan's choices for it.
    A layer the plan does not name keeps the enclosing layer's (a stack a layer emits inside
    itself renders in its parent's form). The form of a closed-form backward is fixed when its
    forward is emitted (`Builder.custom_vjp` runs it in the forward's context)."""
    plan = _plan.get()
    try:
        mine = plan.get((layer, tuple(in_shape))) if plan else None
    except TypeError:  # an unhashable layer (a list-valued option) cannot be in a plan
        mine = None
    if mine is None:
        yield
        return
    token = _layer.set(mine)
    try:
        yield
    finally:
        _layer.reset(token)


@contextlib.contextmanager
def consulted() -> Iterator[set[str]]:
    """The names of the kinds `chosen` is asked about inside the block (what a render depends on)."""
    seen: set[str] = set()
    token = _consulted.set(seen)
    try:
        yield seen
    finally:
        _consulted.reset(token)


def table() -> list[tuple[str, str, dict[str, str]]]:
    """(kind, its choices joined, the choice per target) for every declared kind: what a report prints."""
    return [(k.name, ", ".join(k.choices), {t: k.default(t) for t in TARGETS}) for k in KINDS.values()]


def target_of(backend: object) -> str | None:
    """The render target of a backend instance: its registered name when strategies know it
    ("xla", "iree"), else None (the portable form)."""
    name = getattr(backend, "name", None)
    return name if name in TARGETS else None


# ----------------------------------------------------------------- the activation layout
LAYOUT = declare("layout", ("nchw", "nhwc"), {"xla": "nhwc", "iree": "nhwc"},
                 "image activations between layers: NCHW throughout, or NHWC through every run of "
                 "layers that supports it (one transpose at each end of the run)", per_layer=False)
# ----------------------------------------------------------------- the train step's update
# XLA's CPU compiler removes optimization barriers early in its pipeline (none is left in the
# optimized HLO), so on XLA `in_backward` is only the order of the emitted ops: mnist-mlp 1.70 vs
# 1.70 ms, mnist-cnn 78.1 vs 79.7 (interleaved in one process). A real data dependency in its place
# (the update reading an element of each later cotangent) removed XLA's copies of the donated θ but
# serialised the step: mnist-mlp 2.14 vs 1.54 ms, mnist-cnn 83 vs 76, resnet18-cifar 508–528 vs 503.
UPDATE = declare("update", ("after_backward", "in_backward"), {"xla": "in_backward", "iree": "after_backward"},
                 "the optimizer update after the whole backward, or each parameter's update the moment its "
                 "gradient is final, sequenced before the rest of the backward by an optimization barrier "
                 "(the same math; the gradient is used while hot; not with clipping or data parallel; "
                 "XLA's CPU compiler drops the barrier)",
                 per_layer=False)

# ----------------------------------------------------------------- the carried parameters
# An NHWC conv takes its kernel HWIO. Carried OIHW, every step transposed each conv kernel in (for
# the forward and ∂x) and its gradient out (XLA fused that transpose into the optimizer update,
# 3–4 ms per 512×512×3×3 kernel); carried HWIO, the transposes cancel. Whole steps on XLA (the same
# inputs, interleaved in one process): resnet18-cifar 372 vs 414 ms, mobilenetv2-mini 95 vs 102,
# mnist-cnn 57 vs 58; on IREE (sessions, alternating processes): mobilenetv2-mini 96 vs 128–130,
# resnet18-cifar 588 vs 652, mnist-cnn 80.5 vs 85.4, vit-cifar 148 vs 149.
PARAM_LAYOUT = declare("paramLayout", ("public", "hwio"), {"xla": "hwio", "iree": "hwio"},
                       "how the compiled steps carry each 4-D parameter (a conv kernel, declared OIHW): as "
                       "declared, or stored HWIO (axes 2, 3, 1, 0), the NHWC conv's own kernel layout; the "
                       "host (init, checkpoints, read_params) always sees the declared layout",
                       per_layer=False)

# ----------------------------------------------------------------- the backward's broadcast sums
# The transpose of a broadcast is a sum: every bias's, LayerNorm γ/β's and scale's gradient. Blocked
# (Builder.blocked_sum) where an axis is over 32, XLA hands it to YNNPACK instead of its own
# reduce-window loop: vit-cifar (batch 64, 65 tokens) 113.5 vs 119.2 and 124.4 vs 129.1 ms a step,
# mnist-cnn 53.5 vs 54.0, mnist-mlp 1.56 vs 1.56 and 1.62 vs 1.62 (interleaved, both orders).
SUMS = declare("sums", ("plain", "blocked"), {"xla": "blocked", "iree": "plain"},
               "the sums autodiff takes for a broadcast's gradient (a bias's, a norm's γ/β): one reduce, or "
               "within blocks of at most 32 along each long axis first", per_layer=False)

NCHW, NHWC = "NCHW", "NHWC"
_TO = {(NCHW, NHWC): (0, 2, 3, 1), (NHWC, NCHW): (0, 3, 1, 2)}


def to_layout(b: Builder, x: Value, have: str, want: str) -> Value:
    """x (a [N, ·, ·, ·] image in layout `have`) in layout `want`."""
    return b.transpose(x, _TO[have, want]) if have != want else x


def channel_axis(layout: str, rank: int) -> int:
    """The channel axis of a batched activation: 3 of an NHWC image, else 1."""
    return 3 if layout == NHWC and rank == 4 else 1


def logical(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """A batched activation's shape as the spec writes it ([N, C, H, W] for an NHWC image)."""
    if layout == NHWC and len(shape) == 4:
        return (shape[0], shape[3], shape[1], shape[2])
    return shape


def physical(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """The inverse of `logical`: [N, C, H, W] as laid out in `layout`."""
    if layout == NHWC and len(shape) == 4:
        return (shape[0], shape[2], shape[3], shape[1])
    return shape
