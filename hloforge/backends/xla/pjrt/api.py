"""One loaded PJRT plugin (:class:`Api`): its function table, its calls, its errors, and the
values that cross it (named values, buffer element types).

Every ``PJRT_Error*`` becomes a :class:`~hloforge.core.errors.BackendError` carrying the plugin's
message and code.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

import numpy as np

from hloforge.backends.base import forked_error
from hloforge.backends.signature import DTYPES, extension_dtypes
from hloforge.backends.xla.pjrt.c_api import (
    _API_SIZE_NEEDED,
    _BUFFER_TYPE_CODES,
    _ERROR_CODE_NAMES,
    _slot_end,
    _struct_size,
    ffi,
)
from hloforge.backends.xla.pjrt.declarations import HEADER_MINOR
from hloforge.backends.xla.pjrt.xla_flags import check_xla_flags
from hloforge.core.errors import BackendError, DeviceMemoryError

# -------------------------------------------------------------------- dtypes ---

_CODE_OF_DTYPE = {dt: _BUFFER_TYPE_CODES[f"PJRT_Buffer_Type_{name}"] for dt, name, _ in DTYPES}
_DTYPE_OF_CODE = {code: dt for dt, code in _CODE_OF_DTYPE.items()}


@functools.cache
def _add_extension_dtypes() -> None:
    """Add the rows looked up only on a miss (signature.extension_dtypes: bfloat16)."""
    for dt, name, _ in extension_dtypes():
        code = _BUFFER_TYPE_CODES[f"PJRT_Buffer_Type_{name}"]
        _CODE_OF_DTYPE[dt], _DTYPE_OF_CODE[code] = code, dt


def _buffer_type(dtype: np.dtype) -> int:
    code = _CODE_OF_DTYPE.get(dtype)
    if code is None:
        _add_extension_dtypes()
        code = _CODE_OF_DTYPE.get(dtype)
    if code is None:
        supported = ", ".join(str(dt) for dt in _CODE_OF_DTYPE)
        raise BackendError(f"dtype {dtype} is not supported by the XLA backend (supported: {supported})")
    return code


def _dtype_of(code: int) -> np.dtype:
    dtype = _DTYPE_OF_CODE.get(code)
    if dtype is None:
        _add_extension_dtypes()
        dtype = _DTYPE_OF_CODE.get(code)
    if dtype is None:
        name = ffi.typeof("PJRT_Buffer_Type").elements.get(code, str(code))
        raise BackendError(f"the XLA backend has no numpy dtype for buffer element type {name}")
    return dtype


# ----------------------------------------------------------------------- Api ---


# What a PJRT call was doing, for its error message: a string, or a function that makes it (the hot
# path's messages name shapes; formatting them on every call would cost more than the call).
Doing = str | Callable[[], str]


# The calls a finalizer may make (freeing an executable, a client, a borrowed array's event, and an error
# any of them returns), their argument types realized when a plugin is loaded. A finalizer runs inside a
# garbage collection, which may come in the middle of cffi realizing another type; one that realized a
# type too would re-enter cffi (when the FFI was parsed in-line, on a lock it never released: a hang).
RELEASE_CALLS = ("LoadedExecutable_Destroy", "Client_Destroy", "Event_Await", "Event_Destroy", "Error_Message",
                 "Error_GetCode", "Error_Destroy")


@functools.cache
def _args_type(name: str) -> tuple[object, int]:
    """The cffi pointer type of ``PJRT_<name>_Args`` and its struct_size (the hot path asks often)."""
    pointer = ffi.typeof(f"PJRT_{name}_Args*")
    return pointer, _struct_size(pointer.item)


class Api:
    """One loaded plugin: its PJRT_Api table, initialized once (see :func:`load_api`)."""

    def __init__(self, path: str):
        try:
            self._lib = ffi.dlopen(path)
        except OSError as exc:
            raise BackendError(f"cannot load PJRT plugin {path}: {exc}") from None
        try:
            get_api = self._lib.GetPjrtApi
        except AttributeError:
            raise BackendError(f"{path} is not a PJRT plugin: it exports no GetPjrtApi") from None
        self.path, self.pid = path, os.getpid()  # the process whose threads XLA starts
        self._api = get_api()
        # PJRT_<name> -> (function pointer, args pointer type, struct_size), looked up once: the step's
        # hot path makes ~35 calls.
        self._calls: dict[str, tuple[Callable, object, int]] = {}
        version = self._api.pjrt_api_version
        self.version: tuple[int, int] = (version.major_version, version.minor_version)
        # Major 0 is the only ABI the declarations above describe.
        if self.version[0] != 0 or self._api.struct_size < _API_SIZE_NEEDED:
            raise BackendError(
                f"PJRT plugin {path} reports API version {self.version[0]}.{self.version[1]} "
                f"with a {self._api.struct_size}-byte function table; hloforge needs 0.x with at "
                f"least {_API_SIZE_NEEDED} bytes (it was written against 0.{HEADER_MINOR})"
            )
        self.call("Plugin_Initialize", "initializing the PJRT plugin")
        self._destroy = self._api.PJRT_Buffer_Destroy
        self._destroy_type, self._destroy_size = _args_type("Buffer_Destroy")
        for name in RELEASE_CALLS:
            _args_type(name)
        self.attributes = self._plugin_attributes()

    def has(self, name: str) -> bool:
        """Whether the plugin's function table reaches ``PJRT_<name>`` and fills it (for the calls in
        OPTIONAL)."""
        return self._api.struct_size >= _slot_end(name) and getattr(self._api, f"PJRT_{name}") != ffi.NULL

    def args(self, name: str, **fields):
        """A zeroed ``PJRT_<name>_Args`` with struct_size set and ``fields`` filled in."""
        ptype, size = _args_type(name)
        args = ffi.new(ptype)
        args.struct_size = size
        for key, value in fields.items():
            setattr(args, key, value)
        return args

    def call(self, name: str, doing: Doing, **fields):
        """Call ``PJRT_<name>`` and return its args (outputs included); raise on error, saying
        what it was ``doing`` (a string, or a function making it: only an error needs it)."""
        entry = self._calls.get(name)
        if entry is None:
            entry = self._calls[name] = (getattr(self._api, f"PJRT_{name}"), *_args_type(name))
        fn, ptype, size = entry
        args = ffi.new(ptype)
        args.struct_size = size
        for key, value in fields.items():
            setattr(args, key, value)
        error = fn(args)
        if error != ffi.NULL:
            raise self.take_error(error, doing)
        return args

    def destroy_buffer(self, handle) -> None:
        """PJRT_Buffer_Destroy: `call` without its generic field loop. A step releases every
        donated input (mnist-mlp: 18 a step), and the general path cost 1.9 µs a call against
        0.7 µs here (10 000 calls each)."""
        args = ffi.new(self._destroy_type)
        args.struct_size = self._destroy_size
        args.buffer = handle
        self.check(self._destroy(args), "destroying a buffer")

    def check(self, error, doing: Doing) -> None:
        if error != ffi.NULL:
            raise self.take_error(error, doing)

    def take_error(self, error, doing: Doing) -> BackendError:
        """Turn a PJRT_Error* into a BackendError, destroying the PJRT_Error."""
        if callable(doing):
            doing = doing()
        try:
            msg = self.args("Error_Message", error=error)
            self._api.PJRT_Error_Message(msg)
            message = ffi.unpack(msg.message, msg.message_size).decode("utf-8", "replace").strip()
            code_args = self.args("Error_GetCode", error=error)
            code_error = self._api.PJRT_Error_GetCode(code_args)
            code = _ERROR_CODE_NAMES.get(code_args.code, str(code_args.code))
            if code_error != ffi.NULL:  # no code to report; do not leak the second error
                code = "UNKNOWN"
                self._api.PJRT_Error_Destroy(self.args("Error_Destroy", error=code_error))
        finally:
            self._api.PJRT_Error_Destroy(self.args("Error_Destroy", error=error))
        exc = BackendError(f"XLA failed {doing}: {message} [{code}]")
        if code == "RESOURCE_EXHAUSTED":  # out of memory: the sessions name the batch that asked (out_of_memory)
            exc = DeviceMemoryError(str(exc), asked_bytes(message))
        exc.code = code  # type: ignore[attr-defined]
        exc.plugin_message = message  # type: ignore[attr-defined]
        return exc

    def await_event(self, event, doing: Doing) -> None:
        """Block until ``event`` is ready, destroy it, raise if it carries an error."""
        if event == ffi.NULL:
            return
        try:
            self.call("Event_Await", doing, event=event)
        finally:
            self.call("Event_Destroy", "destroying an event", event=event)

    def _plugin_attributes(self) -> dict[str, object]:
        args = self.call("Plugin_Attributes", "reading plugin attributes")
        return _named_values_to_dict(args.attributes, args.num_attributes)

    @property
    def forked(self) -> bool:
        """Whether this process is a fork of the one that loaded the plugin (see _refuse_in_fork)."""
        return os.getpid() != self.pid

    def __repr__(self) -> str:
        return f"Api({self.path!r}, version={self.version[0]}.{self.version[1]})"


_APIS: dict[str, Api] = {}


def _refuse_in_fork() -> None:
    """In a forked child: XLA's threads (those an execute, a transfer or a destroy waits on) stayed in the
    parent, so any call would wait forever; each loaded plugin refuses its calls instead. Set on the
    instance, over its methods, so the hot path pays nothing for it."""
    for api in list(_APIS.values()):
        def refuse(*_args: object, _pid: int = api.pid, **_fields: object) -> NoReturn:
            raise forked_error("XLA", _pid)
        api.call = api.destroy_buffer = refuse  # type: ignore[method-assign]


os.register_at_fork(after_in_child=_refuse_in_fork)

# The allocation an out-of-memory message names: the CPU plugin's 'Out of memory allocating 55838841440 bytes',
# the GPU allocator's 'Out of memory while trying to allocate 33762398024 bytes.' or '... allocate 16.00GiB'.
_ASKED = re.compile(r"allocat(?:e|ing) (\d+(?:\.\d+)?) ?(bytes|[KMGT]iB)")
_UNIT_BYTES = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def asked_bytes(message: str) -> int | None:
    """The bytes of the allocation an XLA out-of-memory `message` says it was refused, None where it says none."""
    found = _ASKED.search(message)
    return round(float(found[1]) * _UNIT_BYTES[found[2]]) if found else None


_APIS_LOCK = threading.Lock()


LOG_LEVEL_ENV_VAR = "TF_CPP_MIN_LOG_LEVEL"
_LOG_LEVEL_LOCK = threading.Lock()


@contextlib.contextmanager
def info_unlogged() -> Iterator[None]:
    """XLA logs every client option it applies at INFO to stderr (a user who wants that sets TF_CPP_MIN_LOG_LEVEL=0).
    It reads the level from the environment once, at its first line, a client's creation: 1 (warnings and up) is
    set for that where the user set none, then taken out again, the process's environment left as it was."""
    with _LOG_LEVEL_LOCK:
        unset = LOG_LEVEL_ENV_VAR not in os.environ
        if unset:
            os.environ[LOG_LEVEL_ENV_VAR] = "1"
        try:
            yield
        finally:
            if unset:
                os.environ.pop(LOG_LEVEL_ENV_VAR, None)


