"""The normaliser every norm layer emits (batchNorm, instanceNorm, layerNorm, convBn, …) and its forms.

    x̂ = (x − μ)·σ⁻¹,  σ⁻¹ = rsqrt(var + ε),  y = γ·x̂ + β          (M = elements per statistic)
    ∂β = Σ ḡ,  ∂γ = Σ ḡ·x̂,  ∂x = σ⁻¹/M · (M·ĝ − Σ_R ĝ − x̂·Σ_R ĝ·x̂),  ĝ = γ·ḡ

Batch norm takes the form the strategy kind "bnReduce" picks for the module's target:

- "twoPass": the forward reads x for Σx, again for Σ(x − μ)², and the backward reduces Σḡ, Σḡ·x̂
  (for ∂β, ∂γ) and Σĝ, Σĝ·x̂ (for ∂x) as four sums.
- "blocked": two-pass, each sum taken in stages (`Builder.blocked_sum`): the minor reduced axis alone
  first while it is at most 32 long (and more axes are reduced), then within blocks of at most 32
  along every reduced axis, then across the blocks. XLA's CPU compiler rewrites a reduction with an
  axis longer than 32 into a reduce-window its own loop emitter runs; one whose axes are all short
  it hands to YNNPACK's reduction, 2–4× faster, unless an elementwise producer is fused into it.
- "fused": one variadic reduce of Σd and Σd² with d = x − K, K each statistic's first element of
  x (a shift: the textbook E[x²] − E[x]² cancels catastrophically once |μ| ≫ σ, while
  Σd² − (Σd)²/m about a sample of the data loses only what |K − μ| ~ σ costs, and a constant
  channel gives exactly 0); and one variadic reduce of Σḡ, Σḡ·x̂, from which Σĝ = γ·Σḡ and
  Σĝ·x̂ = γ·Σḡ·x̂. Sync BN pools each replica's mean, then its sum of squares about the pooled
  mean (M2_r + m·(μ_r − μ)², Chan's combination): two small all-reduces, as the two-pass form.

Layer norm over the last axis (layerNormLast) takes its sums as the strategy kind "lnSums" picks:
"reduce", or "dot", each sum a dot product with a vector of ones. XLA's CPU compiler sums a row of
a fused product (Σĝ·x̂ over D) one element at a time; a dot with ones it emits as a vectorised loop
(vit-cifar's step: benchmarks/NOTES.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.strategy import StrategyKind

# XLA takes two passes (it runs a variadic reduce on one thread), blocked where an axis is over 32;
# which layers gain otherwise is the autotuner's call (measured: benchmarks/NOTES.md).
BN_REDUCE = StrategyKind("bnReduce", ("twoPass", "fused", "blocked"),
                         "batch-norm statistics and backward sums in two passes each, one variadic reduce "
                         "each, or two passes summed in stages (a short minor axis alone, then blocks of at most 32, "
                         "first; see norm.py)")
LN_SUMS = StrategyKind("lnSums", ("reduce", "dot"),
                       "layer norm's sums (its statistics and ∂x's over the normalised axis, ∂γ and ∂β's over "
                       "the others) as reduces, or as dot products with a vector of ones (see norm.py)")


def normalize(b: Builder, x: Value, gamma: Value, beta: Value, reduce: Sequence[int], axis: int,
              eps: float, replicas: int = 1, form: str = "twoPass", processes: int = 1,
              sums: str = "reduce") -> tuple[Value, Value, Value]:
    """(y, mean, biased var) with statistics over `reduce` and γ/β along `axis`; y carries the
    closed-form backward, mean and var are reported values (no gradient flows through them).

    `replicas` > 1 (sync BN in a data-parallel step): the statistics are over `reduce` of every
    replica's x, M = replicas·m. The forward all-reduces Σx, then Σ(x − μ)²; the backward the two
    sums Σĝ and Σĝ·x̂. Each replica seeds its own loss, so its ĝ is replicas × the cotangent of the
    mean loss — the same factor on every replica, which the gradients' replica mean takes out.
    `processes` > 1 (sync BN across the processes of a multi-process step): the same, over every
    process's replicas; after the in-graph all-reduce the sums go through `Builder.process_sum`.

    `form`: a bnReduce choice, the module docstring's forms ("fused": batch norm only); `sums`, an
    lnSums choice, how a two-pass form takes its sums."""
    shape, rank = x.shape, x.type.rank
    reduce = sorted(reduce)
    kept = [d for d in range(rank) if d not in reduce]
    others = [d for d in range(rank) if d != axis]
    if form not in BN_REDUCE.choices:
        raise UnsupportedSpec(f"normalize form {form!r}: expected one of {', '.join(BN_REDUCE.choices)}")
    if sums not in LN_SUMS.choices:
        raise UnsupportedSpec(f"normalize sums {sums!r}: expected one of {', '.join(LN_SUMS.choices)}")
    fused = form == "fused"
    if fused and others != reduce:
        raise UnsupportedSpec(f"the fused normaliser is batch norm's: statistics over every axis but {axis}, "
                              f"got {reduce}")
    pool = replicas * processes  # the replicas whose batches the statistics cover
    m = pool
    for d in reduce:
        m *= shape[d]
    saved: dict[str, Value] = {}
    group = [list(range(replicas))]

    def total_of(b: Builder, v: Value, dims: Sequence[int]) -> Value:
        if sums == "dot":  # the ones on the side that keeps the product's operands untransposed
            ones, own = b.full(1.0, [shape[d] for d in dims], v.dtype), list(range(len(dims)))
            leading = list(dims) == own
            return b.dot_general(ones, v, (own, dims)) if leading else b.dot_general(v, ones, (dims, own))
        return b.blocked_sum(v, dims) if form == "blocked" else b.sum(v, dims)

    def pooled(*sums: Value) -> list[Value]:
        local = b.all_reduce(sums, group) if replicas > 1 else list(sums)
        return b.process_sum(local) if processes > 1 else local

    def along(v: Value) -> Value:
        return b.broadcast_in_dim(v, shape, [axis])

    def per_stat(v: Value) -> Value:
        return b.broadcast_in_dim(v, shape, kept)

    def fused_stats(x: Value) -> tuple[Value, Value]:
        local = m // pool
        shift = b.reshape(b.slice(x, [0] * rank, [1 if d in reduce else n for d, n in enumerate(shape)]),
                          [shape[d] for d in kept])
        d = x - per_stat(shift)
        s1, s2 = b.reduce_sums([d, d * d], reduce)
        # the replica's own mean and sum of squares about it, then Chan's pooling (a no-op alone)
        local_mean = shift + s1 / float(local)
        zero = b.full(0.0, s2.shape, s2.dtype)
        local_m2 = b.maximum(s2 - s1 * s1 / float(local), zero)
        (means,) = pooled(local_mean)
        mean = means / float(pool)
        apart = local_mean - mean
        (m2,) = pooled(local_m2 + apart * apart * float(local))
        return mean, m2 / float(m)

    def fwd(x: Value, gamma: Value, beta: Value) -> list[Value]:
        if fused:
            mean, var = fused_stats(x)
            istd = b.rsqrt(var + eps)
            xhat = (x - per_stat(mean)) * per_stat(istd)
            saved.update(mean=mean, var=var, istd=istd, xhat=xhat)
            return [xhat * along(gamma) + along(beta)]
        (total,) = pooled(total_of(b, x, reduce))
        mean = total / float(m)
        xc = x - per_stat(mean)
        (squares,) = pooled(total_of(b, xc * xc, reduce))
        var = squares / float(m)
        istd = b.rsqrt(var + eps)
        xhat = xc * per_stat(istd)
        saved.update(mean=mean, var=var, istd=istd, xhat=xhat)
        return [xhat * along(gamma) + along(beta)]

    def bwd_fused(b: Builder, g: Value) -> list[Value]:
        # batch norm (γ/β along the one axis not reduced): ∂β, ∂γ are the sums Σḡ, Σḡ·x̂ over the
        # statistics' own axes, so one variadic reduce gives all four sums
        xhat, istd = saved["xhat"], saved["istd"]
        d_beta, d_gamma = b.reduce_sums([g, g * xhat], reduce)
        s1, s2 = pooled(d_beta * gamma, d_gamma * gamma)
        gh = g * along(gamma)
        dx = per_stat(istd) * (gh - per_stat(s1 / float(m)) - xhat * per_stat(s2 / float(m)))
        return [dx, d_gamma, d_beta]

    def bwd(b: Builder, g: Value) -> list[Value]:
        if fused:
            return bwd_fused(b, g)
        xhat, istd = saved["xhat"], saved["istd"]
        d_beta = total_of(b, g, others)
        d_gamma = total_of(b, g * xhat, others)
        gh = g * along(gamma)
        if others == reduce:  # batch norm: Σĝ = γ·Σḡ and Σĝ·x̂ = γ·Σḡ·x̂, two full passes fewer
            s1, s2 = pooled(d_beta * gamma, d_gamma * gamma)
        else:
            s1, s2 = pooled(total_of(b, gh, reduce), total_of(b, gh * xhat, reduce))
        dx = per_stat(istd / float(m)) * (gh * float(m) - per_stat(s1) - xhat * per_stat(s2))
        return [dx, d_gamma, d_beta]

    (y,) = b.custom_vjp(fwd, bwd, x, gamma, beta)
    return y, b.stop_gradient(saved["mean"]), b.stop_gradient(saved["var"])
