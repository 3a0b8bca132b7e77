"""cffi ABI-mode binding of the PJRT C API: load an XLA plugin, compile StableHLO, run it.

No C compiler is involved: the declarations below are handed to ``ffi.cdef`` and the
plugin is opened with ``ffi.dlopen``. Every ``PJRT_Error*`` becomes a
:class:`~hloforge.core.errors.BackendError` carrying the plugin's message and code.

Ownership: a :class:`Client` owns every :class:`Executable` and :class:`DeviceBuffer`
made through it and frees them, before the PJRT client itself, in :meth:`Client.close`.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import math
import os
import re
import struct
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cffi
import numpy as np

from hloforge.backends.host_memory import retain_freed_host_memory
from hloforge.core.errors import BackendError

# ------------------------------------------------------------ C declarations ---
# Transcribed from xla/pjrt/c/pjrt_c_api.h at PJRT_API_MINOR 94 (openxla/xla
# 0882740a). Argument structs are declared whole, in header order, so cffi lays them
# out as a C compiler would. PJRT only ever appends fields; a plugin rejects a
# struct_size smaller than its own for that struct ("expected N, got M") and ignores
# the tail of a larger one. Every struct used here matches the 0.106 CPU plugin.
# PJRT_Api lists every function pointer in header order; the ones hloforge does not
# call are void* placeholders that keep the later offsets right.

#: PJRT_API_MINOR of the header the declarations below were transcribed from.
HEADER_MINOR = 94

# Function-pointer slots of PJRT_Api, in header order. A name listed in TYPED
# gets its real signature; the rest are placeholders.
API_SLOTS = """
Error_Destroy Error_Message Error_GetCode
Plugin_Initialize Plugin_Attributes
Event_Destroy Event_IsReady Event_Error Event_Await Event_OnReady
Client_Create Client_Destroy Client_PlatformName Client_ProcessIndex
Client_PlatformVersion Client_Devices Client_AddressableDevices
Client_LookupDevice Client_LookupAddressableDevice Client_AddressableMemories
Client_Compile Client_DefaultDeviceAssignment Client_BufferFromHostBuffer
DeviceDescription_Id DeviceDescription_ProcessIndex DeviceDescription_Attributes
DeviceDescription_Kind DeviceDescription_DebugString DeviceDescription_ToString
Device_GetDescription Device_IsAddressable Device_LocalHardwareId
Device_AddressableMemories Device_DefaultMemory Device_MemoryStats
Memory_Id Memory_Kind Memory_DebugString Memory_ToString Memory_AddressableByDevices
Executable_Destroy Executable_Name Executable_NumReplicas Executable_NumPartitions
Executable_NumOutputs Executable_SizeOfGeneratedCodeInBytes
Executable_GetCostAnalysis Executable_OutputMemoryKinds
Executable_OptimizedProgram Executable_Serialize
LoadedExecutable_Destroy LoadedExecutable_GetExecutable
LoadedExecutable_AddressableDevices LoadedExecutable_Delete
LoadedExecutable_IsDeleted LoadedExecutable_Execute
Executable_DeserializeAndLoad LoadedExecutable_Fingerprint
Buffer_Destroy Buffer_ElementType Buffer_Dimensions Buffer_UnpaddedDimensions
Buffer_DynamicDimensionIndices Buffer_GetMemoryLayout Buffer_OnDeviceSizeInBytes
Buffer_Device Buffer_Memory Buffer_Delete Buffer_IsDeleted Buffer_CopyToDevice
Buffer_ToHostBuffer Buffer_IsOnCpu Buffer_ReadyEvent Buffer_UnsafePointer
Buffer_IncreaseExternalReferenceCount Buffer_DecreaseExternalReferenceCount
Buffer_OpaqueDeviceMemoryDataPointer
CopyToDeviceStream_Destroy CopyToDeviceStream_AddChunk
CopyToDeviceStream_TotalBytes CopyToDeviceStream_GranuleSize
CopyToDeviceStream_CurrentBytes
TopologyDescription_Create TopologyDescription_Destroy
TopologyDescription_PlatformName TopologyDescription_PlatformVersion
TopologyDescription_GetDeviceDescriptions TopologyDescription_Serialize
TopologyDescription_Attributes
Compile
Executable_OutputElementTypes Executable_OutputDimensions
Buffer_CopyToMemory Client_CreateViewOfDeviceBuffer Executable_Fingerprint
Client_TopologyDescription Executable_GetCompiledMemoryStats Memory_Kind_Id
ExecuteContext_Create ExecuteContext_Destroy Buffer_CopyRawToHost
AsyncHostToDeviceTransferManager_Destroy AsyncHostToDeviceTransferManager_TransferData
Client_CreateBuffersForAsyncHostToDevice
AsyncHostToDeviceTransferManager_RetrieveBuffer AsyncHostToDeviceTransferManager_Device
AsyncHostToDeviceTransferManager_BufferCount AsyncHostToDeviceTransferManager_BufferSize
AsyncHostToDeviceTransferManager_SetBufferError
AsyncHostToDeviceTransferManager_AddMetadata
Client_DmaMap Client_DmaUnmap Client_CreateUninitializedBuffer
Client_UpdateGlobalProcessInfo TopologyDescription_Deserialize
Client_CreateAliasBuffer Client_FulfillAliasBuffer
LoadedExecutable_GetDeviceAssignment Client_CreateErrorBuffer
AsyncHostToDeviceTransferManager_TransferLiteral Buffer_CopyRawToHostFuture
Device_PoisonExecution Device_CreateAsyncTrackingEvent AsyncTrackingEvent_Destroy
Executable_GetCompileOptions Buffer_DonateWithControlDependency
Event_Create Event_Set Device_GetAttributes
""".split()

# The functions hloforge calls; each takes a ``PJRT_<name>_Args*`` declared below.
# Error_Destroy and Error_Message return void, the rest PJRT_Error*.
TYPED = (
    "Error_Destroy Error_Message Error_GetCode Plugin_Initialize Plugin_Attributes "
    "Event_Destroy Event_Await Client_Create Client_Destroy Client_PlatformName "
    "Client_PlatformVersion Client_AddressableDevices Client_Compile "
    "Client_BufferFromHostBuffer DeviceDescription_Id DeviceDescription_Kind "
    "Device_GetDescription Executable_Destroy Executable_NumOutputs "
    "LoadedExecutable_Destroy LoadedExecutable_GetExecutable LoadedExecutable_Execute "
    "Buffer_Destroy Buffer_ElementType Buffer_Dimensions Buffer_Delete "
    "Buffer_IsDeleted Buffer_ToHostBuffer Buffer_Device Buffer_UnsafePointer"
).split()

_TYPES = r"""
typedef struct PJRT_Extension_Base PJRT_Extension_Base;
typedef struct PJRT_Error PJRT_Error;
typedef struct PJRT_Event PJRT_Event;
typedef struct PJRT_Client PJRT_Client;
typedef struct PJRT_Device PJRT_Device;
typedef struct PJRT_Memory PJRT_Memory;
typedef struct PJRT_DeviceDescription PJRT_DeviceDescription;
typedef struct PJRT_Executable PJRT_Executable;
typedef struct PJRT_LoadedExecutable PJRT_LoadedExecutable;
typedef struct PJRT_Buffer PJRT_Buffer;
typedef struct PJRT_ExecuteContext PJRT_ExecuteContext;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  int major_version;
  int minor_version;
} PJRT_Api_Version;

