"""IREE's runtime in this process: its flags, set once before the first device; how much nicer its CPU
workers run; and one runtime config (instance + device) per driver."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hloforge.backends.base import forked_error
from hloforge.backends.host_memory import retain_freed_host_memory
from hloforge.core.errors import BackendError, BackendSettingError
from hloforge.core.switches import whole_number

RUNTIME_FLAGS_ENV_VAR = "HLOFORGE_IREE_RUNTIME_FLAGS"
# IREE runtime flags, set once per process before the first device. A task-system worker that spins
# 50 µs for the next dispatch before it sleeps: mnist-mlp's step 2.07–2.20 ms in every process, against
# 2.2–4.0 ms at IREE's default (which ran either way by process); mnist-cnn 85–87 vs 84–88 ms (no
# change). The a+1 dispatch was bimodal by process (16–18 µs or 50–75) until execute awaited the
# signal fence itself and the workers ran nicer (EXECUTION_FLAGS, DEFAULT_WORKER_NICE): 15.4–16.2 µs
# in 18 of 18 processes.
DEFAULT_RUNTIME_FLAGS = ("--task_worker_spin_us=50",)


WORKER_NICE_ENV_VAR = "HLOFORGE_IREE_WORKER_NICE"
# The threads the local-task device starts (its task-system workers) run one step nicer than the
# thread that calls execute. On two vCPUs both workers spin after a dispatch, and a caller woken on a
# CPU a worker held waited out the spin (a+1 dispatch 66–70 µs in 2 of 12 processes); a nicer worker
# yields to it at once (10.0–10.4 µs in 8 of 8). 0 leaves them as IREE starts them.
DEFAULT_WORKER_NICE = 1


def worker_nice() -> int:
    """How much nicer than the process the IREE CPU workers run: $HLOFORGE_IREE_WORKER_NICE (0–19)."""
    text = os.environ.get(WORKER_NICE_ENV_VAR, str(DEFAULT_WORKER_NICE)).strip()
    step = whole_number(text)
    if step is None or step > 19:
        raise BackendSettingError(f"{WORKER_NICE_ENV_VAR}={text!r}: expected a niceness step from 0 to 19")
    return step


def _thread_ids() -> set[int]:
    tasks = Path("/proc/self/task")
    return {int(t.name) for t in tasks.iterdir()} if tasks.is_dir() else set()


def _renice(tids: set[int], step: int) -> None:
    """Make these threads of this process `step` nicer (Linux; nothing where there is no /proc)."""
    for tid in tids if step else ():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + step))
        except OSError:  # a thread that already ended
            continue


def runtime_flags() -> tuple[str, ...]:
    """The runtime flags: $HLOFORGE_IREE_RUNTIME_FLAGS (space-separated; empty for IREE's own defaults)
    when set, else DEFAULT_RUNTIME_FLAGS."""
    env = os.environ.get(RUNTIME_FLAGS_ENV_VAR)
    return DEFAULT_RUNTIME_FLAGS if env is None else tuple(env.split())


# IREE's runtime reads these launcher variables when a device is created and then wants an MPI channel
# provider of its own (libmpi.so dlopened; "MPI runtime library not available" where it is not on the path).
# hloforge's ranks exchange gradients through mpi4py on the host, so each rank's device is a plain local one.
IREE_LAUNCHER_ENVS = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")


@contextlib.contextmanager
def _launcher_hidden() -> Iterator[None]:
    """The MPI launcher's variables out of the environment while IREE creates a device, then back."""
    saved = {k: os.environ.pop(k) for k in IREE_LAUNCHER_ENVS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class Runtime:
    """One runtime config (instance + device) per driver per process: devices own threads and memory."""

    _lock = threading.Lock()
    _configs: dict[str, Any] = {}
    _flags_set = False
    _opened_in: int | None = None  # the process that opened them
    _forked_from: int | None = None  # that process, in a fork of it: the devices' threads stayed there

    @classmethod
    def get(cls, runtime: Any, driver: str) -> Any:
        if cls._forked_from is not None:  # any call would wait forever on threads this process lacks
            raise forked_error("IREE", cls._forked_from)
        with cls._lock:
            if not cls._flags_set:  # before the first device: the task system reads them when it starts
                flags = runtime_flags()
                try:
                    if flags:
                        runtime.flags.parse_flags(*flags)
                except Exception as e:
                    raise BackendSettingError(f"IREE refused the runtime flags {' '.join(flags)} "
                                              f"(${RUNTIME_FLAGS_ENV_VAR}): {e}") from None
                cls._flags_set = True
            if driver not in cls._configs:
                retain_freed_host_memory()  # before the device starts the threads that allocate its buffers
                nice, before = worker_nice(), _thread_ids()
                try:
                    with _launcher_hidden():
                        cls._configs[driver] = runtime.Config(driver)
                except Exception as e:  # iree.runtime's own text says only "Exception for last tried follows"
                    why = f"{e}: {e.__cause__}" if e.__cause__ is not None else str(e)
                    raise BackendError(f"IREE could not open the {driver!r} driver: {why}") from None
                if driver == "local-task":  # the threads the device started: its task-system workers
                    _renice(_thread_ids() - before, nice)
                cls._opened_in = os.getpid()
            return cls._configs[driver]

    @classmethod
    def after_fork(cls) -> None:
        cls._forked_from = cls._opened_in
        if cls._configs:  # never freed here: freeing a device waits on its threads (the exit would never end)
            for config in cls._configs.values():
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(config))
            import iree.runtime

            iree.runtime._binding.disable_leak_checker()  # kept on purpose: nanobind's exit report, a page, is noise


os.register_at_fork(after_in_child=Runtime.after_fork)
