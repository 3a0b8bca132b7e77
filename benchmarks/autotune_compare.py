"""What the render-time autotuner (hloforge.train.autotune) picks, what tuning costs, and what it buys.

For each (net, batch) and backend: a cold tuning pass (empty autotune cache), the same pass again
(answered by the cache), then the train step rendered with the target's default strategies and
with the tuned plan, stepped alternately (A, B, A, B, …) so drift on a shared machine hits both
alike; medians of the per-step times. Timings on a busy 2-core machine are noisy: read the
medians next to the spread, never as an assertion.

    python benchmarks/autotune_compare.py --nets mnist-cnn:128,resnet-mini:128 --backends xla,iree
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from hloforge.core.variant import Variant
from hloforge.train import autotune
from hloforge.train.session import TrainSession, make_backend
from hloforge.zoo import get_net


def interleaved(a: TrainSession, b: TrainSession, x: np.ndarray, y: np.ndarray, steps: int,
                warmup: int = 2) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        a.train_step(x, y, 1e-3)
        b.train_step(x, y, 1e-3)
    ta, tb = [], []
    for _ in range(steps):
        for s, out in ((a, ta), (b, tb)):
            t = time.perf_counter()
            s.train_step(x, y, 1e-3)
            out.append((time.perf_counter() - t) * 1e3)
    return ta, tb


def spread(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=4) if len(ms) >= 4 else [min(ms), statistics.median(ms), max(ms)]
    return f"median {statistics.median(ms):8.1f} ms  (IQR {q[0]:.1f}–{q[2]:.1f}, min {min(ms):.1f})"


def one(net: str, batch: int, backend_name: str, steps: int, reps: int) -> dict[str, Any]:
    spec = get_net(net)
    be = make_backend(backend_name)
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        cold = autotune.tune(spec, batch, be, cache_dir=cache, reps=reps)
        cold_s = time.perf_counter() - t
        t = time.perf_counter()
        warm = autotune.tune(spec, batch, be, cache_dir=cache)
        warm_s = time.perf_counter() - t
    assert warm.plan == cold.plan
    print(f"\n== {net} batch {batch} on {be.backend_name()}")
    print(f"  {cold.summary()}")
    print(f"  cached pass: {warm_s:.2f} s ({warm.summary()})")
    for d in cold.decisions:
        if d.source == "timed":
            times = ", ".join(f"{k} {v:.1f}" for k, v in sorted(d.times_ms.items(), key=lambda kv: kv[1]))
            print(f"    layer {d.index} {d.kind} {list(d.in_shape)}: {times} ms (fwd+bwd alone)")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, spec.num_classes, batch).astype(np.int32)
    t = time.perf_counter()
    default = TrainSession(spec, Variant("adam"), batch, be, seed=0)
    default_compile = time.perf_counter() - t
    t = time.perf_counter()
    with autotune.rendering(cold):
        tuned = TrainSession(spec, Variant("adam"), batch, be, seed=0)
    tuned_compile = time.perf_counter() - t
    ta, tb = interleaved(default, tuned, x, y, steps)
    print(f"  default step: {spread(ta)}  compile {default_compile:.1f} s")
    print(f"  tuned step:   {spread(tb)}  compile {tuned_compile:.1f} s")
    print(f"  tuned / default (medians): {statistics.median(tb) / statistics.median(ta):.3f}")
    sys.stdout.flush()
    return {"net": net, "backend": backend_name, "tune_s": cold_s, "cached_s": warm_s,
            "default_ms": statistics.median(ta), "tuned_ms": statistics.median(tb)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", default="mnist-cnn:128,resnet-mini:128", help="net:batch, comma-separated")
    p.add_argument("--backends", default="xla,iree")
    p.add_argument("--steps", type=int, default=10, help="timed steps per form (interleaved)")
    p.add_argument("--reps", type=int, default=autotune.REPS, help="timed runs per candidate when tuning")
    args = p.parse_args()
    os.environ.pop(autotune.ENV_VAR, None)
    for item in args.nets.split(","):
        net, _, batch = item.partition(":")
        for b in args.backends.split(","):
            one(net, int(batch or 128), b, args.steps, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