typedef enum {
  PJRT_Error_Code_OK = 0, PJRT_Error_Code_CANCELLED = 1, PJRT_Error_Code_UNKNOWN = 2,
  PJRT_Error_Code_INVALID_ARGUMENT = 3, PJRT_Error_Code_DEADLINE_EXCEEDED = 4,
  PJRT_Error_Code_NOT_FOUND = 5, PJRT_Error_Code_ALREADY_EXISTS = 6,
  PJRT_Error_Code_PERMISSION_DENIED = 7, PJRT_Error_Code_RESOURCE_EXHAUSTED = 8,
  PJRT_Error_Code_FAILED_PRECONDITION = 9, PJRT_Error_Code_ABORTED = 10,
  PJRT_Error_Code_OUT_OF_RANGE = 11, PJRT_Error_Code_UNIMPLEMENTED = 12,
  PJRT_Error_Code_INTERNAL = 13, PJRT_Error_Code_UNAVAILABLE = 14,
  PJRT_Error_Code_DATA_LOSS = 15, PJRT_Error_Code_UNAUTHENTICATED = 16
} PJRT_Error_Code;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Error* error;
} PJRT_Error_Destroy_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  const char* message;
  size_t message_size;
} PJRT_Error_Message_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  PJRT_Error_Code code;
} PJRT_Error_GetCode_Args;

typedef enum {
  PJRT_NamedValue_kString = 0, PJRT_NamedValue_kInt64, PJRT_NamedValue_kInt64List,
  PJRT_NamedValue_kFloat, PJRT_NamedValue_kBool
} PJRT_NamedValue_Type;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const char* name;
  size_t name_size;
  PJRT_NamedValue_Type type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;
} PJRT_NamedValue;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
} PJRT_Plugin_Initialize_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* attributes;
  size_t num_attributes;
} PJRT_Plugin_Attributes_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
} PJRT_Event_Destroy_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
} PJRT_Event_Await_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  void* kv_get_callback;
  void* kv_get_user_arg;
  void* kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client;
  void* kv_try_get_callback;
  void* kv_try_get_user_arg;
} PJRT_Client_Create_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
} PJRT_Client_Destroy_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_name;
  size_t platform_name_size;
} PJRT_Client_PlatformName_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_version;
  size_t platform_version_size;
} PJRT_Client_PlatformVersion_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
} PJRT_Client_AddressableDevices_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  char* code;
  size_t code_size;
  const char* format;
  size_t format_size;
} PJRT_Program;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const PJRT_Program* program;
  const char* compile_options;
  size_t compile_options_size;
  PJRT_LoadedExecutable* executable;
} PJRT_Client_Compile_Args;

