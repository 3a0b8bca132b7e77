"""Detection heads (seed 001): `yolov1Head` and `fpnDetect` (FPN neck, RetinaNet tower, per-level
1×1 heads, one concatenated output).

`yolov1Head(boxes, classes)`: a 1×1 conv with bias to boxes·5 + classes channels per grid cell —
the one definition of YOLOv1's per-cell layout (`losses.detection` documents the channels).

`fpnDetect`: its input is the backbone's C3 (stride 8). A spec is a sequence, so a layer sees
only its predecessor's output: the two backbone stages that make C4 and C5 (a residualStage of
stride 2 each, `c4.` and `c5.` slots) live inside this layer, then

    P5 = W5·C5,  P4 = W4·C4 + up2(P5),  P3 = W3·C3 + up2(P4)     (1×1 laterals, bilinear ×2)

an optional RetinaNet tower per level (`tower` × 3×3 conv + bias + ReLU, channel-preserving,
not shared across levels, no norm), a 1×1 conv + bias head per level to A·(5 + classes), and
the levels' cells concatenated P3, P4, P5 into one [cells, A, 5 + classes] output
(`losses.detection.pyramid_scales`). The anchor priors belong to the head: log(anchor w, h)
is added to each anchor's size outputs, so the loss's exp(t) is anchor·exp(raw) and the
decoder needs no anchors; the target encoder reads them from this layer.

The neck's backward is the closed form (`fpn_neck`): each level's cotangent goes to its
lateral conv and up the pyramid (dP4 += up2ᵀ(dP3), then dP5 += up2ᵀ(dP4)).
`fpn_param_slots` is the ONE definition of the FPN-owned parameter order (9 + 6·tower):
laterals n3, n4, n5; tower (w, b) × tower for P3, then P4, then P5; head weights h3, h4, h5;
head biases last.

`prior` π > 0 is RetinaNet's prior-bias init (seed 001, applyDetPriorBias): each anchor's
objectness bias starts at −log((1 − π)/π), so every cell first predicts objectness π instead of
½ and the background-dominated focal loss does not open on a burst of false positives; the bias,
not the weights, carries that constant offset. π = 0 is the zero init, today's net exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.resample import bilinear_matrix
from hloforge.core.spec import MAX_REPEAT, Ctx, Layer, ParamSlot, Shape, StatSlot
from hloforge.losses.detection import BOX, Anchor, pyramid_scales
from hloforge.plugins.layers.compose import (
    Part,
    image,
    path_forward,
    path_params,
    path_reference,
    path_shapes,
    path_stats,
)
from hloforge.plugins.layers.residual import ResidualStage
from hloforge.plugins.layers.unet import bilinear_upsample, ref_bilinear_upsample

LEVELS = ("3", "4", "5")


# ------------------------------------------------------------------ emitted pieces
def conv1x1(b: Builder, x: Value, w: Value) -> Value:
    """einsum('oi,bihw->bohw', w, x)."""
    return b.transpose(b.dot_general(x, w, ([1], [1])), [0, 3, 1, 2])


def conv1x1_dx(b: Builder, g: Value, w: Value) -> Value:
    """einsum('oi,bohw->bihw', w, g)."""
    return b.transpose(b.dot_general(g, w, ([1], [0])), [0, 3, 1, 2])


def conv1x1_dw(b: Builder, g: Value, x: Value) -> Value:
    """einsum('bohw,bihw->oi', g, x)."""
    return b.dot_general(g, x, ([0, 2, 3], [0, 2, 3]))


def upsample2_t(b: Builder, g: Value) -> Value:
    """The transpose of bilinear ×2 (`unet.bilinear_upsample`): [B, C, 2h, 2w] → [B, C, h, w],
    a reusable emitter so the neck's closed-form VJP can route a cotangent up the pyramid."""
    h, w = g.shape[2] // 2, g.shape[3] // 2
    wy = b.constant(bilinear_matrix(h, 2 * h), g.dtype)
    wx = b.constant(bilinear_matrix(w, 2 * w), g.dtype)
    t = b.dot_general(g, wy, ([2], [0]))  # [B, C, 2w, h]
    return b.dot_general(t, wx, ([2], [0]))  # [B, C, h, w]


