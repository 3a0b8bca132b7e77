"""XLA compiles in a worker process under the kept heap: the same executable, and every failure of the
worker answered by compiling here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from test_xla_cache import STEP, W, run_step  # tests/ is on sys.path (rootdir-relative, no package)

from hloforge.backends import host_memory
from hloforge.backends.xla import cache as xla_cache
from hloforge.backends.xla import compile_worker
from hloforge.backends.xla.backend import XlaBackend
from hloforge.core.errors import BackendError

# a type error XLA's parser refuses
BROKEN = "func.func @main(%a: tensor<2xf32>) -> tensor<3xf32> {\n  return %a : tensor<2xf32>\n}\n"


@pytest.fixture
def backend(monkeypatch, tmp_path) -> XlaBackend:
    """A backend compiling every time (no cache), with the worker on, started for any module."""
    monkeypatch.setenv(xla_cache.CACHE_ENV_VAR, "0")
    monkeypatch.delenv(compile_worker.ENV_VAR, raising=False)
    monkeypatch.setattr(compile_worker, "COLD_START_MIN_CHARS", 0)
    be = XlaBackend(cache_dir=tmp_path)
    if not compile_worker.takes(be.client.platform_name, STEP):
        pytest.skip("the heap is not kept here (not glibc, or HLOFORGE_HOST_MEMORY=release): no worker")
    return be


def worker(be: XlaBackend) -> compile_worker.CompileWorker:
    return compile_worker.worker_for(be.client.plugin_path, len(be.client.devices))


def test_the_worker_compiles_what_this_process_would(backend, monkeypatch):
    exe = backend.compile(STEP)
    assert backend.stats["worker_compiles"] == backend.stats["compiles"] == 1 and not exe.cache_hit
    assert exe.donated_inputs == (0,)
    out = run_step(backend, exe)

    monkeypatch.setenv(compile_worker.ENV_VAR, "0")
    here = backend.compile(STEP)
    assert backend.stats["worker_compiles"] == 1 and backend.stats["compiles"] == 2
    assert here.input_specs == exe.input_specs and here.scheduler == exe.scheduler
    expected = run_step(backend, here)
    np.testing.assert_array_equal(out[0], expected[0])
    assert out[1] == expected[1] == float(W.sum())


def test_a_cache_miss_stores_the_workers_executable_and_a_hit_loads_it(monkeypatch, tmp_path):
    monkeypatch.delenv(xla_cache.CACHE_ENV_VAR, raising=False)
    monkeypatch.setattr(compile_worker, "COLD_START_MIN_CHARS", 0)
    be = XlaBackend(cache_dir=tmp_path)
    if not compile_worker.takes(be.client.platform_name, STEP):
        pytest.skip("no worker here")
    exe = be.compile(STEP)
    assert be.stats["worker_compiles"] == 1 and len(list(tmp_path.glob(f"*{xla_cache.SUFFIX}"))) == 1
    again = XlaBackend(cache_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hit = again.compile(STEP)
    assert hit.cache_hit and again.stats["compiles"] == 0
    (w_hit, total_hit), (w_miss, total_miss) = run_step(again, hit), run_step(be, exe)
    np.testing.assert_array_equal(w_hit, w_miss)
    assert total_hit == total_miss == float(W.sum())


def test_a_module_that_does_not_compile_is_the_error_it_always_was(backend, monkeypatch):
    with pytest.raises(BackendError) as in_worker:
        backend.compile(BROKEN)
    assert backend.stats["worker_compiles"] == 0
    monkeypatch.setenv(compile_worker.ENV_VAR, "0")
    with pytest.raises(BackendError) as here:
        backend.compile(BROKEN)
    assert str(in_worker.value) == str(here.value) and "3xf32" in str(here.value)
    monkeypatch.delenv(compile_worker.ENV_VAR)
    backend.compile(STEP)  # the worker is still there for the next module
    assert backend.stats["worker_compiles"] == 1


def test_a_short_module_starts_no_worker_but_a_running_one_takes_it(backend, monkeypatch):
    worker(backend).close()
    monkeypatch.setattr(compile_worker, "COLD_START_MIN_CHARS", len(STEP) + 1)
    backend.compile(STEP)
    assert backend.stats["worker_compiles"] == 0 and worker(backend)._proc is None
    monkeypatch.setattr(compile_worker, "COLD_START_MIN_CHARS", len(STEP))
    backend.compile(STEP)  # long enough: starts one
    monkeypatch.setattr(compile_worker, "COLD_START_MIN_CHARS", len(STEP) + 1)
    backend.compile(STEP)  # short, but the worker is running
    assert backend.stats["worker_compiles"] == 2


def test_a_worker_that_died_is_started_again(backend):
    backend.compile(STEP)
    proc = worker(backend)._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    exe = backend.compile(STEP)
    assert backend.stats["worker_compiles"] == 2 and worker(backend)._proc is not proc
    assert run_step(backend, exe)[1] == float(W.sum())


def test_an_idle_worker_exits_and_the_next_compile_starts_another(backend, monkeypatch):
    worker(backend).close()
    monkeypatch.setattr(compile_worker, "IDLE_EXIT_S", 0.2)
    backend.compile(STEP)
    proc = worker(backend)._proc
    assert proc is not None and proc.wait(timeout=30) == 0
    backend.compile(STEP)
    assert backend.stats["worker_compiles"] == 2 and worker(backend)._proc is not proc


def test_a_worker_that_cannot_start_leaves_the_compile_here(backend, monkeypatch):
    worker(backend).close()
    monkeypatch.setattr(compile_worker.sys, "executable", "/nonexistent/python")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exe = backend.compile(STEP)
    assert backend.stats["worker_compiles"] == 0 and backend.stats["compiles"] == 1
    assert run_step(backend, exe)[1] == float(W.sum())


def test_a_worker_that_dies_on_starting_leaves_the_compile_here(backend, monkeypatch, tmp_path):
    worker(backend).close()
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 3\n")  # started, it exits at once
    python.chmod(0o755)
    monkeypatch.setattr(compile_worker.sys, "executable", str(python))
    exe = backend.compile(STEP)
    assert backend.stats["worker_compiles"] == 0 and worker(backend)._proc is None
    assert run_step(backend, exe)[1] == float(W.sum())


def test_an_interrupted_compile_stops_the_worker(backend, monkeypatch):
    backend.compile(STEP)
    proc, read_part = worker(backend)._proc, compile_worker._read_part

    def interrupted(stream):
        raise KeyboardInterrupt

    monkeypatch.setattr(compile_worker, "_read_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backend.compile(STEP)
    assert worker(backend)._proc is None and proc is not None and proc.poll() is not None
    monkeypatch.setattr(compile_worker, "_read_part", read_part)
    backend.compile(STEP)
    assert backend.stats["worker_compiles"] == 2


def test_which_modules_the_worker_takes(backend, monkeypatch):
    host_call = STEP.replace("%3 = stablehlo.reduce", "%9 = stablehlo.custom_call @f(%w) : (tensor<2x3xf32>) -> "
                                                       "tensor<f32>\n  %3 = stablehlo.reduce")
    assert compile_worker.takes("cpu", STEP)
    assert not compile_worker.takes("cpu", host_call)  # a host call is a function of this process
    assert not compile_worker.takes("cuda", STEP)
    python = compile_worker.sys.executable
    for embedding in ("/opt/app/bin/blender", ""):  # an application embedding Python, or none said
        monkeypatch.setattr(compile_worker.sys, "executable", embedding)
        assert not compile_worker.takes("cpu", STEP)
    monkeypatch.setattr(compile_worker.sys, "executable", python)
    monkeypatch.setenv(compile_worker.ENV_VAR, "off")
    assert not compile_worker.takes("cpu", STEP)
    monkeypatch.setenv(compile_worker.ENV_VAR, "sometimes")
    with pytest.raises(BackendError, match=r"^HLOFORGE_XLA_COMPILE_WORKER='sometimes': expected 1/"):
        compile_worker.takes("cpu", STEP)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/dump")
    assert not compile_worker.takes("cpu", STEP)  # a dump is one process's modules
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setattr(host_memory, "_applied", False)
    monkeypatch.setenv(compile_worker.ENV_VAR, "1")
    assert not compile_worker.takes("cpu", STEP)


def test_a_bad_switch_fails_when_the_backend_is_made_before_a_net_is_rendered(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_worker.ENV_VAR, "sometimes")
    with pytest.raises(BackendError, match="HLOFORGE_XLA_COMPILE_WORKER='sometimes'"):
        XlaBackend(cache_dir=tmp_path)


def test_a_compile_from_another_thread_meanwhile_is_done_here(backend):
    """One compile at a time in the worker: a second thread's compiles here rather than wait."""
    w = worker(backend)
    with w._lock:
        result: list = []
        t = threading.Thread(target=lambda: result.append(backend.compile(STEP)))
        t.start()
        t.join(timeout=120)
    assert result and backend.stats["worker_compiles"] == 0 and backend.stats["compiles"] == 1


