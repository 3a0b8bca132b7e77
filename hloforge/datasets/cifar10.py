"""`cifar10`: the CIFAR-10 binary version, as `cifar-10-binary.tar.gz` unpacks.

Reads from `data_dir` (or its `cifar-10-batches-bin/` subfolder): `data_batch_1.bin` …
`data_batch_5.bin` (train, concatenated in that order) and `test_batch.bin` (test).
Each file is headerless fixed-size records of 3,073 bytes: one label byte (0..9), then
3,072 pixel bytes in CHW order (1,024 red, 1,024 green, 1,024 blue, rows top to bottom).
The file length is checked against the record size before anything is read.

Training batches get a random 32×32 crop of the image zero-padded by 4, and a random
horizontal flip; every batch is then scaled to [0, 1] and standardised per channel with
the training set's mean and standard deviation.
"""

from __future__ import annotations

import os

import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.hookspecs import hookimpl
from hloforge.datasets.augment import Compose, HorizontalFlip, Normalize, RandomCrop, Transform
from hloforge.datasets.images import read_rgb, square_rgb
from hloforge.datasets.options import path
from hloforge.datasets.records import RecordDataset, check_labels, check_plain_records, map_records

SIDE, CHANNELS, CLASSES = 32, 3, 10
RECORD = 1 + CHANNELS * SIDE * SIDE  # 3,073
FILES = {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)}
MEAN = (0.4914, 0.4822, 0.4465)  # per-channel statistics of the 50,000 training images
STD = (0.2470, 0.2435, 0.2616)
PAD = 4


def read_batch_file(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch: (images uint8 [N, 3, 32, 32] view of the file, labels int32 [N])."""
    n = check_plain_records(path, RECORD, "CIFAR-10 (1 label + 3,072 CHW pixel bytes)")
    rec = map_records(path, n, RECORD, 0)
    labels = np.asarray(rec[:, 0], np.int32)
    check_labels(path, labels, CLASSES)
    return rec[:, 1:].reshape(n, CHANNELS, SIDE, SIDE), labels


class Cifar10(RecordDataset):
    name = "cifar10"
    num_classes = CLASSES
    image_shape = (CHANNELS, SIDE, SIDE)

    def __init__(self, data_dir: str = "data/cifar10"):
        super().__init__()
        data_dir = path("cifar10", "data_dir", data_dir)
        sub = os.path.join(data_dir, "cifar-10-batches-bin")
        self.data_dir = sub if os.path.isdir(sub) else data_dir

    def _load(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        for f in FILES[split]:  # where to get them and how to point at them, not the missing path alone
            if not os.path.isfile(os.path.join(self.data_dir, f)):
                raise DataError(f"{os.path.join(self.data_dir, f)} not found; expected CIFAR-10's binary version "
                                f"(data_batch_1.bin … data_batch_5.bin, test_batch.bin: cifar-10-binary.tar.gz, "
                                f"unpacked) in {self.data_dir}, or --data-dir where it is")
        parts = [read_batch_file(os.path.join(self.data_dir, f)) for f in FILES[split]]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def image_file(self, path: str) -> np.ndarray:
        """An image file as CIFAR-10 holds an image: 32×32 RGB (resized bilinearly)."""
        return square_rgb(path, SIDE, read_rgb)

    def transform(self, split: str, augment: bool = False) -> Transform:
        self._check_split(split)
        norm = Normalize(MEAN, STD)
        if augment and split == "train":
            return Compose((RandomCrop(SIDE, padding=PAD), HorizontalFlip(), norm))
        return Compose((norm,))


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Cifar10]
