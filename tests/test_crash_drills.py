"""Crash drills on real `hloforge train` processes: kill -9 at random points and resume (the final
checkpoint byte-identical to an uninterrupted run's), a full disk mid-checkpoint, a second trainer
in the same run directory. The long kill drill is scripts/crash_drill.py; the slow tests run it."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hloforge.cli import EXIT_BAD_INPUT
from hloforge.train import checkpoint as ckpt
from hloforge.train import rundir
from hloforge.train.trainer import CHECKPOINT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("crash_drill", os.path.join(ROOT, "scripts", "crash_drill.py"))
assert _spec is not None and _spec.loader is not None
crash_drill = sys.modules["crash_drill"] = importlib.util.module_from_spec(_spec)  # (dataclasses look it up)
_spec.loader.exec_module(crash_drill)

BACKENDS = ["xla", pytest.param("iree", marks=pytest.mark.skipif(
    importlib.util.find_spec("iree") is None, reason="iree packages not installed"))]
if os.environ.get("HLOFORGE_BACKEND"):  # a per-backend run (tox -e py311-xla / py311-iree): that backend only
    BACKENDS = [os.environ["HLOFORGE_BACKEND"]]
TIMEOUT = 600


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    for k in (ckpt.FAULT_ENV, ckpt.SLOW_WRITE_ENV, ckpt.TRACE_ENV):
        monkeypatch.delenv(k, raising=False)


def train_argv(backend: str, *extra: str, epochs: int = 3) -> list[str]:
    return [sys.executable, "-m", "hloforge.cli", "train", "--backend", backend, "--epochs", str(epochs),
            "--run-dir", "run", "--no-progress", *extra]


def error_lines(stderr: str) -> list[str]:
    """hloforge's own lines (an environment's warnings aside), with no traceback among them."""
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("hloforge:")]


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ------------------------------------------------------------------ the write path, in process
def test_the_same_checkpoint_serializes_to_the_same_bytes():
    """safetensors keeps metadata in a hash map whose order changes per map: the header is re-written
    sorted, or a resumed run could never match an uninterrupted one byte for byte."""
    meta = {k: {"v": i} for i, k in enumerate(("spec", "variant", "backend", "epoch", "step", "seed", "config"))}
    blobs = {ckpt.serialize(["param/0.w", "stat/0.mean"], [np.ones((2, 3), np.float32), np.zeros(3)], meta)
             for _ in range(8)}
    assert len(blobs) == 1


def test_a_failed_write_removes_the_temp_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = str(tmp_path / "f.bin")
    ckpt.write_atomic(path, b"old", "checkpoint")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt.os, "fsync", full)  # the disk fills as the data is forced out
    with pytest.raises(ckpt.HloforgeError, match=r"could not write checkpoint .*f.bin: No space left on device "
                                                 r"\(the previous checkpoint is whole, the temp file removed\)"):
        ckpt.write_atomic(path, b"new", "checkpoint")
    assert read(path) == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_resume_cuts_the_metrics_log_back_to_its_checkpoint(tmp_path):
    """A kill after an epoch's line (or mid-line) but before its checkpoint: resuming logs that epoch once."""
    lines = [{"kind": "step", "step": 1}, {"kind": "step", "step": 2}, {"kind": "epoch", "epoch": 1, "step": 2},
             {"kind": "step", "step": 3}, {"kind": "step", "step": 4}, {"kind": "epoch", "epoch": 2, "step": 4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "step", "st')
    rundir.rewind_metrics(str(tmp_path), 2)
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == lines[:3]
    assert not os.path.exists(tmp_path / ("metrics.jsonl" + ckpt.TMP_SUFFIX))


# ------------------------------------------------------------------ kill -9, resume, compare
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_drill_a_few_points(backend, tmp_path):
    """One kill aimed at each phase: mid-write of epoch 2's checkpoint, then mid-step and mid-eval in
    the resumed processes (seed 0 draws epoch 2 first); the run ends byte-identical to an
    uninterrupted one (2 epochs, to keep it short)."""
    rep = crash_drill.drill(backend, kills=3, seed=0, epochs=2, work=str(tmp_path),
                            targets=("checkpoint", "step", "eval"), log=lambda s: None)
    print(rep.summary())
    assert rep.failures == [], rep.summary()
    assert len(rep.kills) == 3 and rep.finished >= 1


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_drill_twenty_random_points(backend, tmp_path):
    """The acceptance drill: 20 kills at random points, every resume ending byte-identical."""
    rep = crash_drill.drill(backend, kills=20, seed=22, epochs=3, work=str(tmp_path), log=lambda s: None)
    print(rep.summary())
    assert rep.failures == [], rep.summary()
    assert len(rep.kills) == 20


# ------------------------------------------------------------------ a full disk
def _disk_full(backend: str, tmp_path) -> tuple[str, subprocess.CompletedProcess[str], str]:
    """Train 3 epochs where only one checkpoint fits: a 12 MiB tmpfs (mnist-mlp's is 8 MiB; the write
    of epoch 2's temp file runs out) in a private mount namespace, or where mounting is not allowed,
    RLIMIT_FSIZE under the checkpoint's size on a resume from epoch 1 (EFBIG; Python ignores SIGXFSZ).
    Returns the mechanism, the failed process, and the run directory (copied out of a tmpfs)."""
    work = tmp_path / "disk"
    work.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    argv = " ".join(train_argv(backend))
    script = (f"mount -t tmpfs -o size=12m tmpfs {work} || exit 99\ncd {work}\n"
              f"{argv} >{out}/stdout 2>{out}/stderr; echo $? >{out}/rc\ncp -a run {out}/run\n")
    if shutil.which("unshare"):
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode == 0:
            rc = int((out / "rc").read_text())
            done = subprocess.CompletedProcess(argv, rc, (out / "stdout").read_text(), (out / "stderr").read_text())
            return "tmpfs", done, str(out / "run")
    # no mount namespace here: epoch 1 checkpointed normally (then a kill mid-write of epoch 2), then a limit
    r = subprocess.run(train_argv(backend), cwd=work, env={**os.environ, ckpt.FAULT_ENV: "2"},
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == -signal.SIGKILL, r.stderr
    limit = os.path.getsize(work / "run" / CHECKPOINT) // 2

    def fsize() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(train_argv(backend, "--resume"), cwd=work, capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=fsize)
    return "RLIMIT_FSIZE", done, str(work / "run")


def test_a_full_disk_mid_checkpoint_keeps_the_previous_one_and_says_so(tmp_path):
    backend = "xla"  # the write path is the same on every backend; one suffices
    how, r, run = _disk_full(backend, tmp_path)
    err = error_lines(r.stderr)
    assert r.returncode == EXIT_BAD_INPUT and len(err) == 1, (how, r.returncode, r.stderr)
    assert err[0].startswith("hloforge: error: could not write checkpoint run/checkpoint.safetensors: ")
    assert ("No space left on device" if how == "tmpfs" else "File too large") in err[0]
    assert "the previous checkpoint is whole, the temp file removed" in err[0]
    _, meta = ckpt.load_checkpoint(os.path.join(run, CHECKPOINT))  # whole: it loads
    assert meta["epoch"] == 1
    assert not [f for f in os.listdir(run) if ckpt.TMP_SUFFIX in f]
    # with space again, --resume finishes the run as if nothing had happened
    ref = tmp_path / "ref"
    ref.mkdir()
    assert subprocess.run(train_argv(backend), cwd=ref, capture_output=True, timeout=TIMEOUT).returncode == 0
    cwd = os.path.dirname(run)
    r = subprocess.run(train_argv(backend, "--resume"), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert read(os.path.join(run, CHECKPOINT)) == read(ref / "run" / CHECKPOINT)


# ------------------------------------------------------------------ one trainer per run directory
def test_a_second_trainer_in_the_same_run_directory_is_refused_and_a_resume_after_kill_9_is_not(tmp_path):
    trace = str(tmp_path / "trace")
    # the first trainer, slowed in its checkpoint writes so it is alive throughout
    first = subprocess.Popen(train_argv("xla"), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, ckpt.TRACE_ENV: trace, ckpt.SLOW_WRITE_ENV: "1"})
    try:
        assert crash_drill.wait_for(first, trace, ("checkpoint", "1"), time.monotonic() + TIMEOUT), \
            first.communicate()[1]
        run = tmp_path / "run"
        config = (run / "config.toml").stat().st_mtime_ns
        for extra in ((), ("--resume",)):
            r = subprocess.run(train_argv("xla", *extra), cwd=tmp_path, capture_output=True, text=True,
                               timeout=TIMEOUT)
            err = error_lines(r.stderr)
            assert r.returncode == EXIT_BAD_INPUT and len(err) == 1, r.stderr
            assert err[0] == (f"hloforge: error: run directory run is in use by another hloforge process (pid "
                              f"{first.pid}); wait for it to end, or pass --run-dir/--tag for a new run")
        assert (run / "config.toml").stat().st_mtime_ns == config  # the refused ones wrote nothing
        assert (run / rundir.LOCK).read_text().strip() == str(first.pid)
        assert first.poll() is None  # still training, undisturbed
        assert crash_drill.wait_for(first, trace, ("checkpoint", "2"), time.monotonic() + TIMEOUT)
    finally:
        first.kill()  # kill -9, mid-write of epoch 2's checkpoint
        first.wait(TIMEOUT)
    assert first.returncode == -signal.SIGKILL
    r = subprocess.run(train_argv("xla", "--resume"), cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert "resumed after epoch 1" in r.stdout


def test_a_kill_while_the_end_plot_is_drawn_is_finished_by_resume(tmp_path, monkeypatch):
    """Killed after its last checkpoint, while curves.png was written aside: the run directory kept
    curves.png.tmp and no plot, and --resume only said the run was finished, so they stayed (the drill's
    'no temp file left' failed). Now the resume takes the lock, drops a dead writer's temp files and draws
    the missing plot, then says the run is finished."""
    from hloforge.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["train", "mnist-linear", "--epochs", "1", "--run-dir", "run", "--no-progress"]
    assert main(argv) == 0
    drawn = read(tmp_path / "run" / "curves.png")
    os.replace(tmp_path / "run" / "curves.png", tmp_path / "run" / "curves.png.tmp")
    (tmp_path / "run" / "curves.png.tmp").write_bytes(drawn[:100])  # as a kill mid-write leaves it
    assert main([*argv, "--resume"]) == EXIT_BAD_INPUT
    assert sorted(os.listdir(tmp_path / "run")) == [".lock", "checkpoint.safetensors", "config.toml", "curves.png",
                                                    "eval_correct.npz", "metrics.jsonl", "run-id"]
    assert read(tmp_path / "run" / "curves.png")[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ SIGTERM and SIGHUP
def started_mid_checkpoint(tmp_path) -> subprocess.Popen:
    """A run of mnist-linear, returned once it is writing epoch 2's checkpoint (slowly: SLOW_WRITE_ENV)."""
    trace = str(tmp_path / "trace")
    proc = subprocess.Popen(train_argv("xla", "--net", "mnist-linear"), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, ckpt.TRACE_ENV: trace, ckpt.SLOW_WRITE_ENV: "0.1"})
    if not crash_drill.wait_for(proc, trace, ("checkpoint", "2"), time.monotonic() + TIMEOUT):
        proc.kill()
        raise AssertionError(proc.communicate()[1])
    return proc


def assert_left_whole_and_resumed(tmp_path) -> None:
    """No temp file beside the checkpoint, and --resume goes on from epoch 1's."""
    assert not [n for n in os.listdir(tmp_path / "run") if n.endswith(ckpt.TMP_SUFFIX)]
    r = subprocess.run(train_argv("xla", "--resume", epochs=2), cwd=tmp_path, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0 and "resumed after epoch 1" in r.stdout, r.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_mid_checkpoint_stops_the_run_as_ctrl_c_does(signum, tmp_path):
    """A scheduler's stop before its kill (SLURM, Kubernetes: SIGTERM) or a closed terminal (SIGHUP),
    landing mid-write of epoch 2's checkpoint. Before, the process died at once: no line, status -n, the
    temp file left beside the checkpoint, a compile worker or producer processes left running. Now as at
    Ctrl-C: one line, exit 128 + n, no temp file, and --resume goes on from epoch 1's checkpoint."""
    proc = started_mid_checkpoint(tmp_path)
    try:
        proc.send_signal(signum)
        err = proc.communicate(timeout=TIMEOUT)[1]
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err
    assert error_lines(err) == [f"hloforge: stopped by {signal.Signals(signum).name}"]
    assert_left_whole_and_resumed(tmp_path)


@pytest.mark.parametrize("second", ["50 ms later", "as the line is said"])
def test_two_ctrl_cs_mid_checkpoint_stop_the_run_as_one_does(second, tmp_path):
    """Ctrl-C twice (a key held down, an impatient user), the first landing mid-write of epoch 2's checkpoint.
    Before, the second raised again while the run stopped or, once the interpreter was finalizing, ended the
    process by SIGINT: status -2 after the one line (28 runs of 30, 50 ms apart at random moments). Now the
    second changes nothing: one line, exit 130, no temp file, and --resume goes on from epoch 1's checkpoint."""
    proc = started_mid_checkpoint(tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        said = ""
        if second == "50 ms later":
            time.sleep(0.05)
        else:
            while not said.startswith("hloforge:"):
                said = proc.stderr.readline()
                assert said, "the process ended without a line"
        proc.send_signal(signal.SIGINT)
        err = said + proc.communicate(timeout=TIMEOUT)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert error_lines(err) == ["hloforge: interrupted"]
    assert_left_whole_and_resumed(tmp_path)


def test_the_epoch_lines_reach_a_log_file_as_they_are_said(tmp_path):
    """`nohup hloforge train > train.log` (SLURM's output file too): stdout is a file, which Python writes in
    8 KB blocks. Before, `tail -f` showed no epoch until the run ended, and a kill -9 (the out-of-memory
    killer, a scheduler's kill after its SIGTERM) lost every line; now each line is written as it is said."""
    trace, log = str(tmp_path / "trace"), tmp_path / "train.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open(log, "w") as out:
        proc = subprocess.Popen(train_argv("xla", "--net", "mnist-linear"), cwd=tmp_path, stdout=out,
                                stderr=subprocess.PIPE, env={**env, ckpt.TRACE_ENV: trace})
        try:
            assert crash_drill.wait_for(proc, trace, ("checkpoint", "2"), time.monotonic() + TIMEOUT), \
                proc.communicate()[1]
        finally:
            proc.kill()
            proc.wait(TIMEOUT)
    assert "\nepoch 1/3 " in log.read_text()
