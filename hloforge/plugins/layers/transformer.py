"""Transformer parts on tokens [N, D]: `layerNormLast`, `patchEmbed`, `classToken` and the pre-norm
encoder block `transformerBlock`.

* layerNormLast normalises the last axis (D) with norm.py's one closed-form normaliser (the
  channel-axis `layerNorm` of norm.py is for NCHW images), its sums in the "lnSums" form.
* patchEmbed (ViT): a p×p stride-p convolution [C, H, W] → [D, H/p, W/p], flattened to N = HW/p²
  tokens [N, D], a learned class token prepended (`cls`), learned positions [N(+1), D] added.
* transformerBlock: x + MHSA(LN(x)), then x + MLP(LN(x)) with MLP = dense → GELU → dense, then an
  optional final LN (`final_norm`) and either the whole sequence (`output="sequence"`) or the class
  token alone (`output="cls"`, → [D]). It is a composition (compose.py) of gated parts; its slots
  are `attn.ln.*`, `attn.mhsa.*`, `mlp.ln.*`, `mlp.fc1.*`, `mlp.fc2.*`, `norm.*`.

GELU is the tanh form (activation.py); timm's ViT uses the erf form — the parameter count is
the same, outputs differ slightly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core import strategy
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
from hloforge.lowering.norm import LN_SUMS, normalize
from hloforge.plugins.layers.attention import ATTENTIONS, MultiHeadSelfAttention
from hloforge.plugins.layers.compose import Block, BlockLayer, Part, image
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.norm import bn_slots, check_eps, ref_conv


@attrs.frozen
class LayerNormLast(Layer):
    """LayerNorm over the last axis of [N, D] (or [D]); γ, β of shape [D]; closed-form backward."""

    kind = "layerNormLast"
    strategy_kinds = (LN_SUMS.name,)
    eps: float = 1e-6

    def out_shape(self, in_shape: Shape) -> Shape:
        check_eps(self.eps)
        if len(in_shape) not in (1, 2):
            raise UnsupportedSpec(f"layerNormLast takes tokens [N, D] or [D], got {list(in_shape)}")
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return bn_slots(in_shape[-1])

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        last = x.type.rank - 1
        return normalize(b, x, params["gamma"], params["beta"], [last], last, self.eps,
                         sums=strategy.chosen(LN_SUMS.name, b.target))[0]

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        mean = x.mean(axis=-1, keepdims=True)
        var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + self.eps) * params["gamma"] + params["beta"]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3, 5)), (cls(eps=1e-5), (4,))]


@attrs.frozen
class ClassToken(Layer):
    """Token 0 of [N, D] → [D] (the class token a ViT classifies from)."""

    kind = "classToken"

    def out_shape(self, in_shape: Shape) -> Shape:
        if len(in_shape) != 2:
            raise UnsupportedSpec(f"classToken takes tokens [N, D], got {list(in_shape)}")
        return (in_shape[1],)

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        bsz, n, d = x.shape
        return b.reshape(b.slice(x, [0, 0, 0], [bsz, 1, d]), (bsz, d))

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return x[:, 0, :]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3, 4))]


@attrs.frozen
class PatchEmbed(Layer):
    """[C, H, W] → [N(+1), dim]: p×p stride-p conv (+ bias), class token (`cls`), learned positions."""

    kind = "patchEmbed"
    dim: int
    patch: int
    cls: bool = True

    def out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = image(in_shape, self.kind)
        if self.dim <= 0 or self.patch <= 0:
            raise UnsupportedSpec(f"dim and patch must be positive, got dim={self.dim} patch={self.patch}")
        if h % self.patch or w % self.patch:
            raise UnsupportedSpec(f"patch {self.patch} does not divide the {h}x{w} image")
        return ((h // self.patch) * (w // self.patch) + int(self.cls), self.dim)

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        n = self.out_shape(in_shape)[0]
        c, p = in_shape[0], self.patch
        slots = [ParamSlot("w", (self.dim, c, p, p), "he_fan_out", True), ParamSlot("b", (self.dim,), "zeros", False)]
        if self.cls:
            slots.append(ParamSlot("cls", (self.dim,), "zeros", False))
        return (*slots, ParamSlot("pos", (n, self.dim), "glorot", False))

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        bsz = x.shape[0]
        p, d = self.patch, self.dim
        y = b.convolution(x, params["w"], strides=[p, p], padding=[(0, 0), (0, 0)])  # [B, D, h, w]
        n = y.shape[2] * y.shape[3]
        t = b.transpose(b.reshape(y, (bsz, d, n)), [0, 2, 1])  # [B, N, D]
        t = t + b.broadcast_in_dim(params["b"], t.shape, [2])
        if self.cls:
            t = b.concatenate([b.broadcast_in_dim(params["cls"], (bsz, 1, d), [2]), t], 1)
        return t + b.broadcast_in_dim(params["pos"], t.shape, [1, 2])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        y = ref_conv(x, params["w"], self.patch, 0)
        bsz, d = y.shape[:2]
        t = y.reshape(bsz, d, -1).transpose(0, 2, 1) + params["b"]
        if self.cls:
            t = jnp.concatenate([jnp.broadcast_to(params["cls"], (bsz, 1, d)), t], axis=1)
        return t + params["pos"]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(3, 2), (2, 4, 4)), (cls(4, 3, cls=False), (1, 3, 6))]


OUTPUTS = ("sequence", "cls")


@attrs.frozen
class TransformerBlock(BlockLayer):
    """Pre-norm encoder block on [N, D]: LN → MHSA → +, LN → fc1 → GELU → fc2 → +; optional final LN;
    the sequence or the class token out."""

    kind = "transformerBlock"
    heads: int
    mlp: int
    attention: str = "dense"
    causal: bool = False
    rope: bool = False
    block: int = 0
    eps: float = 1e-6
    final_norm: bool = False
    output: str = "sequence"
    drop_path: float = 0.0  # stochastic depth on both residual branches

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        if len(in_shape) != 2:
            raise UnsupportedSpec(f"transformerBlock takes tokens [N, D], got {list(in_shape)}")
        if self.attention not in ATTENTIONS:
            raise UnsupportedSpec(f"attention must be one of {list(ATTENTIONS)}, got {self.attention!r}")
        if self.output not in OUTPUTS:
            raise UnsupportedSpec(f"output must be one of {list(OUTPUTS)}, got {self.output!r}")
        if self.mlp <= 0:
            raise UnsupportedSpec(f"mlp must be positive, got {self.mlp}")
        d = in_shape[1]
        attn = MultiHeadSelfAttention(self.heads, self.attention, self.causal, self.rope, block=self.block)
        if not 0.0 <= self.drop_path < 1.0:
            raise UnsupportedSpec(f"drop_path must be in [0, 1), got {self.drop_path}")
        out = [("attn.", Block((Part("ln.", LayerNormLast(self.eps)), Part("mhsa.", attn)), short=(),
                               drop_path=self.drop_path)),
               ("mlp.", Block((Part("ln.", LayerNormLast(self.eps)), Part("fc1.", Dense(self.mlp, act="gelu")),
                               Part("fc2.", Dense(d))), short=(), drop_path=self.drop_path))]
        if self.final_norm:
            out.append(("", Block((Part("norm.", LayerNormLast(self.eps)),))))
        if self.output == "cls":
            out.append(("", Block((Part("", ClassToken()),))))
        return out

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(2, 6, attention="flash", causal=True, rope=True, block=2), (4, 4)),
                (cls(1, 4, final_norm=True, output="cls", drop_path=0.5), (3, 4))]


@hookimpl
def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
    return [LN_SUMS]


@hookimpl
def hloforge_layers() -> list[type]:
    return [LayerNormLast, ClassToken, PatchEmbed, TransformerBlock]
