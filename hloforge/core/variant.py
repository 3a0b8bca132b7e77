"""The typed training variant, its fields, its slug, the optimizer wrappers and the state layout (the Optimizer base:
contracts).

A Variant names everything that changes a run besides the net: the optimizer and
its wrappers (EMA shadow, gradient accumulation over k micro-batches, global-norm
clipping), the loss and its options (label smoothing, soft labels from mixup /
cutmix), dropout and stochastic depth, the BatchNorm ε and the precision. Its slug
names artifacts, run directories and checkpoints, so two arms of an ablation never
share a file (seed 002), and it parses back to the same Variant (`Variant.parse`). Its fields
(`VariantFields`, each an `option`) are also the run config's keys and the command line's flags.

`StateLayout` is the ONE definition of what a train step carries besides θ: the
optimizer's slots (m, v, …), then G (the accumulator) and E (the EMA shadow), each
present only when its wrapper is on, and the per-step scalars (packed into one schedule
vector input). Seed 003: a consumer
that sizes the state off a literal instead of this misaligns every parameter, or
scores the accumulator as if it were weights; so the train step, the session, the
checkpoint and the scorer all read it from here.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs
import numpy as np

# the optimizer base lives with the other contracts; re-exported so `from hloforge.core.variant import Optimizer` works
from hloforge.core.contracts import Optimizer as Optimizer
from hloforge.core.errors import DataError, PluginError, UnsupportedSpec
from hloforge.core.registry import component_label, default_registry
from hloforge.core.spec import Loss, ParamSlot

if TYPE_CHECKING:
    from hloforge.core.hlo import Builder, Value
    from hloforge.core.registry import Registry
    from hloforge.core.spec import NetSpec


# ------------------------------------------------------------------ the wrappers and the state layout
ACCUMULATOR = "G"  # the gradient accumulator's slot
SHADOW = "E"  # the EMA shadow's slot
ACCUM_APPLY = "accum_apply"  # 1 on the micro-batch that applies the update, else 0
EMA_DECAY, EMA_WEIGHT = "ema_decay", "ema_weight"  # d and 1 − d, both from the host (1 − d in f32 loses bits)


def checked_lr(lr: Any) -> float:
    """A step's learning rate, refused unless a real number in 0 … float32's max: a NaN, an inf or a string
    ("1e-3") given to a session's step would turn θ to NaN or train at a rate nobody chose, silently."""
    v = float(lr) if isinstance(lr, numbers.Real) and not isinstance(lr, bool) else math.nan
    if not 0 <= v <= float(np.finfo(np.float32).max):  # NaN too
        raise DataError(f"learning rate {lr!r}: expected a finite number ≥ 0 (at most float32's 3.4e38)")
    return v


def bn_weight(momentum: float, accum: int = 1) -> float:
    """The weight the running statistics put on a new batch (seed 003): exactly 0.01 at the
    default 0.99, not 1 − 0.99 = 0.010000000000000009. Under accumulation over k micro-batches the
    statistics move once per MICRO-batch, so the momentum is k-th-rooted: k chained updates
    compose to one update at `momentum` per optimizer step."""
    if accum == 1:
        return 0.01 if momentum == 0.99 else 1.0 - momentum
    return 1.0 - float(momentum ** (1.0 / accum))  # float ** float is Any to mypy


def ema_decay_at(decay: float, update: int) -> float:
    """The shadow's decay for 0-based optimizer update `update`: min(d, (1 + t)/(10 + t)), a warm-up
    so the shadow does not sit at the initialisation for the first ~1/(1 − d) steps."""
    return min(decay, (1.0 + update) / (10.0 + update))


