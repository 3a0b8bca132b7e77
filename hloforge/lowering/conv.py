"""The forms of a 2-D convolution (NCHW with OIHW kernels in the spec) and their backwards.

Every 2-D convolution of the layers (conv2d, convBn, depthwiseConvBn) is emitted by `conv2d`,
in the form the strategy kind "conv2d" picks for the module's target (core/strategy.py; each
backend's choice is its `strategy_defaults`, the measurements behind them benchmarks/NOTES.md):

- "nchw": one NCHW/OIHW stablehlo.convolution; the backward is autodiff's (∂x and ∂w as the
  dilated/batch-grouped convolutions XLA's own VJP uses).
- "nhwc": the conv in NHWC/HWIO between a transpose in and out (inside a layout=nhwc net, every
  conv is NHWC with no transposes, whatever this kind says).

An NHWC conv's backward is what the kind "convGrad" picks:
- "written" (a `Builder.custom_vjp`): ∂x as a forward-style NHWC conv of ḡ (stride-dilated) with
  the flipped, in/out-swapped kernel, ∂w as k² shifted dot_generals Σ_{n,h,w} x[n, s·h+i, s·w+j, :]ᵀ ḡ.
  IREE runs this form an order of magnitude faster than the NCHW one or the NHWC autodiff one,
  once its kernel transpose is materialised (`hwio`).
- "chunked": autodiff's, but ∂w summed over chunks of a few examples where the output image is
  large (see `dw_chunk`; one while loop over the chunks for an ungrouped conv), ∂x on flipped
  activations where the kernel outweighs them (`flips_data_for_dx`), a strided conv's ∂x as one
  GEMM summed by output phase (`_dense_dx_by_phases`), the whole conv one im2col GEMM where the
  kernel outweighs its input GEMM_KERNEL_RATIO times (`gemm_outruns_conv`), and a strided 1×1
  conv the GEMM of its strided view (`is_strided_pointwise`).
- "winograd": "chunked", but a 3×3 stride-1 conv of at least WINOGRAD_MIN_CHANNELS channels a
  side is Winograd's F(2×2, 3×3), forward and backward (`takes_winograd`, lowering/winograd.py):
  2.25× fewer flops in its GEMMs, between three small transform products (benchmarks/NOTES.md).
- "autodiff": autodiff's, as for "nchw" (in an NHWC stretch, free of NCHW↔NHWC relayouts).

A depthwise conv (groups = in = out channels) first consults the kind "depthwise":
- "conv": the convolution above, whichever form "conv2d" picks;
- "shifted": Σ over the k² taps of a strided slice of x times that tap's per-channel weight, in
  the activation's own layout, with a closed-form backward (`depthwise_shifted`);
- "shiftedSmall": "shifted" for kernels up to SHIFTED_MAX_K, "conv" above. ∂w's k² sums are one
  variadic reduce of k² + 1 buffers, which a compiler may fuse into one dispatch: IREE 3.13 does,
  and its runtime binds at most 32 buffers to one (a 7×7 kernel's 50 are refused).

A 1×1, stride-1, ungrouped, unpadded conv in NHWC (MobileNet's expand and project convs) first
consults the kind "pointwise":
- "conv": the convolution above, with the backward "convGrad" picks;
- "dot": the GEMM it is, y = x[NHW, C]·w[C, O], with the closed-form backward ∂x = ḡ·wᵀ and
  ∂w = xᵀ·ḡ (one dot_general contracting batch and space).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hloforge.core import autodiff, strategy
from hloforge.core.hlo import NUMPY_DTYPE, Builder, ConvSpec, Value
from hloforge.core.strategy import StrategyKind
from hloforge.lowering import winograd


def window_out(n: int, k: int, stride: int, pads: tuple[int, int]) -> int:
    return (n + pads[0] + pads[1] - k) // stride + 1


# ∂w of a convolution is x correlated with ḡ. XLA's CPU runs it faster on a few examples at a time
# when ḡ's image is large, fastest when a chunk's x and ḡ fill about one core's L2 cache, slower on
# small images: so "chunked" splits the batch only where ḡ has DW_CHUNK_MIN_PIXELS pixels, into
# power-of-two chunks whose x and ḡ fit in DW_CHUNK_BYTES (`dw_chunk`; measured: benchmarks/NOTES.md).
DW_CHUNK_BYTES = 1 << 20
DW_CHUNK_MIN_PIXELS = 14 * 14

# XLA's CPU runs a convolution whose kernel outweighs its activations below its GEMM speed, most of
# all the backward; where the kernel is about the activations' size the conv still wins (benchmarks/NOTES.md).
GEMM_KERNEL_RATIO = 2

# Winograd's transformed image is 4× the image: on 16-wide convs writing it costs the step more than
# their GEMMs save; from 32 channels a side the step gains, but the compile grows more than it does
# from 64 on (mnist-cnn's cold setup past jax.jit's: benchmarks/NOTES.md).
WINOGRAD_MIN_CHANNELS = 64


def dw_chunk(x_shape: Sequence[int], g_shape: Sequence[int], dtype: str) -> int | None:
    """The examples per chunk of a "chunked" ∂w for NHWC x and ḡ of these shapes, or None where
    the batch is not split (ḡ's image below DW_CHUNK_MIN_PIXELS, or one chunk would be the batch)."""
    n, oh, ow = g_shape[0], g_shape[1], g_shape[2]
    if oh * ow < DW_CHUNK_MIN_PIXELS:
        return None
    per_example = (math.prod(x_shape[1:]) + math.prod(g_shape[1:])) * np.dtype(NUMPY_DTYPE[dtype]).itemsize
    chunk = 1 << max(0, (DW_CHUNK_BYTES // per_example).bit_length() - 1)
    return chunk if chunk < n else None


CONV2D = StrategyKind("conv2d", ("nchw", "nhwc"), "the layout of a 2-D convolution in an NCHW net (see conv.py)")
CONV_GRAD = StrategyKind("convGrad", ("written", "autodiff", "chunked", "winograd"),
                         "the backward of an NHWC convolution: written out (∂x a forward-style conv, ∂w k² "
                         "shifted dots), autodiff's (the backend's own transposed convolutions), or autodiff's "
                         f"with ∂w summed over batch chunks whose x and ḡ fit in {DW_CHUNK_BYTES >> 20} MiB "
                         f"where ḡ is at least {DW_CHUNK_MIN_PIXELS} pixels, ∂x taken on flipped "
                         "activations where the kernel outweighs them, and the conv an im2col GEMM "
                         f"where the kernel is at least {GEMM_KERNEL_RATIO}× its input; or chunked with each 3×3 "
                         f"stride-1 conv of at least {WINOGRAD_MIN_CHANNELS} channels a side as Winograd's "
                         "F(2×2, 3×3) (winograd)")
POINTWISE = StrategyKind("pointwise", ("conv", "dot"),
                         "a 1×1 stride-1 conv in NHWC as a convolution, or as the GEMM over its pixels it is")
SHIFTED_MAX_K = 5  # k² + 1 = 26 buffers in ∂w's reduce, within a 32-binding dispatch
DEPTHWISE = StrategyKind("depthwise", ("conv", "shifted", "shiftedSmall"),
                         "a depthwise conv as a convolution, or as k² shifted per-channel products (shiftedSmall: "
                         f"for kernels up to {SHIFTED_MAX_K}×{SHIFTED_MAX_K}, a convolution above)")
KINDS = (CONV2D, CONV_GRAD, POINTWISE, DEPTHWISE)


def is_depthwise(channels: int, out: int, groups: int) -> bool:
    """One k×k filter per channel: what the "depthwise" strategy kind decides the form of."""
    return groups > 1 and groups == channels == out


def is_pointwise(k: int, stride: int, groups: int, pads: Sequence[tuple[int, int]]) -> bool:
    """A 1×1 conv over every pixel, channels mixed across the whole: a GEMM over the pixels, what
    the "pointwise" strategy kind decides the form of."""
    return k == 1 and stride == 1 and groups == 1 and not any(lo or hi for lo, hi in pads)


def is_strided_pointwise(k: int, stride: int, groups: int, pads: Sequence[tuple[int, int]]) -> bool:
    """A 1×1, ungrouped, unpadded conv of stride > 1 (a ResNet's downsampling shortcut): a GEMM over
    every s-th pixel, which the chunked and winograd forms run as one (`nhwc_conv2d`)."""
    return stride > 1 and is_pointwise(k, 1, groups, pads)


def conv_strategies(channels: int, out: int, groups: int, pointwise: bool = False) -> tuple[str, ...]:
    """The strategy kinds a conv of these channels (`pointwise`: and kernel, see `is_pointwise`)
    consults (Layer.strategies_for of its layers)."""
    kinds = ("conv2d", "layout", "convGrad")
    if is_depthwise(channels, out, groups):
        return (*kinds, "depthwise")
    return (*kinds, "pointwise") if pointwise else kinds


NHWC_HWIO: ConvSpec = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def spatial_axes(layout: str) -> tuple[int, int]:
    """H and W of a batched image: axes 2, 3 of NCHW, 1, 2 of NHWC."""
    return (1, 2) if layout == strategy.NHWC else (2, 3)


def per_axis(layout: str, h: int, w: int, rest: int) -> list[int]:
    """A per-axis list for a batched image (pad edges, slice starts, strides): h, w on its spatial
    axes, `rest` on the batch and channel axes."""
    v = [rest] * 4
    sp = spatial_axes(layout)
    v[sp[0]], v[sp[1]] = h, w
    return v


def shifts(choice: str, k: int) -> bool:
    """Whether a depthwise conv of kernel k takes the shifted form under the "depthwise" `choice`."""
    return choice == "shifted" or (choice == "shiftedSmall" and k <= SHIFTED_MAX_K)


def conv2d(b: Builder, x: Value, w: Value, *, stride: int, pads: Sequence[tuple[int, int]], groups: int = 1,
           layout: str = strategy.NCHW) -> Value:
    """x [N, C, H, W] ⊛ w [O, C/groups, k, k] -> [N, O, OH, OW], in the form strategy "conv2d" picks;
    an NHWC x (`layout`, inside a layout=nhwc net) gives an NHWC result, always in the NHWC form."""
    channels = x.shape[strategy.channel_axis(layout, 4)]
    if is_depthwise(channels, w.shape[0], groups) and shifts(strategy.chosen("depthwise", b.target), w.shape[-1]):
        return depthwise_shifted(b, x, w, stride=stride, pads=pads, layout=layout)
    if layout == strategy.NHWC:
        return nhwc_conv2d(b, x, hwio(b, w), stride=stride, pads=pads, groups=groups)
    if strategy.chosen("conv2d", b.target) == "nchw":
        return b.convolution(x, w, strides=(stride, stride), padding=pads, feature_groups=groups)
    y = nhwc_conv2d(b, b.transpose(x, [0, 2, 3, 1]), hwio(b, w), stride=stride, pads=pads, groups=groups)
    return b.transpose(y, [0, 3, 1, 2])


def depthwise_shifted(b: Builder, x: Value, w: Value, *, stride: int, pads: Sequence[tuple[int, int]],
                      layout: str) -> Value:
    """A depthwise conv (w [C, 1, k, k]) as Σ_{i,j} x_pad[·, s·h+i, s·w+j, ·] · w[c, 0, i, j], in x's
    layout, with a closed-form backward: ∂x shifted sums over ḡ with the flipped taps (one per
    output phase at stride > 1, `_depthwise_dx`); ∂w one variadic reduce of the k² products
    x_tap·ḡ, in parallel partial sums over the batch (autodiff's, a pad of ḡ per tap and k² separate
    reductions, ran several times slower: benchmarks/NOTES.md)."""
    sp = spatial_axes(layout)
    k = w.shape[2]
    hw = [x.shape[d] for d in sp]
    out_hw = [window_out(n, k, stride, p) for n, p in zip(hw, pads, strict=True)]

    taps: dict[tuple[int, int], Value] = {}  # x's tap views, the forward's and ∂w's

    def fwd(x: Value, w: Value) -> list[Value]:
        taps.update(_shifted_taps(b, x, k, stride, pads, out_hw, layout))
        return [_shifted_sum(b, taps, w, layout, flip=False)]

    def bwd(b: Builder, g: Value) -> list[Value]:
        dx = _depthwise_dx(b, g, w, hw, stride, pads, layout)
        sums = _batch_sums(b, [taps[i, j] * g for i, j in itertools.product(range(k), repeat=2)],
                           strategy.channel_axis(layout, 4))
        c = w.shape[0]
        dw = b.reshape(b.concatenate([b.reshape(t, (c, 1)) for t in sums], 1), w.shape)
        return [dx, dw]

    return b.custom_vjp(fwd, bwd, x, w)[0]


def _depthwise_dx(b: Builder, g: Value, w: Value, hw: Sequence[int], stride: int, pads: Sequence[tuple[int, int]],
                  layout: str) -> Value:
    """∂x of a depthwise conv by output phase (`_dx_by_phases`), each tap a shift of ḡ times that
    tap's per-channel weight; on XLA about 3× faster than k² taps over ḡ dilated by zeros."""
    k, c = w.shape[2], w.shape[0]
    ch = strategy.channel_axis(layout, 4)

    def term(gp: Value, i: int, j: int, start: list[int], limit: list[int]) -> Value:
        view = b.slice(gp, start, limit)
        tap = b.reshape(b.slice(w, [0, 0, i, j], [c, 1, i + 1, j + 1]), (c,))
        return view * b.broadcast_in_dim(tap, view.shape, [ch])

    return _dx_by_phases(b, g, hw, k, stride, pads, layout, c, term)


def _dense_dx_by_phases(b: Builder, g: Value, w: Value, hw: Sequence[int], stride: int,
                        pads: Sequence[tuple[int, int]]) -> Value:
    """∂x of a strided, ungrouped NHWC conv (w [k, k, C, O]) as one GEMM and a sum by output
    phase: ḡ·wᵀ gives every pixel of ḡ its k² taps' contributions ([N, OH, OW, k²·C]), and each
    phase of ∂x adds up the shifted blocks of its own taps (`_dx_by_phases`). Autodiff's ∂x
    convolves ḡ dilated by the stride, (s² − 1)/s² of it zeros (3/4 at stride 2)."""
    k, c, o = w.shape[0], w.shape[2], w.shape[3]
    cols = b.dot_general(g, b.reshape(w, (k * k * c, o)), ([3], [1]))

    def term(gp: Value, i: int, j: int, start: list[int], limit: list[int]) -> Value:
        block = (i * k + j) * c
        return b.slice(gp, [*start[:3], block], [*limit[:3], block + c])

    return _dx_by_phases(b, cols, hw, k, stride, pads, strategy.NHWC, c, term)


def _dx_by_phases(b: Builder, g: Value, hw: Sequence[int], k: int, stride: int, pads: Sequence[tuple[int, int]],
                  layout: str, channels: int,
                  term: Callable[[Value, int, int, list[int], list[int]], Value]) -> Value:
    """∂x [·, H, W, ·] of a k×k conv of stride s from a per-pixel source g laid out like ḡ:
    ∂x[y] = Σ_i tap_i(g)[(y + p − i)/s] over the taps i with y + p − i a multiple of s, per
    spatial axis. Each phase a = y mod s of the output draws on its own taps only (i ≡ a + p mod
    s), each a plain shift of g by d = (a + p − i)/s rows: s² shifted sums over g itself (at
    stride 1 the one sum), together k² taps over an image of ∂x's size / s², instead of k² over
    g dilated by zeros to ∂x's size. At stride > 1 the phases are then interleaved (stacked and
    reshaped). `term(gp, i, j, start, limit)` is tap (i, j)'s contribution read from the padded
    source gp, whose spatial window for the shift is start:limit."""
    sp = spatial_axes(layout)
    rows = [-(-n // stride) for n in hw]  # per phase, padded to the longest
    # per axis and phase a: the (tap i, shift d) pairs, and the padding of g every shift needs
    shifts = [[[(i, (a + p[0] - i) // stride) for i in range(k) if (a + p[0] - i) % stride == 0]
               for a in range(stride)] for p in pads]
    ds = [[d for phase in axis for _, d in phase] or [0] for axis in shifts]
    lo = [max(0, -min(d)) for d in ds]
    hi = [max(0, r + max(d) - g.shape[ax]) for r, d, ax in zip(rows, ds, sp, strict=True)]
    gp = b.pad(g, per_axis(layout, lo[0], lo[1], 0), per_axis(layout, hi[0], hi[1], 0))
    out_shape = list(g.shape)
    out_shape[sp[0]], out_shape[sp[1]] = rows
    out_shape[strategy.channel_axis(layout, 4)] = channels
    phases = []
    for row_phase, col_phase in itertools.product(range(stride), repeat=2):
        dx = None
        for (i, di), (j, dj) in itertools.product(shifts[0][row_phase], shifts[1][col_phase]):
            limit = list(gp.shape)
            limit[sp[0]], limit[sp[1]] = lo[0] + di + rows[0], lo[1] + dj + rows[1]
            t = term(gp, i, j, per_axis(layout, lo[0] + di, lo[1] + dj, 0), limit)
            dx = t if dx is None else dx + t
        phases.append(dx if dx is not None else b.full(0.0, out_shape, g.dtype))
    if stride == 1:
        return phases[0]
    # [.., R, W', ..] per phase (a, b) -> [.., R, s, W', s, ..] -> [.., s·R, s·W', ..], cropped to H, W
    h_ax, w_ax = sp[0], sp[1]
    expanded = [b.reshape(ph, (*out_shape[:h_ax + 1], 1, out_shape[w_ax], 1, *out_shape[w_ax + 1:]))
                for ph in phases]
    by_row = [b.concatenate(expanded[a * stride:(a + 1) * stride], w_ax + 2) for a in range(stride)]
    woven = b.concatenate(by_row, h_ax + 1)
    full = list(out_shape)
    full[h_ax], full[w_ax] = rows[0] * stride, rows[1] * stride
    dx = b.reshape(woven, full)
    if full[h_ax] != hw[0] or full[w_ax] != hw[1]:
        limit = list(full)
        limit[h_ax], limit[w_ax] = hw
        dx = b.slice(dx, [0] * 4, limit)
    return dx


def _shifted_taps(b: Builder, x: Value, k: int, stride: int, pads: Sequence[tuple[int, int]],
                  out_hw: Sequence[int], layout: str) -> dict[tuple[int, int], Value]:
    """The k² views x_pad[·, s·h+i, s·w+j, ·] (h < OH, w < OW) of a batched image, by tap (i, j)."""
    sp = spatial_axes(layout)
    if any(lo or hi for lo, hi in pads):
        x = b.pad(x, per_axis(layout, pads[0][0], pads[1][0], 0), per_axis(layout, pads[0][1], pads[1][1], 0))
    taps = {}
    for i, j in itertools.product(range(k), repeat=2):
        limit = list(x.shape)
        limit[sp[0]], limit[sp[1]] = i + (out_hw[0] - 1) * stride + 1, j + (out_hw[1] - 1) * stride + 1
        taps[i, j] = b.slice(x, per_axis(layout, i, j, 0), limit, per_axis(layout, stride, stride, 1))
    return taps


def _shifted_sum(b: Builder, taps: Mapping[tuple[int, int], Value], w: Value, layout: str, *, flip: bool) -> Value:
    """Σ_{i,j} taps[i, j] · w[c, 0, i, j] per channel (w[c, 0, k−1−i, k−1−j] when `flip`)."""
    c, k = w.shape[0], w.shape[2]
    y = None
    for (i, j), xs in taps.items():
        wi, wj = (k - 1 - i, k - 1 - j) if flip else (i, j)
        tap = b.reshape(b.slice(w, [0, 0, wi, wj], [c, 1, wi + 1, wj + 1]), (c,))
        term = xs * b.broadcast_in_dim(tap, xs.shape, [strategy.channel_axis(layout, 4)])
        y = term if y is None else y + term
    assert y is not None
    return y


# XLA's CPU runs a variadic reduce on one thread; split over the batch, its partial sums run in parallel
BATCH_PARTS = (8, 4, 2)


def _batch_sums(b: Builder, xs: Sequence[Value], keep: int) -> list[Value]:
    """Each of xs (one shape [N, …]) summed over every axis but `keep`, in one variadic reduce over
    up to 8 partial sums of the batch, then the partials added."""
    n = xs[0].shape[0]
    parts = next((p for p in BATCH_PARTS if n % p == 0), 1)
    split = [b.reshape(x, (parts, n // parts, *x.shape[1:])) for x in xs]
    partial = b.reduce_sums(split, [d for d in range(1, split[0].type.rank) if d != keep + 1])
    return [b.sum(p, [0]) for p in partial]


def hwio(b: Builder, w: Value) -> Value:
    """The OIHW kernel as HWIO; for the written backward (IREE's form) materialised, as IREE runs a
    conv whose kernel transpose it fused ~10× slower."""
    t = b.transpose(w, [2, 3, 1, 0])
    return b.optimization_barrier(t) if strategy.chosen("convGrad", b.target) == "written" else t


def nhwc_conv2d(b: Builder, x: Value, w: Value, *, stride: int, pads: Sequence[tuple[int, int]],
                groups: int = 1) -> Value:
    """x [N, H, W, C] ⊛ w [k, k, C/groups, O] -> [N, OH, OW, O], differentiated as "convGrad" says."""
    pads = [(lo, hi) for lo, hi in pads]
    if is_pointwise(w.shape[0], stride, groups, pads) and strategy.chosen("pointwise", b.target) == "dot":
        return pointwise_dot(b, x, w)
    form = strategy.chosen("convGrad", b.target)
    if form == "winograd":
        if takes_winograd(w.shape, stride, groups):
            out_hw = [window_out(n, 3, 1, p) for n, p in zip(x.shape[1:3], pads, strict=True)]
            return winograd.winograd_conv(b, x, w, pads, out_hw)
        form = "chunked"
    if form == "chunked" and gemm_outruns_conv(x.shape, w.shape, groups):
        return im2col_conv(b, x, w, stride, pads)
    if form == "chunked" and is_strided_pointwise(w.shape[0], stride, groups, pads):
        return pointwise_dot(b, b.slice(x, [0] * 4, x.shape, [1, stride, stride, 1]), w)
    if form in ("autodiff", "chunked"):
        chunk, dx_form = None, "autodiff"
        if form == "chunked":
            oh, ow = (window_out(n, w.shape[0], stride, p) for n, p in zip(x.shape[1:3], pads, strict=True))
            chunk = dw_chunk(x.shape, (x.shape[0], oh, ow, w.shape[3]), x.dtype)
            if flips_data_for_dx(x.shape, w.shape, stride, groups):
                dx_form = "flipped"
            elif stride > 1 and groups == 1:
                dx_form = "phases"
        if chunk is None and dx_form == "autodiff":
            return b.convolution(x, w, strides=(stride, stride), padding=pads, feature_groups=groups, spec=NHWC_HWIO)
        return _conv_autodiff_parts(b, x, w, stride, pads, groups, chunk, dx_form)

    def fwd(x: Value, w: Value) -> list[Value]:
        return [b.convolution(x, w, strides=(stride, stride), padding=pads, feature_groups=groups, spec=NHWC_HWIO)]

    def bwd(b: Builder, g: Value) -> list[Value]:
        return [_nhwc_conv_dx(b, g, w, x.shape, stride, pads, groups), _nhwc_conv_dw(b, x, g, w.shape, stride, pads,
                                                                                      groups)]

    return b.custom_vjp(fwd, bwd, x, w)[0]


def pointwise_dot(b: Builder, x: Value, w: Value) -> Value:
    """x [N, H, W, C] ⊛ w [1, 1, C, O] as y = Σ_c x[…, c]·w[c, o], with the closed-form backward
    ∂x = ḡ·wᵀ, ∂w = Σ_{n,h,w} x[n, h, w, :]ᵀ ḡ[n, h, w, :]."""
    w2 = b.reshape(w, w.shape[2:])

    def fwd(x: Value, w: Value) -> list[Value]:
        return [b.dot_general(x, w2, ([3], [0]))]

    def bwd(b: Builder, g: Value) -> list[Value]:
        return [b.dot_general(g, w2, ([3], [1])), b.reshape(b.dot_general(x, g, ((0, 1, 2), (0, 1, 2))), w.shape)]

    return b.custom_vjp(fwd, bwd, x, w)[0]


def _conv_autodiff_parts(b: Builder, x: Value, w: Value, stride: int, pads: Sequence[tuple[int, int]],
                         groups: int, chunk: int | None, dx_form: str) -> Value:
    """The NHWC conv with autodiff's backward, but for two parts: ∂w summed over batch chunks of
    `chunk` examples (the last may be shorter; None: one piece), and ∂x as `dx_form` says:
    "autodiff", "flipped" (on flipped activations rather than a flipped kernel,
    `_conv_dx_flipping_data`) or "phases" (a GEMM summed by output phase, `_dense_dx_by_phases`)."""
    conv: dict[str, Any] = {}

    def fwd(x: Value, w: Value) -> list[Value]:
        y = b.convolution(x, w, strides=(stride, stride), padding=pads, feature_groups=groups, spec=NHWC_HWIO)
        conv.update(b.tape[-1].attrs)  # the attributes autodiff's rules read, exactly as recorded
        return [y]

    def bwd(b: Builder, g: Value) -> list[Value]:
        n = x.shape[0]
        step = chunk or n
        dw = None
        if step < n and groups == 1:  # one loop over the chunks: a compile of one chunk's ops, not n/step
            dw = _looped_kernel_grad(b, x, g, w.shape, stride, pads, step)
        for lo in range(0, n if dw is None else 0, step):
            hi = min(lo + step, n)
            xs, gs = (x, g) if step == n else (b.slice(x, [lo, 0, 0, 0], [hi, *x.shape[1:]]),
                                               b.slice(g, [lo, 0, 0, 0], [hi, *g.shape[1:]]))
            part = autodiff.conv_kernel_grad(b, xs, gs, w.shape, conv)
            dw = part if dw is None else dw + part
        assert dw is not None
        if dx_form == "flipped":
            dx = _conv_dx_flipping_data(b, g, w, pads)
        elif dx_form == "phases":
            dx = _dense_dx_by_phases(b, g, w, x.shape[1:3], stride, pads)
        else:
            dx = autodiff.conv_input_grad(b, g, w, x.shape, conv)
        return [dx, dw]

    return b.custom_vjp(fwd, bwd, x, w)[0]


# XLA's CPU runs a convolution through Eigen only in the form b01f_01io->b01f; it rewrites the
# entry computation's convolutions into it, but not a loop body's (those ran ~15× slower), so the
# loop's ∂w is written in it: x as [C, H, W, n], ḡ as [OH, OW, n, O], ∂w as [C, k, k, O].
_EIGEN_DW: ConvSpec = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def _eigen_kernel_grad(b: Builder, x: Value, g: Value, k: int, stride: int,
                       pads: Sequence[tuple[int, int]]) -> Value:
    """∂w as [C, k, k, O] of a stride-`stride` ungrouped NHWC conv of x [n, H, W, C] with a k×k
    kernel, from ḡ [n, OH, OW, O]: x correlated with ḡ dilated by the stride."""
    span = [(m - 1) * stride + 1 for m in g.shape[1:3]]
    conv_pads = [(p[0], o - h + k - p[0] - 1) for p, o, h in zip(pads, span, x.shape[1:3], strict=True)]
    return b.convolution(b.transpose(x, [3, 1, 2, 0]), b.transpose(g, [1, 2, 0, 3]), strides=(1, 1),
                         padding=conv_pads, rhs_dilation=(stride, stride), spec=_EIGEN_DW)


def _looped_kernel_grad(b: Builder, x: Value, g: Value, w_shape: Sequence[int], stride: int,
                        pads: Sequence[tuple[int, int]], chunk: int) -> Value:
    """∂w [k, k, C, O] of an ungrouped NHWC conv summed over the batch in chunks of `chunk`
    examples: one stablehlo.while over the whole chunks (x and ḡ carried, each chunk a
    dynamic_slice), the remainder, if any, after it."""
    n, k = x.shape[0], w_shape[0]
    whole, rest = divmod(n, chunk)

    def i32(c: Builder, v: int) -> Value:
        return c.full(v, (), "i32")

    def cond(c: Builder, a: list[Value]) -> Value:
        return c.compare(a[0], i32(c, whole), "LT")

    def body(c: Builder, a: list[Value]) -> list[Value]:
        i, dw, x, g = a
        start, z = i * i32(c, chunk), i32(c, 0)
        xs = c.dynamic_slice(x, [start, z, z, z], (chunk, *x.shape[1:]))
        gs = c.dynamic_slice(g, [start, z, z, z], (chunk, *g.shape[1:]))
        return [i + i32(c, 1), dw + _eigen_kernel_grad(c, xs, gs, k, stride, pads), x, g]

    zero = b.full(0.0, (w_shape[2], k, k, w_shape[3]), x.dtype)
    _, dw, *_ = b.while_([i32(b, 0), zero, x, g], cond, body)
    if rest:
        lo = whole * chunk
        dw = dw + _eigen_kernel_grad(b, b.slice(x, [lo, 0, 0, 0], list(x.shape)),
                                     b.slice(g, [lo, 0, 0, 0], list(g.shape)), k, stride, pads)
    return b.transpose(dw, [1, 2, 0, 3])


def takes_winograd(w_shape: Sequence[int], stride: int, groups: int) -> bool:
    """Whether the winograd form (XLA's default) runs an NHWC conv as Winograd's F(2×2, 3×3)
    (`winograd.winograd_conv`): an ungrouped 3×3 stride-1 conv at least WINOGRAD_MIN_CHANNELS wide
    on both sides."""
    return (tuple(w_shape[:2]) == (3, 3) and stride == 1 and groups == 1
            and min(w_shape[2], w_shape[3]) >= WINOGRAD_MIN_CHANNELS)


def gemm_outruns_conv(x_shape: Sequence[int], w_shape: Sequence[int], groups: int) -> bool:
    """Whether the chunked and winograd forms run an NHWC conv as an im2col GEMM (`im2col_conv`): an
    ungrouped k×k conv (k > 1) whose kernel is at least GEMM_KERNEL_RATIO × its input."""
    return groups == 1 and w_shape[0] > 1 and math.prod(w_shape) >= GEMM_KERNEL_RATIO * math.prod(x_shape)


def im2col_conv(b: Builder, x: Value, w: Value, stride: int, pads: Sequence[tuple[int, int]]) -> Value:
    """x [N, H, W, C] ⊛ w [k, k, C, O] as one GEMM: the k² strided views of the padded x side by side
    on the channel axis ([N, OH, OW, k²·C], taps in w's (i, j) order) times w as [k²·C, O], with
    autodiff's backward: ∂x the GEMM ḡ·wᵀ with its k² column blocks padded back into place and
    summed, ∂w one GEMM of the views and ḡ over the batch and pixels."""
    k, c, o = w.shape[0], w.shape[2], w.shape[3]
    out_hw = [window_out(n, k, stride, p) for n, p in zip(x.shape[1:3], pads, strict=True)]
    taps = _shifted_taps(b, x, k, stride, pads, out_hw, strategy.NHWC)
    cols = b.concatenate(list(taps.values()), 3)
    return b.dot_general(cols, b.reshape(w, (k * k * c, o)), ([3], [0]))


def flips_data_for_dx(x_shape: Sequence[int], w_shape: Sequence[int], stride: int, groups: int) -> bool:
    """Whether the chunked form takes ∂x on flipped activations (`_conv_dx_flipping_data`): where
    the kernel outweighs x and ḡ. A stride-1 ungrouped NHWC conv only (XLA's stride-2 ∂x is its
    own base-dilated conv). XLA fuses autodiff's flip of the kernel into its in/out transpose and
    runs the pair ~4× slower than either alone, hence the factor (benchmarks/NOTES.md)."""
    g_elems = math.prod(x_shape[:3]) * w_shape[3]
    return stride == 1 and groups == 1 and 4 * math.prod(w_shape) > math.prod(x_shape) + g_elems


def _conv_dx_flipping_data(b: Builder, g: Value, w: Value, pads: Sequence[tuple[int, int]]) -> Value:
    """∂x of a stride-1 ungrouped NHWC conv as flip(flip(ḡ) ⊛ wᵀ): ḡ and the result flipped in
    space, the kernel only in/out-transposed, and each side's padding the other's mirror."""
    k = w.shape[0]
    conv_pad = [(k - 1 - hi, k - 1 - lo) for lo, hi in pads]
    dx = b.convolution(b.reverse(g, [1, 2]), b.transpose(w, [0, 1, 3, 2]), strides=(1, 1), padding=conv_pad,
                       spec=NHWC_HWIO)
    return b.reverse(dx, [1, 2])


def _nhwc_conv_dx(b: Builder, g: Value, w: Value, x_shape: Sequence[int], stride: int,
                  pads: Sequence[tuple[int, int]], groups: int) -> Value:
    """∂x: ḡ, dilated by the stride, in a stride-1 forward conv with the spatially flipped kernel
    whose in and out channels are swapped within each group."""
    k, cg, o = w.shape[0], w.shape[2], w.shape[3]
    og = o // groups
    # [k, k, Cg, G·Og] -> [k, k, Og, G·Cg]: per group the transposed channel map
    wk = b.reshape(b.transpose(b.reshape(w, (k, k, cg, groups, og)), [0, 1, 4, 3, 2]), (k, k, og, groups * cg))
    wk = b.reverse(wk, [0, 1])
    before = [k - 1 - p[0] for p in pads]
    # the dilated ḡ spans (OH−1)·s+1 rows; pad it so the stride-1 conv returns exactly H rows
    after = [n + k - 1 - ((m - 1) * stride + 1) - bf for n, m, bf in zip(x_shape[1:3], g.shape[1:3], before,
                                                                             strict=True)]
    if stride == 1 and min(before + after) >= 0:
        conv_pad = list(zip(before, after, strict=True))
    else:  # interior padding dilates ḡ; a negative edge (rows the forward never read) crops it
        g = b.pad(g, [0, *before, 0], [0, *after, 0], [0, stride - 1, stride - 1, 0])
        conv_pad = [(0, 0), (0, 0)]
    return b.convolution(g, wk, strides=(1, 1), padding=conv_pad, feature_groups=groups, spec=NHWC_HWIO)


def _nhwc_conv_dw(b: Builder, x: Value, g: Value, w_shape: Sequence[int], stride: int,
                  pads: Sequence[tuple[int, int]], groups: int) -> Value:
    """∂w[i, j] = Σ_{n,h,w} x_pad[n, s·h+i, s·w+j, :]ᵀ ḡ[n, h, w, :] (per group): k² dot_generals
    contracting batch and space, stacked to [k, k, Cg, O]."""
    k, cg, o = w_shape[0], w_shape[2], w_shape[3]
    og = o // groups
    n, oh, ow = g.shape[0], g.shape[1], g.shape[2]
    if any(lo or hi for lo, hi in pads):
        x = b.pad(x, [0, pads[0][0], pads[1][0], 0], [0, pads[0][1], pads[1][1], 0])
    gg = b.reshape(g, (n, oh, ow, groups, og)) if groups > 1 else g
    taps = []
    for i, j in itertools.product(range(k), repeat=2):
        xs = b.slice(x, [0, i, j, 0], [n, i + (oh - 1) * stride + 1, j + (ow - 1) * stride + 1, x.shape[3]],
                     [1, stride, stride, 1])
        if groups == 1:
            tap = b.dot_general(xs, gg, ((0, 1, 2), (0, 1, 2)))  # [C, O]
        else:  # batch over the groups: [G, Cg, Og] -> [Cg, G·Og]
            xs = b.reshape(xs, (n, oh, ow, groups, cg))
            tap = b.dot_general(xs, gg, ((0, 1, 2), (0, 1, 2)), ((3,), (3,)))
            tap = b.reshape(b.transpose(tap, [1, 0, 2]), (cg, o))
        taps.append(b.reshape(tap, (1, cg, o)))
    return b.reshape(b.concatenate(taps, 0), (k, k, cg, o))
