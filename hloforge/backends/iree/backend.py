"""The `iree` backend plugin: StableHLO text through `iree.compiler`, run with `iree.runtime`.

Compiled artifacts (.vmfb) are cached on disk, keyed by a sha256 of the module text,
the target, the flags, the compiler version and, for llvm-cpu (which compiles for this host's
CPU), the host CPU (see :func:`cache_key`), written and pruned as
:mod:`hloforge.backends.disk_cache` says (atomically: two processes can share one cache and a
reader never sees a half-written artifact). A cache that cannot be written (read-only, full) is
said once; the artifact is then loaded from memory and the run goes on. An artifact carries its key
(KEY_REFLECTION): an entry that is another key's, or does not load, is compiled again, with one
warning, and replaced.

@main keeps its intermediate buffers in one storage buffer per executable, made once and passed to every
call (:mod:`hloforge.backends.iree.transients` says why: IREE's own pool grew the process every step).

This module imports without IREE installed (the registry loads every backend's entry
point); the packages are imported when an :class:`IreeBackend` is made.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hloforge.backends.base import (
    CACHE_ENV_VAR,
    CROSS_REPLICA_OPS,
    ArgSpec,
    InputSlot,
    ProcessLock,
    cache_root,
    check_args,
    parse_main_signature,
)
from hloforge.backends.disk_cache import first_unwritable, host_cpu, prune, sha256_key, touch, write_atomic
from hloforge.backends.host_memory import host_memory_description
from hloforge.backends.iree.runtime import Runtime, runtime_flags, worker_nice
from hloforge.backends.iree.transients import SIZE_KEY, TAKES_STORAGE_KEY, with_reflection, with_transient_storage
from hloforge.core.errors import BackendError, BackendSettingError, DeviceMemoryError, HloforgeWarning, SettingError
from hloforge.core.hookspecs import hookimpl

TARGET_ENV_VAR = "HLOFORGE_IREE_TARGET"
GPU_ARCH_ENV_VAR = "HLOFORGE_IREE_GPU_ARCH"
PIP_HINT = "pip install iree-base-compiler iree-base-runtime  (or: pip install 'hloforge[iree]')"

# target -> (runtime driver, flag naming the GPU architecture, its default)
TARGETS: dict[str, tuple[str, str | None, str | None]] = {
    "llvm-cpu": ("local-task", None, None),
    "cuda": ("cuda", "--iree-cuda-target", "sm_80"),
    "rocm": ("hip", "--iree-rocm-target", "gfx942"),
}
# what a GPU target's architecture is written as, said when iree-compile knows no architecture of the name given
ARCH_FORMS = {
    "cuda": "an NVIDIA compute capability as sm_<major><minor> (sm_80 for an A100, sm_90 for an H100) or a name "
            "iree-compile knows (ampere, a100, rtx4090)",
    "rocm": "an AMD ISA as gfx<id> (gfx942 for an MI300X, gfx90a for an MI250) or a name iree-compile knows "
            "(mi300x, cdna3)",
}
# iree-compile's words for an architecture it does not know: a misspelt name, or sm_<N> of no such N
_UNKNOWN_ARCH = re.compile(r"Unknown (CUDA|ROCM) target '|missing GPU target in #hal\.executable\.target")

# The CPU flags that help. `--iree-opt-data-tiling` is accepted by iree-compile 3.13 but
# breaks our train steps: the fused dW dot_general (contracting [0] x [0]) then fails with
# "exceeded stack allocation limit" / "large vector sizes" — so it is left out by default
# (pass it through `extra_flags` to try it on a module). Rechecked with the NHWC lowering
# strategies (core/strategy.py): a conv's shifted-dot ∂w alone runs ~2× faster with it, but
# mnist-cnn's step still fails on its dense ∂w, and resnet-mini's step (which compiles) is no
# faster within this shared machine's noise — so it stays off.
CPU_FLAGS = ("--iree-llvmcpu-target-cpu=host", "--iree-llvmcpu-enable-ukernels=all")
# Every target: @main takes a wait fence and a signal fence, and `execute` waits on the signal fence
# itself. The synchronous ABI awaits inside the VM, through IREE's proactor thread, one more thread to
# wake per call: a+1 on a bare invocation 50–70 µs in most processes with it, 10.2–10.8 µs in 10 of
# 12 awaited here (the rest: DEFAULT_WORKER_NICE).
EXECUTION_FLAGS = ("--iree-execution-model=async-external",)
ABI_MODEL = "coarse-fences"  # what that flag makes of @main (its reflection says so)


def _import_iree() -> tuple[Any, Any]:
    try:
        import iree.compiler as compiler
        import iree.runtime as runtime
    except ImportError as e:
        raise BackendError(f"the iree backend needs the IREE Python packages ({e}); install them with "
                           f"`{PIP_HINT}`") from None
    return compiler, runtime


def compiler_version() -> str:
    """The full compiler version and revision (part of every cache key)."""
    from iree.compiler import version

    return f"{version.VERSION} {json.dumps(version.REVISIONS, sort_keys=True)}"


def _dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def default_cache_dir() -> Path:
    return cache_root() / "iree"


# @main's reflection in an artifact: the cache key it was compiled under (its file's name), so an entry that
# is another key's (swapped, copied over) is compiled again, not run as this module: a .vmfb is mmapped as it
# is, so it holds no header of ours as XLA's entries do.
KEY_REFLECTION = "hloforge.cache_key"


def cache_key(mlir_text: str, target: str, flags: Sequence[str], version: str, host: str = "") -> str:
    """`host`: the CPU the code is compiled for where it is this machine's (llvm-cpu), so a cache shared
    with another machine never hands this one instructions its CPU lacks."""
    return sha256_key({"mlir": mlir_text, "target": target, "flags": list(flags), "compiler": version,
                       "host": host, "entry": KEY_REFLECTION})  # entries from before the key are misses


# What IREE's VmModule.mmap raises for a file this process may read but not write.
_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class IreeCacheWarning(HloforgeWarning):
    """The artifact cache could not be written (the run goes on, the artifact loaded from memory)."""


def _compiler_message(err: Exception) -> str:
    """The diagnostics of a CompilerToolError, trimmed (IREE repeats @main's whole signature per note)."""
    text = str(err)
    m = re.search(r"Diagnostics:\n(.*?)\n\s*\nInvoked with:", text, re.S)
    diag = (m.group(1) if m else text).strip().splitlines()
    lines = [ln if len(ln) <= 240 else ln[:240] + " …" for ln in diag[:24]]
    if len(diag) > 24:
        lines.append(f"… ({len(diag) - 24} more lines)")
    return "\n".join(lines)


def _runtime_failure(e: Exception, doing: str, needed: int | None = None) -> BackendError:
    """IREE's runtime error `e` while `doing`: an allocation it refused (RESOURCE_EXHAUSTED) is a
    DeviceMemoryError of `needed` bytes, as XLA's is, so the sessions say it with their batch."""
    message = f"IREE failed {doing}: {e}"
    return DeviceMemoryError(message, needed) if "RESOURCE_EXHAUSTED" in str(e) else BackendError(message)


def _module_head(mlir_text: str, n: int = 6) -> str:
    lines = mlir_text.splitlines()
    head = [ln if len(ln) <= 240 else ln[:240] + " …" for ln in lines[:n]]
    return "\n".join(head) + (f"\n… ({len(lines) - n} more lines)" if len(lines) > n else "")


_ALIAS = r"tf\.aliasing_output\s*=\s*\d+\s*:\s*i\d+"
_ALIAS_ONLY = re.compile(r"\s*\{\s*" + _ALIAS + r"\s*\}")
_ALIAS_ENTRY = re.compile(_ALIAS + r"\s*,\s*|,\s*" + _ALIAS)


def strip_aliasing(mlir_text: str) -> str:
    """The text without `tf.aliasing_output` (buffer donation) argument attributes.

    IREE 3.13 turns them into `iree.abi.output` ties and then miscompiles a read of the
    donated input that comes after the aliased result is written: it sees the new value
    (`sum(w)` next to `w' = w - 0.1·g` gave sum(w') — see test_iree_backend). So on IREE
    outputs get fresh storage; donation stays part of the contract (see `execute`)."""
    return _ALIAS_ENTRY.sub("", _ALIAS_ONLY.sub("", mlir_text))


def iree_text(mlir_text: str) -> str:
    """The text IREE compiles: without the donation ties (`strip_aliasing`), and with @main's transients
    in a storage buffer of the caller's where @main can be read (`transients.with_transient_storage`)."""
    stripped = strip_aliasing(mlir_text)
    return with_transient_storage(stripped) or stripped


# Cross-replica work IREE's single-device path would quietly run on one device.
_REPLICATED = re.compile(r"mhlo\.num_replicas\s*=\s*([2-9]|\d{2,})\b|stablehlo\.(" + "|".join(CROSS_REPLICA_OPS)
                         + r")\b")


class IreeBuffer:
    """An array on an IREE device. Invalid once donated to an executable (its storage was reused)."""

    def __init__(self, backend: IreeBackend, view: Any, shape: tuple[int, ...], dtype: np.dtype):
        self._backend, self._view = backend, view
        self.shape, self.dtype = shape, np.dtype(dtype)
        self._gone: str | None = None

    def _describe(self) -> str:
        return f"IreeBuffer({'x'.join(map(str, self.shape)) or 'scalar'} {self.dtype})"

    def _live(self, purpose: str) -> Any:
        if self._gone is not None:
            raise BackendError(f"{self._describe()} {self._gone}; cannot {purpose}")
        return self._view

    @property
    def is_deleted(self) -> bool:
        return self._gone is not None

    def delete(self) -> None:
        self._gone = self._gone or "was deleted"
        self._view = None

    def __repr__(self) -> str:
        return self._describe()[:-1] + (f", {self._gone})" if self._gone else ")")


class IreeExecutable:
    """A loaded .vmfb and its @main, with the signature read from the module text."""

    def __init__(self, backend: IreeBackend, module: Any, context: Any, function: Any,
                 signature: list[ArgSpec] | None, artifact: Path, cache_hit: bool):
        self._backend, self.module, self.context, self.function = backend, module, context, function
        self.input_specs = signature
        self.donated_inputs: tuple[int, ...] = tuple(
            i for i, s in enumerate(signature or ()) if s.aliasing_output is not None)
        self.artifact, self.cache_hit = artifact, cache_hit
        self.num_replicas = 1
        #: the buffer @main keeps its transients in, made once and passed to every call (None: IREE's own)
        self.transient_storage: Any = None
        if TAKES_STORAGE_KEY in function.reflection:
            size = function.reflection.get(SIZE_KEY)
            if size is None or not size.isdigit():
                raise BackendError(f"the artifact {artifact} takes a transient storage buffer of no constant size "
                                   f"({TAKES_STORAGE_KEY} without {SIZE_KEY}); hloforge passes one of a fixed size")
            rt = backend.runtime
            try:
                self.transient_storage = backend.device.allocator.allocate_buffer(
                    memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
                    allocation_size=max(int(size), 1))
            except RuntimeError as e:
                raise _runtime_failure(e, f"allocating {module.name}'s transient storage", int(size)) from None

    def __repr__(self) -> str:
        return f"IreeExecutable({self.module.name!r}, {self.artifact})"


class IreeBackend:
    name = "iree"
    # The lowering forms IREE's modules are rendered in (core/strategy.py; why: benchmarks/NOTES.md).
    strategy_defaults = {"layout": "nhwc", "update": "after_backward", "paramLayout": "hwio", "sums": "plain",
                         "conv2d": "nhwc", "convGrad": "written", "pointwise": "dot", "depthwise": "shiftedSmall",
                         "maxPool": "select", "bnReduce": "fused", "sdpaGrad": "closed", "maskedSum": "channelsFirst"}

    def __init__(self, target: str | None = None, *, gpu_arch: str | None = None,
                 extra_flags: Sequence[str] = (), cache_dir: str | os.PathLike[str] | None = None):
        self.compiler, self.runtime = _import_iree()
        self.target = target or os.environ.get(TARGET_ENV_VAR) or "llvm-cpu"
        if self.target not in TARGETS:
            if target:
                raise BackendError(f"iree target {self.target!r} is not supported; expected one of {sorted(TARGETS)}")
            # the variable's fault, named as such: not the checkpoint's or the run's being opened
            raise BackendSettingError(f"{TARGET_ENV_VAR}={self.target!r}: not an iree target; expected one of "
                                      f"{sorted(TARGETS)}, or the variable unset (llvm-cpu)")
        driver, arch_flag, arch_default = TARGETS[self.target]
        #: who named the GPU architecture ("gpu_arch", the variable, or None: the target's default or a CPU)
        self.arch_named_by = "gpu_arch" if gpu_arch else GPU_ARCH_ENV_VAR if os.environ.get(GPU_ARCH_ENV_VAR) else None
        self.gpu_arch = (gpu_arch or os.environ.get(GPU_ARCH_ENV_VAR) or arch_default) if arch_flag else None
        flags = list(CPU_FLAGS) if arch_flag is None else [f"{arch_flag}={self.gpu_arch}"]
        self.flags: tuple[str, ...] = (*EXECUTION_FLAGS, *flags, *extra_flags)
        self.driver = driver
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.version = compiler_version()
        #: compiles and cache hits made through this backend (tests read these)
        self.stats = {"compiles": 0, "hits": 0, "compile_s": 0.0}
        # the timeline semaphore `execute` signals (one value per call) and waits on; opened on first use
        self._semaphore: Any = None
        self._timeline = 0
        # One execute at a time: each waits on the timeline's value the last one signalled, so two at once (a fit's
        # step and another thread's predict, two forwards of one model) made the same fences, and one hung or failed.
        self._executing = ProcessLock()
        self._unstored_why = ""  # why the last artifact could not be stored (_store)

    @property
    def config(self) -> Any:
        """The runtime config (instance + device), opened on first use: compiling needs no device."""
        return Runtime.get(self.runtime, self.driver)

    @property
    def device(self) -> Any:
        return self.config.device

    def backend_name(self) -> str:
        return f"iree ({self.target}, compiler {_dist_version('iree-base-compiler')}, driver {self.driver})"

    def fingerprint(self) -> str:
        """What a program's speed depends on besides its text: target, compiler revision and flags."""
        return (f"iree {self.target} {self.version} flags {' '.join(self.flags)} runtime {' '.join(runtime_flags())} "
                f"worker nice {worker_nice()} {host_memory_description()}")

    # -- compile ---------------------------------------------------------------

    def artifact_path(self, mlir_text: str) -> Path:
        """Where the artifact of this text (as IREE compiles it: `iree_text`) lives in the cache."""
        host = host_cpu() if self.target == "llvm-cpu" else ""  # a GPU target's code is not the host's
        return self.cache_dir / f"{cache_key(mlir_text, self.target, self.flags, self.version, host)}.vmfb"

    def _compile_vmfb(self, mlir_text: str, path: Path) -> bytes:
        t0 = time.perf_counter()
        keyed = with_reflection(mlir_text, {KEY_REFLECTION: path.stem}) or mlir_text
        try:
            vmfb = self.compiler.compile_str(keyed, target_backends=[self.target], input_type="stablehlo",
                                             extra_args=list(self.flags))
        except self.compiler.CompilerToolError as e:
            if self.target in ARCH_FORMS and self.arch_named_by and _UNKNOWN_ARCH.search(str(e)):
                said = f"{self.arch_named_by}={self.gpu_arch!r}: iree-compile knows no {self.target} architecture " \
                       f"of that name; expected {ARCH_FORMS[self.target]}"
                if self.arch_named_by == "gpu_arch":
                    raise BackendError(said) from None
                raise BackendSettingError(f"{said}, or the variable unset ({TARGETS[self.target][2]})") from None
            raise BackendError(
                f"iree-compile ({self.target}, flags {' '.join(self.flags)}) rejected the module; "
                f"artifact path {path}\ncompiler says:\n{_compiler_message(e)}\nmodule begins:\n"
                f"{_module_head(mlir_text)}") from None
        self.stats["compiles"] += 1
        self.stats["compile_s"] += time.perf_counter() - t0
        return bytes(vmfb)

    def compile_artifact(self, mlir_text: str) -> tuple[Path, bool]:
        """The cached .vmfb for this text, target and flags, compiling on a miss; (path, was it a hit).
        Needs no device, so a GPU target can be built ahead of time on a CPU machine."""
        path, hit, unstored = self._artifact(mlir_text)
        if unstored is not None:
            raise BackendError(f"could not write the artifact {path}: {self._unstored_why}; expected a cache "
                               f"directory this user can write, with room for it (${CACHE_ENV_VAR} names one)")
        return path, hit

    def _artifact(self, mlir_text: str) -> tuple[Path, bool, bytes | None]:
        """(the cache path, was it a hit, the artifact's bytes where the cache could not store them)."""
        mlir_text = iree_text(mlir_text)
        path = self.artifact_path(mlir_text)
        if path.is_file():
            self.stats["hits"] += 1
            touch(path)
            return path, True, None
        vmfb = self._compile_vmfb(mlir_text, path)
        return path, False, None if self._store(path, vmfb) else vmfb

    def _store(self, path: Path, vmfb: bytes) -> bool:
        """`vmfb` into the cache; False (said once per directory and cause) where it cannot be written."""
        try:
            write_atomic(path, vmfb)
            prune(self.cache_dir, ".vmfb", keep=path)
            return True
        except OSError as e:
            self._unstored_why = e.strerror or str(e)  # compile_artifact's cause: a full disk, a read-only one
            why = first_unwritable(self.cache_dir, e)
            if why is not None:
                warnings.warn(IreeCacheWarning(
                    f"IREE cache: cannot write to {self.cache_dir} ({why}); artifacts are not cached "
                    f"(${CACHE_ENV_VAR} names a writable directory)"), stacklevel=4)
            return False

    def compile(self, mlir_text: str, num_replicas: int = 1) -> IreeExecutable:
        if num_replicas != 1:
            raise BackendError(f"num_replicas={num_replicas}: the iree backend runs one device only "
                               f"(data-parallel needs --backend xla)")
        found = _REPLICATED.search(mlir_text)
        if found:
            raise BackendError(f"the module asks for cross-replica work ({found.group(0)!r}); the iree backend "
                               f"runs one device only and will not run it on one quietly")
        path, hit, unstored = self._artifact(mlir_text)
        try:
            module, context = self._load(path, unstored)
            wrong = self._not_this_key(module, path, mlir_text) if hit else ""
        except BackendError as e:
            if not hit or isinstance(e, SettingError):  # an environment variable's fault, not the entry's
                raise
            wrong = f"does not load ({str(e).splitlines()[0]})"  # damaged (e.g. a disk filled up mid-copy elsewhere)
        if wrong:  # rebuilt once, and replaced
            warnings.warn(IreeCacheWarning(f"IREE cache entry {path} {wrong}; compiling again and replacing it"),
                          stacklevel=2)
            vmfb = self._compile_vmfb(iree_text(mlir_text), path)
            module, context = self._load(path, None if self._store(path, vmfb) else vmfb)
        function = module.lookup_function("main")
        if function is None:
            raise BackendError(f"the module in {path} has no @main (functions: {module.function_names})")
        model = function.reflection.get("iree.abi.model")
        if model != ABI_MODEL:
            raise BackendError(f"the artifact {path} has the {model or 'synchronous'} ABI; execute expects "
                               f"{ABI_MODEL} (compile with {' '.join(EXECUTION_FLAGS)})")
        return IreeExecutable(self, module, context, function, parse_main_signature(mlir_text), path, hit)

    @staticmethod
    def _not_this_key(module: Any, path: Path, mlir_text: str) -> str:
        """What is wrong with a cache hit whose @main does not carry its own key (KEY_REFLECTION), else ""."""
        main = module.lookup_function("main")
        said = main.reflection.get(KEY_REFLECTION) if main is not None else None
        if said == path.stem or (said is None and with_reflection(iree_text(mlir_text), {}) is None):
            return ""  # this key's, or a text whose @main cannot carry one
        return f"is another key's entry (its @main carries {f'key {said[:12]}…' if said else 'no key'})"

    def _load(self, path: Path, unstored: bytes | None = None) -> tuple[Any, Any]:
        """The artifact at `path`, or `unstored` (its bytes, which the cache could not keep) from memory."""
        rt, cfg = self.runtime, self.config
        try:
            if unstored is None:
                try:
                    module = rt.VmModule.mmap(cfg.vm_instance, str(path))
                except OSError as e:
                    if e.errno not in _READ_ONLY_ERRNOS:
                        raise
                    # IREE's mmap opens the file for writing: an entry of a read-only cache (a read-only mount,
                    # another user's) is read into memory instead, not taken for damaged and compiled again
                    unstored = path.read_bytes()
            if unstored is not None:
                module = rt.VmModule.copy_buffer(cfg.vm_instance, unstored)
            return module, rt.VmContext(cfg.vm_instance, modules=[*cfg.default_vm_modules, module])
        except Exception as e:
            raise BackendError(f"IREE could not load the artifact {path}: {e}") from None

    # -- buffers ---------------------------------------------------------------

    def to_device(self, array: np.ndarray, borrow: bool = False, device: int = 0) -> IreeBuffer:  # always a copy
        if device != 0:
            raise BackendError(f"device {device}: the iree backend drives one device only (device 0)")
        from iree.runtime.array_interop import map_dtype_to_element_type

        host = np.asarray(array)
        if not host.dtype.isnative:
            host = host.astype(host.dtype.newbyteorder("="))
        host = np.ascontiguousarray(host) if host.ndim else host.copy()
        etype = map_dtype_to_element_type(host.dtype)
        if etype is None:
            raise BackendError(f"the iree backend has no element type for dtype {host.dtype}")
        rt = self.runtime
        try:
            view = self.device.allocator.allocate_buffer_copy(
                memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
                device=self.device, buffer=host, element_type=etype)
        except RuntimeError as e:
            raise _runtime_failure(e, f"copying a {host.dtype}{list(host.shape)} array to the device",
                                  host.nbytes) from None
        return IreeBuffer(self, view, tuple(host.shape), host.dtype)

    def input_slot(self, shape: tuple[int, ...], dtype: np.dtype) -> InputSlot | None:
        """A fixed input buffer the host rewrites per call (see InputSlot): the buffer mapped once,
        on a CPU driver (local-task, local-sync), where device memory is host memory; else None."""
        if not self.driver.startswith("local-"):
            return None
        buffer = self.to_device(np.zeros(shape, dtype))
        mapping = buffer._view.map()
        return InputSlot(buffer, mapping.asarray(tuple(shape), np.dtype(dtype)), keepalive=mapping)

    def to_host(self, buffer: IreeBuffer) -> np.ndarray:
        if not isinstance(buffer, IreeBuffer):
            raise BackendError(f"to_host takes an IreeBuffer, got {type(buffer).__name__}")
        view = buffer._live("copy it to the host")
        arr = self.runtime.DeviceArray(self.device, view, override_dtype=buffer.dtype).to_host()
        # On the CPU this maps the device memory: copy, or a later in-place update would show through.
        return np.array(arr, dtype=buffer.dtype, copy=True).reshape(buffer.shape)

    # -- execute ---------------------------------------------------------------

    def device_count(self) -> int:
        return 1

    def execute_replicated(self, exe: IreeExecutable, per_replica: Sequence[Sequence[IreeBuffer]],
                           keep: Sequence[int] = ()) -> list[list[IreeBuffer]]:
        raise BackendError(f"data-parallel execution over {len(per_replica)} replicas: the iree backend runs "
                           "one device only and will not run it on one quietly (use --backend xla)")

    def execute(self, exe: IreeExecutable, args: Sequence[IreeBuffer], keep: Sequence[int] = ()) -> list[IreeBuffer]:
        with self._executing:
            return self._execute(exe, args, keep)

    def _execute(self, exe: IreeExecutable, args: Sequence[IreeBuffer], keep: Sequence[int]) -> list[IreeBuffer]:
        if not isinstance(exe, IreeExecutable):
            raise BackendError(f"execute takes an IreeExecutable, got {type(exe).__name__}")
        for i, buf in enumerate(args):
            if not isinstance(buf, IreeBuffer):
                raise BackendError(f"argument {i} is a {type(buf).__name__}, not an IreeBuffer (use to_device)")
            if buf._backend.device is not self.device:
                raise BackendError(f"argument {i} belongs to another IREE device")
            buf._live(f"pass it as argument {i}")
        check_args(exe.input_specs, [(b.shape, b.dtype) for b in args], [b._describe() for b in args])
        bad = [k for k in keep if not 0 <= k < len(args)]
        if bad:
            raise BackendError(f"keep={list(keep)} names inputs outside 0..{len(args) - 1}")
        kept = set(keep)
        rt = self.runtime
        if self._semaphore is None:
            self._semaphore, self._timeline = self.device.create_semaphore(0), 0
        ready, done = (rt.HalFence.create_at(self._semaphore, t) for t in (self._timeline, self._timeline + 1))
        arg_list = rt.VmVariantList(len(args) + 3)
        for buf in args:
            arg_list.push_ref(buf._view)
        if exe.transient_storage is not None:
            arg_list.push_ref(exe.transient_storage)
        arg_list.push_ref(ready)
        arg_list.push_ref(done)
        ret_list = rt.VmVariantList(8)
        try:
            exe.context.invoke(exe.function, arg_list, ret_list)
            done.wait()  # the outputs exist once the work signals: execute returns when it has run
            self._timeline += 1
        except Exception as e:
            self._semaphore = None  # a failed semaphore stays failed: the next call opens a new one
            raise _runtime_failure(e, f"executing {exe.module.name}") from None
        finally:
            # Compiled without the ties (strip_aliasing), the storage is intact; a donated input is still
            # consumed, so a driver that reuses one fails here as it would on XLA, not only there.
            for i in exe.donated_inputs:
                if i not in kept and i < len(args):
                    args[i]._gone = (f"was donated to an executable as argument {i} and holds no data any more "
                                     f"(pass keep=[{i}] to execute() to keep an input alive)")
                    args[i]._view = None
        outs = []
        for j in range(len(ret_list)):
            view = ret_list.get_as_object(j, rt.HalBufferView)
            dtype = _dtype_of_element_type(rt, view.element_type)
            outs.append(IreeBuffer(self, view, tuple(view.shape), dtype))
        return outs


_DTYPES_BY_ELEMENT_TYPE: dict[int, np.dtype] = {}


def _dtype_of_element_type(rt: Any, etype: Any) -> np.dtype:
    from iree.runtime.array_interop import map_dtype_to_element_type

    if not _DTYPES_BY_ELEMENT_TYPE:
        for dt in (np.float32, np.float64, np.int32, np.int64, np.float16, np.int8, np.uint8, np.int16, np.bool_):
            code = map_dtype_to_element_type(np.dtype(dt))
            if code is not None:
                _DTYPES_BY_ELEMENT_TYPE.setdefault(int(code), np.dtype(dt))
    try:
        return _DTYPES_BY_ELEMENT_TYPE[int(etype)]
    except KeyError:
        raise BackendError(f"the iree backend has no numpy dtype for element type {etype}") from None


@hookimpl
def hloforge_backends() -> list[type]:
    return [IreeBackend]
