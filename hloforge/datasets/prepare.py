"""`hloforge prepare NAME SRC OUT`: build a dataset's binaries from the layout users download.

`PREPARERS` maps a dataset name to its `Preparer`: the function and its command-line options.
Adding a dataset is one entry there; the CLI builds its subcommand from it.

- imagenette: SRC is an extracted Imagenette (or any ImageNet-style) tree, `SRC/train/<class>/*.JPEG`
  and `SRC/val/<class>/*.JPEG`. Classes are the train folders in sorted order, hidden ones
  (.ipynb_checkpoints) and a Mac zip's __MACOSX left out (for Imagenette the WordNet ids, so label 0 is
  n01440764, tench); val must use the same folders. Folders named by number whose
  labels are not their numbers (1, 2, 10: labels 0, 2, 1) are said. Each image
  is decoded with Pillow, converted to RGB and resized bilinearly to 256×256 (`train_size`); a val image
  is then centre-cropped to 224×224 (`val_size`), the window training's centre crop takes of the same
  image, so val shows objects at the scale training does (a whole image resized to 224 would show them
  256/224 smaller); written as `OUT/train.bin` / `OUT/val.bin` in `hloforge.datasets.imagenette`'s
  format, with `OUT/classes.json` naming the labels (the dataset reads its class count there). An
  image Pillow cannot decode is skipped: one line per split counts them and names the first with its
  error; so are, one line per kind, the image files of another format (.webp, .bmp: convert them), the
  folders nested in class folders and the images beside the class folders, none of which are read. A
  class with no .jpeg/.jpg/.png image in a split (an empty folder, one of .webp files), or none of whose
  images decodes, or a split without one image, is refused, as is a link among the class folders to
  nothing (a drive not mounted). Where the
  sizes are not the dataset's defaults (256², 224²), the `--data-opt` options that read the files
  are printed.
- brats: SRC is MSD's `Task01_BrainTumour` (dataset.json, imagesTr/*.nii.gz 4D (X, Y, Z, 4),
  labelsTr/*.nii.gz 3D), read with nibabel. The split is by patient (adjacent slices of one
  brain are near-duplicates, so a slice-level split would leak): `val_frac` of the volumes,
  drawn with `seed`, go to val. Each modality is z-scored over that volume's brain (nonzero)
  voxels — over the whole volume the mostly-zero background would crush the tissue contrast —
  then quantised (`brats.quantize`); the plane is centre-cropped (or zero-padded) to S×S.
  Kept slices are those with at least `min_tumor_px` tumour voxels, every `stride`-th; 2.5D
  (`context` K) stacks slices z−K·step … z+K·step, replicated at the volume ends, around the
  same kept centres. Writes `OUT/train.bin`, `OUT/val.bin` in `hloforge.datasets.brats`'s
  format and `OUT/split.json` (the volumes on each side and the options). Where the size or context
  is not the dataset's default (240², 2D), the `--data-opt` options that read the files are printed.

- yolo: SRC in the YOLO txt layout (`SRC/images/{train,val}`, `SRC/labels/{train,val}`), written as
  YOLOv1 records `OUT/train.bin`, `OUT/test.bin` (`hloforge.datasets.yolo`). A missing labels folder
  (Roboflow's `valid` named) is refused; label files of no image (`a.TXT`) are said.

Output files are written to a sibling temporary file and renamed, so an interrupted
prepare leaves no truncated binary behind.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError
from hloforge.datasets import brats, imagenette, yolo
from hloforge.datasets.augment import centre_window
from hloforge.datasets.images import square_rgb
from hloforge.datasets.records import replaced_together, write_counted

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


@attrs.frozen
class Option:
    name: str  # the keyword argument; the flag is --name with - for _
    type: type
    default: Any
    help: str
    lo: int | None = None  # an int option's least value, refused below it at parse time (None: any int)


@attrs.frozen
class Preparer:
    # run(src, out, **options) -> a summary: its "records" maps file -> count; its "warnings", if any, are
    # one line each that the CLI prints (e.g. the images it skipped)
    run: Callable[..., dict[str, Any]]
    help: str
    options: tuple[Option, ...] = ()


# ---------------------------------------------------------------------------------------- imagenette
def _no_class(name: str) -> bool:
    """A folder that is no one's class, as hidden files are no one's image: a hidden one (Jupyter's
    .ipynb_checkpoints, .git) or the __MACOSX of AppleDouble files a zip made on a Mac unpacks beside its folders."""
    return name.startswith(".") or name == "__MACOSX"


def _class_folders(split_dir: str) -> list[str]:
    if not os.path.isdir(split_dir):
        src = os.path.dirname(split_dir)
        if not os.path.isdir(src):
            raise DataError(f"{src} not found; expected a folder of class folders of images (SRC/train/<class>/*.JPEG "
                            "and SRC/val/<class>/*.JPEG)")
        held = sorted(d for d in os.listdir(src) if not _no_class(d) and os.path.isdir(os.path.join(src, d)))
        # a user's own SRC/<class>/ folders, not yet split: say where their images go
        split = (f": {src} holds folders {_named(held)}, its classes not yet split? move each class's images into "
                 f"{src}/train/<class>/ and some of them (a fifth, say) into {src}/val/<class>/"
                 if held and not {"train", "val"} & set(held) else "")
        parent, name = os.path.split(os.path.abspath(src))
        other = os.path.join(parent, "val" if name == "train" else "train")
        if name in ("train", "val") and os.path.isdir(other):  # SRC/train given for SRC: its classes read as splits
            split = f": {src} is itself a split, beside {other}; pass their parent, {parent}, as SRC"
        raise DataError(f"{split_dir} not found{split}; expected class folders of images "
                        "(SRC/train/<class>/*.JPEG and SRC/val/<class>/*.JPEG)")
    shown = sorted(d for d in os.listdir(split_dir) if not _no_class(d))
    # a link to a class folder on a drive not mounted (or a link loop) is no folder: left out unsaid, its class was lost
    dangling = [p for d in shown if os.path.islink(p := os.path.join(split_dir, d)) and not os.path.exists(p)]
    if dangling:
        raise DataError(f"{dangling[0]}: a link to {os.readlink(dangling[0])}, which is not there (or links back to "
                        f"itself){f'; so are {_named(dangling[1:])}' if dangling[1:] else ''}; expected a class "
                        "folder: mount or mend what it links to, or remove the link")
    classes = [d for d in shown if os.path.isdir(os.path.join(split_dir, d))]
    if not classes:
        raise DataError(f"{split_dir} has no class folders")
    return classes


def _named(paths: list[str], shown: int = 3) -> str:
    """The first `shown` of `paths`, and how many more."""
    more = f", and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _scan_split(split_dir: str, classes: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(per class, the image files prepare reads; the split's warnings: the image files of another format
    Pillow knows (.webp, .bmp), the folders nested in class folders and the images lying beside the class
    folders, none of which prepare reads). A class with no image it reads is refused, naming what it holds,
    as is a split with none: before any image is decoded. Hidden files (.DS_Store) and files of no image
    format (notes.txt) are no one's images and go unsaid."""
    from PIL import Image

    Image.init()
    pillow = {s.lower() for s in Image.registered_extensions()}
    images: dict[str, list[str]] = {}
    others: dict[str, list[str]] = {}
    nested: dict[str, list[str]] = {}
    for cls in classes:
        folder = os.path.join(split_dir, cls)
        names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
        images[cls] = [n for n in names if n.lower().endswith(IMAGE_SUFFIXES)]
        others[cls] = [n for n in names if n not in images[cls] and os.path.splitext(n)[1].lower() in pillow]
        nested[cls] = [n for n in names if n not in images[cls] and os.path.isdir(os.path.join(folder, n))]
    wanted = "/".join(IMAGE_SUFFIXES)
    if not any(images.values()):
        down = [os.path.join(cls, n) for cls in classes for n in nested[cls]]
        inside = f" but in folders inside them ({_named(down)}): move their images up" if down else ""
        raise DataError(f"{split_dir}: no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders{inside}")
    empty = [cls for cls in classes if not images[cls]]
    if empty:
        held = [f"{cls}: {_plural(len(others[cls]), 'other image file')}, the first {others[cls][0]}"
                for cls in empty if others[cls]]
        # images one folder down (cat/batch1/*.jpg) are there, not read: 'add some' sent the user to find more
        inside = [f"{cls}: {_plural(len(nested[cls]), 'folder')} inside it, {_named(nested[cls])}"
                  for cls in empty if nested[cls] and not others[cls]]
        which = f"folders {', '.join(empty)} hold" if len(empty) > 1 else f"folder {empty[0]} holds"
        detail = f" ({'; '.join(held + inside)})" if held or inside else ""
        fix = ("convert them" if held else "move their images up (a class's images lie directly in its folder)"
               if inside else "add some")
        raise DataError(f"{split_dir}: class {which} no {wanted} image{detail}; each class needs at least one in "
                        f"each split: {fix}, or remove the class from both splits")
    warnings = []
    other_paths = [os.path.join(split_dir, cls, n) for cls in classes for n in others[cls]]
    if other_paths:
        one = len(other_paths) == 1
        warnings.append(f"{split_dir}: skipped {_plural(len(other_paths), 'image file')} that {'is' if one else 'are'} "
                        f"not {wanted} (convert {'it' if one else 'them'} to use {'it' if one else 'them'}): "
                        f"{_named(other_paths)}")
    nested_paths = [os.path.join(split_dir, cls, n) for cls in classes for n in nested[cls]]
    if nested_paths:
        warnings.append(f"{split_dir}: skipped {_plural(len(nested_paths), 'folder')} inside class folders (a "
                        f"class's images lie directly in its folder): {_named(nested_paths)}")
    loose = sorted(os.path.join(split_dir, n) for n in os.listdir(split_dir)
                   if not n.startswith(".") and os.path.splitext(n)[1].lower() in pillow)
    if loose:
        warnings.append(f"{split_dir}: skipped {_plural(len(loose), 'image file')} in no class folder (a class's "
                        f"images lie in SRC/<split>/<class>/): {_named(loose)}")
    return images, warnings


