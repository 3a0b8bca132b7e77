"""The PJRT C API's declarations, and XLA FFI's for host calls, as C text: CDEF, what the binding's
one cffi FFI (:mod:`.c_api`) is parsed from. This module imports nothing of hloforge's, so
``python scripts/parse_pjrt_declarations.py`` can load it alone and write :mod:`.parsed_declarations`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import cffi

# ------------------------------------------------------------ C declarations ---
# Transcribed from xla/pjrt/c/pjrt_c_api.h at PJRT_API_MINOR 94 (openxla/xla
# 0882740a). Argument structs are declared whole, in header order, so cffi lays them
# out as a C compiler would. PJRT only ever appends fields; a plugin rejects a
# struct_size smaller than its own for that struct ("expected N, got M") and ignores
# the tail of a larger one. Every struct used here matches the 0.106 CPU plugin.
# PJRT_Api lists every function pointer in header order; the ones hloforge does not
# call are void* placeholders that keep the later offsets right.
# Executable_Serialize / Executable_DeserializeAndLoad (the XLA cache's): 56 and 64 bytes at minor
# 94, which the 0.106 CPU plugin takes (it would name its own size if it wanted more).

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
    "Device_GetDescription Executable_Destroy Executable_NumOutputs Executable_Serialize "
    "Executable_DeserializeAndLoad LoadedExecutable_Destroy LoadedExecutable_GetExecutable LoadedExecutable_Execute "
    "Buffer_Destroy Buffer_ElementType Buffer_Dimensions Buffer_Delete "
    "Buffer_IsDeleted Buffer_ToHostBuffer Buffer_Device Buffer_UnsafePointer"
).split()

# Typed too, but hloforge does without them where a plugin lacks them (`Api.has`): they do not raise
# the function table a plugin must have.
OPTIONAL = ("Executable_GetCompiledMemoryStats",)

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
typedef struct PJRT_SerializedExecutable PJRT_SerializedExecutable;

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

// Through total_size_in_bytes, two fields past minor 94: the 0.106 CPU plugin asks for 112 bytes.
typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  int64_t generated_code_size_in_bytes; int64_t argument_size_in_bytes; int64_t output_size_in_bytes;
  int64_t alias_size_in_bytes; int64_t temp_size_in_bytes;
  int64_t host_generated_code_size_in_bytes; int64_t host_argument_size_in_bytes;
  int64_t host_output_size_in_bytes; int64_t host_alias_size_in_bytes; int64_t host_temp_size_in_bytes;
  int64_t peak_memory_in_bytes; int64_t total_size_in_bytes;
} PJRT_Executable_GetCompiledMemoryStats_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  const PJRT_Executable* executable;
  const char* serialized_bytes;
  size_t serialized_bytes_size;
  PJRT_SerializedExecutable* serialized_executable;
  void (*serialized_executable_deleter)(PJRT_SerializedExecutable* exec);
} PJRT_Executable_Serialize_Args;

typedef struct {
  size_t struct_size; PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable;
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
} PJRT_Executable_DeserializeAndLoad_Args;

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
        if name in TYPED or name in OPTIONAL:
            result = "void" if name in _VOID_RESULT else "PJRT_Error*"
            slots.append(f"  {result} (*PJRT_{name})(PJRT_{name}_Args* args);")
        else:
            slots.append(f"  void* PJRT_{name};")
    return (
        "typedef struct {\n  size_t struct_size;\n  PJRT_Extension_Base* extension_start;\n"
        "  PJRT_Api_Version pjrt_api_version;\n" + "\n".join(slots) + "\n} PJRT_Api;\n"
        "const PJRT_Api* GetPjrtApi(void);\n"
    )


# XLA's FFI (xla/ffi/api/c_api.h) as far as a host call uses it (host_calls.py): a handler's call frame,
# its error constructor, and the plugin's PJRT FFI extension that registers one.
_XLA_FFI_TYPES = r"""
typedef struct XLA_FFI_Extension_Base {
  size_t struct_size; int type; struct XLA_FFI_Extension_Base* next;
} XLA_FFI_Extension_Base;
typedef struct {
  size_t struct_size; XLA_FFI_Extension_Base* extension_start; int major_version; int minor_version;
} XLA_FFI_Api_Version;
typedef struct { size_t struct_size; XLA_FFI_Api_Version api_version; uint32_t traits; } XLA_FFI_Metadata;
typedef struct { XLA_FFI_Extension_Base extension_base; XLA_FFI_Metadata* metadata; } XLA_FFI_Metadata_Extension;
typedef struct {
  size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  int dtype; void* data; int64_t rank; int64_t* dims;
} XLA_FFI_Buffer;
typedef struct {
  size_t struct_size; XLA_FFI_Extension_Base* extension_start; int64_t size; int* types; void** items;
} XLA_FFI_Items;
typedef struct {
  size_t struct_size; XLA_FFI_Extension_Base* extension_start; int64_t size; int* types; void** names;
  void** attrs;
} XLA_FFI_Attrs;
typedef struct XLA_FFI_Error XLA_FFI_Error;
typedef struct {
  size_t struct_size; XLA_FFI_Extension_Base* extension_start; const char* message; int errc;
} XLA_FFI_Error_Create_Args;
typedef struct {
  size_t struct_size; XLA_FFI_Extension_Base* extension_start; XLA_FFI_Api_Version api_version;
  void* internal_api; XLA_FFI_Error* (*XLA_FFI_Error_Create)(XLA_FFI_Error_Create_Args* args);
} XLA_FFI_Api;
typedef struct {
  size_t struct_size; XLA_FFI_Extension_Base* extension_start; const XLA_FFI_Api* api; void* ctx; int stage;
  XLA_FFI_Items args; XLA_FFI_Items rets; XLA_FFI_Attrs attrs; void* future;
} XLA_FFI_CallFrame;
typedef struct {
  size_t struct_size; const char* target_name; size_t target_name_size; void* handler;
  const char* platform_name; size_t platform_name_size; int traits;
} PJRT_FFI_Register_Handler_Args;
typedef struct {
  size_t struct_size; const char* target_name; size_t target_name_size; int api_version; void* handler;
  const char* platform_name; size_t platform_name_size; int traits;
} PJRT_FFI_Register_Handler_Args_typed_flag;
typedef struct {
  size_t struct_size; int type; void* next;
  void* type_id_register; void* user_data_add; PJRT_Error* (*register_handler)(void* args);
} PJRT_FFI_Extension;
"""

CDEF = _TYPES + _XLA_FFI_TYPES + _api_struct()


def parse(cdef: str = CDEF) -> cffi.FFI:
    """`cdef` (CDEF) parsed by cffi here and now (with pycparser): what :mod:`.parsed_declarations` must equal."""
    import cffi

    parsed = cffi.FFI()
    parsed.cdef(cdef)
    return parsed

