"""What users running hloforge over several processes and backends get wrong, and what they then see: IREE
under an MPI launcher, a bad HLOFORGE_MPI_TIMEOUT across ranks, `hloforge bench` counts and net names.
The MPI cases launch MPICH's `mpiexec -n 2 -iface lo` as tests/test_mpi.py does (and skip without it)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_mpi import HLOFORGE, MPIEXEC, env, needs_mpi, tensors

from hloforge.cli import main

needs_iree = pytest.mark.skipif(importlib.util.find_spec("iree.runtime") is None, reason="iree not installed")


@needs_iree
def test_an_iree_device_opens_where_an_mpi_launcher_set_its_variables(tmp_path):
    """IREE's runtime reads PMI_SIZE/PMI_RANK and then wanted an MPI channel of its own: every rank of
    `mpiexec -n 2 hloforge train --backend iree` failed with 'Could not create device'. A fresh process
    (the device is made once a process), the variables a hydra rank has, a compile that opens the device."""
    child = textwrap.dedent("""
        import os
        from hloforge.backends.iree import IreeBackend
        from hloforge.testing.backend_conformance import STEP
        IreeBackend().compile(STEP)
        print(os.environ["PMI_SIZE"], os.environ["PMI_RANK"])
    """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300,
                       env=env(PMI_SIZE="2", PMI_RANK="1", HLOFORGE_CACHE_DIR=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["2", "1"]  # the launcher's variables are back for MPI


def epochs(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m.get("kind") == "epoch"]


@needs_mpi
@needs_iree
def test_two_ranks_train_on_iree_as_one_process_does(tmp_path):
    """mnist-mlp has no batch statistics, so 2 ranks at global batch 64 take the one-process steps."""
    def cmd(run_dir: Path) -> list[str]:
        return [*HLOFORGE, "train", "mnist-mlp", "--data", "digits", "--epochs", "1", "--batch", "64",
                "--backend", "iree", "--run-dir", str(run_dir), "--no-progress"]
    e = env(HLOFORGE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([MPIEXEC, "-n", "2", "-iface", "lo", *cmd(tmp_path / "two")], capture_output=True,
                       text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run(cmd(tmp_path / "one"), capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    two, one = epochs(tmp_path / "two")[-1], epochs(tmp_path / "one")[-1]
    assert two["top1"] == one["top1"] and abs(two["loss"] - one["loss"]) <= 1e-5 * abs(one["loss"])
    a, b = tensors(tmp_path / "two"), tensors(tmp_path / "one")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=k)


@needs_mpi
@pytest.mark.parametrize("value", ["abc", "inf"])
def test_a_bad_mpi_timeout_is_one_line_for_the_job_and_exit_3(tmp_path, value):
    """Every rank reads the same variable: rank 0 says it, MPI ends in order (exit 3, not hydra's 9)."""
    r = subprocess.run([MPIEXEC, "-n", "2", "-iface", "lo", *HLOFORGE, "train", "mnist-linear", "--epochs", "1",
                        "--run-dir", str(tmp_path / "r"), "--no-progress"], capture_output=True, text=True,
                       env=env(HLOFORGE_MPI_TIMEOUT=value), timeout=300)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [f"hloforge: error: HLOFORGE_MPI_TIMEOUT='{value}': expected a positive "
                                     "number of seconds"]
    assert not (tmp_path / "r").exists()


FAST = ["--nets", "mnist-linear", "--backends", "hloforge-xla", "--no-roofline", "--dispatch-calls", "0",
        "--isolate", "", "--batch", "4", "--steps", "1", "--warmup", "1"]


@pytest.mark.parametrize(("flag", "value"), [("--rounds", "0"), ("--steps", "0"), ("--warmup", "-1"),
                                             ("--lr", "nan"), ("--cap-s", "0")])
def test_a_bench_count_out_of_range_is_a_usage_line(capsys, flag, value):
    """--rounds 0 was an internal error (KeyError), --steps 0 a table of failures with exit 0."""
    assert main(["bench", *FAST, flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hloforge bench: error: argument {flag}: expected"), err


def test_an_unknown_bench_net_is_refused_before_anything_is_measured(capsys):
    """It ran every backend, printed a table of failures and exited 0."""
    assert main(["bench", *FAST, "--nets", "mnist-linear,mnist-mpl"]) == 3
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1].startswith("hloforge: error: unknown net 'mnist-mpl'")
    assert "[bench]" not in err and out == ""


@pytest.mark.parametrize("net", ["tinygpt-nano", "ddpm-mini", "fpn-mini"])
def test_a_net_that_is_no_classifier_is_refused_before_anything_is_measured(capsys, net):
    """Each backend compiled it apart and failed ('crossEntropy takes logits [classes]', jax.jit's row only JAX's
    note on its traceback), in a table with exit 0."""
    from hloforge.zoo import get_net

    assert main(["bench", *FAST, "--nets", f"mnist-linear,{net}"]) == 3
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [f"hloforge: error: net {net!r} outputs {list(get_net(net).out_shape)}; bench "
                                         "times a classifier's Adam step (cross-entropy on [classes] logits), so "
                                         "expected a net whose output is its class scores, such as mnist-cnn"]
    assert out == ""


def under_two_ranks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MPIEXEC, "-n", "2", "-iface", "lo", *HLOFORGE, *args], capture_output=True, text=True,
                          env=env(), timeout=300)


