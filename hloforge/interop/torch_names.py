"""Tensor-name tables: which PyTorch (torchvision / timm) state-dict entry each zoo parameter and
BatchNorm statistic comes from, and how its layout converts. One table per family.

A zoo tensor name is `<unit>.<suffix>` (`2.b0.conv1.w`, `4.se.w1`, `0.mean`): the unit is a conv+BN
pair, a dense, an SE, a norm; the suffix is the slot. A family's table maps each unit to the PyTorch
module(s) it reads, found by name (never by order: ConvNeXt's state dict lists its layer scale first).
Within a block, torchvision's sequential containers number their parts by position (`block.2.0`), so
those tables count the block's own units in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from hloforge.core.spec import NetSpec

Shape = tuple[int, ...]


@attrs.frozen
class Layout:
    """A layout conversion: the source shape a zoo shape needs, and the two ways across."""

    source_shape: Callable[[Shape], Shape]
    to_zoo: Callable[[np.ndarray, Shape], np.ndarray]
    to_source: Callable[[np.ndarray], np.ndarray]


LAYOUTS: dict[str, Layout] = {
    "copy": Layout(lambda s: s, lambda a, s: a, lambda a: a),
    # nn.Linear's (out, in) → a dense's (in, out)
    "linear": Layout(lambda s: s[::-1], lambda a, s: a.T, lambda a: a.T),
    # a 1×1 conv (out, in, 1, 1) on a pooled vector → a dense's (in, out) (SE blocks, MobileNetV4's head)
    "conv1x1_dense": Layout(lambda s: (s[1], s[0], 1, 1), lambda a, s: a[:, :, 0, 0].T,
                            lambda a: a.T[:, :, None, None]),
    # nn.Linear on channels-last (ConvNeXt's pointwise) → a 1×1 conv (out, in, 1, 1)
    "linear_conv1x1": Layout(lambda s: s[:2], lambda a, s: a[:, :, None, None], lambda a: a[:, :, 0, 0]),
    # ConvNeXt's layer scale (C, 1, 1) → (C,)
    "chan11": Layout(lambda s: (*s, 1, 1), lambda a, s: a.reshape(s), lambda a: a[:, None, None]),
    # timm's class token (1, 1, D) and position embedding (1, N, D): a leading batch axis of one
    "batch1": Layout(lambda s: (1,) * (3 - len(s)) + s, lambda a, s: a.reshape(s),
                     lambda a: a.reshape((1,) * (3 - a.ndim) + a.shape)),
}

Unit = dict[str, tuple[str, str]]  # zoo suffix → (source tensor name, layout)


def convbn(conv: str, bn: str) -> Unit:
    return {"w": (f"{conv}.weight", "copy"), "b": (f"{conv}.bias", "copy"), **norm(bn)}


def norm(m: str) -> Unit:
    return {"gamma": (f"{m}.weight", "copy"), "beta": (f"{m}.bias", "copy"),
            "mean": (f"{m}.running_mean", "copy"), "var": (f"{m}.running_var", "copy")}


def linear(m: str, layout: str = "linear") -> Unit:
    return {"w": (f"{m}.weight", layout), "b": (f"{m}.bias", "copy")}


def se(fc1: str, fc2: str) -> Unit:
    return {"w1": (f"{fc1}.weight", "conv1x1_dense"), "b1": (f"{fc1}.bias", "copy"),
            "w2": (f"{fc2}.weight", "conv1x1_dense"), "b2": (f"{fc2}.bias", "copy")}


def units(spec: NetSpec) -> dict[str, list[str]]:
    """Each unit of the net (the tensor name less its slot suffix) and its suffixes, in net order."""
    out: dict[str, list[str]] = {}
    for name, _ in [*spec.params(), *spec.stats()]:
        unit, _, suffix = name.rpartition(".")
        out.setdefault(unit, []).append(suffix)
    return out


def block_parts(spec: NetSpec) -> dict[str, list[str]]:
    """Each block (`2.b0`, or `4` for a one-block layer) → its parts in order (`expand`, `dw`, `se`, ...)."""
    out: dict[str, list[str]] = {}
    for unit in units(spec):
        block, _, part = unit.rpartition(".")
        if block:
            parts = out.setdefault(block, [])
            if part not in parts:
                parts.append(part)
    return out


def _layer(unit: str) -> int:
    return int(unit.split(".")[0])


def _head(spec: NetSpec, unit: str) -> int:
    """How many layers from the end `unit`'s layer sits (0: the last)."""
    return len(spec.layers) - 1 - _layer(unit)


