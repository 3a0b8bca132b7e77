"""The XLA backend: the PJRT binding run end to end on the CPU plugin."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hloforge.backends.signature import parse_main_signature
from hloforge.backends.xla import Client, DeviceBuffer, default_client, find_plugin
from hloforge.backends.xla.pjrt import PLUGIN_ENV_VAR, compile_options
from hloforge.core.errors import BackendError
from hloforge.testing.backend_conformance import STEP  # the train-step pattern every backend runs

ADD = """module @add {{
  func.func public @main(%a: tensor<2x3x{t}>, %b: tensor<2x3x{t}>) -> tensor<2x3x{t}> {{
    %0 = stablehlo.add %a, %b : tensor<2x3x{t}>
    return %0 : tensor<2x3x{t}>
  }}
}}
"""

DOT = """module @dot {{
  func.func public @main(%a: tensor<2x3x{t}>, %b: tensor<3x4x{t}>) -> tensor<2x4x{t}> {{
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3x{t}>, tensor<3x4x{t}>) -> tensor<2x4x{t}>
    return %0 : tensor<2x4x{t}>
  }}
}}
"""

MLIR_TYPE = {np.float32: "f32", np.float64: "f64"}


@pytest.fixture(scope="module")
def client() -> Client:
    return default_client()


def _rng_array(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add(client, dtype):
    exe = client.compile(ADD.format(t=MLIR_TYPE[dtype]))
    a, b = _rng_array((2, 3), dtype, 1), _rng_array((2, 3), dtype, 2)
    (out,) = exe.run([a, b])
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, a + b)
    exe.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dot_general(client, dtype):
    exe = client.compile(DOT.format(t=MLIR_TYPE[dtype]))
    a, b = _rng_array((2, 3), dtype, 1), _rng_array((3, 4), dtype, 2)
    (out,) = exe.run([a, b])
    np.testing.assert_allclose(out, a @ b, rtol=1e-6 if dtype == np.float32 else 1e-12)


def test_client_basics(client):
    assert client.platform_name == "cpu"
    assert client.devices and all(d.kind == "cpu" for d in client.devices)
    assert client.api_version[0] == 0


def test_donated_input_is_consumed_in_a_training_loop(client):
    exe = client.compile(STEP)
    assert exe.donated_inputs == (0,)
    assert exe.num_outputs == 2
    w_host = _rng_array((2, 3), np.float32)
    g_host = np.ones((2, 3), np.float32)
    w, g = client.to_device(w_host), client.to_device(g_host)
    first_w = w
    for _ in range(3):
        new_w, total = exe.execute([w, g])
        assert w.is_deleted  # donated
        assert not g.is_deleted  # not donated: reused every step
        np.testing.assert_allclose(total.to_numpy(), w_host.sum(), rtol=1e-6)
        w_host = w_host - np.float32(0.1) * g_host
        w = new_w
    np.testing.assert_allclose(w.to_numpy(), w_host, rtol=1e-6)
    with pytest.raises(BackendError, match=r"donated .* argument 0.*keep=\[0\]"):
        first_w.to_numpy()
    with pytest.raises(BackendError, match="donated"):
        exe.execute([first_w, g])


def test_keep_prevents_donation(client):
    exe = client.compile(STEP)
    w_host = _rng_array((2, 3), np.float32)
    w, g = client.to_device(w_host), client.to_device(np.ones((2, 3), np.float32))
    new_w, _ = exe.execute([w, g], keep=[0])
    assert not w.is_deleted
    np.testing.assert_array_equal(w.to_numpy(), w_host)
    np.testing.assert_allclose(new_w.to_numpy(), w_host - np.float32(0.1), rtol=1e-6)
    with pytest.raises(BackendError, match="keep"):
        exe.execute([w, g], keep=[5])


def test_malformed_module_reports_the_parser_message(client):
    with pytest.raises(BackendError, match=r"compiling StableHLO.*'stablehlo\.addd' is unknown") as info:
        client.compile(ADD.format(t="f32").replace("stablehlo.add ", "stablehlo.addd "))
    assert info.value.code == "UNKNOWN"


def test_wrong_arguments_are_rejected_before_execution(client):
    exe = client.compile(ADD.format(t="f32"))
    good = client.to_device(np.zeros((2, 3), np.float32))
    exe.execute([good, good])  # accepted once: the check's fast path must still refuse what follows
    # (3, 2) f32 has the right byte size, which is all the CPU plugin checks.
    for bad, why in [
        (np.zeros((3, 2), np.float32), r"argument 1 is DeviceBuffer\(3x2 float32\).*2x3 float32"),
        (np.zeros((2, 3), np.float64), r"argument 1 is DeviceBuffer\(2x3 float64\).*2x3 float32"),
    ]:
        with pytest.raises(BackendError, match=why):
            exe.execute([good, client.to_device(bad)])
    with pytest.raises(BackendError, match="takes 2 arguments, got 1"):
        exe.execute([good])
    with pytest.raises(BackendError, match="not a DeviceBuffer"):
        exe.execute([good, np.zeros((2, 3), np.float32)])


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6, dtype=np.int32).reshape(2, 3),
        np.arange(6, dtype=np.int64),
        np.array([True, False, True]),
        np.arange(5, dtype=np.uint8),
        np.linspace(0, 1, 4, dtype=np.float16),
        np.float64(3.5),  # 0-d stays 0-d
        np.zeros((0, 3), np.float32),
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
    ],
    ids=["int32", "int64", "bool", "uint8", "float16", "scalar", "empty", "transposed"],
)
def test_round_trip(client, array):
    buf = client.to_device(array)
    assert buf.shape == np.shape(array) and buf.dtype == np.asarray(array).dtype
    np.testing.assert_array_equal(buf.to_numpy(), array)
    buf.delete()
    buf.delete()  # idempotent
    with pytest.raises(BackendError, match="was deleted"):
        buf.to_numpy()


def test_bfloat16_round_trip(client):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    array = np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(client.to_device(array).to_numpy(), array)


def test_bfloat16_module_signature_reads_bf16() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    (a, _) = parse_main_signature(ADD.format(t="bf16"))
    assert a.shape == (2, 3) and a.dtype == np.dtype(ml_dtypes.bfloat16)


def test_an_f32_program_runs_without_importing_ml_dtypes() -> None:
    """bfloat16's table rows are looked up only on a miss: ml_dtypes' import cost every process 0.6 s."""
    code = ("import sys, numpy as np; from hloforge.backends.xla.backend import XlaBackend; be = XlaBackend(); "
            "exe = be.compile(sys.argv[1]); a = be.to_device(np.ones((2, 3), np.float32)); "
            "print(be.to_host(be.execute(exe, [a, a])[0]).sum(), 'ml_dtypes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, ADD.format(t="f32")], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["12.0", "False"]


def test_unsupported_dtype(client):
    with pytest.raises(BackendError, match="dtype <U1 is not supported"):
        client.to_device(np.array(["a"]))


def test_own_client_with_options_and_teardown():
    with Client(create_options={"cpu_device_count": 2}) as own:
        assert [d.id for d in own.devices] == [0, 1]
        buf = own.to_device(np.ones(3), device=1)
        assert buf.device.id == 1
        exe = own.compile(ADD.format(t="f32"))
    with pytest.raises(BackendError, match="closed Client"):
        buf.to_numpy()
    with pytest.raises(BackendError, match="closed"):
        exe.execute([])
    own.close()  # idempotent
    with pytest.raises(BackendError, match="Client is closed"):
        own.to_device(np.ones(3))


def test_mistyped_client_option_is_caught_before_the_plugin_aborts():
    with pytest.raises(BackendError, match="cpu_device_count='2' must be of type int"):
        Client(create_options={"cpu_device_count": "2"})


def test_find_plugin_prefers_the_environment(monkeypatch):
    monkeypatch.delenv(PLUGIN_ENV_VAR, raising=False)
    installed = find_plugin()
    assert installed.endswith(".so")
    monkeypatch.setenv(PLUGIN_ENV_VAR, installed)
    assert find_plugin() == installed


def test_missing_plugin_in_environment_is_an_error_not_a_fallback(monkeypatch, tmp_path):
    missing = str(tmp_path / "no_such_plugin.so")
    monkeypatch.setenv(PLUGIN_ENV_VAR, missing)
    with pytest.raises(BackendError, match=missing):
        find_plugin()
    with pytest.raises(BackendError, match=missing):
        Client()


def test_a_file_that_is_not_a_plugin(tmp_path):
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"not an ELF file")
    with pytest.raises(BackendError, match=str(bogus)):
        Client(plugin_path=str(bogus))


def test_compile_options_wire_format():
    # Bytes jaxlib's CompileOptions.SerializeAsString() writes for these settings
    # (minus its debug_options and defaults): device_ordinal=-1, num_replicas=2,
    # num_partitions=1, device_assignment [[0], [1]].
    build = bytes.fromhex("08ffffffffffffffffff01" "2002" "2801" "4a0a" "0802" "1001" "1a040a020001")
    assert compile_options(2, 1, [[0], [1]]) == b"\x1a" + bytes([len(build)]) + build
    with pytest.raises(BackendError, match="device_assignment"):
        compile_options(2, 1, [[0]])


def test_parse_main_signature():
    specs = parse_main_signature(STEP)
    assert [(s.shape, s.dtype, s.aliasing_output) for s in specs] == [
        ((2, 3), np.dtype(np.float32), 0),
        ((2, 3), np.dtype(np.float32), None),
    ]
    text = 'func.func @main(%x: tensor<?x4xi1> {a.b = "x,)"}, %y: tensor<i64>, %t: !stablehlo.token) -> ()'
    specs = parse_main_signature(text)
    assert [(s.shape, s.dtype) for s in specs] == [
        ((None, 4), np.dtype(bool)),
        ((), np.dtype(np.int64)),
        (None, None),
    ]
    assert parse_main_signature("module {}") is None


def test_device_buffer_type(client):
    assert isinstance(client.to_device(np.ones(2)), DeviceBuffer)


def test_no_plugin_installed(monkeypatch):
    from hloforge.backends.xla import pjrt

    monkeypatch.delenv(PLUGIN_ENV_VAR, raising=False)
    monkeypatch.setattr(pjrt.discovery, "_PLUGIN_FINDERS", [("some_pkg", lambda: None)])
    with pytest.raises(BackendError, match=r"HLOFORGE_PJRT_PLUGIN is unset.*some_pkg.*pip install fastatomstruct-xla-cpu"):
        find_plugin()


def _address(client, buf) -> int:
    from hloforge.backends.xla.pjrt import ffi

    ptr = client._api.call("Buffer_UnsafePointer", "locating a buffer", buffer=buf._handle).buffer_pointer
    return int(ffi.cast("uintptr_t", ptr))


def test_borrowed_input_aliases_host_memory_and_keeps_it_alive(client):
    raw = np.empty(4 * 300 + 64, np.uint8)
    start = -raw.ctypes.data % 64
    host = raw[start:start + 4 * 300].view(np.float32)
    host[:] = np.arange(300)
    buf = client.to_device(host, borrow=True)
    assert _address(client, buf) == host.ctypes.data  # no copy
    misaligned = np.frombuffer(raw[start + 4:start + 4 + 4 * 299].tobytes(), np.float32).copy()
    misaligned_view = raw[start + 4:start + 4 + 4 * 299].view(np.float32)  # 4 bytes past a 64-byte boundary
    misaligned_view[:] = misaligned
    other = client.to_device(misaligned_view, borrow=True)
    assert _address(client, other) % 64 == 0 and _address(client, other) != misaligned_view.ctypes.data
    del raw, host, misaligned_view  # the buffers hold their host memory, not the caller
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(300, dtype=np.float32))
    np.testing.assert_array_equal(other.to_numpy(), misaligned)
    exe = client.compile(ADD.format(t="f32").replace("2x3x", "300x"))
    (out,) = exe.execute([buf, buf])
    np.testing.assert_array_equal(out.to_numpy(), 2 * np.arange(300, dtype=np.float32))
    buf.delete()
    other.delete()
    assert buf.is_deleted and other.is_deleted


def test_an_input_slot_is_rewritten_in_place_and_read_row_major(client):
    from hloforge.backends.xla.backend import XlaBackend

    be = XlaBackend(client)
    exe = client.compile(DOT.format(t="f32"))
    a = be.input_slot((2, 3), np.dtype(np.float32))
    b = client.to_device(_rng_array((3, 4), np.float32, seed=1))
    first = a.buffer
    for seed in range(3):  # each write is what the next execute reads: the slot is rewritten, never stale
        host = _rng_array((2, 3), np.float32, seed=10 + seed)  # not symmetric: a layout mix-up shows
        (out,) = exe.execute([a.write(host), b])
        np.testing.assert_allclose(out.to_numpy(), host @ b.to_numpy(), rtol=1e-6)
        assert a.buffer is first and not first.is_deleted
    with pytest.raises(BackendError, match=r"holds a float32 array of shape \[2, 3\]; got float64 \[2, 3\]"):
        a.write(np.zeros((2, 3)))
    with pytest.raises(BackendError, match=r"shape \[2, 3\]; got float32 \[3, 2\]"):
        a.write(np.zeros((3, 2), np.float32))
    # donated by an execute, the slot is gone: the next write says so instead of writing freed memory
    step = client.compile(STEP)
    w = be.input_slot((2, 3), np.dtype(np.float32))
    step.execute([w.write(np.ones((2, 3), np.float32)), client.to_device(np.ones((2, 3), np.float32))])
    with pytest.raises(BackendError, match="donated .* argument 0"):
        w.write(np.ones((2, 3), np.float32))


def test_an_input_slot_of_a_closed_client_refuses_the_write():
    from hloforge.backends.xla.backend import XlaBackend

    with Client() as own:
        slot = XlaBackend(own).input_slot((4,), np.dtype(np.float32))
    with pytest.raises(BackendError, match="closed Client"):
        slot.write(np.zeros(4, np.float32))


def test_the_xla_scheduler_is_read_from_the_environment_and_a_bad_name_is_refused(monkeypatch):
    from hloforge.backends.xla import pjrt

    for value, want in (("", None), ("auto", None), ("sequential", "sequential"), ("concurrent", "concurrent")):
        monkeypatch.setenv(pjrt.SCHEDULER_ENV_VAR, value)
        assert pjrt.xla_scheduler() == want
    monkeypatch.setenv(pjrt.SCHEDULER_ENV_VAR, "fastest")
    with pytest.raises(BackendError, match="HLOFORGE_XLA_SCHEDULER='fastest'; expected auto, concurrent, sequential"):
        pjrt.xla_scheduler()
    with pytest.raises(BackendError, match="XLA scheduler 'fastest'; expected one of concurrent, sequential"):
        pjrt.default_client().compile(IDENTITY, scheduler="fastest")


IDENTITY = "func.func @main(%a: tensor<f32>) -> tensor<f32> { return %a : tensor<f32> }"
CONV = """func.func @main(%x: tensor<1x1x4x4xf32>, %w: tensor<1x1x3x3xf32>) -> tensor<1x1x2x2xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {}
    {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x1x4x4xf32>, tensor<1x1x3x3xf32>) -> tensor<1x1x2x2xf32>
  return %0 : tensor<1x1x2x2xf32>
}"""


def test_each_executable_gets_its_own_scheduler_and_xla_really_uses_it(tmp_path):
    """In a child process that dumps XLA's debug options per module: a module without a convolution
    is compiled with the memory-optimized (sequential) schedule, one with a convolution with the
    concurrent one, a forced choice applies to both, and a scheduler in the user's XLA_FLAGS wins."""
    import json
    import os
    import subprocess
    import sys

    probe = ("import json, sys; from hloforge.train.session import make_backend; b = make_backend('xla'); "
             "print(json.dumps([b.compile(t).scheduler for t in sys.argv[1:]])); print(b.backend_name()); "
             "print(b.fingerprint())")

    def run(tag: str, env: dict[str, str]) -> tuple[list[str], str, str, list[str]]:
        dump = tmp_path / tag
        base = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "HLOFORGE_XLA_SCHEDULER")}
        flags = f"--xla_dump_to={dump} " + env.pop("XLA_FLAGS", "")
        out = subprocess.run([sys.executable, "-c", probe, IDENTITY, CONV], capture_output=True, text=True,
                             check=True, env=base | env | {"XLA_FLAGS": flags}).stdout.strip().split("\n")
        used = [p.read_text() for p in sorted(dump.glob("*.debug_options"))]  # module_0000 (IDENTITY), 0001 (CONV)
        return json.loads(out[0]), out[1], out[2], used

    got, name, fingerprint, used = run("auto", {})
    assert got == ["sequential", "concurrent"]
    assert "MEMORY_OPTIMIZED" in used[0] and "CONCURRENCY_OPTIMIZED" in used[1]
    assert "scheduler)" not in name and " scheduler auto " in fingerprint
    got, name, fingerprint, used = run("forced", {"HLOFORGE_XLA_SCHEDULER": "sequential"})
    assert got == ["sequential", "sequential"] and all("MEMORY_OPTIMIZED" in u for u in used)
    assert name.endswith("sequential scheduler)") and " scheduler sequential " in fingerprint
    user = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED"
    got, name, fingerprint, used = run("user", {"HLOFORGE_XLA_SCHEDULER": "sequential", "XLA_FLAGS": user})
    assert got == ["XLA_FLAGS", "XLA_FLAGS"] and all("CONCURRENCY_OPTIMIZED" in u for u in used)
    assert name.endswith("XLA_FLAGS scheduler)") and " scheduler XLA_FLAGS " in fingerprint


