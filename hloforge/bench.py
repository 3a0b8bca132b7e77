"""Step-time benchmark: hloforge's fused train step against jax.jit and PyTorch eager.

For each net it times one Adam train step as a user pays it — host batch in,
loss (a Python float) out — and reports the median ms/step after a warm-up,
with compile time reported separately:

- ``hloforge-xla`` / ``hloforge-iree``: a `TrainSession` on that backend
  (device-resident θ and optimizer state, one fused step per call, including
  the host→device copy of x, y and the read-back of the loss);
- ``jax.jit``: ``value_and_grad`` + ``optax.adam`` of the same net written with
  the layers' own jax.numpy ``reference`` functions, θ and optimizer state
  donated, f32;
- ``torch``: the torch.nn equivalent in eager mode with ``torch.optim.Adam``.

All start from ``spec.init_params(seed)`` and see the same batches, so their
first-step losses must agree (printed as a sanity check; a mismatch fails).
It also measures dispatch overhead: µs per call of a 1-element graph
(``a + 1``) including the scalar's trip to the device and back.

jax, optax and torch are benchmark peers only (extra ``bench``); never
imported on the training path.

    python -m hloforge.bench --nets mnist-mlp,mnist-cnn --batch 128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hloforge.core.errors import UnsupportedSpec

BACKENDS = ("hloforge-xla", "hloforge-iree", "jax.jit", "torch")
DISPATCH_BACKENDS = ("hloforge-xla", "hloforge-iree", "jax.jit")
# A few-ms step needs hundreds of samples for a stable median on a shared machine; a 100-ms one, ten.
DEFAULT_STEPS = {"mnist-mlp": 300, "mnist-linear": 300, "mnist-cnn": 10}
LOSS_RTOL = 1e-4
# The issue-#11 suite: (net, per-step batch). A net is a zoo name, optionally with its input shape
# ("vit-mini:3x32x32"); the suite's ViT is vit-cifar (0.81M parameters, 3×32×32, patch 4).
SUITE = (("mnist-mlp", 128), ("mnist-cnn", 128), ("resnet18-cifar", 32), ("mobilenetv2-mini", 128),
         ("vit-cifar", 64))
SGEMM_N = 2048


def load_net(ref: str) -> Any:
    """A zoo net by name, or `name:CxHxW` for the same net on another input shape."""
    from hloforge.zoo import get_net

    name, _, shape = ref.partition(":")
    if not shape:
        return get_net(name)
    try:
        dims = tuple(int(d) for d in shape.split("x"))
    except ValueError:
        raise UnsupportedSpec(f"net {ref!r}: the input shape after ':' must be CxHxW integers") from None
    return get_net(name, input=dims)


def strategy_table() -> list[tuple[str, str, dict[str, str]]]:
    """The declared lowering-strategy kinds with their per-target choices (the layers declare them)."""
    import hloforge.plugins.layers.conv  # noqa: F401 - declares "conv2d"
    import hloforge.plugins.layers.norm  # noqa: F401 - declares "bnReduce"
    import hloforge.plugins.layers.pool  # noqa: F401 - declares "maxPool"
    from hloforge.core import strategy

    return strategy.table()


@dataclass
class Result:
    """One (net, backend) measurement; ``ms`` empty and ``note`` set when skipped."""

    net: str
    backend: str
    batch: int
    ms: list[float] = field(default_factory=list)
    compile_s: float | None = None
    first_loss: float | None = None
    note: str = ""

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.ms) if self.ms else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["median_ms"] = self.median_ms
        d["min_ms"] = min(self.ms) if self.ms else None
        return d


# ---------------------------------------------------------------- availability ---


def hloforge_backend_names() -> list[str]:
    from hloforge.core.registry import default_registry

    return list(default_registry().names("backend"))


def unavailable(backend: str) -> str | None:
    """Why `backend` cannot run here, or None."""
    if backend.startswith("hloforge-"):
        name = backend.removeprefix("hloforge-")
        have = hloforge_backend_names()
        return None if name in have else f"backend {name!r} not registered (registered: {', '.join(have)})"
    mod = {"jax.jit": "optax", "torch": "torch"}[backend]
    try:
        if backend == "jax.jit":
            import jax  # noqa: F401
        __import__(mod)
    except ImportError as e:
        return f"not importable ({e}); pip install 'hloforge[bench]'" + (" torch==2.13.0" if mod == "torch" else "")
    return None


# ------------------------------------------------------------------- the data ---


def batches(spec: Any, batch: int, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """n fixed (x, y) batches shared by every backend; steps cycle through them."""
    rng = np.random.default_rng(seed + 1)
    classes = spec.walk()[-1].out_shape[0]
    return [(rng.standard_normal((batch, *spec.input_shape)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int32)) for _ in range(n)]


# ------------------------------------------------------------ the step makers ---
# Each returns (compile seconds, step, note) where step(x, y) -> float loss does one full
# training step as a user pays it: numpy in, Python float out.

StepFn = Callable[[np.ndarray, np.ndarray], float]


def make_hloforge(net: str, backend: str, batch: int, lr: float, seed: int) -> tuple[float, StepFn, str]:
    from hloforge.core.variant import Variant
    from hloforge.train import autotune
    from hloforge.train.session import TrainSession, make_backend
    spec = load_net(net)
    be = make_backend(backend.removeprefix("hloforge-"))
    tuning = autotune.resolve(spec, batch, be)  # on with --autotune / $HLOFORGE_AUTOTUNE; not in compile_s
    t = time.perf_counter()
    with autotune.rendering(tuning):
        session = TrainSession(spec, Variant("adam"), batch, be, seed=seed)
    compile_s = time.perf_counter() - t
    # IREE keeps compiled artifacts on disk: a cache hit did not really compile.
    note = "setup was a compile-cache hit" if getattr(session.exe, "cache_hit", False) else ""
    if tuning is not None:
        note = "; ".join(n for n in (note, tuning.summary()) if n)

    def step(x: np.ndarray, y: np.ndarray) -> float:
        return session.train_step(x, y, lr)

    return compile_s, step, note


def jax_forward(spec: Any) -> Callable[[Sequence[Any], Any], Any]:
    """The net as a composition of the layers' jax.numpy references (as tests/test_train_step.py)."""
    walk = spec.walk()

    def forward(ps: Sequence[Any], x: Any) -> Any:
        it = iter(ps)
        for ls in walk:
            x = ls.layer.reference({s.name: next(it) for s in ls.slots}, x, None)
        return x

    return forward