def _image_records(split_dir: str, classes: list[str], images: dict[str, list[str]], resized: int, side: int,
                   skipped: list[str]) -> Iterator[bytes]:
    """The split's records, class by class (`images`: _scan_split's): each image resized to `resized`², then
    its centre `side`² kept (centre_window, as training crops without augmentation). An image Pillow cannot
    decode is left out and appended to `skipped` as "PATH (its error)"; a class none of whose images decodes is refused
    (raised before any file of the set is renamed into place)."""
    for label, cls in enumerate(classes):
        folder = os.path.join(split_dir, cls)
        bad_before = len(skipped)
        for fname in images[cls]:
            path = os.path.join(folder, fname)
            try:
                chw = np.ascontiguousarray(centre_window(square_rgb(path, resized), side))
            except Exception as e:  # Pillow raises many types for a bad file (OSError, SyntaxError, ValueError, …)
                skipped.append(f"{path} ({' '.join(str(e).split()) or type(e).__name__})")
                continue
            yield bytes([label]) + chw.tobytes()
        if len(skipped) - bad_before == len(images[cls]):
            raise DataError(f"{folder}: none of its {len(images[cls])} images can be decoded (the first: "
                            f"{skipped[bad_before]}); each class needs at least one")


def prepare_imagenette(src: str, out: str, train_size: int = imagenette.TRAIN_SIZE,
                       val_size: int = imagenette.CROP) -> dict[str, Any]:
    imagenette.check_sides(train_size, val_size, "train_size", "val_size")  # files its loader can read
    classes = _class_folders(os.path.join(src, "train"))
    if len(classes) > imagenette.MAX_CLASSES:
        raise DataError(f"{src}/train has {len(classes)} class folders; the format's one label byte holds "
                        f"{imagenette.MAX_CLASSES}")
    val_classes = _class_folders(os.path.join(src, "val"))
    if val_classes != classes:
        extra = sorted(set(val_classes) - set(classes))
        missing = sorted(set(classes) - set(val_classes))
        # 'café' composed (é one code point) in one split, decomposed (e + ´) in the other: macOS writes the latter
        nfc = {unicodedata.normalize("NFC", c) for c in extra} == {unicodedata.normalize("NFC", c) for c in missing}
        forms = ("; the names differ in Unicode form alone (é as one code point in one split, e + accent in the "
                 "other, as macOS writes them): rename one split's folders") if nfc else ""
        raise DataError(f"{src}/val has class folders {extra} not in train and lacks {missing}{forms}; both splits "
                        "must use the same classes")
    summary: dict[str, Any] = {"classes": classes, "records": {}, "skipped": {}, "warnings": []}
    # folders 1, 2, ..., 10 read as label = number, which the sorted names' order is not ('10' sorts before '2')
    renumbered = [f"label {i} is folder {c!r}" for i, c in enumerate(classes) if c.isdecimal() and int(c) != i]
    if renumbered and all(c.isdecimal() for c in classes):
        summary["warnings"].append(f"{src}/train: class folders named by number are labelled by their place in name "
                                   f"order, not by their number ({_named(renumbered)}); label i is the i-th name of "
                                   f"{os.path.join(out, imagenette.CLASSES_FILE)}")
    with replaced_together(out) as stage:
        scanned = {split: _scan_split(os.path.join(src, split), classes) for split in ("train", "val")}
        for split, fname, side in (("train", "train.bin", train_size), ("val", "val.bin", val_size)):
            skipped: list[str] = []
            split_dir = os.path.join(src, split)
            images, warnings = scanned[split]
            summary["warnings"].extend(warnings)
            n = write_counted(stage(fname), _image_records(split_dir, classes, images, train_size, side, skipped),
                              imagenette.record_bytes(side))
            summary["records"][fname] = n
            summary["skipped"][split] = skipped
            if skipped:
                summary["warnings"].append(f"{split_dir}: skipped {len(skipped)} of {n + len(skipped)} images "
                                           f"that cannot be decoded; the first: {skipped[0]}")
        with open(stage(imagenette.CLASSES_FILE), "w", encoding="utf-8") as f:
            json.dump(classes, f, indent=1)
    # the dataset's options these files need where they are not its defaults (256² / 224²; the class count
    # it reads from classes.json)
    read_as = {"train_size": (train_size, imagenette.TRAIN_SIZE), "crop": (val_size, imagenette.CROP)}
    summary["data_options"] = [f"{k}={v}" for k, (v, default) in read_as.items() if v != default]
    return summary