def load_api(path: str) -> Api:
    """The process-wide Api for ``path``: PJRT plugins must be initialized only once."""
    key = os.path.realpath(path)
    with _APIS_LOCK:
        if key not in _APIS:
            check_xla_flags(path)
            _APIS[key] = Api(path)
        return _APIS[key]


_STDERR_LOCK = threading.Lock()  # two captures at once would restore each other's capture file


@contextlib.contextmanager
def stderr_without(drop: re.Pattern[bytes]) -> Iterator[None]:
    """Run the body with file descriptor 2 captured, then write back every line `drop` does not
    match: for a plugin's known-harmless log lines (its C++ logging writes to fd 2 directly). A line
    another thread writes meanwhile comes out after the body, not lost."""
    with _STDERR_LOCK:
        yield from _stderr_without(drop)


def _stderr_without(drop: re.Pattern[bytes]) -> Iterator[None]:
    if sys.stderr is not None:  # None: a process started without one (pythonw, a service; `2>&-`)
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to capture
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True) if not drop.search(line)]
            if kept:
                os.write(2, b"".join(kept))


# -------------------------------------------------------------- named values ---


_NV = {
    name.removeprefix("PJRT_NamedValue_"): code
    for name, code in ffi.typeof("PJRT_NamedValue_Type").relements.items()
}


