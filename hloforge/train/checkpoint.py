"""Checkpoints: safetensors files (no code runs on load) with the spec, variant, backend,
epoch, step and RNG state in the metadata.

Written to a sibling temp file, fsynced and renamed, so a crash mid-write leaves the
previous checkpoint whole. Tensor names come from the slots (`param/0.w`,
`state/m/0.w`, `stat/1.mean`), so a checkpoint of another net cannot load silently
misaligned.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError

FORMAT = "hloforge-checkpoint-1"
# Test knob: kill the process halfway through writing a checkpoint (seed 003's "fault knobs").
FAULT_ENV = "HLOFORGE_FAULT_KILL_IN_CHECKPOINT"


@attrs.frozen
class Checkpoint:
    params: list[np.ndarray]
    state: list[np.ndarray]
    stats: list[np.ndarray]
    meta: dict[str, Any]


def tensor_names(param_names: Sequence[str], state_names: Sequence[str], stat_names: Sequence[str]) -> list[str]:
    return ([f"param/{n}" for n in param_names] + [f"state/{k}/{n}" for k in state_names for n in param_names]
            + [f"stat/{n}" for n in stat_names])


def save_checkpoint(path: str, names: Sequence[str], tensors: Sequence[np.ndarray], meta: dict[str, Any]) -> None:
    from safetensors.numpy import save

    blob = save({n: np.ascontiguousarray(t) for n, t in zip(names, tensors, strict=True)},
                metadata={"format": FORMAT, **{k: json.dumps(v) for k, v in meta.items()}})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        if os.environ.get(FAULT_ENV) == str(meta.get("epoch")):
            f.write(blob[: len(blob) // 2])
            f.flush()
            os._exit(137)
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
