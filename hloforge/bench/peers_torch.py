"""The PyTorch peers: a net translated layer by layer to torch.nn, with `torch.optim.Adam`; eager, or
its forward and loss through `torch.compile`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hloforge.bench.common import StepFn, cpu_count, load_net
from hloforge.core.errors import UnsupportedSpec


def torch_net(spec: Any, params: Sequence[np.ndarray]) -> Any:
    """spec as a torch.nn.Sequential, with spec's parameters copied in: dense, conv2d, max-pool,
    flatten, global average pool, batch norm, convBn / depthwiseConvBn, blocks of those
    (residual stages, inverted residuals), and the ViT parts (patch embedding, LayerNorm on tokens,
    self-attention, class token, transformer blocks); anything else is an UnsupportedSpec naming
    the layer."""
    from torch import nn

    mods: list[nn.Module] = []
    it = iter(params)
    for ls in spec.walk():
        mine = {s.name: next(it) for s in ls.slots}
        try:
            mods += _torch_layer(ls.layer, ls.in_shape, mine)
        except UnsupportedSpec as e:
            raise UnsupportedSpec(f"torch peer: layer {ls.index} ({ls.layer.kind}): {e}") from None
    return nn.Sequential(*mods)


def _torch_layer(layer: Any, in_shape: Sequence[int], mine: dict[str, np.ndarray]) -> list[Any]:
    """One hloforge layer (its parameters by slot name) as torch modules, its activation included."""
    from torch import nn

    from hloforge.plugins.layers.compose import BlockLayer
    from hloforge.plugins.layers.conv import Conv2d, resolve_padding
    from hloforge.plugins.layers.dense import Dense, Flatten
    from hloforge.plugins.layers.norm import BatchNorm, _ConvBnUnit
    from hloforge.plugins.layers.pool import GlobalAvgPool, MaxPool

    act, copy = _torch_act, _torch_copy

    def bn(c: int, eps: float, rank: int) -> nn.Module:
        m = (nn.BatchNorm2d if rank == 3 else nn.BatchNorm1d)(c, eps=eps)
        copy(m.weight, mine["gamma"])
        copy(m.bias, mine["beta"])
        return m

    m: nn.Module
    if isinstance(layer, BlockLayer):
        return [_torch_block(layer, in_shape, mine)]
    if isinstance(layer, Dense):
        m = nn.Linear(in_shape[-1], layer.units, bias=layer.bias)  # [n] or tokens [N, D]
        copy(m.weight, mine["w"].T)  # ours is [in, out], torch's [out, in]
    elif isinstance(layer, Conv2d):
        pads = resolve_padding(layer.pad, (in_shape[1], in_shape[2]), layer.k, layer.stride)
        if any(lo != hi for lo, hi in pads):
            raise UnsupportedSpec(f"asymmetric padding {pads}")
        m = nn.Conv2d(in_shape[0], layer.out, layer.k, layer.stride, (pads[0][0], pads[1][0]),
                      groups=layer.groups, bias=layer.bias)
        copy(m.weight, mine["w"])  # OIHW on both sides
    elif isinstance(layer, _ConvBnUnit):
        c = in_shape[0]
        oc, groups = layer.out_channels(c), layer.group_count(c)
        conv = nn.Conv2d(c, oc, layer.k, layer.stride, layer.padding, groups=groups, bias=False)
        copy(conv.weight, mine["w"])
        return [conv, bn(oc, layer.eps, 3), *act(layer.act)]
    elif isinstance(layer, BatchNorm):
        return [bn(in_shape[0], layer.eps, len(in_shape)), *act(layer.act)]
    elif isinstance(layer, MaxPool):
        pads = resolve_padding(layer.pad, (in_shape[1], in_shape[2]), layer.k, layer.s)
        if any(lo != hi for lo, hi in pads):
            raise UnsupportedSpec(f"asymmetric padding {pads}")
        m = nn.MaxPool2d(layer.k, layer.s, (pads[0][0], pads[1][0]))
    elif isinstance(layer, Flatten):
        m = nn.Flatten()
    elif isinstance(layer, GlobalAvgPool):
        return [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    elif (tokens := _torch_token_layer(layer, in_shape, mine)) is not None:
        return [tokens]
    else:
        raise UnsupportedSpec("no translation")
    if getattr(layer, "bias", False):
        copy(m.bias, mine["b"])
    return [m, *act(getattr(layer, "act", "identity"))]


def _torch_block(layer: Any, in_shape: Sequence[int], mine: dict[str, np.ndarray]) -> Any:
    """A BlockLayer's blocks: main path (+ identity or projected skip), then the block's activation."""
    from torch import nn

    from hloforge.plugins.layers.compose import path_shapes

    class Block(nn.Module):
        def __init__(self, main: nn.Module, short: nn.Module | None, act: list[nn.Module]):
            super().__init__()
            self.main, self.short, self.act = main, short, nn.Sequential(*act)

        def forward(self, x: Any) -> Any:
            y = self.main(x)
            return self.act(y if self.short is None else y + self.short(x))

    def path(parts: Sequence[Any], shape: Sequence[int], prefix: str) -> nn.Module:
        mods: list[nn.Module] = []
        for p, sh in zip(parts, path_shapes(parts, tuple(shape)), strict=False):
            pre = prefix + p.prefix
            mods += _torch_layer(p.layer, sh, {s.name: mine[pre + s.name] for s in p.layer.param_slots(sh)})
        return nn.Sequential(*mods)

    blocks = []
    for prefix, blk, shape in layer._walk(tuple(in_shape)):
        if blk.drop_path:
            raise UnsupportedSpec("drop path (host-drawn masks) has no torch peer here")
        short = None if blk.short is None else path(blk.short, shape, prefix)
        blocks.append(Block(path(blk.main, shape, prefix), short, _torch_act(blk.act)))
    return nn.Sequential(*blocks)


def _torch_copy(dst: Any, src: np.ndarray) -> None:
    """Copy one of our parameters into a torch parameter of the same layout."""
    import torch

    with torch.no_grad():
        dst.copy_(torch.from_numpy(np.ascontiguousarray(src, np.float32)))


def _torch_token_layer(layer: Any, in_shape: Sequence[int], mine: dict[str, np.ndarray]) -> Any:
    """The ViT parts as torch modules with our parameters (None for any other layer): patchEmbed,
    layerNormLast, mhsa and classToken. Attention is torch's fused F.scaled_dot_product_attention on
    our qkv layout (ours is [B, N, 3, H, dh] split into q, k, v); dense and flash are the same math."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from hloforge.plugins.layers.attention import MultiHeadSelfAttention
    from hloforge.plugins.layers.transformer import ClassToken, LayerNormLast, PatchEmbed

    def linear(d_in: int, d_out: int, prefix: str) -> nn.Linear:
        m = nn.Linear(d_in, d_out)
        _torch_copy(m.weight, mine[prefix + "w"].T)  # ours is [in, out], torch's [out, in]
        _torch_copy(m.bias, mine[prefix + "b"])
        return m

    class Patches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            p = layer.patch
            self.conv = nn.Conv2d(in_shape[0], layer.dim, p, p)
            _torch_copy(self.conv.weight, mine["w"])  # OIHW on both sides
            _torch_copy(self.conv.bias, mine["b"])
            self.cls = nn.Parameter(torch.from_numpy(np.array(mine["cls"], np.float32)).view(1, 1, -1)) \
                if layer.cls else None
            self.pos = nn.Parameter(torch.from_numpy(np.array(mine["pos"], np.float32)).unsqueeze(0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = self.conv(x).flatten(2).transpose(1, 2)  # [B, N, D]
            if self.cls is not None:
                t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1)
            return t + self.pos

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = in_shape[-1]
            self.qkv, self.proj = linear(d, 3 * d, "qkv."), linear(d, d, "proj.")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            bsz, n, d = x.shape
            h = layer.heads
            q, k, v = self.qkv(x).view(bsz, n, 3, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=layer.causal)  # [B, H, N, dh]
            return self.proj(o.transpose(1, 2).reshape(bsz, n, d))

    class FirstToken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, 0]

    if isinstance(layer, PatchEmbed):
        return Patches()
    if isinstance(layer, LayerNormLast):
        m = nn.LayerNorm(in_shape[-1], eps=layer.eps)
        _torch_copy(m.weight, mine["gamma"])
        _torch_copy(m.bias, mine["beta"])
        return m
    if isinstance(layer, MultiHeadSelfAttention):
        if layer.rope:
            raise UnsupportedSpec("rope has no torch peer here")
        return SelfAttention()
    if isinstance(layer, ClassToken):
        return FirstToken()
    return None


