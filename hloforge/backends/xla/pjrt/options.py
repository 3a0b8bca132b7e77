"""Compile options: the XLA CPU scheduler choice and the CompileOptionsProto, encoded by hand."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

from hloforge.core.errors import BackendError, BackendSettingError

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
        raise BackendSettingError(f"{SCHEDULER_ENV_VAR}={name!r}; expected auto, {', '.join(SCHEDULERS)}")
    return None if name == "auto" else name


def scheduler_in_xla_flags() -> bool:
    """Whether the user's XLA_FLAGS choose the scheduler (then they win over any per-executable choice)."""
    return any(flag in os.environ.get("XLA_FLAGS", "") for flag in _SCHEDULER_FLAGS)


def forced_scheduler() -> str | None:
    """The scheduler every executable of the process gets: "XLA_FLAGS" (the user's), a name from
    $HLOFORGE_XLA_SCHEDULER, or None (each executable's own, the backend's rule)."""
    return "XLA_FLAGS" if scheduler_in_xla_flags() else xla_scheduler()


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