# ------------------------------------------------------------------ the families
def resnet(spec: NetSpec) -> dict[str, Unit]:
    out: dict[str, Unit] = {}
    for unit in units(spec):
        p = unit.split(".")
        if unit == "0":
            out[unit] = convbn("conv1", "bn1")
        elif _head(spec, unit) == 0:
            out[unit] = linear("fc")
        elif len(p) == 3:
            block = f"layer{int(p[0]) - 1}.{p[1][1:]}"
            out[unit] = (convbn(f"{block}.downsample.0", f"{block}.downsample.1") if p[2] == "down"
                         else convbn(f"{block}.{p[2]}", f"{block}.bn{p[2][-1]}"))
    return out


def _sequential_block(prefix: str, parts: list[str], part: str, *, bare_project: bool = False) -> Unit:
    """A torchvision block whose parts are a numbered sequence: conv+BN pairs `prefix.i.0` / `.i.1`, SE
    `prefix.i.fc1` / `fc2`; `bare_project`: the last part is a bare conv `prefix.i` and its BN `prefix.i+1`
    (MobileNetV2)."""
    i = parts.index(part)
    if part == "se":
        return se(f"{prefix}.{i}.fc1", f"{prefix}.{i}.fc2")
    if bare_project and i == len(parts) - 1:
        return convbn(f"{prefix}.{i}", f"{prefix}.{i + 1}")
    return convbn(f"{prefix}.{i}.0", f"{prefix}.{i}.1")


def mobilenet_v2(spec: NetSpec) -> dict[str, Unit]:
    blocks = block_parts(spec)
    flat: dict[str, int] = {}  # block → its index in `features` (the stages' blocks numbered through)
    for block in blocks:
        if ".b" in block:
            flat[block] = len(flat) + 1
    out: dict[str, Unit] = {}
    for unit in units(spec):
        block, _, part = unit.rpartition(".")
        if not block:
            out[unit] = (linear("classifier.1") if _head(spec, unit) == 0
                         else convbn(f"features.{len(flat) + 1 if _layer(unit) else 0}.0",
                                     f"features.{len(flat) + 1 if _layer(unit) else 0}.1"))
        else:
            out[unit] = _sequential_block(f"features.{flat[block]}.conv", blocks[block], part, bare_project=True)
    return out


def mobilenet_v3(spec: NetSpec) -> dict[str, Unit]:
    blocks = block_parts(spec)
    out: dict[str, Unit] = {}
    for unit in units(spec):
        block, _, part = unit.rpartition(".")
        if block:
            out[unit] = _sequential_block(f"features.{block}.block", blocks[block], part)
        elif _head(spec, unit) <= 1:  # Dense(1280, hSwish), Dense(classes): classifier 0 and 3
            out[unit] = linear("classifier.0" if _head(spec, unit) else "classifier.3")
        else:
            out[unit] = convbn(f"features.{unit}.0", f"features.{unit}.1")
    return out


def efficientnet(spec: NetSpec) -> dict[str, Unit]:
    blocks = block_parts(spec)
    out: dict[str, Unit] = {}
    for unit in units(spec):
        block, _, part = unit.rpartition(".")
        if block:
            layer, _, b = block.partition(".b")
            out[unit] = _sequential_block(f"features.{layer}.{b}.block", blocks[block], part)
        elif _head(spec, unit) == 0:
            out[unit] = linear("classifier.1")
        else:
            out[unit] = convbn(f"features.{unit}.0", f"features.{unit}.1")
    return out


CONVNEXT_BLOCK: dict[str, Callable[[str], Unit]] = {
    "dw": lambda p: linear(f"{p}.block.0", "copy"),
    "norm": lambda p: norm(f"{p}.block.2"),
    "pw1": lambda p: linear(f"{p}.block.3", "linear_conv1x1"),
    "pw2": lambda p: linear(f"{p}.block.5", "linear_conv1x1"),
    "scale": lambda p: {"gamma": (f"{p}.layer_scale", "chan11")},
}


def convnext(spec: NetSpec) -> dict[str, Unit]:
    """Stem conv + LN are torchvision's features.0; layer i ≥ 2 is features.(i-1) (stages and downsamples)."""
    out: dict[str, Unit] = {}
    for unit in units(spec):
        p = unit.split(".")
        layer = int(p[0])
        if _head(spec, unit) == 0:
            out[unit] = linear("classifier.2")
        elif _head(spec, unit) == 1:
            out[unit] = norm("classifier.0")
        elif layer < 2:
            out[unit] = linear("features.0.0", "copy") if layer == 0 else norm("features.0.1")
        elif len(p) == 3:  # a stage's block: 2.b0.dw
            out[unit] = CONVNEXT_BLOCK[p[2]](f"features.{layer - 1}.{p[1][1:]}")
        else:  # a downsample: 3.norm, 3.conv
            m = f"features.{layer - 1}"
            out[unit] = norm(f"{m}.0") if p[1] == "norm" else linear(f"{m}.1", "copy")
    return out