def test_the_bench_can_read_the_workers_peak(backend):
    from hloforge.bench.timing import workers_peak_rss_mb

    backend.compile(STEP)
    peak = workers_peak_rss_mb()
    if peak is None:
        pytest.skip("no /proc here")
    assert 10 < peak < 4096


# A process whose compile (resnet18-cifar's step, seconds) goes to a worker: it prints the worker's pid once
# the module is in the worker's pipe, then waits for the answer.
COMPILING = """
import sys
from hloforge.backends.xla import compile_worker
from hloforge.backends.xla.backend import XlaBackend
from hloforge.core.modules import train_step_module
from hloforge.core.strategy import target_of
from hloforge.core.variant import Variant
from hloforge.zoo import get_net

be = XlaBackend(cache_dir=sys.argv[1])
text, _ = train_step_module(get_net("resnet18-cifar"), Variant("sgd"), 8, target=target_of(be))
read_part = compile_worker._read_part

def asked(stream):
    compile_worker._read_part = read_part
    print(*compile_worker.worker_pids(), flush=True)
    return read_part(stream)

compile_worker._read_part = asked
be.compile(text)
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie nobody has reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_ends_soon_after_its_parent_is_killed_mid_compile(tmp_path, monkeypatch):
    """kill -9 (or the out-of-memory killer) on the process whose module the worker is compiling: the
    worker goes within a second, not at the compile's end seconds later."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    monkeypatch.setenv(xla_cache.CACHE_ENV_VAR, "0")
    monkeypatch.delenv(compile_worker.ENV_VAR, raising=False)
    parent = subprocess.Popen([sys.executable, "-c", COMPILING, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        line = parent.stdout.readline().split()
        if not line:
            pytest.skip("the compile was not given to a worker here (heap not kept)")
        pid = int(line[0])
        time.sleep(0.2)  # well into the compile
        assert _running(pid)
        parent.kill()
        parent.wait()
        gone = time.monotonic() + 1.0
        while _running(pid) and time.monotonic() < gone:
            time.sleep(0.02)
        assert not _running(pid)
    finally:
        parent.kill()
        parent.wait()
        if pid is not None and _running(pid):  # the worker this test started, left behind
            os.kill(pid, signal.SIGKILL)


def test_an_idle_worker_that_exited_is_reaped_without_another_compile(backend, monkeypatch):
    """Before: a worker that exited idle stayed a zombie (a `<defunct>` process) until the next compile or exit."""
    worker(backend).close()
    monkeypatch.setattr(compile_worker, "IDLE_EXIT_S", 0.2)
    backend.compile(STEP)
    proc = worker(backend)._proc
    assert proc is not None
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{proc.pid}") and time.monotonic() < deadline:  # a zombie's entry stays
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{proc.pid}"), "the exited worker was left a zombie"
    assert proc.returncode == 0
