"""A run directory that moves (another folder, machine, mount or cache) gives the numbers it gave where
it was trained, or one line saying what is missing or different and what to do: IREE's artifact cache
keyed on the host CPU and usable read-only, `eval --data-file` for a dataset that moved, `--resume` of a
spec file's net from its checkpoint's own copy, a read-only run directory, another version's checkpoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_moved_runs import trained_spec_file_run

import hloforge
from hloforge.cli import main

CORPUS = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. " * 200


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def last_line(text: str, word: str) -> str:
    return [ln for ln in text.splitlines() if word in ln][-1]


def test_an_iree_artifact_compiled_on_another_cpu_is_not_loaded(cache, monkeypatch):
    pytest.importorskip("iree.runtime")
    import hloforge.backends.iree.backend as iree_backend
    from hloforge.testing.backend_conformance import STEP

    first = iree_backend.IreeBackend().compile(STEP)
    assert not first.cache_hit
    # the same cache directory (a shared home, a copied ~/.cache) seen from a machine with other CPU features:
    # llvm-cpu compiles for the host CPU, so that machine's artifact may hold instructions this one lacks
    monkeypatch.setattr(iree_backend, "host_cpu", lambda: '{"flags": "sse2", "machine": "x86_64"}', raising=False)
    other = iree_backend.IreeBackend().compile(STEP)
    assert not other.cache_hit and other.artifact != first.artifact


def test_an_unwritable_iree_cache_warns_once_and_the_run_goes_on(cache):
    pytest.importorskip("iree.runtime")
    from hloforge.backends.iree import IreeBackend
    from hloforge.testing.backend_conformance import STEP, G, W

    cache.mkdir()
    (cache / "iree").write_bytes(b"")  # a file where the cache directory should be: nothing can be written
    be = IreeBackend()
    with pytest.warns(UserWarning, match=r"IREE cache: cannot write to .*iree"):
        exe = be.compile(STEP)
    assert not exe.cache_hit
    out, _ = be.execute(exe, [be.to_device(W), be.to_device(G)])
    np.testing.assert_allclose(be.to_host(out), W - 0.1)


def test_eval_reads_a_moved_corpus_with_data_file_and_says_so_when_it_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-file", "corpus.txt", "--epochs", "1",
                 "--run-dir", "run", "--no-progress"]) == 0
    trained = last_line(capsys.readouterr().out, "bits/char").split("val ")[1].split(" (")[0]
    os.makedirs("elsewhere")
    shutil.move("corpus.txt", "elsewhere/corpus.txt")  # the data lives at another path on this machine

    assert main(["eval", "run"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "corpus.txt" in err and "--data-file" in err, err
    assert main(["eval", "run", "--data-file", "elsewhere/corpus.txt"]) == 0, capsys.readouterr().err
    assert f"val {trained} (" in capsys.readouterr().out  # the number the run printed
    # --resume says the same (was: the dataset's "not found" line alone), and goes on given the new path
    assert main(["train", "--resume", "--run-dir", "run", "--epochs", "2", "--no-progress"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith("if the run's data moved, give where it is now with "
                                                       "--data-file"), err
    assert main(["train", "--resume", "--run-dir", "run", "--epochs", "2", "--no-progress", "--data-file",
                 "elsewhere/corpus.txt"]) == 0, capsys.readouterr().err
    # generate reads the corpus's vocabulary: the same hint, and the same flag finds it
    capsys.readouterr()
    shutil.move("elsewhere", "third")  # the resumed run recorded elsewhere/: moved again
    assert main(["generate", "run", "--tokens", "5"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith("give where it is now with --data-file"), err
    assert main(["generate", "run", "--tokens", "5", "--prompt", "ab", "--data-file", "third/corpus.txt"]) == 0
    assert capsys.readouterr().out.startswith("ab")


@pytest.mark.parametrize("command", ["eval", "generate", "cam", "detect", "sample"])
def test_every_command_that_opens_a_runs_data_takes_where_it_moved(command, monkeypatch):
    """The hint a moved run's refusal gives (--data-dir / --data-file) is a flag of each command that
    opens the run's dataset, and reaches `open_checkpoint`."""
    from hloforge.commands import opening

    seen = {}

    def opened(*args, **kw):
        seen.update(kw)
        raise opening.DataError("stop here")

    monkeypatch.setattr(opening, "open_checkpoint", opened)
    for module in ("cam", "detect", "generate", "sample"):
        monkeypatch.setattr(f"hloforge.commands.{module}.open_checkpoint", opened, raising=False)
    more = {"cam": ["test:0"], "detect": ["--index", "0"]}.get(command, [])
    assert main([command, "run", *more, "--data-dir", "d", "--data-file", "f"]) == 3
    assert (seen["data_dir"], seen["data_file"]) == ("d", "f")


