"""`hloforge train` under `mpiexec -n 2 -iface lo` where the ranks' machines differ: each rank in a working
directory of its own (-wdir, read through /proc/self/cwd), so one path holds another file, or none, per rank."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_mpi import HLOFORGE, MPIEXEC, env, needs_mpi  # tests/ is on sys.path (rootdir-relative, no package)


def per_rank(tmp_path: Path, cmd: list[str], **extra: str) -> subprocess.CompletedProcess:
    """`cmd` on 2 ranks, rank r started in tmp_path/w<r> (made here)."""
    assert MPIEXEC is not None
    argv = [MPIEXEC, "-iface", "lo"]
    for rank in range(2):
        (tmp_path / f"w{rank}").mkdir(exist_ok=True)
        argv += [*([":"] if rank else []), "-n", "1", "-wdir", str(tmp_path / f"w{rank}"), *cmd]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env(**extra))


def said(r: subprocess.CompletedProcess) -> list[str]:
    """Every line of the job's output but hloforge's (MPI's own included: the 'Abort(3) on node 1' of an
    MPI_Abort) and the run's own (its header's indented line, its epochs), and hloforge's lines."""
    lines = (r.stdout + r.stderr).splitlines()
    return [ln for ln in lines if ln.strip() and not ln.startswith(("hloforge", " ", "epoch "))], \
        [ln for ln in lines if ln.startswith("hloforge")]


def text_cmd(tmp_path: Path) -> list[str]:
    return [*HLOFORGE, "train", "tinygpt-nano", "--data", "text", "--data-file", "/proc/self/cwd/corpus.txt",
            "--epochs", "1", "--batch", "32", "--run-dir", str(tmp_path / "r"), "--no-progress"]


@needs_mpi
def test_a_data_file_missing_on_every_rank_is_one_line(tmp_path):
    """Before: every rank printed the line (twice in all), and rank 1's MPI_Abort added MPICH's own."""
    t = time.monotonic()
    r = per_rank(tmp_path, text_cmd(tmp_path))
    other, lines = said(r)
    assert r.returncode == 3 and time.monotonic() - t < 120, r.stdout + r.stderr
    assert lines == ["hloforge: error: text: /proc/self/cwd/corpus.txt: no such file or directory; expected a UTF-8 "
                     "text file (--data-file)"] and not other, r.stdout + r.stderr
    assert not (tmp_path / "r").exists()


@needs_mpi
def test_a_data_file_missing_on_one_rank_is_one_line_naming_it(tmp_path):
    """Before: rank 1's line did not say it was rank 1's (the file is there on rank 0's machine), and MPICH's
    abort line followed it."""
    (tmp_path / "w0").mkdir()
    (tmp_path / "w0" / "corpus.txt").write_text("the quick brown fox " * 400)
    r = per_rank(tmp_path, text_cmd(tmp_path))
    other, lines = said(r)
    assert r.returncode == 3, r.stdout + r.stderr
    assert lines == ["hloforge: error: text: /proc/self/cwd/corpus.txt: no such file or directory; expected a UTF-8 "
                     "text file (--data-file) (on rank 1 of 2 alone: every rank reads its own copy of the data)"], \
        r.stdout + r.stderr
    assert not other, r.stdout + r.stderr
    assert not (tmp_path / "r").exists()


def two_blocks(tmp_path: Path, cmd: list[str], rank1_env: dict[str, str]) -> subprocess.CompletedProcess:
    """`cmd` on 2 ranks, rank 1 with `rank1_env` on top of the launch's environment (hydra's -env)."""
    assert MPIEXEC is not None
    extra = [a for k, v in rank1_env.items() for a in ("-env", k, v)]
    return subprocess.run([MPIEXEC, "-iface", "lo", "-n", "1", *cmd, ":", "-n", "1", *extra, *cmd],
                          capture_output=True, text=True, timeout=200, env=env())


@needs_mpi
def test_a_rank_whose_strategy_lays_its_gradients_out_otherwise_is_refused_in_one_line(tmp_path):
    """HLOFORGE_STRATEGY set on one machine alone (paramLayout=public: conv kernels OIHW, where rank 0 carries
    them HWIO). Before: the ranks' ∂θ were summed slot by slot, one layout into the other, and mnist-cnn trained
    to a plausible loss (1.1340, not 1.0513; top-1 90.00%, not 91.94%)."""
    cmd = [*HLOFORGE, "train", "mnist-cnn", "--epochs", "1", "--run-dir", str(tmp_path / "r"), "--no-progress"]
    r = two_blocks(tmp_path, cmd, {"HLOFORGE_STRATEGY": "paramLayout=public"})
    other, lines = said(r)
    assert r.returncode == 3 and not other, r.stdout + r.stderr
    assert lines == ["hloforge: error: rank 1 of 2 was started with another train step than rank 0 (HLOFORGE_STRATEGY: "
                     "'paramLayout=public', not ''); give every rank the same HLOFORGE_STRATEGY and plugins"], \
        r.stdout + r.stderr
    assert not (tmp_path / "r" / "checkpoint.safetensors").exists()


