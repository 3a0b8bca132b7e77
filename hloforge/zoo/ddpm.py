"""`ddpm-mini`: a small U-Net noise predictor, time-conditioned by timeCondAdd after each level.

Input [C+1, H, W] (the noised image and the t/T plane, hloforge.train.diffusion), output the
predicted noise [C, H, W]; `classes` is C, the image channels (3 for shapes, 1 for digits with
`--input 2,28,28`). H and W must divide by 4 (two levels).
"""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.ddpm import TimeCondAdd
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.unet import UnetDown, UnetUp

NFREQ = 4


def ddpm_mini(classes: int = 3, input: Sequence[int] = (4, 32, 32)) -> NetSpec:
    if input[0] != classes + 1:
        raise UnsupportedSpec(f"ddpm-mini on {classes}-channel images takes {classes + 1} input channels (the "
                              f"images and the time plane), got input {list(input)}")
    t = TimeCondAdd(NFREQ)
    layers: list[Layer] = [
        ConvBn(32), t,
        UnetDown(32), t,
        UnetDown(64), t,
        ConvBn(128), t, ConvBn(128),
        UnetUp(64), t,
        UnetUp(32),
        Conv2d(classes, k=1),
    ]
    return NetSpec("ddpm-mini", input, layers, classes)
