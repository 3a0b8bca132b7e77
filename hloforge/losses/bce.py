"""Binary cross-entropy with logits, timm's BinaryCrossEntropy (the RSB recipes' loss): every class
is an independent sigmoid, targets are the smoothed one-hot (off = ε/C, on = 1 − ε + ε/C) or, with
`soft`, the host's mixed targets, and the loss is the mean over all B·C elements (PyTorch's
binary_cross_entropy_with_logits, reduction 'mean')."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Loss, Shape
from hloforge.losses.ce import check_soft, one_hot, sample_soft_targets


@attrs.frozen
class BinaryCrossEntropy(Loss):
    name = "bce"
    label_kind = "class"  # soft targets too: they are mixed class labels, scored as classes
    label_smoothing: float = 0.0
    soft: bool = False

    def __attrs_post_init__(self) -> None:
        check_soft(self)

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 1:
            raise UnsupportedSpec(f"bce takes logits [classes], got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (out_shape, "f32") if self.soft else ((), "i32")

    def targets(self, b: Builder, y: Value, classes: int, dtype: str) -> Value:
        if self.soft:
            return y if y.dtype == dtype else b.convert(y, dtype)
        off = self.label_smoothing / classes
        t = one_hot(b, y, classes, dtype)
        return t * (1.0 - self.label_smoothing) + off if self.label_smoothing else t

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

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        if self.soft:
            return sample_soft_targets(rng, batch, out_shape[0])
        return rng.integers(0, out_shape[0], batch).astype(np.int32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (5,)), (cls(label_smoothing=0.1), (6,)), (cls(soft=True), (4,))]


@hookimpl
def hloforge_losses() -> list[type]:
    return [BinaryCrossEntropy]
