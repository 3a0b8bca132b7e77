"""Adam and AdamW: β 0.9/0.999, ε 1e-8, bias correction bc1 = 1 − β1ᵗ, bc2 = 1 − β2ᵗ as runtime scalars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.variant import Optimizer


@attrs.frozen
class Adam(Optimizer):
    name: ClassVar[str] = "adam"
    layout_free: ClassVar[bool] = True  # elementwise
    state: ClassVar[tuple[str, ...]] = ("m", "v")
    scalars: ClassVar[tuple[str, ...]] = ("lr", "bc1", "bc2")
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def host_scalars(self, step: int, lr: float) -> dict[str, float]:
        return {"lr": lr, "bc1": 1.0 - self.b1**step, "bc2": 1.0 - self.b2**step}

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        m = state["m"] * self.b1 + g * (1.0 - self.b1)
        v = state["v"] * self.b2 + g * g * (1.0 - self.b2)
        m_hat = m / b.broadcast_to(scalars["bc1"], g.shape)
        v_hat = v / b.broadcast_to(scalars["bc2"], g.shape)
        return m_hat / (b.sqrt(v_hat) + self.eps), {"m": m, "v": v}

    def optax_direction(self) -> Any:
        import optax

        return optax.scale_by_adam(b1=self.b1, b2=self.b2, eps=self.eps)

    @classmethod
    def gate_cases(cls) -> list[Optimizer]:
        # β1, β2 and ε other than the defaults: an update that reads a constant for one passes the others
        return [cls(), cls(weight_decay=0.1), cls(b1=0.8, b2=0.99, eps=1e-4)]


@attrs.frozen
class AdamW(Adam):
    """Adam with decoupled weight decay on by default (0.01, as PyTorch and optax)."""

    name: ClassVar[str] = "adamw"
    weight_decay: float = 0.01

    @classmethod
    def gate_cases(cls) -> list[Optimizer]:
        return [cls(), cls(weight_decay=0.0)]


@hookimpl
def hloforge_optimizers() -> list[type]:
    return [Adam, AdamW]
