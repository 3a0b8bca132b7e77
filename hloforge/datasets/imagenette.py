"""`imagenette`: the counted-record binaries `hloforge prepare imagenette` writes.

`data_dir/train.bin` and `data_dir/val.bin` (the `test` split) each hold a u32
little-endian record count, then that many records of one label byte and 3·S² pixel
bytes in CHW order (S² red, S² green, S² blue, rows top to bottom). The train images
are stored at S = `train_size` (256) so training can random-crop them to `crop` (224);
the val images are stored at S = `crop`, already centre-cropped. The file length is
checked against 4 + count·(1 + 3·S²) before any record is read, so a train file read
as val (or a file of another resolution) fails at load, naming the side its length fits and the option
(`train_size`, `crop`) that reads it.

The class count is the length of `data_dir/classes.json` (the label names prepare writes, label i
the i-th, the dataset's `class_names`) where the directory has one, else 10 (Imagenette's); a `classes`
option may widen the head past the file's count, never narrow it. A label byte at or past the count is
refused at load.

Training batches: a random `crop`×`crop` window of the 256² image and a random
horizontal flip; without augmentation the centre window (so the net still sees
`crop`²). Every batch is then scaled to [0, 1] and standardised with the ImageNet
mean and standard deviation.
"""

from __future__ import annotations

import json
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
    centre_window,
)
from hloforge.datasets.images import read_rgb, square_rgb
from hloforge.datasets.options import integer, path
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
CLASSES_FILE = "classes.json"  # the label names prepare writes beside the files, label i the i-th
MAX_CLASSES = 256  # the label is one byte


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


def _names_problem(names: object) -> str:
    """What is wrong with a classes.json's content ("" if nothing): a list of distinct names, 1..256 of them."""
    if not isinstance(names, list):
        kind = {dict: "an object", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
        return f"{kind.get(type(names), 'null')}, not a list"
    if not 0 < len(names) <= MAX_CLASSES:
        return f"{len(names)} names"
    odd = next((n for n in names if not isinstance(n, str)), None)
    if odd is not None:
        return f"a name that is not a string ({json.dumps(odd)})"
    repeated = sorted({n for n in names if names.count(n) > 1})
    return f"names repeated ({', '.join(map(repr, repeated[:3]))})" if repeated else ""


def stated_classes(data_dir: str) -> int | None:
    """The class count `data_dir/classes.json` states (its names' number); None where there is none."""
    names = stated_names(data_dir)
    return None if names is None else len(names)


def stated_names(data_dir: str) -> list[str] | None:
    """The class names `data_dir/classes.json` states, label i the i-th; None where there is none."""
    path = os.path.join(data_dir, CLASSES_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            names = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise DataError(f"{path}: cannot read it as JSON ({e}); expected the list of class names "
                        "`hloforge prepare imagenette` writes") from None
    problem = _names_problem(names)
    if problem:
        raise DataError(f"{path}: {problem}; expected a JSON list of 1..{MAX_CLASSES} distinct class names "
                        "(label i the i-th), as `hloforge prepare imagenette` writes")
    return list(names)


def read_counted_images(path: str, side: int, classes: int, option: str = "",
                        classes_from: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 3, side, side] view of the file, labels int32 [N]); `option`: the dataset option
    that sets `side`, named when the file holds images of another side (prepared at another size);
    `classes_from`: the file that gave `classes`, named when a label is past it."""
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
    check_labels(path, labels, classes, f" (the class count {classes_from} gives)" if classes_from else "")
    return rec[:, 1:].reshape(n, 3, side, side), labels


class Imagenette(RecordDataset):
    name = "imagenette"

    def __init__(self, data_dir: str = "data/imagenette", train_size: int = TRAIN_SIZE, crop: int = CROP,
                 classes: int | None = None):
        super().__init__()
        data_dir = path("imagenette", "data_dir", data_dir)
        train_size, crop = integer("imagenette", "train_size", train_size, 1), integer("imagenette", "crop", crop, 1)
        check_sides(train_size, crop)
        names = stated_names(data_dir)
        stated = None if names is None else len(names)
        if classes is None:
            classes = stated or CLASSES
        classes = integer("imagenette", "classes", classes, 1)
        if not 0 < classes <= MAX_CLASSES:
            raise DataError(f"imagenette: classes {classes} must be in 1..{MAX_CLASSES} (labels are one byte)")
        if stated and classes < stated:  # a head too narrow for the labels prepare wrote
            raise DataError(f"imagenette: classes {classes}, but {os.path.join(data_dir, CLASSES_FILE)} names "
                            f"{stated}; leave the option out to read its count")
        self.data_dir, self.train_size, self.crop, self.num_classes = data_dir, train_size, crop, classes
        self._classes_from = os.path.join(data_dir, CLASSES_FILE) if classes == stated else ""
        self.class_names = None if names is None else tuple(names)
        self.image_shape = (3, crop, crop)

    def side(self, split: str) -> int:
        return self.train_size if split == "train" else self.crop

    def _load(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        path = os.path.join(self.data_dir, FILES[split])
        if not os.path.isfile(path):  # a data_dir of JPEG class folders, the prepare step not yet taken
            folders = all(os.path.isdir(os.path.join(self.data_dir, s)) for s in ("train", "val"))
            held = f": {self.data_dir} holds the class folders themselves (train/, val/)" if folders else ""
            raise DataError(f"{path} not found{held}; expected the binaries `hloforge prepare imagenette SRC OUT` "
                            "writes from SRC/train/<class>/*.JPEG and SRC/val/<class>/*.JPEG, then --data-dir OUT")
        return read_counted_images(path, self.side(split), self.num_classes,
                                   "train_size" if split == "train" else "crop", self._classes_from)

    def image_file(self, path: str) -> np.ndarray:
        """An image file as `prepare imagenette` stores a val image: resized to train_size², its centre crop² kept."""
        return np.ascontiguousarray(centre_window(square_rgb(path, self.train_size, read_rgb), self.crop))

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