@needs_mpi
def test_a_rank_whose_plugin_layer_computes_otherwise_is_refused_in_one_line(tmp_path):
    """One plugin distribution, another copy of its code on rank 1's machine (it triples where rank 0's doubles).
    Before: each rank trained its own net, summed into one, to a plausible loss (1.4353, not 1.3045)."""
    from plugin_site import fake_dist, layer_module

    for rank, factor in enumerate(("2.0", "3.0")):
        text = layer_module("scaleBy").replace("x * 2.0", f"x * {factor}").replace("2.0 * x", f"{factor} * x")
        fake_dist(tmp_path / f"site{rank}", "scale-layer", {"scale_layer": text},
                  {"hloforge.layers": {"scaleBy": "scale_layer"}})
    net = tmp_path / "net.json"
    net.write_text(json.dumps({"name": "scaled", "input_shape": [784], "num_classes": 10, "layers": [
        {"kind": "scaleBy"}, {"kind": "dense", "units": 10, "act": "identity", "bias": True}]}))
    cmd = [*HLOFORGE, "train", str(net), "--epochs", "1", "--run-dir", str(tmp_path / "r"), "--no-progress"]
    assert MPIEXEC is not None
    path = env()["PYTHONPATH"]
    r = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "1", "-env", "PYTHONPATH", f"{tmp_path / 'site0'}:{path}",
                        *cmd, ":", "-n", "1", "-env", "PYTHONPATH", f"{tmp_path / 'site1'}:{path}", *cmd],
                       capture_output=True, text=True, timeout=300, env=env())
    other, lines = said(r)
    assert r.returncode == 3 and not other, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "hloforge: error: rank 1 of 2 was started with another train step than rank 0 (program: "), r.stdout + r.stderr
    assert not (tmp_path / "r" / "checkpoint.safetensors").exists()


def cifar_batches(folder: Path, inverted: str = "") -> None:
    """A small CIFAR-10 binary set (40 records a file), the same on every call but for the pixels of the file
    `inverted` names (its labels kept)."""
    folder.mkdir(parents=True)
    for i, name in enumerate([*(f"data_batch_{k}.bin" for k in range(1, 6)), "test_batch.bin"]):
        rng = np.random.default_rng(i)
        labels, pixels = rng.integers(0, 10, (40, 1), np.uint8), rng.integers(0, 256, (40, 3072), np.uint8)
        (folder / name).write_bytes(np.concatenate([labels, 255 - pixels if name == inverted else pixels], 1).tobytes())


@needs_mpi
def test_a_rank_whose_train_images_alone_differ_is_refused_in_one_line(tmp_path):
    """One --data-dir path, rank 1's copy with other pixels in one train file and the same labels (another
    machine's copy, re-made or damaged). Before: only the labels were compared, and each rank trained on its own
    images to a plausible loss."""
    cifar_batches(tmp_path / "w0" / "c10")
    cifar_batches(tmp_path / "w1" / "c10", inverted="data_batch_3.bin")
    net = tmp_path / "net.json"
    net.write_text(json.dumps({"name": "lin3", "input_shape": [3, 32, 32], "num_classes": 10, "layers": [
        {"kind": "flatten"}, {"kind": "dense", "units": 10, "act": "identity", "bias": True}]}))
    r = per_rank(tmp_path, [*HLOFORGE, "train", str(net), "--data", "cifar10", "--data-dir", "/proc/self/cwd/c10",
                            "--epochs", "1", "--batch", "20", "--run-dir", str(tmp_path / "r"), "--no-progress"])
    other, lines = said(r)
    assert r.returncode == 3 and not other, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "hloforge: error: rank 1 of 2 was started with another config, net or data than rank 0 (data.train.inputs: "), \
        r.stdout + r.stderr
    assert not (tmp_path / "r" / "checkpoint.safetensors").exists()


@needs_mpi
def test_a_rank_that_fails_alone_mid_run_names_itself_in_one_line(tmp_path):
    """A fault one rank meets alone after the start (here its eval stream refuses a setting of that machine's
    environment at the first epoch's end). Before: its line did not say which rank's machine to look at, and
    MPICH's 'Abort(3) on node 1 (rank 1 in comm 0): ...' followed it."""
    cmd = [*HLOFORGE, "train", "mnist-mlp", "--workers", "1", "--epochs", "2", "--run-dir", str(tmp_path / "r"),
           "--no-progress"]
    t = time.monotonic()
    r = two_blocks(tmp_path, cmd, {"HLOFORGE_VAL_FAULT": "bogus"})
    other, lines = said(r)
    assert r.returncode == 3 and time.monotonic() - t < 120, r.stdout + r.stderr
    assert not other and lines[1:] == ["hloforge: error: HLOFORGE_VAL_FAULT='bogus'; expected one of ['order', "
                                       "'tail'] or unset (on rank 1 of 2)"], r.stdout + r.stderr


_SWITCH = "expected 1/true/yes/on ({}) or 0/false/no/off (the default, as is empty or unset)"


