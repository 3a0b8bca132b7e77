"""Detectors: YOLOv1 on a ResNet backbone, an FPN detector (ResNet stem to C3, then fpnDetect),
and their `-mini` variants for the synthetic `shapes` dataset at 32×32 (3 box classes)."""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.fpn import FpnDetect, Yolov1Head
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.pool import MaxPool
from hloforge.plugins.layers.residual import ResidualStage

VOC = (3, 224, 224)
SHAPES = (3, 32, 32)
# YOLOv3's COCO anchors (pixels at 416), as fractions of the image, three per level P3, P4, P5.
COCO_ANCHORS = tuple(tuple((w / 416, h / 416) for w, h in level) for level in (
    ((10, 13), (16, 30), (33, 23)), ((30, 61), (62, 45), (59, 119)), ((116, 90), (156, 198), (373, 326))))
# shapes' boxes are 0.2–0.45 of the image: one square anchor per level spanning that range.
SHAPES_ANCHORS = (((0.2, 0.2),), ((0.32, 0.32),), ((0.5, 0.5),))


def _resnet_trunk(depths: Sequence[int]) -> list[Layer]:
    """ResNet's stem and basic-block stages (64, 128, 256, 512 wide): stride 32 after four stages."""
    widths = (64, 128, 256, 512)
    return [ConvBn(64, k=7, stride=2), MaxPool(3, 2, pad=1)] + \
        [ResidualStage(w, n=n, stride=1 if i == 0 else 2) for i, (w, n) in enumerate(zip(widths, depths, strict=False))]


def yolov1(classes: int = 20, input: Sequence[int] = VOC) -> NetSpec:
    """ResNet-34 to a 7×7 grid at 224, a 3×3 conv 512→256 with ReLU, the YOLOv1 head (2 boxes)."""
    return NetSpec("yolov1", input, [*_resnet_trunk((3, 4, 6, 3)), Conv2d(256, k=3, act="relu"),
                                     Yolov1Head(classes, boxes=2)], classes)


def fpn_detector(classes: int = 20, input: Sequence[int] = VOC) -> NetSpec:
    """ResNet-18's stem and first two stages to C3 (stride 8), then fpnDetect: C4/C5 stages of
    256/512, a 128-wide neck, a one-layer RetinaNet tower, three anchors per level."""
    return NetSpec("fpn-detector", input, [*_resnet_trunk((2, 2)),
                                           FpnDetect(classes, COCO_ANCHORS, oc=128, c4=256, c5=512, tower=1,
                                                     prior=0.01)], classes)


def yolov1_mini(classes: int = 3, input: Sequence[int] = SHAPES) -> NetSpec:
    """32×32 → an 8×8 grid (stride 4, as fpn-mini's C3: shapes' boxes are 6–14 px, and a 4×4 grid
    of 8-px cells localised them too coarsely), a 64-wide residual stage there, a 3×3 conv, the
    YOLOv1 head (2 boxes)."""
    return NetSpec("yolov1-mini", input, [
        ConvBn(16, k=3), ResidualStage(24, n=1, stride=2), ResidualStage(32, n=1, stride=2), ResidualStage(64, n=1),
        Conv2d(64, k=3, act="relu"), Yolov1Head(classes, boxes=2)], classes)


def fpn_mini(classes: int = 3, input: Sequence[int] = SHAPES) -> NetSpec:
    """32×32 → C3 8×8 (stride 4: shapes' boxes are 6–14 px) → fpnDetect: P3 8×8, P4 4×4, P5 2×2,
    one anchor per level."""
    return NetSpec("fpn-mini", input, [
        ConvBn(16, k=3), ResidualStage(24, n=1, stride=2), ResidualStage(32, n=1, stride=2),
        FpnDetect(classes, SHAPES_ANCHORS, oc=32, c4=48, c5=64, tower=0, prior=0.01)], classes)
