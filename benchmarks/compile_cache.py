"""Time to the first train step on XLA with a cold and a warm executable cache, per suite net.

Each net runs twice, each time in a fresh process on one fresh cache directory: the first run
compiles (cold: the cache is empty), the second finds the executable the first stored (warm).
Per run: render (net spec -> StableHLO text), compile or load (the backend's own count), the first
step (Adam, batch from the suite) and their sum, the time to the first step once the modules are
imported; "process" is the child's whole wall time, imports and interpreter start included. "setup
CPU s" is the process's CPU time (all threads) for render + compile/load: on a loaded machine the
wall times stretch, that much less.

    python benchmarks/compile_cache.py                      # the bench suite
    python benchmarks/compile_cache.py --nets mnist-mlp mnist-cnn
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(net: str, batch: int) -> dict[str, float | bool]:
    from hloforge.bench.common import batches, load_net
    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession, make_backend

    spec = load_net(net)
    x, y = batches(spec, batch, 1, 0)[0]
    be = make_backend("xla")
    t0, c0 = time.perf_counter(), time.process_time()
    session = TrainSession(spec, Variant("adam"), batch, be, seed=0)
    t1, c1 = time.perf_counter(), time.process_time()
    loss = session.train_step(x, y, 1e-3)
    t2 = time.perf_counter()
    stats = be.stats
    return {"hit": bool(session.exe.cache_hit), "setup_s": t1 - t0, "compile_s": stats["compile_s"],
            "load_s": stats["load_s"], "setup_cpu_s": c1 - c0, "first_step_s": t2 - t1, "to_first_step_s": t2 - t0,
            "loss": float(loss)}


def run(net: str, batch: int, cache_dir: str) -> dict[str, float | bool]:
    env = {**os.environ, "HLOFORGE_CACHE_DIR": cache_dir, "HLOFORGE_XLA_CACHE": "1"}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", net, str(batch)], env=env, check=True,
                         capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t
    return result


def main() -> None:
    from hloforge.bench.common import SUITE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", nargs="*", help="suite nets to run (default: the whole suite)")
    ap.add_argument("--child", nargs=2, metavar=("NET", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    suite = [(n, b) for n, b in SUITE if not args.nets or n in args.nets]
    print("| net (batch) | run | hit | render s | compile/load s | setup CPU s | first step s | to first step s "
          "| process s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for net, batch in suite:
        with tempfile.TemporaryDirectory(prefix="hloforge-cache-bench-") as cache_dir:
            for label in ("cold", "warm"):
                r = run(net, batch, cache_dir)
                built = r["compile_s"] + r["load_s"]
                print(f"| {net} ({batch}) | {label} | {'yes' if r['hit'] else 'no'} | {r['setup_s'] - built:.2f} | "
                      f"{built:.2f} | {r['setup_cpu_s']:.2f} | {r['first_step_s']:.2f} | {r['to_first_step_s']:.2f} | "
                      f"{r['process_s']:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
