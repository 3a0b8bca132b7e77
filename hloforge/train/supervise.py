"""A rank of an MPI run under hydra, run as a worker under a small parent (`supervise`).

Under hydra (`PMI_FD`) the `hloforge` command runs each rank as a worker under a small parent
(`supervise`), for a worker that a signal kills: it names it in one line (the one process sure to
outlive it, and to print before anyone is killed), then dies by SIGKILL itself, the end hydra's proxy
answers by SIGKILLing every process it started whichever event reaches it first (a parent exiting with
the worker's status as a code was the end it missed, 2 killed-rank drills in 36).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from hloforge.core.launcher import launched

WORKER_ENV = "HLOFORGE_MPI_WORKER"  # set in a rank's worker (supervise); "0" beforehand: no parent, run as started
# A worker still there this long after a Ctrl-C is stopped by its parent: Python's handler runs only between
# bytecodes, never inside MPI_Init waiting for a rank that the Ctrl-C already ended (a job hung for good), nor
# inside one long compile. The ranks meet for 2 s after one (mpi.INTERRUPT_GRACE_S), then MPI ends in order.
INTERRUPTED_WAIT_S = 10.0


def supervise(argv: Sequence[str]) -> None:
    """Under hydra, run this command again as a child (the worker) and wait for it; returns at once in
    the worker, alone, or where `WORKER_ENV` is set. The parent keeps its copy of the PMI connection (it
    closes when the parent exits, just after the worker: hydra then sees one process end, as without the
    parent), takes hydra's signals with the worker (one process group: SIGUSR1 and SIGINT reach both, so
    it only notes them) and passes a SIGTERM on. A worker that exits gives the parent its exit status;
    one that a signal ended takes the job down, the parent dying by SIGKILL (module doc), after one line
    naming the signal where nobody sent it to the job: the survivors leave it to this line (`World.lost`)."""
    if os.environ.get(WORKER_ENV) == "1":
        _die_with_parent()
    if "PMI_FD" not in os.environ or WORKER_ENV in os.environ or launched()[1] == 1 or not hasattr(os, "fork"):
        return
    import subprocess

    sent: list[int] = []  # signals from the launcher or the user: the worker's end is theirs, not news
    overdue: list[bool] = []  # the worker outlived a Ctrl-C by INTERRUPTED_WAIT_S: stopped here

    def stop_overdue() -> None:
        overdue.append(True)
        child.kill()

    def noted(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and signal.SIGINT not in sent:  # the worker's own handler may never run
            timer = threading.Timer(INTERRUPTED_WAIT_S, stop_overdue)
            timer.daemon = True
            timer.start()
        sent.append(signum)

    signal.signal(signal.SIGUSR1, noted)
    signal.signal(signal.SIGINT, noted)
    fd = int(os.environ["PMI_FD"])
    # A Ctrl-C that came before the worker existed, or between its fork and exec, was lost to it, and it trained on
    # while the ranks it was meant to stop with left (a job hung): the worker starts with SIGINT blocked, so one sent
    # from its fork on waits for it, one noted here before is passed on, and it takes them with its handler in place
    # (take_interrupts; pending signals coalesce, so it sees one)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    child = subprocess.Popen([sys.executable, *argv], env={**os.environ, WORKER_ENV: "1"},
                             pass_fds=(fd,))  # exec resets the handled signals in the worker
    if signal.SIGINT in sent or signal.SIGINT in signal.sigpending():
        child.send_signal(signal.SIGINT)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def passed_on(signum: int, frame: Any) -> None:
        sent.append(signum)
        child.send_signal(signum)
        child.send_signal(signal.SIGCONT)  # a stopped (hung) worker acts on it too

    signal.signal(signal.SIGTERM, passed_on)
    code = child.wait()
    if overdue:  # stopped for the Ctrl-C it could not act on: the job's line is rank 0's, as the worker's would be
        if launched()[0] == 0:
            sys.stderr.write("hloforge: interrupted\n")
            sys.stderr.flush()
        os._exit(130)
    if code < 0 and not sent:
        rank, size, _ = launched()
        sys.stderr.write(f"hloforge: error: {_died(rank, size, -code)}; the other ranks stopped\n")
        sys.stderr.flush()
    if code < 0:
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(code)


def take_interrupts() -> None:
    """In a supervised worker: take the Ctrl-C its parent held back while starting it (supervise), where the
    command's handler says it."""
    if os.environ.get(WORKER_ENV) == "1":
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _die_with_parent() -> None:
    """In a supervised worker, on Linux: be SIGKILLed when the parent dies. Hydra's cleanup kills the
    process it started, the parent; a worker left behind (hung, or stopped) would keep the job's output
    pipes open and mpiexec waiting on them."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no such call
        pass


def _died(rank: int, size: int, signum: int) -> str:
    """How a rank killed by `signum` is named (SIGKILL is also the kernel's out-of-memory killer's)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    oom = ", also what the out-of-memory killer sends" if signum == signal.SIGKILL else ""
    return f"rank {rank} of {size} died, killed by {name} ({signum}{oom})"
