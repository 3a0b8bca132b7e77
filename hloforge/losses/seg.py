"""Segmentation losses on per-pixel logits [B, C, H, W] and masks [B, H, W] int32 (seed 001).

Each carries its closed-form backward (a `Builder.custom_vjp`), which the gate checks against
jax.vjp of the plain reference and finite differences. N = B·H·W pixels; p = softmax over C.

- perPixelCE: −(1/N) Σ_k Σ_c t_c log p_c with t = (1−ε)·onehot + ε/C; ∂/∂z = (p − t)/N.
- dice: per class over the whole batch, I_c = Σ p_c y_c, P_c = Σ p_c, Y_c = Σ y_c,
  D_c = (2 I_c + ε)/(P_c + Y_c + ε), loss = 1 − (1/C) Σ_c D_c. ε (smooth) makes an absent,
  correctly unpredicted class score 1 rather than 0/0. ∂L/∂p_c = (1/C)(B_c − A_c y_c) with
  A_c = 2/den_c, B_c = num_c/den_c², then the softmax Jacobian-vector product written out:
  ∂L/∂z_i = p_i (g_i − Σ_j g_j p_j) — Dice gets no p − y cancellation.
- diceCE: perPixelCE + dice; label smoothing softens the CE half only (it is a likelihood
  notion; a set-overlap ratio has no use for it).
- perPixelFocal: FL_k = −(1 − p_t)^γ log p_t, loss = (1/N) Σ_k FL_k, with the per-pixel scalar
  A_k = γ p_t (1−p_t)^(γ−1) log p_t − (1−p_t)^γ and ∂FL_k/∂z_c = A_k (y_c − p_c). γ = 0 gives
  A = −1 exactly, so the loss and gradient are perPixelCE's bit for bit (the gradient by
  that arithmetic; the loss because the weight, identically 1, is then left out).
  (1−p_t)^γ is exp(γ log max(1−p_t, 1e-6)); the clamp only engages on a saturated softmax,
  where the pixel contributes ~nothing. The weight is differentiated, not detached, so the
  gradient is the reported loss's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Loss, Shape

FOCAL_CLAMP = 1e-6
PIXEL_DIMS = (0, 2, 3)  # the axes of [B, C, H, W] a per-pixel scalar [B, H, W] broadcasts along


# ------------------------------------------------------------------ emitted pieces
def channel_log_softmax(b: Builder, z: Value) -> Value:
    """log softmax over the class axis 1 of [B, C, H, W], shifted by the (gradient-free) max."""
    m = b.stop_gradient(b.reduce(z, [1], "max"))
    s = z - b.broadcast_in_dim(m, z.shape, PIXEL_DIMS)
    lse = b.log(b.sum(b.exp(s), [1]))
    return s - b.broadcast_in_dim(lse, z.shape, PIXEL_DIMS)


def pixel_one_hot(b: Builder, y: Value, classes: int, dtype: str) -> Value:
    n, h, w = y.shape
    shape = (n, classes, h, w)
    hit = b.compare(b.iota(shape, 1), b.broadcast_in_dim(y, shape, PIXEL_DIMS), "EQ")
    return b.select(hit, b.full(1.0, shape, dtype), b.full(0.0, shape, dtype))


def pixel_nll(b: Builder, logp: Value, t: Value) -> Value:
    """−Σ_c t_c log p_c per pixel: [B, H, W]. One definition, so focal at γ = 0 is CE's bits."""
    return b.negate(b.sum(t * logp, [1]))


def per_pixel(b: Builder, v: Value, like: Value) -> Value:
    return b.broadcast_in_dim(v, like.shape, PIXEL_DIMS)


def scaled_seed(b: Builder, g: Value, like: Value, n: int) -> Value:
    """The loss cotangent ḡ, divided by the pixel count, as a [B, C, H, W] factor."""
    return b.broadcast_to(g / float(n), like.shape)