@attrs.frozen
class Wrappers:
    """What wraps any optimizer: an EMA shadow of θ (decay, 0 = off), gradient accumulation over
    `accum` micro-batches (1/k in the graph, the apply cadence from the host), and clipping of
    the global gradient norm (0 = off)."""

    ema: float = 0.0
    accum: int = 1
    clip: float = 0.0

    def __attrs_post_init__(self) -> None:
        if not (0.0 <= self.ema < 1.0):
            raise UnsupportedSpec(f"ema decay must be in [0, 1) (0: no shadow), got {self.ema}")
        if isinstance(self.accum, bool) or not isinstance(self.accum, int) or self.accum < 1:
            raise UnsupportedSpec(f"accum must be a positive integer (micro-batches per update), got {self.accum!r}")
        if not (self.clip >= 0.0 and math.isfinite(self.clip)):
            raise UnsupportedSpec(f"clip must be a finite norm ≥ 0 (0: no clipping), got {self.clip}")

    def layout(self, opt: Optimizer) -> StateLayout:
        return StateLayout(tuple(opt.state), tuple(opt.scalars), self.accum, self.ema)

    def label(self) -> str:
        fields = [f for f in attrs.fields(Wrappers) if getattr(self, f.name) != f.default]
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields)

    # -- the graph ---------------------------------------------------------------
    def emit_update(self, b: Builder, opt: Optimizer, slots: Sequence[ParamSlot], params: Sequence[Value],
                    grads: Sequence[Value], state: Mapping[str, Sequence[Value]],
                    scalars: Mapping[str, Value]) -> tuple[list[Value], dict[str, list[Value]]]:
        """θ' and every state slot's new value (layout order) from θ, this micro-batch's gradients,
        the state and the scalars: accumulate (G + g/k), clip the global norm, step the optimizer,
        then move the shadow toward θ'. Under accumulation nothing but G moves until the host says
        `accum_apply` = 1, and then G restarts at 0."""
        lay = self.layout(opt)
        n = len(params)
        g_eff = list(grads)
        if lay.accumulates:
            g_eff = [acc + g * (1.0 / self.accum) for acc, g in zip(state[ACCUMULATOR], grads, strict=True)]
        accumulated = g_eff  # what G carries on: the running sum, never its clipped form
        if self.clip:
            g_eff = clip_by_global_norm(b, g_eff, self.clip)
        new_p: list[Value] = []
        new_s: dict[str, list[Value]] = {k: [] for k in lay.slots}
        for i in range(n):
            try:
                p2, s2 = opt.update(b, params[i], g_eff[i], {k: state[k][i] for k in lay.optimizer_slots}, scalars,
                                    slots[i])
            except UnsupportedSpec as e:  # a refused op of the optimizer's own update: the author needs its name
                raise PluginError(f"{component_label('optimizer', opt)}: its update of parameter {slots[i].name!r} "
                                  f"{list(slots[i].shape)}: {e}") from e
            if not isinstance(s2, Mapping) or set(s2) != set(lay.optimizer_slots):  # the plugin's, not ours
                got = sorted(s2) if isinstance(s2, Mapping) else repr(s2)
                raise PluginError(f"{component_label('optimizer', opt)}: its update returned new state {got}, "
                                  f"expected one tensor per name its `state` declares: {sorted(lay.optimizer_slots)}")
            new_p.append(p2)
            for k in lay.optimizer_slots:
                new_s[k].append(s2[k])
        if lay.accumulates:
            apply = b.compare(scalars[ACCUM_APPLY], b.full(0.5), "GT")

            def gated(new: Value, old: Value) -> Value:
                return b.select(b.broadcast_to(apply, new.shape), new, old)

            new_p = [gated(q, p) for q, p in zip(new_p, params, strict=True)]
            for k in lay.optimizer_slots:
                new_s[k] = [gated(q, s) for q, s in zip(new_s[k], state[k], strict=True)]
            new_s[ACCUMULATOR] = [gated(b.full(0.0, a.shape), a) for a in accumulated]
        if lay.shadows:
            d, w = scalars[EMA_DECAY], scalars[EMA_WEIGHT]
            shadow = [e * b.broadcast_to(d, e.shape) + p * b.broadcast_to(w, p.shape)
                      for e, p in zip(state[SHADOW], new_p, strict=True)]
            if lay.accumulates:
                shadow = [gated(e2, e) for e2, e in zip(shadow, state[SHADOW], strict=True)]
            new_s[SHADOW] = shadow
        return new_p, new_s

    # -- the oracle ----------------------------------------------------------------
    def optax_reference(self, opt: Optimizer, lr: float, decay_mask: Any) -> Any:
        """The update (not the shadow) in optax: clip_by_global_norm before the optimizer, the whole
        wrapped in MultiSteps under accumulation. The gate tracks the shadow with optax.ema."""
        import optax

        tx = opt.optax_reference(lr, decay_mask)
        if self.clip:
            tx = optax.chain(optax.clip_by_global_norm(self.clip), tx)
        if self.accum > 1:
            # accumulator_dtype None: the params' own (optax's default f32 would cap an f64 oracle at f32)
            tx = optax.MultiSteps(tx, every_k_schedule=self.accum, accumulator_dtype=None)
        return tx

    @classmethod
    def gate_cases(cls) -> list[Wrappers]:
        """What the registry-wide gate runs every optimizer inside: all three wrappers composed (each
        wrapper alone is gated in tests/test_optimizers.py)."""
        return [cls(ema=0.99, accum=2, clip=1.5)]


