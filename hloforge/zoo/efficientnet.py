"""EfficientNet-B0 and EfficientNetV2-S (torchvision), and efficientnet-mini."""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.mobile import FusedMbConv, MbConv
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.pool import GlobalAvgPool

IMAGENET = (3, 224, 224)

# (expand, kernel, stride, out, repeats)
B0 = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
      (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
# (fused?, expand, kernel, stride, out, repeats); BN eps 1e-3
V2_S = ((True, 1, 3, 1, 24, 2), (True, 4, 3, 2, 48, 4), (True, 4, 3, 2, 64, 4), (False, 4, 3, 2, 128, 6),
        (False, 6, 3, 1, 160, 9), (False, 6, 3, 2, 256, 15))


def efficientnet_b0(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    layers: list[Layer] = [ConvBn(32, k=3, stride=2, act="swish")]
    layers += [MbConv(o, n=n, stride=s, k=k, expand=e) for e, k, s, o, n in B0]
    layers += [ConvBn(1280, k=1, act="swish"), GlobalAvgPool(), Dense(classes)]
    return NetSpec("efficientnet_b0", input, layers, classes)


def efficientnet_v2_s(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    eps = 1e-3
    layers: list[Layer] = [ConvBn(24, k=3, stride=2, act="swish", eps=eps)]
    for fused, e, k, s, o, n in V2_S:
        block = FusedMbConv if fused else MbConv
        layers.append(block(o, n=n, stride=s, k=k, expand=e, eps=eps))
    layers += [ConvBn(1280, k=1, act="swish", eps=eps), GlobalAvgPool(), Dense(classes)]
    return NetSpec("efficientnet_v2_s", input, layers, classes)


def efficientnet_mini(classes: int = 10, input: Sequence[int] = (1, 28, 28)) -> NetSpec:
    return NetSpec("efficientnet-mini", input, [
        ConvBn(16, k=3, act="swish"),
        FusedMbConv(16, n=1, expand=1), MbConv(24, n=2, stride=2, expand=4),
        MbConv(32, n=2, stride=2, k=5, expand=4),
        ConvBn(128, k=1, act="swish"), GlobalAvgPool(), Dense(classes),
    ], classes)
