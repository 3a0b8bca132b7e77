"""Dense (fully connected) layer on [B, n]: y = act(x·W + b), W stored [in, out].

On tokens [B, N, D] (a per-example [N, D] input) it applies to the last axis: [B, N, units], in the
form the strategy kind "tokenProduct" picks (lowering/dense.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
from hloforge.lowering.dense import TOKEN_PRODUCT, token_product
from hloforge.plugins.layers.activation import check_act, emit_act, reference_act


@attrs.frozen
class Dense(Layer):
    kind = "dense"
    strategy_kinds = (TOKEN_PRODUCT.name,)
    units: int
    act: str = "identity"
    bias: bool = True

    def out_shape(self, in_shape: Shape) -> Shape:
        check_act(self.act)
        if len(in_shape) not in (1, 2):
            raise UnsupportedSpec(f"dense takes a flat input [n] or tokens [N, D], got {list(in_shape)}; "
                                  "add a flatten layer first")
        if self.units <= 0:
            raise UnsupportedSpec(f"units must be positive, got {self.units}")
        return (*in_shape[:-1], self.units)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        w = ParamSlot("w", (in_shape[-1], self.units), "glorot", True)
        return (w, ParamSlot("b", (self.units,), "zeros", False)) if self.bias else (w,)

    def strategies_for(self, in_shape: Shape) -> tuple[str, ...]:
        return self.strategy_kinds if len(in_shape) > 1 else ()

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        y = token_product(b, x, params["w"])
        if self.bias:
            y = y + b.broadcast_to(params["b"], y.shape)
        return emit_act(b, self.act, y)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        y = x @ params["w"]
        if self.bias:
            y = y + params["b"]
        return reference_act(self.act, y)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(4, act="relu"), (6,)), (cls(3, bias=False, act="gelu"), (5,)), (cls(3, act="gelu"), (2, 4)),
                # fan-in 64 spreads the pre-activations to std ≈ 4: past relu6's 6 and the hard ones' ±3,
                # which the N(0, 1) inputs of the activations' own cases never reach
                *[(cls(16, act=act), (64,)) for act in ("relu6", "hSwish", "hSigmoid")]]


@attrs.frozen
class Flatten(Layer):
    kind = "flatten"

    def out_shape(self, in_shape: Shape) -> Shape:
        n = 1
        for d in in_shape:
            n *= d
        return (n,)

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return b.reshape(x, (x.shape[0], *self.out_shape(x.shape[1:])))

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        return x.reshape(x.shape[0], -1)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (2, 3, 3))]


@hookimpl
def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
    return [TOKEN_PRODUCT]


@hookimpl
def hloforge_layers() -> list[type]:
    return [Dense, Flatten]