def clip_by_global_norm(b: Builder, grads: Sequence[Value], max_norm: float) -> list[Value]:
    """g·(c/‖g‖) for every tensor when the global norm ‖g‖ (over all tensors) exceeds c; written
    (g/‖g‖)·c with the same comparison as optax, so f64 agrees to the last bits."""
    sq = [b.sum(g * g) for g in grads]
    total = sq[0]
    for s in sq[1:]:
        total = total + s
    norm = b.sqrt(total)
    under = b.compare(norm, b.full(max_norm), "LT")
    return [b.select(b.broadcast_to(under, g.shape), g, g / b.broadcast_to(norm, g.shape) * max_norm)
            for g in grads]


@attrs.frozen
class StateLayout:
    """The carried state: regions θ, the optimizer's slots, then G (accumulation on) and E (EMA on),
    and the scalar inputs: the optimizer's (lr first), then `accum_apply`, then `ema_decay`,
    `ema_weight`. G comes before E so a single-wrapper layout keeps its extra slot right after
    the optimizer's, whichever wrapper it is (seed 003's ordering rule)."""

    optimizer_slots: tuple[str, ...]
    optimizer_scalars: tuple[str, ...]
    accum: int = 1
    ema: float = 0.0

    def __attrs_post_init__(self) -> None:
        clash = {ACCUMULATOR, SHADOW, "param"} & set(self.optimizer_slots)
        if clash:
            raise UnsupportedSpec(f"optimizer state slot name(s) {sorted(clash)} are reserved for the wrappers")

    @property
    def accumulates(self) -> bool:
        return self.accum > 1

    @property
    def shadows(self) -> bool:
        return self.ema > 0.0

    @property
    def slots(self) -> tuple[str, ...]:
        """The state slots after θ, in train-step (and checkpoint) order."""
        return (*self.optimizer_slots, *((ACCUMULATOR,) if self.accumulates else ()),
                *((SHADOW,) if self.shadows else ()))

    @property
    def scalars(self) -> tuple[str, ...]:
        return (*self.optimizer_scalars, *((ACCUM_APPLY,) if self.accumulates else ()),
                *((EMA_DECAY, EMA_WEIGHT) if self.shadows else ()))

    def region(self, slot: str) -> int:
        """The 1-based position of a state slot after θ (θ is region 0); a missing one is an error."""
        if slot not in self.slots:
            raise UnsupportedSpec(f"this variant's state has no {slot!r} slot; its slots are {list(self.slots)}")
        return 1 + self.slots.index(slot)

    def applies(self, micro_step: int) -> bool:
        """Whether 1-based micro-batch `micro_step` applies the accumulated update."""
        return micro_step % self.accum == 0

    def update_index(self, micro_step: int) -> int:
        """The 0-based optimizer update that 1-based micro-batch `micro_step` contributes to."""
        return (micro_step - 1) // self.accum

    def host_scalars(self, opt: Optimizer, micro_step: int, lr: float) -> list[float]:
        """The scalar inputs of 1-based micro-batch `micro_step`, in `scalars` order."""
        u = self.update_index(micro_step)
        got = opt.host_scalars(u + 1, lr)
        missing = [k for k in self.optimizer_scalars if k not in got] if isinstance(got, Mapping) else []
        if not isinstance(got, Mapping) or missing:  # the plugin's two declarations disagree: name it, not a KeyError
            said = f"{list(got)}, without {missing}" if missing else repr(got)
            raise PluginError(f"{component_label('optimizer', opt)}: host_scalars returned {said}; expected a "
                              f"mapping with a number for each name its `scalars` declares: "
                              f"{list(self.optimizer_scalars)}")
        vals = dict(got)
        if self.accumulates:
            vals[ACCUM_APPLY] = 1.0 if self.applies(micro_step) else 0.0
        if self.shadows:
            d = ema_decay_at(self.ema, u)
            vals[EMA_DECAY], vals[EMA_WEIGHT] = d, 1.0 - d
        return [vals[k] for k in self.scalars]

    def host_schedule(self, opt: Optimizer, micro_step: int, lr: float, dtype: Any = np.float32) -> np.ndarray:
        """The train step's schedule input for 1-based micro-batch `micro_step`: `host_scalars` packed
        in `scalars` order (`hloforge.core.modules.schedule_input` unpacks it)."""
        return np.asarray(self.host_scalars(opt, micro_step, lr), dtype)

    def initial(self, opt: Optimizer, slots: Sequence[ParamSlot], params: Sequence[np.ndarray],
                dtype: Any = np.float32) -> list[np.ndarray]:
        """Every state slot's initial value, slot group by slot group: the optimizer's own init, G = 0,
        E = θ (the shadow starts at the initialisation, as timm's ModelEma copies the model)."""
        out: list[np.ndarray] = []
        for k in self.slots:
            for s, p in zip(slots, params, strict=True):
                if k == ACCUMULATOR:
                    out.append(np.zeros(s.shape, dtype))
                elif k == SHADOW:
                    out.append(np.array(p, dtype))
                else:
                    out.append(np.asarray(_initial_state(opt, s, k), dtype))
        return out

    def shadow_restarted(self, state: Sequence[np.ndarray], trained: Sequence[np.ndarray]) -> list[np.ndarray]:
        """`state` (slot group by slot group, a tensor per trained θ) with the EMA shadow E = `trained` (θ
        assigned anew: a shadow of the weights before would be scored for them), as `initial` starts it."""
        out = list(state)
        if self.shadows:
            at = (self.region(SHADOW) - 1) * len(trained)
            out[at:at + len(trained)] = [np.array(p, copy=True) for p in trained]
        return out

    def check_slots(self, where: str, names: Sequence[str]) -> None:
        """Refuse tensors (a checkpoint's names) whose state slots are not this layout's, naming the
        missing and the extra ones: another layout would load misaligned, or not at all."""
        have = sorted({n.split("/")[1] for n in names if n.startswith("state/")})
        missing = [k for k in self.slots if k not in have]
        extra = [k for k in have if k not in self.slots]
        if missing or extra:
            parts = ([f"missing slot(s) {missing}"] if missing else []) + ([f"extra slot(s) {extra}"] if extra else [])
            raise DataError(f"{where} holds state slots {have}, but this variant's layout is "
                                  f"{list(self.slots)}: {' and '.join(parts)}")


