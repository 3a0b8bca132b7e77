"""Arrays on a device (:class:`DeviceBuffer`) and the devices themselves."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hloforge.backends.xla.pjrt.api import Api, _dtype_of
from hloforge.backends.xla.pjrt.c_api import _struct_size, ffi
from hloforge.core.errors import BackendError


class Owner(Protocol):
    """What a buffer or an executable uses of the :class:`~.client.Client` that owns it (the client
    module imports this one, so the class is not named here)."""

    _api: Api
    platform_name: str

    def _own(self, child: Any) -> None: ...

    def _device_of(self, handle: Any) -> Device: ...

    def to_device(self, array: np.ndarray, device: int = 0, borrow: bool = False) -> DeviceBuffer: ...


# ------------------------------------------------------------------ devices ---


@dataclass(frozen=True)
class Device:
    """An addressable device of a Client."""

    id: int
    kind: str
    handle: object = field(repr=False, compare=False)


# ------------------------------------------------------------------ buffers ---


_DONATED = ("was donated to an executable as argument {i} and holds no data any more "
            "(pass keep=[{i}] to execute() to keep an input alive)")


class DeviceBuffer:
    """An array on a device. Invalid once deleted, donated, or its Client is closed."""

    def __init__(self, client: Owner, handle, shape: tuple[int, ...] | None = None,
                 dtype: np.dtype | None = None):
        """`shape`/`dtype`, when the caller already knows them, save two PJRT calls per buffer."""
        self._client = client
        self._handle = handle
        self._gone: str | None = None  # why the buffer can no longer be used ({i}: _gone_arg)
        self._gone_arg: int | None = None
        api = client._api
        if shape is None:
            dims = api.call("Buffer_Dimensions", "reading buffer dimensions", buffer=handle)
            shape = tuple(ffi.unpack(dims.dims, dims.num_dims))
        if dtype is None:
            etype = api.call("Buffer_ElementType", "reading buffer element type", buffer=handle)
            dtype = _dtype_of(etype.type)
        self.shape: tuple[int, ...] = shape
        self.dtype: np.dtype = dtype
        self._computed = False  # an execute output whose completion event was awaited
        self._borrowed: tuple[np.ndarray, object] | None = None  # (host array, PJRT's done event)
        self._one_execute = False  # made with borrow=True: the next execute consumes it
        client._own(self)

    def _live(self, purpose: str):
        """The PJRT_Buffer*, or a BackendError saying why it is gone."""
        if self._gone is not None:
            raise BackendError(f"{self._describe()} {self._why_gone()}; cannot {purpose}")
        return self._handle

    def _why_gone(self) -> str:
        return self._gone.format(i=self._gone_arg) if self._gone and self._gone_arg is not None else self._gone or ""

    def _describe(self) -> str:
        dims = "x".join(map(str, self.shape)) or "scalar"
        return f"DeviceBuffer({dims} {self.dtype})"

    @property
    def is_deleted(self) -> bool:
        return self._gone is not None

    @property
    def device(self) -> Device:
        args = self._client._api.call(
            "Buffer_Device", "reading a buffer's device", buffer=self._live("read its device")
        )
        return self._client._device_of(args.device)

    def _host_memory(self) -> np.ndarray:
        """The buffer's own memory as a numpy array (on the CPU a buffer is host memory). Dense
        row-major is right for a rank ≤ 1 array, and for a buffer made from a host array (PJRT's
        default layout); valid while the buffer lives."""
        ptr = self._client._api.call("Buffer_UnsafePointer", "locating a buffer", buffer=self._live("map it"))
        size = self.dtype.itemsize * math.prod(self.shape)
        return np.frombuffer(ffi.buffer(ffi.cast("char*", ptr.buffer_pointer), size), self.dtype).reshape(self.shape)

    def to_numpy(self) -> np.ndarray:
        handle = self._live("copy it to the host")
        if self._computed and len(self.shape) <= 1 and self._client.platform_name == "cpu":
            # A CPU buffer is host memory and a rank ≤ 1 array has one layout: copy it directly,
            # skipping the transfer thread's round trip (~40 µs for a scalar loss).
            return self._host_memory().copy()
        out = np.empty(self.shape, self.dtype)
        # Ask for a dense row-major host copy, whatever the device layout is.
        minor_to_major = ffi.new("int64_t[]", list(reversed(range(len(self.shape)))))
        layout = ffi.new("PJRT_Buffer_MemoryLayout*")
        layout.struct_size = _struct_size("PJRT_Buffer_MemoryLayout")
        layout.type = _LAYOUT_TILED
        layout.tiled.struct_size = _struct_size("PJRT_Buffer_MemoryLayout_Tiled")
        layout.tiled.minor_to_major = minor_to_major
        layout.tiled.minor_to_major_size = len(self.shape)
        api = self._client._api

        def doing() -> str:
            return f"copying a {self._describe()} to the host"

        args = api.call(
            "Buffer_ToHostBuffer",
            doing,
            src=handle,
            host_layout=layout,
            dst=ffi.from_buffer(out),
            dst_size=out.nbytes,
        )
        api.await_event(args.event, doing)
        return out

    def delete(self) -> None:
        """Free the device memory now; idempotent."""
        self._release("was deleted")

    def _release(self, reason: str, arg: int | None = None) -> None:
        """Destroy the PJRT buffer; `reason` says why, with `{i}` standing for `arg` (formatted
        only if someone asks: an execute releases every donated input)."""
        if self._gone is not None:
            return
        self._gone, self._gone_arg = reason, arg
        handle, self._handle = self._handle, None
        self._client._api.destroy_buffer(handle)
        if self._borrowed is not None:  # the host memory may go only when PJRT says it is done
            done, self._borrowed = self._borrowed[1], None
            self._client._api.await_event(done, "releasing a borrowed host array")

    def __del__(self) -> None:
        try:
            self._release("was garbage-collected")
        except Exception:  # never raise from a finalizer (e.g. during interpreter exit)
            pass

    def __repr__(self) -> str:
        state = f", {self._why_gone()}" if self._gone else ""
        return self._describe()[:-1] + state + ")"


_LAYOUT_TILED = ffi.typeof("PJRT_Buffer_MemoryLayout_Type").relements[
    "PJRT_Buffer_MemoryLayout_Type_Tiled"
]
