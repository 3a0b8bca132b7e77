"""Multi-process data parallelism on XLA CPU: the evidence behind docs/distributed.md, re-runnable.

hloforge does not train across processes: no XLA CPU PJRT plugin we can install takes a
key-value store and the rank/count options that cross-process collectives need. These tests
pin what jax's own CPU plugin build (`lammps-jax-pjrt-cpu`) does, on two real processes on
loopback, and run the same module on jaxlib's non-plugin CPU client as the control: there it
all-reduces across the two processes, so the module, the compile options and the launcher are
right and the refusal is the plugin's. If a plugin update makes these fail, the plugin has
gained what was missing: revisit docs/distributed.md ("Several processes").

They need the plugin (`pip install lammps-jax-pjrt-cpu`, ~200 MB; not a project dependency)
and skip without it. Each plugin runs in a child process of its own: two XLA builds are never
loaded into one process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 90

# Two replicas, one per process; replica r holds [r+1]*4, so the all-reduced sum is [3]*4.
ALL_REDUCE = """
module @cross_process_sum attributes {mhlo.num_replicas = 2 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""
# XLA CPU global device id: process index << 11 | local ordinal (one device per process here).
GLOBAL_IDS = [[0], [1 << 11]]


# ------------------------------------------------------------------ the children


def plugin_child(rank: int, plugin: str) -> dict:
    """On the PJRT plugin: which rank options it takes, whether it calls a KV store, and what
    compiling the 2-process all-reduce does."""
    from hloforge.backends.xla import pjrt
    from hloforge.core.errors import BackendError

    api = pjrt.load_api(plugin)
    refused = {}
    for name in ("node_id", "num_nodes"):
        try:
            pjrt.Client(plugin, {"cpu_device_count": 1, name: rank}).close()
            refused[name] = None
        except BackendError as exc:
            refused[name] = str(exc)

    kv_calls: list[str] = []

    def recorder(slot: str):
        @pjrt.ffi.callback("void*(void*)")
        def record(args):  # a real store would fill in args; this one only records that it was asked
            kv_calls.append(slot)
            return pjrt.ffi.NULL
        return record

    callbacks = {slot: recorder(slot) for slot in ("kv_get", "kv_try_get", "kv_put")}
    options, keep = pjrt.api._named_values({"cpu_device_count": 1, "process_id": rank})
    client = api.call("Client_Create", "creating a client with a KV store", create_options=options,
                      num_options=2, **{f"{slot}_callback": pjrt.ffi.cast("void*", cb)
                                        for slot, cb in callbacks.items()}).client
    del keep
    listed = api.call("Client_AddressableDevices", "listing devices", client=client)
    device_ids = []
    for i in range(listed.num_addressable_devices):
        desc = api.call("Device_GetDescription", "describing", device=listed.addressable_devices[i])
        device_ids.append(api.call("DeviceDescription_Id", "reading an id",
                                   device_description=desc.device_description).id)
    compile_error = compile_all_reduce(api, client, GLOBAL_IDS)
    api.call("Client_Destroy", "destroying the client", client=client)
    # The control: the same module on two devices of this one process compiles.
    with pjrt.Client(plugin, {"cpu_device_count": 2, "process_id": rank}) as local:
        local_error = compile_all_reduce(api, local._handle, [[d.id] for d in local.devices])
    return {"refused": refused, "kv_calls": kv_calls, "device_ids": device_ids, "compile_error": compile_error,
            "local_compile_error": local_error}


def compile_all_reduce(api, client, assignment: list[list[int]]) -> str | None:
    """Compile ALL_REDUCE with `assignment` (global device ids) on a raw PJRT client; the error, if any."""
    from hloforge.backends.xla import pjrt
    from hloforge.core.errors import BackendError

    code, fmt = pjrt.ffi.new("char[]", ALL_REDUCE.encode()), pjrt.ffi.new("char[]", b"mlir")
    program = pjrt.ffi.new("PJRT_Program*")
    program.struct_size = pjrt.c_api._struct_size("PJRT_Program")
    program.code, program.code_size = code, len(ALL_REDUCE.encode())
    program.format, program.format_size = fmt, 4
    options = pjrt.compile_options(2, 1, assignment)
    try:
        compiled = api.call("Client_Compile", f"compiling the all-reduce for devices {assignment}", client=client,
                            program=program, compile_options=pjrt.ffi.new("char[]", options),
                            compile_options_size=len(options))
    except BackendError as exc:
        return str(exc)
    api.call("LoadedExecutable_Destroy", "destroying", executable=compiled.executable)
    return None


def jaxlib_child(rank: int, port: int) -> dict:
    """The control: jaxlib's own CPU client, with Gloo collectives over jax's distributed
    runtime (its KV store), both on 127.0.0.1; the same module and device assignment."""
    import jax
    import numpy as np
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    jax.config.update("jax_platforms", "cpu")
    address = f"127.0.0.1:{port}"
    jax.distributed.initialize(coordinator_address=address, coordinator_bind_address=address,
                               num_processes=2, process_id=rank, initialization_timeout=60)
    try:
        gloo = _jax.make_gloo_tcp_collectives(distributed_client=distributed.global_state.client,
                                              hostname="127.0.0.1")
        client = xla_bridge.make_cpu_client(collectives=gloo)
        devices = client.devices()
        options = _jax.CompileOptions()
        options.num_replicas, options.num_partitions = 2, 1
        options.device_assignment = _jax.DeviceAssignment.create(np.array(GLOBAL_IDS))
        exe = client.compile_and_load(ALL_REDUCE, _jax.DeviceList(tuple(devices)), options)
        mine = jax.device_put(np.full(4, rank + 1, np.float32), client.local_devices()[0])
        sharding = NamedSharding(Mesh(np.array(devices), ("replica",)), PartitionSpec("replica"))
        out = exe.execute_sharded([jax.make_array_from_single_device_arrays((8,), sharding, [mine])])
        result = np.asarray(out.disassemble_into_single_device_arrays()[0][0]).tolist()
    finally:
        jax.distributed.shutdown()
    return {"device_ids": [d.id for d in devices], "result": result}


# ------------------------------------------------------------------ the launcher


def run_pair(*args: str) -> list[dict]:
    """Run this file as two child processes (ranks 0 and 1) at once; each prints one JSON line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    children = [subprocess.Popen([sys.executable, __file__, args[0], str(rank), *args[1:]], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for rank in range(2)]
    deadline, results = time.monotonic() + TIMEOUT_S, []
    try:
        for rank, child in enumerate(children):
            try:
                out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {rank} ({' '.join(args)}) did not finish in {TIMEOUT_S} s")
            if child.returncode != 0:
                pytest.fail(f"rank {rank} ({' '.join(args)}) exited {child.returncode}:\n{err[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:  # reap both, whatever happened to the other
            if child.poll() is None:
                child.kill()
                child.wait()
    return results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def plugin_runs() -> list[dict]:
    lammps = pytest.importorskip(
        "lammps_jax_pjrt_cpu", reason="the multi-process evidence runs on jax's CPU PJRT plugin build: "
        "pip install lammps-jax-pjrt-cpu (see docs/distributed.md)")
    return run_pair("plugin", str(lammps.PLUGIN_PATH))


def test_plugin_refuses_node_id_and_num_nodes(plugin_runs):
    for run in plugin_runs:
        for name in ("node_id", "num_nodes"):
            assert f"Unexpected option name passed to PJRT_Client_Create: {name}" in run["refused"][name]


def test_plugin_takes_process_id_but_never_asks_the_kv_store(plugin_runs):
    # process_id only renumbers the local devices; each client sees its own device and no other.
    assert [run["device_ids"] for run in plugin_runs] == GLOBAL_IDS
    assert [run["kv_calls"] for run in plugin_runs] == [[], []]


def test_plugin_cannot_compile_an_all_reduce_across_two_processes(plugin_runs):
    for run in plugin_runs:
        assert "Multiprocess computations aren't implemented on the CPU backend" in run["compile_error"]
        assert run["local_compile_error"] is None  # the module is fine where both replicas are local


def test_control_jaxlib_client_with_gloo_runs_the_same_all_reduce_across_two_processes(plugin_runs):
    pytest.importorskip("jax", reason="the control runs on jaxlib's CPU client")
    runs = run_pair("jaxlib", str(free_port()))
    assert [run["device_ids"] for run in runs] == [[ids[0] for ids in GLOBAL_IDS]] * 2
    assert [run["result"] for run in runs] == [[3.0] * 4] * 2


if __name__ == "__main__":
    mode, rank = sys.argv[1], int(sys.argv[2])
    child = plugin_child(rank, sys.argv[3]) if mode == "plugin" else jaxlib_child(rank, int(sys.argv[3]))
    print(json.dumps(child), flush=True)
