"""Character-level GPTs: token + learned position embedding (a real gather), causal pre-norm blocks,
a final LN and a dense LM head on every position ([T, D] → [T, vocab]).

tinygpt-nano: T=64, D=64, 2 heads, MLP 256, 4 blocks, vocab 65 (212,545 parameters).
tinygpt-tiny: T=128, D=128, 4 heads, MLP 512, 6 blocks, vocab 65.
The `-flash` variants use FlashAttention in every block (same parameters, same function).
"""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.tokens import TokenPositionEmbed
from hloforge.plugins.layers.transformer import TransformerBlock


def gpt(name: str, *, seq: int, vocab: int, dim: int, depth: int, heads: int, mlp: int,
        attention: str = "dense", rope: bool = False) -> NetSpec:
    if depth < 1:
        raise UnsupportedSpec(f"depth must be at least 1, got {depth}")
    layers: list[Layer] = [TokenPositionEmbed(vocab, dim, positions=not rope)]
    layers += [TransformerBlock(heads, mlp, attention=attention, causal=True, rope=rope, final_norm=i == depth - 1)
               for i in range(depth)]
    layers.append(Dense(vocab))
    return NetSpec(name, (seq,), layers, vocab)


def _sized(name: str, seq: int, dim: int, depth: int, heads: int, mlp: int, attention: str):
    def make(classes: int = 65, input: Sequence[int] | None = None) -> NetSpec:
        t = seq if input is None else int(input[0])
        if input is not None and len(input) != 1:
            raise UnsupportedSpec(f"{name} takes token ids [T], got {list(input)}")
        return gpt(name, seq=t, vocab=classes, dim=dim, depth=depth, heads=heads, mlp=mlp, attention=attention)

    return make


tinygpt_nano = _sized("tinygpt-nano", 64, 64, 4, 2, 256, "dense")
tinygpt_nano_flash = _sized("tinygpt-nano-flash", 64, 64, 4, 2, 256, "flash")
tinygpt_tiny = _sized("tinygpt-tiny", 128, 128, 6, 4, 512, "dense")
tinygpt_tiny_flash = _sized("tinygpt-tiny-flash", 128, 128, 6, 4, 512, "flash")