def jax_adam_step(spec: Any, lr: float) -> tuple[Any, Callable[..., Any]]:
    """The jax peer: (optax transform, train_step(θ, state, x, y) -> (θ', state', loss)) with
    hloforge's Adam hyper-parameters and mean softmax cross-entropy over every label."""
    import jax
    import jax.numpy as jnp
    import optax

    from hloforge.core.registry import default_registry

    adam = default_registry().make("optimizer", "adam")
    forward = jax_forward(spec)
    tx = optax.adam(lr, b1=adam.b1, b2=adam.b2, eps=adam.eps)

    def loss_fn(ps: Any, x: Any, y: Any) -> Any:
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(forward(ps, x), y))

    def train_step(ps: Any, st: Any, x: Any, y: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        upd, st = tx.update(g, st, ps)
        return optax.apply_updates(ps, upd), st, loss

    return tx, train_step


def make_jax(net: str, batch: int, lr: float, seed: int) -> tuple[float, StepFn, str]:
    import jax

    spec = load_net(net)
    tx, train_step = jax_adam_step(spec, lr)

    cpu = jax.devices("cpu")[0]
    params = [jax.device_put(np.asarray(p, np.float32), cpu) for p in spec.init_params(seed)]
    opt_state = tx.init(params)
    x0 = np.zeros((batch, *spec.input_shape), np.float32)
    y0 = np.zeros((batch,), np.int32)
    t = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, opt_state, x0, y0).compile()
    compile_s = time.perf_counter() - t
    state = [params, opt_state]

    def step(x: np.ndarray, y: np.ndarray) -> float:
        ps, st, loss = compiled(state[0], state[1], x, y)
        state[0], state[1] = ps, st
        return float(loss.block_until_ready())

    return compile_s, step, ""


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


