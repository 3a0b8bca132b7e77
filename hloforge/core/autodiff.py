"""Reverse mode at code-generation time: one VJP rule per builder op.

`grad` walks the builder's tape backwards and emits the backward ops into the
same function. Rules are named after their ops and kept in hlo.py's order.
A rule takes (builder, op, output cotangent) and returns one cotangent per
input, None meaning zero.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from hloforge.core import strategy
from hloforge.core.errors import PluginError, UnsupportedSpec
from hloforge.core.hlo import FLOAT_DTYPES, Builder, TapeOp, Value

Cts = Sequence[Value | None]
Rule = Callable[[Builder, TapeOp, Value], Cts]
VJP: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(f: Rule) -> Rule:
        VJP[name] = f
        return f
    return register


# ----------------------------------------------------------------- leaves
@rule("constant")
@rule("iota")
def _leaf(b: Builder, op: TapeOp, g: Value) -> Cts:
    return ()


# ----------------------------------------------------------------- elementwise
@rule("add")
def _add(b: Builder, op: TapeOp, g: Value) -> Cts:
    return g, g


@rule("subtract")
def _subtract(b: Builder, op: TapeOp, g: Value) -> Cts:
    return g, b.negate(g)


@rule("multiply")
def _multiply(b: Builder, op: TapeOp, g: Value) -> Cts:
    x, y = op.ins
    return b.multiply(g, y), b.multiply(g, x)


@rule("divide")
def _divide(b: Builder, op: TapeOp, g: Value) -> Cts:
    x, y = op.ins
    gx = b.divide(g, y)
    return gx, b.negate(b.multiply(gx, op.outs[0]))


def _minmax(b: Builder, op: TapeOp, g: Value, direction: str) -> Cts:
    # Ties send the cotangent to the first operand (a subgradient; ties have measure zero).
    x, y = op.ins
    zero = b.full(0.0, g.shape, g.dtype)
    first = b.compare(x, y, direction)
    return b.select(first, g, zero), b.select(first, zero, g)


@rule("maximum")
def _maximum(b: Builder, op: TapeOp, g: Value) -> Cts:
    return _minmax(b, op, g, "GE")


@rule("minimum")
def _minimum(b: Builder, op: TapeOp, g: Value) -> Cts:
    return _minmax(b, op, g, "LE")


@rule("negate")
def _negate(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.negate(g),)


@rule("exponential")
def _exponential(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.multiply(g, op.outs[0]),)


@rule("log")
def _log(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.divide(g, op.ins[0]),)


@rule("tanh")
def _tanh(b: Builder, op: TapeOp, g: Value) -> Cts:
    y = op.outs[0]
    return (g * (1.0 - y * y),)


@rule("logistic")
def _logistic(b: Builder, op: TapeOp, g: Value) -> Cts:
    y = op.outs[0]
    return (g * (y * (1.0 - y)),)


@rule("sqrt")
def _sqrt(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.divide(g * 0.5, op.outs[0]),)


@rule("rsqrt")
def _rsqrt(b: Builder, op: TapeOp, g: Value) -> Cts:
    # d/dx x^(-1/2) = -1/2 · rsqrt(x) / x
    return (b.divide(g * op.outs[0] * -0.5, op.ins[0]),)


@rule("abs")
def _abs(b: Builder, op: TapeOp, g: Value) -> Cts:
    x = op.ins[0]
    zero = b.full(0.0, x.shape, x.dtype)
    return (b.select(b.compare(x, zero, "GE"), g, b.negate(g)),)


@rule("sine")
def _sine(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (g * b.cosine(op.ins[0]),)


@rule("cosine")
def _cosine(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.negate(g * b.sine(op.ins[0])),)


@rule("compare")
def _compare(b: Builder, op: TapeOp, g: Value) -> Cts:
    return None, None


@rule("select")
def _select(b: Builder, op: TapeOp, g: Value) -> Cts:
    pred = op.ins[0]
    zero = b.full(0.0, g.shape, g.dtype)
    return None, b.select(pred, g, zero), b.select(pred, zero, g)


@rule("convert")
def _convert(b: Builder, op: TapeOp, g: Value) -> Cts:
    x = op.ins[0]
    return (b.convert(g, x.dtype) if x.dtype in FLOAT_DTYPES else None,)


@rule("optimization_barrier")
def _optimization_barrier(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (g,)


# ----------------------------------------------------------------- shape
@rule("broadcast_in_dim")
def _broadcast_in_dim(b: Builder, op: TapeOp, g: Value) -> Cts:
    x = op.ins[0]
    dims = op.attrs["dims"]
    summed = [d for d in range(g.type.rank) if d not in dims]
    summed += [d for i, d in enumerate(dims) if x.shape[i] == 1 and g.shape[d] != 1]
    if not summed:
        return (b.reshape(g, x.shape),)
    blocked = strategy.chosen("sums", b.target) == "blocked"
    return (b.reshape(b.blocked_sum(g, summed) if blocked else b.sum(g, sorted(summed)), x.shape),)


@rule("reshape")
def _reshape(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.reshape(g, op.ins[0].shape),)


@rule("transpose")
def _transpose(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.transpose(g, list(np.argsort(op.attrs["perm"]))),)


@rule("reverse")
def _reverse(b: Builder, op: TapeOp, g: Value) -> Cts:
    return (b.reverse(g, op.attrs["dims"]),)


@rule("pad")
def _pad(b: Builder, op: TapeOp, g: Value) -> Cts:
    lo, hi, it = op.attrs["low"], op.attrs["high"], op.attrs["interior"]
    if min(lo) < 0 or min(hi) < 0:
        raise UnsupportedSpec("the VJP of a negative pad is not implemented; pad with non-negative amounts")
    limit = [g.shape[d] - hi[d] for d in range(g.type.rank)]
    return (b.slice(g, lo, limit, [i + 1 for i in it]),)


@rule("slice")
def _slice(b: Builder, op: TapeOp, g: Value) -> Cts:
    x = op.ins[0]
    start, strides = op.attrs["start"], op.attrs["strides"]
    high = [n - 1 - (s + (m - 1) * st) for n, s, m, st in zip(x.shape, start, g.shape, strides, strict=True)]
    return (b.pad(g, start, high, [st - 1 for st in strides]),)


@rule("concatenate")
def _concatenate(b: Builder, op: TapeOp, g: Value) -> Cts:
    d = op.attrs["dim"]
    cts, off = [], 0
    for x in op.ins:
        start = [0] * g.type.rank
        limit = list(g.shape)
        start[d], limit[d] = off, off + x.shape[d]
        cts.append(b.slice(g, start, limit))
        off += x.shape[d]
    return cts


@rule("dynamic_slice")
def _dynamic_slice(b: Builder, op: TapeOp, g: Value) -> Cts:
    x, *starts = op.ins
    return (b.dynamic_update_slice(b.full(0.0, x.shape, x.dtype), g, starts), *[None] * len(starts))


@rule("dynamic_update_slice")
def _dynamic_update_slice(b: Builder, op: TapeOp, g: Value) -> Cts:
    x, upd, *starts = op.ins
    gx = b.dynamic_update_slice(g, b.full(0.0, upd.shape, upd.dtype), starts)
    return (gx, b.dynamic_slice(g, starts, upd.shape), *[None] * len(starts))


@rule("gather")
def _gather(b: Builder, op: TapeOp, g: Value) -> Cts:
    # The rows gathered go back where they came from, duplicates summed: a scatter-add into zeros.
    x, idx = op.ins
    a = op.attrs
    gx = b.scatter_add(b.full(0.0, x.shape, x.dtype), idx, g, update_window_dims=a["offset_dims"],
                       inserted_window_dims=a["collapsed_slice_dims"],
                       scatter_dims_to_operand_dims=a["start_index_map"], index_vector_dim=a["index_vector_dim"])
    return gx, None


@rule("scatter_add")
def _scatter_add(b: Builder, op: TapeOp, g: Value) -> Cts:
    x, idx, upd = op.ins
    a = op.attrs
    window = iter(a["update_window_dims"])
    sizes = [1 if d in a["inserted_window_dims"] else upd.shape[next(window)] for d in range(x.type.rank)]
    gu = b.gather(g, idx, offset_dims=a["update_window_dims"], collapsed_slice_dims=a["inserted_window_dims"],
                  start_index_map=a["scatter_dims_to_operand_dims"], index_vector_dim=a["index_vector_dim"],
                  slice_sizes=sizes)
    return g, None, gu


# ----------------------------------------------------------------- contraction
def _ranges_like(*xs: Sequence[int]) -> list[list[int]]:
    out, start = [], 0
    for x in xs:
        out.append(list(range(start, start + len(x))))
        start += len(x)
    return out


def _dot_transpose_lhs(b: Builder, g: Value, x: Value, y: Value, contract: tuple[Sequence[int], Sequence[int]],
                       batch: tuple[Sequence[int], Sequence[int]], swap_ans: bool = False) -> Value:
    (xc, yc), (xb, yb) = contract, batch
    x_kept = [d for d in range(x.type.rank) if d not in xc and d not in xb]
    y_kept = [d for d in range(y.type.rank) if d not in yc and d not in yb]
    if swap_ans:
        ans_batch, ans_y, _ = _ranges_like(xb, y_kept, x_kept)
    else:
        ans_batch, _, ans_y = _ranges_like(xb, x_kept, y_kept)
    xc_by_y = [xc[i] for i in np.argsort(yc)]
    # dot(g, y) yields x's dims as [batch, kept, contracted]; dot(y, g) as [batch, contracted, kept].
    # Emit the order that needs no transpose when there is one: a weight gradient (x = W, contracted
    # over the batch rows) then comes out in W's layout, which IREE runs ~2× faster on an MLP.
    perm = list(np.argsort(list(xb) + x_kept + xc_by_y))
    swapped = list(np.argsort(list(xb) + xc_by_y + x_kept))
    if perm != sorted(perm) and swapped == sorted(swapped):
        return b.dot_general(y, g, (y_kept, ans_y), (list(yb), ans_batch))
    return b.transpose(b.dot_general(g, y, (ans_y, y_kept), (ans_batch, list(yb))), perm)


@rule("dot_general")
def _dot_general(b: Builder, op: TapeOp, g: Value) -> Cts:
    x, y = op.ins
    (xc, yc), (xb, yb) = op.attrs["contract"], op.attrs["batch"]
    gx = _dot_transpose_lhs(b, g, x, y, (xc, yc), (xb, yb))
    gy = _dot_transpose_lhs(b, g, y, x, (yc, xc), (yb, xb), swap_ans=True)
    return gx, gy


def _dilate(shape: Sequence[int], dil: Sequence[int]) -> list[int]:
    return [0 if n == 0 else 1 + d * (n - 1) for n, d in zip(shape, dil, strict=True)]


def _spec_t(spec: tuple[int, ...]) -> tuple[int, ...]:
    return (spec[1], spec[0], *spec[2:])


def _split_axis(b: Builder, x: Value, src: int, size: int) -> Value:
    shape = list(x.shape)
    shape[src:src + 1] = [size, shape[src] // size]
    return b.reshape(x, shape)


def _merge_axis_into(b: Builder, x: Value, src: int, dst: int) -> Value:
    perm = [i for i in range(x.type.rank) if i != src]
    perm.insert(dst, src)
    shape = [n for i, n in enumerate(x.shape) if i != src]
    shape[dst] *= x.shape[src]
    return b.reshape(b.transpose(x, perm), shape)


@rule("convolution")
def _convolution(b: Builder, op: TapeOp, g: Value) -> Cts:
    x, w = op.ins
    if op.attrs["batch_groups"] != 1:
        raise UnsupportedSpec("the VJP of a batch-grouped convolution is not implemented")
    return conv_input_grad(b, g, w, x.shape, op.attrs), conv_kernel_grad(b, x, g, w.shape, op.attrs)


def conv_input_grad(b: Builder, g: Value, w: Value, x_shape: Sequence[int], attrs: Mapping[str, Any]) -> Value:
    """∂x of a convolution (`attrs` as `Builder.convolution` records them): g, dilated by the
    stride, convolved with the spatially flipped, in/out-swapped kernel."""
    ls, rs, os_ = attrs["spec"]
    padding, groups = attrs["padding"], attrs["feature_groups"]
    wk = w
    if groups > 1:
        wk = _merge_axis_into(b, _split_axis(b, w, rs[0], groups), rs[0], rs[1])
    lhs_d = _dilate([x_shape[d] for d in ls[2:]], attrs["lhs_dilation"])
    rhs_d = _dilate([w.shape[d] for d in rs[2:]], attrs["rhs_dilation"])
    out_d = _dilate([g.shape[d] for d in os_[2:]], attrs["strides"])
    before = [k - p[0] - 1 for k, p in zip(rhs_d, padding, strict=True)]
    after = [n + k - 1 - o - bf for n, k, o, bf in zip(lhs_d, rhs_d, out_d, before, strict=True)]
    return b.convolution(g, b.reverse(wk, list(rs[2:])), strides=attrs["lhs_dilation"],
                         padding=list(zip(before, after, strict=True)), lhs_dilation=attrs["strides"],
                         rhs_dilation=attrs["rhs_dilation"], feature_groups=groups, spec=(os_, _spec_t(rs), ls))


def conv_kernel_grad(b: Builder, x: Value, g: Value, w_shape: Sequence[int], attrs: Mapping[str, Any]) -> Value:
    """∂w of a convolution: x correlated with g (the feature groups become batch groups)."""
    ls, rs, os_ = attrs["spec"]
    padding = attrs["padding"]
    lhs_d = _dilate([x.shape[d] for d in ls[2:]], attrs["lhs_dilation"])
    rhs_d = _dilate([w_shape[d] for d in rs[2:]], attrs["rhs_dilation"])
    out_d = _dilate([g.shape[d] for d in os_[2:]], attrs["strides"])
    hi = [o - n + (k - p[0] - 1) for o, n, k, p in zip(out_d, lhs_d, rhs_d, padding, strict=True)]
    pads = [(p[0], h) for p, h in zip(padding, hi, strict=True)]
    return b.convolution(x, g, strides=attrs["rhs_dilation"], padding=pads, lhs_dilation=attrs["lhs_dilation"],
                         rhs_dilation=attrs["strides"],
                         batch_groups=attrs["feature_groups"], spec=(_spec_t(ls), _spec_t(os_), _spec_t(rs)))


# ----------------------------------------------------------------- reduction
@rule("reduce_sum")
def _reduce_sum(b: Builder, op: TapeOp, g: Value) -> Cts:
    x = op.ins[0]
    kept = [d for d in range(x.type.rank) if d not in op.attrs["dims"]]
    return (b.broadcast_in_dim(g, x.shape, kept),)


def _reduce_extremum(b: Builder, op: TapeOp, g: Value) -> Cts:
    # Every position equal to the extremum receives the cotangent (ties have measure zero).
    x, y = op.ins[0], op.outs[0]
    kept = [d for d in range(x.type.rank) if d not in op.attrs["dims"]]
    hit = b.compare(x, b.broadcast_in_dim(y, x.shape, kept), "EQ")
    return (b.select(hit, b.broadcast_in_dim(g, x.shape, kept), b.full(0.0, x.shape, x.dtype)),)


VJP["reduce_max"] = _reduce_extremum
VJP["reduce_min"] = _reduce_extremum


def _window_offsets(window: Sequence[int]) -> list[tuple[int, ...]]:
    """Every position inside a window, in row-major order (the order ties are broken in)."""
    return list(itertools.product(*(range(w) for w in window)))


def _window_slice(b: Builder, xp: Value, offset: Sequence[int], strides: Sequence[int],
                  out_shape: Sequence[int]) -> Value:
    """The element at `offset` of every window of the (padded) xp: one strided slice, out-shaped."""
    limit = [o + (m - 1) * s + 1 for o, m, s in zip(offset, out_shape, strides, strict=True)]
    return b.slice(xp, offset, limit, strides)


def _scatter_windows(b: Builder, parts: Sequence[Value], x: Value, window: Sequence[int], strides: Sequence[int],
                     padding: Sequence[tuple[int, int]]) -> Value:
    """x's cotangent from one out-shaped cotangent per window offset (`_window_offsets` order): each
    part goes back to the positions its offset read. Windows that tile (window = stride) interleave
    the parts with one reshape; overlapping ones add one strided pad per part."""
    out, rank = parts[0].shape, x.type.rank
    padded = [n + lo + hi for n, (lo, hi) in zip(x.shape, padding, strict=True)]
    if list(window) == list(strides):
        wdims = [d for d in range(rank) if window[d] > 1]
        stacked = b.concatenate([b.reshape(p, (*out, 1)) for p in parts], rank)
        stacked = b.reshape(stacked, (*out, *(window[d] for d in wdims)))
        perm = [i for d in range(rank) for i in ([d, rank + wdims.index(d)] if d in wdims else [d])]
        tiled = b.reshape(b.transpose(stacked, perm), [m * w for m, w in zip(out, window, strict=True)])
        # the last rows of a padded x that no window reaches get nothing
        gp = b.pad(tiled, [0] * rank, [n - m * w for n, m, w in zip(padded, out, window, strict=True)])
    else:
        gp_: Value | None = None
        for offset, part in zip(_window_offsets(window), parts, strict=True):
            high = [n - o - (m - 1) * s - 1 for n, o, m, s in zip(padded, offset, out, strides, strict=True)]
            spread = b.pad(part, offset, high, [s - 1 for s in strides])
            gp_ = spread if gp_ is None else b.add(gp_, spread)
        assert gp_ is not None
        gp = gp_
    if any(lo or hi for lo, hi in padding):
        gp = b.slice(gp, [lo for lo, _ in padding], [lo + n for (lo, _), n in zip(padding, x.shape, strict=True)])
    return gp


@rule("reduce_window_sum")
def _reduce_window_sum(b: Builder, op: TapeOp, g: Value) -> Cts:
    window = op.attrs["window"]
    return (_scatter_windows(b, [g] * len(_window_offsets(window)), op.ins[0], window, op.attrs["strides"],
                             op.attrs["padding"]),)


def window_extremum_vjp(b: Builder, x: Value, y: Value, g: Value, window: Sequence[int], strides: Sequence[int],
                        padding: Sequence[tuple[int, int]], fill: float) -> Value:
    """x's cotangent for y = the max (or min) of every window of x padded with `fill`, by
    compare/select, no select_and_scatter: walking the window offsets in row-major order, each
    window's cotangent ḡ goes to the FIRST position equal to its extremum (jax's and PyTorch's tie
    rule; a ReLU'd input ties at 0 often). `left` is what each window has not yet given away."""
    xp = b.pad(x, [lo for lo, _ in padding], [hi for _, hi in padding], value=fill) \
        if any(lo or hi for lo, hi in padding) else x
    zero, left, parts = b.full(0.0, g.shape, g.dtype), g, []
    offsets = _window_offsets(window)
    for k, offset in enumerate(offsets):
        hit = b.compare(_window_slice(b, xp, offset, strides, y.shape), y, "EQ")
        parts.append(b.select(hit, left, zero))
        if k + 1 < len(offsets):
            left = b.select(hit, zero, left)
    return _scatter_windows(b, parts, x, window, strides, padding)