typedef enum {
  PJRT_Buffer_Type_INVALID, PJRT_Buffer_Type_PRED,
  PJRT_Buffer_Type_S8, PJRT_Buffer_Type_S16, PJRT_Buffer_Type_S32, PJRT_Buffer_Type_S64,
  PJRT_Buffer_Type_U8, PJRT_Buffer_Type_U16, PJRT_Buffer_Type_U32, PJRT_Buffer_Type_U64,
  PJRT_Buffer_Type_F16, PJRT_Buffer_Type_F32, PJRT_Buffer_Type_F64, PJRT_Buffer_Type_BF16,
  PJRT_Buffer_Type_C64, PJRT_Buffer_Type_C128
} PJRT_Buffer_Type;

typedef enum {
  PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
  PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
  PJRT_HostBufferSemantics_kImmutableZeroCopy,
  PJRT_HostBufferSemantics_kMutableZeroCopy
} PJRT_HostBufferSemantics;

typedef enum {
  PJRT_Buffer_MemoryLayout_Type_Tiled = 0,
  PJRT_Buffer_MemoryLayout_Type_Strides
} PJRT_Buffer_MemoryLayout_Type;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const int64_t* minor_to_major;
  size_t minor_to_major_size;
  const int64_t* tile_dims;
  const size_t* tile_dim_sizes;
  size_t num_tiles;
} PJRT_Buffer_MemoryLayout_Tiled;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const int64_t* byte_strides;
  size_t num_byte_strides;
} PJRT_Buffer_MemoryLayout_Strides;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  union {
    PJRT_Buffer_MemoryLayout_Tiled tiled;
    PJRT_Buffer_MemoryLayout_Strides strides;
  };
  PJRT_Buffer_MemoryLayout_Type type;
} PJRT_Buffer_MemoryLayout;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const void* data;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;
  size_t num_byte_strides;
  PJRT_HostBufferSemantics host_buffer_semantics;
  PJRT_Device* device;
  PJRT_Memory* memory;
  PJRT_Buffer_MemoryLayout* device_layout;
  PJRT_Event* done_with_host_buffer;
  PJRT_Buffer* buffer;
} PJRT_Client_BufferFromHostBuffer_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int id;
} PJRT_DeviceDescription_Id_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* device_kind;
  size_t device_kind_size;
} PJRT_DeviceDescription_Kind_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_DeviceDescription* device_description;
} PJRT_Device_GetDescription_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
} PJRT_Executable_Destroy_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
} PJRT_Executable_NumOutputs_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
} PJRT_LoadedExecutable_Destroy_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable;
} PJRT_LoadedExecutable_GetExecutable_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  void** send_callbacks;
  void** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  PJRT_ExecuteContext* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
} PJRT_ExecuteOptions;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists;
  size_t num_devices;
  size_t num_args;
  PJRT_Buffer** const* output_lists;
  PJRT_Event** device_complete_events;
  PJRT_Device* execute_device;
} PJRT_LoadedExecutable_Execute_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
} PJRT_Buffer_Destroy_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Buffer_Type type;
} PJRT_Buffer_ElementType_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const int64_t* dims;
  size_t num_dims;
} PJRT_Buffer_Dimensions_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
} PJRT_Buffer_Delete_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  bool is_deleted;
} PJRT_Buffer_IsDeleted_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  uintptr_t buffer_pointer;
} PJRT_Buffer_UnsafePointer_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* src;
  PJRT_Buffer_MemoryLayout* host_layout;
  void* dst;
  size_t dst_size;
  PJRT_Event* event;
} PJRT_Buffer_ToHostBuffer_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Device* device;
} PJRT_Buffer_Device_Args;
"""

_VOID_RESULT = {"Error_Destroy", "Error_Message"}


def _api_struct() -> str:
    slots = []
    for name in API_SLOTS:
        if name in TYPED:
            result = "void" if name in _VOID_RESULT else "PJRT_Error*"
            slots.append(f"  {result} (*PJRT_{name})(PJRT_{name}_Args* args);")
        else:
            slots.append(f"  void* PJRT_{name};")
    return (
        "typedef struct {\n  size_t struct_size;\n  PJRT_Extension_Base* extension_start;\n"
        "  PJRT_Api_Version pjrt_api_version;\n" + "\n".join(slots) + "\n} PJRT_Api;\n"
        "const PJRT_Api* GetPjrtApi(void);\n"
    )


CDEF = _TYPES + _api_struct()
ffi = cffi.FFI()
ffi.cdef(CDEF)

_BUFFER_TYPE_CODES: dict[str, int] = ffi.typeof("PJRT_Buffer_Type").relements
_ERROR_CODE_NAMES: dict[int, str] = {
    code: name.removeprefix("PJRT_Error_Code_")
    for name, code in ffi.typeof("PJRT_Error_Code").relements.items()
}


@functools.cache
def _struct_size(ctype: str) -> int:
    """The header's PJRT_STRUCT_SIZE: offset of the last field plus that field's size."""
    _, last = ffi.typeof(ctype).fields[-1]
    return last.offset + ffi.sizeof(last.type)


# The plugin's PJRT_Api must reach at least as far as the last slot hloforge calls.
_API_SIZE_NEEDED = max(
    ffi.offsetof("PJRT_Api", f"PJRT_{name}") + ffi.sizeof("void*") for name in TYPED
)

# -------------------------------------------------------------------- dtypes ---

# numpy dtype <-> PJRT_Buffer_Type <-> MLIR element type: the one table of that fact.
_DTYPES: list[tuple[np.dtype, str, str]] = [
    (np.dtype(np.bool_), "PRED", "i1"),
    (np.dtype(np.int8), "S8", "i8"),
    (np.dtype(np.int16), "S16", "i16"),
    (np.dtype(np.int32), "S32", "i32"),
    (np.dtype(np.int64), "S64", "i64"),
    (np.dtype(np.uint8), "U8", "ui8"),
    (np.dtype(np.uint16), "U16", "ui16"),
    (np.dtype(np.uint32), "U32", "ui32"),
    (np.dtype(np.uint64), "U64", "ui64"),
    (np.dtype(np.float16), "F16", "f16"),
    (np.dtype(np.float32), "F32", "f32"),
    (np.dtype(np.float64), "F64", "f64"),
    (np.dtype(np.complex64), "C64", "complex<f32>"),
    (np.dtype(np.complex128), "C128", "complex<f64>"),
]
try:  # numpy has no bfloat16; ml_dtypes (a jax dependency) supplies it when present.
    import ml_dtypes

    _DTYPES.append((np.dtype(ml_dtypes.bfloat16), "BF16", "bf16"))
except ImportError:  # pragma: no cover - depends on the environment
    pass

_CODE_OF_DTYPE = {dt: _BUFFER_TYPE_CODES[f"PJRT_Buffer_Type_{name}"] for dt, name, _ in _DTYPES}
_DTYPE_OF_CODE = {code: dt for dt, code in _CODE_OF_DTYPE.items()}
_DTYPE_OF_MLIR = {mlir: dt for dt, _, mlir in _DTYPES}


def _buffer_type(dtype: np.dtype) -> int:
    code = _CODE_OF_DTYPE.get(dtype)
    if code is None:
        supported = ", ".join(str(dt) for dt in _CODE_OF_DTYPE)
        raise BackendError(f"dtype {dtype} is not supported by the XLA backend (supported: {supported})")
    return code


def _dtype_of(code: int) -> np.dtype:
    dtype = _DTYPE_OF_CODE.get(code)
    if dtype is None:
        name = ffi.typeof("PJRT_Buffer_Type").elements.get(code, str(code))
        raise BackendError(f"the XLA backend has no numpy dtype for buffer element type {name}")
    return dtype


# ----------------------------------------------------------------------- Api ---


# What a PJRT call was doing, for its error message: a string, or a function that makes it (the hot
# path's messages name shapes; formatting them on every call would cost more than the call).
Doing = str | Callable[[], str]


@functools.cache
def _args_type(name: str) -> tuple[object, int]:
    """The cffi pointer type of ``PJRT_<name>_Args`` and its struct_size (the hot path asks often)."""
    ctype = f"PJRT_{name}_Args"
    return ffi.typeof(ctype + "*"), _struct_size(ctype)


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
        self.path = path
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
        self.attributes = self._plugin_attributes()

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

    def __repr__(self) -> str:
        return f"Api({self.path!r}, version={self.version[0]}.{self.version[1]})"


_APIS: dict[str, Api] = {}
_APIS_LOCK = threading.Lock()


SCHEDULER_ENV_VAR = "HLOFORGE_XLA_SCHEDULER"
# XLA's CPU HLO scheduler, chosen per executable (DebugOptions.xla_cpu_scheduler_type, passed as a
# compile option override). "concurrent" orders independent ops to run side by side; "sequential"
# (XLA's memory-optimized list schedule) runs them one after another.
SCHEDULERS = {"concurrent": "CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED",
              "sequential": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}
_SCHEDULER_OPTION = "xla_cpu_scheduler_type"
# XLA_FLAGS spellings that choose the scheduler for the whole process (the second is the deprecated one).
_SCHEDULER_FLAGS = ("--xla_cpu_scheduler_type", "--xla_cpu_enable_concurrency_optimized_scheduler")


def xla_scheduler() -> str | None:
    """The scheduler $HLOFORGE_XLA_SCHEDULER asks for; None (unset or "auto"): the backend's choice."""
    name = os.environ.get(SCHEDULER_ENV_VAR, "").strip() or "auto"
    if name != "auto" and name not in SCHEDULERS:
        raise BackendError(f"{SCHEDULER_ENV_VAR}={name!r}; expected auto, {', '.join(SCHEDULERS)}")
    return None if name == "auto" else name


