"""Segmentation scores from exact integer confusion matrices (seed 002).

`conf[g, p]` counts the pixels of ground-truth class g predicted as p (int64, never a float
accumulation). From it:

- per-class IoU = conf[c, c] / (row_c + col_c − conf[c, c]); a class absent from both the
  ground truth and the prediction has no IoU (NaN) and is left out of mIoU;
- pixel accuracy = trace / total;
- Dice of a class-union region R (a mapping name → label set, e.g. BraTS's WT/TC/ET, which the
  dataset defines once as its `regions`): inter = Σ_{g∈R} Σ_{p∈R} conf[g, p],
  |gt| = Σ_{g∈R} Σ_p conf[g, p], |pred| = Σ_{p∈R} Σ_g conf[g, p], Dice = 2·inter/(|gt| + |pred|),
  with the BraTS convention where the ground truth lacks the region: an empty prediction
  scores 1 and a non-empty one 0.

Dice is reported twice: over the whole eval set's confusion matrix, and as the mean over images
of each image's own Dice (where the BraTS convention decides most often: a slice without
tumour).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.train.metrics import check_ids

Regions = Mapping[str, Collection[int]]


def check_masks(masks: np.ndarray, classes: int, what: str) -> None:
    """Integer class ids 0..classes−1 (a float mask would be truncated to plausible wrong classes)."""
    check_ids(masks, classes, f"{what}: mask labels")


def confusion_matrices(gt: np.ndarray, pred: np.ndarray, classes: int) -> np.ndarray:
    """Per image [N, classes, classes] int64 counts conf[n, g, p], from masks [N, H, W]."""
    if gt.shape != pred.shape:
        raise DataError(f"ground truth {list(gt.shape)} and prediction {list(pred.shape)} differ in shape")
    check_masks(gt, classes, "ground truth")
    check_masks(pred, classes, "prediction")
    n = len(gt)
    flat = (np.arange(n, dtype=np.int64)[:, None] * classes * classes
            + gt.reshape(n, -1).astype(np.int64) * classes + pred.reshape(n, -1).astype(np.int64))
    return np.bincount(flat.ravel(), minlength=n * classes * classes).reshape(n, classes, classes)


def confusion_matrix(gt: np.ndarray, pred: np.ndarray, classes: int) -> np.ndarray:
    """[classes, classes] int64: conf[g, p] over every pixel of the masks."""
    out: np.ndarray = confusion_matrices(gt, pred, classes).sum(axis=0)
    return out


def iou_per_class(conf: np.ndarray) -> np.ndarray:
    """IoU of each class; NaN for a class neither present nor predicted."""
    inter = np.diag(conf).astype(np.float64)
    union = conf.sum(axis=0) + conf.sum(axis=1) - np.diag(conf)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.maximum(union, 1), np.nan)


def mean_iou(conf: np.ndarray) -> float:
    iou = iou_per_class(conf)
    present = ~np.isnan(iou)
    return float(iou[present].mean()) if present.any() else float("nan")


def pixel_accuracy(conf: np.ndarray) -> float:
    return int(np.trace(conf)) / max(int(conf.sum()), 1)


def check_regions(regions: Regions, classes: int) -> None:
    for name, labels in regions.items():
        bad = [c for c in labels if not 0 <= c < classes]
        if not labels or bad:
            raise UnsupportedSpec(f"region {name!r}: labels {sorted(labels)} must be a non-empty subset of "
                                  f"0..{classes - 1}")


def region_counts(conf: np.ndarray, labels: Collection[int]) -> tuple[int, int, int]:
    """(inter, |gt|, |pred|) of the class-union region `labels`, as exact Python ints."""
    r = sorted(labels)
    inter = int(conf[np.ix_(r, r)].sum())
    return inter, int(conf[r, :].sum()), int(conf[:, r].sum())


def region_dice(inter: int, gt: int, pred: int) -> float:
    """2·inter/(|gt| + |pred|); where the ground truth lacks the region, 1 for an empty
    prediction and 0 for a non-empty one (the BraTS convention)."""
    if gt == 0:
        return 1.0 if pred == 0 else 0.0
    return 2.0 * inter / (gt + pred)


def dice_by_region(conf: np.ndarray, regions: Regions) -> dict[str, float]:
    return {name: region_dice(*region_counts(conf, labels)) for name, labels in regions.items()}


def default_regions(classes: int) -> dict[str, frozenset[int]]:
    """Each foreground class alone, for a dataset that names no regions of its own."""
    return {f"class{c}": frozenset({c}) for c in range(1, classes)}


def score_names(classes: int, regions: Regions) -> set[str]:
    """The keys `scores` gives for `classes` classes and these regions."""
    return {"pixel_acc", "miou", *(f"iou/{c}" for c in range(classes)),
            *(f"{d}/{k}" for k in regions for d in ("dice", "dice_img"))}


def scores(confs: np.ndarray, regions: Regions) -> dict[str, float]:
    """The metrics of per-image confusion matrices [N, C, C]: pixel_acc, miou, iou/<c>,
    dice/<region> (whole set) and dice_img/<region> (mean of per-image Dice)."""
    classes = confs.shape[1]
    check_regions(regions, classes)
    total = confs.sum(axis=0)
    out: dict[str, float] = {"pixel_acc": pixel_accuracy(total), "miou": mean_iou(total)}
    out.update({f"iou/{c}": float(v) for c, v in enumerate(iou_per_class(total))})
    out.update({f"dice/{k}": v for k, v in dice_by_region(total, regions).items()})
    per_image = [dice_by_region(c, regions) for c in confs]
    out.update({f"dice_img/{k}": float(np.mean([d[k] for d in per_image])) for k in regions})
    return out
