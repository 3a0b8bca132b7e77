"""Detection losses (seed 001): DIoU box loss, YOLOv1's masked 5-term loss, the anchor YOLO loss
and the FPN multi-scale YOLO loss over the concatenated head.

Box layout shared by every loss here and by `hloforge.train.detection` (encoding, decoding):
a box slot is (x, y, w, h) with x, y the centre's offset inside its grid cell (0..1) and
w, h the size relative to the image. Every loss is a mean over the batch (Σ / B).

- `diou`: pred, target [B, 4, gH, gW] and a per-cell mask; the head's raw outputs
  (tx, ty, tw, th) are decoded with the positive parameterisation
  cx = (j + σ(tx))/gW, cy = (i + σ(ty))/gH, w = anchor_w·exp(tw), h = anchor_h·exp(th),
  and loss = Σ mask·(1 − DIoU), DIoU = IoU − ρ²(centres)/c²(enclosing box diagonal).
  Its backward is the hand-derived closed form (`diou_loss`), every min/max an indicator.
- `yolov1`: per cell perCell = boxes·5 + classes channels, box slot k at 5k..5k+4
  (x, y, w, h, confidence), the class scores last; labels are the target with the per-cell
  object mask appended as one more channel (seed 002's record: target then mask). Box
  slot k is responsible where the cell holds an object and the target fills slot k
  (its confidence is 1), which is how the encoder marks it. Five sums:
  λ_coord·Σ r(x̂−x)² + (ŷ−y)²,  λ_coord·Σ r(√ŵ−√w)² + (√ĥ−√h)² (√ of max(·, ε)),
  Σ r(Ĉ−1)²,  λ_noobj·Σ (1−r)·Ĉ²,  Σ_cells mask·Σ_c (p̂_c − p_c)².
- `anchorYolo`: A anchors per cell, slot a = [tx, ty, tw, th, obj, classes…] (5 + NC
  channels); the target has the same layout and its obj channel is the per-anchor mask.
  Per anchor: λ_box·DIoU (with the anchor as size prior) + focal-BCE objectness
  α·(1 − p_t)^γ·BCE (α = 1 on objects, λ_noobj elsewhere) + mask·softmax CE of the classes.
  The focal weight is differentiated (not detached), so the reported loss and its
  gradient agree and finite differences can check it at any γ.
- `fpnYolo`: three scales P3, P4, P5 (grids 4·g5, 2·g5, g5), their cells concatenated in
  that order into one [cells, A, 5 + NC] output (the `fpnDetect` layer's; self-describing,
  so the loss needs no options); the loss splits it into per-level anchor blocks, sums the
  per-scale losses, and the gradient is the re-concatenation of the per-scale ones (the
  slices' VJP).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import numpy as np

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Loss, Shape

EPS = 1e-9  # floors the union and the enclosing diagonal (never engaged by real boxes)
SQRT_EPS = 1e-6  # YOLOv1's √ floor on the box-size terms
FOCAL_EPS = 1e-12  # (1 − p_t) floor before the log of the focal weight
BOX = 5  # x, y, w, h, confidence / objectness


# ------------------------------------------------------------------ target encoding (host, numpy)
def centre_cell(box: np.ndarray, size: int, grid: int) -> tuple[int, int, float, float, float, float]:
    """(i, j, x offset, y offset, w rel, h rel) of a pixel box (x0, y0, x1, y1) on a grid."""
    x0, y0, x1, y1 = (float(v) for v in box)
    cx, cy = (x0 + x1) / 2 / size, (y0 + y1) / 2 / size
    j, i = min(int(cx * grid), grid - 1), min(int(cy * grid), grid - 1)
    return i, j, cx * grid - j, cy * grid - i, (x1 - x0) / size, (y1 - y0) / size


def encode_yolov1(t: np.ndarray, cls: int, xyxy: np.ndarray, image_size: int, boxes: int) -> None:
    """Write one box into a YOLOv1 target [boxes·5 + classes + 1, g, g] (the mask last), in place:
    box slot 0 of the cell holding its centre, which it takes over whole."""
    per, g = t.shape[0] - 1, t.shape[1]
    i, j, ox, oy, w, h = centre_cell(xyxy, image_size, g)
    t[:, i, j] = 0.0
    t[0:BOX, i, j] = (ox, oy, w, h, 1.0)
    t[BOX * boxes + cls, i, j] = 1.0
    t[per, i, j] = 1.0


Anchor = tuple[float, float]

# Σ v·mask of v [B, C, H, W] and a per-cell mask [B, 1, H, W] (the class terms of the YOLO losses).
# iree-compile 3.13 (llvm-cpu) rejects a whole-tensor sum of a product with a broadcast operand —
# even Σ a·broadcast(v) of a [3, 4] and v [4] fails with "'vector.contract' op invalid
# accumulator/result vector shape" — so on IREE the channels are summed first, then the masked cells:
# the same sum in another order (XLA keeps the one-sum form, its render unchanged).
MASKED_SUM = strategy.StrategyKind("maskedSum", ("broadcast", "channelsFirst"),
                                   "a per-cell mask's sum over [B, C, H, W]: the mask broadcast over the channels "
                                   "and one sum, or the channels summed first and the masked cells then")


def _anchors(v: Any) -> tuple[Anchor, ...]:
    return tuple((float(a[0]), float(a[1])) for a in v)


def _anchor_sets(v: Any) -> tuple[tuple[Anchor, ...], ...]:
    return tuple(_anchors(s) for s in v)


# ------------------------------------------------------------------ builder helpers
def channels(b: Builder, v: Value, lo: int, hi: int) -> Value:
    """v[:, lo:hi] of a [B, C, H, W] value."""
    n, _, h, w = v.shape
    return b.slice(v, [0, lo, 0, 0], [n, hi, h, w])


def _indicator(b: Builder, a: Value, c: Value, direction: str) -> Value:
    one, zero = b.full(1.0, a.shape, a.dtype), b.full(0.0, a.shape, a.dtype)
    return b.select(b.compare(a, c, direction), one, zero)


def _cell_index(b: Builder, shape: Shape, axis: int, dtype: str) -> Value:
    return b.convert(b.iota(shape, axis), dtype)


def diou_loss(b: Builder, pred: Value, tgt: Value, mask: Value, anchor: Anchor = (1.0, 1.0)) -> Value:
    """Σ mask·(1 − DIoU) of pred, tgt [B, 4, gH, gW] and mask [B, gH, gW] (not divided by B),
    differentiated w.r.t. pred by the closed form below; tgt and mask are data."""
    n, _, gh, gw = pred.shape
    s1 = (n, 1, gh, gw)
    dt = pred.dtype
    aw, ah = anchor
    tgt, mask = b.stop_gradient(tgt), b.stop_gradient(mask)
    m = b.reshape(mask, s1)
    ci, cj = _cell_index(b, s1, 2, dt), _cell_index(b, s1, 3, dt)
    gx, gy, tw_rel, th_rel = (channels(b, tgt, k, k + 1) for k in range(4))
    tcx, tcy = (cj + gx) / float(gw), (ci + gy) / float(gh)
    big_x0, big_x1 = tcx - tw_rel * 0.5, tcx + tw_rel * 0.5
    big_y0, big_y1 = tcy - th_rel * 0.5, tcy + th_rel * 0.5
    zero = b.full(0.0, s1, dt)
    eps = b.full(EPS, s1, dt)
    saved: dict[str, Value] = {}

    def fwd(p: Value) -> list[Value]:
        tx, ty, tw, th = (channels(b, p, k, k + 1) for k in range(4))
        sx, sy = b.logistic(tx), b.logistic(ty)
        cx, cy = (cj + sx) / float(gw), (ci + sy) / float(gh)
        w, h = b.exp(tw) * aw, b.exp(th) * ah
        x0, x1, y0, y1 = cx - w * 0.5, cx + w * 0.5, cy - h * 0.5, cy + h * 0.5
        iw = b.maximum(zero, b.minimum(x1, big_x1) - b.maximum(x0, big_x0))
        ih = b.maximum(zero, b.minimum(y1, big_y1) - b.maximum(y0, big_y0))
        inter = iw * ih
        union = b.maximum(w * h + tw_rel * th_rel - inter, eps)
        rho2 = (cx - tcx) * (cx - tcx) + (cy - tcy) * (cy - tcy)
        cw = b.maximum(x1, big_x1) - b.minimum(x0, big_x0)
        ch = b.maximum(y1, big_y1) - b.minimum(y0, big_y0)
        c2 = b.maximum(cw * cw + ch * ch, eps)
        diou = inter / union - rho2 / c2
        saved.update(sx=sx, sy=sy, cx=cx, cy=cy, w=w, h=h, x0=x0, x1=x1, y0=y0, y1=y1, iw=iw, ih=ih,
                     inter=inter, union=union, rho2=rho2, cw=cw, ch=ch, c2=c2)
        return [b.sum((1.0 - diou) * m)]

    def bwd(b: Builder, g: Value) -> list[Value]:
        s = saved
        iw_on, ih_on = _indicator(b, s["iw"], zero, "GT"), _indicator(b, s["ih"], zero, "GT")
        # ∂inter through the overlap's edges: max(x0, X0) picks x0 where x0 > X0, min(x1, X1) x1 where x1 < X1.
        di_dx0 = b.negate(s["ih"] * _indicator(b, s["x0"], big_x0, "GT") * iw_on)
        di_dx1 = s["ih"] * _indicator(b, s["x1"], big_x1, "LT") * iw_on
        di_dy0 = b.negate(s["iw"] * _indicator(b, s["y0"], big_y0, "GT") * ih_on)
        di_dy1 = s["iw"] * _indicator(b, s["y1"], big_y1, "LT") * ih_on
        u, inter = s["union"], s["inter"]
        u2 = u * u

        def d_iou(d_inter: Value, d_area: Value | None) -> Value:
            # IoU = I / U with U = area_p + area_t − I: ∂IoU = (∂I·U − I·(∂area_p − ∂I)) / U²
            d_union = b.negate(d_inter) if d_area is None else d_area - d_inter
            return (d_inter * u - inter * d_union) / u2

        diou_cx, diou_cy = d_iou(di_dx0 + di_dx1, None), d_iou(di_dy0 + di_dy1, None)
        diou_w = d_iou((di_dx1 - di_dx0) * 0.5, s["h"])
        diou_h = d_iou((di_dy1 - di_dy0) * 0.5, s["w"])
        # ∂c² through the enclosing box: max(x1, X1) picks x1 where x1 > X1, min(x0, X0) x0 where x0 < X0.
        e1, e0 = _indicator(b, s["x1"], big_x1, "GT"), _indicator(b, s["x0"], big_x0, "LT")
        f1, f0 = _indicator(b, s["y1"], big_y1, "GT"), _indicator(b, s["y0"], big_y0, "LT")
        two_cw, two_ch = s["cw"] * 2.0, s["ch"] * 2.0
        c2, rho2 = s["c2"], s["rho2"]
        c2sq = c2 * c2

        def d_pen(d_rho2: Value | None, d_c2: Value) -> Value:
            num = b.negate(rho2 * d_c2) if d_rho2 is None else d_rho2 * c2 - rho2 * d_c2
            return num / c2sq

        pen_cx = d_pen((s["cx"] - tcx) * 2.0, two_cw * (e1 - e0))
        pen_cy = d_pen((s["cy"] - tcy) * 2.0, two_ch * (f1 - f0))
        pen_w = d_pen(None, two_cw * ((e1 + e0) * 0.5))
        pen_h = d_pen(None, two_ch * ((f1 + f0) * 0.5))
        sx, sy = s["sx"], s["sy"]
        gm = m * b.broadcast_to(g, s1)
        d_tx = (pen_cx - diou_cx) * (sx * (1.0 - sx)) / float(gw)
        d_ty = (pen_cy - diou_cy) * (sy * (1.0 - sy)) / float(gh)
        d_tw = (pen_w - diou_w) * s["w"]
        d_th = (pen_h - diou_h) * s["h"]
        return [b.concatenate([d * gm for d in (d_tx, d_ty, d_tw, d_th)], 1)]

    return b.custom_vjp(fwd, bwd, pred)[0]


def masked_sum(b: Builder, v: Value, mask: Value) -> Value:
    """Σ v·mask of v [B, C, H, W] and the per-cell mask [B, 1, H, W] (data: no cotangent), in the
    target's `maskedSum` form."""
    if strategy.chosen(MASKED_SUM.name, b.target) == "channelsFirst":
        n, _, h, w = v.shape
        return b.sum(b.sum(v, [1]) * b.stop_gradient(b.reshape(mask, (n, h, w))))
    return b.sum(v * b.stop_gradient(b.broadcast_to(mask, v.shape, [0, 1, 2, 3])))