# ------------------------------------------------------------------ the losses
class SegLoss(Loss):
    """What every per-pixel loss shares: its label kind, shapes and gate labels."""

    label_kind: ClassVar[str] = "mask"

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 3:
            raise UnsupportedSpec(f"{self.name} takes per-pixel logits [classes, H, W], got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return tuple(out_shape[1:]), "i32"

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return rng.integers(0, out_shape[0], (batch, *out_shape[1:])).astype(np.int32)


def _smoothing(instance: Any, attribute: Any, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise UnsupportedSpec(f"label_smoothing must be in [0, 1), got {value}")


def _positive(instance: Any, attribute: Any, value: float) -> None:
    if not value > 0:
        raise UnsupportedSpec(f"{attribute.name} must be positive, got {value}")


def _ref_softmax_onehot(logits: Any, y: Any) -> tuple[Any, Any, Any]:
    import jax

    c = logits.shape[1]
    logp = jax.nn.log_softmax(logits, axis=1)
    onehot = jax.nn.one_hot(y, c, axis=1, dtype=logits.dtype)
    return logp, onehot, c


@attrs.frozen
class PerPixelCE(SegLoss):
    name = "perPixelCE"
    label_smoothing: float = attrs.field(default=0.0, validator=_smoothing)

    def targets(self, b: Builder, y: Value, classes: int, dtype: str) -> Value:
        t = pixel_one_hot(b, y, classes, dtype)
        eps = self.label_smoothing
        return t * (1.0 - eps) + eps / classes if eps else t

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n = logits.shape[0] * logits.shape[2] * logits.shape[3]

        def fwd(z: Value) -> list[Value]:
            return [b.sum(pixel_nll(b, channel_log_softmax(b, z), self.targets(b, y, z.shape[1], z.dtype))) / float(n)]

        def bwd(b: Builder, g: Value) -> list[Value]:
            p = b.exp(channel_log_softmax(b, logits))
            return [(p - self.targets(b, y, logits.shape[1], logits.dtype)) * scaled_seed(b, g, logits, n)]

        return b.custom_vjp(fwd, bwd, logits)[0]

    def reference(self, logits: Any, y: Any) -> Any:
        import jax.numpy as jnp

        logp, onehot, c = _ref_softmax_onehot(logits, y)
        t = onehot * (1 - self.label_smoothing) + self.label_smoothing / c
        return -jnp.mean(jnp.sum(t * logp, axis=1))

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (4, 3, 3)), (cls(label_smoothing=0.1), (3, 2, 4))]


@attrs.frozen
class Dice(SegLoss):
    name = "dice"
    eps: float = attrs.field(default=1.0, validator=_positive)

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        c = logits.shape[1]

        def terms(z: Value) -> tuple[Value, Value, Value, Value]:
            """(p, onehot, num_c = 2 I_c + ε, den_c = P_c + Y_c + ε)."""
            p = b.exp(channel_log_softmax(b, z))
            onehot = pixel_one_hot(b, y, c, z.dtype)
            num = b.sum(p * onehot, PIXEL_DIMS) * 2.0 + self.eps
            den = b.sum(p, PIXEL_DIMS) + b.sum(onehot, PIXEL_DIMS) + self.eps
            return p, onehot, num, den

        def fwd(z: Value) -> list[Value]:
            _, _, num, den = terms(z)
            return [1.0 - b.sum(num / den) / float(c)]

        def bwd(b: Builder, g: Value) -> list[Value]:
            p, onehot, num, den = terms(logits)
            a, bc = (b.broadcast_in_dim(v, logits.shape, [1]) for v in (2.0 / den, num / (den * den)))
            gp = (bc - a * onehot) / float(c)  # ∂L/∂p
            dz = p * (gp - per_pixel(b, b.sum(gp * p, [1]), logits))  # the softmax JVP
            return [dz * b.broadcast_to(g, logits.shape)]

        return b.custom_vjp(fwd, bwd, logits)[0]

    def reference(self, logits: Any, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        _, onehot, c = _ref_softmax_onehot(logits, y)
        p = jax.nn.softmax(logits, axis=1)
        axes = (0, 2, 3)
        d = (2 * jnp.sum(p * onehot, axis=axes) + self.eps) / \
            (jnp.sum(p, axis=axes) + jnp.sum(onehot, axis=axes) + self.eps)
        return 1.0 - jnp.mean(d)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (4, 3, 3)), (cls(eps=1e-3), (3, 2, 4))]