V4_STAGES = (2, 2, 6, 6, 1)  # timm mobilenetv4_conv_small: blocks per stage (zoo layers 1…17)
UIB_PARTS = {"dwStart": "dw_start", "expand": "pw_exp", "dwMid": "dw_mid", "project": "pw_proj"}


def mobilenet_v4(spec: NetSpec) -> dict[str, Unit]:
    where: dict[int, str] = {}  # zoo layer → timm block
    layer = 1
    for s, n in enumerate(V4_STAGES):
        for j in range(n):
            where[layer] = f"blocks.{s}.{j}"
            layer += 1
    out: dict[str, Unit] = {}
    for unit in units(spec):
        p = unit.split(".")
        head = _head(spec, unit)
        if unit == "0":
            out[unit] = convbn("conv_stem", "bn1")
        elif head == 0:
            out[unit] = linear("classifier")
        elif head == 1:
            out[unit] = norm("norm_head")
        elif head == 2:
            out[unit] = {"w": ("conv_head.weight", "conv1x1_dense")}
        elif len(p) == 1:
            out[unit] = convbn(f"{where[int(p[0])]}.conv", f"{where[int(p[0])]}.bn1")
        else:
            m = f"{where[int(p[0])]}.{UIB_PARTS[p[1]]}"
            out[unit] = convbn(f"{m}.conv", f"{m}.bn")
    return out


VIT_PARTS = {"attn.ln": "norm1", "attn.mhsa.qkv": "attn.qkv", "attn.mhsa.proj": "attn.proj", "mlp.ln": "norm2",
             "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}


def vit(spec: NetSpec) -> dict[str, Unit]:
    out: dict[str, Unit] = {}
    for unit in units(spec):
        layer, _, part = unit.partition(".")
        if unit == "0":
            out[unit] = {"w": ("patch_embed.proj.weight", "copy"), "b": ("patch_embed.proj.bias", "copy"),
                         "cls": ("cls_token", "batch1"), "pos": ("pos_embed", "batch1")}
        elif _head(spec, unit) == 0:
            out[unit] = linear("head")
        elif part == "norm":
            out[unit] = norm("norm")
        else:
            m = f"blocks.{int(layer) - 1}.{VIT_PARTS[part]}"
            out[unit] = norm(m) if part.endswith("ln") else linear(m)
    return out


@attrs.frozen
class Family:
    net: str  # the zoo net
    table: Callable[[NetSpec], dict[str, Unit]]
    build: dict[str, Any] = attrs.field(factory=dict)  # PyTorch constructor keywords


# "source:name" → the zoo net and its table. `build`: the PyTorch model's knobs that make a train
# step deterministic (dropout and stochastic depth off), which the parity tests pass.
SOURCES: dict[str, Family] = {
    "torchvision:resnet18": Family("resnet18", resnet),
    "torchvision:resnet34": Family("resnet34", resnet),
    "torchvision:resnet50": Family("resnet50", resnet),
    "torchvision:mobilenet_v2": Family("mobilenet_v2", mobilenet_v2, {"dropout": 0.0}),
    "torchvision:mobilenet_v3_large": Family("mobilenet_v3_large", mobilenet_v3, {"dropout": 0.0}),
    "torchvision:efficientnet_b0": Family("efficientnet_b0", efficientnet,
                                          {"dropout": 0.0, "stochastic_depth_prob": 0.0}),
    "torchvision:efficientnet_v2_s": Family("efficientnet_v2_s", efficientnet,
                                            {"dropout": 0.0, "stochastic_depth_prob": 0.0}),
    "torchvision:convnext_tiny": Family("convnext_tiny", convnext, {"stochastic_depth_prob": 0.0}),
    "timm:mobilenetv4_conv_small": Family("mobilenetv4_conv_small", mobilenet_v4),
    "timm:vit_tiny_patch16_224": Family("vit_tiny", vit),
}

# PyTorch buffers with no zoo counterpart: BatchNorm's step counter (it only matters at momentum=None).
IGNORED_SUFFIXES = (".num_batches_tracked",)
