"""Softmax cross-entropy with label smoothing (closed-form backward) and mean squared error."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Loss, Shape


def log_softmax(b: Builder, z: Value) -> Value:
    """Row-wise log-softmax of [B, C], shifted by the (gradient-free) row max for stability."""
    n, c = z.shape
    m = b.stop_gradient(b.reduce(z, [1], "max"))
    s = z - b.broadcast_in_dim(m, z.shape, [0])
    lse = b.log(b.sum(b.exp(s), [1]))
    return s - b.broadcast_in_dim(lse, z.shape, [0])


def one_hot(b: Builder, y: Value, classes: int, dtype: str) -> Value:
    n = y.shape[0]
    hit = b.compare(b.iota((n, classes), 1), b.broadcast_in_dim(y, (n, classes), [0]), "EQ")
    return b.select(hit, b.full(1.0, (n, classes), dtype), b.full(0.0, (n, classes), dtype))


@attrs.frozen
class CrossEntropy(Loss):
    """mean_b −Σ_c t_c log softmax(z)_c with t = (1−ε)·onehot(y) + ε/C."""

    name = "crossEntropy"
    label_smoothing: float = attrs.field(default=0.0)

    @label_smoothing.validator
    def _check(self, attribute: Any, value: float) -> None:
        if not 0.0 <= value < 1.0:
            raise UnsupportedSpec(f"label_smoothing must be in [0, 1), got {value}")

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 1:
            raise UnsupportedSpec(f"crossEntropy takes logits [classes], got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (), "i32"

    def targets(self, b: Builder, y: Value, classes: int, dtype: str) -> Value:
        t = one_hot(b, y, classes, dtype)
        eps = self.label_smoothing
        return t * (1.0 - eps) + eps / classes if eps else t

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n, c = logits.shape

        def fwd(z: Value) -> list[Value]:
            t = self.targets(b, y, c, z.dtype)
            return [b.sum(b.negate(t * log_softmax(b, z))) / float(n)]

        def bwd(b: Builder, g: Value) -> list[Value]:
            return [self.backward(b, logits, y, g)]

        return b.custom_vjp(fwd, bwd, logits)[0]

    def backward(self, b: Builder, logits: Value, y: Value, g: Value) -> Value:
        """The closed form: the softmax Jacobian cancels the log, ∂L/∂z = (p − t)·ḡ/B."""
        n, c = logits.shape
        p = b.exp(log_softmax(b, logits))
        t = self.targets(b, y, c, logits.dtype)
        return (p - t) * b.broadcast_to(g / float(n), (n, c))

    def reference(self, logits: Any, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        c = logits.shape[1]
        t = jax.nn.one_hot(y, c, dtype=logits.dtype) * (1 - self.label_smoothing) + self.label_smoothing / c
        return -jnp.mean(jnp.sum(t * jax.nn.log_softmax(logits, axis=1), axis=1))

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return rng.integers(0, out_shape[0], batch).astype(np.int32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (5,)), (cls(label_smoothing=0.1), (7,))]


@attrs.frozen
class MeanSquaredError(Loss):
    """mean over every element of (z − y)², y a float target shaped like the output."""

    name = "mse"

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return out_shape, "f32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        if y.dtype != logits.dtype:
            y = b.convert(y, logits.dtype)
        d = logits - y
        return b.sum(d * d) / float(logits.type.size)

    def reference(self, logits: Any, y: Any) -> Any:
        import jax.numpy as jnp

        return jnp.mean((logits - y) ** 2)

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return rng.standard_normal((batch, *out_shape)).astype(np.float32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (4,)), (cls(), (2, 3, 3))]


@hookimpl
def hloforge_losses() -> list[type]:
    return [CrossEntropy, MeanSquaredError]
