"""LAMB (You et al.): the Adam direction plus decoupled decay, r = m̂/(√v̂ + ε) + wd·θ, scaled per
tensor by the trust ratio ‖θ‖/‖r‖ (1 when either norm is 0): θ ← θ − lr·(‖θ‖/‖r‖)·r. ε 1e-6."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import ParamSlot
from hloforge.core.variant import Optimizer
from hloforge.plugins.optimizers.adam import Adam


def norm(b: Builder, x: Value) -> Value:
    return b.sqrt(b.sum(x * x))


@attrs.frozen
class Lamb(Adam):
    name: ClassVar[str] = "lamb"
    layout_free: ClassVar[bool] = True  # elementwise, and whole-tensor norms
    eps: float = 1e-6

    def update(self, b: Builder, p: Value, g: Value, state: Mapping[str, Value], scalars: Mapping[str, Value],
               slot: ParamSlot) -> tuple[Value, dict[str, Value]]:
        d, new_state = self.direction(b, g, state, scalars)
        r = self.decayed(p, d, slot)
        pn, rn = norm(b, p), norm(b, r)
        zero, one = b.full(0.0), b.full(1.0)
        ratio = b.select(b.compare(pn, zero, "EQ"), one, b.select(b.compare(rn, zero, "EQ"), one, pn / rn))
        step = b.broadcast_to(scalars["lr"] * ratio, p.shape)
        return p - step * r, new_state

    def optax_reference(self, lr: float, decay_mask: Any) -> Any:
        import optax

        return optax.chain(self.optax_direction(), optax.add_decayed_weights(self.weight_decay, decay_mask),
                           optax.scale_by_trust_ratio(), optax.scale(-lr))

    @classmethod
    def gate_cases(cls) -> list[Optimizer]:
        return [cls(), cls(weight_decay=0.02)]


@hookimpl
def hloforge_optimizers() -> list[type]:
    return [Lamb]
