"""`mnist`: the IDX files of MNIST (or any dataset in that format), plain or gzipped.

Reads from `data_dir`: train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each optionally with `.gz`).
IDX: a big-endian u32 magic (0x00000803 images, 0x00000801 labels), u32 dims,
then u8 data. The file length is checked against the header before reading.
Pixels are scaled to [0, 1] and standardised with MNIST's mean 0.1307 and
standard deviation 0.3081.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib

import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DataError
from hloforge.core.hookspecs import hookimpl
from hloforge.datasets.augment import Normalize
from hloforge.datasets.options import path

IMAGES_MAGIC, LABELS_MAGIC = 0x803, 0x801
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
MEAN, STD = 0.1307, 0.3081


def _open(data_dir: str, stem: str, magic: int, rank: int) -> tuple[str, bytes]:
    """(the IDX file's path, its bytes): the header, then, under the right magic, at most one byte more than
    it says follow, so a file (a .gz above all) far longer than its header is never read whole into memory."""
    for name in (stem, stem + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            try:
                with opener(path, "rb") as f:
                    head = f.read(4 + 4 * rank)
                    ours = len(head) == 4 + 4 * rank and struct.unpack(">I", head[:4])[0] == magic
                    body = math.prod(struct.unpack(f">{rank}I", head[4:])) if ours else 0
                    parts, left = [head], body + 1
                    while left > 0 and (part := f.read(min(left, 1 << 24))):
                        parts.append(part)
                        left -= len(part)
                    return path, b"".join(parts)
            except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt gzip stream
                # the OS's reason (a directory, no permission) without its errno and the path again; gzip's as it is
                why = e.strerror.lower() if isinstance(e, OSError) and e.strerror else str(e)
                raise DataError(f"{path}: cannot read it ({why}); expected an MNIST IDX file") from None
    raise DataError(f"{os.path.join(data_dir, stem)}[.gz] not found; expected the MNIST IDX files in {data_dir}, "
                    "or --data-dir where they are")


def read_idx(path: str, raw: bytes, magic: int, rank: int) -> np.ndarray:
    if len(raw) < 4 + 4 * rank:
        raise DataError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    got = struct.unpack(">I", raw[:4])[0]
    if got != magic:
        raise DataError(f"{path}: magic 0x{got:08x}, expected 0x{magic:08x} (IDX u8, rank {rank})")
    dims = struct.unpack(f">{rank}I", raw[4:4 + 4 * rank])
    want = 4 + 4 * rank + math.prod(dims)  # exact: np.prod wraps past 2**63
    if len(raw) != want:
        held = f"{len(raw)} bytes" if len(raw) < want else f"more than {want} bytes"
        raise DataError(f"{path}: {held}, but its header {list(dims)} needs {want}; truncated or corrupt")
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * rank).reshape(dims)


class Mnist(Dataset):
    name = "mnist"
    num_classes = 10
    image_shape = (1, 28, 28)
    pixels = Normalize((MEAN,), (STD,))  # bytes ÷ 255, as arrays() scales them

    def __init__(self, data_dir: str = "data/mnist"):
        self.data_dir = path("mnist", "data_dir", data_dir)
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in FILES:
            raise DataError(f"mnist has no split {split!r}; expected one of {list(FILES)}")
        if split not in self._cache:
            img_stem, lab_stem = FILES[split]
            ipath, iraw = _open(self.data_dir, img_stem, IMAGES_MAGIC, 3)
            images = read_idx(ipath, iraw, IMAGES_MAGIC, 3)
            if images.shape[1:] != self.image_shape[1:]:  # the nets are built for 28×28
                raise DataError(f"{ipath}: images of {images.shape[1]}×{images.shape[2]} pixels, expected "
                                f"{self.image_shape[1]}×{self.image_shape[2]}")
            lpath, lraw = _open(self.data_dir, lab_stem, LABELS_MAGIC, 1)
            labels = read_idx(lpath, lraw, LABELS_MAGIC, 1)
            if len(images) != len(labels):
                raise DataError(f"{self.data_dir}: {len(images)} {split} images but {len(labels)} labels")
            if labels.max(initial=0) >= self.num_classes:
                raise DataError(f"{lpath}: label {labels.max()} out of range 0..{self.num_classes - 1}")
            x = ((images.astype(np.float32) / 255.0 - MEAN) / STD)[:, None]
            self._cache[split] = (x, labels.astype(np.int32))
        return self._cache[split]


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Mnist]
