"""ResNet 18/34/50 (torchvision, v1.5: the bottleneck strides on its 3×3) and resnet-mini."""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.pool import GlobalAvgPool, MaxPool
from hloforge.plugins.layers.residual import BottleneckStage, ResidualStage

IMAGENET = (3, 224, 224)


def _resnet(name: str, depths: Sequence[int], bottleneck: bool, classes: int, input: Sequence[int]) -> NetSpec:
    stage = BottleneckStage if bottleneck else ResidualStage
    widths = (256, 512, 1024, 2048) if bottleneck else (64, 128, 256, 512)
    layers: list[Layer] = [ConvBn(64, k=7, stride=2), MaxPool(3, 2, pad=1)]
    layers += [stage(w, n=n, stride=1 if i == 0 else 2) for i, (w, n) in enumerate(zip(widths, depths, strict=True))]
    layers += [GlobalAvgPool(), Dense(classes)]
    return NetSpec(name, input, layers, classes)


def resnet18(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    return _resnet("resnet18", (2, 2, 2, 2), False, classes, input)


def resnet34(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    return _resnet("resnet34", (3, 4, 6, 3), False, classes, input)


def resnet50(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    return _resnet("resnet50", (3, 4, 6, 3), True, classes, input)


def resnet18_cifar(classes: int = 10, input: Sequence[int] = (3, 32, 32)) -> NetSpec:
    """ResNet-18 with the CIFAR stem (a 3×3 stride-1 convBn, no max-pool): 32 → 32 → 16 → 8 → 4."""
    layers: list[Layer] = [ConvBn(64, k=3)]
    layers += [ResidualStage(w, n=2, stride=1 if i == 0 else 2) for i, w in enumerate((64, 128, 256, 512))]
    return NetSpec("resnet18-cifar", input, [*layers, GlobalAvgPool(), Dense(classes)], classes)


def resnet_mini(classes: int = 10, input: Sequence[int] = (1, 28, 28)) -> NetSpec:
    """28×28 digits: 16-wide stem, three one-block stages (28 → 14 → 7)."""
    return NetSpec("resnet-mini", input, [
        ConvBn(16, k=3),
        ResidualStage(16, n=1), ResidualStage(32, n=1, stride=2), ResidualStage(64, n=1, stride=2),
        GlobalAvgPool(), Dense(classes),
    ], classes)
