"""Fixed-size binary records on disk: the length check every loader does before reading, and the
record-dataset interface the trainer and the streaming producers share.

A record dataset keeps its stored pixels as they are on disk (uint8, memory-mapped, so a
producer touching one shard of a split reads only that shard) and says how a batch of them
becomes what the net reads:

- `records(split)` -> (stored images [N, C, H, W] uint8, labels int32 [N] or [N, H, W])
- `transform(split, augment)` -> the `augment.Transform` from stored batch to float32 net input:
  the training augmentation when `augment` is true on the train split, else the deterministic one
- `arrays(split)` -> the whole split through the deterministic transform (what eval, `cam` and
  any dataset-agnostic caller read)
"""

from __future__ import annotations

import abc
import contextlib
import os
import struct
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DISK_FULL, DataError
from hloforge.core.paths import new_dirs
from hloforge.datasets.augment import Transform, apply_all

COUNT_HEADER = struct.Struct("<I")  # the u32 little-endian record count of the counted formats


def write_counted(path: str, records: Iterable[bytes], record: int) -> int:
    """A u32 LE count then the records, written to path.tmp and renamed over path; returns the count."""
    tmp = path + ".tmp"
    count = 0
    try:
        with open(tmp, "wb") as f:
            f.write(COUNT_HEADER.pack(0))
            for r in records:
                if len(r) != record:
                    raise DataError(f"{path}: record {count} is {len(r)} bytes, expected {record}")
                f.write(r)
                count += 1
            f.seek(0)
            f.write(COUNT_HEADER.pack(count))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return count


@contextlib.contextmanager
def replaced_together(out: str, what: str = "OUT", again: str = "prepare again") -> Iterator[Callable[[str], str]]:
    """A preparer's files as one set: inside the block each file NAME is written at `stage(NAME)`, a hidden
    path in `out`; when the block ends every staged file is renamed over `out/NAME`, and when it raises none
    is (and the staged ones are removed). So a prepare that fails on its second split leaves the earlier
    set whole, not a new train.bin beside an old val.bin and an old classes.json. `out` (the option `what`) is
    made for the block, and where the block raises, so are the directories it made on the way (paths.new_dirs).
    A full disk is said naming the file, then what to do (`again`: Model.save's set is its config and net)."""
    staged: dict[str, str] = {}

    def stage(name: str) -> str:
        staged[name] = os.path.join(out, f".{name}.staged")
        return staged[name]

    with new_dirs(out, what):
        try:
            yield stage
            for name, path in staged.items():
                os.replace(path, os.path.join(out, name))
        except OSError as e:  # a write's error names no file: said with the one being written
            if e.errno not in DISK_FULL or not staged:
                raise
            raise DataError(f"could not write {os.path.join(out, next(reversed(staged)))}: {e.strerror} (what {out} "
                            f"held before is untouched, the new files removed); free space and {again}") \
                from None
        finally:
            for path in staged.values():
                if os.path.exists(path):
                    os.remove(path)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        raise DataError(f"{path} not found") from None


def check_plain_records(path: str, record: int, what: str) -> int:
    """The number of `record`-byte records in a headerless file; its length must be a positive multiple."""
    size = file_size(path)
    if size == 0 or size % record:
        raise DataError(f"{path}: {size:,} bytes is not a whole number of {record:,}-byte {what} records "
                        f"({size // record} records and {size % record} bytes over); truncated or not this format")
    return size // record


def check_counted_records(path: str, record: int, what: str, hint: str = "") -> int:
    """The record count of a file holding a u32 LE count then `count` records of `record` bytes;
    the file length must be exactly 4 + count·record, checked before any record is read."""
    size = file_size(path)
    if size < COUNT_HEADER.size:
        raise DataError(f"{path}: {size} bytes is too short for the 4-byte record count")
    with open(path, "rb") as f:
        (count,) = COUNT_HEADER.unpack(f.read(COUNT_HEADER.size))
    want = COUNT_HEADER.size + count * record
    if size != want:
        raise DataError(f"{path}: {size:,} bytes, but its header's {count:,} records of {record:,} bytes "
                        f"({what}) need {want:,}; truncated, or not this format{hint}")
    return count


def map_records(path: str, count: int, record: int, offset: int) -> np.ndarray:
    """A read-only [count, record] uint8 memory map (an empty array for an empty file)."""
    if count == 0:
        return np.zeros((0, record), np.uint8)
    return np.memmap(path, np.uint8, mode="r", offset=offset, shape=(count, record))


def check_labels(path: str, labels: np.ndarray, classes: int, whence: str = "") -> None:
    """Labels below `classes`; `whence`: where that count came from, said after the range."""
    top = int(labels.max(initial=0))
    if top >= classes:
        raise DataError(f"{path}: label {top} out of range 0..{classes - 1}{whence}")


class RecordDataset(Dataset, abc.ABC):
    """Shared plumbing of the uint8 record datasets (cifar10, imagenette, brats)."""

    name = ""
    splits: tuple[str, ...] = ("train", "test")

    def __init__(self) -> None:
        self._records: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise DataError(f"{self.name} has no split {split!r}; expected one of {list(self.splits)}")

    @abc.abstractmethod
    def _load(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The split's stored uint8 images and its labels, read after the file-length checks."""

    def records(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        self._check_split(split)
        if split not in self._records:
            self._records[split] = self._load(split)
        return self._records[split]

    @abc.abstractmethod
    def transform(self, split: str, augment: bool = False) -> Transform:
        """The host transform from stored records to what the net reads (random only when `augment`)."""

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in self._arrays:
            x, y = self.records(split)
            self._arrays[split] = apply_all(self.transform(split, augment=False), x, y)
        return self._arrays[split]