def _initial_state(opt: Optimizer, slot: ParamSlot, k: str) -> np.ndarray:
    """The optimizer's initial value of state `k` for one parameter, refused unless a real array of the
    parameter's shape: another one would be refused by the backend as an argument, naming no plugin."""
    got = opt.init_state(slot)
    if not isinstance(got, Mapping) or k not in got:
        said = f"{list(got)}, without {k!r}" if isinstance(got, Mapping) else repr(got)
    else:
        v = np.asarray(got[k])
        if v.shape == tuple(slot.shape) and v.dtype.kind in "fiu":
            return v
        said = f"state {k!r} of shape {list(v.shape)} {v.dtype}"
    raise PluginError(f"{component_label('optimizer', opt)}: init_state of parameter {slot.name!r} returned {said}; "
                      f"expected a float array of the parameter's shape {list(slot.shape)} for each name its "
                      f"`state` declares: {list(opt.state)}")


# ------------------------------------------------------------------ the variant and its slug
PRECISIONS = ("fp32", "fp8")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_NUMBER = re.compile(r"^[0-9][0-9pem]*$")


def _encode(v: float) -> str:
    """A float in slug characters: the shortest round-trip repr, '.' → p, '-' → m (1e-05 → 1em05)."""
    r = repr(float(v))
    if r.endswith(".0"):
        r = r[:-2]
    return r.replace("e+", "e").replace(".", "p").replace("-", "m")


