"""Sessions: a compiled module and its device-resident state, on any backend.

A TrainSession owns the train step and θ, optimizer state and the last batch
statistics on the device. Each step feeds θ and state back as donated inputs
(updated in place on XLA and on IREE) and moves only x, the labels and one
schedule vector (lr, bias corrections, …). `read_params` (θ) / `read_state`
(optimizer state) / `read_all` are the copies back, once per epoch; `read_params_prefix` copies the
leading θ tensors alone for a caller that needs them more often.

`resident=False` is the copying path: θ and state go back to the host after every
step and to the device before the next. It computes the same thing bit for bit;
it exists to check that, and for drivers that want the whole state every step.
Unset (`resident=None`), residency is the default and `HLOFORGE_RESIDENT=0` turns it
off for the process (seed 000's environment switch), so every driver takes it alike.

Sessions use only the backend interface of `hloforge.backends.base.Backend`.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from hloforge.backends.base import ProcessLock, backend_name
from hloforge.core.contracts import Backend
from hloforge.core.errors import BackendError, DataError, DeviceMemoryError, PluginError, UnsupportedSpec
from hloforge.core.modules import (
    TrainStepLayout,
    forward_module,
    host_declared,
    host_relaid,
    host_stored,
    param_storage,
    train_step_module,
)
from hloforge.core.registry import Registry, default_registry, plugin_label
from hloforge.core.slots import check_stats
from hloforge.core.spec import NetSpec
from hloforge.core.strategy import target_of
from hloforge.core.switches import env_switch
from hloforge.core.variant import Variant, checked_lr
from hloforge.train.inputs import checked_labels, finite_inputs, label_classes, net_inputs, token_vocab


def stage(backend: Any, array: np.ndarray) -> Any:
    """`array` on the device for one execute: borrowed where the backend's `to_device` takes
    `borrow` (the protocol's keyword; a plugin backend written without it copies)."""
    to_device = backend.to_device
    accepts = _BORROWS.get(type(backend))
    if accepts is None:
        try:
            accepts = "borrow" in inspect.signature(to_device).parameters
        except (TypeError, ValueError):
            accepts = False
        _BORROWS[type(backend)] = accepts
    return to_device(array, borrow=True) if accepts else to_device(array)


_BORROWS: dict[type, bool] = {}


class InputStager:
    """One call site's per-call inputs (the same shapes every call) on the device: written into
    the backend's input slots where it has them (`input_slot(shape, dtype)`: XLA on the CPU, one
    memcpy each), else staged per call (`stage`)."""

    def __init__(self, backend: Any):
        self.backend = backend
        self._slots: list[Any] | None = None  # None: not made yet; []: the backend has none

    def __call__(self, host: Sequence[np.ndarray]) -> list[Any]:
        if self._slots is None:
            make = getattr(self.backend, "input_slot", None)
            slots = [make(a.shape, a.dtype) for a in host] if callable(make) else []
            self._slots = slots if all(s is not None for s in slots) else []
        if self._slots:
            return [slot.write(a) for slot, a in zip(self._slots, host, strict=True)]
        return [stage(self.backend, a) for a in host]


def make_backend(name: str | None = None, registry: Registry | None = None, **options: Any) -> Any:
    """An instance of the named backend; `name` None reads $HLOFORGE_BACKEND (default xla).

    An unknown name is a PluginError listing the registered ones; a registered backend
    whose packages are missing raises BackendError naming what to pip install; one that lacks a
    method of the Backend protocol is a PluginError naming them, before anything is compiled."""
    name = backend_name(name)
    entry = (registry or default_registry()).entry("backend", name)
    cls = entry.obj
    accepted = inspect.signature(cls).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:  # e.g. `devices` (an XLA client's device count) asked of IREE
        raise UnsupportedSpec(f"backend {name!r} takes no option {', '.join(unknown)} "
                              f"(its options: {', '.join(accepted) or 'none'})")
    backend = cls(**options)
    if not isinstance(backend, Backend):  # the instance: a wrapper may forward its methods (__getattr__)
        members = [*Backend.__annotations__, *(k for k, v in vars(Backend).items()
                                               if inspect.isfunction(v) and not k.startswith("_"))]
        missing = [m for m in members if not hasattr(backend, m)]
        # else the first missing call fails mid-run, after a compile, as if hloforge had a bug
        raise PluginError(f"{plugin_label('backend', name, entry.distribution)} does not implement "
                          f"{', '.join(missing)}; expected every member of the Backend protocol "
                          f"(hloforge.core.contracts.Backend: {', '.join(members)})")
    return backend


def replica_devices(name: str | None, replicas: int, devices: int | None) -> int | None:
    """The device count to ask backend `name` for: `devices` where given, else one per replica where
    the backend takes a count (the XLA CPU client has one device unless asked), else its own."""
    if devices or replicas <= 1:
        return devices
    cls = default_registry().get("backend", backend_name(name))
    return replicas if "devices" in inspect.signature(cls).parameters else None


def _is_host(a: Any) -> bool:
    return isinstance(a, (np.ndarray, np.generic))


RESIDENT_ENV_VAR = "HLOFORGE_RESIDENT"


def resident_default() -> bool:
    """$HLOFORGE_RESIDENT, an on/off switch: on (the default, as is empty) keeps θ and state on the
    device, off is the copying path; anything else is one error line, never a guess."""
    return env_switch(RESIDENT_ENV_VAR, default=True, on="residency: θ and the optimizer state stay on the device",
                      off="copy them to the host after every step", error=BackendError)


def positive_batch(batch: Any, what: str = "batch") -> int:
    """A session's batch (its modules are compiled for it), refused unless an integer ≥ 1: at 0 a step trains
    on no rows (a NaN loss), and a negative one fails in the backend's parser as if the module were broken."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise UnsupportedSpec(f"{what} must be an integer ≥ 1, got {batch!r}")
    return int(batch)


SMALLER_BATCH = "use a smaller batch (--batch, or fit's batch_size)"  # what to reduce: a run's, a fit's train step
# ... and a forward's: scoring takes the batch_size of predict or evaluate too (fit's, scoring its validation)
SMALLER_EVAL_BATCH = "use a smaller batch (--batch, or the batch_size of predict, evaluate or fit)"


def out_of_memory(e: DeviceMemoryError, what: str, batch: int | None,
                  reduce: str = SMALLER_BATCH) -> DeviceMemoryError:
    """A module that ran out of memory, said in one line with what to reduce (`reduce`): the batch, since the
    activations (and those the backward keeps) grow with it, not the backend's byte count. `batch` None: a
    module of no batch (an optimizer step)."""
    asked = f"{e.needed / 2**30:.1f} GiB at once" if e.needed else "more memory"
    at = "" if batch is None else f" at batch {batch}"
    return DeviceMemoryError(f"out of memory: {what}{at} asked for {asked}, more than the device has free", e.needed,
                             reduce)


@contextlib.contextmanager
def memory_said(what: str, batch: int | None, reduce: str = SMALLER_BATCH) -> Iterator[None]:
    """The block's DeviceMemoryError (a compile that allocates, an execute) said by `out_of_memory`."""
    try:
        yield
    except DeviceMemoryError as e:
        raise out_of_memory(e, what, batch, reduce) from None


def merge_carried(lay: TrainStepLayout, held: Sequence[Any], new: Sequence[Any]) -> list[Any]:
    """The step's carried outputs (θ' of the trained parameters, then the state) in the held order of
    its inputs (every θ, then the state): each frozen θ is the one `held` already has."""
    if not lay.frozen:
        return list(new)
    theta = list(held[:lay.n_params])
    for j, i in enumerate(lay.trained):
        theta[i] = new[j]
    return [*theta, *new[len(lay.trained):]]


def check_param_shapes(layout: TrainStepLayout, params: Sequence[np.ndarray]) -> None:
    for (name, slot), p in zip(layout.params, params, strict=True):
        if tuple(p.shape) != slot.shape:
            raise DataError(f"parameter {name}: got shape {list(p.shape)}, expected {list(slot.shape)}")


class TrainSession:
    def __init__(self, spec: NetSpec, variant: Variant, batch: int, backend: Any, *, seed: int = 0,
                 params: Sequence[np.ndarray] | None = None, registry: Registry | None = None,
                 resident: bool | None = None):
        reg = registry or default_registry()
        batch = positive_batch(batch)
        spec = variant.apply_to(spec, reg)  # the net this variant trains (dropout, drop_path, BN ε)
        self.spec, self.variant, self.batch, self.backend = spec, variant, batch, backend
        self.resident = resident_default() if resident is None else resident
        self.optimizer = variant.make_optimizer(reg)
        self.state_layout = variant.state_layout(self.optimizer)  # what the carried state is, slot by slot
        compile_step, self.layout = self._step_program(reg)
        self.label_classes = label_classes(self.layout.y_dtype, self.layout.y_shape[1:], spec.out_shape)
        given = None if params is None else list(params)
        if given is not None:
            check_param_shapes(self.layout, given)  # before the compile: a θ of another net costs none
        # θ drawn, its optimizer state made, relaid and placed on a thread of its own while the backend
        # compiles: XLA runs its HLO passes on one thread, leaving a core idle (benchmarks/NOTES.md).
        self._carried: list[Any] = []
        with ThreadPoolExecutor(1, thread_name_prefix="hloforge-setup") as pool:
            placed = pool.submit(contextvars.copy_context().run, self._place_initial, given, seed)
            with memory_said(f"the train step of net {spec.name!r}", batch):  # IREE allocates as it loads a module
                self.exe = compile_step()
            placed.result()
        self._step_inputs = InputStager(backend)
        self._batch_stats: list[Any] = []  # the last step's batch statistics (device buffers), one per stat slot
        self.step = 0
        self.seed = seed

    def _step_program(self, registry: Registry) -> tuple[Callable[[], Any], TrainStepLayout]:
        """The train step's layout and a call that compiles it (a data-parallel session renders its own)."""
        text, layout = train_step_module(self.spec, self.variant, self.batch, registry=registry,
                                         target=target_of(self.backend))
        return lambda: self.backend.compile(text), layout

    def _place_initial(self, params: list[np.ndarray] | None, seed: int) -> None:
        """Place the step's held inputs (see `_place`): θ (`params`, or drawn from `seed`), then each
        optimizer-state group (trained θ only), in the step's order and stored layouts."""
        host = params if params is not None else self.spec.init_params(seed)
        if params is None:
            check_param_shapes(self.layout, host)
        trained = self.layout.trained
        slots = [self.layout.params[i][1] for i in trained]
        carried = [np.asarray(p, np.float32) for p in host]
        carried += self.state_layout.initial(self.optimizer, slots, [host[i] for i in trained])
        del host
        storage = self.layout.held_storage
        for i, a in enumerate(carried):  # relaid one at a time: each original freed as its copy is made
            carried[i] = host_relaid(a, storage[i])
            del a
        self._place(carried)

    def _place(self, carried: list[np.ndarray]) -> None:
        """Make `carried` (host arrays in the step's carried order) the state: on the device if resident,
        emptying `carried` as it goes, so each host copy can be freed once its device copy is made
        (not θ and its whole optimizer state twice at the peak)."""
        if not self.resident:
            self._carried = carried
            return
        placed = []
        for i, a in enumerate(carried):
            placed.append(self.backend.to_device(a))
            carried[i] = None  # type: ignore[call-overload]
            del a
        self._carried = placed

    # -- the step --------------------------------------------------------------

    def masks_for_step(self, step: int) -> list[np.ndarray]:
        """The dropout / drop-path masks of 1-based step `step`: drawn from (seed, step) alone,
        so a resumed run draws exactly the masks the uninterrupted run would have."""
        if not self.layout.masks:  # the per-step path: no generator for a net without masks
            return []
        rng = np.random.default_rng([self.seed, 0x6D61736B, step])
        return [s.sample(rng, self.batch) for _, s in self.layout.masks]

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float,
                   masks: Sequence[np.ndarray] | None = None) -> float:
        """One fused step (forward, loss, backward, update); returns the batch loss. `masks`
        default to `masks_for_step` of this step."""
        lay, be = self.layout, self.backend
        x, y = self.checked_batch(x, y, lay.x_shape, lay.y_shape)
        masks = self._advance(masks, lr)
        carried = self._carried if self.resident else [be.to_device(a) for a in self._carried]
        step_inputs = self._step_inputs(self._step_host(x, y, lr, masks))
        # The carried inputs are donated and consumed here; the session never touches them again.
        try:
            outs = be.execute(self.exe, [*carried, *step_inputs])
        except DeviceMemoryError as e:
            raise out_of_memory(e, f"the train step of net {self.spec.name!r}", self.batch) from None
        new = outs[:lay.n_carried]
        self._carried = merge_carried(lay, self._carried, new if self.resident else [be.to_host(b) for b in new])
        self._batch_stats = outs[lay.loss_index + 1:]
        return float(be.to_host(outs[lay.loss_index]))

    def checked_batch(self, x: Any, y: Any, x_shape: Sequence[int], y_shape: Sequence[int],
                      note: str = "") -> tuple[np.ndarray, np.ndarray]:
        """(x, labels) as the step takes them, checked before the step counts: shape, kind, range, finite."""
        return (finite_inputs(x, x_shape, "train batch", note, token_vocab(self.spec)),
                checked_labels(y, y_shape, self.layout.y_dtype, self.label_classes, "train batch"))

    def _advance(self, masks: Sequence[np.ndarray] | None, lr: Any) -> Sequence[np.ndarray]:
        """Count the step and return its masks (`masks_for_step` when not given), checked; a bad `lr` is
        refused before the step counts."""
        checked_lr(lr)
        self.step += 1
        if masks is None:
            masks = self.masks_for_step(self.step)
        if len(masks) != len(self.layout.masks):
            raise DataError(f"the train step takes {len(self.layout.masks)} mask(s), got {len(masks)}")
        return masks

    def _step_host(self, x: np.ndarray, y: np.ndarray, lr: float, masks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """This step's inputs after the carried state, as host arrays in layout order: the schedule
        (lr, bias corrections, the accumulation apply flag, the EMA decay: StateLayout.scalars order),
        x, the labels, the masks."""
        return [self.state_layout.host_schedule(self.optimizer, self.step, lr), np.ascontiguousarray(x, np.float32),
                np.ascontiguousarray(y, np.int32 if self.layout.y_dtype == "i32" else np.float32),
                *(np.ascontiguousarray(m, np.float32) for m in masks)]

    def load(self, params: Sequence[np.ndarray], state: Sequence[np.ndarray], step: int) -> None:
        """Replace θ and the optimizer state (e.g. from a checkpoint) and set the step counter."""
        lay = self.layout
        # one (name, shape) per held tensor: every θ, then each state group over the trained θ
        held = [(n, s.shape) for n, s in lay.params] + [(lay.params[i][0], lay.params[i][1].shape)
                                                         for _ in lay.state for i in lay.trained]
        n_tr = len(lay.trained)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataError(f"load: step {step!r}; expected the count of steps taken, an integer ≥ 0")
        if len(params) != lay.n_params or len(state) != lay.n_held - lay.n_params:
            raise DataError(f"load: got {len(params)} parameter and {len(state)} state tensors, expected "
                            f"{lay.n_params} and {lay.n_held - lay.n_params}")
        for i, a in enumerate([*params, *state]):
            name, want = held[i]
            if tuple(np.shape(a)) != want:
                what = "parameter" if i < lay.n_params else f"state {lay.state[(i - lay.n_params) // n_tr]}"
                raise DataError(f"load: {what} {name} has shape {list(np.shape(a))}, expected {list(want)}")
            if not np.isfinite(np.asarray(a, np.float32)).all():  # each step would carry the NaN on, silently
                raise DataError(f"load: {name} holds NaN or inf (or values beyond float32's range); expected finite")
        self._place(host_stored([np.array(a, np.float32) for a in [*params, *state]], self.layout.held_storage))
        self._batch_stats = []
        self.step = int(step)

    def release(self) -> None:
        """Free θ, the optimizer state and the last batch statistics on the device, keeping the compiled
        step, for an owner that holds the state on the host and `load`s it before the next step: hf.Model
        keeps a session per batch size, and each one it left held a whole copy (a fit at 30 batch sizes
        grew mnist-mlp's process by 8 MB each)."""
        self._carried, self._batch_stats = [], []

    # -- the way back ------------------------------------------------------------

    def _host(self, items: Sequence[Any]) -> list[np.ndarray]:
        return [np.array(a) if _is_host(a) else self.backend.to_host(a) for a in items]

    def _declared(self, items: Sequence[Any], start: int = 0) -> list[np.ndarray]:
        """Carried tensors from position `start` copied to the host, in their declared layouts."""
        return host_declared(self._host(items), self.layout.held_storage, start)

    @property
    def params(self) -> list[Any]:
        """θ as device buffers, stored as the step carries them (`layout.storage`: what a
        ForwardSession on the same backend takes), for a ForwardSession (in the copying path, a
        fresh push per call)."""
        theta = self._carried[:self.layout.n_params]
        return list(theta) if self.resident else [self.backend.to_device(a) for a in theta]

    def batch_stats(self) -> list[np.ndarray]:
        """The last step's batch statistics (layout.stats order), copied to the host."""
        return self._host(self._batch_stats)

    def read_params(self) -> list[np.ndarray]:
        """θ, copied to the host (layout.params order, declared layouts)."""
        return self._declared(self._carried[:self.layout.n_params])

    def read_state(self) -> list[np.ndarray]:
        """The optimizer state, copied to the host: each group of layout.state in turn, one per trained θ."""
        return self._declared(self._carried[self.layout.n_params:], self.layout.n_params)

    def read_all(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(θ, optimizer state): the whole carried state, for a checkpoint."""
        return self.read_params(), self.read_state()

    def slot_buffers(self, slot: str) -> list[Any]:
        """One state slot's tensors (e.g. "E", the EMA shadow) as the eval forward takes θ: device
        buffers (a fresh push in the copying path). Located through the StateLayout, never a literal. A
        frozen parameter has no state; its entry is θ itself (what the shadow of a constant is)."""
        part = self.slot_of(self._carried, slot)
        return list(part) if self.resident else [self.backend.to_device(a) for a in part]

    def slot_of(self, carried: Sequence[Any], slot: str) -> list[Any]:
        """One state slot's tensors out of `carried` (the step's carried order), one per θ: a frozen θ's
        entry is θ itself."""
        lay = self.layout
        n_tr = len(lay.trained)
        start = lay.n_params + (self.state_layout.region(slot) - 1) * n_tr
        return merge_carried(lay, carried, carried[start:start + n_tr])[:lay.n_params]

    def replace_params(self, params: Sequence[np.ndarray]) -> None:
        """Overwrite θ alone (the optimizer state stays): fp8 training swaps its quantized weights in
        before a step and its fp32 master back after it."""
        n = self.layout.n_params
        if len(params) != n:
            raise DataError(f"replace_params: got {len(params)} tensors, θ has {n}")
        rest = self._carried[n:]
        theta = host_stored([np.asarray(p, np.float32) for p in params], self.layout.storage)
        self._carried = [*(theta if not self.resident else [self.backend.to_device(a) for a in theta]), *rest]

    def read_params_prefix(self, count: int | None = None) -> list[np.ndarray]:
        """The leading `count` θ tensors (default: all of θ, and none of the state)."""
        n = self.layout.n_params if count is None else count
        if not 0 <= n <= self.layout.n_params:
            raise DataError(f"read_params_prefix({count}): θ has {self.layout.n_params} tensors")
        return self._declared(self._carried[:n])


class ForwardSession:
    """The (eval) forward at a fixed batch; a ragged final batch is padded and its padding dropped.

    `logits(x, params)` takes device buffers (used as they are, never donated) or host
    arrays. Host arrays are pushed once per call — or, in hold mode (`gen` given), once
    per generation token: the device copies are reused across calls while `gen` is
    unchanged and re-seeded the moment it changes. Pass the epoch (or anything that
    changes whenever the parameters do). Passing different parameter arrays under an
    unchanged token is an error, not a silent score of the held (stale) ones.

    `batch_stats=True` is seed 003's EVAL_BATCHSTATS diagnostic: the forward normalises with each
    batch's own statistics (params: θ… alone). Its padded tail is refused, not scored: the zero rows
    would enter the batch statistics and shift the real rows' normalisation. `suffix` ends the
    module's name (`forward_module`): the eval graph at another size is `…_fwd_eval_s<S>`."""

    def __init__(self, spec: NetSpec, batch: int, backend: Any, batch_stats: bool = False, suffix: str = ""):
        batch = positive_batch(batch)
        self.spec, self.batch, self.backend, self.batch_stats = spec, batch, backend, batch_stats
        self.suffix = suffix
        # how the module takes θ (host arrays come in declared layouts and are stored so when pushed)
        self.storage = param_storage(spec.params(), target_of(backend))
        with memory_said(f"the forward of net {spec.name!r}", batch, SMALLER_EVAL_BATCH):  # IREE: as it loads
            self.exe = self._compile()
        self._held: list[Any] | None = None
        self._held_gen: Hashable | None = None
        self._held_src: list[Any] = []  # the host arrays seeded from (kept alive so their ids stay theirs)
        self._x_in = InputStager(backend)
        self.seeds = 0  # how many times parameters were pushed (hold mode or not)
        self._lock = ProcessLock()

    def _compile(self) -> Any:
        return self.backend.compile(forward_module(self.spec, self.batch, eval_mode=not self.batch_stats,
                                                   target=target_of(self.backend), suffix=self.suffix))

    def _push(self, params: Sequence[Any]) -> list[Any]:
        """The parameters on the device: host arrays stored and copied there, device buffers as they are.
        The eval form's running statistics, the last inputs, are checked first (every score goes through here)."""
        stats = self.spec.stats() if not self.batch_stats else []
        running = list(params[len(params) - len(stats):]) if stats else []
        check_stats([s for s, p in zip(stats, running, strict=True) if _is_host(p)],
                    [p for p in running if _is_host(p)], "eval")
        return [self.backend.to_device(self._stored(i, p)) if _is_host(p) else p for i, p in enumerate(params)]

    def _stored(self, i: int, p: Any) -> np.ndarray:
        """The i-th module parameter (θ…, then running statistics) from the host, as the module takes it."""
        return host_relaid(p, self.storage[i] if i < len(self.storage) else None)

    def _device_params(self, params: Sequence[Any], gen: Hashable | None) -> list[Any]:
        if not any(_is_host(p) for p in params):
            return list(params)
        if gen is None:
            self.seeds += 1
            return self._push(params)
        if self._held is not None and gen == self._held_gen:
            same = len(params) == len(self._held_src) and all(
                p is q for p, q in zip(params, self._held_src, strict=True))
            if not same:
                raise DataError(f"ForwardSession hold mode: different parameters under the same generation token "
                                f"{gen!r}; pass a new gen whenever the parameters change")
            return self._held
        self._held = self._push(params)
        self._held_gen, self._held_src = gen, list(params)
        self.seeds += 1
        return self._held

    def checked_inputs(self, x: Any) -> np.ndarray:
        """The rows to score as float32, refused unless real numbers of the net's input shape, all finite."""
        n = len(x) if hasattr(x, "__len__") else 0
        if n == 0:  # nothing to pad a batch around: refused here, not a bare numpy error from the concatenation
            raise DataError("eval x has no rows; expected at least one to score")
        return net_inputs(x, self.spec, n, "eval", integers_as_given=True)  # cast a chunk at a time below

    def logits(self, x: np.ndarray, params: Sequence[Any], gen: Hashable | None = None) -> np.ndarray:
        """Logits for all rows of x (params: θ… then any running statistics, as the eval module takes them)."""
        # One call at a time (threads sharing a Model, a server's): the x slot each chunk is written into and the
        # held θ are this session's, and two calls at once scored each other's rows.
        with self._lock:
            x = self.checked_inputs(x)
            dev = self._device_params(params, gen)
            keep = range(1, 1 + len(dev))  # the parameters outlive the call, whatever the module says
            out = []
            for i in range(0, len(x), self.batch):
                chunk = np.asarray(x[i:i + self.batch], np.float32)
                n = len(chunk)
                if n < self.batch and self.batch_stats:
                    raise DataError(f"batch-statistics eval refuses a padded tail: the last batch has {n} of "
                                    f"{self.batch} rows and zero padding would shift the real rows' normalisation; "
                                    f"score a split whose size divides by {self.batch}")
                if n < self.batch:
                    chunk = np.concatenate([chunk, np.zeros((self.batch - n, *chunk.shape[1:]), np.float32)])
                try:
                    res = self.backend.execute(self.exe, [*self._x_in([chunk]), *dev], keep=keep)
                except DeviceMemoryError as e:
                    raise out_of_memory(e, f"the forward of net {self.spec.name!r}", self.batch,
                                        SMALLER_EVAL_BATCH) from None
                out.append(self.backend.to_host(res[0])[:n])
            return np.concatenate(out)
