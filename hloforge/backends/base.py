"""The backend interface every backend plugin implements, and the argument check they share.

A backend plugin module (entry-point group ``hloforge.backends``) implements
``hloforge_backends()`` returning classes that satisfy :class:`Backend` (declared in
:mod:`hloforge.core.contracts`, re-exported here). Sessions
(:mod:`hloforge.train.session`) use nothing else, so a train step runs on any of them.

Buffers are opaque to callers: only the backend that made one can read or run it.
An executable exposes ``input_specs`` (the ``@main`` parameters, read from the text
by :func:`parse_main_signature`; None when the text has no recognizable ``@main``)
and ``donated_inputs`` (indices of inputs marked ``tf.aliasing_output``). A donated
input is consumed by :meth:`Backend.execute` unless its index is in ``keep``, on
every backend alike: XLA reuses its storage for the result; IREE compiles without the
ties (`hloforge.backends.iree.backend.strip_aliasing` says why) but marks it consumed all
the same, so a driver that reuses a donated input fails on either.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hloforge.backends.signature import ArgSpec, parse_main_signature  # one definition, shared
from hloforge.core.contracts import Backend  # the protocol lives with the other contracts; re-exported here
from hloforge.core.errors import BackendError, PluginError, setting_error
from hloforge.core.registry import default_registry
from hloforge.core.switches import env_path

__all__ = ["ArgSpec", "Backend", "BACKEND_ENV_VAR", "CACHE_ENV_VAR", "CROSS_REPLICA_OPS", "DEFAULT_BACKEND",
           "ForkedError", "InputSlot", "backend_fingerprint", "backend_name", "cache_root",
           "check_args", "cross_replica_op", "parse_main_signature"]

#: StableHLO ops whose result depends on the other replicas, or on which replica runs them
CROSS_REPLICA_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                     "collective_broadcast", "replica_id", "partition_id")
_CROSS_REPLICA = re.compile(r"stablehlo\.(" + "|".join(CROSS_REPLICA_OPS) + r")\b")


def cross_replica_op(mlir_text: str) -> str | None:
    """The first cross-replica op in the text (e.g. "stablehlo.all_reduce"), or None."""
    found = _CROSS_REPLICA.search(mlir_text)
    return None if found is None else found.group(0)


#: environment variable naming the backend when none is given (`--backend` wins over it)
BACKEND_ENV_VAR = "HLOFORGE_BACKEND"
DEFAULT_BACKEND = "xla"


def backend_name(name: str | None) -> str:
    """`name` where given, else $HLOFORGE_BACKEND, else xla. A variable naming no registered backend is refused
    naming the variable: the user gave no --backend for the registry's own refusal to be read as."""
    env = os.environ.get(BACKEND_ENV_VAR)
    if name or not env:
        return name or DEFAULT_BACKEND
    known = default_registry().names("backend")
    if env not in known:
        raise setting_error(PluginError, f"{BACKEND_ENV_VAR}={env!r}: no backend of that name is registered; "
                                         f"expected one of {known}, or the variable unset (xla)")
    return env


#: environment variable naming the root of hloforge's on-disk caches (executables, autotune decisions)
CACHE_ENV_VAR = "HLOFORGE_CACHE_DIR"