def make_torch(net: str, batch: int, lr: float, seed: int) -> tuple[float, StepFn, str]:
    import torch
    import torch.nn.functional as F

    from hloforge.core.registry import default_registry

    torch.set_num_threads(cpu_count())
    spec = load_net(net)
    adam = default_registry().make("optimizer", "adam")
    t = time.perf_counter()
    model = torch_net(spec, spec.init_params(seed))
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(adam.b1, adam.b2), eps=adam.eps)
    compile_s = time.perf_counter() - t  # no compile: model construction only

    def step(x: np.ndarray, y: np.ndarray) -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y).long())
        loss.backward()
        opt.step()
        return float(loss.item())

    return compile_s, step, "setup is model construction (eager: no compile)"


def make_step(net: str, backend: str, batch: int, lr: float, seed: int) -> tuple[float, StepFn, str]:
    if backend.startswith("hloforge-"):
        return make_hloforge(net, backend, batch, lr, seed)
    if backend == "jax.jit":
        return make_jax(net, batch, lr, seed)
    if backend == "torch":
        return make_torch(net, batch, lr, seed)
    raise ValueError(f"unknown benchmark backend {backend!r}; expected one of {BACKENDS}")


def measure(net: str, backend: str, batch: int, steps: int, warmup: int, lr: float, seed: int) -> Result:
    res = Result(net, backend, batch)
    data = batches(load_net(net), batch, 4, seed)
    res.compile_s, step, res.note = make_step(net, backend, batch, lr, seed)
    for i in range(max(warmup, 1)):  # the first warm-up step gives the first-step loss
        loss = step(*data[i % len(data)])
        if i == 0:
            res.first_loss = loss
    for i in range(steps):
        x, y = data[(warmup + i) % len(data)]
        t = time.perf_counter()
        step(x, y)
        res.ms.append((time.perf_counter() - t) * 1e3)
    return res


def _in_child(flag: str, args: Sequence[str], cap_s: float) -> dict[str, Any] | str:
    """`python -m hloforge.bench <flag> OUT <args>` in a child process killed after cap_s seconds:
    the JSON it wrote to OUT, or a note saying why there is none."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        try:
            proc = subprocess.run([sys.executable, "-m", "hloforge.bench", flag, out, *args], capture_output=True,
                                  text=True, timeout=cap_s)
        except subprocess.TimeoutExpired:
            return f"skipped: compile + steps exceeded the {cap_s:g} s cap"
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"failed: {tail[0][:200]}"
        with open(out, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
            return data


def measure_isolated(net: str, backend: str, batch: int, steps: int, warmup: int, lr: float, seed: int,
                     cap_s: float) -> Result:
    """`measure` in a child process killed after cap_s seconds (a compile that runs away)."""
    d = _in_child("--_child", ["--nets", net, "--backends", backend, "--batch", str(batch), "--steps", str(steps),
                               "--warmup", str(warmup), "--lr", repr(lr), "--seed", str(seed)], cap_s)
    if isinstance(d, str):
        return Result(net, backend, batch, note=d)
    return Result(d["net"], d["backend"], d["batch"], d["ms"], d["compile_s"], d["first_loss"], d["note"])


# ------------------------------------------------------------ work and roofline ---


def step_gflop(net: str, batch: int) -> float | None:
    """GFLOP in one train step, as XLA's cost analysis counts the jax peer's step (the same math
    on every backend); None without jax."""
    try:
        import jax
    except ImportError:
        return None
    spec = load_net(net)
    tx, train_step = jax_adam_step(spec, 1e-3)
    params = [np.zeros(s.shape, np.float32) for _, s in spec.params()]
    x = np.zeros((batch, *spec.input_shape), np.float32)
    y = np.zeros((batch,), np.int32)
    cost = jax.jit(train_step).lower(params, tx.init(params), x, y).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"]) / 1e9 if cost and "flops" in cost else None


def sgemm_gflops(n: int = SGEMM_N, reps: int = 5) -> dict[str, float]:
    """The measured f32 matmul roofline: best-of-`reps` GFLOP/s of an n³ product through numpy's
    BLAS and (if installed) jax.jit; the larger is the roofline."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    out: dict[str, float] = {}

    def best(f: Callable[[], Any]) -> float:
        f()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return 2 * n**3 / min(times) / 1e9

    out["numpy"] = best(lambda: a @ a)
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return out
    dot = jax.jit(jnp.matmul)
    ad = jax.device_put(a)
    out["jax.jit"] = best(lambda: dot(ad, ad).block_until_ready())
    return out


