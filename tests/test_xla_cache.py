"""The XLA backend's on-disk executable cache: miss, hit, damaged entries, keys, concurrent processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from hloforge.backends import disk_cache
from hloforge.backends.xla import cache as xla_cache
from hloforge.backends.xla import compile_worker
from hloforge.backends.xla.backend import XlaBackend
from hloforge.backends.xla.cache import SUFFIX, XlaCacheWarning
from hloforge.core.errors import BackendError

# w is donated to output 0 (the train-step pattern)
STEP = """module @step {
  func.func public @main(%w: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}, %g: tensor<2x3xf32>)
      -> (tensor<2x3xf32>, tensor<f32>) {
    %lr = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %1 = stablehlo.multiply %0, %g : tensor<2x3xf32>
    %2 = stablehlo.subtract %w, %1 : tensor<2x3xf32>
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %3 = stablehlo.reduce(%w init: %zero) applies stablehlo.add across dimensions = [0, 1]
      : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
    return %2, %3 : tensor<2x3xf32>, tensor<f32>
  }
}
"""
W = np.arange(6, dtype=np.float32).reshape(2, 3)
G = np.ones((2, 3), np.float32)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(xla_cache.CACHE_ENV_VAR, raising=False)
    monkeypatch.delenv(disk_cache.MAX_MB_ENV_VAR, raising=False)
    return tmp_path / "xla"


def run_step(be: XlaBackend, exe) -> tuple[np.ndarray, float]:
    w = be.to_device(W)
    new_w, total = be.execute(exe, [w, be.to_device(G)])
    assert w._gone is not None  # donation holds for a loaded executable too
    return be.to_host(new_w), float(be.to_host(total))


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"*{SUFFIX}"))


def test_a_miss_stores_and_a_hit_loads_the_same_executable(cache):
    be = XlaBackend()
    exe = be.compile(STEP)
    assert exe.cache_hit is False and be.stats["compiles"] == 1 and be.stats["hits"] == 0
    (entry,) = entries(cache)
    assert not list(cache.glob(".*.tmp"))
    first = run_step(be, exe)

    again = XlaBackend()  # a new run: nothing shared in memory but the client
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hit = again.compile(STEP)
    assert hit.cache_hit is True and again.stats == {**again.stats, "compiles": 0, "hits": 1}
    assert hit.donated_inputs == exe.donated_inputs == (0,) and hit.input_specs == exe.input_specs
    assert hit.scheduler == exe.scheduler
    out = run_step(again, hit)
    np.testing.assert_array_equal(out[0], first[0])
    assert out[1] == first[1] == float(W.sum())
    np.testing.assert_allclose(out[0], W - 0.1, rtol=1e-6)
    assert entries(cache) == [entry]


def test_a_hit_touches_the_entry(cache):
    XlaBackend().compile(STEP)
    (entry,) = entries(cache)
    os.utime(entry, (1_000_000, 1_000_000))
    assert XlaBackend().compile(STEP).cache_hit
    assert entry.stat().st_mtime > 1_000_000


def _truncate(blob: bytes, other: bytes) -> bytes:
    return blob[: len(blob) // 2]


def _flip_payload(blob: bytes, other: bytes) -> bytes:
    out = bytearray(blob)
    out[-len(out) // 3] ^= 0x5A
    return bytes(out)


def _flip_header(blob: bytes, other: bytes) -> bytes:
    out = bytearray(blob)
    at = out.index(b'"replicas": 1')
    out[at + len('"replicas": ')] = ord("7")
    return bytes(out)


def _other_keys_entry(blob: bytes, other: bytes) -> bytes:
    return other


def _not_an_entry(blob: bytes, other: bytes) -> bytes:
    return b"\x00" * 64


def _empty(blob: bytes, other: bytes) -> bytes:
    return b""


@pytest.mark.parametrize("damage", [_truncate, _flip_payload, _flip_header, _other_keys_entry, _not_an_entry,
                                    _empty])
def test_a_damaged_or_foreign_entry_warns_once_and_is_compiled_again(cache, damage):
    be = XlaBackend()
    be.compile(STEP)
    (mine,) = entries(cache)
    be.compile(STEP.replace("1.000000e-01", "2.000000e-01"))  # another key's entry, to copy in
    (other,) = [p for p in entries(cache) if p != mine]
    mine.write_bytes(damage(mine.read_bytes(), other.read_bytes()))

    fresh = XlaBackend()
    with pytest.warns(XlaCacheWarning) as caught:
        exe = fresh.compile(STEP)
    assert len(caught) == 1 and str(mine) in str(caught[0].message)
    assert "\n" not in str(caught[0].message)
    assert exe.cache_hit is False and fresh.stats["compiles"] == 1 and fresh.stats["hits"] == 0
    np.testing.assert_allclose(run_step(fresh, exe)[0], W - 0.1, rtol=1e-6)
    # the entry was replaced: the next run loads it, quietly
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert XlaBackend().compile(STEP).cache_hit


def test_an_entry_the_plugin_cannot_load_is_compiled_again(cache):
    """A whole entry for this key whose payload the plugin refuses (its checksum matches: written so)."""
    be = XlaBackend()
    options, _ = be.client.build_options(1, "sequential")
    material = xla_cache.key_material(be.client, STEP, options, 1)
    key = xla_cache.sha256_key(material)
    path = be.cache.path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(xla_cache.encode_entry(key, material, b"not an executable"))
    with pytest.warns(XlaCacheWarning, match="does not load") as caught:
        exe = be.cache.compile(be.client, STEP, scheduler="sequential")
    assert len(caught) == 1 and not exe.cache_hit and be.stats["compiles"] == 1
    assert be.cache.compile(be.client, STEP, scheduler="sequential").cache_hit


def test_options_text_and_replicas_are_part_of_the_key(cache):
    be = XlaBackend(devices=2)
    assert not be.cache.compile(be.client, STEP, scheduler="sequential").cache_hit
    assert not be.cache.compile(be.client, STEP, scheduler="concurrent").cache_hit
    assert not be.cache.compile(be.client, STEP, 2, scheduler="sequential").cache_hit
    assert not be.cache.compile(be.client, STEP.replace("1.000000e-01", "2.000000e-01"),
                                scheduler="sequential").cache_hit
    assert be.stats["compiles"] == 4 and len(entries(cache)) == 4
    replicated = be.cache.compile(be.client, STEP, 2, scheduler="sequential")
    assert replicated.cache_hit and replicated.num_replicas == 2 and be.stats["hits"] == 1
    per = [[be.to_device(W, device=r), be.to_device(G * (r + 1), device=r)] for r in range(2)]
    outs = be.execute_replicated(replicated, per)
    for r in range(2):
        np.testing.assert_allclose(be.to_host(outs[r][0]), W - 0.1 * (r + 1), rtol=1e-6)


def test_the_cache_is_off_with_zero_and_a_bad_value_is_one_line(cache, monkeypatch):
    monkeypatch.setenv(xla_cache.CACHE_ENV_VAR, "0")
    be = XlaBackend()
    assert not be.compile(STEP).cache_hit and not be.compile(STEP).cache_hit
    assert be.stats["compiles"] == 2 and not cache.exists()
    monkeypatch.setenv(xla_cache.CACHE_ENV_VAR, "maybe")
    with pytest.raises(BackendError, match=r"^HLOFORGE_XLA_CACHE='maybe': expected 1/true/yes/on \(.*, the default, "
                                           r"as is empty or unset\) or 0/false/no/off \(compile every time\)$"):
        be.compile(STEP)
    assert not cache.exists()


def test_entries_are_pruned_least_recently_used_first(cache, monkeypatch):
    cache.mkdir(parents=True)
    for age, name in enumerate(["c", "b", "a"]):  # a is the oldest
        (cache / f"{name}{SUFFIX}").write_bytes(b"x" * 600_000)
        os.utime(cache / f"{name}{SUFFIX}", (time.time() - 100 * age, time.time() - 100 * age))
    (cache / f".writing{SUFFIX}.1.tmp").write_bytes(b"x" * 600_000)  # another writer's: left alone
    (cache / "notes.txt").write_bytes(b"x" * 600_000)  # not an entry
    removed = disk_cache.prune(cache, SUFFIX, limit=1_400_000)  # 1.8 MB; without a: 1.2, under 0.9 × 1.4
    assert [p.name for p in removed] == [f"a{SUFFIX}"]
    monkeypatch.setenv(disk_cache.MAX_MB_ENV_VAR, "1")
    be = XlaBackend()
    be.compile(STEP)  # a write prunes to $HLOFORGE_CACHE_MAX_MB
    names = {p.name for p in cache.iterdir()}
    assert f"b{SUFFIX}" not in names and f"c{SUFFIX}" in names and len(entries(cache)) == 2
    assert {f".writing{SUFFIX}.1.tmp", "notes.txt"} <= names
    monkeypatch.setenv(disk_cache.MAX_MB_ENV_VAR, "2G")
    with pytest.raises(BackendError, match=r"^HLOFORGE_CACHE_MAX_MB='2G': expected a whole number of MiB"):
        be.compile(STEP.replace("1.000000e-01", "3.000000e-01"))


def test_a_writer_counts_the_cache_once_then_adds_its_writes_until_the_limit_or_rescan_s(cache, monkeypatch):
    """Every write stat'ed every entry of the directory: 23,000 entries made each write of the test suite's
    gate a scan of ~0.2 s."""
    scans = []
    scandir = os.scandir
    monkeypatch.setattr(disk_cache.os, "scandir", lambda d: scans.append(d) or scandir(d))
    clock = [1000.0]
    monkeypatch.setattr(disk_cache.time, "time", lambda: clock[0])
    cache.mkdir(parents=True)

    def write(name: str, size: int = 100_000) -> list[Path]:
        (cache / f"{name}{SUFFIX}").write_bytes(b"x" * size)
        clock[0] += 1
        os.utime(cache / f"{name}{SUFFIX}", (clock[0], clock[0]))
        return disk_cache.prune(cache, SUFFIX, keep=cache / f"{name}{SUFFIX}", limit=1_000_000)

    for i in range(9):  # 900 kB: the first write counts the directory, the next eight add to that count
        assert write(f"e{i}") == []
    assert len(scans) == 1
    removed = write("e9", 200_000)  # 1.1 MB would pass the limit: counted again, pruned to 900 kB
    assert len(scans) == 2 and [p.name for p in removed] == [f"e{i}{SUFFIX}" for i in range(2)]
    assert sum(os.path.getsize(cache / f"e{i}{SUFFIX}") for i in range(2, 10)) == 900_000
    (cache / f"other{SUFFIX}").write_bytes(b"x" * 50_000)  # another process's entry, not in this count
    clock[0] += disk_cache.RESCAN_S
    removed = write("e10", 60_000)  # 960 kB by this count, 1.01 MB by the directory's: counted again
    assert len(scans) == 3 and [p.name for p in removed] == [f"e2{SUFFIX}", f"e3{SUFFIX}"]


def test_a_concurrent_writer_does_not_break_a_reader(cache):
    """Another process rewrites the entry over and over (as a run that compiled it too would); every
    read here meanwhile loads a whole entry, never a partial one."""
    XlaBackend().compile(STEP)
    (entry,) = entries(cache)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from hloforge.backends.disk_cache import write_atomic
        path = Path({str(entry)!r}); blob = path.read_bytes()
        print("ready", flush=True)
        end = time.monotonic() + 60
        while time.monotonic() < end and not Path({str(entry)!r} + ".stop").exists():
            write_atomic(path, blob)
    """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == b"ready"
        be = XlaBackend()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(15):
                be.cache = xla_cache.ExecutableCache()
                assert be.compile(STEP).cache_hit
    finally:
        Path(str(entry) + ".stop").touch()
        assert writer.wait(timeout=120) == 0, writer.stderr.read().decode()


