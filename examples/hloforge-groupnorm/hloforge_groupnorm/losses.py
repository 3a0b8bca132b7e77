"""Huber loss: mean over every element of ½d² where |d| ≤ δ, else δ(|d| − ½δ), d = z − y.

Float targets shaped like the output (as `mse`). The backward is given in closed form —
∂L/∂z = clip(d, −δ, δ)/N — with `Builder.custom_vjp`, so the forward's select and compare
are not differentiated; the gate checks the closed form against jax.grad of `reference`
and against finite differences of the emitted forward.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Loss, Shape

HLOFORGE_PLUGIN_API = 1


@attrs.frozen
class Huber(Loss):
    name = "huber"
    delta: float = attrs.field(default=1.0)

    @delta.validator
    def _check(self, attribute: Any, value: float) -> None:
        if not value > 0:
            raise UnsupportedSpec(f"delta must be positive, got {value}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return out_shape, "f32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        if y.dtype != logits.dtype:
            y = b.convert(y, logits.dtype)
        n, delta = float(logits.type.size), self.delta

        def fwd(z: Value) -> list[Value]:
            d = z - y
            a = b.abs(d)
            small = b.compare(a, b.full(delta, a.shape, a.dtype), "LE")
            return [b.sum(b.select(small, d * d * 0.5, (a - 0.5 * delta) * delta)) / n]

        def bwd(b: Builder, g: Value) -> list[Value]:
            d = logits - y
            return [b.clip(d, -delta, delta) * b.broadcast_to(g / n, d.shape)]

        return b.custom_vjp(fwd, bwd, logits)[0]

    def reference(self, logits: Any, y: Any) -> Any:
        import jax.numpy as jnp

        a = jnp.abs(logits - y)
        return jnp.mean(jnp.where(a <= self.delta, 0.5 * a**2, self.delta * (a - 0.5 * self.delta)))

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return rng.standard_normal((batch, *out_shape)).astype(np.float32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        # The gate's logits are N(0, 4): δ=1 puts elements on both branches, δ=0.25 mostly on the linear one.
        return [(cls(), (6,)), (cls(delta=0.25), (2, 3, 3))]


@hookimpl
def hloforge_losses() -> list[type]:
    return [Huber]
