"""Attention: multi-head self-attention (`mhsa`) with dense SDPA or FlashAttention, and RoPE (`rope`).

Tokens are [N, D] per example ([B, N, D] in the builder); heads split D into H × dh and the
attention core works on [B, H, N, dh].

* Dense SDPA materialises the [B, H, N, N] scores: softmax(Q·Kᵀ/√dh + mask)·V, differentiated
  by the ordinary VJP rules (the row max is gradient-free, as in log-softmax).
* FlashAttention (seed 001) is a tiled online softmax: a `stablehlo.while` over N/bk key blocks
  that keeps only one [B, H, N, bk] score block live, carrying the running row max m, the
  running denominator l and the unnormalised output; O = acc/l and the per-row log-sum-exp
  lse = m + log l is saved. Its backward is a closed form (a `custom_vjp`), a second while over
  key blocks that recomputes P_ij = exp(S_ij − lse) and uses D = rowsum(dO ⊙ O): dQ accumulates
  over all blocks, dK and dV are written once per (disjoint) key block by dynamic_update_slice.
  The block size is a divisor of N, at most 128 (`block=0`: the largest such divisor).
* Dense SDPA's backward is a lowering strategy ("sdpaGrad"): the attention cores and their forms
  are hloforge/lowering/attention.py.
* The causal mask puts a large finite negative on the scores above the diagonal (never −inf, so
  no row can turn into NaN); each row keeps its diagonal, so every first key block has a live key.
* RoPE (rotate-half form): x ⊙ cos + rotate_half(x) ⊙ sin with rotate_half([a, b]) = [−b, a],
  cos/sin tables [N, dh] built in-graph from iota (θ_i = base^(−2i/dh), no giant constant). It
  is a rotation, so its VJP is the rotation by −θ: the same op with sin negated (a custom_vjp).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
from hloforge.lowering.attention import SDPA_GRAD, attention_core, flash_block
from hloforge.lowering.dense import TOKEN_PRODUCT, token_product

ATTENTIONS = ("dense", "flash")


# ------------------------------------------------------------------ RoPE (emitted)
def rope_tables(b: Builder, n: int, dh: int, base: float) -> tuple[Value, Value]:
    """cos, sin [n, dh]: freqs[m, i] = m · base^(−2i/dh) for i < dh/2, tiled twice along dh."""
    half = dh // 2
    pos = b.iota((n, half), 0, b.dtype)
    idx = b.iota((n, half), 1, b.dtype)
    inv = b.exp(idx * (-2.0 * math.log(base) / dh))
    f = b.concatenate([pos * inv, pos * inv], 1)
    return b.stop_gradient(b.cosine(f)), b.stop_gradient(b.sine(f))


def _rotate(b: Builder, x: Value, cos: Value, sin: Value) -> Value:
    """x ⊙ cos + rotate_half(x) ⊙ sin on [..., N, dh] with [N, dh] tables."""
    r = x.type.rank
    half = x.shape[-1] // 2
    lo = [0] * r
    x1 = b.slice(x, lo, [*x.shape[:-1], half])
    x2 = b.slice(x, [*lo[:-1], half], list(x.shape))
    rot = b.concatenate([b.negate(x2), x1], r - 1)
    return x * b.broadcast_in_dim(cos, x.shape, [r - 2, r - 1]) + rot * b.broadcast_in_dim(sin, x.shape, [r - 2, r - 1])


def apply_rope(b: Builder, x: Value, base: float = 10000.0) -> Value:
    """RoPE on [..., N, dh]; the VJP is the rotation by −θ (sin negated)."""
    cos, sin = rope_tables(b, x.shape[-2], x.shape[-1], base)

    def fwd(x: Value) -> list[Value]:
        return [_rotate(b, x, cos, sin)]

    def bwd(b: Builder, g: Value) -> list[Value]:
        return [_rotate(b, g, cos, b.negate(sin))]

    return b.custom_vjp(fwd, bwd, x)[0]


# ------------------------------------------------------------------ the references (jax.numpy)
def ref_rope(x: Any, base: float) -> Any:
    import jax.numpy as jnp

    n, dh = x.shape[-2], x.shape[-1]
    theta = base ** (-jnp.arange(0, dh // 2, dtype=x.dtype) * 2.0 / dh)
    ang = jnp.arange(n, dtype=x.dtype)[:, None] * theta[None, :]
    c, s = jnp.cos(ang), jnp.sin(ang)
    a, bb = x[..., : dh // 2], x[..., dh // 2:]
    return jnp.concatenate([a * c - bb * s, bb * c + a * s], axis=-1)


def ref_attention(q: Any, k: Any, v: Any, causal: bool) -> Any:
    import jax
    import jax.numpy as jnp

    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


# ------------------------------------------------------------------ layers
def _tokens(in_shape: Shape, kind: str) -> tuple[int, int]:
    if len(in_shape) != 2:
        raise UnsupportedSpec(f"{kind} takes tokens [N, D], got {list(in_shape)}")
    return in_shape[0], in_shape[1]


@attrs.frozen
class MultiHeadSelfAttention(Layer):
    """Self-attention on [N, D]: fused qkv projection [D, 3D] (+ bias), `heads` heads, optional RoPE on
    q and k, dense SDPA or FlashAttention (`attention`), optional causal mask, output projection [D, D]."""

    kind = "mhsa"
    strategy_kinds = ("sdpaGrad", TOKEN_PRODUCT.name)
    heads: int
    attention: str = "dense"
    causal: bool = False
    rope: bool = False
    rope_base: float = 10000.0
    block: int = 0  # flash key-block size; 0: the largest divisor of N that is at most 128

    def out_shape(self, in_shape: Shape) -> Shape:
        n, d = _tokens(in_shape, self.kind)
        if self.attention not in ATTENTIONS:
            raise UnsupportedSpec(f"attention must be one of {list(ATTENTIONS)}, got {self.attention!r}")
        if self.heads <= 0 or d % self.heads:
            raise UnsupportedSpec(f"heads={self.heads} must divide the model width {d}")
        if self.rope and (d // self.heads) % 2:
            raise UnsupportedSpec(f"rope needs an even head width, got {d // self.heads}")
        if self.rope_base <= 1.0:
            raise UnsupportedSpec(f"rope_base must exceed 1, got {self.rope_base}")
        if self.attention == "flash":
            flash_block(n, self.block)
        elif self.block:
            raise UnsupportedSpec("block is a FlashAttention option; dense attention takes none")
        return in_shape

    def strategies_for(self, in_shape: Shape) -> tuple[str, ...]:
        return self.strategy_kinds if self.attention == "dense" else (TOKEN_PRODUCT.name,)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        d = in_shape[1]
        return (ParamSlot("qkv.w", (d, 3 * d), "glorot", True), ParamSlot("qkv.b", (3 * d,), "zeros", False),
                ParamSlot("proj.w", (d, d), "glorot", True), ParamSlot("proj.b", (d,), "zeros", False))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        bsz, n, d = x.shape
        qkv = token_product(b, x, params["qkv.w"]) + b.broadcast_to(params["qkv.b"], (bsz, n, 3 * d))
        q, k, v = _split_heads(b, qkv, self.heads)
        if self.rope:
            q, k = apply_rope(b, q, self.rope_base), apply_rope(b, k, self.rope_base)
        o = attention_core(b, q, k, v, self.attention, self.causal, self.block)
        o = b.reshape(b.transpose(o, [0, 2, 1, 3]), (bsz, n, d))
        return token_product(b, o, params["proj.w"]) + b.broadcast_to(params["proj.b"], (bsz, n, d))

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        bsz, n, d = x.shape
        h, dh = self.heads, d // self.heads
        qkv = x @ params["qkv.w"] + params["qkv.b"]
        q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(bsz, n, h, dh).transpose(0, 2, 1, 3) for i in range(3))
        if self.rope:
            q, k = ref_rope(q, self.rope_base), ref_rope(k, self.rope_base)
        o = ref_attention(q, k, v, self.causal).transpose(0, 2, 1, 3).reshape(bsz, n, d)
        return o @ params["proj.w"] + params["proj.b"]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(2, causal=True, rope=True), (4, 4)),
                (cls(1, attention="flash", causal=True, block=2), (4, 2)),
                (cls(2, attention="flash", rope=True), (4, 4))]


def _split_heads(b: Builder, qkv: Value, heads: int) -> list[Value]:
    """q, k, v [B, H, N, dh] from qkv [B, N, 3·D]: slices of the last axis, each to heads (XLA:
    vit-cifar's step 181–183 against 191–192 ms with one 5-D transpose of the whole qkv; IREE the
    same either way). The backward lays the three cotangents side by side with one concatenate;
    autodiff's (each slice's transpose a zero pad to 3·D, the three added) wrote every element
    three times."""
    bsz, n, d3 = qkv.shape
    d = d3 // 3

    def split(qkv: Value) -> list[Value]:
        return [b.transpose(b.reshape(b.slice(qkv, [0, 0, i * d], [bsz, n, (i + 1) * d]), (bsz, n, heads, d // heads)),
                            [0, 2, 1, 3]) for i in range(3)]

    def join(b: Builder, *cts: Value) -> list[Value]:
        return [b.concatenate([b.reshape(b.transpose(ct, [0, 2, 1, 3]), (bsz, n, d)) for ct in cts], 2)]

    return b.custom_vjp(split, join, qkv)


@attrs.frozen
class Rope(Layer):
    """RoPE alone on tokens [N, D] split into `heads` heads of width D/heads (no parameters)."""

    kind = "rope"
    heads: int = 1
    base: float = 10000.0

    def out_shape(self, in_shape: Shape) -> Shape:
        n, d = _tokens(in_shape, self.kind)
        if self.heads <= 0 or d % self.heads or (d // self.heads) % 2:
            raise UnsupportedSpec(f"heads={self.heads} must split the width {d} into even head widths")
        if self.base <= 1.0:
            raise UnsupportedSpec(f"base must exceed 1, got {self.base}")
        return in_shape

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        bsz, n, d = x.shape
        h = self.heads
        xh = b.transpose(b.reshape(x, (bsz, n, h, d // h)), [0, 2, 1, 3])
        y = apply_rope(b, xh, self.base)
        return b.reshape(b.transpose(y, [0, 2, 1, 3]), (bsz, n, d))

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        bsz, n, d = x.shape
        h = self.heads
        xh = x.reshape(bsz, n, h, d // h).transpose(0, 2, 1, 3)
        return ref_rope(xh, self.base).transpose(0, 2, 1, 3).reshape(bsz, n, d)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (5, 4)), (cls(heads=2, base=100.0), (3, 8))]


@hookimpl
def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
    return [SDPA_GRAD]


@hookimpl
def hloforge_layers() -> list[type]:
    return [MultiHeadSelfAttention, Rope]
