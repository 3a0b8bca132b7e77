"""Mixup and cutmix on the host (timm's Mixup, batch mode), producing the soft targets a
soft-label train step takes; label smoothing is applied here too, in the same targets.

Each batch is mixed with itself reversed: mixup blends whole images, x ← λ·x + (1 − λ)·x[::-1];
cutmix pastes a box of the reversed batch whose area is 1 − λ, and λ is then corrected to the
box actually pasted (clipped at the border). λ ~ Beta(α, α). With both on, each batch picks one,
cutmix with probability 1/2. Targets: λ·smooth(y) + (1 − λ)·smooth(y[::-1]), smooth(y) the
one-hot with off = ε/C and on = 1 − ε + ε/C. Drawn from (seed, step) alone, like the masks, so a
resumed run mixes exactly as the uninterrupted one would have.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from hloforge.core.errors import DataError, UnsupportedSpec

MIX_STREAM = 0x6D6978  # "mix": this module's stream of the run's seed


def smooth_one_hot(y: np.ndarray, classes: int, smoothing: float) -> np.ndarray:
    """timm's targets: off = ε/C everywhere, on = 1 − ε + ε/C at the label."""
    off = smoothing / classes
    t = np.full((len(y), classes), off, np.float64)
    t[np.arange(len(y)), np.asarray(y, np.int64)] = 1.0 - smoothing + off
    return t


@attrs.frozen
class Mixer:
    classes: int
    mixup: float = 0.0  # Beta α; 0: off
    cutmix: float = 0.0  # Beta α; 0: off
    label_smoothing: float = 0.0
    switch_prob: float = 0.5  # with both on: the chance a batch uses cutmix

    def check_input(self, input_shape: tuple[int, ...]) -> None:
        if self.cutmix and len(input_shape) not in (2, 3):
            raise UnsupportedSpec(f"cutmix pastes a box of an image: it needs an input [C, H, W] or [H, W], not "
                                  f"{list(input_shape)}; use mixup for this net")

    def mix(self, x: np.ndarray, y: np.ndarray, seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(mixed x, soft targets [B, C] float32) for 1-based train step `step`."""
        y = np.asarray(y)
        if y.ndim != 1:
            raise DataError(f"mixing takes class labels [B]; got labels of shape {list(y.shape)}")
        rng = np.random.default_rng([seed, MIX_STREAM, step])
        use_cutmix = bool(self.cutmix) and (not self.mixup or rng.random() < self.switch_prob)
        alpha = self.cutmix if use_cutmix else self.mixup
        lam = float(rng.beta(alpha, alpha)) if alpha else 1.0
        x = np.asarray(x, np.float32)
        flipped = x[::-1]
        if use_cutmix:
            self.check_input(tuple(x.shape[1:]))
            h, w = x.shape[-2:]
            ratio = math.sqrt(1.0 - lam)
            ch, cw = int(h * ratio), int(w * ratio)
            cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
            y0, y1 = np.clip([cy - ch // 2, cy + ch // 2], 0, h)
            x0, x1 = np.clip([cx - cw // 2, cx + cw // 2], 0, w)
            out = x.copy()
            out[..., y0:y1, x0:x1] = flipped[..., y0:y1, x0:x1]
            lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
        else:
            out = (x * lam + flipped * (1.0 - lam)).astype(np.float32)
        t = smooth_one_hot(y, self.classes, self.label_smoothing)
        return out, (lam * t + (1.0 - lam) * t[::-1]).astype(np.float32)
