"""Keeping freed host memory in the process, so a step's buffers do not come back from the kernel
zeroed page by page every step.

Both runtimes allocate a step's scratch (XLA's temp buffer, IREE's transients) and its outputs with
malloc from their worker threads and free them when the step ends. glibc hands a block that large
back to the kernel at once (mmap/munmap; a worker thread's arena cannot hold it at all), so every
step faults all of it in again: mobilenetv2-mini's 236 MB temp buffer on XLA was 58 000 page
faults per step, a third of the process's CPU time in the kernel. Before either runtime starts its
threads, :func:`retain_freed_host_memory` tells glibc to serve every thread from the main heap and
keep what is freed there (the policy jemalloc and tcmalloc follow by default): the next step
reuses the same pages. Whole steps on XLA, ms (same machine, alternating processes): mobilenetv2-mini
160–178 → 111–112, resnet18-cifar 446 → 395–397, mnist-cnn 69 → 55, vit-cifar 153 → 124,
mnist-mlp 1.6 either way; IREE mobilenetv2-mini 194 → 145.

The costs: the process keeps its peak heap until it exits; and a step too small to need it pays
for the one arena its threads then share: mnist-mlp on XLA 1.80–1.83 vs 1.66 ms (alternating
processes; each setting alone: the one arena is the whole of it, no mmap and no trimming cost
nothing). So would an XLA compile: its two threads wait on that arena's lock, resnet18-cifar's step
compiling in 4.5–4.9 s against 3.0–3.1 (benchmarks/NOTES.md). The one arena cannot be lifted for a
compile alone (glibc fixes the arena limit when a thread first takes an arena, and a thread keeps its
arena), so XLA compiles in a process of its own (backends/xla/compile_worker.py).
A Model's fit, predict and evaluate keep the heap only while they run (:func:`kept_while`): in a process
that goes on after them (a notebook), glibc's own trimming and mmap come back two seconds after the last
returns, and the kept heap is given back, so an array the user frees later leaves the process's memory
(a 2 GiB one freed after a fit stayed resident); the next call keeps the heap again before its first step.
`HLOFORGE_HOST_MEMORY=release` keeps glibc's own policy. It must be chosen before the
XLA client starts: its threads take their arenas then (set later, XLA kept faulting 47 000 pages
per step). Elsewhere than glibc this does nothing.

A kept heap has one race to close. XLA's CPU client allocates an execution's temp buffer (on the
calling thread, at times on its worker) and frees it on its worker thread just after the outputs
are ready; a step that starts before that free lands allocates a second temp buffer beside the
first, and the kept heap holds both from then on (vit-cifar's peak RSS 490 MB in a run without the
race, 812–1137 MB with it). So an executable knows its scratch (the temp size XLA reports for it,
or, where the plugin does not say, what the heap grows by beyond the outputs it allocates when
launched: :func:`scratch_grown`), and each execute, once its outputs are ready, waits briefly for
that scratch to be back (:func:`wait_for_scratch`) before it returns.

And one hole to fill. At times the client makes a small allocation of its own just above a live
temp buffer; the freed temp is then a hole below it that the next temp, allocated aligned, cannot
fit, and the heap would grow by one temp buffer (resnet18-cifar's peak 624 MB, or ~930 when that
happened). After each execute :func:`hold_stranded_scratch` takes such a hole over with a block it
never touches and gives the hole's pages back to the kernel (benchmarks/NOTES.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hloforge.core.errors import BackendSettingError

ENV_VAR = "HLOFORGE_HOST_MEMORY"
POLICIES = ("retain", "release")
DEFAULT_POLICY = "retain"

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_KEEP = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))  # what kept_while sets again (the arena limit stays)
_GLIBC_OWN = ((_M_MMAP_MAX, 65536), (_M_TRIM_THRESHOLD, 128 * 1024))  # glibc's defaults (malloc.c)

_lock = threading.Lock()
_applied: bool | None = None  # None until first asked; then whether glibc took the settings
_released = False  # the kept heap given back between a Model's calls (kept_while); the one arena stays
_calls = 0  # the kept_while windows open (a callback's evaluate inside a fit, another thread's predict)
_held_holes: list[int] = []  # the blocks hold_stranded_scratch took over (their addresses)
_held_hole_bytes = 0


def _glibc() -> bool:
    return platform.libc_ver()[0] == "glibc"


def host_memory_policy() -> str:
    """$HLOFORGE_HOST_MEMORY: "retain" (the default) or "release"; anything else is one error line."""
    text = os.environ.get(ENV_VAR, DEFAULT_POLICY).strip().lower()
    if text not in POLICIES:
        raise BackendSettingError(f"{ENV_VAR}={text!r}: expected one of {', '.join(POLICIES)}")
    return text


def retain_freed_host_memory() -> bool:
    """Under the "retain" policy, set glibc's malloc (once per process) to one arena for all
    threads, no mmap for large blocks and no trimming of the heap's top. Call it before a runtime
    starts its threads: a thread keeps the arena it first allocated from. True when in effect."""
    global _applied
    if host_memory_policy() == "release":
        return False
    with _lock:
        if _applied is None:
            _applied = False
            if _glibc():
                _applied = _mallopt(((_M_ARENA_MAX, 1), *_KEEP))
        return _applied


def _mallopt(settings: tuple[tuple[int, int], ...]) -> bool:
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in settings)


@contextlib.contextmanager
def kept_while() -> Iterator[None]:
    """Around a Model's fit, predict or evaluate: the heap kept (as retain_freed_host_memory keeps it) while it
    runs, then, RELEASE_AFTER_S after the last such call returned, glibc's own trimming and mmap again and the
    kept heap trimmed, so that the user's memory freed between calls goes back to the kernel. The steps run as
    they did: the settings are back before the first one (a kept heap's first step faults its pages in, as a
    process's first)."""
    global _released, _calls, _release_at
    with _lock:
        _release_at = None
        if _released:
            _mallopt(_KEEP)
            _released = False
        _calls += 1
    try:
        yield
    finally:
        with _lock:
            _calls -= 1
            if _calls == 0 and _applied:
                _release_at = time.monotonic() + RELEASE_AFTER_S
                _start_releaser()


# How long the heap stays kept once a Model's last call returned: a loop of small predicts (each would
# fault its scratch in afresh: mnist-cnn's on 64 rows, 8 000 pages, 30 → 46-50 ms of CPU a call) or
# the next fit finds it still kept.
RELEASE_AFTER_S = 2.0
_release_at: float | None = None  # when the heap is given back, unless a call starts first
_release_due = threading.Condition(_lock)
_releaser: threading.Thread | None = None


def _start_releaser() -> None:
    """(under _lock) the thread that gives the kept heap back when due, unless one is waiting already."""
    global _releaser
    if _releaser is None:
        _releaser = threading.Thread(target=_release_when_due, name="hloforge-heap-release", daemon=True)
        _releaser.start()


def _release_when_due() -> None:
    """Waits until the heap is due back, gives it back, and ends: no thread stays in the user's process (a call
    that starts meanwhile cancels the release, and this thread ends at its wake-up)."""
    global _released, _release_at, _releaser
    with _lock:
        while _release_at is not None:
            if (left := _release_at - time.monotonic()) > 0:
                _release_due.wait(left)
                continue
            _release_at = None
            if _calls == 0 and not _released:
                _released = _mallopt(_GLIBC_OWN)
                trim_heap()
        _releaser = None


def _new_locks_in_child() -> None:
    """A child forked while the releaser held _lock would find it held for good (its first fit hung)."""
    global _lock, _release_due, _releaser, _release_at
    _lock = threading.Lock()
    _release_due = threading.Condition(_lock)
    _releaser, _release_at = None, None


os.register_at_fork(after_in_child=_new_locks_in_child)


def host_memory_description() -> str:
    """For a backend's fingerprint: the allocator policy its steps run under."""
    retained = _applied if _applied is not None else host_memory_policy() == "retain" and _glibc()
    return f"host memory {'retained' if retained else 'released'}"


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None (another C library)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Hand the heap XLA's compiler freed back to the OS. glibc keeps it (resnet18-cifar's step: ~165 MB
    of a 255 MB compile peak), and the first steps' buffers then came on top of it."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class _Mallinfo2(ctypes.Structure):  # glibc's struct mallinfo2 (glibc 2.33+)
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _mallinfo2_function() -> Callable[[], _Mallinfo2] | None:
    fn = getattr(ctypes.CDLL(None), "mallinfo2", None) if _glibc() else None
    if fn is not None:
        fn.restype, fn.argtypes = _Mallinfo2, ()
    return fn


