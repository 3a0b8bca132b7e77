"""Resampling weights shared by the layers (upsampling), the datasets (resizing) and Grad-CAM."""

from __future__ import annotations

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