def _reduce_window_extremum(b: Builder, op: TapeOp, g: Value) -> Cts:
    fill = -np.inf if op.op == "reduce_window_max" else np.inf
    return (window_extremum_vjp(b, op.ins[0], op.outs[0], g, op.attrs["window"], op.attrs["strides"],
                                op.attrs["padding"], fill),)


VJP["reduce_window_max"] = _reduce_window_extremum
VJP["reduce_window_min"] = _reduce_window_extremum


# ----------------------------------------------------------------- collectives
@rule("all_reduce")
def _all_reduce(b: Builder, op: TapeOp, g: Value) -> Cts:
    # Each replica differentiates its own loss; the sum over replicas of those losses reaches x_r
    # through every replica's copy of the sum, so x_r's cotangent is the sum of the group's.
    return (b.all_reduce([g], op.attrs["replica_groups"])[0],)


@rule("process_sum")
def _process_sum(b: Builder, op: TapeOp, g: Value) -> Cts:
    # as all_reduce's, over processes: each differentiates its own loss, which reaches x through every copy
    return (b.process_sum([g])[0],)


# ----------------------------------------------------------------- control flow
@rule("while")
def _while(b: Builder, op: TapeOp, g: Value) -> Cts:
    raise UnsupportedSpec("stablehlo.while has no VJP rule: emit the loop inside Builder.custom_vjp with its own "
                          "backward (as FlashAttention does)")


