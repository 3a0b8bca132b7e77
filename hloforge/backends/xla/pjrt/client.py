"""A PJRT client on one plugin (:class:`Client`) and the process-wide clients.

Ownership: a :class:`Client` owns every :class:`~.executable.Executable` and
:class:`~.buffers.DeviceBuffer` made through it and frees them, before the PJRT client itself,
in :meth:`Client.close`.
"""

from __future__ import annotations

import atexit
import re
import threading
import weakref

import numpy as np

import hloforge.backends.xla.pjrt.host_calls as host_calls
from hloforge.backends.host_memory import retain_freed_host_memory
from hloforge.backends.signature import parse_main_signature
from hloforge.backends.xla.pjrt.api import _buffer_type, _named_values, info_unlogged, load_api, stderr_without
from hloforge.backends.xla.pjrt.buffers import Device, DeviceBuffer
from hloforge.backends.xla.pjrt.c_api import _struct_size, ffi
from hloforge.backends.xla.pjrt.discovery import find_plugin
from hloforge.backends.xla.pjrt.executable import Executable
from hloforge.backends.xla.pjrt.options import _SCHEDULER_OPTION, SCHEDULERS, compile_options, scheduler_in_xla_flags
from hloforge.core.errors import BackendError

_SEMANTICS = ffi.typeof("PJRT_HostBufferSemantics").relements
# How a host array reaches the device. The CPU plugin copies an "only during the call" array inline
# (a memcpy: 14 µs for mnist-mlp's 400 KB batch, 5 µs for a 12-byte vector, everything included);
# "until the transfer completes" goes through its transfer thread (23 µs for the batch), what the
# other platforms do; "zero copy" aliases the host memory, which XLA CPU does only at its buffer
# alignment (64 bytes; a misaligned array it would copy on the transfer thread).
_IMMUTABLE_ONLY_DURING_CALL = _SEMANTICS["PJRT_HostBufferSemantics_kImmutableOnlyDuringCall"]
_IMMUTABLE_UNTIL_TRANSFER_COMPLETES = _SEMANTICS["PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes"]
_IMMUTABLE_ZERO_COPY = _SEMANTICS["PJRT_HostBufferSemantics_kImmutableZeroCopy"]
_ZERO_COPY_ALIGN = 64
# What XLA's CPU plugin logs on every load of a serialized executable on a CPU whose LLVM features
# include the tuning flags +prefer-no-gather/-scatter (e.g. AMD Zen 4): the host feature list it
# compares against never has them, so it reports a mismatch (two lines of ~3 KB each) that is none.
# A real ISA mismatch (another feature named) still shows; the cache key holds the host's CPU.
_HARMLESS_LOAD_LOG = re.compile(rb"cpu_aot_loader\.cc:\d+\] Loading XLA:CPU AOT result\. Target machine feature "
                                rb"\+prefer-no-(gather|scatter) is not +supported on the host machine\."
                                rb"|^WARNING: All log messages before absl::InitializeLog\(\) is called")