def _decode(s: str) -> float:
    return float(s.replace("p", ".").replace("m", "-"))


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        if isinstance(name, str):  # a name registered nowhere (Keras's 'sparse_categorical_crossentropy'): said so,
            default_registry().get(what, name)  # with the registered ones, before the slug's characters
        raise UnsupportedSpec(f"{what} name {name!r} cannot appear in a variant slug: expected a letter then "
                              "letters and digits")


_PREFIX = re.compile(r"^[A-Za-z0-9]+(\.[A-Za-z0-9]+)*$")


def frozen_prefixes(v: Any) -> tuple[str, ...]:
    """Frozen parameter-name prefixes in canonical form: a trailing '.' dropped, sorted, and each one
    another covers left out (("1", "1.b0") freezes what ("1",) does)."""
    if v is None:  # Model(frozen=None): nothing frozen
        return ()
    if not isinstance(v, (str, list, tuple)):  # a config's `frozen = 5`: one line, not a TypeError
        raise UnsupportedSpec(f"frozen prefixes {v!r}: expected a list of parameter-name prefixes")
    items = (v,) if isinstance(v, str) else tuple(v)
    out: list[str] = []
    for p in items:
        q = p.removesuffix(".") if isinstance(p, str) else p
        if not isinstance(q, str) or not _PREFIX.match(q):
            raise UnsupportedSpec(f"frozen prefix {p!r}: expected a parameter-name prefix (a string) of "
                                  "dot-separated letters and digits, e.g. '0' or '2.b0.conv1'")
        out.append(q)
    return tuple(sorted(p for p in set(out) if not any(covers(o, p) for o in out if o != p)))


def covers(prefix: str, name: str) -> bool:
    """Whether a frozen prefix covers a parameter name: the name is it, or begins with it and a '.'
    (prefix 1 covers 1.b0.conv1.w, never 10.w)."""
    return name == prefix or name.startswith(prefix + ".")


def _unit(what: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and 0.0 <= v < 1.0):
        raise UnsupportedSpec(f"{what} must be in [0, 1), got {v!r}")


# A Variant field's metadata key: its `Option`.
OPTION = "hloforge.option"
T = TypeVar("T")


@attrs.frozen
class Option:
    """How a Variant field is offered: the command line's flag (`flag`, else `--<name with dashes>`;
    hloforge.cli.variant_flags) with this help, metavar and choices, its text parsed by `parse`, else by the
    field's annotated type (int, float, str; a tuple's items), then refused at parse time by the Variant's own
    rule; `repeat`: the flag takes one or more values and may be given again (a tuple field). TrainConfig holds
    the field as a config key of the same name (it inherits VariantFields)."""

    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    parse: Callable[[str], Any] | None = None
    flag: str = ""
    repeat: bool = False


def option(default: T, help: str, *, metavar: str | None = None, choices: Sequence[str] = (),
           parse: Callable[[str], Any] | None = None, flag: str = "", repeat: bool = False,
           converter: Callable[[Any], T] | None = None) -> T:
    """A Variant field: its default (and converter) and its `Option`."""
    return attrs.field(default=default, converter=converter,
                       metadata={OPTION: Option(help, metavar, tuple(choices), parse, flag, repeat)})


