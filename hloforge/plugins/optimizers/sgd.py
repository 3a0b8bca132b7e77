"""Plain SGD and heavy-ball momentum (v ← μ·v + g; θ ← θ − lr·v), decoupled weight decay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.variant import Optimizer


@attrs.frozen
class SGD(Optimizer):
    name: ClassVar[str] = "sgd"

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        return g, {}

    def optax_direction(self) -> Any:
        import optax

        return optax.identity()


@attrs.frozen
class Momentum(Optimizer):
    name: ClassVar[str] = "momentum"
    state: ClassVar[tuple[str, ...]] = ("v",)
    momentum: float = 0.9

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        v = state["v"] * self.momentum + g
        return v, {"v": v}

    def optax_direction(self) -> Any:
        import optax

        return optax.trace(decay=self.momentum)


@hookimpl
def hloforge_optimizers() -> list[type]:
    return [SGD, Momentum]
