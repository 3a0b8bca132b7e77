"""What a train step's resident memory is made of: glibc's heap (live and free, from mallinfo2) right
after each step and at the end, and the process's RSS, each run in a fresh process.

Under the "retain" host-memory policy (hloforge/backends/host_memory.py) the heap keeps what a step
freed, so the peak RSS is the heap's high-water mark. XLA's CPU runtime frees a step's temporaries on
its worker thread just after the step's outputs are ready: "live right after a step" shows when the
host found them still live, and `--pause-ms` waits that long after each step before the next.

    python benchmarks/step_memory.py --net vit-cifar --batch 64 --runs 3
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time


def one_run(net: str, batch: int, steps: int, pause_ms: float) -> dict:
    from hloforge.backends.host_memory import mallinfo2
    from hloforge.bench.common import batches, load_net
    from hloforge.bench.timing import make_hloforge, peak_rss_mb

    def heap():  # glibc's heap statistics, checked once for all readings
        info = mallinfo2()
        assert info is not None, "step_memory.py reads glibc's heap (mallinfo2): glibc 2.33+ only"
        return info

    _, step, *_ = make_hloforge(net, "hloforge-xla", batch, 1e-3, 0)
    data = batches(load_net(net), batch, 4, 0)
    times, live_after = [], []
    for i in range(steps):
        t = time.perf_counter()
        step(*data[i % len(data)])
        live_after.append(heap().uordblks >> 20)  # right after the step returned
        time.sleep(pause_ms / 1e3)
        times.append(time.perf_counter() - t)
    rss = int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) >> 10
    info = heap()
    timed = sorted(times[2:])
    return {"pause_ms": pause_ms, "median_ms": 1e3 * timed[len(timed) // 2], "rss_mb": rss,
            "peak_mb": round(peak_rss_mb()), "heap_live_mb": info.uordblks >> 20, "heap_free_mb": info.fordblks >> 20,
            "live_after_step_mb": sorted(set(live_after[2:]))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", default="vit-cifar")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pause-ms", default="0", help="comma-separated pauses after each step, one process each")
    p.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print(json.dumps(one_run(a.net, a.batch, a.steps, a.child)))
        return
    print(f"{a.net} (batch {a.batch}), {a.steps} steps a process; MB")
    print("pause ms | median ms | peak RSS | RSS at end | heap live / free at end | heap live right after a step")
    for _ in range(a.runs):
        for pause in (float(x) for x in a.pause_ms.split(",")):
            out = subprocess.run([sys.executable, __file__, "--net", a.net, "--batch", str(a.batch), "--steps",
                                  str(a.steps), "--child", str(pause)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{r['pause_ms']:g} | {r['median_ms']:.1f} | {r['peak_mb']} | {r['rss_mb']} | "
                  f"{r['heap_live_mb']} / {r['heap_free_mb']} | {r['live_after_step_mb']}")


if __name__ == "__main__":
    main()
