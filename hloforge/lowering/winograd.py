"""A 3×3 stride-1 NHWC convolution by Winograd's minimal filtering F(2×2, 3×3) (Lavin & Gray, 2016).

Each 2×2 tile of the output comes from a 4×4 tile of the padded input (tiles overlap by two
pixels): V = Bᵀ d B per input tile and U = G w Gᵀ per kernel, then for each of the 16 positions
(ξ, ν) of the transformed tile one GEMM M[ξν] = V[ξν]·U[ξν] over [tiles, C]·[C, O], and the
output tile Aᵀ M A. That is 16 multiplies per 2×2 outputs where the direct conv does 36: the
GEMMs are 2.25× fewer flops than the im2col one, for three linear transforms that read and write
memory.

Each transform is one small dense matrix product over the 16 (or 9, or 4) positions of a tile,
Bᵀ⊗Bᵀ, G⊗G and Aᵀ⊗Aᵀ, against the tiles laid out position-major ([16, tiles·C]): a handful of ops
per conv, which XLA compiles in about the time of a direct conv's, where the transforms written as
sums of strided slices cost it one kernel per position. The 4×4 input tiles are four shifted block
views of the image split into its 2×2 pixel phases, so gathering them is one concatenate.

The backward is the transposed chain: ḡ through the output transform's transposed matrix (M̄,
shared by both gradients), then per position two GEMMs, V̄ = M̄·Uᵀ and Ū = Vᵀ·M̄ (∂x and ∂w in the
transformed domain, with the same 2.25× saving), and back through the other two transforms'
transposed matrices; autodiff's adjoint of the tile gather overlap-adds the tiles into the image.
∂U reads V, which a large image's conv computes again in the backward rather than holding it from the
forward through the whole backward (`RECOMPUTED_MIN_BYTES`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hloforge.core.hlo import Builder, Value

# The transformed image V is 4× the image, and the backward's ∂U reads it: held from the forward, the
# V of resnet18-cifar's 64-wide convs (32 MiB each at batch 32) were 128 of the step's 417 MiB of
# scratch at the forward/backward turn. From this size on V is computed again in the backward
# (`_products_recomputing_v`), which cost that step ~4% (benchmarks/NOTES.md).
RECOMPUTED_MIN_BYTES = 32 << 20

# F(2, 3)'s matrices, row by row: transformed index × tap.
B_T = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))  # input tile (4) → transformed (4)
G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))  # kernel (3) → transformed (4)
A_T = ((1, 1, 1, 0), (0, 1, -1, -1))  # transformed (4) → output tile (2)


def apply(b: Builder, matrix: np.ndarray, x: Value) -> Value:
    """matrix [R, K] · x [K, M], differentiated as matrixᵀ · ḡ: autodiff's rule would also emit the
    constant matrix's (unused) gradient, a GEMM as large as the transform."""

    def fwd(x: Value) -> list[Value]:
        return [b.dot_general(b.constant(matrix), x, ([1], [0]))]

    def bwd(b: Builder, g: Value) -> list[Value]:
        return [b.dot_general(b.constant(np.ascontiguousarray(matrix.T)), g, ([1], [0]))]

    return b.custom_vjp(fwd, bwd, x)[0]


def input_matrix() -> np.ndarray:
    """Bᵀ⊗Bᵀ [16, 16]: rows ξν, columns in `input_tiles`' order (p, p', q, q'), where tap a = 2p + q
    along H (block offset p, pixel phase q) and a' = 2p' + q' along W."""
    by_block = np.asarray(B_T, np.float32).reshape(4, 2, 2)  # [ξ, p, q]
    product: np.ndarray = np.einsum("xpq,yst->xypsqt", by_block, by_block)
    return product.reshape(16, 16)


def input_tiles(b: Builder, xp: Value) -> Value:
    """The 4×4 tiles at stride 2 of the padded NHWC image xp [N, 2·TH + 2, 2·TW + 2, C], as
    [16, N·TH·TW·C] with the tile's 16 pixels major, ordered (p, p', q, q') as `input_matrix` reads
    them: the pixel at tile row 2p + q of tile i is xp's row 2(i + p) + q, phase q of block i + p."""
    n, hp, wp, c = xp.shape
    th, tw = hp // 2 - 1, wp // 2 - 1
    blocks = b.reshape(xp, (n, th + 1, 2, tw + 1, 2, c))
    shifted = [b.reshape(b.transpose(b.slice(blocks, [0, p, 0, p_, 0, 0], [n, p + th, 2, p_ + tw, 2, c]),
                                     (2, 4, 0, 1, 3, 5)), (1, 2, 2, n, th, tw, c))
               for p in range(2) for p_ in range(2)]  # block offsets p (along H), p' (along W)
    return b.reshape(b.concatenate(shifted, 0), (16, n * th * tw * c))