def scheduler_in_xla_flags() -> bool:
    """Whether the user's XLA_FLAGS choose the scheduler (then they win over any per-executable choice)."""
    return any(flag in os.environ.get("XLA_FLAGS", "") for flag in _SCHEDULER_FLAGS)


def forced_scheduler() -> str | None:
    """The scheduler every executable of the process gets: "XLA_FLAGS" (the user's), a name from
    $HLOFORGE_XLA_SCHEDULER, or None (each executable's own, the backend's rule)."""
    return "XLA_FLAGS" if scheduler_in_xla_flags() else xla_scheduler()


def load_api(path: str) -> Api:
    """The process-wide Api for ``path``: PJRT plugins must be initialized only once."""
    # XLA logs every client option it applies at INFO to stderr; a user who wants it sets this to 0.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    key = os.path.realpath(path)
    with _APIS_LOCK:
        if key not in _APIS:
            _APIS[key] = Api(path)
        return _APIS[key]


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


# ---------------------------------------------------------- compile options ---
# xla.CompileOptionsProto, written in protobuf wire format by hand. Field numbers
# from xla/pjrt/proto/compile_options.proto and DeviceAssignmentProto (xla_data.proto).
_COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS = 3
_BUILD_DEVICE_ORDINAL = 1
_BUILD_NUM_REPLICAS = 4
_BUILD_NUM_PARTITIONS = 5
_BUILD_DEVICE_ASSIGNMENT = 9
_ASSIGNMENT_REPLICA_COUNT = 1
_ASSIGNMENT_COMPUTATION_COUNT = 2
_ASSIGNMENT_COMPUTATION_DEVICES = 3
_COMPUTATION_DEVICE_REPLICA_IDS = 1
_COMPILE_OPTIONS_ENV_OPTION_OVERRIDES = 7  # map<string, OptionOverrideProto>: DebugOptions by field name
_MAP_KEY, _MAP_VALUE = 1, 2
_OVERRIDE_STRING, _OVERRIDE_BOOL, _OVERRIDE_INT, _OVERRIDE_DOUBLE = 1, 2, 3, 4


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are ten-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _option_override(value: bool | int | float | str) -> bytes:
    """One OptionOverrideProto (its oneof picked by the Python type)."""
    if isinstance(value, bool):  # before int: bool is an int subclass
        return _int_field(_OVERRIDE_BOOL, int(value))
    if isinstance(value, int):
        return _int_field(_OVERRIDE_INT, value)
    if isinstance(value, float):
        return _varint(_OVERRIDE_DOUBLE << 3 | 1) + struct.pack("<d", value)
    if isinstance(value, str):
        return _bytes_field(_OVERRIDE_STRING, value.encode())
    raise BackendError(f"compile option value {value!r}: expected bool, int, float or str")


