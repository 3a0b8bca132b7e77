"""Data parallelism in one process: a train step over N replicas, and a sharded forward.

Both split a GLOBAL batch of B = N·b rows on its first axis: replica r gets rows
[r·b, (r+1)·b) of every per-example input, each replica on its own device.

- `DataParallelTrainSession`: the train step rendered at b with `replicas = N`, whose
  graph averages the loss and every gradient over the replicas (one all-reduce,
  `hloforge.core.modules.replica_mean`) before the optimizer. θ, the optimizer state and
  the schedule scalars are replicated; x, the labels (class ids or soft labels) and the
  dropout / drop-path masks are sharded (`step_placement`). Every replica ends the step
  with the same θ, so everything is read back from replica 0: θ and state, the loss (the
  replica mean), and the batch statistics — replica 0's own batch's, or with `sync_bn`
  the statistics of the whole global batch, identical on every replica.
  Resident (the default): each replica keeps its own θ and state on its own device;
  the copying path pushes replica 0's host copy to every replica every step.
- `ShardedForwardSession`: the eval forward (no collectives) compiled for N devices,
  driven at the global batch: a short last batch is padded to it, and the logits come
  back in row order with the padding dropped, exactly as `ForwardSession` returns them.
  It refuses a graph with a cross-replica op: it reads every replica's output, which
  is only right when no replica's result depends on another's.
- `RankShardedForward`: an eval forward spread over the processes of an MPI run (train/mpi.py's world).

A backend that cannot run N replicas (IREE; a client with fewer devices) raises
BackendError before anything is compiled, never a quiet run on one device.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from hloforge.backends.base import cross_replica_op
from hloforge.core.errors import BackendError, DataError, DeviceMemoryError, UnsupportedSpec
from hloforge.core.modules import TrainStepLayout, forward_module, train_step_module
from hloforge.core.registry import Registry
from hloforge.core.spec import NetSpec
from hloforge.core.strategy import target_of
from hloforge.core.variant import Variant
from hloforge.train.session import (
    SMALLER_EVAL_BATCH,
    ForwardSession,
    TrainSession,
    _is_host,
    merge_carried,
    out_of_memory,
)

SHARD, REPLICATE = "shard", "replicate"


def step_placement(layout: TrainStepLayout) -> list[str]:
    """Per train-step input, in layout order: θ, optimizer state and the schedule are replicated;
    x, the labels and the masks (everything per example) are sharded. Stated by role, not
    guessed from shapes: a parameter that happens to be batch-sized must not be split."""
    return [REPLICATE] * (layout.n_held + 1) + [SHARD] * (2 + len(layout.masks))


def require_replicas(backend: Any, replicas: int, what: str) -> None:
    """Refuse, before any compile, what the backend cannot run on `replicas` devices."""
    if replicas < 1:
        raise UnsupportedSpec(f"replicas must be at least 1, got {replicas}")
    count = backend.device_count() if hasattr(backend, "device_count") else 1  # a one-device backend may omit it
    if replicas > count:
        xla = getattr(backend, "name", "") == "xla"
        hint = (" (the XLA CPU plugin takes the count as --devices N)" if xla and "(cpu," in backend.backend_name()
                else "" if xla else " (data parallelism runs on --backend xla)")
        raise BackendError(f"{what} over {replicas} replicas needs {replicas} devices, but backend "
                           f"{backend.backend_name()} has {count}{hint}")


def split_batch(a: np.ndarray, replicas: int) -> list[np.ndarray]:
    """Rows [r·b, (r+1)·b) for each replica r (views, in order)."""
    b = len(a) // replicas
    return [a[r * b:(r + 1) * b] for r in range(replicas)]


class DataParallelTrainSession(TrainSession):
    """A TrainSession over `replicas` devices; `batch` is the GLOBAL batch (see the module doc).

    Its interface is TrainSession's: `train_step` takes the global x, labels and masks
    (`masks_for_step` draws them at the global batch), and `read_*` / `batch_stats` /
    `params` read replica 0."""

    def __init__(self, spec: NetSpec, variant: Variant, batch: int, backend: Any, *, replicas: int,
                 seed: int = 0, params: Sequence[np.ndarray] | None = None, registry: Registry | None = None,
                 resident: bool | None = None, sync_bn: bool = False):
        require_replicas(backend, replicas, "a data-parallel train step")
        if batch % replicas:
            raise DataError(f"the global batch {batch} does not split evenly over {replicas} replicas")
        self.replicas, self.local_batch, self.sync_bn = replicas, batch // replicas, sync_bn
        self._replicas: list[list[Any]] = []
        super().__init__(spec, variant, batch, backend, seed=seed, params=params, registry=registry,
                         resident=resident)
        self.placement = step_placement(self.layout)

    def _step_program(self, registry: Registry) -> tuple[Callable[[], Any], TrainStepLayout]:
        text, layout = train_step_module(self.spec, self.variant, self.local_batch, registry=registry,
                                         replicas=self.replicas, sync_bn=self.sync_bn, target=target_of(self.backend))
        return lambda: self.backend.compile(text, num_replicas=self.replicas), layout

    def _place(self, carried: list[np.ndarray]) -> None:
        if self.resident:
            self._replicas = [[self.backend.to_device(a, device=r) for a in carried] for r in range(self.replicas)]
            self._carried = self._replicas[0]
        else:
            self._carried = carried

    def release(self) -> None:
        super().release()
        self._replicas = []  # each replica's copy too

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float,
                   masks: Sequence[np.ndarray] | None = None) -> float:
        """One data-parallel step on the global batch; returns the loss averaged over replicas."""
        lay, be = self.layout, self.backend
        want_x, want_y = (self.batch, *lay.x_shape[1:]), (self.batch, *lay.y_shape[1:])
        x, y = self.checked_batch(x, y, want_x, want_y,
                                  f" (the global batch: {self.replicas} replicas × {self.local_batch})")
        masks = self._advance(masks, lr)
        # Each step input as one part per replica: the same array replicated, or its rows split.
        parts = [[a] * self.replicas if p == REPLICATE else split_batch(a, self.replicas)
                 for a, p in zip(self._step_host(x, y, lr, masks), self.placement[lay.n_held:], strict=True)]
        per_replica = []
        for r in range(self.replicas):
            carried = self._replicas[r] if self.resident else [be.to_device(a, device=r) for a in self._carried]
            inputs = [be.to_device(part[r], borrow=True, device=r) for part in parts]
            per_replica.append([*carried, *inputs])
        # The carried inputs are donated and consumed on every replica.
        try:
            outs = be.execute_replicated(self.exe, per_replica)
        except DeviceMemoryError as e:
            raise out_of_memory(e, f"the train step of net {self.spec.name!r}", self.batch) from None
        del per_replica  # releases the borrowed host arrays
        new = [o[:lay.n_carried] for o in outs]
        if self.resident:
            self._replicas = [merge_carried(lay, held, n) for held, n in zip(self._replicas, new, strict=True)]
            self._carried = self._replicas[0]
        else:
            self._carried = merge_carried(lay, self._carried, [be.to_host(b) for b in new[0]])
        self._batch_stats = outs[0][lay.loss_index + 1:]
        return float(be.to_host(outs[0][lay.loss_index]))

    def read_replica_params(self, replica: int) -> list[np.ndarray]:
        """θ as replica `replica` holds it (resident only): every replica's equals replica 0's."""
        if not self.resident:
            raise DataError("the copying path keeps one host copy of θ, not one per replica")
        return self._declared(self._replicas[replica][:self.layout.n_params])

    def replica_params(self) -> list[list[Any]]:
        """θ on every replica's device (replica r's list first pushed to device r): what a
        ShardedForwardSession takes without copying. In the copying path, a fresh push per call."""
        n = self.layout.n_params
        if self.resident:
            return [list(c[:n]) for c in self._replicas]
        return [[self.backend.to_device(a, device=r) for a in self._carried[:n]] for r in range(self.replicas)]

    def replica_slot_buffers(self, slot: str) -> list[list[Any]]:
        """One state slot's tensors (e.g. "E", the EMA shadow) on every replica's device, as `replica_params`
        gives θ: what a ShardedForwardSession takes. In the copying path, a fresh push per call."""
        if self.resident:
            return [self.slot_of(c, slot) for c in self._replicas]
        part = self.slot_of(self._carried, slot)
        return [[self.backend.to_device(a, device=r) for a in part] for r in range(self.replicas)]


def compile_sharded(backend: Any, mlir_text: str, replicas: int) -> Any:
    """Compile a graph for sharded inference over `replicas` devices. A graph with a cross-replica
    op is refused: sharded inference reads every replica's output as its own rows, which a
    train step's collectives (read from replica 0 alone) would make wrong."""
    found = cross_replica_op(mlir_text)
    if found is not None:
        raise UnsupportedSpec(f"sharded inference takes a graph without cross-replica ops, and this one has "
                              f"{found!r} (a data-parallel train step is run by DataParallelTrainSession)")
    require_replicas(backend, replicas, "sharded inference")
    return backend.compile(mlir_text, num_replicas=replicas)


