"""Vision transformers: vit_tiny (timm's vit_tiny_patch16_224: 5,717,416 parameters at 1000 classes),
vit-mini (digits: 1×28×28, patch 7 → 16 patches + a class token; patch 4 on a 32×32 input;
D 32, 2 heads, MLP 64, 4 blocks: 36,746 parameters at 10 classes) and vit-cifar (the issue-#11
benchmark ViT: 3×32×32, patch 4 → 64 patches + a class token; D 128, 4 heads of 32, MLP 256,
6 blocks: 811,146 parameters at 10 classes)."""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.transformer import PatchEmbed, TransformerBlock


def vit(name: str, input: Sequence[int], classes: int, *, dim: int, depth: int, heads: int, mlp: int, patch: int,
        attention: str = "dense") -> NetSpec:
    """Patch embedding, `depth` pre-norm blocks (the last adds the final LN and takes the class token), a head."""
    if depth < 1:
        raise UnsupportedSpec(f"depth must be at least 1, got {depth}")
    layers: list[Layer] = [PatchEmbed(dim, patch)]
    layers += [TransformerBlock(heads, mlp, attention=attention, final_norm=i == depth - 1,
                                output="cls" if i == depth - 1 else "sequence") for i in range(depth)]
    layers.append(Dense(classes))
    return NetSpec(name, input, layers, classes)


def vit_tiny(classes: int = 1000, input: Sequence[int] = (3, 224, 224)) -> NetSpec:
    return vit("vit_tiny", input, classes, dim=192, depth=12, heads=3, mlp=768, patch=16)


def vit_mini(classes: int = 10, input: Sequence[int] = (1, 28, 28)) -> NetSpec:
    patch = 7 if input[-1] % 7 == 0 else 4
    return vit("vit-mini", input, classes, dim=32, depth=4, heads=2, mlp=64, patch=patch)


def vit_cifar(classes: int = 10, input: Sequence[int] = (3, 32, 32)) -> NetSpec:
    """The CIFAR-sized ViT of the step-time suite (a 0.81M-parameter ViT trained from scratch at 32×32)."""
    return vit("vit-cifar", input, classes, dim=128, depth=6, heads=4, mlp=256, patch=4)
