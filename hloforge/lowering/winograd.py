"""A 3×3 stride-1 NHWC convolution by Winograd's minimal filtering F(2×2, 3×3) (Lavin & Gray, 2016).

Each 2×2 tile of the output comes from a 4×4 tile of the padded input (tiles overlap by two
pixels): V = Bᵀ d B per input tile and U = G w Gᵀ per kernel, then for each of the 16 positions
(ξ, ν) of the transformed tile one GEMM M[ξν] = V[ξν]·U[ξν] over [tiles, C]·[C, O], and the
output tile Aᵀ M A. That is 16 multiplies per 2×2 outputs where the direct conv does 36: the
GEMMs are 2.25× fewer flops than the im2col one, for three linear transforms that read and write
memory.

The backward is the transposed chain: ḡ through the output transform's adjoint (M̄, shared by
both gradients), then per position two GEMMs, V̄ = M̄·Uᵀ and Ū = Vᵀ·M̄ (∂x and ∂w in the transformed
domain, with the same 2.25× saving), and the input transform's adjoint (each tile's Bᵀ-adjoint
overlap-added back into the image) and the kernel transform's. The input and output transforms
carry closed-form adjoints written like their forwards (strided slices, sums, interleaves):
autodiff's would pad each of the 16 slices back to the whole image and add them.

Each transform is separable: along H, then along W, with one 1-D matrix (B_T, G, A_T below).
"""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.hlo import Builder, Value

# F(2, 3)'s matrices, row by row: transformed index × tap.
B_T = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))  # input tile (4) → transformed (4)
G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))  # kernel (3) → transformed (4)
A_T = ((1, 1, 1, 0), (0, 1, -1, -1))  # transformed (4) → output tile (2)