# ----------------------------------------------------------------- custom closed forms
@rule("custom")
def _custom(b: Builder, op: TapeOp, g: Value) -> Cts:
    raise AssertionError("custom ops are differentiated through their own bwd")  # pragma: no cover


# ----------------------------------------------------------------- fault injection (for testing the gates)
@contextlib.contextmanager
def inject_fault(op_name: str, factor: float = 1.001) -> Iterator[list[int]]:
    """Make the VJP of `op_name` ("custom" for closed-form backwards) scale every cotangent it
    returns by `factor`: a deliberately wrong backward, so a test can see a gate go red.
    Yields a one-element list counting how often the broken rule ran."""
    calls = [0]
    global _FAULT
    _FAULT = (op_name, factor, calls)
    try:
        yield calls
    finally:
        _FAULT = None


_FAULT: tuple[str, float, list[int]] | None = None


def _maybe_fault(b: Builder, op: TapeOp, cts: Cts) -> Cts:
    if _FAULT is None or _FAULT[0] != op.op:
        return cts
    _FAULT[2][0] += 1
    return [None if c is None else c * _FAULT[1] for c in cts]


# ----------------------------------------------------------------- closed-form backwards
#: a custom op's attrs key: who emitted it (`claim_custom_ops`), named when its bwd returns a wrong cotangent
EMITTED_BY = "emitted_by"


