"""`hloforge cam`: Grad-CAM of one image through a run's checkpoint, as a PNG overlay."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from hloforge.commands.opening import open_checkpoint
from hloforge.core.cam import gradcam, save_overlay
from hloforge.core.errors import DataError
from hloforge.train import checkpoint as ckpt
from hloforge.train.trainer import Run


def load_image(ref: str, run: Run) -> np.ndarray:
    """`test:N` (the N-th image of the run's eval split) or a .npy file of the net's input shape."""
    if ref.startswith("test:"):
        try:
            i = int(ref[5:])
            return run.x_te[i]
        except (ValueError, IndexError):
            raise DataError(f"image {ref!r}: expected test:N with 0 ≤ N < {len(run.x_te)}") from None
    if ref.endswith(".npy") and os.path.exists(ref):
        try:
            return np.load(ref).astype(np.float32)
        except (OSError, ValueError) as e:
            raise DataError(f"{ref}: not a readable .npy array ({e})") from None
    raise DataError(f"image {ref!r}: expected test:N or an existing .npy file of shape {list(run.spec.input_shape)}")


def cam_run(path: str, image_ref: str, out: str, class_index: int | None = None,
            log: Callable[[str], None] = print) -> np.ndarray:
    oc = open_checkpoint(path, log=log)
    spec = oc.spec
    image = load_image(image_ref, oc.run).reshape(spec.input_shape)
    params = oc.weights(ckpt.PARAMS, [n for n, _ in spec.params()])
    running = oc.weights(ckpt.STATS, [n for n, _ in spec.stats()])
    heat = gradcam(spec, params, running, image, oc.run.backend, class_index)
    save_overlay(image, heat, out)
    log(f"wrote {out} (Grad-CAM of {image_ref} through {spec.name}, epoch {oc.meta['epoch']})")
    return heat
