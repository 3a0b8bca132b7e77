"""Plain SGD, heavy-ball momentum (m ← μ·m + g; θ ← θ − lr·m) and Nesterov momentum
(m ← μ·m + g; θ ← θ − lr·(g + μ·m)), with decoupled weight decay."""

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
    layout_free: ClassVar[bool] = True  # elementwise

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        return g, {}

    def optax_direction(self) -> Any:
        import optax

        return optax.identity()


@attrs.frozen
class Momentum(Optimizer):
    """Heavy-ball momentum; `nesterov=True` steps along g + μ·m' (the look-ahead form optax and
    PyTorch use). The velocity is the `m` slot."""

    name: ClassVar[str] = "momentum"
    layout_free: ClassVar[bool] = True  # elementwise
    state: ClassVar[tuple[str, ...]] = ("m",)
    momentum: float = 0.9
    nesterov: bool = False

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        m = state["m"] * self.momentum + g
        return (g + m * self.momentum if self.nesterov else m), {"m": m}

    def optax_direction(self) -> Any:
        import optax

        return optax.trace(decay=self.momentum, nesterov=self.nesterov)


@attrs.frozen
class Nesterov(Momentum):
    """`--optimizer nesterov`: momentum 0.9 with the Nesterov step (the seed's mom variants)."""

    name: ClassVar[str] = "nesterov"
    nesterov: bool = True

    @classmethod
    def gate_cases(cls) -> list[Optimizer]:
        return [cls(), cls(weight_decay=0.1, momentum=0.8)]


@hookimpl
def hloforge_optimizers() -> list[type]:
    return [SGD, Momentum, Nesterov]