def _log_softmax_channels(b: Builder, z: Value) -> Value:
    """log softmax over axis 1 of [B, C, H, W], shifted by the (gradient-free) channel max."""
    keep = [0, 2, 3]
    mx = b.stop_gradient(b.reduce(z, [1], "max"))
    s = z - b.broadcast_in_dim(mx, z.shape, keep)
    return s - b.broadcast_in_dim(b.log(b.sum(b.exp(s), [1])), z.shape, keep)


def anchor_yolo_loss(b: Builder, pred: Value, tgt: Value, anchors: Sequence[Anchor], gamma: float,
                     lambda_box: float, lambda_noobj: float) -> Value:
    """Σ over anchors of the anchor YOLO terms for one scale, pred/tgt [B, A·(5+NC), g, g] (not ÷ B)."""
    n, c, gh, gw = pred.shape
    per = c // len(anchors)
    tgt = b.stop_gradient(tgt)  # labels are data: no backward ops for them
    total: Value | None = None
    for a, anchor in enumerate(anchors):
        base = a * per
        obj_t = channels(b, tgt, base + 4, base + 5)  # the per-anchor mask, [B, 1, g, g]
        mask = b.reshape(obj_t, (n, gh, gw))
        box = diou_loss(b, channels(b, pred, base, base + 4), channels(b, tgt, base, base + 4), mask, anchor)
        z = channels(b, pred, base + 4, base + 5)
        p = b.logistic(z)
        p_t = obj_t * p + (1.0 - obj_t) * (1.0 - p)
        alpha = obj_t + (1.0 - obj_t) * lambda_noobj
        zero = b.full(0.0, z.shape, z.dtype)
        bce = b.maximum(z, zero) - z * obj_t + b.log(1.0 + b.exp(b.negate(b.abs(z))))
        weight = alpha
        if gamma:
            omp = b.maximum(1.0 - p_t, b.full(FOCAL_EPS, z.shape, z.dtype))
            weight = alpha * b.exp(b.log(omp) * gamma)
        obj = b.sum(weight * bce)
        ce = b.negate(channels(b, tgt, base + 5, base + per) * _log_softmax_channels(b, channels(b, pred, base + 5,
                                                                                                   base + per)))
        cls = masked_sum(b, ce, obj_t)
        term = box * lambda_box + obj + cls
        total = term if total is None else total + term
    assert total is not None
    return total


