"""A weight's product with tokens [..., N, D] (the dense layer's and MHSA's projections) and its forms.

The strategy kind "tokenProduct" picks the form:

- "tokens": one dot_general over the last axis of the tokens.
- "rows": the same product of the rows [B·N, D], reshaped around it. On the 3-D form XLA's CPU
  compiler feeds the weight's gradient Xᵀ·Ḡ a transposed copy of X that its loop emitter gathers
  element by element; on rows it takes the transposed product itself. IREE runs the 3-D form faster.
  (vit-cifar's step: benchmarks/NOTES.md.)
"""

from __future__ import annotations

import math

from hloforge.core import strategy
from hloforge.core.hlo import Builder, Value
from hloforge.core.strategy import StrategyKind

TOKEN_PRODUCT = StrategyKind("tokenProduct", ("tokens", "rows"),
                             "a weight's product with tokens [B, N, D] (dense, MHSA's projections): one product "
                             "over their last axis, or the product of the B·N rows (see lowering/dense.py)")


def token_product(b: Builder, x: Value, w: Value) -> Value:
    """x [..., D] · w [D, U] → [..., U], in the form "tokenProduct" picks where x has more than one
    leading axis."""
    lead = x.shape[:-1]
    if len(lead) < 2 or strategy.chosen(TOKEN_PRODUCT.name, b.target) == "tokens":
        return b.dot_general(x, w, ([len(lead)], [0]))
    y = b.dot_general(b.reshape(x, (math.prod(lead), x.shape[-1])), w, ([1], [0]))
    return b.reshape(y, (*lead, w.shape[1]))