def mallinfo2() -> _Mallinfo2 | None:
    """glibc's heap statistics (its cost grows with the free blocks: ~1–40 µs on the suite's steps),
    or None elsewhere than glibc 2.33+."""
    fn = _mallinfo2_function()
    return None if fn is None else fn()


# An execute whose scratch (the heap it grew by beyond its outputs) is at least this large waits for
# it to be freed; a smaller one is not worth the heap readings.
SCRATCH_MIN_BYTES = 64 << 20
# The longest an execute waits: the free lands within ~2 ms of the outputs (a 2 ms pause after each
# step removed the race in 5 runs of 5, 0.2 ms did not), and a heap that does not shrink (another
# thread allocating meanwhile) must not stall the steps.
SCRATCH_WAIT_S = 0.02


def _kept_heap_reading() -> _Mallinfo2 | None:
    return mallinfo2() if _applied and not _released else None


def _in_use(info: _Mallinfo2) -> int:
    return int(info.uordblks) - _held_hole_bytes


def heap_kept() -> bool:
    """Whether this process's heap is kept (:func:`retain_freed_host_memory` took effect; its one arena stays
    while kept_while gives the heap back between a Model's calls)."""
    return bool(_applied)


def heap_in_use() -> int | None:
    """Bytes the kept heap has handed out and not had back, less the holes it holds (see
    `hold_stranded_scratch`), or None when heap memory is not kept (the "release" policy, or not
    glibc)."""
    info = _kept_heap_reading()
    return None if info is None else _in_use(info)


