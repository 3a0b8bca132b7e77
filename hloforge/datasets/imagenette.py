"""`imagenette`: the counted-record binaries `hloforge prepare imagenette` writes.

`data_dir/train.bin` and `data_dir/val.bin` (the `test` split) each hold a u32
little-endian record count, then that many records of one label byte and 3·S² pixel
bytes in CHW order (S² red, S² green, S² blue, rows top to bottom). The train images
are stored at S = `train_size` (256) so training can random-crop them to `crop` (224);
the val images are stored at S = `crop`, already centre-cropped. The file length is
checked against 4 + count·(1 + 3·S²) before any record is read, so a train file read
as val (or a file of another resolution) fails at load, naming the side its length fits and the option
(`train_size`, `crop`) that reads it.

Training batches: a random `crop`×`crop` window of the 256² image and a random
horizontal flip; without augmentation the centre window (so the net still sees
`crop`²). Every batch is then scaled to [0, 1] and standardised with the ImageNet
mean and standard deviation.
"""

from __future__ import annotations

import math
import os

import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.hookspecs import hookimpl
from hloforge.datasets.augment import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    Compose,
    HorizontalFlip,
    Normalize,
    RandomCrop,
    Transform,
)
from hloforge.datasets.records import (
    COUNT_HEADER,
    RecordDataset,
    check_counted_records,
    check_labels,
    file_size,
    map_records,
)

TRAIN_SIZE, CROP, CLASSES = 256, 224, 10
FILES = {"train": "train.bin", "test": "val.bin"}


def record_bytes(side: int) -> int:
    return 1 + 3 * side * side


def check_sides(train_size: int, crop: int, train_name: str = "train_size", crop_name: str = "crop") -> None:
    """The stored sides' rule: positive, and the val side (the crop) at most the train side, which
    training crops to it. The names are the caller's (prepare calls the crop val_size)."""
    if not 0 < crop <= train_size:
        raise DataError(f"imagenette: {crop_name} {crop} must be positive and at most {train_name} {train_size}")


def stored_side(path: str) -> int | None:
    """The side S whose records (1 + 3·S² bytes) the file's length fits, after its count; None if none."""
    size = file_size(path)
    with open(path, "rb") as f:
        head = f.read(COUNT_HEADER.size)
    if len(head) < COUNT_HEADER.size or size <= COUNT_HEADER.size:
        return None
    (count,) = COUNT_HEADER.unpack(head)
    per, over = divmod(size - COUNT_HEADER.size, count) if count else (0, 1)
    side = math.isqrt(max(per - 1, 0) // 3)
    return side if not over and side and record_bytes(side) == per else None


def read_counted_images(path: str, side: int, classes: int, option: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 3, side, side] view of the file, labels int32 [N]); `option`: the dataset option
    that sets `side`, named when the file holds images of another side (prepared at another size)."""
    try:
        n = check_counted_records(path, record_bytes(side), f"1 label + 3·{side}² CHW pixel bytes")
    except DataError as e:
        fits = stored_side(path) if option else None
        if fits is None or fits == side:
            raise
        raise DataError(f"{e}; its length fits {fits}×{fits} images, not {side}×{side}: prepared at another size? "
                        f"pass --data-opt {option}={fits}") from None
    rec = map_records(path, n, record_bytes(side), COUNT_HEADER.size)
    labels = np.asarray(rec[:, 0], np.int32)
    check_labels(path, labels, classes)
    return rec[:, 1:].reshape(n, 3, side, side), labels


class Imagenette(RecordDataset):
    name = "imagenette"

    def __init__(self, data_dir: str = "data/imagenette", train_size: int = TRAIN_SIZE, crop: int = CROP,
                 classes: int = CLASSES):
        super().__init__()
        check_sides(train_size, crop)
        if not 0 < classes <= 256:
            raise DataError(f"imagenette: classes {classes} must be in 1..256 (labels are one byte)")
        self.data_dir, self.train_size, self.crop, self.num_classes = data_dir, train_size, crop, classes
        self.image_shape = (3, crop, crop)

    def side(self, split: str) -> int:
        return self.train_size if split == "train" else self.crop

    def _load(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        return read_counted_images(os.path.join(self.data_dir, FILES[split]), self.side(split), self.num_classes,
                                   "train_size" if split == "train" else "crop")

    def transform(self, split: str, augment: bool = False) -> Transform:
        self._check_split(split)
        norm = Normalize(IMAGENET_MEAN, IMAGENET_STD)
        if split != "train":
            return Compose((norm,))
        if augment:
            return Compose((RandomCrop(self.crop), HorizontalFlip(), norm))
        return Compose((CenterCrop(self.crop), norm))


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Imagenette]
