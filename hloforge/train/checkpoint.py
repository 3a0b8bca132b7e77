"""Checkpoints: safetensors files (no code runs on load) with the spec, variant, backend,
epoch, step and RNG state in the metadata.

Written to a sibling temp file, fsynced and renamed, so a crash mid-write leaves the
previous checkpoint whole; a failed write (a full disk) removes the temp file and says so in one
line. The header is canonical (sorted keys), so the same run writes the same bytes: a run killed
and resumed ends with the file an uninterrupted run ends with (scripts/crash_drill.py).

Tensor names come from the slots (`param/0.w`,
`state/m/0.w`, `stat/1.mean`), so a checkpoint of another net cannot load silently
misaligned. A variant with an EMA shadow also keeps the shadow's BatchNorm statistics
(`stat/E/1.mean`: an EMA of the running statistics, seed 003's `ema_bn`) next to the
running ones, so the shadow is scored with its own statistics and the live weights with theirs.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hloforge.core.errors import DataError, HloforgeError
from hloforge.core.variant import SHADOW

FORMAT = "hloforge-checkpoint-1"
# Test knobs (seed 003's "fault knobs"), never set in a real run:
# SIGKILL the process halfway through writing epoch N's checkpoint;
FAULT_ENV = "HLOFORGE_FAULT_KILL_IN_CHECKPOINT"
# write checkpoints in 16 chunks with this many seconds between them (widens the crash drill's mid-write window);
SLOW_WRITE_ENV = "HLOFORGE_DRILL_SLOW_WRITE"
# append "phase epoch [n]" lines to this file as the run passes them (where the crash drill's kills landed).
TRACE_ENV = "HLOFORGE_DRILL_TRACE"
TMP_SUFFIX = ".tmp"  # one writer per run directory (the run's lock), so one fixed temp name
PARAMS = "param"  # θ
STATS = "stat"  # the running BatchNorm statistics: what the live weights are scored with
SHADOW_STATS = f"{STATS}/{SHADOW}"  # the EMA shadow's statistics: what the shadow is scored with


def state_group(slot: str) -> str:
    """The group of a state slot's tensors (`state/m`, `state/E`, ...)."""
    return f"state/{slot}"


def names_in(group: str, names: Sequence[str]) -> list[str]:
    """The checkpoint tensor names of `names` in `group` (PARAMS, STATS, a state_group, ...): the one
    place a checkpoint tensor is named."""
    return [f"{group}/{n}" for n in names]


def tensor_names(param_names: Sequence[str], state_names: Sequence[str], stat_names: Sequence[str],
                 shadow_stats: bool = False) -> list[str]:
    """θ, the state slots, the running statistics and (`shadow_stats`) the shadow's, in that order."""
    return (names_in(PARAMS, param_names) + [n for k in state_names for n in names_in(state_group(k), param_names)]
            + names_in(STATS, stat_names) + (names_in(SHADOW_STATS, stat_names) if shadow_stats else []))


def serialize(names: Sequence[str], tensors: Sequence[np.ndarray], meta: dict[str, Any]) -> bytes:
    """The checkpoint's bytes: safetensors' layout with its JSON header re-written with sorted keys
    (safetensors keeps the metadata in a hash map, whose order changes from process to process)."""
    from safetensors.numpy import save

    blob = save({n: np.ascontiguousarray(t) for n, t in zip(names, tensors, strict=True)},
                metadata={"format": FORMAT, **{k: json.dumps(v) for k, v in meta.items()}})
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.dumps(json.loads(blob[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the data stays 8-byte aligned, as safetensors pads it
    return struct.pack("<Q", len(header)) + header + blob[8 + n:]


def write_atomic(path: str, data: bytes, what: str, *, fault: bool = False) -> None:
    """`data` to `path` through `path`.tmp, fsynced and renamed over it: a crash at any point leaves
    the old file or the new one, whole. A failed write (ENOSPC, EFBIG, EIO) removes the temp file and
    raises one line saying the old file is untouched. `fault`: the FAULT_ENV kill, halfway through."""
    tmp = path + TMP_SUFFIX
    chunks = 16 if os.environ.get(SLOW_WRITE_ENV) else 1
    pause = float(os.environ.get(SLOW_WRITE_ENV) or 0)
    try:
        with open(tmp, "wb") as f:
            if fault:
                f.write(data[: len(data) // 2])
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            step = -(-len(data) // chunks)
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                if pause:
                    f.flush()
                    time.sleep(pause)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        old = f"the previous {what} is whole" if os.path.exists(path) else f"there was no {what} before"
        raise HloforgeError(f"could not write {what} {path}: {e.strerror or e} ({old}, the temp file removed); "
                            "free space and --resume") from None
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_dir(d: str) -> None:
    """The rename itself made durable (a power cut after it keeps the new file)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: str, names: Sequence[str], tensors: Sequence[np.ndarray], meta: dict[str, Any]) -> None:
    blob = serialize(names, tensors, meta)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    mark("checkpoint", meta.get("epoch"))
    write_atomic(path, blob, "checkpoint", fault=os.environ.get(FAULT_ENV) == str(meta.get("epoch")))
    mark("saved", meta.get("epoch"))


def mark(phase: str, epoch: Any, n: int | None = None) -> None:
    """One TRACE_ENV line (the crash drill reads where each kill landed); nothing when it is unset."""
    trace = os.environ.get(TRACE_ENV)
    if not trace:
        return
    fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:  # one write(2) per line on O_APPEND: a kill never leaves half a line
        os.write(fd, f"{phase} {epoch}{'' if n is None else f' {n}'}\n".encode())
    finally:
        os.close(fd)


def load_checkpoint(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """All tensors by name and the decoded metadata; a truncated or foreign file is one clear error."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    if not os.path.exists(path):
        raise DataError(f"checkpoint {path} does not exist")
    try:
        with open(path, "rb") as f:
            tensors = load(f.read())
        from safetensors import safe_open

        with safe_open(path, "np") as f:
            raw = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise DataError(f"checkpoint {path} is truncated or not a safetensors file ({e})") from None
    if raw.get("format") != FORMAT:
        raise DataError(f"checkpoint {path} is not an hloforge checkpoint (format {raw.get('format')!r}, "
                        f"expected {FORMAT!r})")
    meta = {k: json.loads(v) for k, v in raw.items() if k != "format"}
    return tensors, meta


def shadow_stats(tensors: dict[str, np.ndarray], stat_names: Sequence[str], path: str, remedy: str) -> list[np.ndarray]:
    """The EMA shadow's BatchNorm statistics (`stat/E/…`) out of a checkpoint's tensors. One written
    before they were kept is refused: the shadow normalised by the live running statistics would
    print a plausible, wrong number. `remedy` says what the caller can do instead."""
    names = names_in(SHADOW_STATS, stat_names)
    missing = [n for n, t in zip(stat_names, names, strict=True) if t not in tensors]
    if missing:
        raise DataError(f"checkpoint {path} has no BatchNorm statistics for its EMA shadow ({SHADOW_STATS}/"
                        f"{missing[0]} and {len(missing) - 1} more are missing; it predates them), and the shadow "
                        f"is never scored with the live running statistics; {remedy}")
    return [tensors[t] for t in names]
