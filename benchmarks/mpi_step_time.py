"""Step time across MPI processes (hloforge.train.mpi) at P = 1 and 2, each rank pinned to one core.

For each net: one Adam step (host batch in, loss out, state resident), median over the timed steps, in
fresh processes launched by MPICH's `mpiexec -n P -iface lo` (loopback):

- P = 1, fused: TrainSession, what a one-process run uses;
- P = 1, split: MpiTrainSession alone (the gradient half, then the update half; no all-reduce): the
  cost of splitting the step;
- P = 2, strong: the same global batch B, each rank B/2;
- P = 2, weak: each rank the P = 1 batch B (global 2B).

Each rank pins itself to core `rank` (os.sched_setaffinity, before the XLA client starts its threads), so
P = 2 brings a second core. The communication share is the time in the flat all-reduce (waiting for the
slower rank included) over the step time, rank 0's. Reported, not asserted.

    python benchmarks/mpi_step_time.py                      # mnist-mlp and mnist-cnn, batch 64
    python benchmarks/mpi_step_time.py --nets mnist-cnn --batch 32 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def child(net: str, mode: str, batch: int, steps: int, warmup: int) -> None:
    from hloforge.train import mpi

    w = mpi.world()
    os.sched_setaffinity(0, {w.rank % os.cpu_count()})  # before the client's threads exist
    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession, make_backend
    from hloforge.zoo import get_net

    spec, be = get_net(net), make_backend("xla")
    variant = Variant("adam")
    if mode == "fused":
        session: Any = TrainSession(spec, variant, batch, be)
    else:
        session = mpi.MpiTrainSession(spec, variant, batch, be, world=w, replicas=w.size)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, spec.num_classes, batch).astype(np.int32)
    times, comm = [], []
    for i in range(warmup + steps):
        c0 = getattr(session, "comm_s", 0.0)
        t = time.perf_counter()
        session.train_step(x, y, 1e-3)
        if i >= warmup:
            times.append(time.perf_counter() - t)
            comm.append(getattr(session, "comm_s", 0.0) - c0)
    if w.is_root:
        med = statistics.median(times)
        print(json.dumps({"net": net, "mode": mode, "P": w.size, "global_batch": batch, "step_ms": 1e3 * med,
                          "comm_ms": 1e3 * statistics.median(comm), "img_s": batch / med}), flush=True)
    w.finalize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nets", default="mnist-mlp,mnist-cnn")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--child", nargs=5, metavar=("NET", "MODE", "BATCH", "STEPS", "WARMUP"))
    a = p.parse_args()
    if a.child:
        net, mode, batch, steps, warmup = a.child
        return child(net, mode, int(batch), int(steps), int(warmup))
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit("no mpiexec: pip install 'hloforge[mpi]'")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows = []
    for net in a.nets.split(","):
        for procs, mode, batch in ((1, "fused", a.batch), (1, "split", a.batch), (2, "strong", a.batch),
                                   (2, "weak", 2 * a.batch)):
            cmd = [mpiexec, "-n", str(procs), "-iface", "lo", sys.executable, __file__, "--child", net,
                   "fused" if mode == "fused" else "split", str(batch), str(a.steps), str(a.warmup)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if out.returncode:
                sys.exit(f"{net} {mode} P={procs} failed:\n{out.stdout}{out.stderr}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["mode"] = mode
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(f"{'net':<10} {'P':>2} {'mode':<7} {'batch':>5} {'step ms':>8} {'img/s':>7} {'comm ms':>8} {'comm %':>6}")
    for r in rows:
        print(f"{r['net']:<10} {r['P']:>2} {r['mode']:<7} {r['global_batch']:>5} {r['step_ms']:>8.2f} "
              f"{r['img_s']:>7.0f} {r['comm_ms']:>8.2f} {100 * r['comm_ms'] / r['step_ms']:>6.1f}")


if __name__ == "__main__":
    main()