@attrs.frozen
class VariantFields:
    """The Variant's fields, the one definition: Variant checks and uses them, TrainConfig inherits them as config
    keys, and the command line makes a flag of each (`option`). A field added here is all three."""

    optimizer: str = option("adam", "an optimizer plugin (sgd, momentum, adam, adamw, ...)")
    weight_decay: float | None = option(None, "decoupled weight decay (default: the optimizer's own)")
    loss: str = option("crossEntropy", "a loss plugin (default: the one the net and dataset call for: "
                                       "crossEntropy for classes, tokenCrossEntropy per token, perPixelCE for "
                                       "masks, mse for a DDPM, a detector's head's own: yolov1, fpnYolo)")
    label_smoothing: float = option(0.0, "label smoothing of a cross-entropy loss")
    ema: float = option(0.0, "keep an EMA shadow of the weights (e.g. 0.9999; default 0: none)", metavar="DECAY")
    accum: int = option(1, "accumulate gradients over K micro-batches per update (default 1)", metavar="K")
    clip: float = option(0.0, "clip the global gradient norm to NORM (default 0: no clipping)", metavar="NORM")
    mixup: float = option(0.0, "mixup with λ ~ Beta(A, A), on the host (soft labels; default 0: off)", metavar="A")
    cutmix: float = option(0.0, "cutmix with λ ~ Beta(A, A), on the host (soft labels; default 0: off)",
                           metavar="A")
    dropout: float = option(0.0, "classifier dropout, before the net's last layer with a weight (default 0)",
                             metavar="P")
    # a flag below that sets a per-layer option replaces the spec's own value, with a warning (core/trained_net)
    drop_path: float = option(0.0, "stochastic depth on every block that has it, replacing the spec's own "
                                   "(default 0: each block's own; 0 replaces nothing)", metavar="P")
    bn_eps: float | None = option(None, "BatchNorm ε of every BN layer, train and eval, replacing the spec's own "
                                        "(default: each layer's own)", metavar="EPS")
    precision: str = option("fp32", "fp8: E4M3 weights and input, fp32 master (default fp32)", choices=PRECISIONS)
    # parameter-name prefixes the train step takes as constants: no update, no optimizer state, not clipped
    frozen: tuple[str, ...] = option((), "train the parameters under PREFIX (a layer index, a block such as 2.b0, a "
                                         "name) as constants: no update, no optimizer state (repeatable; default: "
                                         "none)", metavar="PREFIX", flag="--freeze", repeat=True,
                                     converter=frozen_prefixes)