def transposed(m: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(zip(*m, strict=True))


def combine(b: Builder, parts: Sequence[Value], m: Sequence[Sequence[float]]) -> list[Value]:
    """[Σ_j m[i][j]·parts[j] for each row i]: the 1-D transform `m` applied across `parts`."""
    out = []
    for row in m:
        acc: Value | None = None
        for coef, part in zip(row, parts, strict=True):
            if coef == 0:
                continue
            if acc is None:
                acc = part if coef == 1 else part * float(coef)
            elif coef in (1, -1):
                acc = acc + part if coef == 1 else acc - part
            else:
                acc = acc + part * float(coef)
        assert acc is not None, "a transform row of zeros"
        out.append(acc)
    return out


def _strided(b: Builder, x: Value, axis: int, start: int, count: int) -> Value:
    """x at start, start + 2, …, `count` positions along `axis`."""
    lo, hi, step = [0] * x.type.rank, list(x.shape), [1] * x.type.rank
    lo[axis], hi[axis], step[axis] = start, start + 2 * (count - 1) + 1, 2
    return b.slice(x, lo, hi, step)


def _interleave(b: Builder, even: Value, odd: Value, axis: int) -> Value:
    """[e0, o0, e1, o1, …] along `axis`: the two phases of one axis woven back together."""
    shape = list(even.shape)
    unit = [*shape[:axis + 1], 1, *shape[axis + 1:]]
    both = b.concatenate([b.reshape(even, unit), b.reshape(odd, unit)], axis + 1)
    shape[axis] *= 2
    return b.reshape(both, shape)


def _tiles_in(b: Builder, x: Value, axis: int, tiles: int) -> list[Value]:
    """Bᵀ along `axis` of every 4-wide tile at stride 2: four arrays with `tiles` along it."""
    return combine(b, [_strided(b, x, axis, a, tiles) for a in range(4)], B_T)


def _tiles_in_adjoint(b: Builder, parts: Sequence[Value], axis: int) -> Value:
    """The adjoint of `_tiles_in`: each tile's four taps Σ_ξ Bᵀ[ξ, a]·V̄_ξ overlap-added back,
    taps 0, 1 of tile t on pixels 2t, 2t + 1 and taps 2, 3 on 2t + 2, 2t + 3 (2·tiles + 2 pixels)."""
    d = combine(b, parts, transposed(B_T))
    rank = d[0].type.rank

    def shifted(v: Value, lo: int) -> Value:
        low, high = [0] * rank, [0] * rank
        low[axis], high[axis] = lo, 1 - lo
        return b.pad(v, low, high)

    even = shifted(d[0], 0) + shifted(d[2], 1)
    odd = shifted(d[1], 0) + shifted(d[3], 1)
    return _interleave(b, even, odd, axis)


def _tiles_out(b: Builder, parts: Sequence[Value], axis: int) -> Value:
    """Aᵀ along `axis` of four transformed arrays, the two output phases interleaved."""
    even, odd = combine(b, parts, A_T)
    return _interleave(b, even, odd, axis)


def _tiles_out_adjoint(b: Builder, g: Value, axis: int) -> list[Value]:
    tiles = g.shape[axis] // 2
    return combine(b, [_strided(b, g, axis, p, tiles) for p in range(2)], transposed(A_T))


def input_transform(b: Builder, xp: Value) -> list[Value]:
    """V: the 16 transformed planes [N·TH·TW, C] (ξν row-major) of the padded NHWC image
    xp [N, 2·TH + 2, 2·TW + 2, C]. Sixteen arrays, not one: XLA's CPU writes a 16-way concatenate
    ~3× slower than the planes apart."""
    n, hp, wp, c = xp.shape
    th, tw = (hp - 2) // 2, (wp - 2) // 2

    def fwd(xp: Value) -> list[Value]:
        return [b.reshape(v, (n * th * tw, c)) for r in _tiles_in(b, xp, 1, th) for v in _tiles_in(b, r, 2, tw)]

    def bwd(b: Builder, *v_bar: Value) -> list[Value]:
        parts = [b.reshape(v, (n, th, tw, c)) for v in v_bar]
        rows = [_tiles_in_adjoint(b, parts[4 * xi:4 * xi + 4], 2) for xi in range(4)]
        return [_tiles_in_adjoint(b, rows, 1)]

    return b.custom_vjp(fwd, bwd, xp)


def output_transform(b: Builder, m: Sequence[Value], n: int, th: int, tw: int) -> Value:
    """The NHWC output [N, 2·TH, 2·TW, O] of the 16 GEMMs' products m (each [N·TH·TW, O], ξν row-major)."""
    o = m[0].shape[1]

    def fwd(*m: Value) -> list[Value]:
        parts = [b.reshape(v, (n, th, tw, o)) for v in m]
        cols = [_tiles_out(b, [parts[4 * xi + nu] for xi in range(4)], 1) for nu in range(4)]
        return [_tiles_out(b, cols, 2)]

    def bwd(b: Builder, g: Value) -> list[Value]:
        cols = _tiles_out_adjoint(b, g, 2)  # per ν: [N, 2·TH, TW, O]
        per_nu = [_tiles_out_adjoint(b, col, 1) for col in cols]  # per ν, per ξ: [N, TH, TW, O]
        return [b.reshape(per_nu[nu][xi], (n * th * tw, o)) for xi in range(4) for nu in range(4)]

    return b.custom_vjp(fwd, bwd, *m)[0]


def kernel_transform(b: Builder, w: Value) -> list[Value]:
    """U: the 16 transformed kernels [C, O] (ξν row-major) of the HWIO kernel w [3, 3, C, O],
    G w Gᵀ per channel pair."""
    c, o = w.shape[2], w.shape[3]

    def taps(v: Value, axis: int) -> list[Value]:
        lo, hi = [0] * 4, list(v.shape)
        out = []
        for i in range(3):
            lo[axis], hi[axis] = i, i + 1
            out.append(b.slice(v, list(lo), list(hi)))
        return out

    return [b.reshape(u, (c, o)) for r in combine(b, taps(w, 0), G) for u in combine(b, taps(r, 1), G)]


def winograd_conv(b: Builder, x: Value, w: Value, pads: Sequence[tuple[int, int]],
                  out_hw: Sequence[int]) -> Value:
    """x [N, H, W, C] ⊛ w [3, 3, C, O] at stride 1 with `pads` per spatial axis -> [N, OH, OW, O]
    (`out_hw`: OH, OW)."""
    n, h, wd, _ = x.shape
    out_hw = list(out_hw)
    th, tw = ((s + 1) // 2 for s in out_hw)
    # the tiles cover 2·T + 2 padded pixels per axis: an odd output size reads one pixel past `pads`
    high = [2 * t + 2 - size - lo for t, size, (lo, _) in zip((th, tw), (h, wd), pads, strict=True)]
    xp = b.pad(x, [0, pads[0][0], pads[1][0], 0], [0, *high, 0])
    m = [b.dot_general(v, u, ([1], [0])) for v, u in zip(input_transform(b, xp), kernel_transform(b, w), strict=True)]
    y = output_transform(b, m, n, th, tw)
    if [2 * th, 2 * tw] != out_hw:
        y = b.slice(y, [0, 0, 0, 0], [n, *out_hw, w.shape[3]])
    return y