def _ref_diou(pred: Any, tgt: Any, mask: Any, anchor: Anchor) -> Any:
    """Σ mask·(1 − DIoU) in jax.numpy, written from the definition (the gate's oracle)."""
    import jax
    import jax.numpy as jnp

    _, _, gh, gw = pred.shape
    i = jnp.arange(gh, dtype=pred.dtype)[None, :, None]
    j = jnp.arange(gw, dtype=pred.dtype)[None, None, :]
    cx, cy = (j + jax.nn.sigmoid(pred[:, 0])) / gw, (i + jax.nn.sigmoid(pred[:, 1])) / gh
    w, h = anchor[0] * jnp.exp(pred[:, 2]), anchor[1] * jnp.exp(pred[:, 3])
    tx, ty = (j + tgt[:, 0]) / gw, (i + tgt[:, 1]) / gh
    tw, th = tgt[:, 2], tgt[:, 3]
    p_lo, p_hi = jnp.stack([cx - w / 2, cy - h / 2]), jnp.stack([cx + w / 2, cy + h / 2])
    t_lo, t_hi = jnp.stack([tx - tw / 2, ty - th / 2]), jnp.stack([tx + tw / 2, ty + th / 2])
    overlap = jnp.clip(jnp.minimum(p_hi, t_hi) - jnp.maximum(p_lo, t_lo), 0.0, None)
    inter = overlap[0] * overlap[1]
    iou = inter / jnp.maximum(w * h + tw * th - inter, EPS)
    enclosing = jnp.maximum(p_hi, t_hi) - jnp.minimum(p_lo, t_lo)
    diag2 = jnp.maximum(jnp.sum(enclosing ** 2, axis=0), EPS)
    centre2 = (cx - tx) ** 2 + (cy - ty) ** 2
    return jnp.sum(mask * (1.0 - (iou - centre2 / diag2)))


