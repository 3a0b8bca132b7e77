"""The attention cores: dense SDPA, FlashAttention, and dense SDPA's backward forms.

Q, K, V are [B, H, N, dh] (heads split out of the tokens' D by the layer, plugins/layers/attention.py).

* Dense SDPA materialises the [B, H, N, N] scores: softmax(Q·Kᵀ/√dh + mask)·V, differentiated
  by the ordinary VJP rules (the row max is gradient-free, as in log-softmax).
* FlashAttention is a tiled online softmax with a closed-form backward (see `flash_forward`,
  `flash_backward`); the block size is a divisor of N, at most 128 (`flash_block`).
* Dense SDPA's backward is a lowering strategy ("sdpaGrad", core/strategy.py): "autodiff" (the
  VJP rules of the ops above); "closed": FlashAttention's kernel with the whole sequence as its
  one key block — the same [B, H, N, N] scores, the same math, but the closed-form backward that
  recomputes P from the saved lse; or "untransposed": that closed form with each of its six
  batched products in the one form XLA's CPU runs on YNNPACK, [.., M, K]·[.., K, N] (see
  `sdpa_untransposed`).
"""

from __future__ import annotations

import math

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.strategy import StrategyKind

MASK = -1e30  # the causal mask's score: exp(MASK − m) is exactly 0 in f32 and f64
SDPA_GRAD = StrategyKind("sdpaGrad", ("autodiff", "closed", "untransposed"),
                         "dense attention's backward: the ops' VJP rules, or FlashAttention's closed form "
                         "with the whole sequence as one key block, with its products as they come or "
                         "all untransposed (see attention.py)")


def flash_block(n: int, block: int = 0) -> int:
    """The key-block size: `block` if given (it must divide n and be ≤ 128), else the largest divisor of n ≤ 128."""
    if block:
        if block <= 0 or block > 128 or n % block:
            raise UnsupportedSpec(f"flash block {block} must be a divisor of the sequence length {n}, at most 128")
        return block
    return max(d for d in range(1, min(n, 128) + 1) if n % d == 0)


# ------------------------------------------------------------------ the attention cores (emitted)
def _scores(b: Builder, q: Value, k: Value, scale: float) -> Value:
    """Q·Kᵀ·scale: [B, H, Nq, dh] × [B, H, Nk, dh] → [B, H, Nq, Nk]."""
    return b.dot_general(q, k, ([3], [3]), ([0, 1], [0, 1])) * scale


def _causal(b: Builder, s: Value, key_offset: Value | None = None) -> Value:
    """Mask scores [B, H, Nq, Nk] where key index (+ offset) > query index."""
    nq, nk = s.shape[2], s.shape[3]
    row = b.iota((nq, nk), 0)
    col = b.iota((nq, nk), 1)
    if key_offset is not None:
        col = col + b.broadcast_in_dim(key_offset, (nq, nk), [])
    keep = b.broadcast_in_dim(b.compare(col, row, "LE"), s.shape, [2, 3])
    return b.select(keep, s, b.full(MASK, s.shape, s.dtype))


def sdpa_dense(b: Builder, q: Value, k: Value, v: Value, causal: bool) -> Value:
    """softmax(Q·Kᵀ/√dh + mask)·V with the whole [B, H, N, N] score matrix; derived backward."""
    scale = 1.0 / math.sqrt(q.shape[3])
    s = _scores(b, q, k, scale)
    if causal:
        s = _causal(b, s)
    m = b.stop_gradient(b.reduce(s, [3], "max"))
    e = b.exp(s - b.broadcast_in_dim(m, s.shape, [0, 1, 2]))
    p = e / b.broadcast_in_dim(b.sum(e, [3]), s.shape, [0, 1, 2])
    return b.dot_general(p, v, ([3], [2]), ([0, 1], [0, 1]))


def _i32(b: Builder, v: int) -> Value:
    return b.full(v, (), "i32")