def claim_custom_ops(ops: Sequence[TapeOp], owner: Callable[[], str]) -> None:
    """Record `owner` (called only for a refusal: e.g. "layer 'x' (dist 'y'): layer 2's backward") as the emitter
    of the custom ops in `ops` that no inner emitter claimed first (a layer emitted inside another keeps its own)."""
    for op in ops:
        if op.op == "custom" and EMITTED_BY not in op.attrs:
            op.attrs[EMITTED_BY] = owner


def _custom_cts(b: Builder, op: TapeOp, out_cts: Sequence[Value | None]) -> Cts:
    """The cotangents a custom op's own bwd gives its inputs, refused unless one per input, each None or of
    that input's type: the bwd is a plugin author's code, and a short list would silently freeze an input."""
    assert op.bwd is not None
    full = [c if c is not None else b.full(0.0, o.shape, o.dtype) for c, o in zip(out_cts, op.outs, strict=True)]
    cts = op.bwd(b, *full)
    n = len(op.ins)
    if not isinstance(cts, (list, tuple)):
        got = cts.type if isinstance(cts, Value) else repr(cts)
        raise _refused(op, f"{got}, expected a list of one cotangent per input ({n}; None for no gradient)")
    if len(cts) != n:
        raise _refused(op, f"{len(cts)} cotangent{'s' * (len(cts) != 1)} for its {n} input{'s' * (n != 1)}, "
                           "expected one per input, in order (None for no gradient)")
    for i, (v, c) in enumerate(zip(op.ins, cts, strict=True)):
        if c is None or (isinstance(c, Value) and (c.type == v.type or v.dtype not in FLOAT_DTYPES)):
            continue  # a non-float input gets no gradient: whatever its cotangent, it is dropped
        got = c.type if isinstance(c, Value) else repr(c)
        raise _refused(op, f"{got} for input {i}, expected {v.type} (that input's type) or None")
    return cts


