"""`hloforge train` under `mpiexec -n 2 -iface lo` where the ranks' machines differ: each rank in a working
directory of its own (-wdir, read through /proc/self/cwd), so one path holds another file, or none, per rank."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

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
    MPI_Abort), and hloforge's lines."""
    lines = (r.stdout + r.stderr).splitlines()
    return [ln for ln in lines if ln.strip() and not ln.startswith("hloforge")], \
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