@needs_mpi
def test_a_run_dir_another_process_holds_is_one_line_from_two_ranks(tmp_path):
    """Rank 0 alone takes the lock; its refusal was a fault it reported alone, so MPI_Abort added MPICH's
    own 'Abort(3) on node 0 ...' line. Now every rank refuses together."""
    from hloforge.train import rundir

    run = tmp_path / "r"
    with rundir.locked(str(run), str(run / "checkpoint.safetensors")):
        r = under_two_ranks("train", "mnist-linear", "--epochs", "1", "--run-dir", str(run), "--no-progress")
    assert r.returncode == 3, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "is in use by another hloforge process" in r.stderr, r.stderr


@needs_mpi
def test_a_run_dir_that_holds_a_checkpoint_is_one_line_from_two_ranks(tmp_path):
    run = tmp_path / "r"
    cmd = ["train", "mnist-linear", "--epochs", "1", "--run-dir", str(run), "--no-progress"]
    assert main(cmd) == 0
    before = (run / "checkpoint.safetensors").read_bytes()
    r = under_two_ranks(*cmd)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [f"hloforge: error: run directory {run} already holds a checkpoint; pass "
                                     "--resume to continue it, or --tag/--run-dir for a new run"]
    assert (run / "checkpoint.safetensors").read_bytes() == before


def test_an_unknown_bench_backend_is_a_usage_line(capsys):
    assert main(["bench", *FAST, "--backends", "hloforge-xla,jaxjit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hloforge bench: error: argument --backends: unknown backend(s) "
                                               "['jaxjit']"), err


@needs_mpi
def test_ctrl_c_of_a_two_rank_job_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C reaches mpiexec's whole process group: each rank printed 'interrupted' and exited without
    MPI_Finalize, so hydra SIGKILLed the job (exit 9, two lines). Now the ranks meet, rank 0 says it once,
    MPI ends in order: the README's 130. The checkpoint rank 0 wrote is whole."""
    import os
    import signal
    import time

    from safetensors.numpy import load_file

    run = tmp_path / "r"
    job = subprocess.Popen([MPIEXEC, "-n", "2", "-iface", "lo", *HLOFORGE, "train", "mnist-mlp", "--epochs", "200",
                            "--run-dir", str(run), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env(), start_new_session=True)  # its own group, as a terminal's job
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoint.safetensors").exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # mid-epoch 2
        os.killpg(job.pid, signal.SIGINT)
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, err
    assert err.splitlines() == ["hloforge: interrupted"]
    assert load_file(str(run / "checkpoint.safetensors"))


@needs_mpi
def test_eval_under_mpiexec_prints_its_score_once(tmp_path, capsys):
    """Scoring is one process's (docs/distributed.md): every rank scored the whole split and printed it."""
    run = tmp_path / "r"
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    scored = capsys.readouterr().out.strip().splitlines()
    r = under_two_ranks("eval", str(run))
    assert r.returncode == 0, r.stderr
    assert len(scored) == 1 and "test top-1" in scored[0]
    assert r.stdout.strip().splitlines() == scored


@pytest.mark.parametrize("rank, prints", [("1", False), ("0", True)])
def test_a_command_that_is_not_training_runs_on_rank_0_alone(monkeypatch, capsys, rank, prints):
    """Under a launcher only `train` runs across the ranks; `summary`, `render`, `bench`, `plot`, ... ran once
    per rank, printing (and measuring, and writing) it all again; the other ranks now end at once, exit 0."""
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", rank)
    assert main(["summary", "mnist-mlp"]) == 0
    out = capsys.readouterr().out
    assert ("params" in out.lower()) == prints, out


@needs_mpi
def test_summary_under_mpiexec_prints_once():
    one = subprocess.run([*HLOFORGE, "summary", "mnist-mlp"], capture_output=True, text=True, env=env(), timeout=120)
    assert one.returncode == 0, one.stderr
    r = under_two_ranks("summary", "mnist-mlp")
    assert r.returncode == 0, r.stderr
    assert r.stdout == one.stdout


@pytest.mark.parametrize("extra, said", [
    (["--isolate", "hloforge-xlaa"], "argument --isolate: unknown backend(s) ['hloforge-xlaa']"),
    (["--nets", ","], "argument --nets: names nothing to measure (',')"),
    (["--backends", ""], "argument --backends: names nothing to measure ('')"),
    (["--json", "."], "argument --json: cannot write .; expected a file path in an existing, writable directory"),
])
def test_bench_options_that_would_measure_nothing_or_be_lost_are_a_usage_line(extra, said, capsys):
    """Before: a misspelled --isolate name was measured in-process unsaid, an empty --nets or --backends printed
    empty tables, and --json to a directory failed after the whole benchmark (its results never written)."""
    assert main(["bench", *FAST, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hloforge bench: error: {said}"), err
