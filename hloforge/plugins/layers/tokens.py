"""Token inputs: `tokenPositionEmbed`, ids [T] → token embedding + learned position [T, D].

The ids arrive as the net's float input (the session's inputs are f32; ids below 2²⁴ are exact),
are clamped to [0, vocab − 1] and converted to i32, and index the [vocab, D] table with a real
`stablehlo.gather` — no [B, T, vocab] one-hot. Its backward is the gather rule's scatter-add
(duplicate ids sum); the ids get no cotangent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape


def embed_rows(b: Builder, table: Value, ids: Value) -> Value:
    """table[ids]: [V, D] gathered by i32 ids [B, T] → [B, T, D]."""
    bsz, t = ids.shape
    return b.gather(table, b.reshape(ids, (bsz, t, 1)), offset_dims=[2], collapsed_slice_dims=[0],
                    start_index_map=[0], index_vector_dim=2, slice_sizes=[1, table.shape[1]])


@attrs.frozen
class TokenPositionEmbed(Layer):
    kind = "tokenPositionEmbed"
    vocab: int
    dim: int
    positions: bool = True

    def out_shape(self, in_shape: Shape) -> Shape:
        if len(in_shape) != 1:
            raise UnsupportedSpec(f"tokenPositionEmbed takes token ids [T], got {list(in_shape)}")
        if self.vocab <= 0 or self.dim <= 0:
            raise UnsupportedSpec(f"vocab and dim must be positive, got vocab={self.vocab} dim={self.dim}")
        if self.vocab >= 2 ** 24:
            raise UnsupportedSpec(f"vocab {self.vocab} is too large for exact f32 ids (< 2^24)")
        return (in_shape[0], self.dim)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        tok = ParamSlot("tok", (self.vocab, self.dim), "glorot", True)
        return (tok, ParamSlot("pos", (in_shape[0], self.dim), "glorot", False)) if self.positions else (tok,)

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        ids = b.convert(b.clip(x, 0.0, float(self.vocab - 1)), "i32")
        e = embed_rows(b, params["tok"], ids)
        if self.positions:
            e = e + b.broadcast_in_dim(params["pos"], e.shape, [1, 2])
        return e

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        ids = jnp.clip(x, 0, self.vocab - 1).astype(jnp.int32)
        e = jnp.take(params["tok"], ids, axis=0)
        return e + params["pos"] if self.positions else e

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(3, 4), (5,)), (cls(4, 2, positions=False), (3,))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [TokenPositionEmbed]
