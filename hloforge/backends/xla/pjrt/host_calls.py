"""Host calls: a Python function a compiled program calls in the middle of its run.

The program names it as a typed-FFI custom call (``stablehlo.custom_call @name(...) {api_version = 4}``);
:func:`register` hands XLA a C entry point for that name through the plugin's PJRT FFI extension
(``PJRT_FFI_Register_Handler``, for the platform "Host": the CPU). XLA then calls it with the operands'
and results' buffers in place; the function reads the operands and fills the results as numpy views of
them. What it is for: a collective XLA's CPU plugin cannot run across processes (MPI's all-reduce inside
the step, train/mpi.py), at exactly the point of the graph that needs it.

A function that raises fails the XLA run with its message; the exception itself is kept
(:func:`take_failure`) so the caller re-raises the user's one line rather than XLA's wrapping of it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from hloforge.backends.xla.pjrt.c_api import ffi
from hloforge.core.errors import BackendError

EXTENSION_FFI = 5  # PJRT_Extension_Type_FFI
FFI_METADATA = 1  # XLA_FFI_Extension_Metadata
STAGE_EXECUTE = 3
TYPED_FFI = 1  # PJRT_FFI_Register_Handler_Args.api_version: the typed FFI (custom_call api_version = 4)
ERROR_INTERNAL = 13
PLATFORM = b"Host"
# XLA_FFI_DataType -> numpy
DTYPES = {1: np.bool_, 2: np.int8, 4: np.int32, 5: np.int64, 6: np.uint8, 8: np.uint32, 11: np.float32,
          12: np.float64}

HostFunction = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]

_REGISTERED: dict[str, tuple[HostFunction, object]] = {}  # name -> (function, its C callback: kept alive)
_LOCK = threading.Lock()
_failure: BaseException | None = None


def _ffi_extension(api) -> object:
    addr = int(ffi.cast("uintptr_t", api._api.extension_start))
    need = ffi.offsetof("PJRT_FFI_Extension", "register_handler") + ffi.sizeof("void*")
    while addr:
        ext = ffi.cast("PJRT_FFI_Extension*", addr)
        if ext.type == EXTENSION_FFI:
            if ext.struct_size < need:
                break
            return ext
        addr = int(ffi.cast("uintptr_t", ext.next))
    raise BackendError(f"the PJRT plugin {api.path} cannot take host calls (no FFI handler registration in its "
                       "PJRT FFI extension); use a newer XLA CPU plugin")


def _buffers(items) -> list[np.ndarray]:
    out = []
    for i in range(items.size):
        buf = ffi.cast("XLA_FFI_Buffer*", items.items[i])
        dtype = DTYPES.get(buf.dtype)
        if dtype is None:
            raise BackendError(f"a host call got an operand of XLA type {buf.dtype}; it takes "
                               f"{', '.join(np.dtype(d).name for d in DTYPES.values())}")
        shape = tuple(buf.dims[d] for d in range(buf.rank))
        count = int(np.prod(shape, dtype=np.int64))
        raw = ffi.buffer(ffi.cast("char*", buf.data), count * np.dtype(dtype).itemsize)
        out.append(np.frombuffer(raw, dtype).reshape(shape))
    return out


def _entry(fn: HostFunction) -> object:
    """The C handler XLA calls: metadata on registration, then each execution's buffers to `fn`."""

    def handler(frame):
        global _failure
        ext = frame.extension_start
        if ext != ffi.NULL and ext.type == FFI_METADATA:  # XLA asks which FFI version the handler speaks
            meta = ffi.cast("XLA_FFI_Metadata_Extension*", ext).metadata
            meta.api_version.major_version = frame.api.api_version.major_version
            meta.api_version.minor_version = frame.api.api_version.minor_version
            meta.traits = 0
            return ffi.NULL
        if frame.stage != STAGE_EXECUTE:
            return ffi.NULL
        try:
            fn(_buffers(frame.args), _buffers(frame.rets))
            return ffi.NULL
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller through take_failure
            _failure = exc
            args = ffi.new("XLA_FFI_Error_Create_Args*")
            args.struct_size = ffi.sizeof("XLA_FFI_Error_Create_Args")
            message = ffi.new("char[]", (str(exc) or type(exc).__name__).encode())
            args.message, args.errc = message, ERROR_INTERNAL
            return frame.api.XLA_FFI_Error_Create(args)

    return ffi.callback("XLA_FFI_Error*(XLA_FFI_CallFrame*)", handler)


def register(api, name: str, fn: HostFunction) -> None:
    """Make `name` a host call of every program compiled by `api`'s plugin in this process, calling `fn`
    (inputs, outputs). XLA keeps a name's first handler for the life of the process, so a name is
    registered once; a second `fn` for it replaces the function the handler calls."""
    with _LOCK:
        if name in _REGISTERED:
            _REGISTERED[name] = (fn, _REGISTERED[name][1])
            return
        callback = _entry(lambda inputs, outputs: _REGISTERED[name][0](inputs, outputs))
        ext = _ffi_extension(api)
        target, platform = ffi.new("char[]", name.encode()), ffi.new("char[]", PLATFORM)
        # Two layouts of the arguments are in released plugins: the newer dropped the `api_version` field
        # (typed FFI only). An older plugin refuses the newer's shorter struct_size with an error, never
        # misreads it: so the newer first, then the older.
        error = None
        for ctype in ("PJRT_FFI_Register_Handler_Args", "PJRT_FFI_Register_Handler_Args_typed_flag"):
            if error is not None:
                api.take_error(error, "")
            args = ffi.new(ctype + "*")
            args.struct_size = ffi.offsetof(ctype, "traits") + ffi.sizeof("int")  # PJRT_STRUCT_SIZE
            args.target_name, args.target_name_size = target, len(target) - 1
            args.handler = ffi.cast("void*", callback)
            args.platform_name, args.platform_name_size = platform, len(platform) - 1
            if ctype.endswith("typed_flag"):
                args.api_version = TYPED_FFI
            error = ext.register_handler(args)
            if error == ffi.NULL:
                break
        api.check(error, f"registering the host call {name!r}")
        _REGISTERED[name] = (fn, callback)


def take_failure() -> BaseException | None:
    """The exception the last failed host call raised (cleared): what a failed run should re-raise."""
    global _failure
    exc, _failure = _failure, None
    return exc


@contextlib.contextmanager
def reraised() -> Iterator[None]:
    """Around a run: the run failing because a host call raised re-raises that call's exception."""
    take_failure()
    try:
        yield
    except BackendError:
        failure = take_failure()
        if failure is not None:
            raise failure from None
        raise