def _ref_anchor(pred: Any, tgt: Any, anchors: Sequence[Anchor], gamma: float, lambda_box: float,
                lambda_noobj: float) -> Any:
    import jax
    import jax.numpy as jnp

    per = pred.shape[1] // len(anchors)
    total = 0.0
    for a, anchor in enumerate(anchors):
        blk, tb = pred[:, a * per:(a + 1) * per], tgt[:, a * per:(a + 1) * per]
        t = tb[:, 4]
        box = _ref_diou(blk[:, :4], tb[:, :4], t, anchor)
        p = jax.nn.sigmoid(blk[:, 4])
        p_t = jnp.where(t > 0.5, p, 1.0 - p)
        focal = jnp.maximum(1.0 - p_t, FOCAL_EPS) ** gamma
        bce = -(t * jax.nn.log_sigmoid(blk[:, 4]) + (1 - t) * jax.nn.log_sigmoid(-blk[:, 4]))
        alpha = jnp.where(t > 0.5, 1.0, lambda_noobj)
        ce = -jnp.sum(tb[:, 5:] * jax.nn.log_softmax(blk[:, 5:], axis=1), axis=1)
        total = total + lambda_box * box + jnp.sum(alpha * focal * bce) + jnp.sum(t * ce)
    return total


def _sample_boxes(rng: np.random.Generator, shape: Shape, classes: int, obj: np.ndarray) -> np.ndarray:
    """A target block [B, 5 + classes, g, g] for the given object mask [B, g, g]: offsets in (0, 1),
    sizes in (0.05, 0.6) of the image, one-hot classes on object cells, objectness = mask."""
    n, _, gh, gw = shape
    t = np.zeros((n, BOX + classes, gh, gw))
    t[:, 0:2] = rng.uniform(0.05, 0.95, (n, 2, gh, gw))
    t[:, 2:4] = rng.uniform(0.05, 0.6, (n, 2, gh, gw))
    t[:, 4] = obj
    cls = rng.integers(0, max(classes, 1), (n, gh, gw))
    for c in range(classes):
        t[:, BOX + c] = (cls == c) * obj
    return t


