"""Training across processes on MPI: the world a launcher started, and the data-parallel session over it.

`mpirun -np P hloforge train ...` (or `srun`) starts P copies of the run. `world()` finds them from the
launcher's environment (`PMI_SIZE` from MPICH's hydra and Intel MPI, `OMPI_COMM_WORLD_SIZE` from Open MPI,
`SLURM_STEP_NUM_TASKS` from srun; `HLOFORGE_MPI=1` asks for MPI outright) and imports mpi4py only then:
a plain run needs no MPI installed, and a multi-process launch without it is one line naming the extra.

`MpiTrainSession` is the data-parallel step with the reduction taken out of the graph. Each rank takes
its rows of the GLOBAL batch (every rank draws the same global batch, masks and augmentation: the same
function of the seed at any P), runs the gradient half (`gradient_step_module`: forward, loss, backward;
over its own local devices with the in-graph mean, as `DataParallelTrainSession`), averages ∂θ and the
loss across ranks with ONE in-place MPI all-reduce of a flat float32 host buffer (a few calls for a net
past `BUCKET_BYTES`), then runs the update half (`optimizer_step_module` with the variant's wrappers:
clipping sees the averaged gradient, as in the fused data-parallel step). The update runs on identical
inputs on every rank, so θ and the optimizer state stay identical, bit for bit. Rank 0's batch
statistics ride in the same buffer (the others add zeros), so every rank tracks the running statistics
the one-process run reads from its replica 0. The mean is the sum ÷ P in float32, as `replica_mean`
computes it: at one device per rank the step is the `--replicas P` step.

Every wait on the others is watched (`HLOFORGE_MPI_TIMEOUT`, default 30 s): a rank that dies or hangs
makes the others stop with one line naming it, never a silent hang.

A fault ends the job for every rank at once (`end_after_error`): a rank that reports alone (a peer
died or hung, or it failed where the others did not) calls MPI_Abort, never leaving the others to wait
out their timeout, or, behind a hung peer, for ever. A rank merely exiting does not do it: hydra's proxy
ends a job on a process's PMI socket closing without MPI_Finalize only when that close reaches it
before it reaped the process, and the job of a hung rank then waited for ever (strace of the proxy).

Under hydra each rank runs as a worker under a small parent: hloforge.train.supervise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import BackendError, DataError, DeviceMemoryError, HloforgeError, UnsupportedSpec
from hloforge.core.hlo import PROCESS_SUM
from hloforge.core.launcher import launched as launched
from hloforge.core.modules import TrainStepLayout, gradient_step_module, optimizer_step_module, stored_shape
from hloforge.core.registry import Registry
from hloforge.core.spec import NetSpec
from hloforge.core.strategy import ENV_VAR, target_of
from hloforge.core.switches import env_switch
from hloforge.core.variant import Variant
from hloforge.train.parallel import DataParallelTrainSession, require_replicas, split_batch
from hloforge.train.session import TrainSession, memory_said, merge_carried
from hloforge.train.supervise import WORKER_ENV as WORKER_ENV
from hloforge.train.supervise import supervise as supervise

FORCE_ENV = "HLOFORGE_MPI"  # on (1, yes, ...): use MPI even where no launcher variable says so
TIMEOUT_ENV = "HLOFORGE_MPI_TIMEOUT"  # seconds a rank waits for the others at a step before naming the missing
DEFAULT_TIMEOUT_S = 30.0
# Waits that follow work one rank does alone (compiling, rank 0's checkpoint and plots) get this many timeouts.
SLOW_PHASE_FACTOR = 20
BUCKET_BYTES = 64 << 20  # the all-reduce in calls of at most this much: one call for any net below it
# Test knob (seed 003's fault knobs), never set in a real run: "RANK:WHAT" makes that rank SIGSTOP itself as
# it reaches the all-reduce named WHAT, before posting it: a hang at an exact place (the hung-rank drills).
STOP_ENV = "HLOFORGE_FAULT_STOP_AT"
INSTALL = "pip install 'hloforge[mpi]' (mpi4py and the mpich wheels)"
QUIET_GRACE_S = 5.0  # a rank that does not report gives the one that does this long to end the job itself
# Before MPI_Abort: the launcher forwards the line printed before it kills (hydra lost it 1 run in 3 without).
OUTPUT_GRACE_S = 0.5
INTERRUPT_GRACE_S = 2.0  # after Ctrl-C, how long a rank waits to learn whether every rank was interrupted


class PeerError(HloforgeError):
    """A refusal every rank reaches together: printed by the reporting rank alone (`quiet` on the others).
    `together` False: one raised because a peer is gone (`World.lost`), where MPI cannot shut down in order."""

    def __init__(self, message: str, quiet: bool = False, together: bool = True):
        super().__init__(message)
        self.quiet, self.together = quiet, together


def shared(err: HloforgeError, w: World, by: int = 0) -> HloforgeError:
    """`err` as a refusal every rank raises alike: printed by rank `by` alone. Every rank is there to raise
    it, so each ends in MPI_Finalize at exit: a script that catches it (Model.fit's) and exits would
    otherwise leave hydra to SIGKILL the ranks still handling it once the first one's PMI socket closed."""
    err.quiet = w.rank != by  # type: ignore[attr-defined]
    err.together = True  # type: ignore[attr-defined]
    w.finalize_at_exit()
    return err


def raise_roots(w: World, failed: HloforgeError | None, what: str, kind: type[HloforgeError] = HloforgeError) -> None:
    """Rank 0's refusal at `what` (`failed` there, None where it passed; rank 0 alone decides), raised by
    every rank alike: printed once, MPI ends in order (no MPI_Abort, whose launcher line would follow it)."""
    said = w.bcast("" if failed is None else str(failed), what) if w.size > 1 else ""
    if said:
        raise shared(failed or kind(said), w)
    if failed is not None:
        raise failed


def end_after_error(err: BaseException, code: int) -> None:
    """After `err` ended this rank's run (its line printed), with exit status `code` to come. A refusal every
    rank reached together (`shared`, or a PeerError of the run's own): MPI shuts down in order, so the
    launcher sees each rank end as it ended (without MPI_Finalize, hydra's default cleanup SIGKILLs the ranks
    still exiting when the first one's PMI connection closes: exit 9, not 3). Anything else, a fault this
    rank reports alone: MPI_Abort, which every launcher answers by stopping every rank, once the line is
    out (a rank that does not report gives the one that does QUIET_GRACE_S to do it); this call does not
    return."""
    w = _WORLD
    if w is None or w.size == 1 or w._mpi is None or w._mpi.Is_finalized():
        return
    if getattr(err, "together", False):
        w._mpi.Finalize()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(QUIET_GRACE_S if getattr(err, "quiet", False) else OUTPUT_GRACE_S)
    w._mpi.COMM_WORLD.Abort(code)


def end_after_interrupt(say: Callable[[], None]) -> None:
    """After Ctrl-C ended this rank's run. The launcher passes Ctrl-C to every rank: when they all meet
    within INTERRUPT_GRACE_S, rank 0 alone calls `say` and MPI shuts down in order (the job exits 130, not
    hydra's 9); a rank interrupted alone calls `say` and leaves as before (hydra then stops the others)."""
    w = _WORLD
    if w is None or w.size == 1 or w._halt is None or w._mpi.Is_finalized():
        say()
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while the ranks meet
    met, deadline = w._halt.Ibarrier(), time.monotonic() + INTERRUPT_GRACE_S
    while not met.Test():
        if time.monotonic() > deadline:
            say()
            return
        time.sleep(0.005)
    if w.is_root:
        say()
    sys.stderr.flush()
    # the interrupted collectives stay pending, which MPICH's finalize notes on stderr: after the one line, noise
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    w._mpi.Finalize()


@attrs.define
class World:
    """The processes of one run: `rank` of `size`; `comm` is mpi4py's COMM_WORLD (None alone)."""

    rank: int = 0
    size: int = 1
    comm: Any = None
    timeout: float = DEFAULT_TIMEOUT_S
    step: int = 0  # the step the last wait belonged to (named when a peer goes missing)
    allreduce_calls: int = 0  # MPI all-reduce calls so far (one per step below BUCKET_BYTES)
    _mpi: Any = None
    _diag: Any = None  # a communicator of its own for the missing-rank round
    _halt: Any = None  # one more, for the ranks to meet after Ctrl-C (end_after_interrupt)
    said: str = ""  # what this rank prints of a start some rank did not make (_meet)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # -- waits ------------------------------------------------------------------------

    def wait(self, request: Any, what: str, slow: bool = False) -> None:
        """Complete a non-blocking collective, or stop with one line naming the rank(s) that never came:
        after `timeout` seconds (× SLOW_PHASE_FACTOR after a phase one rank runs alone), or at once when
        the launcher signals that a process died (SIGUSR1, hydra's notice under -disable-auto-cleanup)."""
        deadline = time.monotonic() + self.timeout * (SLOW_PHASE_FACTOR if slow else 1)
        spins, pause = 0, 2e-5
        while True:
            try:
                if request.Test():
                    return
            except self._mpi.Exception:  # a transport error: a peer is gone
                break
            if _PEER_DIED or time.monotonic() > deadline:
                break
            spins += 1
            if spins > 200:  # a short spin for a fast step, then sleeps that leave the core to the others
                time.sleep(pause)
                pause = min(pause * 2, 2e-3)
        self.lost(what)

    def lost(self, what: str) -> None:
        """Find which ranks are still here (a short round on a communicator of its own) and raise: the
        lowest rank still here reports, the others stop quietly."""
        grace = 1.0 if _PEER_DIED else min(5.0, max(1.0, self.timeout / 6))  # the launcher said one died
        peers = [r for r in range(self.size) if r != self.rank]
        heard = np.zeros(self.size, np.int32)
        mine = np.array([1], np.int32)
        reqs: list[tuple[int, Any]] = []
        try:
            for p in peers:
                self._diag.Isend(mine, dest=p, tag=7)
                reqs.append((p, self._diag.Irecv(heard[p:p + 1], source=p, tag=7)))
        except self._mpi.Exception:
            pass
        end = time.monotonic() + grace
        alive = {self.rank}
        while time.monotonic() < end and len(alive) < self.size:
            for p, r in reqs:
                try:
                    if p not in alive and r.Test():
                        alive.add(p)
                except self._mpi.Exception:
                    pass
            time.sleep(0.01)
        missing = [r for r in range(self.size) if r not in alive] or peers
        who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {', '.join(map(str, missing))}"
        why = "died" if _PEER_DIED else f"did not arrive within {self.timeout:g} s ({TIMEOUT_ENV})"
        # a supervised peer that died said so itself (its own error line, or its parent's: `supervise`)
        named_by_the_dead = _PEER_DIED and os.environ.get(WORKER_ENV) == "1"
        raise PeerError(f"{who} of {self.size} {why} at {what} (step {self.step}); the other ranks stopped",
                        quiet=self.rank != min(alive) or named_by_the_dead, together=False)

    # -- collectives ------------------------------------------------------------------

    def allreduce_sum(self, buf: np.ndarray, what: str) -> None:
        """`buf` (flat, contiguous) summed over the ranks in place, in calls of at most BUCKET_BYTES."""
        if self.size == 1:
            return
        if os.environ.get(STOP_ENV) == f"{self.rank}:{what}":
            from hloforge.train.checkpoint import mark

            mark("stopped", self.step)
            os.kill(os.getpid(), signal.SIGSTOP)
        per = max(1, BUCKET_BYTES // buf.itemsize)
        for i in range(0, len(buf), per):
            self.allreduce_calls += 1
            self.wait(self.comm.Iallreduce(self._mpi.IN_PLACE, buf[i:i + per], op=self._mpi.SUM), what)

    def allgather_rows(self, part: np.ndarray, counts: Sequence[int], what: str) -> np.ndarray:
        """Each rank's rows (rank r holds counts[r]) joined in rank order, on every rank."""
        part = np.ascontiguousarray(part, np.float32)
        row = math.prod(part.shape[1:])
        out = np.empty((sum(counts), *part.shape[1:]), np.float32)
        sizes = [c * row for c in counts]
        offsets = np.cumsum([0, *sizes[:-1]]).tolist()
        self.wait(self.comm.Iallgatherv(part, [out, sizes, offsets, self._mpi.FLOAT]), what)
        return out

    def barrier(self, what: str, slow: bool = False) -> None:
        if self.size > 1:
            self.wait(self.comm.Ibarrier(), what, slow=slow)

    def bcast(self, obj: Any, what: str, slow: bool = False) -> Any:
        """Rank 0's `obj` on every rank (pickled; once a run, not per step)."""
        if self.size == 1:
            return obj
        blob = np.frombuffer(_pickle(obj), np.uint8) if self.is_root else np.zeros(0, np.uint8)
        n = np.array([len(blob)], np.int64)
        self.wait(self.comm.Ibcast(n, root=0), what, slow=slow)
        buf = blob.copy() if self.is_root else np.empty(int(n[0]), np.uint8)
        self.wait(self.comm.Ibcast(buf, root=0), what)
        return obj if self.is_root else _unpickle(buf.tobytes())

    def allgather(self, obj: Any, what: str, slow: bool = False) -> list[Any]:
        """Every rank's `obj` on every rank (in rank order): small things, once."""
        blob = np.frombuffer(_pickle(obj), np.uint8)
        sizes = np.zeros(self.size, np.int64)
        self.wait(self.comm.Iallgather(np.array([len(blob)], np.int64), sizes), what, slow=slow)
        out = np.empty(int(sizes.sum()), np.uint8)
        offsets = np.cumsum([0, *sizes[:-1]]).tolist()
        self.wait(self.comm.Iallgatherv(blob, [out, sizes.tolist(), offsets, self._mpi.BYTE]), what)
        return [_unpickle(out[o:o + s].tobytes()) for o, s in zip(offsets, sizes.tolist(), strict=True)]

    def agree(self, what: str, value: Any, fix: str = "start every rank with the same command and data") -> None:
        """Refuse, on every rank at once, a run whose ranks were started differently: `value` (JSON-able:
        the config and the net) compared through the engine; rank 0 names the first rank that differs and
        how."""
        if self.size == 1:
            return
        text = json.dumps(value, sort_keys=True, default=str)
        digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
        every = np.zeros((self.size, len(digest)), np.uint8)
        self.wait(self.comm.Iallgather(digest, every), f"the start ({what} compared)", slow=True)
        if (every == every[0]).all():
            return
        values = self.allgather(value, what)
        from hloforge.train.checkpoint import first_difference

        odd = next(r for r in range(self.size) if not (every[r] == every[0]).all())
        theirs = json.loads(json.dumps(values[odd], sort_keys=True, default=str))
        ours = json.loads(text)
        raise PeerError(f"rank {odd} of {self.size} was started with another {what} than rank 0 "
                        f"({first_difference(theirs, ours)}); {fix}",
                        quiet=not self.is_root)

    def finalize(self) -> None:
        """The end of a run that every rank finished: MPI shuts down in order when the process exits (a
        failed rank never gets here, so a survivor never waits in MPI_Finalize for a peer that is gone;
        another run in the same process still has MPI)."""
        if self.size > 1 and self._mpi is not None:
            self.barrier("the end of the run", slow=True)
            self.finalize_at_exit()

    def finalize_at_exit(self) -> None:
        """MPI_Finalize when the process exits, where every rank is known to reach it (not after a fault)."""
        global _FINALIZE_AT_EXIT
        if self.size > 1 and self._mpi is not None and not _FINALIZE_AT_EXIT:
            import atexit

            atexit.register(lambda: None if self._mpi.Is_finalized() else self._mpi.Finalize())
            _FINALIZE_AT_EXIT = True


def _pickle(obj: Any) -> bytes:
    import pickle

    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _unpickle(b: bytes) -> Any:
    import pickle

    return pickle.loads(b)  # from rank 0 of this same job, never from a file


_PEER_DIED = False
_WORLD: World | None = None
_FINALIZE_AT_EXIT = False


def _on_peer_death(signum: int, frame: Any) -> None:
    global _PEER_DIED
    _PEER_DIED = True


def world_made() -> bool:
    """Whether this process has made its World (after which the ranks refuse together through `shared`)."""
    return _WORLD is not None


def world(environ: Any = None, ended: tuple[int, str] | None = None) -> World:
    """The processes this one was launched with (detected once, lazily). One process: World(0, 1). `ended`:
    this rank ended before its run started (ended_before_start); the ranks meet first either way (_meet)."""
    global _WORLD
    if _WORLD is not None and environ is None:
        return _WORLD  # (its timeout checked as it was made)
    env = os.environ if environ is None else environ
    rank, size, var = launched(env)
    try:
        forced, bad_force = env_switch(FORCE_ENV, on="use MPI even where no launcher variable says so",
                                       error=UnsupportedSpec, environ=env), None
    except UnsupportedSpec as e:  # a launcher's rank refusing it before MPI_Init left the others there for good
        if size == 1:
            raise
        forced, bad_force = True, e  # refused with the others, below
    if size == 1 and not forced:
        w = World()
    else:
        try:
            import mpi4py

            mpi4py.rc.finalize = False  # World.finalize does it on success; a failed rank must not wait in it
            from mpi4py import MPI
        except ImportError:
            asked = (f"{var}={size}: one of {size} processes an MPI launcher started" if var
                     else f"{FORCE_ENV}={env[FORCE_ENV]}")
            raise BackendError(f"training across processes needs mpi4py ({asked}); {INSTALL}") from None
        comm = MPI.COMM_WORLD
        if var and comm.Get_size() != size:  # e.g. srun without its MPI plugin: P lone copies of one run
            raise BackendError(f"the launcher started {size} processes ({var}={size}) but MPI sees "
                               f"{comm.Get_size()}: this MPI is not the launcher's (with srun: --mpi=pmi2 or "
                               "--mpi=pmix, as the MPI library was built)")
        w = World(comm.Get_rank(), comm.Get_size(), comm, _timeout(env) or DEFAULT_TIMEOUT_S, mpi=MPI, diag=comm.Dup(),
                  halt=comm.Dup())
        if w.size > 1 and signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR1, _on_peer_death)
    if environ is None:
        _WORLD = w
        if w.size > 1:
            w.said = _meet(w, ended)
    if w._mpi is not None and ended is None:  # met by every rank (refuse_together): each machine has its own
        # environment, and one rank refusing it alone left the others waiting for it; said once, MPI ends in order
        timeout = UnsupportedSpec(f"{TIMEOUT_ENV}={env.get(TIMEOUT_ENV)!r}: expected a positive number of seconds")
        refuse_together(w, bad_force or (timeout if _timeout(env) is None else None), f"the check of {FORCE_ENV} and "
                        f"{TIMEOUT_ENV}", f"give every rank the same {FORCE_ENV} and {TIMEOUT_ENV}")
    return w


def _meet(w: World, ended: tuple[int, str] | None) -> str:
    """The first collective of a run across processes: whether each rank ended before its run started (its
    exit status and what it would print: a usage error, a refusal of its options, --help), so that no rank
    waits for ever for one that left (in MPI_Init, or at the start). Every rank ended: rank 0 says it; some
    alone: the lowest of them says it and names them. What this rank prints; a rank that did start is
    stopped, quietly (a refusal every rank reached together: MPI ends in order)."""
    notes = w.allgather(ended, "the start", slow=True)
    gone = [r for r, n in enumerate(notes) if n is not None]
    if not gone:
        return ""
    w.finalize_at_exit()
    text = notes[gone[0]][1]
    if len(gone) < w.size:
        text = f"{text.rstrip()}{_alone(gone, w.size)}\n"
    if ended is None:
        raise PeerError(f"{text.rstrip()}", quiet=True)
    return text if w.rank == gone[0] else ""


def _alone(gone: Sequence[int], size: int, fix: str = "start every rank with the same command") -> str:
    """The note a line some ranks alone say ends with: which of them, and what to do."""
    who = f"rank {gone[0]}" if len(gone) == 1 else f"ranks {', '.join(map(str, gone))}"
    return f" (on {who} of {size} alone: {fix})"


def refuse_together(w: World, failed: HloforgeError | None, what: str = "the options' checks",
                    fix: str = "start every rank with the same command") -> None:
    """The options' refusal, `failed` on this rank (None where its options passed), met by every rank: where
    any rank refused, every rank raises it at once and it is said once, as `shared` (every rank refused: rank
    0's own line; some alone, a rank started with another command line: the lowest one's, naming them). A
    rank refusing alone used to leave the others waiting at their next collective for 20 × the timeout."""
    if w.size == 1:
        if failed is not None:
            raise shared(failed, w)
        return
    said = w.allgather(None if failed is None else str(failed), what, slow=True)
    gone = [r for r, line in enumerate(said) if line is not None]
    if not gone:
        return
    if failed is not None and len(gone) == w.size:
        raise shared(failed, w)
    raise shared(UnsupportedSpec(f"{said[gone[0]]}{_alone(gone, w.size, fix)}"), w)


def memory_together(w: World, failed: DeviceMemoryError | None, gone: list[int]) -> HloforgeError:
    """Out of memory on ranks `gone` (`failed` on this one, None where its step ran) at a point every rank
    reaches: raised by every rank, said once, by the lowest of them, naming them."""
    who = f"every rank of {w.size}" if len(gone) == w.size else \
        f"rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} of {w.size}"
    err = DeviceMemoryError(f"{failed.said} (on {who})", failed.needed, failed.advice) if failed else \
        PeerError(f"out of memory on {who}; the other ranks stopped")
    return shared(err, w, by=gone[0])


def ended_before_start(code: int, said: str) -> str | None:
    """A rank of a launch across processes that ends before its run starts meets the others first (_meet);
    what it prints of `said` then ("" where another rank says it). None where no world can be made (no
    mpi4py): rank 0 says it, as every rank would."""
    try:
        return world(ended=(code, said)).said
    except HloforgeError:
        return None


def _timeout(env: Any) -> float | None:
    """$HLOFORGE_MPI_TIMEOUT in seconds (unset: the default); None for a value that is not a positive number."""
    raw = env.get(TIMEOUT_ENV, "")
    try:
        timeout = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        return None
    return timeout if timeout > 0 and math.isfinite(timeout) else None


def started_as(run: Any, resume: bool) -> dict[str, Any]:
    """What the ranks of `hloforge train` compare at the start (World.agree): the config, the net, --resume,
    and the data each rank read, since one path may hold other data on another machine (its eval set's id,
    the train split's size, a hash of up to 2^20 of its labels, evenly spaced, and one of up to 2^14 values of
    each of 64 of its stored rows, evenly spaced: a copy whose images alone differ trains otherwise too)."""
    y, x, n = np.asarray(run.feed.y).reshape(-1), run.feed.x, run.feed.n
    labels = np.ascontiguousarray(y[::max(1, y.size >> 20)], np.int64)
    inputs = hashlib.sha256()
    for i in np.linspace(0, n - 1, min(n, 64)).astype(int):  # row by row: a row's size is the dataset's own affair
        inputs.update(np.ascontiguousarray(np.asarray(x[i]).reshape(-1)[::max(1, np.size(x[i]) >> 14)]))
    return {"config": attrs.asdict(run.cfg), "net": run.spec.to_dict(), "resume": resume, "data": {
        "eval_set": str(run.eval_set), "train": {"examples": n, "labels": hashlib.sha256(labels).hexdigest()[:16],
                                                 "inputs": inputs.hexdigest()[:16]}}}


def on_rank(w: World, callbacks: Sequence[Any]) -> list[Any]:
    """The callbacks this rank runs: every one on rank 0, the one writer (TensorBoard's events, a CSV; a stop
    one decides reaches the others: Run._epoch_end); elsewhere those with `every_rank` alone."""
    return [cb for cb in callbacks if w.is_root or getattr(cb, "every_rank", False)]


# -- the run's pieces over the world -----------------------------------------------------------


def global_replicas(replicas: int, sync_bn: bool, w: World) -> int:
    """The run's replica count over P processes: at least P (the default 1 becomes P), a multiple of P.
    `--sync-bn` across processes runs one replica per process (its host call is made once per process)."""
    if w.size == 1:
        return replicas
    total = max(replicas, w.size)
    if total % w.size:
        raise shared(UnsupportedSpec(f"--replicas {replicas} does not split over {w.size} MPI processes; give a "
                                     f"multiple of {w.size} (the default: one replica per process)"), w)
    if sync_bn and total != w.size:
        raise shared(UnsupportedSpec(f"--sync-bn across {w.size} MPI processes runs one replica per process; "
                                     f"--replicas {replicas} puts {total // w.size} in each: drop --replicas "
                                     "(or --sync-bn)"), w)
    return total


class MpiTrainSession(DataParallelTrainSession):
    """The data-parallel step over `world` (module doc): `replicas` is the run's total; this process runs
    replicas ÷ P of them on its own devices (`self.replicas`, as `DataParallelTrainSession` counts them).
    `train_step` takes the GLOBAL batch, as the one-process session does."""

    def __init__(self, spec: NetSpec, variant: Variant, batch: int, backend: Any, *, world: World, replicas: int,
                 seed: int = 0, params: Sequence[np.ndarray] | None = None, registry: Registry | None = None,
                 resident: bool | None = None, sync_bn: bool = False):
        if replicas % world.size:
            raise UnsupportedSpec(f"{replicas} replicas do not split over {world.size} processes")
        if batch % replicas:
            raise DataError(f"the global batch {batch} does not split evenly over {replicas} replicas")
        self.world, self.total_replicas = world, replicas
        self.replicas = replicas // world.size
        if self.replicas > 1:
            require_replicas(backend, self.replicas, "a data-parallel train step")
        self.local_batch, self.sync_bn = batch // replicas, sync_bn and world.size > 1
        if self.sync_bn:
            if self.replicas > 1:
                raise UnsupportedSpec(f"--sync-bn across MPI processes runs one replica per process, not "
                                      f"{self.replicas}")
            register = getattr(backend, "register_host_call", None)
            if register is None:
                raise UnsupportedSpec(f"--sync-bn across MPI processes sums the BN statistics in a host call inside "
                                      f"the step, which the {getattr(backend, 'name', backend)} backend cannot make: "
                                      "use the xla backend, or drop --sync-bn")
            register(PROCESS_SUM, self._process_sum)
        self._replicas: list[list[Any]] = []
        TrainSession.__init__(self, spec, variant, batch, backend, seed=seed, params=params, registry=registry,
                              resident=resident)
        lay = self.layout
        trained = [lay.params[i][1] for i in lay.trained]  # a frozen θ has no gradient, no place in the buffer
        sizes = [math.prod(s.shape) for s in trained]
        stat_sizes = [math.prod(s.shape) for _, s in lay.stats]
        # [∂θ… | loss | batch stats…]: one buffer, one all-reduce; the views below are its pieces, stored
        # as the gradient half returns them and the update half takes them.
        # … | a flag per rank]: the ranks whose gradient half ran out of memory, said once (memory_together)
        self._flat = np.zeros(sum(sizes) + 1 + sum(stat_sizes) + world.size, np.float32)
        self._failed = self._flat[-world.size:]
        self._grad_end = sum(sizes)
        self._grad_views: list[np.ndarray] = []
        off = 0
        for s in sizes:
            self._grad_views.append(self._flat[off:off + s])
            off += s
        # the same pieces in the stored shapes the update half takes (views: the all-reduce's mean is in them)
        self._grads = [v.reshape(stored_shape(s.shape, lay.storage[i]))
                       for v, s, i in zip(self._grad_views, trained, lay.trained, strict=True)]
        self._stat_views: list[np.ndarray] = []
        off += 1
        for s in stat_sizes:
            self._stat_views.append(self._flat[off:off + s])
            off += s
        self.comm_s = 0.0  # seconds spent in the all-reduce (what a benchmark reads)

    def _step_program(self, registry: Registry) -> tuple[Callable[[], Any], TrainStepLayout]:
        target = target_of(self.backend)
        text, layout = gradient_step_module(self.spec, self.variant, self.local_batch, registry=registry,
                                            replicas=self.replicas, sync_bn=self.sync_bn, processes=self.world.size,
                                            target=target)
        update = optimizer_step_module([layout.params[i][1] for i in layout.trained], self.optimizer,
                                       wrappers=self.variant.wrappers, target=target,
                                       storage=tuple(layout.storage[i] for i in layout.trained),
                                       name=f"{self.spec.ident}_{self.variant.slug}_update_step")
        # one program on every rank: the ∂θ are summed slot by slot, so a layout one machine's HLOFORGE_STRATEGY or
        # plugin code rendered otherwise would be summed into another's (a plausible, wrong loss)
        self.world.agree("train step", {ENV_VAR: os.environ.get(ENV_VAR, ""), "program": hashlib.sha256(
            (text + update).encode()).hexdigest()[:16]}, f"give every rank the same {ENV_VAR} and plugins")

        def compile_both() -> Any:
            self.update_exe = self._compile(update)
            return self._compile(text)
        return compile_both, layout

    def _process_sum(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """The sync-BN step's host call (Builder.process_sum), on an XLA thread mid-step: the statistics'
        sums over the ranks, in one all-reduce. inputs[0] / outputs[0]: the calls' order token."""
        outputs[0][...] = inputs[0]
        flat = np.concatenate([a.ravel() for a in inputs[1:]]).astype(np.float32, copy=False)
        self.world.allreduce_sum(flat, "the sync-BN statistics")
        off = 0
        for out in outputs[1:]:
            out.ravel()[:] = flat[off:off + out.size]
            off += out.size

    def _compile(self, text: str) -> Any:
        return self.backend.compile(text, num_replicas=self.replicas) if self.replicas > 1 else \
            self.backend.compile(text)

    def _run(self, exe: Any, per_replica: list[list[Any]], keep: Sequence[int] = ()) -> list[list[Any]]:
        with memory_said(f"the train step of net {self.spec.name!r}", self.batch):  # the global batch, as P=1's
            if self.replicas > 1:
                return self.backend.execute_replicated(exe, per_replica, keep=keep)
            return [self.backend.execute(exe, per_replica[0], keep=keep)]

    def _theta_on(self, r: int) -> list[Any]:
        """The carried state (θ, optimizer state) on local replica r's device."""
        return self._replicas[r] if self.resident else [self.backend.to_device(a, device=r) for a in self._carried]

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float,
                   masks: Sequence[np.ndarray] | None = None) -> float:
        """One step on the global batch over every rank; returns the loss averaged over all replicas."""
        lay, be, w = self.layout, self.backend, self.world
        want_x, want_y = (self.batch, *lay.x_shape[1:]), (self.batch, *lay.y_shape[1:])
        x, y = self.checked_batch(x, y, want_x, want_y,
                                  f" (the global batch: {self.total_replicas} replicas × {self.local_batch})")
        masks = self._advance(masks, lr)
        w.step = self.step
        sched, *rows = self._step_host(x, y, lr, masks)
        n, n_tr, per = lay.n_params, len(lay.trained), self.replicas * self.local_batch
        mine = [split_batch(a[w.rank * per:(w.rank + 1) * per], self.replicas) for a in rows]
        # The gradient half: θ kept (the update half takes it next), this rank's rows per local replica.
        args = [[*self._theta_on(r)[:n], *(be.to_device(np.ascontiguousarray(p[r]), borrow=True, device=r)
                                           for p in mine)] for r in range(self.replicas)]
        failed, self._failed[:] = None, 0.0
        try:
            outs = self._run(self.exe, args, keep=range(n))[0]
        except DeviceMemoryError as e:  # flagged in the all-reduce every rank comes to; under sync BN the others
            if self.sync_bn:  # may wait in its host call's, mid-step: said here, the job ended as any fault's
                raise
            failed, self._failed[w.rank] = e, 1.0
        del args
        if failed is None:
            for view, buf in zip(self._grad_views, outs[:n_tr], strict=True):
                view[:] = be.to_host(buf).ravel()
            self._flat[self._grad_end] = be.to_host(outs[n_tr])
            for view, buf in zip(self._stat_views, outs[n_tr + 1:], strict=True):
                view[:] = be.to_host(buf).ravel() if w.is_root else 0.0  # rank 0's statistics, on every rank
        t = time.perf_counter()
        w.allreduce_sum(self._flat, "the gradient all-reduce")
        self.comm_s += time.perf_counter() - t
        if self._failed.any():
            raise memory_together(w, failed, np.flatnonzero(self._failed).tolist())
        self._flat[:self._grad_end + 1] /= np.float32(w.size)  # the mean, as replica_mean divides (float32)
        # The update half, on identical inputs on every rank and replica: identical θ' and state'. It takes
        # (and donates) the trained θ and the state; a frozen θ stays where it is held.
        held = [self._theta_on(r) for r in range(self.replicas)]
        args = [[*(h[i] for i in lay.trained), *h[n:], *(be.to_device(g, borrow=True, device=r) for g in self._grads),
                 be.to_device(sched, device=r)] for r, h in enumerate(held)]
        new = self._run(self.update_exe, args)
        del args
        if self.resident:
            self._replicas = [merge_carried(lay, h, o[:lay.n_carried]) for h, o in zip(held, new, strict=True)]
            self._carried = self._replicas[0]
        else:
            self._carried = merge_carried(lay, self._carried, [be.to_host(b) for b in new[0][:lay.n_carried]])
        self._batch_stats = [v.reshape(s.shape).copy() for v, (_, s) in zip(self._stat_views, lay.stats, strict=True)]
        return float(self._flat[self._grad_end])

