"""`yolo`: box detection records in the YOLOv1 format (seed 002), built by `hloforge prepare yolo`.

On disk, `DIR/train.bin` and `DIR/test.bin`: a u32 little-endian record count, then records of

    3·S² uint8        the RGB image, CHW
    perCell·g² f32    the YOLOv1 target [perCell, g, g], perCell = boxes·5 + classes
    g² f32            the per-cell object mask [g, g]
    i32               nb, the number of boxes kept (at most MAX_BOXES)
    MAX_BOXES × 20    per box: i32 class, f32 x0, y0, x1, y1 as fractions of the image (unused slots zero)

(S = 224, g = 7, 30 channels: 157,728 bytes per record; the geometry is the dataset's options
and the loader checks the file length against it before reading). The target is
`hloforge.losses.detection.encode_yolov1` of the boxes, the same encoding a trained YOLOv1
head's labels use.

`prepare_yolo(src, out)` reads the layout YOLO tools use (Ultralytics / converted VOC and
VisDrone): `SRC/images/{train,val}/*.{jpg,jpeg,png}` with `SRC/labels/{train,val}/<stem>.txt`,
one line `class cx cy w h` (fractions of the image) per box; an image without a label file
has no boxes, but a split without its labels folder (`valid` for `val` is named), or none of whose
images has a label file, is refused, and a file in labels/ that is no image's `<stem>.txt` (`a.TXT`) is
said; an image of more than MAX_BOXES is refused, as is a box with no area inside the image; a
repeated box line is kept once, and said; hidden files (.DS_Store, macOS's `._a.jpg`) are skipped.
Images are resized (squashed) bilinearly to S×S, which leaves fractional boxes unchanged. val becomes test.bin.

`Yolo(data_dir)`: `arrays(split)` -> (x float32 [N, 3, S, S] = (pixels/255 − mean)/std with
ImageNet's mean and std, labels [N, perCell + 1, g, g]: target then mask), `boxes(split)` ->
rows (class, x0, y0, x1, y1) in pixels, `normalize(image01)` for a decoded image file.
"""

from __future__ import annotations

import inspect
import os
import struct
from collections.abc import Iterator

import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DataError, unreadable_text
from hloforge.core.hookspecs import hookimpl
from hloforge.datasets.augment import IMAGENET_MEAN, IMAGENET_STD, Normalize
from hloforge.datasets.images import ENDLESS, endless, read_rgb
from hloforge.datasets.options import integer, path
from hloforge.datasets.records import check_counted_records, map_records, replaced_together, write_counted

MAX_BOXES = 56
BOX_ROW = struct.Struct("<iffff")
MEAN = np.array(IMAGENET_MEAN, np.float32)
STD = np.array(IMAGENET_STD, np.float32)
SPLIT_FILES = {"train": "train.bin", "test": "test.bin"}
SOURCE_SPLITS = {"train": "train", "test": "val"}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def record_size(size: int, grid: int, per_cell: int) -> int:
    return 3 * size * size + 4 * per_cell * grid * grid + 4 * grid * grid + 4 + MAX_BOXES * BOX_ROW.size


def check_geometry(size: int, grid: int, boxes: int, classes: int) -> None:
    """The records' geometry rule, the loader's and prepare's: all positive, and no more grid cells
    across than pixels (a cell under a pixel wide holds no box centre of its own)."""
    for name, value in (("size", size), ("grid", grid), ("boxes", boxes), ("classes", classes)):
        integer("yolo", name, value, 1)
    if grid > size:
        raise DataError(f"yolo: grid {grid} is larger than the image size {size}; expected a grid of at most "
                        "size cells across")