class ShardedForwardSession(ForwardSession):
    """The eval forward at per-replica `batch` over `replicas` devices, driven at the global batch
    `replicas × batch` (see the module doc). `logits(x, params, gen)` is ForwardSession's:
    params are host arrays (pushed to every replica — once per `gen` in hold mode, so the
    push is replicas× once per generation, not per batch), or one list of device buffers
    per replica, replica r's on device r (`DataParallelTrainSession.replica_params`)."""

    def __init__(self, spec: NetSpec, batch: int, backend: Any, replicas: int, suffix: str = ""):
        self.replicas = replicas
        super().__init__(spec, batch, backend, suffix=suffix)
        self.global_batch = replicas * batch

    def _compile(self) -> Any:
        text = forward_module(self.spec, self.batch, eval_mode=True, target=target_of(self.backend),
                              suffix=self.suffix)
        return compile_sharded(self.backend, text, self.replicas)

    def _push(self, params: Sequence[Any]) -> list[Any]:
        if not all(_is_host(p) for p in params):
            raise DataError("ShardedForwardSession takes host arrays, or one list of device buffers per replica")
        return [[self.backend.to_device(self._stored(i, p), device=r) for i, p in enumerate(params)]
                for r in range(self.replicas)]

    def logits(self, x: np.ndarray, params: Sequence[Any], gen: Hashable | None = None) -> np.ndarray:
        """Logits for all rows of x, in row order (params: θ… then any running statistics)."""
        per_replica = self._device_params(params, gen)
        if len(per_replica) != self.replicas or not all(isinstance(p, (list, tuple)) for p in per_replica):
            raise DataError(f"expected one parameter list per replica ({self.replicas}), or host arrays")
        keep = range(1, 1 + len(per_replica[0]))  # the parameters outlive the call
        x = self.checked_inputs(x)
        be, gb, out = self.backend, self.global_batch, []
        for i in range(0, len(x), gb):
            chunk = x[i:i + gb]
            n = len(chunk)
            if n < gb:  # the ragged tail: zero rows to the global batch, computed and never read
                chunk = np.concatenate([chunk, np.zeros((gb - n, *chunk.shape[1:]), np.float32)])
            args = [[be.to_device(np.ascontiguousarray(part), borrow=True, device=r), *per_replica[r]]
                    for r, part in enumerate(split_batch(chunk, self.replicas))]
            try:
                res = be.execute_replicated(self.exe, args, keep=keep)
            except DeviceMemoryError as e:
                raise out_of_memory(e, f"the forward of net {self.spec.name!r}", gb, SMALLER_EVAL_BATCH) from None
            del args
            out.append(np.concatenate([be.to_host(outs[0]) for outs in res])[:n])
        return np.concatenate(out)


