"""The measurements: a train step per backend timed (in this process or a child one killed after
a cap), the work of a step and the sgemm roofline, and the dispatch overhead of one call."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import numpy as np

from hloforge.backends.base import CACHE_ENV_VAR
from hloforge.bench.common import BACKENDS, SGEMM_N, Result, StepFn, batches, load_net
from hloforge.bench.peers_jax import jax_adam_step, make_jax
from hloforge.bench.peers_torch import make_torch


def make_hloforge(net: str, backend: str, batch: int, lr: float, seed: int) -> tuple[float, StepFn, str, bool]:
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
    # Both backends keep compiled executables on disk: a cache hit did not really compile.
    cache_hit = bool(getattr(session.exe, "cache_hit", False))
    note = "setup was a compile-cache hit" if cache_hit else ""
    if be.stats.get("worker_compiles"):
        worker_peak = workers_peak_rss_mb()
        note = "compiled in a worker process" + (f" (its peak RSS {worker_peak:.0f} MB, not in this row's)"
                                                 if worker_peak is not None else "")
    if tuning is not None:
        note = "; ".join(n for n in (note, tuning.summary()) if n)

    def step(x: np.ndarray, y: np.ndarray) -> float:
        return session.train_step(x, y, lr)

    return compile_s, step, note, cache_hit


def make_step(net: str, backend: str, batch: int, lr: float, seed: int) -> tuple[float, StepFn, str, bool]:
    """(setup s, the step, a note, whether the setup loaded its compiled program from an on-disk cache)."""
    if backend.startswith("hloforge-"):
        return make_hloforge(net, backend, batch, lr, seed)
    if backend == "jax.jit":
        return (*make_jax(net, batch, lr, seed), False)
    if backend in ("torch", "torch-compile"):
        return make_torch(net, batch, lr, seed, compiled=backend == "torch-compile")
    raise ValueError(f"unknown benchmark backend {backend!r}; expected one of {BACKENDS}")


def workers_peak_rss_mb() -> float | None:
    """The largest peak resident set of this process's live XLA compile workers, MB (a row's peak
    column is the measuring process's own); None where none is alive or /proc cannot say."""
    from hloforge.backends.xla.compile_worker import worker_pids

    return max(filter(None, map(peak_rss_mb, worker_pids())), default=None)


# Where each peer that keeps compiled programs on disk looks for them (torch.compile: inductor's cache).
CACHE_DIR_VARS = {"hloforge-xla": CACHE_ENV_VAR, "hloforge-iree": CACHE_ENV_VAR,
                  "torch-compile": "TORCHINDUCTOR_CACHE_DIR"}


@contextlib.contextmanager
def empty_cache(backend: str) -> Iterator[None]:
    """`backend`'s on-disk cache of compiled programs in a new empty directory inside the block (a
    child process started in it inherits the setting), so a setup there compiles; nothing for a
    peer without one."""
    var = CACHE_DIR_VARS.get(backend)
    if var is None:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="hloforge-bench-cache-") as d, mock.patch.dict(os.environ, {var: d}):
        yield


def measure(net: str, backend: str, batch: int, steps: int, warmup: int, lr: float, seed: int) -> Result:
    res = Result(net, backend, batch)
    data = batches(load_net(net), batch, 4, seed)
    res.compile_s, step, res.note, cache_hit = make_step(net, backend, batch, lr, seed)
    (res.cached_setups if cache_hit else res.cold_setups).append(res.compile_s)
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


def peak_rss_mb(pid: int | None = None) -> float | None:
    """The peak resident set size so far of this process (or of process `pid`), MB. On Linux /proc's
    VmHWM: getrusage's ru_maxrss survives exec, so a child started from a 400 MB parent reports at least
    400 MB. None for another process where /proc cannot say."""
    try:
        with open(f"/proc/{pid or 'self'}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except OSError:
        pass
    if pid is not None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB elsewhere


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
    return Result(d["net"], d["backend"], d["batch"], d["ms"], d["compile_s"], d["first_loss"], d["note"],
                  d.get("peak_rss_mb"), d["cold_setups"], d["cached_setups"])


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
