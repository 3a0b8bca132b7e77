"""Resampling weights shared by the layers (upsampling), the datasets (resizing) and Grad-CAM."""

from __future__ import annotations

import math

import numpy as np


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] interpolation weights, half-pixel centres, edges clamped."""
    m = np.zeros((n_out, n_in), np.float64)
    for i in range(n_out):
        src = min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1.0)
        lo = int(np.floor(src))
        hi = min(lo + 1, n_in - 1)
        frac = src - lo
        m[i, lo] += 1.0 - frac
        m[i, hi] += frac
    return m


def resize_short_side(size: int, crop: float) -> int:
    """The short side an eval image is resized to before its size×size center crop: timm's
    `math.floor(img_size / crop_pct)` (transforms_imagenet_eval), so 224 at 0.875 is 256."""
    return math.floor(size / crop)


def resize_center_crop(x: np.ndarray, size: int, crop: float = 1.0) -> np.ndarray:
    """[N, C, H, W] images resized (bilinear, aspect kept) so the short side is `resize_short_side`,
    then center-cropped to size×size: torchvision's Resize(int) then CenterCrop (the long side
    `int(short_target · long / short)`, the crop's corner `round((side − size) / 2)`). A side already
    at its target is not resampled, so crop 1 at the images' own size gives them back unchanged."""
    h, w = x.shape[-2:]
    short = resize_short_side(size, crop)
    th, tw = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
    out = x
    if th != h:
        out = np.einsum("ih,...hw->...iw", bilinear_matrix(h, th), out)
    if tw != w:
        out = np.einsum("jw,...hw->...hj", bilinear_matrix(w, tw), out)
    top, left = int(round((th - size) / 2.0)), int(round((tw - size) / 2.0))
    return np.ascontiguousarray(out[..., top:top + size, left:left + size], dtype=x.dtype)
