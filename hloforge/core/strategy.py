"""Lowering strategies: the form a layer's ops take for the backend a module is rendered for.

A layer's math is fixed; its *form* is not. The same convolution can be an NCHW conv with
the backward autodiff derives, or an NHWC conv whose backward is written out (∂x as a
forward-style conv with the flipped kernel, ∂w as k² shifted dot_generals) — equal to
rounding, but one lowerer runs the first 10× faster and another the second (DESIGN.md, "The
builder and the backward"). So a layer consults a *strategy kind* ("conv2d", "maxPool", …) with
named choices; the builder knows its target (`Builder.target`) and the layer asks
`chosen(kind, b.target)`.

Who declares what: a kind is a `StrategyKind` (its choices, the first the portable form); the
core's net-wide kinds are `CORE_KINDS` here, a layer plugin's come from its
`hloforge_strategy_kinds` hook (their forms live in hloforge/lowering/). A *target* is a
registered backend that declares `strategy_defaults` (kind -> choice) on its class: the target's
name is the backend's `name`, and a kind it does not name renders in its portable form. So the
core names no backend, and a third-party backend states its own choices. Kinds and targets are
read from `default_registry()`, or from the registry a `using` block names.

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
import weakref
from collections.abc import Hashable, Iterator, Mapping

import attrs

from hloforge.core.contracts import CORE_STRATEGY_CHOICES
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.registry import Registry, default_registry

ENV_VAR = "HLOFORGE_STRATEGY"


@attrs.frozen
class StrategyKind:
    """One decision a layer makes at render time: its named choices (the first is the portable
    form, what a module rendered for no target gets). Each target's choice is the backend's
    (`strategy_defaults` on its class)."""

    name: str
    choices: tuple[str, ...]
    doc: str = ""
    # False: consulted once per net, outside any layer (the activation layout), so not tuned per layer
    per_layer: bool = True

    def __attrs_post_init__(self) -> None:
        if not self.choices:
            raise UnsupportedSpec(f"strategy kind {self.name!r} has no choices")

    def default(self, target: str | None) -> str:
        """The choice a module rendered for `target` gets when nothing overrides it."""
        return targets().get(target, {}).get(self.name, self.choices[0]) if target is not None else self.choices[0]


@attrs.frozen
class _Table:
    kinds: Mapping[str, StrategyKind]
    targets: Mapping[str, Mapping[str, str]]


_registry: contextvars.ContextVar[Registry | None] = contextvars.ContextVar("hloforge_strategy_registry",
                                                                            default=None)
_tables: weakref.WeakKeyDictionary[Registry, _Table] = weakref.WeakKeyDictionary()


def _table() -> _Table:
    """The kinds and targets of the registry in use (read once per registry)."""
    reg = _registry.get() or default_registry()
    table = _tables.get(reg)
    if table is None:
        table = _tables[reg] = _read(reg)
    return table


def _read(reg: Registry) -> _Table:
    # The registry refused, as it loaded them, a plugin kind that takes a core kind's name and a backend whose
    # `strategy_defaults` is no mapping or names an unknown kind or choice (Registry.broken lists them).
    kinds = {k.name: k for k in CORE_KINDS}
    kinds.update((name, reg.get("strategy", name)) for name in reg.names("strategy"))
    found: dict[str, Mapping[str, str]] = {}
    for name in reg.names("backend"):
        defaults = getattr(reg.get("backend", name), "strategy_defaults", None)
        if defaults is not None:  # None: not a render target, it gets the portable forms
            found[name] = dict(defaults)
    return _Table(kinds, found)


@contextlib.contextmanager
def using(registry: Registry) -> Iterator[None]:
    """Read the strategy kinds and targets from `registry` inside the block (a test's own plugins)."""
    token = _registry.set(registry)
    try:
        yield
    finally:
        _registry.reset(token)


def kinds() -> Mapping[str, StrategyKind]:
    """Every strategy kind: the core's, then the layer plugins' (name -> kind)."""
    return _table().kinds


def targets() -> Mapping[str, Mapping[str, str]]:
    """The render targets: each backend that declares `strategy_defaults`, by name, with them."""
    return _table().targets


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


def kind(name: str) -> StrategyKind:
    try:
        return kinds()[name]
    except KeyError:
        raise UnsupportedSpec(f"unknown strategy kind {name!r}; declared: {sorted(kinds())}") from None


def _check(choices: Mapping[str, str], where: str) -> dict[str, str]:
    out = {}
    for k, c in choices.items():
        if k not in kinds():  # said with `where` (the variable, a tuned plan), as a choice of a known kind is
            raise UnsupportedSpec(f"{where}: unknown strategy kind {k!r}; declared: {sorted(kinds())}")
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
    pairs: dict[str, str] = {}
    for item in text.split(","):
        k, sep, c = item.strip().partition("=")
        if not sep or not k or not c:
            raise UnsupportedSpec(f"{ENV_VAR}={text!r}: expected kind=choice[,kind=choice…]")
        if pairs.get(k, c) != c:  # the later one would win unsaid
            raise UnsupportedSpec(f"{ENV_VAR}={text!r}: strategy {k} given twice ({pairs[k]}, {c}); expected it once")
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
    return [(k.name, ", ".join(k.choices), {t: k.default(t) for t in targets()}) for k in kinds().values()]


def target_of(backend: object) -> str | None:
    """The render target of a backend instance: its name when its class declares strategy
    defaults (`targets`), else None (the portable form). A backend's name given for the instance is refused:
    it has no `name` of its own, and would render the portable form, then fail on its first call."""
    if isinstance(backend, str):
        raise UnsupportedSpec(f"backend {backend!r} is a name, where a session takes a backend instance; expected "
                              f"hloforge.train.session.make_backend({backend!r}), one shared by the sessions that "
                              "share buffers")
    name = getattr(backend, "name", None)
    return name if name in targets() else None


# ----------------------------------------------------------------- the core's kinds (net-wide)
# Their names and choices are contracts.CORE_STRATEGY_CHOICES, what the registry checks plugins against.
# Why each backend picks what it does, with the measurements: benchmarks/NOTES.md.
LAYOUT = StrategyKind("layout", CORE_STRATEGY_CHOICES["layout"],
                      "image activations between layers: NCHW throughout, or NHWC through every run of "
                      "layers that supports it (one transpose at each end of the run)", per_layer=False)
UPDATE = StrategyKind("update", CORE_STRATEGY_CHOICES["update"],
                      "the optimizer update after the whole backward, or each parameter's update the moment its "
                      "gradient is final, sequenced before the rest of the backward by an optimization barrier "
                      "(the same math; the gradient is used while hot; not with clipping or data parallel; "
                      "XLA's CPU compiler drops the barrier)",
                      per_layer=False)
# An NHWC conv takes its kernel HWIO: carried so, the per-step transposes of kernels and gradients cancel.
PARAM_LAYOUT = StrategyKind("paramLayout", CORE_STRATEGY_CHOICES["paramLayout"],
                            "how the compiled steps carry each 4-D parameter (a conv kernel, declared OIHW): as "
                            "declared, or stored HWIO (axes 2, 3, 1, 0), the NHWC conv's own kernel layout; the "
                            "host (init, checkpoints, read_params) always sees the declared layout",
                            per_layer=False)
# The transpose of a broadcast is a sum (every bias's, LayerNorm γ/β's and scale's gradient).
SUMS = StrategyKind("sums", CORE_STRATEGY_CHOICES["sums"],
                    "the sums autodiff takes for a broadcast's gradient (a bias's, a norm's γ/β): one reduce, or "
                    "in stages: a short minor axis alone, then long axes within blocks of at most 32, first",
                    per_layer=False)
CORE_KINDS = (LAYOUT, UPDATE, PARAM_LAYOUT, SUMS)

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