def make_forward_session(spec: NetSpec, batch: int, backend: Any, replicas: int = 1,
                         suffix: str = "") -> ForwardSession:
    """The eval session at per-replica `batch`: replicas ≤ 1 IS ForwardSession (a single-device
    run and every IREE run are unchanged); past 1 a ShardedForwardSession, XLA only. `suffix`
    ends the module's name (`forward_module`)."""
    if replicas <= 1:
        return ForwardSession(spec, batch, backend, suffix=suffix)
    return ShardedForwardSession(spec, batch, backend, replicas, suffix=suffix)


class RankShardedForward:
    """An eval session's `logits` spread over the ranks: each scores a contiguous slice of the rows
    with `inner` (its own devices as `inner` does), and the logits are gathered in row order on every
    rank, so every task scores the whole split exactly as one process does."""

    def __init__(self, inner: ForwardSession, world: Any):  # train.mpi.World (which imports this module)
        self.inner, self.world = inner, world

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def logits(self, x: np.ndarray, params: Sequence[Any], gen: Any = None) -> np.ndarray:
        w, n = self.world, len(x)
        counts = [n // w.size + (1 if r < n % w.size else 0) for r in range(w.size)]
        lo = sum(counts[:w.rank])
        if counts[w.rank]:
            part = self.inner.logits(x[lo:lo + counts[w.rank]], params, gen)
        else:  # fewer rows than ranks: this one scores none, but says the row shape
            part = np.zeros((0, *self.inner.spec.out_shape), np.float32)
        return w.allgather_rows(part, counts, "the evaluation gather")
