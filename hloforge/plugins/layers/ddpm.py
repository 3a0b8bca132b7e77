"""timeCondAdd: the DDPM timestep embedding, added to a feature map (seed 001); timeResBlock:
a residual block with that embedding inside; noiseHead: the noise predictor's output conv.

A DDPM net's input carries the per-image timestep in its last channel: the host fills that
plane with s = t / T (see `hloforge.train.diffusion.with_time_channel`). The layer reads s from
pixel (0, 0) of that channel of the *net's* input (`Ctx.net_input`; the layer's own input
when it runs alone), builds the 2·nfreq features [sin(π·2^k·s)…, cos(π·2^k·s)…] for
k = 0 … nfreq−1 in-graph, projects them with a learned dense w [2·nfreq, C] + b [C], and adds
the result to every pixel of its [C, H, W] input.

timeResBlock(out) is the residual block of Ho et al.'s noise predictor without its GroupNorm:

    h = conv1(swish(x)) + timeCondAdd;  y = skip(x) + conv2(swish(h))

conv1 and conv2 3×3 "same" with bias, skip the identity when x has `out` channels and a 1×1
conv otherwise. conv2 starts at zero (Goyal et al.'s zero-initialised residual branch), so a
stack of blocks starts as its skips and trains stably with no normalisation: no batch
statistics, so eval, EMA shadows and sampling see the very function that trained.

noiseHead(out): swish → 3×3 conv to the `out` image channels, the conv starting at zero — the
predictor starts at ε̂ = 0 (loss 1) rather than at a fan-out-initialised conv from many channels
to three, whose output starts tens of times the noise's scale.
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
from hloforge.plugins.layers.activation import emit_act, reference_act
from hloforge.plugins.layers.compose import image
from hloforge.plugins.layers.conv import Conv2d


def frequencies(nfreq: int) -> np.ndarray:
    return np.pi * 2.0 ** np.arange(nfreq)


@attrs.frozen
class TimeCondAdd(Layer):
    kind = "timeCondAdd"
    time_conditioned = True  # reads the time channel: a net with one is a DDPM's (train/diffusion.py)
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


ACT = "swish"


@attrs.frozen
class TimeResBlock(Layer):
    kind = "timeResBlock"
    time_conditioned = True  # reads the time channel: a net with one is a DDPM's (train/diffusion.py)
    out: int
    nfreq: int = 4

    def _parts(self, in_shape: Shape) -> tuple[Conv2d, TimeCondAdd, Conv2d, Conv2d | None]:
        if self.out <= 0:
            raise UnsupportedSpec(f"out must be positive, got {self.out}")
        skip = None if in_shape[0] == self.out else Conv2d(self.out, k=1)
        return Conv2d(self.out, k=3), TimeCondAdd(self.nfreq), Conv2d(self.out, k=3), skip

    def out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = image(in_shape, self.kind)
        TimeCondAdd(self.nfreq).out_shape((self.out, h, w))
        self._parts(in_shape)
        return (self.out, h, w)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        conv1, time, conv2, skip = self._parts(in_shape)
        mid = (self.out, *in_shape[1:])
        slots = [attrs.evolve(s, name=f"conv1.{s.name}") for s in conv1.param_slots(in_shape)]
        slots += [attrs.evolve(s, name=f"time.{s.name}") for s in time.param_slots(mid)]
        slots += [attrs.evolve(s, name=f"conv2.{s.name}", init="zeros" if s.name == "w" else s.init)
                  for s in conv2.param_slots(mid)]
        if skip is not None:
            slots += [attrs.evolve(s, name=f"skip.{s.name}") for s in skip.param_slots(in_shape)]
        return tuple(slots)

    @staticmethod
    def _own(params: Mapping[str, Any], part: str) -> dict[str, Any]:
        return {k.removeprefix(f"{part}."): v for k, v in params.items() if k.startswith(f"{part}.")}

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        conv1, time, conv2, skip = self._parts(tuple(x.shape[1:]))
        # the time channel is the net's input's, or this block's own input's when it runs alone
        tctx = attrs.evolve(ctx, net_input=ctx.net_input if ctx.net_input is not None else x)
        h = conv1.forward(b, emit_act(b, ACT, x), self._own(params, "conv1"), ctx)
        h = time.forward(b, h, self._own(params, "time"), tctx)
        h = conv2.forward(b, emit_act(b, ACT, h), self._own(params, "conv2"), ctx)
        return h + (x if skip is None else skip.forward(b, x, self._own(params, "skip"), ctx))

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        conv1, time, conv2, skip = self._parts(tuple(x.shape[1:]))
        src = ctx.net_input if ctx is not None and ctx.net_input is not None else x
        h = conv1.reference(self._own(params, "conv1"), reference_act(ACT, x), Ctx())
        h = time.reference(self._own(params, "time"), h, Ctx(net_input=src))
        h = conv2.reference(self._own(params, "conv2"), reference_act(ACT, h), Ctx())
        return h + (x if skip is None else skip.reference(self._own(params, "skip"), x, Ctx()))

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        from hloforge.plugins.layers.unet import SkipChain

        # alone with a 1×1 skip (4 → 3 channels), and behind a conv with the identity skip (the
        # time plane then read from the net's input, not the block's)
        return [(cls(3, nfreq=2), (4, 4, 4)), (SkipChain((Conv2d(3, k=1), cls(3, nfreq=3)), cls.kind), (3, 4, 3))]


@attrs.frozen
class NoiseHead(Layer):
    kind = "noiseHead"
    out: int

    def _conv(self) -> Conv2d:
        return Conv2d(self.out, k=3)

    def out_shape(self, in_shape: Shape) -> Shape:
        image(in_shape, self.kind)
        return self._conv().out_shape(in_shape)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return tuple(attrs.evolve(s, init="zeros") for s in self._conv().param_slots(in_shape))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return self._conv().forward(b, emit_act(b, ACT, x), params, ctx)

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return self._conv().reference(params, reference_act(ACT, x), Ctx())

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(3), (5, 4, 3))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [TimeCondAdd, TimeResBlock, NoiseHead]
