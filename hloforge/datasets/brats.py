"""`brats`, `brats224`, `brats224-25d`: BraTS brain-tumour segmentation (MSD Task01_BrainTumour) as
2D axial slices, in the counted-record binaries `hloforge prepare brats` writes.

`data_dir/train.bin` and `data_dir/val.bin` (the `test` split) each hold a u32 little-endian
record count, then records of C·S² image bytes (channel-first [channel][y][x]) followed by
S² mask bytes (the per-pixel class, 0..3). S is 240 (the native in-plane size; 240 = 16·15,
so a depth-4 UNet's four halvings divide evenly) or 224 (the centre crop). C is 4, the MRI
modalities FLAIR, T1w, T1gd, T2w — or, in 2.5D, 4·(2·context+1): the modalities of the
slices z−context … z … z+context in that order, with the mask of the centre slice z.

Image bytes are per-volume z-scores over brain (nonzero) voxels, quantised over ±5σ with
zero anchored at 128 (`quantize`); the loader inverts that (`dequantize`), so background
comes back as exact 0. Masks use MSD's numbering: 0 background, 1 edema, 2 non-enhancing
tumour, 3 enhancing tumour — and `BRATS_REGIONS` is the one table of the regions Dice is
reported on, shared by all three variants.

The file length is checked against 4 + count·(C·S² + S²) before any record is read, so a
2D file read as 2.5D (or the reverse, or a 240 file read as 224) fails at load, naming
the channel count its length does fit, rather than misaligning every mask after the first.
Augmentation is the identity.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import attrs
import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.hookspecs import hookimpl
from hloforge.datasets.augment import Affine, Compose, Transform
from hloforge.datasets.options import integer, path
from hloforge.datasets.records import (
    COUNT_HEADER,
    RecordDataset,
    check_counted_records,
    file_size,
    map_records,
)

MODALITIES = ("FLAIR", "T1w", "T1gd", "T2w")
LABEL_NAMES = ("background", "edema", "non-enhancing tumour", "enhancing tumour")
CLASSES = len(LABEL_NAMES)
# Whole tumour, tumour core, enhancing tumour, as unions of MSD labels. The one definition:
# a second copy drifting out of sync would score the wrong voxels without failing.
BRATS_REGIONS: Mapping[str, frozenset[int]] = {
    "WT": frozenset({1, 2, 3}),
    "TC": frozenset({2, 3}),
    "ET": frozenset({3}),
}
NATIVE_SIZE = 240
CLIP_SIGMA = 5.0  # the quantisation window, in standard deviations
ZERO_LEVEL = 128  # the byte that stores z = 0 (background)
LEVELS_PER_WINDOW = 127.0
FILES = {"train": "train.bin", "test": "val.bin"}


def channels(context: int) -> int:
    """Image channels per record: the 4 modalities of each of the 2·context + 1 slices."""
    return len(MODALITIES) * (2 * context + 1)


def record_bytes(size: int, context: int) -> int:
    return channels(context) * size * size + size * size


def quantize(z: np.ndarray) -> np.ndarray:
    """z-scores to bytes over ±CLIP_SIGMA, z = 0 stored as exactly ZERO_LEVEL."""
    q = np.rint(np.asarray(z, np.float64) * (LEVELS_PER_WINDOW / CLIP_SIGMA) + ZERO_LEVEL)
    return np.clip(q, 0, 255).astype(np.uint8)


DEQUANTIZE = Affine(CLIP_SIGMA / LEVELS_PER_WINDOW, -ZERO_LEVEL * CLIP_SIGMA / LEVELS_PER_WINDOW)


def dequantize(b: np.ndarray) -> np.ndarray:
    """The inverse of `quantize` on the grid: bytes back to float32 z-scores."""
    return DEQUANTIZE(b, np.empty(0), np.random.default_rng(0))[0]


@attrs.frozen
class MaskToInt32:
    """Masks stored as bytes -> the int32 per-pixel labels the segmentation losses read."""

    def __call__(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return x, np.asarray(y, np.int32)


def _length_hint(path: str, size: int, context: int) -> str:
    """Which (context, size) the file's length does fit, for the error of one that does not: solved from its
    length, so a set of the user's own at 32² read at the default 240² is named, not called truncated."""
    total = file_size(path)
    with open(path, "rb") as f:
        head = f.read(COUNT_HEADER.size)
    if len(head) < COUNT_HEADER.size:
        return ""
    (count,) = COUNT_HEADER.unpack(head)
    if count == 0 or (total - COUNT_HEADER.size) % count:
        return ""
    rec = (total - COUNT_HEADER.size) // count
    fits = []
    for k in range(8):
        s = math.isqrt(rec // (channels(k) + 1))
        if (s, k) != (size, context) and s > 0 and rec == record_bytes(s, k):
            fits.append((s != size, k != context, k, s))  # the likeliest first: one option off, the size kept
    if not fits:
        return ""
    _, _, k, s = min(fits)
    kind = "2D" if k == 0 else f"2.5D (context {k})"
    want = "2D" if context == 0 else f"2.5D (context {context})"
    options = " ".join(f"{name}={v}" for name, v, asked in (("size", s, size), ("context", k, context)) if v != asked)
    misread = f"a {s}² file read at {size}²" if k == context else f"a {kind} file read as {want} at {size}²"
    return (f"; its length fits {channels(k)} channels at {s}² — {misread}? (the data option"
            f"{'s' if ' ' in options else ''} {options})")


def read_brats(path: str, size: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, C, S, S] view of the file, masks uint8 [N, S, S] view)."""
    c = channels(context)
    try:
        n = check_counted_records(path, record_bytes(size, context),
                                  f"{c} channels · {size}² image + {size}² mask bytes")
    except DataError as e:
        raise DataError(f"{e}{_length_hint(path, size, context)}") from None
    rec = map_records(path, n, record_bytes(size, context), COUNT_HEADER.size)
    images = rec[:, :c * size * size].reshape(n, c, size, size)
    masks = rec[:, c * size * size:].reshape(n, size, size)
    for i in range(0, n, 256):  # the label range, a chunk at a time (never the whole split in memory)
        top = int(masks[i:i + 256].max(initial=0))
        if top >= CLASSES:
            raise DataError(f"{path}: mask label {top} in records {i}..{min(i + 256, n) - 1}, "
                            f"out of range 0..{CLASSES - 1}")
    return images, masks


class Brats(RecordDataset):
    name = "brats"
    num_classes = CLASSES
    label_kind = "mask"
    regions = BRATS_REGIONS
    default_size = NATIVE_SIZE
    default_context = 0

    def __init__(self, data_dir: str = "data/brats", size: int | None = None, context: int | None = None):
        super().__init__()
        data_dir = path(self.name, "data_dir", data_dir)
        self.size = integer(self.name, "size", self.default_size if size is None else size, 1)
        self.context = integer(self.name, "context", self.default_context if context is None else context, 0)
        if self.size <= 0 or self.context < 0:
            raise DataError(f"{self.name}: size must be positive and context non-negative, got size {self.size}, "
                            f"context {self.context}")
        self.data_dir = data_dir
        self.image_shape = (channels(self.context), self.size, self.size)

    def _load(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        path = os.path.join(self.data_dir, FILES[split])
        if not os.path.isfile(path):  # the prepare step not yet taken, or another --data-dir meant
            raise DataError(f"{path} not found; expected the binaries `hloforge prepare brats SRC OUT --size "
                            f"{self.size} --context {self.context}` writes from MSD's Task01_BrainTumour, then "
                            "--data-dir OUT")
        return read_brats(path, self.size, self.context)

    def transform(self, split: str, augment: bool = False) -> Transform:
        self._check_split(split)
        return Compose((DEQUANTIZE, MaskToInt32()))


class Brats224(Brats):
    """BraTS with one number changed: the 224² centre crop."""

    name = "brats224"
    default_size = 224


class Brats224Context(Brats):
    """BraTS at 224² in 2.5D: 4·(2·context+1) channels, the centre slice's mask."""

    name = "brats224-25d"
    default_size = 224
    default_context = 1


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Brats, Brats224, Brats224Context]
