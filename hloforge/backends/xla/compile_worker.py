"""XLA's compile in a process of its own: a worker without the kept heap's one malloc arena.

Under the kept heap (:mod:`hloforge.backends.host_memory`) every thread of this process allocates from
one arena, and XLA's compile threads wait on its lock: resnet18-cifar's train step compiled here in
4.5–4.9 s, in a process with glibc's own arenas in 3.0–3.1 (benchmarks/NOTES.md). So a CPU client
under the kept heap hands its compiles to a worker (`python -c`, this module's :func:`serve`, on the
same plugin and device count): it compiles, serializes the executable and sends it back, and the
client loads it (0.03–0.27 s on the suite's steps; the cache stores the same bytes). The worker
starts at the first compile of a module large enough to pay for its start (~0.25 s), serves the next
ones, and exits once idle for IDLE_EXIT_S or when this process goes, mid-compile too (`_exit_with_parent`).

A module the worker does not take is compiled here, as it was: one with a custom call (a host call is
a function of this process), a client on another platform than the CPU, a heap not kept, or while
$XLA_FLAGS dumps XLA's modules. So is every module the worker did not hand back (it did not start,
died, or the module did not compile): what fails here is the error it always was.
$HLOFORGE_XLA_COMPILE_WORKER=0 compiles every module here.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

from hloforge.backends.host_memory import ENV_VAR as HOST_MEMORY_ENV_VAR
from hloforge.backends.host_memory import heap_kept, trim_heap
from hloforge.backends.python_child import python_child_argv, runs_python
from hloforge.core.errors import BackendError
from hloforge.core.switches import env_switch

ENV_VAR = "HLOFORGE_XLA_COMPILE_WORKER"
# How long an idle worker waits for another compile before it exits: a run compiles its programs
# within a second of each other (`hloforge train`: the step, then the eval), and an idle worker holds
# ~65 MB of its own besides the plugin's pages.
IDLE_EXIT_S = 5.0
# How often a worker looks whether this process is still its parent: a parent killed mid-compile (kill -9,
# the out-of-memory killer) leaves the worker at most this long, not the rest of a compile (seconds).
PARENT_CHECK_S = 0.1
# A module shorter than this is compiled here unless a worker is running: starting one (~0.25 s) costs
# more than the arena's lock does a short compile (mnist-mlp's step, 18k characters: setup 0.52 s
# through a new worker, 0.42 here; mnist-cnn's, 56k: 1.08 against 1.31).
COLD_START_MIN_CHARS = 32_000
_LENGTH = struct.Struct("<Q")
_OK, _FAILED = b"ok", b"failed"


def worker_enabled() -> bool:
    """$HLOFORGE_XLA_COMPILE_WORKER, an on/off switch (on by default)."""
    return env_switch(ENV_VAR, default=True, on="compile XLA executables in a worker process under the kept heap",
                      off="compile in this process", error=BackendError)


def takes(platform_name: str, mlir_text: str) -> bool:
    """Whether a module is compiled in a worker: a CPU client's module with no custom call, while the
    heap is kept, XLA is not dumping (a dump is one process's modules, numbered by it), this process
    runs a Python interpreter and the switch is on."""
    return (platform_name == "cpu" and heap_kept() and "custom_call" not in mlir_text
            and "xla_dump_to" not in os.environ.get("XLA_FLAGS", "") and runs_python() and worker_enabled())


def _frame(*parts: bytes) -> bytes:
    return b"".join(_LENGTH.pack(len(p)) + p for p in parts)


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    """`size` bytes, or None at the end of the stream (a pipe's raw read may return fewer at a time)."""
    parts, left = [], size
    while left:
        part = stream.read(left)
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _read_part(stream: IO[bytes]) -> bytes | None:
    head = _read_exact(stream, _LENGTH.size)
    return None if head is None else _read_exact(stream, _LENGTH.unpack(head)[0])


class CompileWorker:
    """One worker process for one client (its plugin file and device count); one compile at a time."""

    def __init__(self, plugin_path: str, device_count: int):
        self.plugin_path, self.device_count = plugin_path, device_count
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None  # the worker's stderr, relayed after each compile
        self._log_read = 0
        self._lock = threading.Lock()

    def compile(self, mlir_text: str, options: bytes, num_replicas: int) -> bytes | None:
        """The serialized executable the worker compiled, or None where it did not (the caller
        compiles here). A worker gone idle is started again once, for a module of COLD_START_MIN_CHARS
        or more."""
        proc = self._proc  # read once: another thread's compile may stop it meanwhile
        running = proc is not None and proc.poll() is None
        if not running and len(mlir_text) < COLD_START_MIN_CHARS:
            return None
        if not self._lock.acquire(blocking=False):  # another thread's compile holds it: compile there
            return None
        try:
            for _ in range(2):
                fresh = self._proc is None
                if fresh and not self._start():
                    return None
                try:
                    return self._ask(mlir_text, options, num_replicas)
                except _Gone:
                    self._stop()
                    if fresh:
                        return None
            return None
        except BaseException:  # an interrupt mid-compile: the worker's answer would be stale
            self._stop()
            raise
        finally:
            self._lock.release()

    def _start(self) -> bool:
        env = dict(os.environ, **{HOST_MEMORY_ENV_VAR: "release"})
        self._log = tempfile.TemporaryFile()
        self._log_read = 0
        code = ("from hloforge.backends.xla.compile_worker import serve; "
                "sys.exit(serve(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])))")
        try:
            # a session of its own, so a terminal's Ctrl-C reaches this process alone (which stops the worker)
            self._proc = subprocess.Popen(
                python_child_argv(code, self.plugin_path, str(self.device_count), str(IDLE_EXIT_S), str(os.getpid())),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env, start_new_session=True)
        except OSError:
            self._stop()
            return False
        # reaped as it exits (once idle, or killed): else it stays a zombie until the next compile or this
        # process's exit; a thread of its own, not a SIGCHLD handler, which would change the user's process
        threading.Thread(target=self._proc.wait, name="hloforge-compile-worker-reap", daemon=True).start()
        return True

    def _ask(self, mlir_text: str, options: bytes, num_replicas: int) -> bytes | None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(_frame(str(num_replicas).encode(), mlir_text.encode(), options))
            proc.stdin.flush()
        except OSError as e:  # a broken pipe: it exited idle, or died
            raise _Gone from e
        status, payload = _read_part(proc.stdout), _read_part(proc.stdout)
        if status is None or payload is None:
            raise _Gone
        if status != _OK:
            return None
        self._relay_log()
        return payload

    def _relay_log(self) -> None:
        """What the worker wrote to stderr since the last compile, onto this process's stderr (what the
        compile would have logged here)."""
        if self._log is None:
            return
        text = os.pread(self._log.fileno(), 1 << 20, self._log_read)
        self._log_read += len(text)
        if text and sys.stderr is not None:
            sys.stderr.write(text.decode(errors="replace"))
            sys.stderr.flush()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):  # a request the worker never read: nobody to flush to
                        pipe.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        """Stop the worker (it would exit on its own once idle)."""
        with self._lock:
            self._stop()


class _Gone(Exception):
    """The worker is not there to answer (it exited idle, or died)."""


_WORKERS: dict[tuple[str, int], CompileWorker] = {}
_WORKERS_LOCK = threading.Lock()
_WORKERS_PID = os.getpid()


def worker_for(plugin_path: str, device_count: int) -> CompileWorker:
    """This process's worker for clients on this plugin with this many devices. A forked child starts
    workers of its own (its parent's pipes are its parent's)."""
    global _WORKERS_PID
    with _WORKERS_LOCK:
        if _WORKERS_PID != os.getpid():
            _WORKERS.clear()
            _WORKERS_PID = os.getpid()
        key = (os.path.realpath(plugin_path), device_count)
        worker = _WORKERS.get(key)
        if worker is None:
            worker = _WORKERS[key] = CompileWorker(plugin_path, device_count)
        return worker


def worker_pids() -> list[int]:
    """The process ids of this process's live workers (`hloforge bench` reads their peak memory: its
    peak column is the measuring process's own)."""
    if _WORKERS_PID != os.getpid():
        return []
    return [proc.pid for proc in (w._proc for w in list(_WORKERS.values())) if proc is not None and proc.poll() is None]


@atexit.register
def _stop_workers() -> None:
    if _WORKERS_PID == os.getpid():
        for worker in _WORKERS.values():
            worker._stop()  # not close(): a thread still compiling at exit holds the lock


def _exit_with_parent(parent: int) -> None:
    """End this worker within PARENT_CHECK_S of `parent` (the process that started it) going, a compile
    under way or not: once it is gone this process's parent is another (init, a subreaper). A thread
    watching getppid rather than PR_SET_PDEATHSIG, whose "parent" is the thread that started the worker:
    a compile asked from a thread that then ends (a user's) would take the worker down with it."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)  # nobody to answer: not the compile's end, nor an interpreter's orderly exit

    threading.Thread(target=watch, name="hloforge-parent-watch", daemon=True).start()


def serve(plugin_path: str, device_count: int, idle_exit_s: float, parent: int) -> int:
    """The worker's loop: compile each module asked for until stdin closes, `idle_exit_s` pass idle or
    `parent` goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent)  # a parent gone before it started included: its parent is another at once
    from hloforge.backends.xla.pjrt import Client

    requests, answers = io.FileIO(sys.stdin.fileno(), "rb", closefd=False), sys.stdout.buffer
    try:
        client = Client(plugin_path, {"cpu_device_count": device_count})
    except BackendError:
        return 1
    while select.select([requests], [], [], idle_exit_s)[0]:
        replicas, text, options = (_read_part(requests) for _ in range(3))
        if replicas is None or text is None or options is None:
            return 0
        try:
            exe = client.compile_with_options(text.decode(), options, int(replicas), None)
            try:
                answer = _frame(_OK, exe.serialize())
            finally:
                exe.close()
                trim_heap()  # idle, the worker holds what it needs for the next compile, not this one's heap
        except BackendError as e:
            answer = _frame(_FAILED, str(e).encode())
        try:
            answers.write(answer)
            answers.flush()
        except BrokenPipeError:
            return 0
    return 0