def compile_options(
    num_replicas: int = 1,
    num_partitions: int = 1,
    device_assignment: Sequence[Sequence[int]] | None = None,
    overrides: dict[str, bool | int | float | str] | None = None,
) -> bytes:
    """A serialized CompileOptionsProto.

    ``device_assignment[replica][partition]`` is a device id; without it XLA picks the
    default assignment for ``num_replicas`` x ``num_partitions``. ``overrides`` set XLA
    DebugOptions fields by name for this executable alone (jax's ``compiler_options``).
    """
    build = (
        _int_field(_BUILD_DEVICE_ORDINAL, -1)  # -1: not pinned to one device ordinal
        + _int_field(_BUILD_NUM_REPLICAS, num_replicas)
        + _int_field(_BUILD_NUM_PARTITIONS, num_partitions)
    )
    if device_assignment is not None:
        rows = [list(row) for row in device_assignment]
        if len(rows) != num_replicas or any(len(row) != num_partitions for row in rows):
            raise BackendError(
                f"device_assignment must be {num_replicas} replicas x {num_partitions} partitions, got {rows}"
            )
        assignment = _int_field(_ASSIGNMENT_REPLICA_COUNT, num_replicas) + _int_field(
            _ASSIGNMENT_COMPUTATION_COUNT, num_partitions
        )
        for partition in range(num_partitions):
            ids = b"".join(_varint(row[partition]) for row in rows)  # packed repeated int64
            assignment += _bytes_field(
                _ASSIGNMENT_COMPUTATION_DEVICES, _bytes_field(_COMPUTATION_DEVICE_REPLICA_IDS, ids)
            )
        build += _bytes_field(_BUILD_DEVICE_ASSIGNMENT, assignment)
    out = _bytes_field(_COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS, build)
    for name, value in sorted((overrides or {}).items()):
        entry = _bytes_field(_MAP_KEY, name.encode()) + _bytes_field(_MAP_VALUE, _option_override(value))
        out += _bytes_field(_COMPILE_OPTIONS_ENV_OPTION_OVERRIDES, entry)
    return out


