"""Softmax cross-entropy with label smoothing or soft targets (closed-form backward), focal
cross-entropy, and mean squared error."""

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


def check_soft(loss: Any) -> None:
    """Soft targets carry their own smoothing (the host mixes and smooths them together)."""
    if not 0.0 <= loss.label_smoothing < 1.0:
        raise UnsupportedSpec(f"label_smoothing must be in [0, 1), got {loss.label_smoothing}")
    if loss.soft and loss.label_smoothing:
        raise UnsupportedSpec(f"{loss.name}: soft targets come smoothed from the host (train/mixing.py); "
                              "label_smoothing must be 0 with soft=True")


@attrs.frozen
class ClassTargetLoss(Loss):
    """A loss on logits [classes] against class labels, or with `soft` against target
    distributions [B, C] (mixup / cutmix mixed and smoothed on the host): the label handling that
    crossEntropy and bce share. Label smoothing: t = (1−ε)·onehot(y) + ε/C."""

    label_kind = "class"  # soft targets too: they are mixed class labels, scored as classes
    label_smoothing: float = 0.0
    soft: bool = False

    def __attrs_post_init__(self) -> None:
        check_soft(self)

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 1:
            raise UnsupportedSpec(f"{self.name} takes logits [classes], got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (out_shape, "f32") if self.soft else ((), "i32")

    def targets(self, b: Builder, y: Value, classes: int, dtype: str) -> Value:
        if self.soft:
            return y if y.dtype == dtype else b.convert(y, dtype)
        t = one_hot(b, y, classes, dtype)
        eps = self.label_smoothing
        return t * (1.0 - eps) + eps / classes if eps else t

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        if self.soft:
            return sample_soft_targets(rng, batch, out_shape[0])
        return rng.integers(0, out_shape[0], batch).astype(np.int32)


@attrs.frozen
class CrossEntropy(ClassTargetLoss):
    """mean_b −Σ_c t_c log softmax(z)_c (targets: ClassTargetLoss)."""

    name = "crossEntropy"
    # Keras's (categorical: its one-hot y, refused here with how to get the ids) and PyTorch's
    also_known_as = ("sparse_categorical_crossentropy", "categorical_crossentropy", "CrossEntropyLoss")

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n, c = logits.shape
        fwd_values: dict[str, Value] = {}  # the backward reuses the forward's log-softmax and targets

        def fwd(z: Value) -> list[Value]:
            t = self.targets(b, y, c, z.dtype)
            logp = log_softmax(b, z)
            fwd_values.update(logp=logp, t=t)
            return [b.sum(b.negate(t * logp)) / float(n)]

        def bwd(b: Builder, g: Value) -> list[Value]:
            if type(self).backward is CrossEntropy.backward:  # the closed form below, on the forward's values
                return [self.backward(b, logits, y, g, fwd_values["logp"], fwd_values["t"])]
            return [self.backward(b, logits, y, g)]  # a subclass's own backward(b, logits, y, g)

        return b.custom_vjp(fwd, bwd, logits)[0]

    def backward(self, b: Builder, logits: Value, y: Value, g: Value, logp: Value | None = None,
                 t: Value | None = None) -> Value:
        """The closed form: the softmax Jacobian cancels the log, ∂L/∂z = (p − t)·ḡ/B. Host soft
        targets sum to 1 only to f32 rounding, so for them it is (p·Σt − t)·ḡ/B, the exact gradient.
        `logp`, `t`: the forward's log-softmax and targets, where it has them (else emitted here)."""
        n, c = logits.shape
        p = b.exp(log_softmax(b, logits) if logp is None else logp)
        t = self.targets(b, y, c, logits.dtype) if t is None else t
        if self.soft:
            p = p * b.broadcast_in_dim(b.sum(t, [1]), (n, c), [0])
        return (p - t) * b.broadcast_to(g / float(n), (n, c))

    def reference(self, logits: Any, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        c = logits.shape[1]
        if self.soft:
            t = y
        else:
            t = jax.nn.one_hot(y, c, dtype=logits.dtype) * (1 - self.label_smoothing) + self.label_smoothing / c
        return -jnp.mean(jnp.sum(t * jax.nn.log_softmax(logits, axis=1), axis=1))

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (5,)), (cls(label_smoothing=0.1), (7,)), (cls(soft=True), (6,))]


def sample_soft_targets(rng: np.random.Generator, batch: int, classes: int) -> np.ndarray:
    """Rows that sum to 1, as mixing makes them: two smoothed one-hots blended at a random λ."""
    lam = rng.uniform(0.2, 0.8, (batch, 1))
    a, b = (np.eye(classes)[rng.integers(0, classes, batch)] * 0.9 + 0.1 / classes for _ in range(2))
    return (lam * a + (1 - lam) * b).astype(np.float32)


@attrs.frozen
class FocalCrossEntropy(Loss):
    """Focal softmax cross-entropy (Lin et al.) for class labels: mean_b −(1 − p_y)^γ log p_y.
    γ is a whole number (the weight is a product, so its gradient stays finite at p_y → 1);
    γ = 0 is cross-entropy. The backward is derived."""

    name = "focalCrossEntropy"
    label_kind = "class"
    gamma: int = 2

    def __attrs_post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 0:
            raise UnsupportedSpec(f"{self.name}: gamma must be a whole number ≥ 0, got {self.gamma!r}")

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 1:
            raise UnsupportedSpec(f"{self.name} takes logits [classes], got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (), "i32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n, c = logits.shape
        t = b.stop_gradient(one_hot(b, y, c, logits.dtype))  # labels: no cotangent flows into them
        logp = log_softmax(b, logits)
        omp = 1.0 - b.exp(logp)
        w = b.full(1.0, (n, c))
        for _ in range(self.gamma):
            w = w * omp
        return b.sum(b.negate(t * w * logp)) / float(n)

    def reference(self, logits: Any, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        logp = jax.nn.log_softmax(logits, axis=1)
        logp_y = jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
        return -jnp.mean((1.0 - jnp.exp(logp_y)) ** self.gamma * logp_y)

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return rng.integers(0, out_shape[0], batch).astype(np.int32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (5,)), (cls(gamma=1), (4,)), (cls(gamma=0), (3,))]


@attrs.frozen
class MeanSquaredError(Loss):
    """mean over every element of (z − y)², y a float target shaped like the output."""

    name = "mse"
    also_known_as = ("mean_squared_error", "MSELoss")  # Keras's, PyTorch's

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
    return [CrossEntropy, FocalCrossEntropy, MeanSquaredError]
