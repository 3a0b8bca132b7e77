"""Data-parallel step time on XLA CPU devices, and the multi-process probe.

Step time: one Adam train step (host batch in, loss out, θ/state resident on every
device), median over the timed steps, for each net at 1 device (TrainSession) and at 2
devices (DataParallelTrainSession), each configuration in a fresh process whose client has
exactly that many CPU devices (`cpu_device_count`). Two scalings:

- strong: the same global batch B; 2 replicas each run B/2.
- weak: the same per-replica batch b; 2 replicas run 2b (upstream's 1.67–1.70× on 2 GPUs
  is this kind: each GPU brings its own compute).

Scaling efficiency = throughput(2 devices) / (2 × throughput(1 device)). On a CPU the
"devices" share the machine's cores: one device already spreads its ops over every core,
so 2 CPU devices add no compute and efficiency ≤ 50% is the expected ceiling, not a defect.
What the numbers measure here is the cost of the split and the all-reduce.

Probe (`--probe`): does the XLA CPU plugin take a key-value store and node_id/num_nodes at
client creation, as multi-process collectives need? It creates a client with all three
KV callbacks set and node_id=1, num_nodes=2, and reports whether any callback ran, the
process index and the global and addressable device counts (docs/distributed.md).

    python benchmarks/data_parallel.py                     # mnist-cnn and resnet-mini
    python benchmarks/data_parallel.py --nets mnist-cnn --steps 20 --batch 64
    python benchmarks/data_parallel.py --probe
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


def child(net: str, devices: int, batch: int, steps: int, warmup: int) -> dict[str, Any]:
    """Time one configuration: `batch` is the global batch, split over `devices` replicas."""
    from hloforge.backends.xla.backend import XlaBackend
    from hloforge.core.variant import Variant
    from hloforge.train.parallel import DataParallelTrainSession
    from hloforge.train.session import TrainSession
    from hloforge.zoo import get_net

    spec, be = get_net(net), XlaBackend(devices=devices)
    t0 = time.perf_counter()
    session = (TrainSession(spec, Variant("adam"), batch, be) if devices == 1 else
               DataParallelTrainSession(spec, Variant("adam"), batch, be, replicas=devices))
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, spec.num_classes, batch).astype(np.int32)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        session.train_step(x, y, 1e-3)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    step = statistics.median(times)
    return {"net": net, "devices": devices, "batch": batch, "compile_s": compile_s, "step_ms": 1e3 * step,
            "images_per_s": batch / step, "steps": steps}


def run_child(net: str, devices: int, batch: int, steps: int, warmup: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", net, str(devices), str(batch), str(steps), str(warmup)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe() -> dict[str, Any]:
    """Create a CPU client with a KV store and node_id=1 of num_nodes=2; report what the plugin did."""
    import cffi

    from hloforge.backends.xla import pjrt

    api = pjrt.load_api(pjrt.find_plugin())
    calls: list[str] = []

    def recorder(name: str) -> Any:
        @pjrt.ffi.callback("void*(void*)")
        def callback(args: Any) -> Any:
            calls.append(name)
            return pjrt.ffi.NULL  # never reached on this plugin; a real store would fill args in
        return callback

    callbacks = {k: recorder(k) for k in ("kv_get", "kv_try_get", "kv_put")}
    options = {"cpu_device_count": 1, "node_id": 1, "num_nodes": 2}
    array, keep = pjrt.api._named_values(options)
    created = api.call("Client_Create", "creating a client with a KV store", create_options=array,
                       num_options=len(options), **{f"{k}_callback": pjrt.ffi.cast("void*", c)
                                                    for k, c in callbacks.items()})
    del keep
    client = created.client
    # Client_ProcessIndex and Client_Devices are not among the binding's typed calls: declare them here.
    local = cffi.FFI()
    local.cdef("typedef struct { size_t struct_size; void* ext; void* client; int process_index; } PI;"
               "typedef struct { size_t struct_size; void* ext; void* client; void** devices; size_t n; } DV;")

    def call(slot: str, ctype: str, size: int) -> Any:
        fn = local.cast(f"void*(*)({ctype}*)", int(pjrt.ffi.cast("uintptr_t", getattr(api._api, f"PJRT_{slot}"))))
        args = local.new(f"{ctype}*")
        args.struct_size, args.client = size, local.cast("void*", int(pjrt.ffi.cast("uintptr_t", client)))
        err = fn(args)
        if err != local.NULL:
            raise RuntimeError(f"PJRT_{slot} failed")
        return args

    process_index = call("Client_ProcessIndex", "PI", local.sizeof("PI")).process_index
    global_devices = call("Client_Devices", "DV", local.sizeof("DV")).n
    addressable = api.call("Client_AddressableDevices", "listing devices", client=client).num_addressable_devices
    api.call("Client_Destroy", "destroying the probe client", client=client)
    return {"plugin": api.path, "api_version": list(api.version), "options": options,
            "kv_callbacks_called": calls, "process_index": process_index, "global_devices": global_devices,
            "addressable_devices": addressable}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", default="mnist-cnn,resnet-mini")
    p.add_argument("--batch", type=int, default=64, help="the global batch of the strong-scaling runs")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--probe", action="store_true")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        net, devices, batch, steps, warmup = a.child
        print(json.dumps(child(net, int(devices), int(batch), int(steps), int(warmup))))
        return 0
    if a.probe:
        print(json.dumps(probe(), indent=2))
        return 0
    print(f"# {os.cpu_count()} CPUs; timings on a shared machine are noisy (median of {a.steps} steps)")
    print(f"{'net':12} {'scaling':7} {'devices':>7} {'batch':>6} {'step ms':>9} {'img/s':>8} {'speedup':>8} "
          f"{'efficiency':>10}")
    for net in a.nets.split(","):
        one = run_child(net, 1, a.batch, a.steps, a.warmup)
        half = run_child(net, 1, a.batch // 2, a.steps, a.warmup)
        strong = run_child(net, 2, a.batch, a.steps, a.warmup)
        weak = strong  # 2 replicas × b = a.batch//2 is the same run as the strong one at a.batch
        rows = [("strong", one, strong), ("weak", half, weak)]
        for kind, base, dp in rows:
            speedup = dp["images_per_s"] / base["images_per_s"]
            for r, sp, e in ((base, "", ""), (dp, f"{speedup:.2f}x", f"{50 * speedup:.0f}%")):
                print(f"{net:12} {kind:7} {r['devices']:>7} {r['batch']:>6} {r['step_ms']:>9.1f} "
                      f"{r['images_per_s']:>8.0f} {sp:>8} {e:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