class Client:
    """A PJRT client on one plugin: compiles modules and moves arrays to and from devices."""

    def __init__(
        self,
        plugin_path: str | None = None,
        create_options: dict[str, int | str | bool | float] | None = None,
    ):
        self._closed = True  # until the PJRT client exists
        self._owned: weakref.WeakSet = weakref.WeakSet()
        retain_freed_host_memory()  # before the client starts the threads that allocate its buffers
        self.plugin_path = plugin_path or find_plugin()
        options, keep_alive = _named_values(create_options or {})
        with info_unlogged():
            self._api = load_api(self.plugin_path)
            created = self._api.call(
                "Client_Create",
                "creating a PJRT client",
                create_options=options,
                num_options=len(create_options or {}),
            )
        del keep_alive
        self._handle = created.client
        self._closed = False
        name = self._api.call("Client_PlatformName", "reading the platform name", client=self._handle)
        self.platform_name: str = ffi.unpack(name.platform_name, name.platform_name_size).decode()
        version = self._api.call(
            "Client_PlatformVersion", "reading the platform version", client=self._handle
        )
        self.platform_version: str = ffi.unpack(
            version.platform_version, version.platform_version_size
        ).decode()
        listed = self._api.call(
            "Client_AddressableDevices", "listing devices", client=self._handle
        )
        self.devices: list[Device] = [
            self._describe_device(listed.addressable_devices[i])
            for i in range(listed.num_addressable_devices)
        ]

    @property
    def api_version(self) -> tuple[int, int]:
        """The PJRT C API version the plugin reports (major, minor)."""
        return self._api.version

    def _describe_device(self, handle) -> Device:
        api = self._api
        desc = api.call("Device_GetDescription", "describing a device", device=handle).device_description
        ident = api.call("DeviceDescription_Id", "reading a device id", device_description=desc).id
        kind = api.call("DeviceDescription_Kind", "reading a device kind", device_description=desc)
        return Device(ident, ffi.unpack(kind.device_kind, kind.device_kind_size).decode(), handle)

    def _device_of(self, handle) -> Device:
        for device in self.devices:
            if device.handle == handle:
                return device
        return self._describe_device(handle)

    def _live(self):
        if self._closed:
            raise BackendError("this Client is closed")
        return self._handle

    def _own(self, child: DeviceBuffer | Executable) -> None:
        self._owned.add(child)

    def compile(self, mlir_text: str, num_replicas: int = 1, scheduler: str | None = None,
                overrides: dict[str, bool | int | float | str] | None = None) -> Executable:
        """Compile StableHLO text for ``num_replicas`` replicas (one per device). ``scheduler``
        (a name in SCHEDULERS) orders its ops, unless the user's XLA_FLAGS choose one; ``overrides``
        are further XLA DebugOptions for this executable (see compile_options)."""
        options, scheduler = self.build_options(num_replicas, scheduler, overrides)
        return self.compile_with_options(mlir_text, options, num_replicas, scheduler)

    def build_options(self, num_replicas: int = 1, scheduler: str | None = None,
                      overrides: dict[str, bool | int | float | str] | None = None) -> tuple[bytes, str | None]:
        """The serialized CompileOptionsProto :meth:`compile` passes for these arguments, and the
        scheduler the executable gets ("XLA_FLAGS" where the user's flags choose it)."""
        self._live()
        if num_replicas < 1 or num_replicas > len(self.devices):
            raise BackendError(
                f"num_replicas={num_replicas}, but the {self.platform_name} client has "
                f"{len(self.devices)} device(s)"
            )
        overrides = dict(overrides or {})
        if scheduler is not None:
            if scheduler not in SCHEDULERS:
                raise BackendError(f"XLA scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
            if scheduler_in_xla_flags():
                scheduler = "XLA_FLAGS"
            else:
                overrides[_SCHEDULER_OPTION] = SCHEDULERS[scheduler]
        assignment = [[d.id] for d in self.devices[:num_replicas]] if num_replicas > 1 else None
        return compile_options(num_replicas, 1, assignment, overrides), scheduler

    def compile_with_options(self, mlir_text: str, options: bytes, num_replicas: int,
                             scheduler: str | None) -> Executable:
        """Compile with options from :meth:`build_options` (for ``num_replicas``, ``scheduler``)."""
        handle = self._live()
        code = mlir_text.encode()
        code_c = ffi.new("char[]", code)
        fmt = b"mlir"
        fmt_c = ffi.new("char[]", fmt)
        program = ffi.new("PJRT_Program*")
        program.struct_size = _struct_size("PJRT_Program")
        program.code, program.code_size = code_c, len(code)
        program.format, program.format_size = fmt_c, len(fmt)
        options_c = ffi.new("char[]", options)
        compiled = self._api.call(
            "Client_Compile",
            "compiling StableHLO",
            client=handle,
            program=program,
            compile_options=options_c,
            compile_options_size=len(options),
        )
        exe = Executable(self, compiled.executable, parse_main_signature(mlir_text), num_replicas)
        exe.scheduler = scheduler
        return exe

    def deserialize(self, data: bytes, mlir_text: str, options: bytes, num_replicas: int,
                    scheduler: str | None) -> Executable:
        """Load what :meth:`Executable.serialize` wrote, compiled from ``mlir_text`` with ``options``
        (from :meth:`build_options`; passed again so the device assignment is this client's). The
        plugin must be the one that serialized it (PJRT promises nothing across versions); bytes it
        cannot read are a BackendError, but its checks are not a checksum: verify them first."""
        handle = self._live()
        data_c = ffi.new("char[]", data)
        options_c = ffi.new("char[]", options)
        with stderr_without(_HARMLESS_LOAD_LOG):
            loaded = self._api.call(
                "Executable_DeserializeAndLoad",
                "loading a serialized executable",
                client=handle,
                serialized_executable=data_c,
                serialized_executable_size=len(data),
                overridden_serialized_compile_options=options_c,
                overridden_serialized_compile_options_size=len(options),
            )
        exe = Executable(self, loaded.loaded_executable, parse_main_signature(mlir_text), num_replicas)
        exe.scheduler = scheduler
        return exe

    def register_host_call(self, name: str, fn: host_calls.HostFunction) -> None:
        """The custom call `name` calls `fn` on the host in every program this process compiles."""
        host_calls.register(self._api, name, fn)

    def to_device(self, array: np.ndarray, device: int = 0, borrow: bool = False) -> DeviceBuffer:
        """Copy a host array to ``self.devices[device]``.

        ``borrow=True`` (a one-execute input: the execute that takes it consumes it): on CPU an
        aligned array is aliased, not copied; the buffer keeps it alive until PJRT is done with
        it, and the caller must not write to ``array`` while the buffer lives. On CPU every other
        array is copied inline (see _SEMANTICS)."""
        handle = self._live()
        if not 0 <= device < len(self.devices):
            raise BackendError(f"device {device} does not exist; this client has {len(self.devices)}")
        host = np.asarray(array)
        if not host.dtype.isnative:  # PJRT buffers are in the host's byte order
            host = host.astype(host.dtype.newbyteorder("="))
        if not host.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            host = host.copy(order="C")
        cpu = self.platform_name == "cpu"
        one_execute, borrow = borrow, borrow and cpu and host.nbytes > 0 and host.ctypes.data % _ZERO_COPY_ALIGN == 0
        semantics = (_IMMUTABLE_ZERO_COPY if borrow else _IMMUTABLE_ONLY_DURING_CALL if cpu
                     else _IMMUTABLE_UNTIL_TRANSFER_COMPLETES)
        buffer_type = _buffer_type(host.dtype)
        dims = ffi.new("int64_t[]", list(host.shape) or 1)

        def doing() -> str:
            return f"copying a {host.shape} {host.dtype} array to the device"

        args = self._api.call(
            "Client_BufferFromHostBuffer",
            doing,
            client=handle,
            data=ffi.from_buffer(host),
            type=buffer_type,
            dims=dims,
            num_dims=host.ndim,
            host_buffer_semantics=semantics,
            device=self.devices[device].handle,
        )
        buffer = DeviceBuffer(self, args.buffer, host.shape, host.dtype)  # owned from here, even if the wait fails
        buffer._one_execute = one_execute
        if borrow:
            # PJRT is done with `host` only once the buffer is gone: the buffer holds both.
            buffer._borrowed = (host, args.done_with_host_buffer)
        else:
            self._api.await_event(args.done_with_host_buffer, doing)  # `host` must live until now
        return buffer

    def close(self) -> None:
        """Free every buffer and executable made here, then the PJRT client; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._api.forked:  # the parent's client (a forked child's exit closes it): nothing here to free
            return
        for child in list(self._owned):
            if isinstance(child, DeviceBuffer):
                child._release("belongs to a closed Client")
        for child in list(self._owned):
            if isinstance(child, Executable):
                child._release()
        handle, self._handle = self._handle, None
        self._api.call("Client_Destroy", "destroying the PJRT client", client=handle)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finalizer
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.devices)} device(s)"
        return f"Client({self.platform_name!r}, {state}, plugin={self.plugin_path!r})"


_DEFAULT: Client | None = None
_DEFAULT_LOCK = threading.Lock()


def default_client() -> Client:
    """A process-wide Client on :func:`find_plugin`'s plugin, made on first use: one device on a
    CPU plugin (see :func:`_one_device_client`), the plugin's own devices otherwise."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT._closed:
            _DEFAULT = _one_device_client()
        return _DEFAULT


def _one_device_client() -> Client:
    """The XLA CPU plugin defaults to 4 devices and sizes its compute thread pool with them: on a
    2-core machine 4 spinning threads cost a single-device step 13% (jax's own mnist-mlp step through
    this binding: 1.76 ms at 4 devices, 1.55 at 1; jax.jit 1.54, whose client has one device). A
    plugin that takes no `cpu_device_count` (a GPU one refuses the unknown option) keeps its own."""
    try:
        return Client(None, {"cpu_device_count": 1})
    except BackendError as exc:
        if getattr(exc, "code", None) != "INVALID_ARGUMENT":
            raise
        return Client()


_BY_DEVICE_COUNT: dict[int, Client] = {}


def client_with_devices(count: int) -> Client:
    """A process-wide Client with at least `count` devices. On the CPU plugin it has exactly
    `count` (its `cpu_device_count` create option; the plugin's own default is 4); any other
    plugin has the devices it has, and too few is a BackendError."""
    if count < 1:
        raise BackendError(f"a client needs at least one device, not {count}")
    base = default_client()
    if len(base.devices) == count or (base.platform_name != "cpu" and len(base.devices) > count):
        return base
    if base.platform_name != "cpu":
        raise BackendError(f"{count} devices asked for, but the {base.platform_name} plugin {base.plugin_path} "
                           f"has {len(base.devices)}")
    with _DEFAULT_LOCK:
        client = _BY_DEVICE_COUNT.get(count)
        if client is None or client._closed:
            client = _BY_DEVICE_COUNT[count] = Client(base.plugin_path, {"cpu_device_count": count})
        return client


@atexit.register
def _close_default_client() -> None:
    for client in _BY_DEVICE_COUNT.values():
        client.close()
    if _DEFAULT is not None:
        _DEFAULT.close()