@needs_mpi
@pytest.mark.parametrize(("var", "value", "line"), [
    # Before: rank 1 refused it quietly (as if every rank had: 'they share the launch environment'), and rank 0
    # waited for it at the start, 20 × its own 30 s, with no line said.
    ("HLOFORGE_MPI_TIMEOUT", "abc", "expected a positive number of seconds (on rank 1 of 2 alone: give every rank the "
                                    "same HLOFORGE_MPI and HLOFORGE_MPI_TIMEOUT)"),
    # Before: rank 1 refused it before MPI_Init and left, quietly (as one process would with no world to make), and
    # rank 0 waited in MPI_Init for it for good.
    ("HLOFORGE_MPI", "bogus", _SWITCH.format("use MPI even where no launcher variable says so") + " (on rank 1 of 2 "
                              "alone: give every rank the same HLOFORGE_MPI and HLOFORGE_MPI_TIMEOUT)"),
    # Refused before any work, as on one machine. Before: rank 1 said it and left before MPI_Init, and rank 0 waited
    # there for it for good (the job hung).
    ("HLOFORGE_DEBUG", "bogus", _SWITCH.format("print tracebacks") + " (on rank 1 of 2 alone: start every rank with "
                                "the same command)"),
])
def test_a_bad_setting_on_one_machine_alone_is_one_line_naming_it(var, value, line, tmp_path):
    cmd = [*HLOFORGE, "train", "mnist-linear", "--epochs", "1", "--run-dir", str(tmp_path / "r"), "--no-progress"]
    t = time.monotonic()
    r = two_blocks(tmp_path, cmd, {var: value})
    other, lines = said(r)
    assert r.returncode == 3 and time.monotonic() - t < 60 and not other, r.stdout + r.stderr
    assert lines == [f"hloforge: error: {var}={value!r}: {line}"], r.stdout + r.stderr
    assert not (tmp_path / "r").exists()


_OTHER_INIT = """
import numpy as np
from hloforge.core import spec

drawn = spec.NetSpec.init_params
spec.NetSpec.init_params = lambda self, seed: [a + np.float32(0.01) for a in drawn(self, seed)]
"""


@needs_mpi
def test_a_rank_whose_plugin_code_draws_other_weights_trains_from_rank_0s(tmp_path):
    """Another copy of the code that draws θ on one machine alone (here a sitecustomize on rank 1's path; in life a
    plugin's initialisation of another version, or one that reads the machine), rendering the same program. Before:
    each rank trained from its own θ, which the averaged ∂θ never brought together (rank 0's weights differed from
    the same run's on two alike ranks); every rank now starts from rank 0's."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_OTHER_INIT)
    runs = {}
    for name, rank1 in (("alike", {}), ("other", {"PYTHONPATH": str(tmp_path / "site")})):
        cmd = [*HLOFORGE, "train", "mnist-linear", "--epochs", "1", "--run-dir", str(tmp_path / name), "--no-progress"]
        r = two_blocks(tmp_path, cmd, rank1)
        assert r.returncode == 0, r.stdout + r.stderr
        from safetensors.numpy import load_file

        runs[name] = load_file(str(tmp_path / name / "checkpoint.safetensors"))
    for k, v in runs["alike"].items():
        np.testing.assert_array_equal(runs["other"][k], v, err_msg=k)


_API_FIT = """
import os, sys
import numpy as np
import hloforge as hf
rank = int(os.environ["PMI_RANK"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 6)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int32)
net = hf.NetSpec("alike", (6,), [hf.layers.Dense(8, act="relu"), hf.layers.Dense(3)], 3)
m = hf.Model(net, seed=rank if sys.argv[1] == "seed=rank" else 0)
try:
    m.fit(x, y, epochs=1, batch_size=16, verbose=False)
except hf.HloforgeError as e:
    print(f"refused: {e}" if rank == 0 else "", end="")
    sys.exit(3)
print(f"rank {rank} trained")
"""


@needs_mpi
def test_models_made_otherwise_on_each_rank_are_refused_before_a_fit(tmp_path):
    """A user's script under mpiexec making its Model with seed=rank. Before: each rank fit its own θ with the others'
    averaged ∂θ, every rank's weights different for good (rank 0's saved as the run's)."""
    script = tmp_path / "fit.py"
    script.write_text(_API_FIT)
    assert MPIEXEC is not None
    alike = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "2", sys.executable, str(script), "seed=0"],
                           capture_output=True, text=True, timeout=200, env=env())
    assert alike.returncode == 0 and "rank 1 trained" in alike.stdout, alike.stdout + alike.stderr
    other = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "2", sys.executable, str(script), "seed=rank"],
                           capture_output=True, text=True, timeout=200, env=env())
    assert other.returncode != 0, other.stdout + other.stderr
    assert other.stdout.startswith("refused: rank 1 of 2 was started with another model state than rank 0 (weights: "
                                   ), other.stdout + other.stderr
    assert other.stdout.endswith("make the Model alike on every rank (one seed, the same weights loaded) before its "
                                 "fit"), other.stdout
