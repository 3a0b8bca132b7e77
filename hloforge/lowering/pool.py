"""The forms of max pooling, as the strategy kind "maxPool" picks for the module's target:

- "slices": the max of k² strided slices folded with `maximum`; autodiff's backward of that chain
  (a compare and two selects per fold, every tie to the earlier slice).
- "select": the same forward, with a written-out backward (a `Builder.custom_vjp`): per window
  offset a compare of its slice with the max and a select (autodiff.window_extremum_vjp), the
  parts interleaved back by one reshape when the windows tile — no select_and_scatter, and none
  of the k² full-size pads the slices' own VJPs add up.
- "window": one stablehlo.reduce_window max, differentiated by the builder's rule for it (the same
  compare/select backward).

All three send a window's cotangent to the FIRST position (row-major in the window) equal to its max.
"""

from __future__ import annotations

import itertools

from hloforge.core import strategy
from hloforge.core.autodiff import window_extremum_vjp
from hloforge.core.hlo import Builder, Value
from hloforge.core.strategy import StrategyKind

MAX_POOL = StrategyKind("maxPool", ("slices", "select", "window"),
                        "max pooling as k² strided slices folded with maximum, differentiated by autodiff "
                        "or by compare/select; or one reduce_window (see lowering/pool.py)")


def max_pool(b: Builder, x: Value, window: list[int], strides: list[int], edges: list[tuple[int, int]]) -> Value:
    """The max over `window` (strides, edge padding per axis) of x, in the "maxPool" form."""
    form = strategy.chosen("maxPool", b.target)
    if form == "window":
        return b.reduce_window(x, window, strides, edges, "max")
    if form == "select":
        def bwd(b: Builder, g: Value) -> list[Value]:
            return [window_extremum_vjp(b, x, y, g, window, strides, edges, -float("inf"))]

        (y,) = b.custom_vjp(lambda x: [slices_max(b, x, edges, window, strides)], bwd, x)
        return y
    return slices_max(b, x, edges, window, strides)


def slices_max(b: Builder, x: Value, edges: list[tuple[int, int]], window: list[int],
               strides: list[int]) -> Value:
    """The max of the k² strided slices of x padded with −inf, folded in row-major window order
    (`maximum`'s VJP sends a tie to its first operand: the earlier slice)."""
    if any(lo or hi for lo, hi in edges):
        x = b.pad(x, [lo for lo, _ in edges], [hi for _, hi in edges], value=-float("inf"))
    out_shape = [(n - w) // s + 1 for n, w, s in zip(x.shape, window, strides, strict=True)]
    out = None
    for offset in itertools.product(*(range(w) for w in window)):
        limit = [o + (m - 1) * s + 1 for o, m, s in zip(offset, out_shape, strides, strict=True)]
        v = b.slice(x, list(offset), limit, strides)
        out = v if out is None else b.maximum(out, v)
    assert out is not None
    return out
