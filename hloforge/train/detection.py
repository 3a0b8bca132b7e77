"""Detection on the host: target encoding from boxes, decoding, per-class NMS, mAP@0.5, drawing.

Boxes everywhere here are float rows in pixel coordinates of the net's input image:
ground truth (class, x0, y0, x1, y1) — the `shapes` / `yolo` datasets' `boxes(split)` —
and detections (class, score, x0, y0, x1, y1).

A net's head says how its output is read (`DetectionHead.of(spec)`):
- `yolov1Head`: output [boxes·5 + classes, g, g]; targets [boxes·5 + classes + 1, g, g], the
  object mask appended (the `yolov1` loss's labels). A box goes to the cell holding its
  centre, in box slot 0; a later box in the same cell overwrites an earlier one (YOLOv1's
  one-object-per-cell limit).
- `fpnDetect`: output [cells, A, 5 + classes]; targets of the same layout (the `fpnYolo`
  loss's labels). A box goes to the (level, anchor) whose anchor shape matches it best
  (IoU of the two sizes centred together, over all levels), then to the cell holding its
  centre on that level; a later box on the same slot overwrites.

mAP@0.5 is the VOC all-point form: per class, detections of every image ranked by score,
each matched greedily to the unmatched ground truth of its image and class with the highest
IoU ≥ 0.5 (anything else is a false positive), AP the area under the precision envelope
(precision made monotone from the right) summed at every recall step; mAP the mean over
the classes that have ground truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.datasets.images import read_rgb
from hloforge.losses.detection import BOX, centre_cell, encode_yolov1, pyramid_scales
from hloforge.train.checkpoint import write_image

IOU_MATCH = 0.5
NMS_IOU = 0.5
SCORE_MIN = 0.05
# A detection head declares its output layout by the class attribute `head_kind` (a layer's, never
# its class: the trainer finds plugins by registry): head kind -> the loss that trains it.
HEAD_KINDS = {"yolov1": "yolov1", "fpn": "fpnYolo"}


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every row of a [n, 4] with every row of b [m, 4] (x0, y0, x1, y1) -> [n, m]."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0.0, None), axis=2)
    area_a, area_b = (np.prod(np.clip(r[:, 2:] - r[:, :2], 0.0, None), axis=1) for r in (a, b))
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _check_boxes(rows: np.ndarray, classes: int, what: str) -> np.ndarray:
    rows = np.asarray(rows, np.float64).reshape(-1, 5)
    cls = rows[:, 0]
    bad = ~((cls >= 0) & (cls < classes) & (cls % 1 == 0))  # a NaN fails the comparisons too
    if bad.any():
        said = ", ".join(f"{v:g}" for v in sorted(set(cls[bad].tolist())))
        whole = bool(np.all((cls >= 0) & (cls % 1 == 0)))
        more = f"; a detector of {int(cls.max()) + 1} classes: --classes {int(cls.max()) + 1}" if whole else ""
        raise DataError(f"{what}: box class {said} is not one of the detector's {classes} classes (integers "
                        f"0..{classes - 1}){more}")
    if len(rows) and np.any(rows[:, 3:5] <= rows[:, 1:3]):
        k = int(np.argmax(np.any(rows[:, 3:5] <= rows[:, 1:3], axis=1)))
        raise DataError(f"{what}: box {k} is {[round(v, 4) for v in rows[k].tolist()]} (class, x0, y0, x1, y1); "
                        "every box needs x1 > x0 and y1 > y0")
    return rows


@attrs.frozen
class DetectionHead:
    """How a detector's output is laid out: what its targets are and how its output decodes."""

    layer: Any  # the net's last layer, a detection head: its `head_kind` is one of HEAD_KINDS
    out_shape: tuple[int, ...]
    image_size: int

    @classmethod
    def of(cls, spec: NetSpec) -> DetectionHead:
        walk = spec.walk()
        layer = walk[-1].layer
        if getattr(layer, "head_kind", None) not in HEAD_KINDS:
            raise UnsupportedSpec(f"net {spec.name!r} does not end in a detection head (yolov1Head or fpnDetect)")
        c, h, w = spec.input_shape
        if h != w:
            raise UnsupportedSpec(f"detector {spec.name!r} needs a square input, got {h}x{w}")
        return cls(layer, walk[-1].out_shape, h)

    @property
    def loss(self) -> str:
        return HEAD_KINDS[self.layer.head_kind]

    @property
    def classes(self) -> int:
        return self.layer.classes

    def targets(self, boxes: Sequence[np.ndarray], where: str = "") -> np.ndarray:
        """The loss's labels for each image's ground-truth rows (class, x0, y0, x1, y1); `where`: whose
        boxes, as a refusal names them ("dataset 'yolo' test split")."""
        out = np.zeros((len(boxes), *self.label_shape), np.float32)
        for n, rows in enumerate(boxes):
            for cls, *xyxy in _check_boxes(rows, self.classes, f"{where} image {n}".strip()):
                self._encode(out[n], int(cls), np.asarray(xyxy))
        return out

    @property
    def label_shape(self) -> tuple[int, ...]:
        if self.layer.head_kind == "yolov1":
            per, g, _ = self.out_shape
            return (per + 1, g, g)
        return self.out_shape

    def _encode(self, t: np.ndarray, cls: int, xyxy: np.ndarray) -> None:
        if self.layer.head_kind == "yolov1":
            encode_yolov1(t, cls, xyxy, self.image_size, self.layer.boxes)
            return
        w = (xyxy[2] - xyxy[0]) / self.image_size
        h = (xyxy[3] - xyxy[1]) / self.image_size
        shapes = np.asarray([a for level in self.layer.anchors for a in level])
        inter = np.minimum(shapes[:, 0], w) * np.minimum(shapes[:, 1], h)
        best = int(np.argmax(inter / (shapes[:, 0] * shapes[:, 1] + w * h - inter)))
        n_anchors = len(self.layer.anchors[0])
        scale = pyramid_scales(self.out_shape[0])[best // n_anchors]
        i, j, ox, oy, _, _ = centre_cell(xyxy, self.image_size, scale.grid)
        slot = t[scale.offset + i * scale.grid + j, best % n_anchors]
        slot[:] = 0.0
        slot[:BOX] = (ox, oy, w, h, 1.0)
        slot[BOX + cls] = 1.0

    def decode(self, out: np.ndarray, score_min: float = SCORE_MIN, nms_iou: float = NMS_IOU) -> list[np.ndarray]:
        """Per image, the detections (class, score, x0, y0, x1, y1) after per-class NMS, best first."""
        return [nms(self._decode_one(np.asarray(o, np.float64), score_min), nms_iou) for o in out]

    def _decode_one(self, o: np.ndarray, score_min: float) -> np.ndarray:
        s = self.image_size
        rows = []
        if self.layer.head_kind == "yolov1":
            per, g, _ = o.shape
            nb = self.layer.boxes
            cls_scores = np.clip(o[BOX * nb:], 0.0, 1.0)  # the MSE-trained one-hot, shared by the cell's boxes
            cls = np.argmax(cls_scores, axis=0)
            ii, jj = np.mgrid[0:g, 0:g]
            for k in range(nb):
                x, y, w, h, conf = (o[BOX * k + c] for c in range(BOX))
                score = np.clip(conf, 0.0, 1.0) * np.take_along_axis(cls_scores, cls[None], 0)[0]
                cx, cy = (jj + x) / g, (ii + y) / g
                w, h = np.clip(w, 0.0, None), np.clip(h, 0.0, None)
                rows.append(np.stack([cls, score, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1).reshape(-1, 6))
        else:
            for sc in pyramid_scales(o.shape[0]):
                blk = o[sc.offset:sc.offset + sc.cells]  # [g², A, 5 + C]
                ii, jj = np.divmod(np.arange(sc.cells), sc.grid)
                logits = blk[..., BOX:]
                prob = np.exp(logits - logits.max(-1, keepdims=True))
                prob /= prob.sum(-1, keepdims=True)
                cls = np.argmax(prob, -1)
                score = _sigmoid(blk[..., 4]) * np.max(prob, -1)
                cx = (jj[:, None] + _sigmoid(blk[..., 0])) / sc.grid
                cy = (ii[:, None] + _sigmoid(blk[..., 1])) / sc.grid
                w, h = np.exp(np.minimum(blk[..., 2], 10.0)), np.exp(np.minimum(blk[..., 3], 10.0))
                rows.append(np.stack([cls, score, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1).reshape(-1, 6))
        d = np.concatenate(rows)
        d[:, 2:] = np.clip(d[:, 2:] * s, 0.0, s)
        return d[d[:, 1] >= score_min]


class DetectionLabels:
    """A detection dataset seen through a head: `arrays(split)` gives the images and the head's
    encoded targets (encoded once per split) instead of the dataset's own labels."""

    def __init__(self, data: Any, head: DetectionHead):
        self.data, self.head = data, head
        self.name, self.num_classes = data.name, head.classes
        self.image_shape = getattr(data, "image_shape", None)
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in self._cache:
            x, _ = self.data.arrays(split)
            self._cache[split] = (x, self.head.targets(self.data.boxes(split), f"dataset {self.name!r} {split} split"))
        return self._cache[split]

    def boxes(self, split: str) -> list[np.ndarray]:
        return list(self.data.boxes(split))

    def __getattr__(self, name: str) -> Any:  # everything else (normalize, splits, ...) is the dataset's
        if name == "data":  # not yet set (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.data, name)


def nms(dets: np.ndarray, iou: float = NMS_IOU) -> np.ndarray:
    """Greedy per-class non-maximum suppression of rows (class, score, x0, y0, x1, y1), best first."""
    dets = np.asarray(dets, np.float64).reshape(-1, 6)
    keep = []
    for c in np.unique(dets[:, 0]):
        d = dets[dets[:, 0] == c]
        d = d[np.argsort(-d[:, 1], kind="stable")]
        while len(d):
            keep.append(d[0])
            d = d[1:][box_iou(d[:1, 2:], d[1:, 2:])[0] < iou]
    out = np.asarray(keep).reshape(-1, 6)
    return out[np.argsort(-out[:, 1], kind="stable")]


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """VOC all-point AP: the area under the monotone (from the right) precision envelope."""
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    step = np.nonzero(r[1:] != r[:-1])[0]
    return float(np.sum((r[step + 1] - r[step]) * p[step + 1]))


@attrs.frozen
class MapResult:
    map: float
    ap: dict[int, float]  # per class with ground truth
    n_images: int

    def line(self) -> str:
        per = " ".join(f"{c}:{100 * v:.1f}" for c, v in sorted(self.ap.items()))
        return f"mAP@0.5 {100 * self.map:.2f}% ({self.n_images} images; AP per class {per})"


def mean_ap(dets: Sequence[np.ndarray], gts: Sequence[np.ndarray], iou: float = IOU_MATCH) -> MapResult:
    """mAP over images: `dets` rows (class, score, x0, y0, x1, y1), `gts` rows (class, x0, y0, x1, y1),
    the mean of the APs of the classes the ground truth holds. Without a ground-truth box in any image
    it is undefined: refused, never 0."""
    if len(dets) != len(gts):
        raise DataError(f"mean_ap: {len(dets)} images of detections but {len(gts)} of ground truth")
    gts = [np.asarray(g, np.float64).reshape(-1, 5) for g in gts]
    if not any(len(g) for g in gts):
        raise DataError(f"mean_ap: no ground-truth box in any of the {len(gts)} images; mAP needs at least one")
    dets = [np.asarray(d, np.float64).reshape(-1, 6) for d in dets]
    ap: dict[int, float] = {}
    for c in sorted({int(v) for g in gts for v in g[:, 0]}):
        truth = [g[g[:, 0] == c, 1:] for g in gts]
        used = [np.zeros(len(t), bool) for t in truth]
        cand = [(d[1], n, d[2:]) for n, ds in enumerate(dets) for d in ds if int(d[0]) == c]
        cand.sort(key=lambda r: -r[0])
        tp = np.zeros(len(cand))
        for k, (_, n, box) in enumerate(cand):
            if not len(truth[n]):
                continue
            ov = box_iou(box, truth[n])[0]
            ov[used[n]] = -1.0
            best = int(np.argmax(ov))
            if ov[best] >= iou:
                used[n][best] = True
                tp[k] = 1.0
        n_truth = sum(len(t) for t in truth)
        ctp = np.cumsum(tp)
        recall = ctp / n_truth
        precision = ctp / np.arange(1, len(cand) + 1)
        ap[c] = average_precision(recall, precision) if len(cand) else 0.0
    return MapResult(float(np.mean(list(ap.values()))), ap, len(gts))


PALETTE = ((230, 57, 70), (69, 123, 157), (42, 157, 143), (244, 162, 97), (131, 56, 236), (255, 190, 11))


def draw_detections(image: np.ndarray, dets: np.ndarray, path: str, *, names: Sequence[str] | None = None,
                    truth: np.ndarray | None = None, scale: int = 1) -> None:
    """Save `image` (HW, HWC or CHW floats, any range; or uint8) with each detection's box, class and
    score; ground truth, when given, in thin white. `scale` enlarges small images first."""
    from PIL import Image, ImageDraw

    a = np.asarray(image)
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
        a = a.transpose(1, 2, 0)
    if a.dtype != np.uint8:
        lo, hi = float(a.min()), float(a.max())
        a = ((a - lo) / (hi - lo if hi > lo else 1.0) * 255).round().astype(np.uint8)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    img = Image.fromarray(a).convert("RGB")
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
    pen = ImageDraw.Draw(img)
    if truth is not None:
        for _, *xyxy in np.asarray(truth, np.float64).reshape(-1, 5):
            pen.rectangle([v * scale for v in xyxy], outline=(255, 255, 255), width=1)
    for cls, score, *xyxy in np.asarray(dets, np.float64).reshape(-1, 6):
        colour = PALETTE[int(cls) % len(PALETTE)]
        box = [v * scale for v in xyxy]
        pen.rectangle(box, outline=colour, width=2)
        label = f"{names[int(cls)] if names else int(cls)} {score:.2f}"
        pen.text((box[0] + 2, max(box[1] - 11, 0)), label, fill=colour)
    write_image(path, lambda f, suffix: img.save(f, format=Image.registered_extensions()[f".{suffix}"]))


def load_image(path: str, size: int | None = None) -> np.ndarray:
    """A PNG/JPEG as float32 [3, H, W] in [0, 1]; with `size`, [3, size, size] (resized bilinearly if it
    differs)."""
    from PIL import Image

    img = read_rgb(path)  # as a viewer shows it, 16-bit grey scaled (datasets/images.py)
    if size is not None and img.size != (size, size):
        img = img.resize((size, size), Image.Resampling.BILINEAR)
    return (np.asarray(img, np.float32) / 255.0).transpose(2, 0, 1).copy()


def boxes_to(dets: np.ndarray, size: int, height: int, width: int) -> np.ndarray:
    """Detections [n, 6] (class, score, x0, y0, x1, y1) in a `size`×`size` input's pixels, in the pixels of the
    `width`×`height` image it was resized from (each axis scaled alone: the resize stretched them so)."""
    out = np.array(dets, np.float32, copy=True).reshape(-1, 6)
    out[:, [2, 4]] *= width / size
    out[:, [3, 5]] *= height / size
    return out


def describe(dets: np.ndarray, names: Sequence[str] | None = None) -> list[str]:
    return [f"{names[int(c)] if names else int(c)} {s:.2f} at ({x0:.1f}, {y0:.1f}, {x1:.1f}, {y1:.1f})"
            for c, s, x0, y0, x1, y1 in np.asarray(dets).reshape(-1, 6)]