# ------------------------------------------------------------------ DIoU alone
@attrs.frozen
class DiouLoss(Loss):
    """(1/B)·Σ mask·(1 − DIoU): logits [4, gH, gW] raw (tx, ty, tw, th); labels [5, gH, gW],
    the target box (cell offset x, y, relative w, h) and the mask as the fifth channel."""

    name = "diou"
    label_kind: ClassVar[str] = "boxes"  # the detection task encodes these labels from boxes
    anchor: Anchor = attrs.field(default=(1.0, 1.0), converter=lambda v: (float(v[0]), float(v[1])))

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 3 or out_shape[0] != 4:
            raise UnsupportedSpec(f"diou takes box logits [4, gH, gW], got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (5, *out_shape[1:]), "f32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n, _, gh, gw = logits.shape
        mask = b.reshape(channels(b, y, 4, 5), (n, gh, gw))
        return diou_loss(b, logits, channels(b, y, 0, 4), mask, self.anchor) / float(n)

    def reference(self, logits: Any, y: Any) -> Any:
        return _ref_diou(logits, y[:, :4], y[:, 4], self.anchor) / logits.shape[0]

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        obj = (rng.random((batch, *out_shape[1:])) < 0.6).astype(np.float64)
        return _sample_boxes(rng, (batch, 4, *out_shape[1:]), 0, obj).astype(np.float32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(anchor=(0.2, 0.3)), (4, 2, 3))]


