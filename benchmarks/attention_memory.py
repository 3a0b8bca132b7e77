"""FlashAttention vs dense SDPA: peak memory of forward + backward, and tinygpt-nano's step time vs jax.jit.

Memory: for each sequence length n and each attention core, a fresh process compiles
`@main(Q, K, V, dO) -> (dQ, dK, dV)` ([1, H, n, dh] f32; the flash backward is its custom
recompute rule, the dense one the derived VJP of softmax(QKᵀ/√dh)·V) on XLA, pushes the
inputs, runs it once to warm up, resets the kernel's peak-RSS mark (`/proc/self/clear_refs`),
runs it again and reports VmHWM minus the RSS just before: the memory that execution added
(the [H, n, n] score matrix is 16·H·n² bytes/1e6 MB in f32). Dense should grow ~O(n²), flash
~O(n·block).

Step time: one Adam train step of tinygpt-nano (batch 32, T 64), host batch in, loss out,
median over the timed steps, for hloforge on XLA and for jax.jit of the same net written
with the layers' jax.numpy references (optax adam, θ/state donated).

    python benchmarks/attention_memory.py                 # both
    python benchmarks/attention_memory.py --memory --ns 512,1024
    python benchmarks/attention_memory.py --step-time --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

HEADS, DH = 2, 64


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(mode: str, n: int) -> dict[str, Any]:
    from hloforge.backends.xla import default_client
    from hloforge.core import autodiff
    from hloforge.core.hlo import Builder
    from hloforge.lowering.attention import flash_attention, flash_block, sdpa_dense

    shape = (1, HEADS, n, DH)
    b = Builder("f32", f"{mode}_attention")
    q, k, v, do = (b.arg(shape) for _ in range(4))
    o = flash_attention(b, q, k, v, causal=False) if mode == "flash" else sdpa_dense(b, q, k, v, causal=False)
    text = b.module(autodiff.grad(b, [o], [do], [q, k, v]))
    client = default_client()
    exe = client.compile(text)
    rng = np.random.default_rng(0)
    bufs = [client.to_device(rng.standard_normal(shape).astype(np.float32)) for _ in range(4)]

    def once() -> float:
        t = time.perf_counter()
        outs = exe.execute(bufs, keep=range(4))
        for out in outs:
            out.to_numpy()
            out.delete()
        return time.perf_counter() - t

    once()
    before = _status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    secs = once()
    peak = _status_kb("VmHWM")
    return {"mode": mode, "n": n, "block": flash_block(n) if mode == "flash" else None,
            "exec_peak_mb": (peak - before) / 1024, "scores_mb": 4 * HEADS * n * n / 2**20, "ms": 1e3 * secs}


def memory(ns: list[int]) -> list[dict[str, Any]]:
    rows = []
    print(f"FlashAttention vs dense SDPA, forward + backward, [1, {HEADS}, n, {DH}] f32 on XLA CPU")
    print(f"{'n':>6} {'one [H,n,n] f32':>16} {'dense peak':>11} {'flash peak':>11} {'dense ms':>9} {'flash ms':>9}")
    for n in ns:
        got = {}
        for mode in ("dense", "flash"):
            proc = subprocess.run([sys.executable, __file__, "--child", mode, str(n)], capture_output=True, text=True,
                                  timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:])
            got[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(got[mode])
        d, f = got["dense"], got["flash"]
        print(f"{n:6d} {d['scores_mb']:13.1f} MB {d['exec_peak_mb']:8.1f} MB {f['exec_peak_mb']:8.1f} MB "
              f"{d['ms']:9.1f} {f['ms']:9.1f}", flush=True)
    return rows


def step_time(steps: int, warmup: int = 3, batch: int = 32) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    from hloforge.bench import jax_adam_step
    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession, make_backend
    from hloforge.zoo import get_net

    spec = get_net("tinygpt-nano")
    t = spec.input_shape[0]
    rng = np.random.default_rng(1)
    data = [(rng.integers(0, 65, (batch, t)).astype(np.float32), rng.integers(0, 65, (batch, t)).astype(np.int32))
            for _ in range(4)]
    lr = 1e-3
    out: dict[str, float] = {}

    session = TrainSession(spec, Variant("adam", None, "tokenCrossEntropy"), batch, make_backend("xla"))
    ms = []
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        s = time.perf_counter()
        loss_h = session.train_step(x, y, lr) if i else session.train_step(x, y, lr)
        if i == 0:
            first_h = loss_h
        if i >= warmup:
            ms.append(1e3 * (time.perf_counter() - s))
    out["hloforge-xla"] = statistics.median(ms)

    tx, train_step = jax_adam_step(spec, lr)

    params = [jnp.asarray(p) for p in spec.init_params(0)]
    state = [params, tx.init(params)]
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(state[0], state[1], *data[0]).compile()
    ms = []
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        s = time.perf_counter()
        state[0], state[1], loss = compiled(state[0], state[1], x, y)
        loss_j = float(loss.block_until_ready())
        if i == 0:
            first_j = loss_j
        if i >= warmup:
            ms.append(1e3 * (time.perf_counter() - s))
    out["jax.jit"] = statistics.median(ms)
    print(f"tinygpt-nano train step (batch {batch}, T {t}), median of {steps}: hloforge-xla "
          f"{out['hloforge-xla']:.1f} ms, jax.jit {out['jax.jit']:.1f} ms "
          f"(first losses {first_h:.5f} / {first_j:.5f})")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    p.add_argument("--memory", action="store_true")
    p.add_argument("--step-time", action="store_true")
    p.add_argument("--ns", default="512,1024,2048,4096")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", help="write the measurements here")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]))))
        return 0
    both = not (a.memory or a.step_time)
    res: dict[str, Any] = {}
    if a.memory or both:
        res["memory"] = memory([int(n) for n in a.ns.split(",")])
    if a.step_time or both:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        res["step_ms"] = step_time(a.steps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
