"""timeCondAdd: the DDPM timestep embedding, added to a feature map (seed 001).

A DDPM net's input carries the per-image timestep in its last channel: the host fills that
plane with s = t / T (see `hloforge.train.diffusion.with_time_channel`). The layer reads s from
pixel (0, 0) of that channel of the *net's* input (`Ctx.net_input`; the layer's own input
when it runs alone), builds the 2·nfreq features [sin(π·2^k·s)…, cos(π·2^k·s)…] for
k = 0 … nfreq−1 in-graph, projects them with a learned dense w [2·nfreq, C] + b [C], and adds
the result to every pixel of its [C, H, W] input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
from hloforge.plugins.layers.compose import image
from hloforge.plugins.layers.conv import Conv2d


def frequencies(nfreq: int) -> np.ndarray:
    return np.pi * 2.0 ** np.arange(nfreq)


@attrs.frozen
class TimeCondAdd(Layer):
    kind = "timeCondAdd"
    nfreq: int = 4

    def out_shape(self, in_shape: Shape) -> Shape:
        image(in_shape, self.kind)
        if self.nfreq <= 0:
            raise UnsupportedSpec(f"nfreq must be positive, got {self.nfreq}")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return (ParamSlot("w", (2 * self.nfreq, in_shape[0]), "glorot", True),
                ParamSlot("b", (in_shape[0],), "zeros", False))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        src = ctx.net_input if ctx.net_input is not None else x
        if src.type.rank != 4:
            raise UnsupportedSpec(f"timeCondAdd reads the timestep from an image input [C, H, W] (its last "
                                  f"channel); the net's input is {list(src.shape[1:])}")
        n, c_in = src.shape[0], src.shape[1]
        s = b.reshape(b.slice(src, [0, c_in - 1, 0, 0], [n, c_in, 1, 1]), (n,))
        angle = b.broadcast_in_dim(s, (n, self.nfreq), [0]) * \
            b.broadcast_in_dim(b.constant(frequencies(self.nfreq), x.dtype), (n, self.nfreq), [1])
        emb = b.concatenate([b.sine(angle), b.cosine(angle)], 1)
        proj = b.dot_general(emb, params["w"], ([1], [0])) + b.broadcast_in_dim(params["b"], (n, x.shape[1]), [1])
        return x + b.broadcast_in_dim(proj, x.shape, [0, 1])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        src = ctx.net_input if ctx is not None and ctx.net_input is not None else x
        angle = src[:, -1, 0, 0][:, None] * jnp.asarray(frequencies(self.nfreq))[None, :]
        emb = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=1)
        return x + (emb @ params["w"] + params["b"])[:, :, None, None]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        from hloforge.plugins.layers.unet import SkipChain

        # alone (the time channel is its own input's last), and behind a conv (read from the net's input)
        return [(cls(nfreq=3), (4, 3, 3)), (SkipChain((Conv2d(5, k=3), cls(nfreq=2)), cls.kind), (3, 4, 4))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [TimeCondAdd]
