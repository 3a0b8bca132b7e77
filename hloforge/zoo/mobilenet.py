"""MobileNet V2, V3-Large (torchvision) and V4-Conv-Small (timm), and their -mini variants."""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.mobile import InvertedResidual, MbConvV3, Uib
from hloforge.plugins.layers.norm import BatchNorm, ConvBn
from hloforge.plugins.layers.pool import GlobalAvgPool

IMAGENET = (3, 224, 224)

# torchvision mobilenet_v2: (expand t, channels c, repeats n, first stride s)
V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

# torchvision mobilenet_v3_large: (kernel, expanded, out, SE, act, stride); BN eps 1e-3
V3_LARGE = (
    (3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2), (3, 72, 24, False, "relu", 1),
    (5, 72, 40, True, "relu", 2), (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hSwish", 2), (3, 200, 80, False, "hSwish", 1), (3, 184, 80, False, "hSwish", 1),
    (3, 184, 80, False, "hSwish", 1), (3, 480, 112, True, "hSwish", 1), (3, 672, 112, True, "hSwish", 1),
    (5, 672, 160, True, "hSwish", 2), (5, 960, 160, True, "hSwish", 1), (5, 960, 160, True, "hSwish", 1),
)

# timm mobilenetv4_conv_small (_gen_mobilenet_v4, 'small'): conv blocks ("cn": out, k, stride) and
# UIB blocks ("uir": out, start_k, mid_k, stride, expand), stage by stage.
V4_SMALL = (
    ("cn", 32, 3, 2), ("cn", 32, 1, 1),
    ("cn", 96, 3, 2), ("cn", 64, 1, 1),
    ("uir", 96, 5, 5, 2, 3.0), *[("uir", 96, 0, 3, 1, 2.0)] * 4, ("uir", 96, 3, 0, 1, 4.0),
    ("uir", 128, 3, 3, 2, 6.0), ("uir", 128, 5, 5, 1, 4.0), ("uir", 128, 0, 5, 1, 4.0), ("uir", 128, 0, 5, 1, 3.0),
    *[("uir", 128, 0, 3, 1, 4.0)] * 2,
    ("cn", 960, 1, 1),
)


def mobilenet_v2(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    layers: list[Layer] = [ConvBn(32, k=3, stride=2, act="relu6")]
    layers += [InvertedResidual(c, n=n, stride=s, expand=t) for t, c, n, s in V2]
    layers += [ConvBn(1280, k=1, act="relu6"), GlobalAvgPool(), Dense(classes)]
    return NetSpec("mobilenet_v2", input, layers, classes)


def mobilenet_v3_large(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    eps = 1e-3
    layers: list[Layer] = [ConvBn(16, k=3, stride=2, act="hSwish", eps=eps)]
    layers += [MbConvV3(o, mid=e, k=k, stride=s, se=se, act=a, eps=eps) for k, e, o, se, a, s in V3_LARGE]
    layers += [ConvBn(960, k=1, act="hSwish", eps=eps), GlobalAvgPool(), Dense(1280, act="hSwish"), Dense(classes)]
    return NetSpec("mobilenet_v3_large", input, layers, classes)


def mobilenetv4_conv_small(classes: int = 1000, input: Sequence[int] = IMAGENET) -> NetSpec:
    """timm's efficient head: pool, then a 1×1 conv to 1280 without bias + BN + ReLU (here a
    bias-free dense and a batchNorm on the pooled vector: the same map at 1×1), then the classifier."""
    layers: list[Layer] = []
    for kind, *a in V4_SMALL:
        if kind == "cn":
            layers.append(ConvBn(int(a[0]), k=int(a[1]), stride=int(a[2])))
        else:
            layers.append(Uib(int(a[0]), start_k=int(a[1]), mid_k=int(a[2]), stride=int(a[3]), expand=float(a[4])))
    layers += [GlobalAvgPool(), Dense(1280, bias=False), BatchNorm(act="relu"), Dense(classes)]
    return NetSpec("mobilenetv4_conv_small", input, [ConvBn(32, k=3, stride=2), *layers], classes)


def mobilenetv2_mini(classes: int = 10, input: Sequence[int] = (1, 28, 28)) -> NetSpec:
    return NetSpec("mobilenetv2-mini", input, [
        ConvBn(16, k=3, act="relu6"),
        InvertedResidual(16, n=1, expand=1), InvertedResidual(24, n=2, stride=2, expand=4),
        InvertedResidual(32, n=2, stride=2, expand=4),
        ConvBn(128, k=1, act="relu6"), GlobalAvgPool(), Dense(classes),
    ], classes)


def mobilenetv3_mini(classes: int = 10, input: Sequence[int] = (1, 28, 28)) -> NetSpec:
    return NetSpec("mobilenetv3-mini", input, [
        ConvBn(16, k=3, act="hSwish"),
        MbConvV3(16, mid=16, act="relu", se=True), MbConvV3(24, mid=64, stride=2, act="relu"),
        MbConvV3(32, mid=96, k=5, stride=2, se=True), MbConvV3(32, mid=128, k=5, se=True),
        ConvBn(128, k=1, act="hSwish"), GlobalAvgPool(), Dense(classes),
    ], classes)


def mobilenetv4_mini(classes: int = 10, input: Sequence[int] = (1, 28, 28)) -> NetSpec:
    return NetSpec("mobilenetv4-mini", input, [
        ConvBn(16, k=3),
        Uib(24, start_k=3, mid_k=3, stride=2, expand=3.0), Uib(24, start_k=0, mid_k=3, expand=2.0),
        Uib(32, start_k=3, mid_k=0, stride=2, expand=4.0), Uib(32, start_k=0, mid_k=3, expand=2.0),
        ConvBn(128, k=1), GlobalAvgPool(), Dense(classes),
    ], classes)