# ------------------------------------------------------- signature of @main ---


@dataclass(frozen=True)
class ArgSpec:
    """One parameter of the module's ``@main``, as read from the StableHLO text."""

    shape: tuple[int | None, ...] | None  # None: not a ranked tensor; a None dim is dynamic
    dtype: np.dtype | None  # None: an element type hloforge has no dtype for
    aliasing_output: int | None  # `tf.aliasing_output`: the output this input is donated to

    def describe(self) -> str:
        if self.shape is None:
            return "a non-tensor value"
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{dims or 'scalar'} {self.dtype}"


_MAIN = re.compile(r"func\.func\s+(?:public\s+)?@main\s*\(")
_OPEN, _CLOSE = "(<[{", ")>]}"


def _split_top_level(text: str, start: int, stop_char: str) -> tuple[list[str], int]:
    """Split text[start:] at top-level commas up to the unmatched ``stop_char``."""
    parts, depth, begin, i = [], 0, start, start
    while i < len(text):
        ch = text[i]
        if ch == '"':  # skip string attribute values
            i = text.index('"', i + 1)
            while text[i - 1] == "\\":
                i = text.index('"', i + 1)
        elif text.startswith("->", i):
            i += 1
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0 and ch == stop_char:
                parts.append(text[begin:i])
                return [p for p in parts if p.strip()], i
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
        i += 1
    raise ValueError("unbalanced brackets")


def _tensor_spec(type_text: str) -> tuple[tuple[int | None, ...] | None, np.dtype | None]:
    type_text = type_text.strip()
    if not (type_text.startswith("tensor<") and type_text.endswith(">")):
        return None, None
    inner, _ = _split_top_level(type_text, len("tensor<"), ">")
    match = re.fullmatch(r"((?:(?:\d+|\?)x)*)(.+)", inner[0].strip())  # inner[1:] = encoding
    if match is None:
        return None, None
    dims = tuple(None if d == "?" else int(d) for d in match.group(1).split("x")[:-1])
    return dims, _DTYPE_OF_MLIR.get(match.group(2).strip())