def test_the_auto_scheduler_is_concurrent_for_convnets_and_sequential_for_dots():
    from hloforge.backends.xla.backend import auto_scheduler
    from hloforge.core.modules import train_step_module
    from hloforge.core.variant import Variant
    from hloforge.zoo import get_net

    def step(name: str) -> str:
        return train_step_module(get_net(name), Variant("adam"), 2, target="xla")[0]

    assert auto_scheduler(step("mnist-cnn")) == auto_scheduler(CONV) == "concurrent"
    # a ViT's patch embedding is a convolution, but its dots are most of the program
    assert auto_scheduler(step("vit-cifar")) == auto_scheduler(step("mnist-mlp")) == "sequential"


def test_a_compile_option_xla_does_not_know_is_its_error_not_a_silent_default():
    from hloforge.backends.xla import pjrt

    with pytest.raises(BackendError, match="No such compile option: 'xla_no_such_option'"):
        pjrt.default_client().compile(IDENTITY, overrides={"xla_no_such_option": True})
    with pytest.raises(BackendError, match="expected bool, int, float or str"):
        pjrt.compile_options(overrides={"xla_cpu_scheduler_type": None})  # type: ignore[dict-item]


def test_compile_hands_the_compilers_freed_heap_back(monkeypatch, tmp_path):
    """glibc keeps the heap XLA's compiler freed, and a session's first steps' buffers came on top of
    it (resnet18-cifar: ~165 MB of a 255 MB compile peak): the backend trims the heap after each
    compile, cache hit or not."""
    from hloforge.backends import host_memory
    from hloforge.backends.xla import backend as xla_backend

    calls: list[int] = []
    monkeypatch.setattr(host_memory, "_malloc_trim", lambda: lambda pad: calls.append(pad))
    be = xla_backend.XlaBackend(cache_dir=tmp_path)
    text = "func.func @main(%a: tensor<f32>) -> tensor<f32> {\n  return %a : tensor<f32>\n}\n"
    be.compile(text)
    be.compile(text)  # the cache's hit
    assert calls == [0, 0] and be.stats["hits"] == 1


def test_an_xla_flag_the_plugin_does_not_know_is_one_line_before_xla_stops_the_process(monkeypatch, tmp_path):
    """XLA ends the process at its first compile on an unknown name in XLA_FLAGS (exit 1, a fatal log line,
    no hloforge line); the plugin's file holds every name it knows, so the name is checked before it loads."""
    from hloforge.backends.xla.pjrt.xla_flags import check_xla_flags

    plugin = find_plugin()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false --xla_dump_to=/tmp/d --v=1")
    check_xla_flags(plugin)  # XLA's own names pass, and a name not XLA's is left to XLA
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false --xla_cpu_enable_fast_mth=true")
    with pytest.raises(BackendError, match=r"^XLA_FLAGS: --xla_cpu_enable_fast_mth is not a flag of the XLA plugin "):
        check_xla_flags(plugin)
    env = {**os.environ, "XLA_FLAGS": "--xla_bogus_flag"}
    env.pop("HLOFORGE_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "hloforge.cli", "train", "--net", "mnist-mlp", "--epochs", "1",
                           "--run-dir", str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("hloforge: error: XLA_FLAGS: --xla_bogus_flag is not a flag of the XLA plugin ")
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()