def scratch_grown(before: int | None, output_bytes: int) -> int:
    """Right after an execute was launched, with `before` the heap in use just before the launch and
    `output_bytes` what its outputs allocate (an output that takes over a donated input allocates
    nothing): how far the heap grew beyond them, its scratch (0
    when the runtime has not allocated it yet: XLA's CPU client allocates it on the launching thread
    or, at times, on its worker)."""
    after = heap_in_use() if before is not None else None
    return 0 if after is None or before is None else max(after - before - output_bytes, 0)


def wait_for_scratch(before: int | None, output_bytes: int, scratch: int) -> _Mallinfo2 | None:
    """Once an execute's outputs are ready, for an executable whose scratch is `scratch` bytes: wait
    up to SCRATCH_WAIT_S for the heap in use to fall back below `before` + `output_bytes` + half the
    scratch, so that nothing the host allocates next lands beside a scratch about to be freed, and
    the next scratch finds its place free. Returns the last heap reading (for
    `hold_stranded_scratch`), or None when it read none."""
    if before is None or scratch < SCRATCH_MIN_BYTES:
        return None
    freed_below = before + output_bytes + scratch // 2
    deadline = time.perf_counter() + SCRATCH_WAIT_S
    while (info := _kept_heap_reading()) is not None and _in_use(info) > freed_below \
            and time.perf_counter() < deadline:
        time.sleep(0.0001)
    return info


# How much less than a stranded scratch the block that takes its place asks for, so that it fits the
# hole (a scratch reading includes what else the launch allocated), and how much a process holds at most
# in such blocks: address space, none of it memory (a long run strands a hole every few dozen epochs,
# each held one grows the heap's address space by a scratch; past this, each grows its memory by one).
HOLE_SLACK_BYTES = 1 << 20
MAX_HELD_BYTES = 8 << 30
_MADV_DONTNEED = 4


@functools.cache
def _libc_calls() -> tuple[Callable[..., int], Callable[..., None], Callable[..., int]]:
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.restype, libc.free.argtypes = None, (ctypes.c_void_p,)
    libc.madvise.restype, libc.madvise.argtypes = ctypes.c_int, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.malloc, libc.free, libc.madvise


def hold_stranded_scratch(scratch: int, reading: _Mallinfo2 | None = None) -> bool:
    """After an execute whose `scratch` bytes are back in the kept heap: when that scratch came
    back below a block allocated above it while it was live (the heap's top is too small for the
    next scratch, and at least a scratch is free below it), the next scratch cannot reuse that
    hole (XLA allocates it aligned, which asks for a little more than the hole), so the heap would
    keep two. Take the hole over with a block that is never touched and give its pages back to the
    kernel: the heap then keeps one scratch in memory. `reading`: a heap reading taken since the
    scratch came back (`wait_for_scratch`'s), spared reading it again. True when a hole was taken."""
    global _held_hole_bytes
    if scratch < SCRATCH_MIN_BYTES or _held_hole_bytes + scratch > MAX_HELD_BYTES or not _applied or _released:
        return False
    info = reading if reading is not None else mallinfo2()
    if info is None:
        return False
    top, free_below = int(info.keepcost), int(info.fordblks - info.keepcost)
    if top >= scratch or free_below < scratch:
        return False
    malloc, free, madvise = _libc_calls()
    size = scratch - HOLE_SLACK_BYTES
    with _lock:
        block = malloc(size)
        if not block:
            return False
        after = mallinfo2()
        if after is None or after.arena > info.arena or after.keepcost + size // 2 < top:  # from the top
            free(block)
            return False
        page = mmap.PAGESIZE
        start = -(-block // page) * page
        madvise(start, (block + size - start) // page * page, _MADV_DONTNEED)
        _held_holes.append(block)
        _held_hole_bytes += size
    return True