def _refused(op: TapeOp, what: str) -> PluginError:
    owner = op.attrs.get(EMITTED_BY)  # named only now: naming reads the plugins' registry
    return PluginError(f"{owner() if owner else 'a custom op'}: custom_vjp's bwd returned {what}")


# ----------------------------------------------------------------- the walk
def grad(b: Builder, outputs: Sequence[Value], cotangents: Sequence[Value], wrt: Sequence[Value]) -> list[Value]:
    """Emit ∂(Σ⟨outputs, cotangents⟩)/∂wrt into `b`; a `wrt` the outputs do not reach gets zeros."""
    return _walk(b, outputs, cotangents, wrt, None)[0]


def grad_sequenced(b: Builder, outputs: Sequence[Value], cotangents: Sequence[Value], wrt: Sequence[Value],
                   on_final: Callable[[int, Value], Sequence[Value]]) -> tuple[list[Value], dict[int, list[Value]]]:
    """`grad`, calling `on_final(i, ∂wrt[i])` the moment the walk has finished wrt[i]'s gradient. Its
    values (e.g. that parameter's optimizer update) and every cotangent the rest of the walk reads
    pass through one optimization barrier, so the rest of the backward waits for them: the update
    runs while its gradient is hot, and the gradient's buffer is free for the rest. Returns the
    gradients and, per i, the hook's values as they come out of the barrier (a wrt the outputs do
    not reach is never finished: the caller handles it from the zero gradient)."""
    return _walk(b, outputs, cotangents, wrt, on_final)


