"""`shapes`: seeded synthetic images of circles, squares and triangles, so dense tasks train anywhere.

Each image is `size`×`size` RGB: a random dark background colour plus Gaussian
noise (standard deviation `noise`, 0.05 by default; 0 keeps every background and shape flat,
what a diffusion model should learn to draw), with 1 to `max_shapes` (default 3) shapes drawn
in order, each of a random kind (circle, square, upright triangle), size, position and bright
colour. Later shapes are drawn over earlier ones; a placement that would hide more than half
of an earlier shape is redrawn, so every listed shape stays mostly visible.

- `arrays(split)` -> (x float32 [N,3,S,S], masks int32 [N,S,S]): x standardised
  per channel with the training split's mean and standard deviation; masks
  hold `MASK_CLASSES` (0 background, 1 circle, 2 square, 3 triangle) of the
  shape visible at each pixel. `normalize(images)` applies that standardisation to other
  images (an image file's bytes, for `hloforge detect`).
- `boxes(split)` -> one float32 [k,5] array per image, rows (class, x0, y0, x1, y1)
  with `BOX_CLASSES` (0 circle, 1 square, 2 triangle) in drawing order. A box is
  the tight bound of the shape *as drawn* (all its pixels, including any an
  occluding later shape covers), in pixel-edge coordinates: x0 = leftmost
  column, x1 = rightmost column + 1, so a one-pixel shape at (r, c) is
  (c, r, c+1, r+1).

A pixel belongs to a shape when its centre (c + 0.5, r + 0.5) lies inside it.
Generation is deterministic: train and test draw from their own streams of
`numpy.random.default_rng([seed, split_index])`, so the same options give the
same bytes, and `n_train` does not change the test images (only the
standardisation, which the training split sets).
"""

from __future__ import annotations

import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DataError
from hloforge.core.hookspecs import hookimpl
from hloforge.datasets.options import integer, number

KINDS = ("circle", "square", "triangle")
MASK_CLASSES = {"background": 0, **{k: i + 1 for i, k in enumerate(KINDS)}}
BOX_CLASSES = {k: i for i, k in enumerate(KINDS)}
MIN_SIZE = 16
MAX_SHAPES = 3
PLACEMENT_TRIES = 20


def _shape_pixels(kind: str, cx: float, cy: float, half: float, size: int) -> np.ndarray:
    """Boolean [S,S]: the pixels whose centres lie inside the shape centred at (cx, cy), half-extent `half`."""
    c = np.arange(size) + 0.5
    px, py = c[None, :], c[:, None]
    if kind == "circle":
        return (px - cx) ** 2 + (py - cy) ** 2 <= half * half
    if kind == "square":
        return (np.abs(px - cx) <= half) & (np.abs(py - cy) <= half)
    # Upright isosceles triangle: apex at (cx, cy − half), base from (cx ± half, cy + half).
    inside_base = py <= cy + half
    left = (py - (cy - half)) * 0.5 >= (cx - px)  # right of the left edge
    right = (py - (cy - half)) * 0.5 >= (px - cx)  # left of the right edge
    return inside_base & left & right