# ------------------------------------------------------------------ YOLOv1
@attrs.frozen
class Yolov1Loss(Loss):
    name = "yolov1"
    label_kind: ClassVar[str] = "boxes"
    strategy_kinds = (MASKED_SUM.name,)
    boxes: int = 2
    lambda_coord: float = 5.0
    lambda_noobj: float = 0.5

    def classes(self, out_shape: Shape) -> int:
        return out_shape[0] - BOX * self.boxes

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 3:
            raise UnsupportedSpec(f"yolov1 takes a grid [boxes·5 + classes, gH, gW], got {list(out_shape)}")
        if self.boxes < 1 or self.classes(out_shape) < 1:
            raise UnsupportedSpec(f"yolov1 with {self.boxes} box(es) per cell needs more than {BOX * self.boxes} "
                                  f"channels per cell (boxes·5 + classes), got {out_shape[0]}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (out_shape[0] + 1, *out_shape[1:]), "f32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n, per, gh, gw = logits.shape
        y = b.stop_gradient(y)  # labels are data: no backward ops for them
        mask = channels(b, y, per, per + 1)
        eps = b.full(SQRT_EPS, mask.shape, logits.dtype)
        terms: list[Value] = []
        for k in range(self.boxes):
            p = [channels(b, logits, BOX * k + i, BOX * k + i + 1) for i in range(BOX)]
            t = [channels(b, y, BOX * k + i, BOX * k + i + 1) for i in range(BOX)]
            r = b.stop_gradient(mask * t[4])  # box slot k is responsible here (data: no cotangent)
            d_xy = (p[0] - t[0]) * (p[0] - t[0]) + (p[1] - t[1]) * (p[1] - t[1])
            size = [b.sqrt(b.maximum(p[i], eps)) - b.sqrt(b.maximum(t[i], eps)) for i in (2, 3)]
            d_wh = size[0] * size[0] + size[1] * size[1]
            conf = p[4]
            terms += [b.sum(r * d_xy) * self.lambda_coord, b.sum(r * d_wh) * self.lambda_coord,
                      b.sum(r * (conf - 1.0) * (conf - 1.0)), b.sum((1.0 - r) * conf * conf) * self.lambda_noobj]
        dc = channels(b, logits, BOX * self.boxes, per) - channels(b, y, BOX * self.boxes, per)
        terms.append(masked_sum(b, dc * dc, mask))
        total = terms[0]
        for t_ in terms[1:]:
            total = total + t_
        return total / float(n)

    def reference(self, logits: Any, y: Any) -> Any:
        import jax.numpy as jnp

        per = logits.shape[1]
        mask = y[:, per]
        total = 0.0
        for k in range(self.boxes):
            p, t = logits[:, BOX * k:BOX * k + BOX], y[:, BOX * k:BOX * k + BOX]
            r = mask * t[:, 4]
            xy = jnp.sum((p[:, 0:2] - t[:, 0:2]) ** 2, axis=1)
            wh = jnp.sum((jnp.sqrt(jnp.maximum(p[:, 2:4], SQRT_EPS)) - jnp.sqrt(jnp.maximum(t[:, 2:4], SQRT_EPS)))
                         ** 2, axis=1)
            total = total + self.lambda_coord * jnp.sum(r * (xy + wh)) + jnp.sum(r * (p[:, 4] - 1) ** 2) \
                + self.lambda_noobj * jnp.sum((1 - r) * p[:, 4] ** 2)
        cls = jnp.sum((logits[:, BOX * self.boxes:] - y[:, BOX * self.boxes:per]) ** 2, axis=1)
        return (total + jnp.sum(mask * cls)) / logits.shape[0]

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        per, gh, gw = out_shape
        mask = (rng.random((batch, gh, gw)) < 0.5).astype(np.float64)
        y = np.zeros((batch, per + 1, gh, gw))
        block = _sample_boxes(rng, (batch, 0, gh, gw), self.classes(out_shape), mask)
        y[:, 0:BOX] = block[:, :BOX]  # the encoder fills box slot 0; the other slots stay empty
        y[:, BOX * self.boxes:per] = block[:, BOX:]
        y[:, per] = mask
        return y.astype(np.float32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (13, 2, 3))]


