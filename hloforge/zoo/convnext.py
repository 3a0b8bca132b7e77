"""ConvNeXt-Tiny (torchvision) and convnext-mini."""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.convnext import ConvNextDownsample, ConvNextStage
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.norm import LayerNorm
from hloforge.plugins.layers.pool import GlobalAvgPool

IMAGENET = (3, 224, 224)


def _convnext(name: str, depths: Sequence[int], dims: Sequence[int], stem: int, classes: int,
              input: Sequence[int]) -> NetSpec:
    layers: list[Layer] = [Conv2d(dims[0], k=stem, stride=stem, pad="valid"), LayerNorm(1e-6)]
    for i, (d, n) in enumerate(zip(dims, depths, strict=True)):
        if i:
            layers.append(ConvNextDownsample(d))
        layers.append(ConvNextStage(n=n))
    layers += [GlobalAvgPool(), LayerNorm(1e-6), Dense(classes)]
    return NetSpec(name, input, layers, classes)


def convnext_tiny(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    return _convnext("convnext_tiny", (3, 3, 9, 3), (96, 192, 384, 768), 4, classes, input)


def convnext_mini(classes: int = 10, input: Sequence[int] = (1, 28, 28)) -> NetSpec:
    """2×2 patchify stem (28 → 14), then 14 → 7."""
    return _convnext("convnext-mini", (1, 1), (32, 64), 2, classes, input)