def _draw_image(rng: np.random.Generator, size: int, noise: float,
                max_shapes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    background = rng.uniform(0.0, 0.35, 3)
    img = np.broadcast_to(background[:, None, None], (3, size, size)).copy()
    mask = np.zeros((size, size), np.int32)
    owner = np.full((size, size), -1, np.int32)  # index of the shape visible at each pixel
    drawn: list[np.ndarray] = []
    rows: list[list[float]] = []
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        for _try in range(PLACEMENT_TRIES):
            kind = KINDS[int(rng.integers(len(KINDS)))]
            half = rng.uniform(0.1, 0.22) * size
            cx, cy = rng.uniform(half, size - half, 2)
            pix = _shape_pixels(kind, cx, cy, half, size)
            if not pix.any():
                continue
            still_visible = [((owner == j) & ~pix).sum() for j in range(len(drawn))]
            if all(v >= 0.5 * d.sum() for v, d in zip(still_visible, drawn, strict=True)):
                break
        else:
            continue  # no placement keeps the earlier shapes visible: draw one shape fewer
        colour = rng.uniform(0.5, 1.0, 3)
        img[:, pix] = colour[:, None]
        mask[pix] = MASK_CLASSES[kind]
        owner[pix] = len(drawn)
        drawn.append(pix)
        r, c = np.nonzero(pix)
        rows.append([BOX_CLASSES[kind], c.min(), r.min(), c.max() + 1, r.max() + 1])
    img += rng.normal(0.0, noise, img.shape)  # drawn even at noise 0: every option keeps the same shapes
    return img.astype(np.float32), mask, np.asarray(rows, np.float32).reshape(-1, 5)


class Shapes(Dataset):
    name = "shapes"
    num_classes = len(MASK_CLASSES)  # segmentation classes, background included
    label_kind = "mask"
    # the class unions segmentation Dice is reported on (hloforge.train.segmentation)
    regions = {**{k: frozenset({MASK_CLASSES[k]}) for k in KINDS},
               "foreground": frozenset(MASK_CLASSES[k] for k in KINDS)}
    splits = ("train", "test")

    def __init__(self, size: int = 32, n_train: int = 2048, n_test: int = 256, seed: int = 0,
                 noise: float = 0.05, max_shapes: int = MAX_SHAPES):
        size, n_train, n_test = (integer("shapes", k, v, lo) for k, v, lo in
                                 (("size", size, MIN_SIZE), ("n_train", n_train, 1), ("n_test", n_test, 1)))
        seed, max_shapes = integer("shapes", "seed", seed, 0), integer("shapes", "max_shapes", max_shapes, 1)
        noise = number("shapes", "noise", noise, 0.0)  # a standard deviation
        self.size, self.seed, self.noise, self.max_shapes = size, seed, noise, max_shapes
        self.image_shape = (3, size, size)
        raw = {split: self._generate(i, n) for i, (split, n) in enumerate((("train", n_train), ("test", n_test)))}
        train_x = raw["train"][0]
        # [1, 3, 1, 1] float32: the training split's per-channel statistics, what `normalize` applies
        self.mean = train_x.mean(axis=(0, 2, 3), keepdims=True)
        self.std = train_x.std(axis=(0, 2, 3), keepdims=True)
        self._arrays = {s: (self.normalize(x), m) for s, (x, m, _) in raw.items()}
        self._boxes = {s: b for s, (_, _, b) in raw.items()}

    def normalize(self, images: np.ndarray) -> np.ndarray:
        """Images as the net reads them: [3, S, S] or [N, 3, S, S], floats on the generator's scale
        (background and colours in [0, 1]) or uint8 bytes (÷ 255 first, as an image file decodes),
        standardised with the training split's per-channel mean and standard deviation — the same
        float32 arithmetic `arrays` applies to the generated images."""
        a = np.asarray(images)
        if a.ndim not in (3, 4) or tuple(a.shape[-3:]) != self.image_shape:
            raise DataError(f"shapes normalises images [3, {self.size}, {self.size}] or [N, 3, {self.size}, "
                            f"{self.size}] (channels first), got {list(a.shape)}")
        if a.dtype == np.uint8:
            a = a.astype(np.float32) / np.float32(255.0)
        elif not np.issubdtype(a.dtype, np.floating):
            raise DataError(f"shapes normalises uint8 or float images, got {a.dtype}")
        a = a.astype(np.float32, copy=False)
        mean, std = (self.mean, self.std) if a.ndim == 4 else (self.mean[0], self.std[0])
        return ((a - mean) / std).astype(np.float32)

    def _generate(self, split_index: int, n: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        rng = np.random.default_rng([self.seed, split_index])
        images, masks, boxes = zip(*(_draw_image(rng, self.size, self.noise, self.max_shapes) for _ in range(n)),
                                   strict=True)
        return np.stack(images), np.stack(masks), list(boxes)

    def _check_split(self, split: str) -> None:
        if split not in self._arrays:
            raise DataError(f"shapes has no split {split!r}; expected one of {list(self.splits)}")

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        self._check_split(split)
        return self._arrays[split]

    def boxes(self, split: str) -> list[np.ndarray]:
        self._check_split(split)
        return self._boxes[split]


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Shapes]