def fpn_neck(b: Builder, c3: Value, c4: Value, c5: Value, w3: Value, w4: Value, w5: Value) -> list[Value]:
    """(P3, P4, P5) of the top-down neck, differentiated by its closed-form VJP."""

    def fwd(c3: Value, c4: Value, c5: Value, w3: Value, w4: Value, w5: Value) -> list[Value]:
        p5 = conv1x1(b, c5, w5)
        p4 = conv1x1(b, c4, w4) + bilinear_upsample(b, p5, 2)
        return [conv1x1(b, c3, w3) + bilinear_upsample(b, p4, 2), p4, p5]

    def bwd(b: Builder, d3: Value, d4: Value, d5: Value) -> list[Value]:
        d4 = d4 + upsample2_t(b, d3)
        d5 = d5 + upsample2_t(b, d4)
        return [conv1x1_dx(b, d3, w3), conv1x1_dx(b, d4, w4), conv1x1_dx(b, d5, w5),
                conv1x1_dw(b, d3, c3), conv1x1_dw(b, d4, c4), conv1x1_dw(b, d5, c5)]

    return b.custom_vjp(fwd, bwd, c3, c4, c5, w3, w4, w5)


def tower_conv(b: Builder, x: Value, w: Value, bias: Value) -> Value:
    """3×3 stride-1 same conv + bias + ReLU (one RetinaNet tower layer)."""
    y = b.convolution(x, w, strides=(1, 1), padding=[(1, 1), (1, 1)])
    return b.relu(y + b.broadcast_in_dim(bias, y.shape, [1]))


# ------------------------------------------------------------------ the references (jax.numpy)
def ref_neck(c3: Any, c4: Any, c5: Any, w3: Any, w4: Any, w5: Any) -> tuple[Any, Any, Any]:
    import jax
    import jax.numpy as jnp

    def lateral(x: Any, w: Any) -> Any:
        return jnp.einsum("oi,bihw->bohw", w, x, precision=jax.lax.Precision.HIGHEST)

    p5 = lateral(c5, w5)
    p4 = lateral(c4, w4) + ref_bilinear_upsample(p5, 2)
    return lateral(c3, w3) + ref_bilinear_upsample(p4, 2), p4, p5


# ------------------------------------------------------------------ the parameter layout
@attrs.frozen
class PriorBiasSlot(ParamSlot):
    """A zero-init bias plus a fixed per-element start (`fill`, the objectness prior)."""

    fill: tuple[float, ...] = ()

    def initial(self, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.fill, np.float32).reshape(self.shape)


def prior_logit(prior: float) -> float:
    """The logit whose sigmoid is π (RetinaNet's −log((1 − π)/π))."""
    return -float(np.log((1.0 - prior) / prior))


def fpn_param_slots(oc: int, taps: Sequence[int], head: int, tower: int,
                    head_bias: Sequence[float] | None = None) -> tuple[ParamSlot, ...]:
    """The FPN-owned slots in their one order (module docstring): 9 + 6·tower tensors. `head_bias`,
    when given, is each level's head-bias start ([head] values); otherwise the biases start at zero."""
    slots = [ParamSlot(f"neck.n{lv}", (oc, c), "he_fan_out", True) for lv, c in zip(LEVELS, taps, strict=True)]
    for lv in LEVELS:
        for i in range(tower):
            slots += [ParamSlot(f"tower.p{lv}.{i}.w", (oc, oc, 3, 3), "he_fan_out", True),
                      ParamSlot(f"tower.p{lv}.{i}.b", (oc,), "zeros", False)]
    slots += [ParamSlot(f"head.h{lv}", (head, oc), "glorot", True) for lv in LEVELS]
    if head_bias is None:
        slots += [ParamSlot(f"head.b{lv}", (head,), "zeros", False) for lv in LEVELS]
    else:
        slots += [PriorBiasSlot(f"head.b{lv}", (head,), "zeros", False, tuple(head_bias)) for lv in LEVELS]
    return tuple(slots)


def _check_anchors(anchors: Any) -> tuple[tuple[Anchor, ...], ...]:
    try:  # a spec file's typo (one level's pairs without their list) is one line, not a TypeError of Python's
        sets = tuple(tuple((float(w), float(h)) for w, h in level) for level in anchors)
    except (TypeError, ValueError):
        raise UnsupportedSpec(f"fpnDetect anchors must be 3 levels (P3, P4, P5), each a list of [w, h] pairs, e.g. "
                              f"[[[0.1, 0.15]], [[0.3, 0.3]], [[0.6, 0.5]]]; got {anchors!r}") from None
    if len(sets) != len(LEVELS) or len({len(s) for s in sets}) != 1 or not sets[0]:
        raise UnsupportedSpec(f"fpnDetect needs the same number (≥ 1) of anchors on each of the 3 levels, got "
                              f"{[len(s) for s in sets]}")
    if not all(0 < w < math.inf and 0 < h < math.inf for s in sets for w, h in s):  # NaN too: a NaN head bias
        raise UnsupportedSpec("fpnDetect anchors must have positive width and height (fractions of the image)")
    return sets


