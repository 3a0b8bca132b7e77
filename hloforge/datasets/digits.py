"""`digits`: scikit-learn's bundled handwritten digits, the embedded default (no download).

1,797 8×8 grey images (0..16) of the digits 0–9. The split is fixed: a
permutation drawn with seed 0, the first 1,437 images train and the last 360
test. Images are scaled to [0, 1], resized bilinearly (half-pixel centres) to
`size`×`size` (28 by default, so the MNIST nets fit) and standardised with
the training split's mean and standard deviation. `channels` > 1 repeats the grey image in every
channel, for a net that takes RGB (a torchvision ResNet: `--data-opt size=64 --data-opt channels=3`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DataError
from hloforge.core.hookspecs import hookimpl
from hloforge.core.resample import bilinear_matrix
from hloforge.datasets.augment import Normalize
from hloforge.datasets.options import integer

N_TRAIN = 1437
PIXEL_MAX = 16.0  # the digits' grey levels are 0..16
N_IMAGES = 1797


def read_digits_table(path: Path) -> np.ndarray:
    """The digits' CSV table (a row: 64 pixels, then the label); a file that cannot be read is one line."""
    try:
        return np.loadtxt(path, delimiter=",", ndmin=2)
    except (OSError, EOFError, ValueError) as e:
        raise DataError(f"scikit-learn's digits file {path} cannot be read ({e}); reinstall scikit-learn") from None


def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: images [1797, 8, 8] (0..16) and their labels. Its bundled file is read
    without importing scikit-learn, whose import (scipy.stats with it) took 1.2 s of every run's
    start; `load_digits` where a release keeps the file elsewhere or in another form."""
    sklearn = importlib.util.find_spec("sklearn")
    if sklearn is not None and sklearn.origin is not None:
        path = Path(sklearn.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            table = read_digits_table(path)
            if table.shape == (N_IMAGES, 65):
                return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


class Digits(Dataset):
    name = "digits"
    num_classes = 10
    splits = ("train", "test")

    def __init__(self, size: int = 28, channels: int = 1):
        size, channels = integer("digits", "size", size, 8), integer("digits", "channels", channels, 1)
        pixels, labels = bundled_digits()
        images = pixels.astype(np.float64) / PIXEL_MAX
        if size != 8:
            r = bilinear_matrix(8, size)
            images = np.einsum("ih,nhw,jw->nij", r, images, r)
        order = np.random.default_rng(0).permutation(len(images))
        x = images[order][:, None].astype(np.float32)
        y = labels[order].astype(np.int32)
        mean, std = x[:N_TRAIN].mean(), x[:N_TRAIN].std()
        x = np.repeat((x - mean) / std, channels, axis=1)  # the grey image in every channel (an RGB net's input)
        # the same affine of the resized 0..16 pixels (resizing commutes with it: its weights sum to 1)
        self.pixels = Normalize((float(mean),) * channels, (float(std),) * channels, scale=1.0 / PIXEL_MAX)
        self._data = {"train": (x[:N_TRAIN], y[:N_TRAIN]), "test": (x[N_TRAIN:], y[N_TRAIN:])}
        self.image_shape = (channels, size, size)

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in self._data:
            raise DataError(f"digits has no split {split!r}; expected one of {list(self._data)}")
        return self._data[split]


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Digits]