class Yolo(Dataset):
    name = "yolo"
    pixels = Normalize(IMAGENET_MEAN, IMAGENET_STD)  # the stored bytes as normalize() scales them
    label_kind = "boxes"
    splits = tuple(SPLIT_FILES)

    def __init__(self, data_dir: str = "data/yolo", size: int = 224, grid: int = 7, boxes: int = 2,
                 classes: int = 20):
        check_geometry(size, grid, boxes, classes)
        data_dir = path("yolo", "data_dir", data_dir)
        self.data_dir, self.size, self.grid, self.boxes_per_cell = data_dir, size, grid, boxes
        self.num_classes = classes
        self.per_cell = 5 * boxes + classes
        self.image_shape = (3, size, size)
        self.record = record_size(size, grid, self.per_cell)
        self._cache: dict[str, tuple[np.ndarray, np.ndarray, list[np.ndarray]]] = {}

    def _load(self, split: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        if split not in SPLIT_FILES:
            raise DataError(f"yolo has no split {split!r}; expected one of {list(SPLIT_FILES)}")
        if split in self._cache:
            return self._cache[split]
        path = os.path.join(self.data_dir, SPLIT_FILES[split])
        if not os.path.isfile(path):  # the prepare step not yet taken, or another --data-dir meant
            raise DataError(f"{path} not found; expected the binaries `hloforge prepare yolo SRC OUT` writes from "
                            "SRC/images/{train,val} and SRC/labels/{train,val}, then --data-dir OUT")
        hint = (f" (size {self.size}, grid {self.grid}, {self.per_cell} channels per cell: {self.record:,} bytes "
                "per record; pass the options it was prepared with)")
        count = check_counted_records(path, self.record, "yolo", hint)
        raw = map_records(path, count, self.record, 4)
        s2, cells = 3 * self.size ** 2, self.grid ** 2
        images = raw[:, :s2].reshape(count, 3, self.size, self.size)
        lab = np.ascontiguousarray(raw[:, s2:s2 + 4 * (self.per_cell + 1) * cells]).view("<f4")
        labels = lab.reshape(count, self.per_cell + 1, self.grid, self.grid).astype(np.float32)
        tail = s2 + 4 * (self.per_cell + 1) * cells
        boxes = []
        for n in range(count):
            (nb,) = struct.unpack_from("<i", raw[n], tail)
            if not 0 <= nb <= MAX_BOXES:
                raise DataError(f"{path}: record {n} claims {nb} boxes; at most {MAX_BOXES} fit")
            rows = [BOX_ROW.unpack_from(raw[n], tail + 4 + k * BOX_ROW.size) for k in range(nb)]
            b = np.asarray(rows, np.float32).reshape(-1, 5)
            bad = ~((0 <= b[:, 0]) & (b[:, 0] < self.num_classes) & (b[:, 1:] >= 0).all(1) & (b[:, 1:] <= 1).all(1))
            if bad.any():  # a NaN fails the comparisons too
                k = int(np.argmax(bad))
                raise DataError(f"{path}: record {n} box {k} is {[round(float(v), 4) for v in b[k]]}; expected a "
                                f"class in 0..{self.num_classes - 1} and corners in [0, 1]")
            b[:, 1:] *= self.size
            boxes.append(b)
        if not np.isfinite(labels).all():
            n = int(np.argmax(~np.isfinite(labels).reshape(count, -1).all(1)))
            raise DataError(f"{path}: record {n}'s target holds a NaN or an infinity; corrupt")
        x = self.normalize(images.astype(np.float32) / 255.0)
        self._cache[split] = (x, labels, boxes)
        return self._cache[split]

    def normalize(self, image01: np.ndarray) -> np.ndarray:
        """RGB in [0, 1], channels first ([3, S, S] or [N, 3, S, S]), as the net reads it."""
        shape = (3, 1, 1) if image01.ndim == 3 else (1, 3, 1, 1)
        return ((image01 - MEAN.reshape(shape)) / STD.reshape(shape)).astype(np.float32)

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        x, y, _ = self._load(split)
        return x, y

    def boxes(self, split: str) -> list[np.ndarray]:
        return self._load(split)[2]


# ---------------------------------------------------------------------------------------- prepare
def read_label_file(path: str, classes: int) -> np.ndarray:
    """Rows (class, cx, cy, w, h) of a YOLO txt label file; any malformed line is an error naming it."""
    if endless(path):
        raise DataError(f"{path}: {ENDLESS}; expected a YOLO label file")
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark (Windows Notepad's) is no data
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read it as a UTF-8 YOLO label file ({unreadable_text(e)})") from None
    rows = []
    for ln, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            values = [float(v) for v in parts]
        except ValueError:
            values = []
        # the class as Ultralytics reads it, a number: "0.0" (a float column written out) is class 0
        if len(values) != 5 or not values[0].is_integer():
            raise DataError(f"{path}:{ln}: expected 'class cx cy w h', got {line.strip()!r}{_misread(values)}")
        cls, cx, cy, w, h = int(values[0]), *values[1:]
        if not 0 <= cls < classes:
            raise DataError(f"{path}:{ln}: class {cls} is outside 0..{classes - 1} (--classes {classes})")
        if not (0 < w <= 1 and 0 < h <= 1 and 0 <= cx <= 1 and 0 <= cy <= 1):  # a NaN fails too
            raise DataError(f"{path}:{ln}: box centre must lie in [0, 1] and its size in (0, 1], "
                            f"got {line.strip()!r}")
        rows.append((cls, cx, cy, w, h))
    return np.asarray(rows, np.float64).reshape(-1, 5)


def listed(folder: str) -> list[str]:
    """The files of `folder`, sorted. Hidden ones are no one's data: .DS_Store, and the `._a.jpg` AppleDouble
    files macOS writes beside each file it copies to a USB drive or zips, which no decoder reads."""
    return sorted(n for n in os.listdir(folder) if not n.startswith(".")
                  and os.path.isfile(os.path.join(folder, n))) if os.path.isdir(folder) else []


def _misread(values: list[float]) -> str:
    """What a label line of numbers that is no box most likely is, as a hint ("" when none)."""
    if len(values) == 5:
        return f" (class {values[0]:g} is no integer id)"
    if len(values) >= 7 and len(values) % 2:  # Ultralytics' segmentation labels: class x1 y1 x2 y2 …
        return (f" (a polygon of {len(values) // 2} points, a segmentation label? a detection label is its box: "
                "class, centre and size)")
    return ""


def _unread(image_dir: str, label_dir: str, names: list[str]) -> list[str]:
    """One warning line per kind of file of a split that prepare leaves out, so none is dropped unseen: files
    in images/ that are no .jpg/.jpeg/.png (a .bmp, a .webp), and label files of no image (a stem typo)."""
    out = []
    others = [n for n in listed(image_dir) if not n.lower().endswith(IMAGE_SUFFIXES)]
    if others:
        out.append(f"{image_dir}: skipped {len(others)} file(s) that are not {'/'.join(IMAGE_SUFFIXES)} images; "
                   f"the first: {others[0]}")
    stems = {os.path.splitext(n)[0]: n for n in names}
    labels = listed(label_dir)
    orphans = [n for n in labels if not (n.endswith(".txt") and n[:-4] in stems)]  # a.TXT, a.txt.txt, notes.md
    if len(orphans) == len(labels):  # every image would be read as one of no object: a set no model can learn
        held = f"it holds {len(orphans)} other file(s), the first {orphans[0]}" if orphans else "it is empty"
        raise DataError(f"{label_dir}: no label file of any image in {image_dir} (expected <image stem>.txt; {held}); "
                        "every image would have no boxes")
    if orphans:
        stem = os.path.splitext(orphans[0])[0]
        whose = f" (image {stems[stem]}'s label must be named {stem}.txt)" if stem in stems else ""
        out.append(f"{label_dir}: {len(orphans)} label file(s) of no image (their boxes are not used); the first: "
                   f"{orphans[0]}{whose}")
    return out


def near_miss(folder: str) -> str:
    """For a missing SRC/{images,labels}/<split>: a sibling folder named like it (Roboflow's `valid`, a
    `Train`, `training`), as a hint ("" when none)."""
    parent, split = os.path.split(folder)
    found = sorted(d for d in os.listdir(parent) if d != split and d.lower()[:3] == split[:3]
                   and os.path.isdir(os.path.join(parent, d))) if os.path.isdir(parent) else []
    return f" ({os.path.join(parent, found[0])} is there: rename it {split})" if found else ""


def _records(src: str, split: str, size: int, grid: int, boxes: int, classes: int,
             warnings: list[str]) -> Iterator[bytes]:
    from PIL import Image

    from hloforge.losses.detection import encode_yolov1

    image_dir = os.path.join(src, "images", split)
    label_dir = os.path.join(src, "labels", split)
    if not os.path.isdir(image_dir):
        raise DataError(f"{image_dir} not found; prepare yolo expects SRC/images/{{train,val}} and "
                        f"SRC/labels/{{train,val}}{near_miss(image_dir)}")
    if not os.path.isdir(label_dir):  # read as no boxes in any image, it trained (and scored) nothing
        raise DataError(f"{label_dir} not found; expected the label files (<image stem>.txt) of {image_dir} there"
                        f"{near_miss(label_dir)}")
    names = [n for n in listed(image_dir) if n.lower().endswith(IMAGE_SUFFIXES)]
    if not names:
        raise DataError(f"{image_dir} holds no .jpg/.jpeg/.png images")
    warnings.extend(_unread(image_dir, label_dir, names))
    per_cell = 5 * boxes + classes
    repeated: list[tuple[str, int]] = []  # (label file, the copies of a box dropped)
    for name in names:
        path = os.path.join(image_dir, name)
        img = read_rgb(path).resize((size, size), Image.Resampling.BILINEAR)
        label = os.path.join(label_dir, os.path.splitext(name)[0] + ".txt")
        rows = read_label_file(label, classes) if os.path.exists(label) else np.zeros((0, 5))
        first = np.unique(rows, axis=0, return_index=True)[1]
        if len(first) < len(rows):  # one object, one box: a copy could never be matched, capping the AP at 0.5
            repeated.append((label, len(rows) - len(first)))
            rows = rows[np.sort(first)]  # in the file's order, as every other file's boxes
        if len(rows) > MAX_BOXES:  # cut, the eval's truth would lack boxes the image has: a plausible wrong mAP
            raise DataError(f"{label}: {len(rows)} boxes; a yolo record holds at most {MAX_BOXES} per image")
        xyxy = np.column_stack([rows[:, 0], rows[:, 1] - rows[:, 3] / 2, rows[:, 2] - rows[:, 4] / 2,
                                rows[:, 1] + rows[:, 3] / 2, rows[:, 2] + rows[:, 4] / 2])
        xyxy[:, 1:] = np.clip(xyxy[:, 1:], 0.0, 1.0)
        stored = xyxy[:, 1:].astype(np.float32) * np.float32(size)  # the corners as training reads them back
        thin = np.any(stored[:, 2:] <= stored[:, :2], axis=1)
        if thin.any():  # a sliver at the edge, clipped or rounded to no area: training would refuse it
            cls, cx, cy, w, h = rows[int(np.argmax(thin))]
            raise DataError(f"{label}: box '{int(cls)} {cx:g} {cy:g} {w:g} {h:g}' has no area inside the image once "
                            f"clipped to it at {size}×{size}; expected a box that covers part of the image")
        target = np.zeros((per_cell + 1, grid, grid), np.float32)
        for cls, *box in xyxy:
            encode_yolov1(target, int(cls), np.asarray(box) * size, size, boxes)
        table = bytearray(MAX_BOXES * BOX_ROW.size)
        for k, (cls, x0, y0, x1, y1) in enumerate(xyxy):
            BOX_ROW.pack_into(table, k * BOX_ROW.size, int(cls), x0, y0, x1, y1)
        chw = np.asarray(img, np.uint8).transpose(2, 0, 1)
        yield (chw.tobytes() + target[:per_cell].astype("<f4").tobytes() + target[per_cell].astype("<f4").tobytes()
               + struct.pack("<i", len(xyxy)) + bytes(table))
    if repeated:
        warnings.append(f"{label_dir}: {sum(k for _, k in repeated)} repeated box line(s) in {len(repeated)} file(s) "
                        f"kept once each; the first: {repeated[0][0]}")


def prepare_yolo(src: str, out: str, size: int = 224, grid: int = 7, boxes: int = 2,
                 classes: int = 20) -> dict[str, object]:
    check_geometry(size, grid, boxes, classes)  # before anything is read or written
    record = record_size(size, grid, 5 * boxes + classes)
    counts, warnings = {}, []
    with replaced_together(out) as stage:
        for split, source in SOURCE_SPLITS.items():
            fname = SPLIT_FILES[split]  # keyed by file name, as every preparer's summary: the caller joins OUT
            counts[fname] = write_counted(stage(fname), _records(src, source, size, grid, boxes, classes, warnings),
                                          record)
    # the dataset's options these files need where they are not the loader's defaults (it takes the
    # geometry from its options, not from the files)
    loader = inspect.signature(Yolo).parameters
    asked = {"size": size, "grid": grid, "boxes": boxes, "classes": classes}
    return {"records": counts, "warnings": warnings,
            "data_options": [f"{k}={v}" for k, v in asked.items() if v != loader[k].default]}


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Yolo]
