"""Scoring a checkpoint at another size (seed 003, timm's test protocol: RSB-A3 trains at 160² and
evaluates at 224²): the eval graph rendered at S (its module `…_fwd_eval_s<S>`, so no artifact shares
the trained size's name) and the eval images resized and center-cropped to match.

Whether a net can be scored at S is read off its spec, never off a list of nets: re-rendered at
C×S×S it must still validate, and every parameter and statistic must keep its shape, so the
checkpoint loads unchanged. A net with global pooling before its classifier passes; a flatten +
dense head (the dense weight's fan-in is H·W·C) or a fixed positional table (ViT's) does not.

The crop follows timm's crop_pct: the image is resized so its short side is ⌊S / F⌋, then the
center S×S kept (`hloforge.core.resample.resize_center_crop`). Without --crop, F is the net's
protocol crop from PROTOCOLS where timm gives one, else 1 (resize straight to S)."""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.resample import resize_center_crop, resize_short_side
from hloforge.core.spec import NetSpec


@attrs.frozen
class EvalProtocol:
    """A net's published eval transform: its eval size, crop fraction and interpolation, and the
    timm pretrained config the facts are taken from."""

    size: int
    crop: float
    interpolation: str
    source: str


#: timm's eval protocols (its pretrained configs' input_size / crop_pct / interpolation), for the zoo
#: nets whose reference weights publish one. The resize here is bilinear whatever the protocol says.
#: Newer timm recipes test elsewhere: resnet50.a3_in1k (RSB A3) trains at 160 and tests at 224 with
#: crop 0.95; resnet50.a1_in1k tests at 288 with crop 1.0 (give those as --size / --crop).
PROTOCOLS: dict[str, EvalProtocol] = {
    "resnet18": EvalProtocol(224, 0.875, "bilinear", "timm resnet18.tv_in1k (torchvision)"),
    "resnet34": EvalProtocol(224, 0.875, "bilinear", "timm resnet34.tv_in1k (torchvision)"),
    "resnet50": EvalProtocol(224, 0.875, "bilinear", "timm resnet50.tv_in1k (torchvision)"),
    "mobilenet_v2": EvalProtocol(224, 0.875, "bicubic", "timm mobilenetv2_100.ra_in1k"),
    "efficientnet_b0": EvalProtocol(224, 0.875, "bicubic", "timm efficientnet_b0.ra_in1k"),
}


def check_size_crop(size: Any, crop: Any) -> None:
    """--size S and --crop F, refused in one line unless S is a positive integer and F in (0, 1]."""
    if size is None:
        if crop is not None:
            raise UnsupportedSpec(f"--crop {crop} needs --size: the crop fraction of scoring at another size")
        return
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise UnsupportedSpec(f"--size must be a positive integer (the eval image side), got {size!r}")
    if crop is not None and (isinstance(crop, bool) or not isinstance(crop, (int, float, np.floating))
                             or not math.isfinite(crop) or not 0 < crop <= 1):
        raise UnsupportedSpec(f"--crop must be a fraction in (0, 1] (timm's crop_pct), got {crop!r}")


def spec_at_size(spec: NetSpec, size: int) -> NetSpec:
    """The spec with its input C×H×W re-rendered at C×size×size, refused with the reason unless it
    still validates and every parameter and statistic keeps its shape (the checkpoint loads as is)."""
    shape = spec.input_shape
    if len(shape) != 3:
        raise UnsupportedSpec(f"--size scores an image net (input C×H×W); net {spec.name!r} takes input "
                              f"{list(shape)}")
    at = attrs.evolve(spec, input_shape=(shape[0], size, size))
    where = f"net {spec.name!r} (trained at {shape[1]}×{shape[2]}) cannot be scored at {size}×{size}"
    try:
        walk = at.walk()
    except UnsupportedSpec as e:
        raise UnsupportedSpec(f"{where}: {e}") from None
    for what, have, got in (("parameter", spec.params(), at.params()), ("statistic", spec.stats(), at.stats())):
        want = {n: s.shape for n, s in have}
        for n, s in got:
            if want.get(n) != s.shape:
                raise UnsupportedSpec(
                    f"{where}: its {what} {n} would be {list(s.shape)} there, {list(want.get(n, ()))} as trained "
                    "(its shape depends on the input size, as a flatten + dense head's or a fixed positional "
                    "table's does; a net with global pooling before its classifier keeps every shape)")
        if len(got) != len(want):
            raise UnsupportedSpec(f"{where}: it would have {len(got)} {what}s there, {len(want)} as trained")
    if walk[-1].out_shape != spec.out_shape:
        raise UnsupportedSpec(f"{where}: its output would be {list(walk[-1].out_shape)}, "
                              f"{list(spec.out_shape)} as trained")
    return at


@attrs.frozen
class ScoringSize:
    """Where a checkpoint is scored: the spec at `size`, the crop and where the crop came from."""

    spec: NetSpec
    trained: tuple[int, ...]
    size: int
    crop: float
    crop_from: str

    @property
    def suffix(self) -> str:
        """The eval module's name suffix: `…_fwd_eval_s<S>` (seed 003)."""
        return f"_s{self.size}"

    @property
    def graph(self) -> str:
        return f"{self.spec.ident}_fwd_eval{self.suffix}"

    def images(self, x: np.ndarray) -> np.ndarray:
        """The eval images (at the trained size) resized and center-cropped to size×size."""
        return resize_center_crop(x, self.size, self.crop)

    def describe(self) -> str:
        s, (h, w) = self.size, self.trained[1:]
        return (f"at {s}×{s} (trained {h}×{w}; crop {self.crop:g} [{self.crop_from}]: resized to "
                f"{resize_short_side(s, self.crop)}, center {s}×{s}; graph {self.graph})")


def scoring_size(spec: NetSpec, net: str, size: int, crop: float | None) -> ScoringSize:
    """The size to score `spec` (zoo name or spec file `net`) at, with --crop or the net's default."""
    check_size_crop(size, crop)
    at = spec_at_size(spec, size)
    proto = PROTOCOLS.get(net)
    if crop is not None:
        return ScoringSize(at, spec.input_shape, size, float(crop), "--crop")
    if proto is not None:
        return ScoringSize(at, spec.input_shape, size, proto.crop, proto.source)
    return ScoringSize(at, spec.input_shape, size, 1.0, "no timm protocol for this net")
