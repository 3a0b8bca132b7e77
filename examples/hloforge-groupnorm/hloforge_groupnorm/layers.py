"""GroupNorm on NCHW images: y = γ·(x − μ_g)/√(σ²_g + ε) + β, per example and channel group.

The forward is plain builder ops (reshape, sums, rsqrt, broadcasts), so hloforge derives
the backward from them; nothing here is differentiated by hand. `reference` is the same
map written independently in jax.numpy: the gate's oracle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape

HLOFORGE_PLUGIN_API = 1  # the hloforge plugin API this module is written for (hloforge.PLUGIN_API_VERSION)


@attrs.frozen
class GroupNorm(Layer):
    kind = "groupNorm"
    groups: int = 32
    eps: float = 1e-5

    def out_shape(self, in_shape: Shape) -> Shape:
        # Every refusal lives here: the shape walk calls it before any forward is emitted.
        if len(in_shape) != 3:
            raise UnsupportedSpec(f"groupNorm takes an image [C, H, W], got {list(in_shape)}")
        if self.groups <= 0 or in_shape[0] % self.groups:
            raise UnsupportedSpec(f"groups={self.groups} must be positive and divide the {in_shape[0]} channels")
        if not self.eps > 0:
            raise UnsupportedSpec(f"eps must be positive, got {self.eps}")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        c = in_shape[0]
        return (ParamSlot("gamma", (c,), "ones", False), ParamSlot("beta", (c,), "zeros", False))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        n, c, h, w = x.shape
        g = self.groups
        m = (c // g) * h * w  # elements per statistic
        xg = b.reshape(x, (n, g, m))
        mean = b.sum(xg, [2]) / float(m)
        xc = xg - b.broadcast_in_dim(mean, xg.shape, [0, 1])
        var = b.sum(xc * xc, [2]) / float(m)
        xhat = b.reshape(xc * b.broadcast_in_dim(b.rsqrt(var + self.eps), xg.shape, [0, 1]), x.shape)
        return xhat * b.broadcast_in_dim(params["gamma"], x.shape, [1]) + \
            b.broadcast_in_dim(params["beta"], x.shape, [1])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        n, c, h, w = x.shape
        xg = x.reshape(n, self.groups, c // self.groups, h, w)
        mean = jnp.mean(xg, axis=(2, 3, 4), keepdims=True)
        var = jnp.var(xg, axis=(2, 3, 4), keepdims=True)
        y = ((xg - mean) / jnp.sqrt(var + self.eps)).reshape(n, c, h, w)
        return y * params["gamma"][None, :, None, None] + params["beta"][None, :, None, None]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        # Two channels per group; one group (layer norm over C×H×W); a group per channel (instance norm).
        return [(cls(groups=2), (4, 3, 3)), (cls(groups=1, eps=1e-3), (3, 2, 4)), (cls(groups=3), (3, 2, 2))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [GroupNorm]