def _named_values_to_dict(values, count: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for i in range(count):
        nv = values[i]
        name = ffi.unpack(nv.name, nv.name_size).decode()
        kind = nv.type
        if kind == _NV["kString"]:
            out[name] = ffi.unpack(nv.string_value, nv.value_size).decode("utf-8", "replace")
        elif kind == _NV["kInt64"]:
            out[name] = nv.int64_value
        elif kind == _NV["kInt64List"]:
            out[name] = list(ffi.unpack(nv.int64_array_value, nv.value_size))
        elif kind == _NV["kFloat"]:
            out[name] = nv.float_value
        elif kind == _NV["kBool"]:
            out[name] = bool(nv.bool_value)
    return out


# Options whose type hloforge knows. A plugin reads an option with std::get, so a
# mistyped one aborts the whole process (std::bad_variant_access) instead of erring.
_OPTION_TYPES: dict[str, type] = {"cpu_device_count": int}


def _named_values(options: dict[str, int | str | bool | float]):
    """A C array of PJRT_NamedValue and the Python objects that must outlive it."""
    for name, value in options.items():
        want = _OPTION_TYPES.get(name)
        if want is not None and (type(value) is not want):
            raise BackendError(f"client option {name}={value!r} must be of type {want.__name__}")
    array = ffi.new("PJRT_NamedValue[]", len(options))
    keep: list[object] = [array]
    for nv, (name, value) in zip(array, options.items(), strict=False):
        name_c = ffi.new("char[]", name.encode())
        keep.append(name_c)
        nv.struct_size = _struct_size("PJRT_NamedValue")
        nv.name, nv.name_size = name_c, len(name.encode())
        nv.value_size = 1
        if isinstance(value, bool):  # before int: bool is an int subclass
            nv.type, nv.bool_value = _NV["kBool"], value
        elif isinstance(value, int):
            nv.type, nv.int64_value = _NV["kInt64"], value
        elif isinstance(value, float):
            nv.type, nv.float_value = _NV["kFloat"], value
        elif isinstance(value, str):
            raw = value.encode()
            value_c = ffi.new("char[]", raw)
            keep.append(value_c)
            nv.type, nv.string_value, nv.value_size = _NV["kString"], value_c, len(raw)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            ints = ffi.new("int64_t[]", list(value))
            keep.append(ints)
            nv.type, nv.int64_array_value, nv.value_size = _NV["kInt64List"], ints, len(value)
        else:
            raise BackendError(
                f"client option {name}={value!r}: values must be int, str, bool, float or a list of ints"
            )
    return array, keep
