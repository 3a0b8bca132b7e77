"""Dropout: y = x · mask in training, the identity in eval. The mask (inverted dropout: kept
entries scaled by 1/(1 − rate)) is a per-example input the host draws each step (MaskSlot),
so the graph holds no RNG and a resumed run redraws the same masks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, MaskSlot, Shape


@attrs.frozen
class Dropout(Layer):
    kind = "dropout"
    rate: float = 0.1

    def out_shape(self, in_shape: Shape) -> Shape:
        if not 0.0 <= self.rate < 1.0:
            raise UnsupportedSpec(f"rate must be in [0, 1), got {self.rate}")
        return in_shape

    def mask_slots(self, in_shape: Shape) -> tuple[MaskSlot, ...]:
        return (MaskSlot("mask", in_shape, self.rate),) if self.rate else ()

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return x * ctx.masks["mask"] if "mask" in ctx.masks else x

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return x * ctx.masks["mask"] if ctx is not None and "mask" in ctx.masks else x

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(0.5), (3, 5)), (cls(0.25), (2, 3, 3))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [Dropout]
