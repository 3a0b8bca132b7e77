"""RMSProp as the seed's variants use it: the mean square v starts at 1.0 (not 0, which would
make the first steps huge), ε inside the root, ρ 0.9 and momentum 0.9:
    v ← ρ·v + (1 − ρ)·g²;  m ← μ·m + g/√(v + ε);  θ ← θ − lr·(m + wd·θ)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import numpy as np

from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import ParamSlot
from hloforge.core.variant import Optimizer


@attrs.frozen
class RMSProp(Optimizer):
    name: ClassVar[str] = "rmsprop"
    layout_free: ClassVar[bool] = True  # elementwise
    state: ClassVar[tuple[str, ...]] = ("m", "v")  # m: the momentum buffer, v: the mean square
    rho: float = 0.9
    momentum: float = 0.9
    eps: float = 1e-8
    initial_scale: float = 1.0  # v's initial value

    def init_state(self, slot: ParamSlot) -> dict[str, np.ndarray]:
        return {"m": np.zeros(slot.shape, np.float32), "v": np.full(slot.shape, self.initial_scale, np.float32)}

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        v = state["v"] * self.rho + g * g * (1.0 - self.rho)
        step = g / b.sqrt(v + self.eps)
        if not self.momentum:
            return step, {"m": state["m"], "v": v}
        m = state["m"] * self.momentum + step
        return m, {"m": m, "v": v}

    def optax_direction(self) -> Any:
        import optax

        rms = optax.scale_by_rms(decay=self.rho, eps=self.eps, initial_scale=self.initial_scale, eps_in_sqrt=True)
        return optax.chain(rms, optax.trace(decay=self.momentum)) if self.momentum else rms

    @classmethod
    def gate_cases(cls) -> list[Optimizer]:
        return [cls(), cls(weight_decay=0.1, momentum=0.0, eps=1e-3), cls(rho=0.8, momentum=0.7, initial_scale=0.5)]


@hookimpl
def hloforge_optimizers() -> list[type]:
    return [RMSProp]
