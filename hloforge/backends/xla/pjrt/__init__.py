"""cffi ABI-mode binding of the PJRT C API: load an XLA plugin, compile StableHLO, run it.

No C compiler is involved: the declarations (:mod:`.declarations`), parsed by cffi ahead of time
(:mod:`.c_api`), describe the plugin opened with ``ffi.dlopen`` (:mod:`.api`). Every ``PJRT_Error*``
becomes a :class:`~hloforge.core.errors.BackendError` carrying the plugin's message and code.

The parts, each one job: :mod:`.declarations` (the C API), :mod:`.c_api` (its cffi FFI), :mod:`.api`
(one loaded plugin), :mod:`.options` (compile options, the scheduler), :mod:`.buffers`,
:mod:`.executable` and :mod:`.client` (what a user holds), :mod:`.discovery` (which plugin file).

Ownership: a :class:`Client` owns every :class:`Executable` and :class:`DeviceBuffer`
made through it and frees them, before the PJRT client itself, in :meth:`Client.close`.
"""

from hloforge.backends.xla.pjrt.api import Api, load_api
from hloforge.backends.xla.pjrt.buffers import Device, DeviceBuffer
from hloforge.backends.xla.pjrt.c_api import ffi
from hloforge.backends.xla.pjrt.client import Client, client_with_devices, default_client
from hloforge.backends.xla.pjrt.declarations import HEADER_MINOR
from hloforge.backends.xla.pjrt.discovery import PLUGIN_ENV_VAR, find_plugin
from hloforge.backends.xla.pjrt.executable import Executable
from hloforge.backends.xla.pjrt.options import (
    SCHEDULER_ENV_VAR,
    SCHEDULERS,
    compile_options,
    forced_scheduler,
    scheduler_in_xla_flags,
    xla_scheduler,
)

__all__ = ["HEADER_MINOR", "PLUGIN_ENV_VAR", "SCHEDULERS", "SCHEDULER_ENV_VAR", "Api", "Client", "Device",
           "DeviceBuffer", "Executable", "client_with_devices", "compile_options", "default_client", "ffi",
           "find_plugin", "forced_scheduler", "load_api", "scheduler_in_xla_flags", "xla_scheduler"]