@attrs.frozen
class FpnDetect(Layer):
    kind = "fpnDetect"
    head_kind = "fpn"  # a detection head: train/detection.py reads its output this way
    classes: int
    # Per level (P3, P4, P5) the anchors' (w, h) as fractions of the image; the same count on each.
    anchors: tuple[tuple[Anchor, ...], ...] = attrs.field(converter=_check_anchors)
    oc: int = 32
    c4: int = 64
    c5: int = 128
    tower: int = 0
    blocks: int = 1  # residual blocks in each of the C4 and C5 stages
    prior: float = 0.0  # RetinaNet's initial objectness probability π (module docstring); 0: zero-init biases

    @property
    def per_anchor(self) -> int:
        return BOX + self.classes

    @property
    def head_classes(self) -> int:
        """What NetSpec.walk reads: this output is a detection head for `classes` classes."""
        return self.classes

    def _stages(self) -> tuple[Part, Part]:
        return (Part("c4.", ResidualStage(self.c4, n=self.blocks, stride=2)),
                Part("c5.", ResidualStage(self.c5, n=self.blocks, stride=2)))

    def _taps(self, in_shape: Shape) -> list[Shape]:
        """C3, C4, C5 shapes."""
        return path_shapes(self._stages(), in_shape)

    def out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = image(in_shape, "fpnDetect")
        if h != w or h % 4:
            raise UnsupportedSpec(f"fpnDetect takes a square C3 map whose side divides by 4 (C4, C5 halve it), "
                                  f"got {h}x{w}")
        for name in ("classes", "oc", "c4", "c5", "blocks"):  # the one that is wrong named, with its value
            if getattr(self, name) < 1:
                raise UnsupportedSpec(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.tower <= MAX_REPEAT:
            raise UnsupportedSpec(f"tower must be in 0..{MAX_REPEAT}, got {self.tower}")
        if not 0.0 <= self.prior < 1.0:
            raise UnsupportedSpec(f"fpnDetect prior is the initial objectness probability π, expected 0 ≤ π < 1 "
                                  f"(0: zero-init biases), got {self.prior}")
        cells = sum(s.cells for s in pyramid_scales(21 * (h // 4) ** 2))
        return (cells, len(self.anchors[0]), self.per_anchor)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        taps = [s[0] for s in self._taps(in_shape)]
        a = len(self.anchors[0])
        bias = None
        if self.prior > 0.0:
            per = np.zeros((a, self.per_anchor))
            per[:, BOX - 1] = prior_logit(self.prior)  # the objectness channel of each anchor
            bias = per.ravel().tolist()
        return (*path_params(self._stages(), in_shape, ""),
                *fpn_param_slots(self.oc, taps, a * self.per_anchor, self.tower, bias))

    def stat_slots(self, in_shape: Shape) -> tuple[StatSlot, ...]:
        return tuple(path_stats(self._stages(), in_shape, ""))

    def _prior(self, level: int) -> np.ndarray:
        """[A, 5 + classes]: log(anchor w, h) on the size outputs, 0 elsewhere."""
        off = np.zeros((len(self.anchors[level]), self.per_anchor))
        off[:, 2:4] = np.log(np.asarray(self.anchors[level]))
        return off

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        s4, s5 = self._stages()
        c4 = path_forward(b, [s4], x, params, ctx, "")
        c5 = path_forward(b, [s5], c4, params, ctx, "")
        ps = fpn_neck(b, x, c4, c5, *(params[f"neck.n{lv}"] for lv in LEVELS))
        n, a, per = x.shape[0], len(self.anchors[0]), self.per_anchor
        outs = []
        for li, (lv, p) in enumerate(zip(LEVELS, ps, strict=True)):
            for i in range(self.tower):
                p = tower_conv(b, p, params[f"tower.p{lv}.{i}.w"], params[f"tower.p{lv}.{i}.b"])
            h = conv1x1(b, p, params[f"head.h{lv}"])
            h = h + b.broadcast_in_dim(params[f"head.b{lv}"], h.shape, [1])
            g = h.shape[2]
            cells = b.reshape(b.transpose(b.reshape(h, (n, a, per, g, g)), [0, 3, 4, 1, 2]), (n, g * g, a, per))
            prior = b.constant(self._prior(li), x.dtype)
            outs.append(cells + b.broadcast_in_dim(prior, cells.shape, [2, 3]))
        return b.concatenate(outs, 1)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax
        import jax.numpy as jnp
        from jax import lax

        s4, s5 = self._stages()
        c4 = path_reference([s4], params, x, ctx, "")
        c5 = path_reference([s5], params, c4, ctx, "")
        ps = ref_neck(x, c4, c5, *(params[f"neck.n{lv}"] for lv in LEVELS))
        n, a, per = x.shape[0], len(self.anchors[0]), self.per_anchor
        outs = []
        for li, (lv, p) in enumerate(zip(LEVELS, ps, strict=True)):
            for i in range(self.tower):
                p = lax.conv_general_dilated(p, params[f"tower.p{lv}.{i}.w"], (1, 1), [(1, 1), (1, 1)],
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                             precision=lax.Precision.HIGHEST)
                p = jax.nn.relu(p + params[f"tower.p{lv}.{i}.b"][None, :, None, None])
            h = jnp.einsum("oi,bihw->bhwo", params[f"head.h{lv}"], p, precision=lax.Precision.HIGHEST)
            h = h + params[f"head.b{lv}"]
            outs.append(h.reshape(n, -1, a, per) + self._prior(li))
        return jnp.concatenate(outs, axis=1)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        anchors = (((0.1, 0.15), (0.2, 0.1)), ((0.3, 0.3), (0.25, 0.4)), ((0.6, 0.5), (0.5, 0.7)))
        return [(cls(2, anchors, oc=3, c4=4, c5=4, tower=1), (2, 8, 8))]


# ------------------------------------------------------------------ YOLOv1
@attrs.frozen
class Yolov1Head(Layer):
    kind = "yolov1Head"
    head_kind = "yolov1"  # a detection head: train/detection.py reads its output this way
    classes: int
    boxes: int = 2

    @property
    def per_cell(self) -> int:
        return BOX * self.boxes + self.classes

    @property
    def head_classes(self) -> int:
        return self.classes

    def out_shape(self, in_shape: Shape) -> Shape:
        _, h, w = image(in_shape, "yolov1Head")
        if self.classes < 1 or self.boxes < 1:
            raise UnsupportedSpec(f"yolov1Head needs classes ≥ 1 and boxes ≥ 1, got {self.classes}, {self.boxes}")
        return (self.per_cell, h, w)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return (ParamSlot("w", (self.per_cell, in_shape[0]), "glorot", True),
                ParamSlot("b", (self.per_cell,), "zeros", False))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        y = conv1x1(b, x, params["w"])
        return y + b.broadcast_in_dim(params["b"], y.shape, [1])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax
        import jax.numpy as jnp

        y = jnp.einsum("oi,bihw->bohw", params["w"], x, precision=jax.lax.Precision.HIGHEST)
        return y + params["b"][None, :, None, None]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(3, boxes=1), (4, 3, 2))]


def neck_probe_module(batch: int, oc: int, taps: Sequence[int], g5: int, dtype: str = "f64") -> str:
    """Seed 001's standalone neck probe: `@main(C3, C4, C5, W3, W4, W5, dP3, dP4, dP5) ->
    (P3, P4, P5, dC3, dC4, dC5, dW3, dW4, dW5)`, the cotangents explicit inputs as the heads'
    backwards feed them in the train step."""
    from hloforge.core import autodiff

    b = Builder(dtype, "fpn_neck_probe")
    grids = (4 * g5, 2 * g5, g5)
    cs = [b.arg((batch, c, g, g)) for c, g in zip(taps, grids, strict=True)]
    ws = [b.arg((oc, c)) for c in taps]
    ds = [b.arg((batch, oc, g, g)) for g in grids]
    ps = fpn_neck(b, *cs, *ws)
    return b.module([*ps, *autodiff.grad(b, ps, ds, [*cs, *ws])])


@hookimpl
def hloforge_layers() -> list[type]:
    return [FpnDetect, Yolov1Head]

