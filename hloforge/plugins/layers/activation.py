"""Activations: one table of (builder form, jax.numpy reference), used by the standalone
activation layers and by every layer's `act=` option."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, Shape

_GELU_C = math.sqrt(2.0 / math.pi)


def _relu6(b: Builder, x: Value) -> Value:
    return b.clip(x, 0.0, 6.0)


def _gelu(b: Builder, x: Value) -> Value:  # tanh form
    return x * 0.5 * (1.0 + b.tanh((x + x * x * x * 0.044715) * _GELU_C))


EMIT: dict[str, Callable[[Builder, Value], Value]] = {
    "identity": lambda b, x: x,
    "relu": lambda b, x: b.relu(x),
    "relu6": _relu6,
    "gelu": _gelu,
    "swish": lambda b, x: x * b.logistic(x),
    "sigmoid": lambda b, x: b.logistic(x),
    "hSwish": lambda b, x: x * _relu6(b, x + 3.0) / 6.0,
    "hSigmoid": lambda b, x: _relu6(b, x + 3.0) / 6.0,
}


def reference_act(name: str, x: Any) -> Any:
    import jax
    import jax.numpy as jnp

    def relu6(v: Any) -> Any:
        return jnp.minimum(jnp.maximum(v, 0.0), 6.0)

    return {
        "identity": lambda v: v,
        "relu": jax.nn.relu,
        "relu6": relu6,
        "gelu": lambda v: jax.nn.gelu(v, approximate=True),
        "swish": jax.nn.swish,
        "sigmoid": jax.nn.sigmoid,
        "hSwish": lambda v: v * relu6(v + 3.0) / 6.0,
        "hSigmoid": lambda v: relu6(v + 3.0) / 6.0,
    }[name](x)


def check_act(name: str) -> None:
    if name not in EMIT:
        raise UnsupportedSpec(f"unknown activation {name!r}; expected one of {sorted(EMIT)}")


def emit_act(b: Builder, name: str, x: Value) -> Value:
    return EMIT[name](b, x)


@attrs.frozen
class Activation(Layer):
    """An activation as a layer of its own; `kind` is the activation's name."""

    def out_shape(self, in_shape: Shape) -> Shape:
        return in_shape

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return emit_act(b, self.kind, x)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        return reference_act(self.kind, x)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3, 5))]


ACTIVATION_LAYERS: list[type[Layer]] = [
    attrs.frozen(type(f"Act_{name}", (Activation,), {"kind": name})) for name in EMIT
]


@hookimpl
def hloforge_layers() -> list[type]:
    return list(ACTIVATION_LAYERS)