def test_a_spec_file_run_resumes_from_another_folder_with_its_checkpoints_copy(tmp_path, monkeypatch, capsys):
    trained_spec_file_run(tmp_path, monkeypatch)
    shutil.move(tmp_path / "work" / "run", tmp_path / "elsewhere" / "run")  # the run moved, its spec file did not
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["train", "--resume", "--run-dir", "run", "--epochs", "2", "--no-progress"]) == 0, \
        capsys.readouterr().err
    assert "resumed after epoch 1" in capsys.readouterr().out


def test_a_checkpoint_of_another_hloforge_version_is_named_as_such(tmp_path, monkeypatch, capsys):
    """A run records the hloforge release that wrote it (config.toml's first line, the checkpoint's metadata),
    so a checkpoint of another layout names the release to open it with."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", "run", "--no-progress"]) == 0
    assert (tmp_path / "run" / "config.toml").read_text().splitlines()[0] == f"# hloforge {hloforge.__version__}"
    path = tmp_path / "run" / "checkpoint.safetensors"
    path.write_bytes(path.read_bytes().replace(b"hloforge-checkpoint-1", b"hloforge-checkpoint-9", 1))
    capsys.readouterr()
    assert main(["eval", "run"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"was written by hloforge {hloforge.__version__} (format" in err, err


READ_ONLY_SCRIPT = textwrap.dedent("""
    set -e
    mount --bind "$RUN" "$RUN"
    mount -o remount,ro,bind "$RUN"
    set +e
    "$PY" -c 'import sys; from hloforge.cli import main; sys.exit(main(sys.argv[1:]))' eval "$RUN"; echo "eval rc=$?"
    "$PY" -c 'import sys; from hloforge.cli import main; sys.exit(main(sys.argv[1:]))' plot "$RUN"; echo "plot rc=$?"
    "$PY" -c 'import sys; from hloforge.cli import main; sys.exit(main(sys.argv[1:]))' train --resume \\
        --run-dir "$RUN" --epochs 2 --no-progress; echo "resume rc=$?"
""")


def test_a_read_only_run_dir_evaluates_and_refuses_writes_in_one_line(tmp_path, monkeypatch, capsys):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a read-only bind mount needs root and unshare")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", "run", "--no-progress"]) == 0
    trained = last_line(capsys.readouterr().out, "top-1").split("top-1 ")[1].split(" ")[0]
    before = {p: os.stat(tmp_path / "run" / p).st_mtime_ns for p in os.listdir(tmp_path / "run")}
    env = {**os.environ, "RUN": str(tmp_path / "run"), "PY": sys.executable}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", READ_ONLY_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300)
    if "eval rc=" not in done.stdout:
        pytest.skip(f"no read-only bind mount here ({done.stderr.strip()[:200]})")
    out, err = done.stdout, done.stderr
    assert "eval rc=0" in out and f"top-1 {trained} " in out, out + err  # nothing to write: it works
    assert "plot rc=3" in out and "resume rc=3" in out, out + err
    lines = [ln for ln in err.splitlines() if ln.startswith("hloforge: error:")]
    assert len(lines) == 2 and all("is not writable" in ln for ln in lines), err
    assert "Traceback" not in err and "free space" not in err, err
    assert {p: os.stat(tmp_path / "run" / p).st_mtime_ns for p in os.listdir(tmp_path / "run")} == before


def test_hf_load_of_a_run_dir_holding_another_nets_checkpoint_says_whose(tmp_path):
    """Was: "holds a spec that differs from net 'mnist-mlp' as defined now", as if the net's definition
    had changed; it is another run's checkpoint, which `hloforge eval` names as such."""
    import hloforge as hf
    from hloforge.core.errors import DataError

    hf.Model("mnist-mlp").save(str(tmp_path / "a"))
    hf.Model("mnist-linear").save(str(tmp_path / "b"))
    shutil.copy(tmp_path / "b" / "checkpoint.safetensors", tmp_path / "a" / "checkpoint.safetensors")
    with pytest.raises(DataError, match=r"^run directory .*a: its config.toml and checkpoint disagree: checkpoint "
                                        r".*a/checkpoint.safetensors is of net 'mnist-linear', not 'mnist-mlp' "):
        hf.load(str(tmp_path / "a"))