# ------------------------------------------------------------------- dispatch ---


def dispatch_us(backend: str, calls: int, warmup: int = 20) -> tuple[float, float]:
    """(compile seconds, median µs per call) of `a + 1` on a scalar: host→device (the way a session
    stages its per-step inputs), execute, device→host."""
    one = np.float32(1.0)
    if backend.startswith("hloforge-"):
        from hloforge.core.hlo import Builder
        from hloforge.train.session import InputStager, make_backend

        b = Builder("f32", "dispatch")
        a = b.arg(())
        text = b.module([a + 1.0])
        be = make_backend(backend.removeprefix("hloforge-"))
        t = time.perf_counter()
        exe = be.compile(text)
        compile_s = time.perf_counter() - t
        inputs = InputStager(be)
        host = [np.asarray(one)]

        def call() -> float:
            return float(be.to_host(be.execute(exe, inputs(host))[0]))
    elif backend == "jax.jit":
        import jax

        t = time.perf_counter()
        f = jax.jit(lambda a: a + 1.0).lower(one).compile()
        compile_s = time.perf_counter() - t

        def call() -> float:
            return float(np.asarray(f(one)))
    else:
        raise ValueError(f"no dispatch measurement for {backend!r}")
    assert call() == 2.0
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return compile_s, statistics.median(times) * 1e6


# ---------------------------------------------------------------------- report ---


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("hloforge", "numpy", "jax", "jaxlib", "optax", "torch"):
        try:
            out[mod] = str(__import__(mod).__version__)
        except Exception:  # noqa: BLE001 - absent or odd module: just leave it out
            pass
    return out


def sanity(results: Sequence[Result]) -> list[tuple[str, bool]]:
    """First-step losses of every peer against hloforge-xla (or the first backend that ran)."""
    lines: list[tuple[str, bool]] = []
    for net in dict.fromkeys(r.net for r in results):
        rows = [r for r in results if r.net == net and r.first_loss is not None]
        if len(rows) < 2:
            continue
        ref = next((r for r in rows if r.backend == "hloforge-xla"), rows[0])
        for r in rows:
            if r is ref:
                continue
            rel = abs(r.first_loss - ref.first_loss) / max(abs(ref.first_loss), 1e-30)  # type: ignore[operator]
            ok = rel <= LOSS_RTOL
            lines.append((f"{net}: {r.backend} first-step loss {r.first_loss:.7f} vs {ref.backend} "
                          f"{ref.first_loss:.7f} (rel {rel:.1e}) {'OK' if ok else 'MISMATCH'}", ok))
    return lines


