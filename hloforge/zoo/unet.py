"""U-Net segmenters: `unet` (seed 001's: 7,849,667 parameters at 3 classes) and `unet-mini`.

A U-Net here is a flat layer list: unetDown per encoder width (each leaves its pre-pool features
on the skip stack), the convBn bottleneck, unetUp per width in reverse (each concatenating its
level's skip), then a 1×1 conv with bias to the per-pixel class logits.
"""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.unet import UnetDown, UnetUp


def unet_body(widths: Sequence[int], bottleneck: Sequence[int]) -> list[Layer]:
    """unetDown per width, convBn per bottleneck width, unetUp per width in reverse."""
    return [*(UnetDown(w) for w in widths), *(ConvBn(w) for w in bottleneck), *(UnetUp(w) for w in reversed(widths))]


def unet_spec(name: str, widths: Sequence[int], bottleneck: Sequence[int], classes: int,
              input: Sequence[int]) -> NetSpec:
    return NetSpec(name, input, [*unet_body(widths, bottleneck), Conv2d(classes, k=1)], classes)


def unet(classes: int = 3, input: Sequence[int] = (3, 224, 224)) -> NetSpec:
    """4 levels 32 → 64 → 128 → 256, bottleneck convBn 256 → 512 → 512, back up to 32."""
    return unet_spec("unet", (32, 64, 128, 256), (512, 512), classes, input)


def unet_mini(classes: int = 4, input: Sequence[int] = (3, 32, 32)) -> NetSpec:
    """shapes at 32²: 3 levels 16 → 32 → 64, bottleneck 128 at 4×4."""
    return unet_spec("unet-mini", (16, 32, 64), (128, 128), classes, input)