# ------------------------------------------------------------------ anchor YOLO, one scale
@attrs.frozen
class AnchorYoloLoss(Loss):
    """logits and labels [A·(5 + NC), gH, gW]; the labels' obj channels are the per-anchor mask."""

    name = "anchorYolo"
    label_kind: ClassVar[str] = "boxes"
    strategy_kinds = (MASKED_SUM.name,)
    anchors: tuple[Anchor, ...] = attrs.field(default=((0.25, 0.25),), converter=_anchors)
    gamma: float = 2.0
    lambda_box: float = 5.0
    lambda_noobj: float = 0.5

    def check(self, out_shape: Shape) -> None:
        a = len(self.anchors)
        if len(out_shape) != 3 or a == 0 or out_shape[0] % a or out_shape[0] // a <= BOX:
            raise UnsupportedSpec(f"anchorYolo with {a} anchor(s) takes [A·(5 + classes), gH, gW] logits, "
                                  f"got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return out_shape, "f32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        loss = anchor_yolo_loss(b, logits, y, self.anchors, self.gamma, self.lambda_box, self.lambda_noobj)
        return loss / float(logits.shape[0])

    def reference(self, logits: Any, y: Any) -> Any:
        return _ref_anchor(logits, y, self.anchors, self.gamma, self.lambda_box, self.lambda_noobj) / logits.shape[0]

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return sample_anchor_target(rng, batch, len(self.anchors), out_shape).astype(np.float32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        probe = tuple((0.02 + 0.03 * i, 0.03 + 0.04 * i) for i in range(2))  # seed 001's probe anchors
        return [(cls(anchors=probe), (2 * 8, 2, 3))]


def sample_anchor_target(rng: np.random.Generator, batch: int, n_anchors: int, out_shape: Shape) -> np.ndarray:
    c, gh, gw = out_shape
    per = c // n_anchors
    obj = (rng.random((batch, n_anchors, gh, gw)) < 0.3).astype(np.float64)
    return np.concatenate([_sample_boxes(rng, (batch, per, gh, gw), per - BOX, obj[:, a]) for a in range(n_anchors)],
                          axis=1)


# ------------------------------------------------------------------ FPN multi-scale
@attrs.frozen
class Scale:
    """One pyramid level's block of the concatenated head output [cells, A, 5 + NC]."""

    grid: int
    offset: int  # the level's first cell in the concatenation

    @property
    def cells(self) -> int:
        return self.grid * self.grid


PYRAMID = (4, 2, 1)  # P3, P4, P5 grids in units of the coarsest (strides 8, 16, 32)


def pyramid_scales(cells: int) -> list[Scale]:
    """The levels of a [cells, A, 5 + NC] fpnDetect output, P3 first, each level's cells row-major:
    the one definition of the concatenation order, shared by the layer, the loss, the target
    encoder and the decoder."""
    unit = sum(k * k for k in PYRAMID)
    g5 = math.isqrt(cells // unit) if cells % unit == 0 else 0
    if g5 == 0 or unit * g5 * g5 != cells:
        raise UnsupportedSpec(f"{cells} cells are not the pyramid's 21·g² (grids 4g, 2g, g)")
    out, off = [], 0
    for k in PYRAMID:
        out.append(Scale(k * g5, off))
        off += (k * g5) ** 2
    return out


def level_block(b: Builder, v: Value, s: Scale) -> Value:
    """A level's [B, A·(5 + NC), g, g] anchor block out of the concatenated [B, cells, A, 5 + NC]."""
    n, _, a, per = v.shape
    blk = b.reshape(b.slice(v, [0, s.offset, 0, 0], [n, s.offset + s.cells, a, per]), (n, s.grid, s.grid, a, per))
    return b.reshape(b.transpose(blk, [0, 3, 4, 1, 2]), (n, a * per, s.grid, s.grid))


@attrs.frozen
class MultiScaleYoloLoss(Loss):
    """The FPN loss over the concatenated head [cells, A, 5 + NC] (fpnDetect's output); labels have
    the same layout. Each level's block is an anchor YOLO loss with unit anchors: fpnDetect adds
    log(anchor) to its size outputs, so exp(t) there is already anchor·exp(raw)."""

    name = "fpnYolo"
    label_kind: ClassVar[str] = "boxes"
    strategy_kinds = (MASKED_SUM.name,)
    gamma: float = 2.0
    lambda_box: float = 5.0
    lambda_noobj: float = 0.5

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 3 or out_shape[2] <= BOX:
            raise UnsupportedSpec(f"fpnYolo takes the concatenated head [cells, anchors, 5 + classes], "
                                  f"got {list(out_shape)}")
        pyramid_scales(out_shape[0])

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return out_shape, "f32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        a = logits.shape[2]
        total: Value | None = None
        for s in pyramid_scales(logits.shape[1]):
            term = anchor_yolo_loss(b, level_block(b, logits, s), level_block(b, y, s), [(1.0, 1.0)] * a,
                                    self.gamma, self.lambda_box, self.lambda_noobj)
            total = term if total is None else total + term
        assert total is not None
        return total / float(logits.shape[0])

    def reference(self, logits: Any, y: Any) -> Any:
        n, _, a, per = logits.shape
        total = 0.0
        for s in pyramid_scales(logits.shape[1]):
            def block(v: Any, s: Scale = s) -> Any:
                blk = v[:, s.offset:s.offset + s.cells].reshape(n, s.grid, s.grid, a, per)
                return blk.transpose(0, 3, 4, 1, 2).reshape(n, a * per, s.grid, s.grid)

            total = total + _ref_anchor(block(logits), block(y), [(1.0, 1.0)] * a, self.gamma, self.lambda_box,
                                        self.lambda_noobj)
        return total / n

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        cells, a, per = out_shape
        obj = (rng.random((batch, a, cells)) < 0.3).astype(np.float64)
        t = np.stack([_sample_boxes(rng, (batch, per, 1, cells), per - BOX, obj[:, k, None])[:, :, 0]
                      for k in range(a)], axis=1)  # [B, A, per, cells]
        return t.transpose(0, 3, 1, 2).astype(np.float32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        # g5 = 1: P3 4×4, P4 2×2, P5 1×1 = 21 cells; one anchor of two classes (7 channels: with one
        # class the class term is 0 whatever the form). γ = 0 as in seed 001's whole-detector probe;
        # anchorYolo's case runs the focal weight.
        return [(cls(gamma=0.0), (21, 1, 7))]


@hookimpl
def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
    return [MASKED_SUM]


@hookimpl
def hloforge_losses() -> list[type]:
    return [DiouLoss, Yolov1Loss, AnchorYoloLoss, MultiScaleYoloLoss]