def table(results: Sequence[Result], backends: Sequence[str], dispatch: dict[str, dict[str, Any]]) -> str:
    """One row per net (and one for dispatch), one column per backend: median and ratio to jax.jit."""
    def cell(value: float | None, base: float | None, unit: str) -> str:
        if value is None:
            return "-"
        ratio = f" ({value / base:.2f}x)" if base else ""
        digits = 3 if value < 1 else 2 if value < 10 else 1
        return f"{value:.{digits}f} {unit}{ratio}"

    head = ["net (batch)", *backends]
    rows = []
    for net in dict.fromkeys(r.net for r in results):
        mine = {r.backend: r for r in results if r.net == net}
        base = mine["jax.jit"].median_ms if "jax.jit" in mine else None
        batch = next(iter(mine.values())).batch
        rows.append([f"{net} ({batch})", *(cell(mine[b].median_ms if b in mine else None, base, "ms")
                                           for b in backends)])
    if dispatch:
        base = dispatch.get("jax.jit", {}).get("us")
        rows.append(["dispatch (a+1)", *(cell(dispatch.get(b, {}).get("us"), base, "us") for b in backends)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def throughput(results: Sequence[Result], backends: Sequence[str], gflop: dict[str, float | None],
               roofline: float | None) -> str:
    """Achieved GFLOP/s per net and backend (the step's FLOPs over its median time), with the
    percentage of the sgemm roofline, and the ratios the issue asks for: best hloforge backend
    over PyTorch eager, hloforge-xla over jax.jit."""
    head = ["net", "GFLOP/step", *backends, "best hf / torch", "hf-xla / jax"]
    rows = []
    for net in dict.fromkeys(r.net for r in results):
        mine = {r.backend: r.median_ms for r in results if r.net == net}
        work = gflop.get(net)

        def rate(ms: float | None, work: float | None = work) -> str:
            if ms is None or work is None:
                return "-"
            g = work / (ms / 1e3)
            return f"{g:.1f}" + (f" ({100 * g / roofline:.0f}%)" if roofline else "")

        ours = [m for b, m in mine.items() if b.startswith("hloforge-") and m is not None]
        torch_ms, jax_ms, xla_ms = mine.get("torch"), mine.get("jax.jit"), mine.get("hloforge-xla")
        rows.append([net, f"{work:.2f}" if work is not None else "-", *(rate(mine.get(b)) for b in backends),
                     f"{min(ours) / torch_ms:.2f}x" if ours and torch_ms else "-",
                     f"{xla_ms / jax_ms:.2f}x" if xla_ms and jax_ms else "-"])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def details(results: Sequence[Result], dispatch: dict[str, dict[str, Any]]) -> str:
    lines = ["", "per (net, backend): median / min ms per step over N timed steps, setup (compile) s, first loss"]
    for r in results:
        if r.ms:
            lines.append(f"  {r.net:12} {r.backend:14} median {r.median_ms:8.3f}  min {min(r.ms):8.3f}  "
                         f"N={len(r.ms):3}  setup {r.compile_s:7.2f}s  loss0 {r.first_loss:.6f}"
                         + (f"  ({r.note})" if r.note else ""))
        else:
            lines.append(f"  {r.net:12} {r.backend:14} {r.note}")
    for b, d in dispatch.items():
        if "us" in d:
            lines.append(f"  dispatch     {b:14} median {d['us']:8.1f} us/call over {d['calls']} calls, "
                         f"compile {d['compile_s']:.3f}s")
        else:
            lines.append(f"  dispatch     {b:14} {d['note']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------ main ---


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hloforge bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nets", default="mnist-mlp,mnist-cnn",
                   help="comma-separated zoo nets (or spec files; default %(default)s)")
    p.add_argument("--batch", type=int, default=None,
                   help="per-step batch (default 128; with --suite each net's own: " +
                   ", ".join(f"{n} {b}" for n, b in SUITE) + ")")
    p.add_argument("--suite", action="store_true", help="benchmark the issue-#11 suite (overrides --nets)")
    p.add_argument("--roofline", action=argparse.BooleanOptionalAction, default=True,
                   help=f"measure the sgemm roofline ({SGEMM_N}³ f32) and report GFLOP/s against it")
    p.add_argument("--steps", type=int, default=None,
                   help=f"timed steps per (net, backend); default {DEFAULT_STEPS}, else 10")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps after compile (at least 1; default %(default)s)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure each net's backends this many times, alternating, and pool the steps: "
                        "a ratio then compares steps from the same stretches of time (default %(default)s)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"comma-separated subset of {', '.join(BACKENDS)}; unavailable ones are skipped with a note "
                        "(default: all)")
    p.add_argument("--lr", type=float, default=1e-3, help="the steps' learning rate (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the batch (default %(default)s)")
    p.add_argument("--dispatch-calls", type=int, default=2000,
                   help="0 skips the dispatch measurement (default %(default)s)")
    # Every backend in a process of its own by default: XLA (jaxlib's and the plugin's), IREE and
    # PyTorch each keep worker threads that spin after a step and slowed whichever ran next in one process.
    p.add_argument("--isolate", default=",".join(BACKENDS),
                   help="backends measured in a child process killed after --cap-s (comma-separated; '' for none; "
                        "default: all)")
    p.add_argument("--cap-s", type=float, default=600.0,
                   help="time cap per isolated (net, backend), seconds (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (default: not written)")
    p.add_argument("--autotune", action="store_true",
                   help="render hloforge's steps with autotuned per-layer strategies (the same as "
                        "HLOFORGE_AUTOTUNE=1; the tuning time is not in the compile time)")
    p.add_argument("--_child", help=argparse.SUPPRESS)  # internal: write one Result as JSON and exit
    p.add_argument("--_dispatch_child", help=argparse.SUPPRESS)  # internal: write one dispatch timing and exit
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    nets = [n for n, _ in SUITE] if args.suite else [n for n in args.nets.split(",") if n]
    suite_batch = dict(SUITE) if args.suite else {}
    if args._child:  # the parent resolved the batch already
        suite_batch = {}

    def batch_of(net: str) -> int:
        return args.batch or suite_batch.get(net) or 128
    backends = [b for b in args.backends.split(",") if b]
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        print(f"unknown backend(s) {bad}; expected a subset of {list(BACKENDS)}", file=sys.stderr)
        return 2
    if args.autotune:  # through the environment, so isolated children tune too
        from hloforge.train.autotune import ENV_VAR as AUTOTUNE_ENV_VAR

        os.environ[AUTOTUNE_ENV_VAR] = "1"
    if args._child:  # one measurement for measure_isolated
        r = measure(nets[0], backends[0], batch_of(nets[0]), args.steps, args.warmup, args.lr, args.seed)
        with open(args._child, "w", encoding="utf-8") as f:
            json.dump(asdict(r), f)
        return 0
    if args._dispatch_child:  # one dispatch timing, for the isolated dispatch measurement
        c, us = dispatch_us(backends[0], args.dispatch_calls)
        with open(args._dispatch_child, "w", encoding="utf-8") as f:
            json.dump({"us": us, "compile_s": c, "calls": args.dispatch_calls}, f)
        return 0

    isolate = {b for b in args.isolate.split(",") if b}
    notes = {b: unavailable(b) for b in backends}
    results: list[Result] = []
    gflop: dict[str, float | None] = {}
    for net in nets:
        steps = args.steps or DEFAULT_STEPS.get(net, 10)
        batch = batch_of(net)
        try:
            gflop[net] = step_gflop(net, batch)
        except Exception:  # noqa: BLE001 - a net the jax peer cannot lower has no FLOP count; still time it
            gflop[net] = None
        pooled: dict[str, Result] = {}
        for rnd in range(args.rounds):  # backends alternate, so a slow spell of the machine hits them alike
            for b in backends:
                if notes[b]:
                    pooled.setdefault(b, Result(net, b, batch, note=f"skipped: {notes[b]}"))
                    continue
                if b in pooled and not pooled[b].ms:  # failed in an earlier round: once is enough
                    continue
                print(f"[bench] {net} batch {batch} on {b}: compile, {args.warmup} warm-up, {steps} timed steps"
                      + (f" (round {rnd + 1}/{args.rounds})" if args.rounds > 1 else ""), file=sys.stderr, flush=True)
                try:
                    if b in isolate:
                        r = measure_isolated(net, b, batch, steps, args.warmup, args.lr, args.seed, args.cap_s)
                    else:
                        r = measure(net, b, batch, steps, args.warmup, args.lr, args.seed)
                except Exception as e:  # noqa: BLE001 - report the failure in the table, keep benchmarking
                    r = Result(net, b, batch, note=f"failed: {type(e).__name__}: {e}"[:300])
                if b in pooled:  # a later round: its steps join the first round's (compile and loss stay)
                    pooled[b].ms += r.ms
                    if not r.ms:  # said, not dropped: the median is then over the rounds that ran
                        pooled[b].note = "; ".join(n for n in (pooled[b].note, f"round {rnd + 1} {r.note}") if n)
                else:
                    pooled[b] = r
        results += [pooled[b] for b in backends]
    roof = sgemm_gflops() if args.roofline else {}
    roofline = max(roof.values()) if roof else None

    dispatch: dict[str, dict[str, Any]] = {}
    if args.dispatch_calls > 0:
        for b in (b for b in backends if b in DISPATCH_BACKENDS):
            if notes[b]:
                dispatch[b] = {"note": f"skipped: {notes[b]}"}
                continue
            print(f"[bench] dispatch on {b}: {args.dispatch_calls} calls", file=sys.stderr, flush=True)
            try:
                if b in isolate:  # like the steps: another runtime's spinning threads would slow it
                    got = _in_child("--_dispatch_child", ["--backends", b, "--dispatch-calls",
                                                          str(args.dispatch_calls)], args.cap_s)
                    dispatch[b] = {"note": got} if isinstance(got, str) else got
                else:
                    c, us = dispatch_us(b, args.dispatch_calls)
                    dispatch[b] = {"us": us, "compile_s": c, "calls": args.dispatch_calls}
            except Exception as e:  # noqa: BLE001
                dispatch[b] = {"note": f"failed: {type(e).__name__}: {e}"[:300]}

    checks = sanity(results)
    print(f"hloforge bench: Adam train step, median ms/step (ratio to jax.jit); f32; {cpu_count()} CPU threads; "
          f"host batch in, loss out")
    print(table(results, backends, dispatch))
    if roof:
        print(f"\nachieved GFLOP/s (% of the sgemm roofline, {roofline:.1f} GFLOP/s: best of "
              + ", ".join(f"{k} {v:.1f}" for k, v in roof.items()) + f" on {SGEMM_N}³ f32)")
    else:
        print("\nachieved GFLOP/s")
    print(throughput(results, backends, gflop, roofline))
    print(details(results, dispatch))
    forced = os.environ.get("HLOFORGE_STRATEGY")
    print("\nlowering strategies (kind: choice per target" + (f"; forced by HLOFORGE_STRATEGY={forced}" if forced
                                                              else "") + "):")
    for kind, choices, per_target in strategy_table():
        print(f"  {kind:8} {', '.join(f'{t}={c}' for t, c in per_target.items())}   (choices: {choices})")
    if checks:
        print(f"\nsanity (first-step loss, rtol {LOSS_RTOL:.0e}):")
        for line, _ in checks:
            print("  " + line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                       "machine": {"platform": platform.platform(), "cpus": cpu_count(), **versions()},
                       "results": [r.to_dict() for r in results], "dispatch_us": dispatch,
                       "gflop_per_step": gflop, "sgemm_gflops": roof,
                       "strategies": {k: t for k, _, t in strategy_table()},
                       "sanity": [{"check": line, "ok": ok} for line, ok in checks]}, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