def _torch_act(name: str) -> list[Any]:
    """The activation `name` as torch modules ([] for identity)."""
    from torch import nn

    acts: dict[str, Callable[[], nn.Module]] = {
        "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "swish": nn.SiLU, "gelu": lambda: nn.GELU(approximate="tanh"),
        "relu6": nn.ReLU6, "hSwish": nn.Hardswish, "hSigmoid": nn.Hardsigmoid,
    }
    if name == "identity":
        return []
    if name not in acts:
        raise UnsupportedSpec(f"activation {name!r} has no torch peer here")
    return [acts[name]()]


def compile_counters() -> Any:
    """torch.compile's event counters, or None where this torch lacks them (they are its internals)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return counters


def all_from_cache(counters: Any) -> bool:
    """Whether what torch.compile compiled since `counters` were cleared all came from its on-disk
    caches (AOTAutograd's and inductor's FX graphs): some hits, no miss."""
    hits = counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]
    misses = counters["aot_autograd"]["autograd_cache_miss"] + counters["inductor"]["fxgraph_cache_miss"]
    return bool(hits > 0 and misses == 0)


def make_torch(net: str, batch: int, lr: float, seed: int,
               compiled: bool = False) -> tuple[float, StepFn, str, bool]:
    """The torch peer's step (and whether its setup loaded torch.compile's graphs from the cache);
    with `compiled`, the same module's forward and loss through `torch.compile` (inductor), compiled
    in setup by one forward and backward on a zero batch."""
    import torch
    import torch.nn.functional as F

    from hloforge.core.registry import default_registry

    torch.set_num_threads(cpu_count())
    spec = load_net(net)
    adam = default_registry().make("optimizer", "adam")
    t = time.perf_counter()
    model = torch_net(spec, spec.init_params(seed))
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(adam.b1, adam.b2), eps=adam.eps)

    def loss_of(x: Any, y: Any) -> Any:
        return F.cross_entropy(model(x), y)

    fwd = torch.compile(loss_of) if compiled else loss_of
    cached = False
    if compiled:  # the first step would compile: do it here, without an update, so it counts as setup
        counters = compile_counters()
        if counters is not None:
            counters.clear()
        fwd(torch.zeros((batch, *spec.input_shape)), torch.zeros((batch,), dtype=torch.long)).backward()
        opt.zero_grad(set_to_none=True)
        cached = counters is not None and all_from_cache(counters)
    compile_s = time.perf_counter() - t

    def step(x: np.ndarray, y: np.ndarray) -> float:
        opt.zero_grad(set_to_none=True)
        loss = fwd(torch.from_numpy(x), torch.from_numpy(y).long())
        loss.backward()
        opt.step()
        return float(loss.item())

    if compiled:
        return compile_s, step, "setup is model construction + torch.compile (inductor) of forward and backward", cached
    return compile_s, step, "setup is model construction (eager: no compile)", False