@attrs.frozen
class DiceCE(SegLoss):
    name = "diceCE"
    label_smoothing: float = attrs.field(default=0.0, validator=_smoothing)  # the CE half's only
    eps: float = attrs.field(default=1.0, validator=_positive)

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        ce = PerPixelCE(self.label_smoothing).forward(b, logits, y)
        return ce + Dice(self.eps).forward(b, logits, y)

    def reference(self, logits: Any, y: Any) -> Any:
        return PerPixelCE(self.label_smoothing).reference(logits, y) + Dice(self.eps).reference(logits, y)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (3, 3, 3)), (cls(label_smoothing=0.1, eps=0.5), (4, 2, 3))]


@attrs.frozen
class PerPixelFocal(SegLoss):
    name = "perPixelFocal"
    gamma: float = attrs.field(default=2.0)

    @gamma.validator
    def _gamma(self, attribute: Any, value: float) -> None:
        if not value >= 0:
            raise UnsupportedSpec(f"gamma must be non-negative, got {value}")

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n = logits.shape[0] * logits.shape[2] * logits.shape[3]
        c = logits.shape[1]

        def terms(z: Value) -> tuple[Value, Value, Value, Value, Value]:
            """(log p, onehot, −log p_t, log max(1 − p_t, clamp), (1 − p_t)^γ) — the last three per pixel."""
            logp = channel_log_softmax(b, z)
            onehot = pixel_one_hot(b, y, c, z.dtype)
            nll = pixel_nll(b, logp, onehot)
            omp = 1.0 - b.exp(b.negate(nll))
            log_omp = b.log(b.maximum(omp, b.full(FOCAL_CLAMP, omp.shape, omp.dtype)))
            return logp, onehot, nll, log_omp, b.exp(log_omp * self.gamma)

        def fwd(z: Value) -> list[Value]:
            _, _, nll, _, weight = terms(z)
            # (1 − p_t)^0 is 1 for every p_t: at γ = 0 the loss is CE's own sum, not a sum of 1.0·nll
            # that a compiler may reduce in another order (one ulp apart)
            return [b.sum(nll if self.gamma == 0 else weight * nll) / float(n)]

        def bwd(b: Builder, g: Value) -> list[Value]:
            logp, onehot, nll, log_omp, weight = terms(logits)
            # A_k = γ·p_t·(1−p_t)^(γ−1)·log p_t − (1−p_t)^γ
            a = b.exp(b.negate(nll)) * b.exp(log_omp * (self.gamma - 1.0)) * b.negate(nll) * self.gamma - weight
            return [per_pixel(b, a, logits) * (onehot - b.exp(logp)) * scaled_seed(b, g, logits, n)]

        return b.custom_vjp(fwd, bwd, logits)[0]

    def reference(self, logits: Any, y: Any) -> Any:
        import jax.numpy as jnp

        logp, onehot, _ = _ref_softmax_onehot(logits, y)
        logpt = jnp.sum(onehot * logp, axis=1)
        return -jnp.mean(jnp.maximum(1.0 - jnp.exp(logpt), FOCAL_CLAMP) ** self.gamma * logpt)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (4, 3, 3)), (cls(gamma=0.5), (3, 2, 4)), (cls(gamma=0.0), (3, 3, 2))]


@hookimpl
def hloforge_losses() -> list[type]:
    return [PerPixelCE, Dice, DiceCE, PerPixelFocal]
