"""Per-token softmax cross-entropy for language models (closed-form backward).

Logits [B, T, V], labels [B, T] int32 class ids; the loss is the mean over all B·T tokens of
−log softmax(z)[y], in nats (÷ ln 2 for bits per token). ∂L/∂z = (p − onehot(y)) / (B·T).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Loss, Shape
from hloforge.losses.ce import log_softmax, one_hot


@attrs.frozen
class TokenCrossEntropy(Loss):
    name = "tokenCrossEntropy"

    def check(self, out_shape: Shape) -> None:
        if len(out_shape) != 2:
            raise UnsupportedSpec(f"tokenCrossEntropy takes per-token logits [T, vocab], got {list(out_shape)}")

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (out_shape[0],), "i32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        bsz, t, v = logits.shape
        n = bsz * t
        yf = b.reshape(y, (n,))

        fwd_values: dict[str, Value] = {}  # the backward reuses the forward's log-softmax and one-hots

        def fwd(z: Value) -> list[Value]:
            lp = log_softmax(b, b.reshape(z, (n, v)))
            t = one_hot(b, yf, v, z.dtype)
            fwd_values.update(lp=lp, t=t)
            return [b.sum(b.negate(t * lp)) / float(n)]

        def bwd(b: Builder, g: Value) -> list[Value]:
            p = b.exp(fwd_values["lp"])
            d = (p - fwd_values["t"]) * b.broadcast_to(g / float(n), (n, v))
            return [b.reshape(d, (bsz, t, v))]

        return b.custom_vjp(fwd, bwd, logits)[0]

    def reference(self, logits: Any, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        lp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(lp, y[..., None], axis=-1))

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return rng.integers(0, out_shape[1], (batch, out_shape[0])).astype(np.int32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (4, 5))]


@hookimpl
def hloforge_losses() -> list[type]:
    return [TokenCrossEntropy]
