"""XLA backend: run StableHLO text through a PJRT plugin (see :mod:`.pjrt`)."""

from hloforge.backends.xla.pjrt import (
    Client,
    Device,
    DeviceBuffer,
    Executable,
    default_client,
    find_plugin,
)

__all__ = ["Client", "Device", "DeviceBuffer", "Executable", "default_client", "find_plugin"]