def _walk(b: Builder, outputs: Sequence[Value], cotangents: Sequence[Value], wrt: Sequence[Value],
          on_final: Callable[[int, Value], Sequence[Value]] | None) -> tuple[list[Value], dict[int, list[Value]]]:
    cts: dict[int, Value] = {}

    def accumulate(v: Value, c: Value | None) -> None:
        if c is None or v.dtype not in FLOAT_DTYPES:
            return
        if c.shape != v.shape:
            raise AssertionError(f"VJP produced cotangent {c.type} for {v.type}")
        prev = cts.get(id(v))
        cts[id(v)] = c if prev is None else b.add(prev, c)

    for o, c in zip(outputs, cotangents, strict=True):
        accumulate(o, c)
    tape = list(b.tape)  # the backward's own ops are appended as we go; walk only the forward's
    index = {id(w): i for i, w in enumerate(wrt)}
    uses: dict[int, int] = {}  # how many forward ops not yet walked read each wrt
    for op in tape:
        for v in op.ins:
            if id(v) in index:
                uses[id(v)] = uses.get(id(v), 0) + 1
    unwalked = {id(o) for op in tape for o in op.outs}  # values whose producer the walk has not reached
    finished: dict[int, list[Value]] = {}
    for op in reversed(tape):
        for o in op.outs:
            unwalked.discard(id(o))
        out_cts = [cts.get(id(o)) for o in op.outs]
        if all(c is None for c in out_cts):
            in_cts: Cts = ()
        elif op.op == "custom":
            in_cts = _custom_cts(b, op, out_cts)
        elif len(op.outs) != 1:  # a multi-result op (while): its rule sees the first cotangent given
            in_cts = VJP[op.op](b, op, next(c for c in out_cts if c is not None))
        else:
            (g,) = out_cts
            assert g is not None
            in_cts = VJP[op.op](b, op, g)
        if in_cts:
            in_cts = _maybe_fault(b, op, in_cts)
            for v, ct in zip(op.ins, in_cts, strict=True):
                accumulate(v, ct)
        for v in op.ins:
            if id(v) not in index:
                continue
            uses[id(v)] -= 1
            if on_final is None or uses[id(v)] or id(v) not in cts or index[id(v)] in finished:
                continue
            hooked = list(on_final(index[id(v)], cts[id(v)]))
            # What the rest of the walk reads: cotangents of values not yet walked, and unfinished gradients.
            live = [k for k in cts if k in unwalked or uses.get(k, 0) > 0]
            through = b.optimization_barriers([*hooked, *(cts[k] for k in live)])
            finished[index[id(v)]] = through[:len(hooked)]
            for k, c in zip(live, through[len(hooked):], strict=True):
                cts[k] = c
    return [cts.get(id(w)) or b.full(0.0, w.shape, w.dtype) for w in wrt], finished
