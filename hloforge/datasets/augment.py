"""Host-side batch transforms: composable, and seeded per step so a resumed run sees the same stream.

A transform maps one batch `(x, y)` to another, drawing its randomness from the
`numpy.random.Generator` it is handed — never from a global RNG. The caller
derives that generator from (seed, epoch, step) with `step_rng`, so the crop
and flip of step s in epoch e are the same in a fresh run and in a resumed one,
and two producer processes with different seeds draw different sequences.

Image transforms act on x, `[B, C, H, W]`, and leave y alone; a transform that
also rewrites the labels (mixup, cutmix: `hloforge.train.mixing`) has the same
`(x, y, rng) -> (x, y)` signature and sits in the same `Compose`.

Geometric transforms run on the stored uint8 pixels (cheap, and padding is
black as in torchvision's RandomCrop on a PIL image); `Normalize` turns them
into the float32 the net reads, so it comes last among the image transforms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import attrs
import numpy as np

from hloforge.core.errors import DataError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Transform(Protocol):
    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...


def step_rng(seed: int, *keys: int) -> np.random.Generator:
    """The generator for one step: a pure function of (seed, *keys), e.g. (seed, epoch, step)."""
    return np.random.default_rng([seed, *keys])


def _check_image_batch(x: np.ndarray, who: str) -> None:
    if x.ndim != 4:
        raise DataError(f"{who}: expected an image batch [B, C, H, W], got shape {list(x.shape)}")


@attrs.frozen
class Compose:
    """Apply each transform in turn, all drawing from the one step generator."""

    transforms: tuple[Transform, ...]

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        for t in self.transforms:
            x, y = t(x, y, rng)
        return x, y


@attrs.frozen
class RandomCrop:
    """A `size`×`size` window at a uniform offset of each image, after zero-padding `padding` on every side."""

    size: int
    padding: int = 0

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_image_batch(x, "RandomCrop")
        b, _, h, w = x.shape
        p = self.padding
        if h + 2 * p < self.size or w + 2 * p < self.size:
            raise DataError(f"RandomCrop({self.size}, padding={p}): images are {h}×{w}, too small to crop")
        if p:
            x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        top = rng.integers(0, h + 2 * p - self.size + 1, b)
        left = rng.integers(0, w + 2 * p - self.size + 1, b)
        s = self.size
        out = np.empty((b, x.shape[1], s, s), x.dtype)
        for i in range(b):
            out[i] = x[i, :, top[i]:top[i] + s, left[i]:left[i] + s]
        return out, y


@attrs.frozen
class CenterCrop:
    """The central `size`×`size` window (the larger margin below/right when the difference is odd)."""

    size: int

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_image_batch(x, "CenterCrop")
        h, w = x.shape[2:]
        if h < self.size or w < self.size:
            raise DataError(f"CenterCrop({self.size}): images are {h}×{w}, too small to crop")
        return np.ascontiguousarray(centre_window(x, self.size)), y


def centre_window(x: np.ndarray, size: int) -> np.ndarray:
    """The central `size`×`size` window of `x`'s last two axes (the larger margin below/right when the
    difference is odd): CenterCrop's, and the val images `hloforge prepare imagenette` stores."""
    h, w = x.shape[-2:]
    top, left = (h - size) // 2, (w - size) // 2
    return x[..., top:top + size, left:left + size]


@attrs.frozen
class HorizontalFlip:
    """Mirror each image left-right with probability `p`."""

    p: float = 0.5

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_image_batch(x, "HorizontalFlip")
        flip = rng.random(len(x)) < self.p
        if flip.any():
            x = x.copy()
            x[flip] = x[flip, :, :, ::-1]
        return x, y


def _resize_matrix(n_in: int, n_out: int, lo: float, hi: float) -> np.ndarray:
    """[n_out, n_in] bilinear weights sampling the source interval [lo, hi) at n_out half-pixel centres."""
    src = lo + (np.arange(n_out) + 0.5) * (hi - lo) / n_out - 0.5
    src = np.clip(src, 0.0, n_in - 1.0)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    frac = src - i0
    m = np.zeros((n_out, n_in), np.float32)
    m[np.arange(n_out), i0] += 1.0 - frac
    m[np.arange(n_out), i1] += frac
    return m


@attrs.frozen
class RandomResizedCrop:
    """Inception-style crop: a box of area fraction in `scale` and aspect ratio (log-uniform) in `ratio`,
    resized bilinearly to `size`×`size`; ten tries, then the central box of the clamped ratio
    (torchvision's rule). Output is float32 in the input's value range."""

    size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def box(self, h: int, w: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        area = h * w
        log_r = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            r = math.exp(rng.uniform(*log_r))
            bw = int(round(math.sqrt(target * r)))
            bh = int(round(math.sqrt(target / r)))
            if 0 < bw <= w and 0 < bh <= h:
                return int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw
        r = w / h
        if r < self.ratio[0]:
            bw, bh = w, int(round(w / self.ratio[0]))
        elif r > self.ratio[1]:
            bh, bw = h, int(round(h * self.ratio[1]))
        else:
            bh, bw = h, w
        return (h - bh) // 2, (w - bw) // 2, bh, bw

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_image_batch(x, "RandomResizedCrop")
        b, c, h, w = x.shape
        out = np.empty((b, c, self.size, self.size), np.float32)
        for i in range(b):
            top, left, bh, bw = self.box(h, w, rng)
            ry = _resize_matrix(h, self.size, top, top + bh)
            rx = _resize_matrix(w, self.size, left, left + bw)
            out[i] = ry @ x[i].astype(np.float32) @ rx.T
        return out, y


@attrs.frozen
class Normalize:
    """float32 (x·scale − mean) / std per channel; scale 1/255 turns stored bytes into [0, 1] first."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    scale: float = 1.0 / 255.0

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_image_batch(x, "Normalize")
        if x.shape[1] != len(self.mean):
            raise DataError(f"Normalize: images have {x.shape[1]} channels, mean/std give {len(self.mean)}")
        a = (self.scale / np.asarray(self.std, np.float32)).reshape(1, -1, 1, 1)
        b = (-np.asarray(self.mean, np.float32) / np.asarray(self.std, np.float32)).reshape(1, -1, 1, 1)
        return (x.astype(np.float32) * a + b).astype(np.float32, copy=False), y


@attrs.frozen
class Affine:
    """float32 x·scale + shift, the same for every channel (e.g. a dequantisation)."""

    scale: float
    shift: float = 0.0

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return (x.astype(np.float32) * np.float32(self.scale) + np.float32(self.shift)), y


def compose(*transforms: Transform) -> Compose:
    return Compose(transforms)


def apply_all(transform: Transform, x: np.ndarray, y: np.ndarray, chunk: int = 256,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic transform over a whole split, `chunk` rows at a time (bounded peak memory)."""
    if len(x) == 0:
        return transform(x, y, step_rng(seed))
    xs, ys = [], []
    for i in range(0, len(x), chunk):
        xb, yb = transform(np.asarray(x[i:i + chunk]), np.asarray(y[i:i + chunk]), step_rng(seed, i))
        xs.append(xb)
        ys.append(yb)
    return np.concatenate(xs), np.concatenate(ys)


__all__: Sequence[str] = ("IMAGENET_MEAN", "IMAGENET_STD", "Transform", "step_rng", "Compose", "compose",
                          "RandomCrop", "CenterCrop", "HorizontalFlip", "RandomResizedCrop", "Normalize",
                          "Affine", "apply_all")