def test_two_processes_compiling_at_once_share_one_entry(cache):
    script = textwrap.dedent(f"""
        import numpy as np
        from hloforge.backends.xla.backend import XlaBackend
        be = XlaBackend()
        exe = be.compile({STEP!r})
        w, g = be.to_device(np.zeros((2, 3), np.float32)), be.to_device(np.ones((2, 3), np.float32))
        out, _ = be.execute(exe, [w, g])
        assert abs(float(be.to_host(out).sum()) + 0.6) < 1e-5
    """)
    env = {**os.environ, "HLOFORGE_CACHE_DIR": str(cache.parent)}
    procs = [subprocess.Popen([sys.executable, "-W", "error", "-c", script], env=env, stderr=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=180) == 0, p.stderr.read().decode()
    assert len(entries(cache)) == 1 and not list(cache.glob(".*.tmp"))
    assert XlaBackend().compile(STEP).cache_hit


def test_the_gate_compiles_through_the_cache(cache):
    from hloforge.testing import gate

    new_w, total = gate._run(STEP.replace(" {tf.aliasing_output = 0 : i32}", ""), [W, G])
    assert float(total) == float(W.sum()) and len(entries(cache)) == 1


def test_a_hit_keeps_the_plugins_harmless_load_log_off_stderr(cache, capfd):
    """XLA CPU logs a feature "mismatch" of two ~3 KB lines on every load on some CPUs (tuning flags
    it never finds among the host's); other lines written meanwhile still come out."""
    import re

    from hloforge.backends.xla.pjrt.api import stderr_without

    XlaBackend().compile(STEP)
    capfd.readouterr()
    assert XlaBackend().compile(STEP).cache_hit
    assert "cpu_aot_loader" not in capfd.readouterr().err
    with stderr_without(re.compile(rb"^drop")):
        os.write(2, b"drop this\nkeep this\n")
    assert capfd.readouterr().err == "keep this\n"


def test_a_hit_loads_in_a_process_without_sys_stderr(cache, monkeypatch):
    """sys.stderr is None where Python started without file descriptor 2 (pythonw, a service, `2>&-`).
    Before, every cache hit failed on its flush ('NoneType' object has no attribute 'flush': an internal
    error of `hloforge train 2>&-` once the cache held its step); now it loads."""
    XlaBackend().compile(STEP)
    monkeypatch.setattr(sys, "stderr", None)
    assert XlaBackend().compile(STEP).cache_hit


def test_the_serialization_structs_are_the_headers():
    """PJRT_STRUCT_SIZE at header minor 94 (pjrt_c_api.h): what the plugin checks struct_size against."""
    from hloforge.backends.xla.pjrt.c_api import _struct_size

    assert _struct_size("PJRT_Executable_Serialize_Args") == 7 * 8
    assert _struct_size("PJRT_Executable_DeserializeAndLoad_Args") == 8 * 8


def test_a_plugin_that_cannot_serialize_warns_once_and_still_compiles(cache, monkeypatch):
    from hloforge.backends.xla.pjrt import Executable

    def refuse(self):
        raise BackendError("XLA failed serializing an executable: no [UNIMPLEMENTED]")

    monkeypatch.setattr(Executable, "serialize", refuse)  # in this process: the compile worker's would serialize
    monkeypatch.setenv(compile_worker.ENV_VAR, "0")
    monkeypatch.setattr(xla_cache, "_UNSERIALIZABLE", set())
    be = XlaBackend()
    with pytest.warns(XlaCacheWarning, match="cannot serialize") as caught:
        first, second = be.compile(STEP), be.compile(STEP)
    assert len(caught) == 1 and not first.cache_hit and not second.cache_hit and be.stats["compiles"] == 2
    assert not cache.exists() or not entries(cache)
    np.testing.assert_allclose(run_step(be, second)[0], W - 0.1, rtol=1e-6)


def test_a_cache_directory_that_cannot_be_written_warns_once(tmp_path, monkeypatch):
    """Every entry of an unwritable cache fails alike: one warning naming the directory and the two
    variables, not one per executable; each still compiles and runs."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(blocker))  # a file: its xla/ subdirectory cannot be made
    monkeypatch.delenv(xla_cache.CACHE_ENV_VAR, raising=False)
    monkeypatch.setattr(disk_cache, "_UNWRITABLE", set())
    be = XlaBackend()
    with pytest.warns(XlaCacheWarning) as caught:
        exes = [be.compile(STEP), be.compile(STEP.replace("1.000000e-01", "2.000000e-01"))]
    assert [str(w.message) for w in caught] == [
        f"XLA cache: cannot write to {blocker / 'xla'} (Not a directory); executables are not cached "
        "($HLOFORGE_CACHE_DIR names a writable directory, $HLOFORGE_XLA_CACHE=0 turns the cache off)"]
    assert [e.cache_hit for e in exes] == [False, False]
    np.testing.assert_allclose(run_step(be, exes[1])[0], W - 0.2, rtol=1e-6)


def test_an_entry_is_readable_by_the_other_users_of_a_shared_cache(tmp_path):
    """An entry gets a new file's mode under the umask (0644 under 022), as the cache directory does: written
    0600 (mkstemp's), every other user of a shared $HLOFORGE_CACHE_DIR took each entry for damaged and
    compiled it again."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        os.umask(0o022)
        from pathlib import Path
        from hloforge.backends.disk_cache import write_atomic
        path = Path({str(tmp_path / "entry")!r})
        write_atomic(path, b"x")
        print(oct(path.stat().st_mode & 0o777))
    """)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0o644"


def test_an_entry_follows_the_umask_the_user_has_when_it_is_written(tmp_path):
    """A program that sets its umask (0o077: nothing it makes is for others) after hloforge's import got entries
    of the import's umask (0644) all the same."""
    from hloforge.backends.disk_cache import write_atomic

    mask = os.umask(0o077)
    try:
        write_atomic(tmp_path / "entry", b"x")
        assert os.umask(0o077) == 0o077  # and left as the user set it
    finally:
        os.umask(mask)
    assert oct((tmp_path / "entry").stat().st_mode & 0o777) == "0o600"
