"""Binary cross-entropy with logits, timm's BinaryCrossEntropy (the RSB recipes' loss): every class
is an independent sigmoid, targets are the smoothed one-hot (off = ε/C, on = 1 − ε + ε/C) or, with
`soft`, the host's mixed targets, and the loss is the mean over all B·C elements (PyTorch's
binary_cross_entropy_with_logits, reduction 'mean')."""

from __future__ import annotations

from typing import Any

import attrs

from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Loss, Shape
from hloforge.losses.ce import ClassTargetLoss


@attrs.frozen
class BinaryCrossEntropy(ClassTargetLoss):
    name = "bce"
    also_known_as = ("binary_crossentropy", "BCEWithLogitsLoss")  # Keras's, PyTorch's

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n, c = logits.shape

        def fwd(z: Value) -> list[Value]:
            t = self.targets(b, y, c, z.dtype)
            # max(z, 0) − z·t + log(1 + e^−|z|): no overflow for any z
            return [b.sum(b.relu(z) - z * t + b.log(1.0 + b.exp(b.negate(b.abs(z))))) / float(n * c)]

        def bwd(b: Builder, g: Value) -> list[Value]:
            t = self.targets(b, y, c, logits.dtype)
            return [(b.logistic(logits) - t) * b.broadcast_to(g / float(n * c), (n, c))]

        return b.custom_vjp(fwd, bwd, logits)[0]

    def reference(self, logits: Any, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        c = logits.shape[1]
        if self.soft:
            t = y
        else:
            off = self.label_smoothing / c
            t = jax.nn.one_hot(y, c, dtype=logits.dtype) * (1 - self.label_smoothing) + off
        return jnp.mean(-t * jax.nn.log_sigmoid(logits) - (1 - t) * jax.nn.log_sigmoid(-logits))

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (5,)), (cls(label_smoothing=0.1), (6,)), (cls(soft=True), (4,))]


@hookimpl
def hloforge_losses() -> list[type]:
    return [BinaryCrossEntropy]
