"""`pairTile`: per-residue features [2·L·D] → a pair map [C (+p), L, L] (seed 001).

The flat host row is residue block i then residue block j, each [L, D], optionally followed by
p pair planes [p, L, L]. The forward, shared by the eval and train modules:

  x[:, :2LD] → [B, 2L, D], split into i = [B, L, D] and j = [B, L, D];
  u = i·W, v = j·Wj ([B, L, C] each; W, Wj [D, C], no bias: the convBn after it has β);
  t[b, r, s, c] = u[b, r, c] + v[b, s, c]  ([B, L, L, C]), transposed to NCHW [B, C, L, L];
  with p > 0, x[:, 2LD:] → [B, p, L, L] concatenated as the map's last p channels.

W and Wj are dense projections: Glorot (seed 003's rank-2 rule). The backward is derived.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape


@attrs.frozen
class PairTile(Layer):
    kind = "pairTile"
    L: int  # residues
    D: int  # features per residue
    C: int  # channels of the tiled projection (the map has C + p)
    p: int = 0  # pair planes in the row's tail

    @property
    def row(self) -> int:
        """The host row's length: 2·L·D feature values, then p·L·L pair-plane values."""
        return 2 * self.L * self.D + self.p * self.L * self.L

    def out_shape(self, in_shape: Shape) -> Shape:
        for name in ("L", "D", "C"):
            if getattr(self, name) <= 0:
                raise UnsupportedSpec(f"pairTile {name} must be positive, got {getattr(self, name)}")
        if self.p < 0:
            raise UnsupportedSpec(f"pairTile p (pair planes) must be ≥ 0, got {self.p}")
        if tuple(in_shape) != (self.row,):
            tail = f" + p·L·L = {self.p * self.L * self.L}" if self.p else ""
            raise UnsupportedSpec(f"pairTile(L={self.L}, D={self.D}, p={self.p}) takes a flat row of "
                                  f"2·L·D = {2 * self.L * self.D}{tail} = {self.row} values, got {list(in_shape)}")
        return (self.C + self.p, self.L, self.L)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return (ParamSlot("w", (self.D, self.C), "glorot", True), ParamSlot("wj", (self.D, self.C), "glorot", True))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        n, L, D, C = x.shape[0], self.L, self.D, self.C
        head = x if self.p == 0 else b.slice(x, [0, 0], [n, 2 * L * D])
        blocks = b.reshape(head, (n, 2 * L, D))
        xi = b.slice(blocks, [0, 0, 0], [n, L, D])
        xj = b.slice(blocks, [0, L, 0], [n, 2 * L, D])
        u = b.dot_general(xi, params["w"], ([2], [0]))  # [B, L, C]
        v = b.dot_general(xj, params["wj"], ([2], [0]))
        tiled = (n, L, L, C)
        t = b.broadcast_in_dim(u, tiled, [0, 1, 3]) + b.broadcast_in_dim(v, tiled, [0, 2, 3])
        y = b.transpose(t, [0, 3, 1, 2])  # NCHW [B, C, L, L]
        if self.p == 0:
            return y
        planes = b.reshape(b.slice(x, [0, 2 * L * D], [n, self.row]), (n, self.p, L, L))
        return b.concatenate([y, planes], 1)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        n, L, D = x.shape[0], self.L, self.D
        feats = x[:, :L * D * 2].reshape(n, 2, L, D)
        u = jnp.einsum("brd,dc->bcr", feats[:, 0], params["w"])
        v = jnp.einsum("bsd,dc->bcs", feats[:, 1], params["wj"])
        y = u[:, :, :, None] + v[:, :, None, :]
        if not self.p:
            return y
        return jnp.concatenate([y, x[:, L * D * 2:].reshape(n, self.p, L, L)], axis=1)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        cases = [cls(3, 2, 4), cls(3, 4, 2, p=2), cls(2, 3, 5, p=1)]
        return [(c, (c.row,)) for c in cases]


@hookimpl
def hloforge_layers() -> list[type]:
    return [PairTile]