def kernel_transform(b: Builder, w: Value) -> Value:
    """U [16, C, O]: G w Gᵀ per channel pair of the HWIO kernel w [3, 3, C, O], ξν major."""
    c, o = w.shape[2], w.shape[3]
    g = np.kron(np.asarray(G, np.float32), np.asarray(G, np.float32))  # [16, 9]
    return b.reshape(apply(b, g, b.reshape(w, (9, c * o))), (16, c, o))


def output_tiles(b: Builder, m: Value, n: int, th: int, tw: int) -> Value:
    """The NHWC output [N, 2·TH, 2·TW, O] of the products m [16, N·TH·TW, O] (ξν major): Aᵀ M A per
    tile, its 2×2 pixels woven back into the image."""
    o = m.shape[2]
    a = np.kron(np.asarray(A_T, np.float32), np.asarray(A_T, np.float32))  # [4, 16]
    y = apply(b, a, b.reshape(m, (16, n * th * tw * o)))
    y = b.transpose(b.reshape(y, (2, 2, n, th, tw, o)), (2, 3, 0, 4, 1, 5))
    return b.reshape(y, (n, 2 * th, 2 * tw, o))


def _products_recomputing_v(b: Builder, v: Value, u: Value, scaled_v: Callable[[], Value], unscale: float) -> Value:
    """M = V·U per position ([16, tiles, C]·[16, C, O]), differentiated as ∂V = M̄·Uᵀ and ∂U = Vᵀ·M̄
    with V computed again in the backward rather than held from the forward. XLA's CSE would merge
    a plain recomputation back into the forward's V (optimization barriers do not stop it), so the
    backward's reads `scaled_v()`, V times a power of two, and ∂U is multiplied by `unscale`: both
    exact in floating point."""

    def fwd(v: Value, u: Value) -> list[Value]:
        return [b.dot_general(v, u, ([2], [1]), ((0,), (0,)))]

    def bwd(b: Builder, g: Value) -> list[Value]:
        du = b.dot_general(scaled_v(), g, ([1], [1]), ((0,), (0,)))
        return [b.dot_general(g, u, ([2], [2]), ((0,), (0,))), du * unscale]

    return b.custom_vjp(fwd, bwd, v, u)[0]


def winograd_conv(b: Builder, x: Value, w: Value, pads: Sequence[tuple[int, int]],
                  out_hw: Sequence[int]) -> Value:
    """x [N, H, W, C] ⊛ w [3, 3, C, O] at stride 1 with `pads` per spatial axis -> [N, OH, OW, O]
    (`out_hw`: OH, OW)."""
    n, h, wd, c = x.shape
    out_hw = list(out_hw)
    th, tw = ((s + 1) // 2 for s in out_hw)
    # the tiles cover 2·T + 2 padded pixels per axis: an odd output size reads one pixel past `pads`
    high = [2 * t + 2 - size - lo for t, size, (lo, _) in zip((th, tw), (h, wd), pads, strict=True)]

    def transformed(x: Value) -> Value:  # V [16, tiles, C]
        xp = b.pad(x, [0, pads[0][0], pads[1][0], 0], [0, *high, 0])
        return b.reshape(apply(b, input_matrix(), input_tiles(b, xp)), (16, n * th * tw, c))

    v, u = transformed(x), kernel_transform(b, w)
    if v.type.nbytes < RECOMPUTED_MIN_BYTES:
        m = b.dot_general(v, u, ([2], [1]), ((0,), (0,)))
    else:
        m = _products_recomputing_v(b, v, u, lambda: transformed(x * 2.0), 0.5)
    y = output_tiles(b, m, n, th, tw)
    if [2 * th, 2 * tw] != out_hw:
        y = b.slice(y, [0, 0, 0, 0], [n, *out_hw, w.shape[3]])
    return y
