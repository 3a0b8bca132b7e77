"""Checkpoints: safetensors files (no code runs on load) with the spec, variant, backend,
epoch, step and RNG state in the metadata.

Written to a sibling temp file, fsynced and renamed, so a crash mid-write leaves the
previous checkpoint whole. Tensor names come from the slots (`param/0.w`,
`state/m/0.w`, `stat/1.mean`), so a checkpoint of another net cannot load silently
misaligned. A variant with an EMA shadow also keeps the shadow's BatchNorm statistics
(`stat/E/1.mean`: an EMA of the running statistics, seed 003's `ema_bn`) next to the
running ones, so the shadow is scored with its own statistics and the live weights with theirs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.variant import SHADOW

FORMAT = "hloforge-checkpoint-1"
# Test knob: kill the process halfway through writing a checkpoint (seed 003's "fault knobs").
FAULT_ENV = "HLOFORGE_FAULT_KILL_IN_CHECKPOINT"
STATS = "stat"  # the running BatchNorm statistics: what the live weights are scored with
SHADOW_STATS = f"{STATS}/{SHADOW}"  # the EMA shadow's statistics: what the shadow is scored with


@attrs.frozen
class Checkpoint:
    params: list[np.ndarray]
    state: list[np.ndarray]
    stats: list[np.ndarray]
    meta: dict[str, Any]


def tensor_names(param_names: Sequence[str], state_names: Sequence[str], stat_names: Sequence[str],
                 shadow_stats: bool = False) -> list[str]:
    """θ, the state slots, the running statistics and (`shadow_stats`) the shadow's, in that order."""
    return ([f"param/{n}" for n in param_names] + [f"state/{k}/{n}" for k in state_names for n in param_names]
            + [f"{STATS}/{n}" for n in stat_names]
            + ([f"{SHADOW_STATS}/{n}" for n in stat_names] if shadow_stats else []))


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


def shadow_stats(tensors: dict[str, np.ndarray], stat_names: Sequence[str], path: str, remedy: str) -> list[np.ndarray]:
    """The EMA shadow's BatchNorm statistics (`stat/E/…`) out of a checkpoint's tensors. One written
    before they were kept is refused: the shadow normalised by the live running statistics would
    print a plausible, wrong number. `remedy` says what the caller can do instead."""
    missing = [n for n in stat_names if f"{SHADOW_STATS}/{n}" not in tensors]
    if missing:
        raise DataError(f"checkpoint {path} has no BatchNorm statistics for its EMA shadow ({SHADOW_STATS}/"
                        f"{missing[0]} and {len(missing) - 1} more are missing; it predates them), and the shadow "
                        f"is never scored with the live running statistics; {remedy}")
    return [tensors[f"{SHADOW_STATS}/{n}"] for n in stat_names]
