"""What float32 holds: the programs take their scalars (lr, decays, clip norm, a layer's eps, ...) as f32, so a
nonzero value below its smallest normal is 0 there or a subnormal flushed to 0 (lr 1e-50 trains nothing), and
one above its max is inf."""

from __future__ import annotations

F32_MAX = 3.4028234663852886e38
F32_TINY = 1.1754943508222875e-38  # 2**-126
F32_RANGE = "1.2e-38 to 3.4e38 in size"


def f32_holds(v: float) -> bool:
    """Whether f32 holds `v` as the number it is: 0, or a normal f32 (NaN and ±inf: no)."""
    return v == 0 or F32_TINY <= abs(v) <= F32_MAX
