"""Graph size and XLA compile time of hloforge's train step against jax.jit's, per suite net.

For each net: hloforge's rendered step (the text a TrainSession compiles on XLA) and jax's lowered
StableHLO of the same step (benchmarks' jax peer: the layers' jax references, value_and_grad, optax
Adam, θ and state donated), their op counts (stablehlo ops, by kind where they differ most), and
the XLA compile time of each text through hloforge's own PJRT client with the same compile options
(compile only; no run; no cache). Each net runs in a child process of its own, which also reports
its peak RSS after the compile.

    python benchmarks/compile_size.py                        # the bench suite
    python benchmarks/compile_size.py --nets mnist-cnn --reps 2
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time

OP = re.compile(r"\b(?:stablehlo|chlo|mhlo)\.([a-z_]+)")


def ops(text: str) -> collections.Counter[str]:
    """stablehlo ops in `text` by kind (attributes like #stablehlo.dot excluded: a leading '#')."""
    return collections.Counter(m.group(1) for m in OP.finditer(text) if text[m.start() - 1] not in "#<")


def child(net: str, batch: int, reps: int, schedulers: list[str]) -> dict[str, object]:
    import numpy as np

    os.environ["HLOFORGE_XLA_CACHE"] = "0"
    import jax

    from hloforge.backends.xla.backend import auto_scheduler
    from hloforge.bench.common import load_net
    from hloforge.bench.peers_jax import jax_adam_step
    from hloforge.bench.timing import peak_rss_mb
    from hloforge.core.modules import train_step_module
    from hloforge.core.variant import Variant
    from hloforge.train.session import make_backend

    spec = load_net(net)
    be = make_backend("xla")
    t = time.perf_counter()
    ours, _ = train_step_module(spec, Variant("adam"), batch, target="xla")
    render_s = time.perf_counter() - t
    tx, train_step = jax_adam_step(spec, 1e-3)
    params = [np.zeros(s.shape, np.float32) for _, s in spec.params()]
    x = np.zeros((batch, *spec.input_shape), np.float32)
    y = np.zeros((batch,), np.int32)
    t = time.perf_counter()
    lowered = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, tx.init(params), x, y)
    theirs = lowered.as_text()
    lower_s = time.perf_counter() - t
    t = time.perf_counter()
    lowered.compile()
    jax_compile_s = time.perf_counter() - t
    out: dict[str, object] = {"net": net, "batch": batch, "render_s": render_s, "jax_lower_s": lower_s,
                              "jax_compile_s": jax_compile_s, "ours_ops": dict(ops(ours)),
                              "jax_ops": dict(ops(theirs)), "ours_chars": len(ours), "jax_chars": len(theirs),
                              "auto_scheduler": auto_scheduler(ours)}
    for name, text in (("ours", ours), ("jax", theirs)):
        for sched in schedulers:
            s = auto_scheduler(ours) if sched == "auto" else (None if sched == "default" else sched)
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                exe = be.client.compile(text, 1, s)
                times.append(time.perf_counter() - t)
                del exe
            out[f"{name}_compile_s[{sched}]"] = min(times)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def main() -> None:
    from hloforge.bench.common import SUITE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", nargs="*", help="suite nets (default: the whole suite)")
    ap.add_argument("--reps", type=int, default=1, help="compiles of each text (the best is reported)")
    ap.add_argument("--schedulers", default="auto", help="comma-separated: auto, default, concurrent, sequential")
    ap.add_argument("--child", nargs=2, metavar=("NET", "BATCH"), help=argparse.SUPPRESS)
    ap.add_argument("--dump", metavar="DIR", help="also write both texts of each net there")
    args = ap.parse_args()
    scheds = args.schedulers.split(",")
    if args.child:
        r = child(args.child[0], int(args.child[1]), args.reps, scheds)
        print(json.dumps(r))
        return
    batch = dict(SUITE)
    for net in args.nets or [n for n, _ in SUITE]:
        cmd = [sys.executable, __file__, "--child", net, str(batch.get(net, 128)), "--reps", str(args.reps),
               "--schedulers", args.schedulers]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            print(f"{net}: failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        o, j = r.pop("ours_ops"), r.pop("jax_ops")
        print(f"{net} (batch {r['batch']}): ops ours {sum(o.values())} jax {sum(j.values())}; "
              + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                          if k not in ("net", "batch")))
        diff = sorted(set(o) | set(j), key=lambda k: -abs(o.get(k, 0) - j.get(k, 0)))
        print("   by kind (ours/jax): " + ", ".join(f"{k} {o.get(k, 0)}/{j.get(k, 0)}" for k in diff[:14]))


if __name__ == "__main__":
    main()