def parse_main_signature(mlir_text: str) -> list[ArgSpec] | None:
    """The parameters of ``@main``; None when the text has no recognizable ``@main``."""
    match = _MAIN.search(mlir_text)
    if match is None:
        return None
    try:
        params, _ = _split_top_level(mlir_text, match.end(), ")")
        specs = []
        for param in params:
            # "%arg0: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}"
            _, _, rest = param.partition(":")
            type_text, _, attrs = rest.strip().partition(" {")
            if not attrs and "{" in type_text:
                type_text, _, attrs = type_text.partition("{")
            shape, dtype = _tensor_spec(type_text)
            alias = re.search(r"tf\.aliasing_output\s*=\s*(\d+)", attrs)
            specs.append(ArgSpec(shape, dtype, int(alias.group(1)) if alias else None))
        return specs
    except ValueError:
        return None


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

    def __init__(self, client: Client, handle, shape: tuple[int, ...] | None = None,
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

# -------------------------------------------------------------- executables ---


class Executable:
    """A compiled, loaded StableHLO module."""

    def __init__(self, client: Client, handle, signature: list[ArgSpec] | None, num_replicas: int):
        self._client = client
        self._handle = handle
        self._closed = False
        self.num_replicas = num_replicas
        self._output_types: list[tuple[tuple[int, ...], np.dtype]] | None = None
        self._passed: list[tuple[object, ...]] | None = None  # what the last accepted arguments were
        self._options: dict[tuple[int, ...], tuple[object, object]] = {}  # keep-set -> (options, its array)
        #: the parameters of @main as read from the text (None: not recognized)
        self.input_specs = signature
        #: the XLA scheduler it was compiled with (None: XLA's default; "XLA_FLAGS": the user's)
        self.scheduler: str | None = None
        #: indices of inputs the module donates (`tf.aliasing_output`)
        self.donated_inputs: tuple[int, ...] = tuple(
            i for i, spec in enumerate(signature or ()) if spec.aliasing_output is not None
        )
        api = client._api
        unloaded = api.call(
            "LoadedExecutable_GetExecutable", "reading the executable", loaded_executable=handle
        ).executable
        try:
            outputs = api.call("Executable_NumOutputs", "counting outputs", executable=unloaded)
            self.num_outputs: int = outputs.num_outputs
        finally:
            api.call("Executable_Destroy", "destroying an executable view", executable=unloaded)
        client._own(self)

    def execute(self, args: Sequence[DeviceBuffer], keep: Sequence[int] = ()) -> list[DeviceBuffer]:
        """Run on one device. Inputs the module donates are consumed unless listed in ``keep``."""
        if self.num_replicas != 1:
            raise BackendError(
                f"execute() runs one device, but this executable has {self.num_replicas} replicas"
            )
        return self._execute_per_device([list(args)], keep)[0]

    def execute_replicated(self, per_replica: Sequence[Sequence[DeviceBuffer]],
                           keep: Sequence[int] = ()) -> list[list[DeviceBuffer]]:
        """Run every replica at once: ``per_replica[r]`` are replica r's arguments, on
        ``client.devices[r]`` (where :meth:`Client.compile` placed replica r); returns each
        replica's outputs. Donation and ``keep`` apply to every replica alike."""
        if len(per_replica) != self.num_replicas:
            raise BackendError(f"this executable has {self.num_replicas} replica(s), got argument lists "
                               f"for {len(per_replica)}")
        return self._execute_per_device([list(args) for args in per_replica], keep)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Convenience: copy ``arrays`` in, execute, copy the results out."""
        inputs = [self._client.to_device(np.asarray(a)) for a in arrays]
        try:
            outputs = self.execute(inputs)
            try:
                return [out.to_numpy() for out in outputs]
            finally:
                for out in outputs:
                    out.delete()
        finally:
            for buf in inputs:
                buf.delete()

    def _options_keeping(self, keep: Sequence[int]):
        """PJRT_ExecuteOptions with ``keep`` not donated (PJRT only reads them: made once per keep set)."""
        key = tuple(sorted(set(keep)))
        made = self._options.get(key)
        if made is None:
            non_donatable = ffi.new("int64_t[]", list(key) or 1)
            options = ffi.new("PJRT_ExecuteOptions*")
            options.struct_size = _struct_size("PJRT_ExecuteOptions")
            options.non_donatable_input_indices = non_donatable
            options.num_non_donatable_input_indices = len(key)
            made = self._options[key] = (options, non_donatable)  # the options point into the array
        return made[0]

    def _check_args(self, args: Sequence[DeviceBuffer]) -> None:
        try:  # the steady state: the same kinds of live buffers as the last call that passed
            if [(b.__class__, b._client, b.shape, b.dtype, b._gone) for b in args] == self._passed:
                return
        except AttributeError:  # not a DeviceBuffer: the full check below names it
            pass
        self._check_args_fully(args)
        self._passed = [(b.__class__, b._client, b.shape, b.dtype, None) for b in args]

    def _check_args_fully(self, args: Sequence[DeviceBuffer]) -> None:
        specs = self.input_specs
        if specs is not None and len(args) != len(specs):
            raise BackendError(f"the executable takes {len(specs)} arguments, got {len(args)}")
        for i, buf in enumerate(args):
            if not isinstance(buf, DeviceBuffer):
                raise BackendError(
                    f"argument {i} is a {type(buf).__name__}, not a DeviceBuffer (use Client.to_device)"
                )
            if buf._client is not self._client:
                raise BackendError(f"argument {i} belongs to another Client")
            buf._live(f"pass it as argument {i}")
            spec = specs[i] if specs is not None else None
            if spec is None or spec.shape is None:
                continue
            shape_ok = len(spec.shape) == len(buf.shape) and all(
                want is None or want == got for want, got in zip(spec.shape, buf.shape, strict=False)
            )
            if not shape_ok or (spec.dtype is not None and spec.dtype != buf.dtype):
                raise BackendError(
                    f"argument {i} is {buf._describe()}, but the executable was compiled for "
                    f"{spec.describe()}"
                )

    def _execute_per_device(
        self, per_device: Sequence[Sequence[DeviceBuffer]], keep: Sequence[int] = ()
    ) -> list[list[DeviceBuffer]]:
        """Execute with one argument list per device; returns one output list per device."""
        api = self._client._api
        handle = self._live()
        num_args = len(per_device[0])
        for args in per_device:
            if len(args) != num_args:
                raise BackendError("every device needs the same number of arguments")
            self._check_args(args)
        bad = [k for k in keep if not 0 <= k < num_args]
        if bad:
            raise BackendError(f"keep={list(keep)} names inputs outside 0..{num_args - 1}")

        arg_arrays = [ffi.new("PJRT_Buffer*[]", [b._handle for b in args] or 1) for args in per_device]
        out_arrays = [ffi.new("PJRT_Buffer*[]", max(self.num_outputs, 1)) for _ in per_device]
        events = ffi.new("PJRT_Event*[]", len(per_device))
        options = self._options_keeping(keep)
        doing = "executing"
        ok = False
        try:
            api.call(
                "LoadedExecutable_Execute",
                doing,
                executable=handle,
                options=options,
                argument_lists=ffi.new("PJRT_Buffer*const*[]", arg_arrays),
                num_devices=len(per_device),
                num_args=num_args,
                output_lists=ffi.new("PJRT_Buffer**const[]", out_arrays),
                device_complete_events=events,
            )
            ok = True
        finally:
            self._mark_donated(per_device, keep, ask_pjrt=not ok)
            if not ok:
                self._release_borrowed(per_device)
        if self._output_types is None:  # fixed for a compiled executable: read once
            first = [DeviceBuffer(self._client, out_arrays[0][j]) for j in range(self.num_outputs)]
            self._output_types = [(b.shape, b.dtype) for b in first]
            outputs = [first] + [
                [DeviceBuffer(self._client, out[j], *t) for j, t in enumerate(self._output_types)]
                for out in out_arrays[1:]
            ]
        else:
            outputs = [
                [DeviceBuffer(self._client, out[j], *t) for j, t in enumerate(self._output_types)]
                for out in out_arrays
            ]
        try:
            # A borrowed input serves one execute: release it while the computation runs (PJRT frees
            # lazily once the computation is done with it), not on the step's critical path after it.
            self._release_borrowed(per_device)
            for i in range(len(per_device)):
                api.await_event(events[i], doing)
            for outs in outputs:
                for buf in outs:
                    buf._computed = True
        except BackendError:
            for outs in outputs:
                for buf in outs:
                    buf.delete()
            raise
        return outputs

    @staticmethod
    def _release_borrowed(per_device: Sequence[Sequence[DeviceBuffer]]) -> None:
        for args in per_device:
            for buf in args:
                if buf._one_execute:
                    buf._release("was borrowed for one execute and was consumed by it")

    def _mark_donated(self, per_device: Sequence[Sequence[DeviceBuffer]], keep: Sequence[int],
                      ask_pjrt: bool) -> None:
        """After a successful run the module's donated inputs (less `keep`) are consumed: release
        them. After a failed run, or when the signature was not recognised, ask PJRT which
        inputs it really deleted, so a failure never throws away live parameters."""
        api = self._client._api
        kept = set(keep)
        for args in per_device:
            if self.input_specs is not None and not ask_pjrt:
                candidates = [i for i in self.donated_inputs if i not in kept]
            else:
                candidates = [i for i, buf in enumerate(args) if buf._gone is None and
                              api.call("Buffer_IsDeleted", "checking donation", buffer=buf._handle).is_deleted]
            for i in candidates:
                args[i]._release(_DONATED, i)

    def _live(self):
        if self._closed:
            raise BackendError("this Executable is closed")
        return self._handle

    def close(self) -> None:
        """Free the executable; idempotent."""
        self._release()

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        handle, self._handle = self._handle, None
        self._client._api.call(
            "LoadedExecutable_Destroy", "destroying an executable", executable=handle
        )

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # never raise from a finalizer
            pass

    def __enter__(self) -> Executable:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------- client ---


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
        self._api = load_api(self.plugin_path)
        options, keep_alive = _named_values(create_options or {})
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
        handle = self._live()
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
        options = compile_options(num_replicas, 1, assignment, overrides)
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


# ---------------------------------------------------------- plugin discovery ---

PLUGIN_ENV_VAR = "HLOFORGE_PJRT_PLUGIN"


def _package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _fastatomstruct_cpu() -> str | None:
    if importlib.util.find_spec("fastatomstruct_xla_cpu") is None:
        return None
    import fastatomstruct_xla_cpu

    try:
        return fastatomstruct_xla_cpu.library_path()
    except FileNotFoundError:
        return None


def _file_in_package(module: str, *names: str) -> Callable[[], str | None]:
    """A finder for the first of ``names`` (glob patterns) inside ``module``'s directory."""

    def find() -> str | None:
        root = _package_dir(module)
        if root is None:
            return None
        for name in names:
            hits = sorted(root.rglob(name))
            if hits:
                return str(hits[0])
        return None

    return find


# In order of preference: CPU first (always works), then GPU packages.
_PLUGIN_FINDERS: list[tuple[str, Callable[[], str | None]]] = [
    ("fastatomstruct_xla_cpu", _fastatomstruct_cpu),
    ("lammps_jax_pjrt_cpu", _file_in_package("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so")),
    ("jax_plugins.xla_cuda12", _file_in_package("jax_plugins.xla_cuda12", "xla_cuda_plugin.so", "*.so")),
    ("jax_plugins.xla_cuda13", _file_in_package("jax_plugins.xla_cuda13", "xla_cuda_plugin.so", "*.so")),
    ("jax_plugins.xla_rocm7", _file_in_package("jax_plugins.xla_rocm7", "xla_rocm_plugin.so", "*.so")),
]


def find_plugin() -> str:
    """Path of the PJRT plugin to load: $HLOFORGE_PJRT_PLUGIN, else an installed package."""
    explicit = os.environ.get(PLUGIN_ENV_VAR)
    if explicit:
        if not os.path.isfile(explicit):
            raise BackendError(f"{PLUGIN_ENV_VAR}={explicit}: no such plugin file")
        return explicit
    for _, finder in _PLUGIN_FINDERS:
        path = finder()
        if path is not None:
            return path
    tried = ", ".join(name for name, _ in _PLUGIN_FINDERS)
    raise BackendError(
        f"no PJRT plugin found: {PLUGIN_ENV_VAR} is unset and none of these packages is "
        f"installed with its plugin: {tried}. Install the CPU one with "
        f"`pip install fastatomstruct-xla-cpu`, or set {PLUGIN_ENV_VAR} to a PJRT plugin .so"
    )