@attrs.frozen
class Variant(VariantFields):
    """A training variant, each field a keyword (and `hloforge train` flag): `optimizer` and `loss` by registered
    name, weight_decay (None: the optimizer's own), label_smoothing, ema, accum, clip, mixup, cutmix, dropout,
    drop_path, bn_eps (None: each layer's own), precision ("fp32", "fp8") and frozen (parameter prefixes), each
    checked as it is made; VariantFields declares each one's default and meaning. `slug` names it in artifacts."""

    # Each numeric field's type and range, said when its value is not a number: checked before the range
    # checks below (and Wrappers'), so a string or None built in directly is one line, not a TypeError from `<`.
    # A bool is no number here (as in a config: hloforge.train.configio); None only where the field's default is.
    _NUMBERS: ClassVar[dict[str, str]] = {
        "weight_decay": "a finite number ≥ 0, or None (the optimizer's own)",
        "label_smoothing": "a number in [0, 1)",
        "ema": "a decay in [0, 1) (0: no shadow)",
        "accum": "a positive integer (micro-batches per update)",
        "clip": "a finite norm ≥ 0 (0: no clipping)",
        "mixup": "a finite α ≥ 0 (0: off)",
        "cutmix": "a finite α ≥ 0 (0: off)",
        "dropout": "a number in [0, 1)",
        "drop_path": "a number in [0, 1)",
        "bn_eps": "a positive number, or None (each layer's own)",
    }

    def __attrs_post_init__(self) -> None:
        _check_name("optimizer", self.optimizer)
        _check_name("loss", self.loss)
        for what, expected in self._NUMBERS.items():
            v = getattr(self, what)
            if v is None and attrs.fields_dict(Variant)[what].default is None:
                continue
            number = isinstance(v, int) if what == "accum" else isinstance(v, numbers.Real)
            if isinstance(v, bool) or not number:
                raise UnsupportedSpec(f"{what} must be {expected}, got {v!r} (type {type(v).__name__})")
        if self.weight_decay is not None and not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise UnsupportedSpec(f"weight_decay must be a finite number ≥ 0, got {self.weight_decay}")
        for what in ("label_smoothing", "dropout", "drop_path"):
            _unit(what, getattr(self, what))
        for what in ("mixup", "cutmix"):
            v = getattr(self, what)
            if not (v >= 0 and math.isfinite(v)):
                raise UnsupportedSpec(f"{what} α must be a finite number ≥ 0 (0: off), got {v}")
        if self.bn_eps is not None and not (self.bn_eps > 0 and math.isfinite(self.bn_eps)):
            raise UnsupportedSpec(f"bn_eps must be a positive number, got {self.bn_eps}")
        if self.precision not in PRECISIONS:
            raise UnsupportedSpec(f"precision {self.precision!r}; expected one of {list(PRECISIONS)}")
        _ = self.wrappers  # validates ema, accum, clip

    @property
    def wrappers(self) -> Wrappers:
        return Wrappers(self.ema, self.accum, self.clip)

    @property
    def soft_labels(self) -> bool:
        """Mixing makes the labels soft: the train step takes float targets [B, C], label smoothing
        included (applied on the host with the mixing)."""
        return bool(self.mixup or self.cutmix)

    # -- the slug --------------------------------------------------------------------
    # (field, tag) in slug order; a value follows its tag. The loss and precision are spelled apart.
    _TAGS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("weight_decay", "wd"), ("label_smoothing", "ls"), ("ema", "ema"), ("accum", "acc"), ("clip", "clip"),
        ("mixup", "mixup"), ("cutmix", "cutmix"), ("dropout", "do"), ("drop_path", "drop"), ("bn_eps", "eps"))
    _LOSS_TAG: ClassVar[str] = "loss"
    _FROZEN_TAG: ClassVar[str] = "frz"  # then the prefixes, comma-joined, in hex (names hold '.' and capitals)

    @property
    def slug(self) -> str:
        """`adam`, `lamb_wd0p02_ema0p9999_acc4_clip1_lossbce_fp8`: the optimizer, then each option
        that differs from its default as tag + value (numbers: shortest repr, '.' → p, '-' → m)."""
        parts = [self.optimizer]
        for field, tag in self._TAGS:
            v = getattr(self, field)
            default = attrs.fields_dict(Variant)[field].default
            if v != default or (field == "weight_decay" and v is not None):
                parts.append(tag + (str(v) if field == "accum" else _encode(v)))
        if self.frozen:
            parts.append(self._FROZEN_TAG + ",".join(self.frozen).encode().hex())
        if self.loss != "crossEntropy":
            parts.append(self._LOSS_TAG + self.loss)
        if self.precision != "fp32":
            parts.append(self.precision)
        return "_".join(parts)

    @property
    def eval_suffix(self) -> str:
        """The forward / eval artifacts' suffix: `_eps0p001` at a non-default BN ε (ε is baked into
        every BN site, so a net trained at one ε is scored through an eval graph at the same ε)."""
        return "" if self.bn_eps is None else "_eps" + _encode(self.bn_eps)

    @classmethod
    def parse(cls, slug: str) -> Variant:
        """The Variant a slug names; anything that is not a slug this class renders is refused."""
        parts = slug.split("_")
        opts: dict[str, Any] = {"optimizer": parts[0]}
        tags = dict((t, f) for f, t in cls._TAGS)
        for part in parts[1:]:
            value: Any
            if part in PRECISIONS:
                field, value = "precision", part
            elif part.startswith(cls._FROZEN_TAG) and re.fullmatch(r"([0-9a-f]{2})+", part[len(cls._FROZEN_TAG):]):
                field = "frozen"
                try:
                    value = tuple(bytes.fromhex(part[len(cls._FROZEN_TAG):]).decode().split(","))
                except UnicodeDecodeError:
                    raise UnsupportedSpec(f"variant slug {slug!r}: {part!r} does not spell frozen prefixes") from None
            elif part.startswith(cls._LOSS_TAG) and _NAME.match(part[len(cls._LOSS_TAG):] or "_"):
                field, value = "loss", part[len(cls._LOSS_TAG):]
            else:
                hit = [(t, f) for t, f in tags.items() if part.startswith(t) and _NUMBER.match(part[len(t):])]
                if len(hit) != 1:
                    raise UnsupportedSpec(f"variant slug {slug!r}: cannot read part {part!r}; expected one of the "
                                          f"tags {sorted(tags)} followed by a number, 'loss<name>', or "
                                          f"{list(PRECISIONS[1:])}")
                tag, field = hit[0]
                text = part[len(tag):]
                try:
                    value = int(text) if field == "accum" else _decode(text)
                except ValueError:
                    kind = "a whole number" if field == "accum" else "a number"
                    raise UnsupportedSpec(f"variant slug {slug!r}: {part!r} needs {kind} after {tag!r}") from None
            if field in opts:
                raise UnsupportedSpec(f"variant slug {slug!r} sets {field} twice")
            opts[field] = value
        v = cls(**opts)
        if v.slug != slug:  # e.g. a default spelled out, or parts out of order: not this class's rendering
            raise UnsupportedSpec(f"variant slug {slug!r} is not canonical; this variant's slug is {v.slug!r}")
        return v

    # -- what the variant makes ------------------------------------------------------------
    def frozen_indices(self, names: Sequence[str], where: str = "this net") -> tuple[int, ...]:
        """The positions in `names` (the net's parameters, qualified order) that `frozen` covers. A prefix
        that covers none, or a set that covers them all, is refused in one line."""
        if not self.frozen:
            return ()
        for p in self.frozen:
            if not any(covers(p, n) for n in names):
                layers = sorted({n.split(".")[0] for n in names}, key=lambda t: (len(t), t))
                blocks = sorted({".".join(n.split(".")[:2]) for n in names if n.count(".") > 1})[:6]
                some = f"blocks such as {blocks}, " if blocks else ""
                raise UnsupportedSpec(f"frozen prefix {p!r} matches no parameter of {where}; valid prefixes are "
                                      f"layer indices {layers}, {some}or whole names such as {list(names[:2])}")
        hit = tuple(i for i, n in enumerate(names) if any(covers(p, n) for p in self.frozen))
        if len(hit) == len(names):
            raise UnsupportedSpec(f"frozen {list(self.frozen)} covers every parameter of {where}: nothing left to "
                                  "train")
        return hit

    def make_optimizer(self, registry: Registry) -> Optimizer:
        opts = {} if self.weight_decay is None else {"weight_decay": self.weight_decay}
        opt: Optimizer = registry.make("optimizer", self.optimizer, **opts)
        return opt

    def state_layout(self, opt: Optimizer) -> StateLayout:
        """The train step's carried state for this variant: the one place it is derived."""
        return self.wrappers.layout(opt)

    def make_loss(self, registry: Registry) -> Loss:
        cls = registry.get("loss", self.loss)
        fields = {f.name for f in attrs.fields(cls)} if attrs.has(cls) else set()
        opts: dict[str, Any] = {}
        if self.soft_labels:
            if "soft" not in fields:
                raise UnsupportedSpec(f"loss {self.loss!r} takes no soft labels, so it cannot train with mixup or "
                                      "cutmix")
            opts["soft"] = True  # label smoothing then rides in the host's soft targets
        elif self.label_smoothing:
            opts["label_smoothing"] = self.label_smoothing
        loss: Loss = registry.make("loss", self.loss, **opts)
        return loss

    def label_loss(self, registry: Registry) -> Loss:
        """The loss the data's own labels are for: mixing makes its soft targets on the host from class
        labels, so a mixing variant's arrays hold (and are checked and scored as) the unmixed loss's labels."""
        return attrs.evolve(self, mixup=0.0, cutmix=0.0).make_loss(registry)

    def apply_to(self, spec: NetSpec, registry: Registry | None = None) -> NetSpec:
        """The net this variant trains (dropout, drop_path, BN ε): `hloforge.core.trained_net`. Idempotent, so
        the train step may apply it to a net its caller already applied it to."""
        from hloforge.core.trained_net import trained_net

        return trained_net(spec, self.dropout, self.drop_path, self.bn_eps, registry)