def cache_root() -> Path:
    """$HLOFORGE_CACHE_DIR (`~` expanded), else $XDG_CACHE_HOME/hloforge (where that is an absolute path, as the
    XDG spec has it: a cluster's scratch, not a small home), else ~/.cache/hloforge: each cache is a
    subdirectory of it. Where there is no home folder ($HOME unset, and a user id with no passwd entry: a
    container's), one line asking for $HLOFORGE_CACHE_DIR (was: Path.home()'s RuntimeError, an internal error)."""
    explicit = env_path(CACHE_ENV_VAR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "hloforge"
    home = os.path.expanduser("~")
    if home.startswith("~"):
        raise setting_error(BackendError, f"no home folder for hloforge's cache (~/.cache/hloforge): $HOME is unset "
                                          f"and user id {os.getuid()} has none; expected ${CACHE_ENV_VAR} (or "
                                          "$XDG_CACHE_HOME) naming a writable directory")
    return Path(home) / ".cache" / "hloforge"


class ForkedError(BackendError):
    """A device used in a forked child of the process that opened it (see forked_error)."""


def forked_error(runtime: str, pid: int) -> ForkedError:
    """The refusal of a call into `runtime` (XLA, IREE) in a fork of process `pid`, which had started it: a
    fork copies only the thread that called it, and the runtime's calls wait on threads it started."""
    return ForkedError(f"this process is a fork of process {pid}, which had started {runtime}, and {runtime}'s "
                       "threads stay in the process that started them (here its calls would wait forever); start "
                       "the process with multiprocessing's 'spawn' method (a Model pickles across), or fork before "
                       "the first Model is made")


class ProcessLock:
    """A threading.Lock held across a device call (one forward's chunks, one IREE execute) that a forked child finds
    free: a fork copies only its own thread, so a lock another thread of the parent held then stayed held for good,
    and the child's call waited on it forever before reaching the runtime's one-line refusal (forked_error)."""

    def __init__(self) -> None:
        self._pid, self._lock = os.getpid(), threading.Lock()

    def __enter__(self) -> bool:
        if os.getpid() != self._pid:  # a forked child: whoever held it is not in this process
            self._pid, self._lock = os.getpid(), threading.Lock()
        return self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def backend_fingerprint(backend: Any) -> str:
    """What a compiled program's speed depends on besides its text (compiler and plugin versions,
    flags): a backend's optional `fingerprint()`, else its `backend_name()`."""
    fingerprint = getattr(backend, "fingerprint", None)
    return str(fingerprint()) if callable(fingerprint) else str(backend.backend_name())


class InputSlot:
    """A per-call input the host rewrites in place: one device buffer of a fixed shape and dtype
    (a batch, its labels, the schedule vector) instead of a new buffer every call, where the
    device's memory is the host's (a CPU): `write` is one memcpy, no runtime call, no buffer to
    make or destroy (mnist-mlp's three step inputs on XLA: 50–80 µs less per step). A backend
    offers them through an optional `input_slot(shape, dtype)` (None where it cannot).

    `buffer` is the backend's buffer, `memory` a numpy array over its storage, `keepalive` what
    must live as long as that array (a mapping). Safe because an execute returns only when the
    computation is done: a write between executes never races one that reads the slot. Pass the
    buffer only as an input that is not donated (an execute that donates it consumes it; the next
    write says so)."""

    def __init__(self, buffer: Any, memory: np.ndarray, keepalive: object = None):
        self.buffer, self._memory, self._keepalive = buffer, memory, keepalive

    def write(self, array: np.ndarray) -> Any:
        """`array` copied into the slot (same shape and dtype); returns the slot's buffer."""
        self.buffer._live("write into it")  # a consumed buffer's memory is not ours to write
        if array.shape != self._memory.shape or array.dtype != self._memory.dtype:
            raise BackendError(f"this input slot holds a {self._memory.dtype} array of shape "
                               f"{list(self._memory.shape)}; got {array.dtype} {list(array.shape)}")
        np.copyto(self._memory, array, casting="no")
        return self.buffer


def check_args(specs: Sequence[ArgSpec] | None, args: Sequence[tuple[tuple[int, ...], np.dtype]],
               describe: Sequence[str]) -> None:
    """Refuse arguments whose count, shape or dtype differ from the compiled signature.

    `args` are (shape, dtype) per argument, `describe` a short text per argument for the message."""
    if specs is None:
        return
    if len(args) != len(specs):
        raise BackendError(f"the executable takes {len(specs)} arguments, got {len(args)}")
    for i, ((shape, dtype), spec) in enumerate(zip(args, specs, strict=True)):
        if spec.shape is None:
            continue
        shape_ok = len(spec.shape) == len(shape) and all(
            w is None or w == g for w, g in zip(spec.shape, shape, strict=True))
        if not shape_ok or (spec.dtype is not None and spec.dtype != dtype):
            raise BackendError(f"argument {i} is {describe[i]}, but the executable was compiled for "
                               f"{spec.describe()}")