def flash_forward(b: Builder, q: Value, k: Value, v: Value, causal: bool, bk: int) -> tuple[Value, Value]:
    """(O [B, H, N, dh], lse [B, H, N]) by the online softmax over N/bk key blocks."""
    bsz, h, n, dh = q.shape
    scale = 1.0 / math.sqrt(dh)
    row = (bsz, h, n)

    def cond(c: Builder, a: list[Value]) -> Value:
        return c.compare(a[0], _i32(c, n // bk), "LT")

    def body(c: Builder, a: list[Value]) -> list[Value]:
        i, acc, m, den, q, k, v = a
        start = i * _i32(c, bk)
        z = _i32(c, 0)
        kb = c.dynamic_slice(k, [z, z, start, z], (bsz, h, bk, dh))
        vb = c.dynamic_slice(v, [z, z, start, z], (bsz, h, bk, dh))
        s = _scores(c, q, kb, scale)
        if causal:
            s = _causal(c, s, start)
        m_new = c.maximum(m, c.reduce(s, [3], "max"))
        p = c.exp(s - c.broadcast_in_dim(m_new, s.shape, [0, 1, 2]))
        alpha = c.exp(m - m_new)
        den_new = den * alpha + c.sum(p, [3])
        pv = c.dot_general(p, vb, ([3], [2]), ([0, 1], [0, 1]))
        acc_new = acc * c.broadcast_in_dim(alpha, acc.shape, [0, 1, 2]) + pv
        return [i + _i32(c, 1), acc_new, m_new, den_new, q, k, v]

    init = [_i32(b, 0), b.full(0.0, q.shape, q.dtype), b.full(-math.inf, row, q.dtype), b.full(0.0, row, q.dtype),
            q, k, v]
    _, acc, m, den, *_ = b.while_(init, cond, body)
    o = acc / b.broadcast_in_dim(den, q.shape, [0, 1, 2])
    return o, m + b.log(den)


def flash_backward(b: Builder, q: Value, k: Value, v: Value, o: Value, lse: Value, do: Value, causal: bool,
                   bk: int) -> tuple[Value, Value, Value]:
    """(dQ, dK, dV) by recomputing each key block's probabilities from lse (no [N, N] matrix)."""
    bsz, h, n, dh = q.shape
    scale = 1.0 / math.sqrt(dh)
    dsum = b.sum(do * o, [3])  # D = rowsum(dO ⊙ O) [B, H, N]

    def cond(c: Builder, a: list[Value]) -> Value:
        return c.compare(a[0], _i32(c, n // bk), "LT")

    def body(c: Builder, a: list[Value]) -> list[Value]:
        i, dq, dk, dv, q, k, v, do, lse, dsum = a
        start = i * _i32(c, bk)
        z = _i32(c, 0)
        at = [z, z, start, z]
        kb = c.dynamic_slice(k, at, (bsz, h, bk, dh))
        vb = c.dynamic_slice(v, at, (bsz, h, bk, dh))
        s = _scores(c, q, kb, scale)
        if causal:
            s = _causal(c, s, start)
        p = c.exp(s - c.broadcast_in_dim(lse, s.shape, [0, 1, 2]))  # [B, H, N, bk]
        dvb = c.dot_general(p, do, ([2], [2]), ([0, 1], [0, 1]))  # Pᵀ·dO  [B, H, bk, dh]
        dp = c.dot_general(do, vb, ([3], [3]), ([0, 1], [0, 1]))  # dO·Vᵀ [B, H, N, bk]
        ds = p * (dp - c.broadcast_in_dim(dsum, s.shape, [0, 1, 2])) * scale
        dq = dq + c.dot_general(ds, kb, ([3], [2]), ([0, 1], [0, 1]))
        dkb = c.dot_general(ds, q, ([2], [2]), ([0, 1], [0, 1]))  # dSᵀ·Q [B, H, bk, dh]
        dk = c.dynamic_update_slice(dk, dkb, at)
        dv = c.dynamic_update_slice(dv, dvb, at)
        return [i + _i32(c, 1), dq, dk, dv, q, k, v, do, lse, dsum]

    zeros = b.full(0.0, q.shape, q.dtype)
    init = [_i32(b, 0), zeros, zeros, zeros, q, k, v, do, lse, dsum]
    _, dq, dk, dv, *_ = b.while_(init, cond, body)
    return dq, dk, dv


def flash_attention(b: Builder, q: Value, k: Value, v: Value, causal: bool, block: int = 0) -> Value:
    """FlashAttention with its recompute backward as the custom VJP; lse is saved, not returned."""
    return _flash(b, q, k, v, causal, flash_block(q.shape[2], block))


def _flash(b: Builder, q: Value, k: Value, v: Value, causal: bool, bk: int) -> Value:
    saved: dict[str, Value] = {}

    def fwd(q: Value, k: Value, v: Value) -> list[Value]:
        o, lse = flash_forward(b, q, k, v, causal, bk)
        saved.update(o=o, lse=lse)
        return [o]

    def bwd(b: Builder, do: Value) -> list[Value]:
        return list(flash_backward(b, q, k, v, saved["o"], saved["lse"], do, causal, bk))

    return b.custom_vjp(fwd, bwd, q, k, v)[0]


def _untransposed_product(b: Builder, x: Value, y: Value) -> Value:
    """[B, H, M, K]·[B, H, K, N] → [B, H, M, N]."""
    return b.dot_general(x, y, ([3], [2]), ([0, 1], [0, 1]))


def _swapped(b: Builder, x: Value) -> Value:
    """x with its last two axes swapped, materialised: unfenced, XLA folds the transpose back into
    the product that reads it, which is then a transposed one again."""
    return b.optimization_barrier(b.transpose(x, [0, 1, 3, 2]))


def sdpa_untransposed(b: Builder, q: Value, k: Value, v: Value, causal: bool) -> Value:
    """Dense SDPA with the closed-form backward, every batched product [.., M, K]·[.., K, N].

    XLA's CPU gives YNNPACK a batched product in that form (and Q·Kᵀ's), but runs one contracted
    over its operands' leading axis (Pᵀ·dO, dSᵀ·Q) on Eigen at under half the speed. So Kᵀ, Vᵀ,
    (Q/√dh)ᵀ and dOᵀ are laid out by copies of [B, H, N, dh] (the head split's own copies are
    transposes already), dK and dV come out as dKᵀ = (Q/√dh)ᵀ·dS and dVᵀ = dOᵀ·P, and the scale is
    on Q ([.., dh]) instead of on S ([.., N]). The math is `_flash` with one key block."""
    scale = 1.0 / math.sqrt(q.shape[3])
    row = [0, 1, 2]
    saved: dict[str, Value] = {}

    def fwd(q: Value, k: Value, v: Value) -> list[Value]:
        qs, kt = q * scale, _swapped(b, k)
        s = _untransposed_product(b, qs, kt)
        if causal:
            s = _causal(b, s)
        m = b.reduce(s, [3], "max")
        e = b.exp(s - b.broadcast_in_dim(m, s.shape, row))
        den = b.sum(e, [3])
        o = _untransposed_product(b, e, v) / b.broadcast_in_dim(den, q.shape, row)
        saved.update(qs=qs, kt=kt, o=o, lse=m + b.log(den))
        return [o]

    def bwd(b: Builder, do: Value) -> list[Value]:
        qs, kt, o, lse = saved["qs"], saved["kt"], saved["o"], saved["lse"]
        s = _untransposed_product(b, qs, kt)
        if causal:
            s = _causal(b, s)
        p = b.exp(s - b.broadcast_in_dim(lse, s.shape, row))
        dp = _untransposed_product(b, do, _swapped(b, v))
        ds = p * (dp - b.broadcast_in_dim(b.sum(do * o, [3]), s.shape, row))  # dS·√dh
        dq = _untransposed_product(b, ds, k) * scale
        # fenced too: XLA would rewrite transpose(A·B) as Bᵀ·Aᵀ, a product contracted over leading axes
        dkt = b.optimization_barrier(_untransposed_product(b, _swapped(b, qs), ds))
        dvt = b.optimization_barrier(_untransposed_product(b, _swapped(b, do), p))
        return [dq, b.transpose(dkt, [0, 1, 3, 2]), b.transpose(dvt, [0, 1, 3, 2])]

    return b.custom_vjp(fwd, bwd, q, k, v)[0]


def attention_core(b: Builder, q: Value, k: Value, v: Value, attention: str, causal: bool, block: int = 0) -> Value:
    if attention == "flash":
        return flash_attention(b, q, k, v, causal, block)
    form = strategy.chosen("sdpaGrad", b.target)
    if form == "closed":  # the whole sequence as the one key block
        return _flash(b, q, k, v, causal, q.shape[2])
    if form == "untransposed":
        return sdpa_untransposed(b, q, k, v, causal)
    return sdpa_dense(b, q, k, v, causal)
