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
nothing). `HLOFORGE_HOST_MEMORY=release` keeps glibc's own policy. It must be chosen before the
XLA client starts: its threads take their arenas then (set later, XLA kept faulting 47 000 pages
per step). Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

from hloforge.core.errors import BackendError

ENV_VAR = "HLOFORGE_HOST_MEMORY"
POLICIES = ("retain", "release")
DEFAULT_POLICY = "retain"

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_lock = threading.Lock()
_applied: bool | None = None  # None until first asked; then whether glibc took the settings


def _glibc() -> bool:
    return platform.libc_ver()[0] == "glibc"


def host_memory_policy() -> str:
    """$HLOFORGE_HOST_MEMORY: "retain" (the default) or "release"; anything else is one error line."""
    text = os.environ.get(ENV_VAR, DEFAULT_POLICY).strip().lower()
    if text not in POLICIES:
        raise BackendError(f"{ENV_VAR}={text!r}: expected one of {', '.join(POLICIES)}")
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
                mallopt = ctypes.CDLL(None).mallopt
                mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
                _applied = all(mallopt(param, value) == 1 for param, value in
                               ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
        return _applied


def host_memory_description() -> str:
    """For a backend's fingerprint: the allocator policy its steps run under."""
    retained = _applied if _applied is not None else host_memory_policy() == "retain" and _glibc()
    return f"host memory {'retained' if retained else 'released'}"