# ---------------------------------------------------------------------------------------- brats
def znorm_brain(vol: np.ndarray) -> np.ndarray:
    """z-score one modality over its nonzero (brain) voxels; background stays exactly 0."""
    vol = np.asarray(vol, np.float32)
    brain = vol != 0
    out = np.zeros_like(vol)
    if brain.any():
        v = vol[brain]
        sd = float(v.std()) or 1.0
        out[brain] = (v - float(v.mean())) / sd
    return out


def fit_plane(a: np.ndarray, size: int) -> np.ndarray:
    """Centre-crop or zero-pad the two leading (in-plane) axes to size × size."""
    for axis in (0, 1):
        cur = a.shape[axis]
        if cur > size:
            lo = (cur - size) // 2
            a = np.take(a, range(lo, lo + size), axis=axis)
        elif cur < size:
            pad = [(0, 0)] * a.ndim
            pad[axis] = ((size - cur) // 2, size - cur - (size - cur) // 2)
            a = np.pad(a, pad)
    return a


def _read_nifti(path: str) -> np.ndarray:
    import nibabel as nib

    try:
        return np.asarray(nib.load(path).dataobj)  # type: ignore[attr-defined]
    except Exception as e:  # nibabel raises many types for a bad file; each becomes one line
        raise DataError(f"{path}: cannot read it as NIfTI ({type(e).__name__}: {e})") from None


def volume_records(img_path: str, lbl_path: str, size: int, context: int, context_step: int,
                   min_tumor_px: int, stride: int) -> list[bytes]:
    img, lbl = _read_nifti(img_path), _read_nifti(lbl_path)
    m = len(brats.MODALITIES)
    if img.ndim != 4 or img.shape[3] != m:
        raise DataError(f"{img_path}: shape {list(img.shape)}, expected (X, Y, Z, {m}) modalities")
    if lbl.shape != img.shape[:3]:
        raise DataError(f"{lbl_path}: label shape {list(lbl.shape)} differs from the image's {list(img.shape[:3])}")
    for path, vol, what in ((img_path, img, "voxels"), (lbl_path, lbl, "labels")):
        # a NaN made its modality's z-score NaN throughout, stored as all zeros
        if np.issubdtype(vol.dtype, np.floating) and not np.isfinite(vol).all():
            bad = np.argwhere(~np.isfinite(vol))[0].tolist()
            raise DataError(f"{path}: {int((~np.isfinite(vol)).sum())} {what} are NaN or infinite (the first at "
                            f"{bad}); expected finite values")
    if np.issubdtype(lbl.dtype, np.floating) and (lbl != np.rint(lbl)).any():  # rounded, 1.4 read as class 1
        raise DataError(f"{lbl_path}: labels such as {lbl[lbl != np.rint(lbl)][0]:g} are not whole numbers; "
                        f"expected class indices 0..{brats.CLASSES - 1}")
    lbl = lbl.astype(np.int64)
    if lbl.min() < 0 or lbl.max() >= brats.CLASSES:
        raise DataError(f"{lbl_path}: labels {lbl.min()}..{lbl.max()}, expected 0..{brats.CLASSES - 1}")
    q = np.stack([brats.quantize(znorm_brain(img[..., c])) for c in range(m)], axis=-1)
    q = fit_plane(q, size)  # (X, Y, Z, M)
    lab = fit_plane(lbl.astype(np.uint8), size)  # (X, Y, Z)
    depth = q.shape[2]
    tumour = (lab > 0).reshape(-1, depth).sum(axis=0)
    keep = [z for z in range(depth) if tumour[z] >= min_tumor_px][::stride]
    offsets = [j * context_step for j in range(-context, context + 1)]
    out = []
    for z in keep:
        # (X, Y, M) -> (M, Y, X): channel-first, row y, column x; neighbours replicated at the ends
        planes = [q[:, :, min(max(z + o, 0), depth - 1), :].transpose(2, 1, 0) for o in offsets]
        out.append(np.concatenate(planes).tobytes() + np.ascontiguousarray(lab[:, :, z].T).tobytes())
    return out


def _cases(src: str) -> list[str]:
    meta_path = os.path.join(src, "dataset.json")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        entries = meta["training"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{meta_path}: cannot read MSD's training list from it ({e})") from None
    images = [e.get("image") if isinstance(e, dict) else e for e in entries] if isinstance(entries, list) else None
    if images is None or not all(isinstance(i, str) and i for i in images):
        shown = entries if images is None else next(e for e, i in zip(entries, images, strict=True)
                                                    if not (isinstance(i, str) and i))
        raise DataError(f"{meta_path}: its \"training\" holds {json.dumps(shown)[:80]}; expected a list of "
                        "{\"image\": PATH, \"label\": PATH} entries (or of image paths), as MSD writes it")
    cases = sorted({os.path.basename(i) for i in images})
    if not cases:
        raise DataError(f"{meta_path} lists no training volumes")
    return cases


def prepare_brats(src: str, out: str, size: int = brats.NATIVE_SIZE, context: int = 0, context_step: int = 1,
                  val_frac: float = 0.15, seed: int = 0, min_tumor_px: int = 1, stride: int = 2) -> dict[str, Any]:
    if size <= 0 or size % 16:
        raise DataError(f"brats size {size} is not a positive multiple of 16 (a depth-4 UNet halves it 4 times)")
    if context < 0 or context_step < 1 or stride < 1 or min_tumor_px < 0 or seed < 0 or not 0 < val_frac < 1:
        raise DataError(f"brats: need context >= 0, context_step >= 1, stride >= 1, min_tumor_px >= 0, seed >= 0 "
                        f"and 0 < val_frac < 1; got {context}, {context_step}, {stride}, {min_tumor_px}, {seed}, "
                        f"{val_frac}")
    cases = _cases(src)
    if len(cases) < 2:
        raise DataError(f"{src}: {len(cases)} training volume; a patient-level split needs at least 2")
    order = np.random.default_rng(seed).permutation(len(cases))
    n_val = min(len(cases) - 1, max(1, round(len(cases) * val_frac)))
    val_set = {cases[i] for i in order[:n_val]}
    split_cases = {"train": [c for c in cases if c not in val_set], "val": [c for c in cases if c in val_set]}
    rec = brats.record_bytes(size, context)
    summary: dict[str, Any] = {"size": size, "context": context, "context_step": context_step,
                               "channels": brats.channels(context), "seed": seed, "val_frac": val_frac,
                               "min_tumor_px": min_tumor_px, "stride": stride, "records": {}}
    with replaced_together(out) as stage:
        for split, chosen in split_cases.items():
            def records(chosen: list[str] = chosen) -> Iterator[bytes]:
                for case in chosen:
                    yield from volume_records(os.path.join(src, "imagesTr", case),
                                              os.path.join(src, "labelsTr", case), size, context, context_step,
                                              min_tumor_px, stride)

            summary[f"{split}_volumes"] = chosen
            summary["records"][f"{split}.bin"] = write_counted(stage(f"{split}.bin"), records(), rec)
        with open(stage("split.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    # the dataset's options these files need where they are not its defaults (240², 2D): read at 240², a 2.5D
    # or smaller file was only refused as not of the format
    read_as = {"size": (size, brats.Brats.default_size), "context": (context, brats.Brats.default_context)}
    summary["data_options"] = [f"{k}={v}" for k, (v, default) in read_as.items() if v != default]
    return summary


PREPARERS: dict[str, Preparer] = {
    "imagenette": Preparer(prepare_imagenette, "JPEG class folders (SRC/train, SRC/val) -> train.bin, val.bin", (
        Option("train_size", int, imagenette.TRAIN_SIZE, "side of the stored train images (random-cropped later)",
               lo=1),
        Option("val_size", int, imagenette.CROP, "side of the stored val images (at most --train-size)", lo=1),
    )),
    "brats": Preparer(prepare_brats, "MSD Task01_BrainTumour NIfTI -> train.bin, val.bin of 2D/2.5D slices", (
        Option("size", int, brats.NATIVE_SIZE, "in-plane side (240 native, 224 the centre crop)", lo=1),
        Option("context", int, 0, "2.5D: slices stacked on each side of the centre (0 = 2D)", lo=0),
        Option("context_step", int, 1, "spacing of the context slices", lo=1),
        Option("val_frac", float, 0.15, "fraction of volumes held out for val"),
        Option("seed", int, 0, "seed of the patient-level split", lo=0),
        Option("min_tumor_px", int, 1, "keep slices with at least this many tumour voxels (0: all)", lo=0),
        Option("stride", int, 2, "keep every N-th qualifying slice", lo=1),
    )),
    "yolo": Preparer(yolo.prepare_yolo, "YOLO txt labels (SRC/images, SRC/labels) -> YOLOv1 train.bin, test.bin", (
        Option("size", int, 224, "side of the stored images", lo=1),
        Option("grid", int, 7, "YOLOv1 grid side (at most --size)", lo=1),
        Option("boxes", int, 2, "box slots per cell", lo=1),
        Option("classes", int, 20, "number of classes (labels 0..classes-1)", lo=1),
    )),
}


def prepare(name: str, src: str, out: str, **options: Any) -> dict[str, Any]:
    if name not in PREPARERS:
        raise DataError(f"no preparer for {name!r}; available: {sorted(PREPARERS)}")
    return PREPARERS[name].run(src, out, **options)
