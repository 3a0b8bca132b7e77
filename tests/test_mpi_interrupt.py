"""Ctrl-C (SIGINT, as hydra passes mpiexec's on) while the ranks of `hloforge train` under `mpiexec -n 2 -iface lo`
start: the job ends, in one line, and never trains on or hangs."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

from test_mpi import HLOFORGE, MPIEXEC, env, needs_mpi  # tests/ is on sys.path (rootdir-relative, no package)

# In each rank's supervising parent (hloforge.train.supervise): a Ctrl-C that reaches it just before its worker
# exists, as one does when mpiexec's comes while the ranks start.
BEFORE_THE_WORKER = '''
    import os
    import signal
    import subprocess

    if "PMI_FD" in os.environ and "HLOFORGE_MPI_WORKER" not in os.environ:
        _start = subprocess.Popen.__init__

        def _init(self, args, *a, **kw):
            if (kw.get("env") or {}).get("HLOFORGE_MPI_WORKER") == "1":
                os.kill(os.getpid(), signal.SIGINT)
            _start(self, args, *a, **kw)

        subprocess.Popen.__init__ = _init
'''


@needs_mpi
def test_a_ctrl_c_that_comes_before_a_ranks_worker_exists_stops_it(tmp_path):
    """Before: the parent noted the Ctrl-C and started its worker, which never saw it: here both ranks trained the
    whole run (exit 0); where another rank's worker had seen it and left, the job hung."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(textwrap.dedent(BEFORE_THE_WORKER))
    e = env()
    e["PYTHONPATH"] = f"{tmp_path / 'site'}:{e['PYTHONPATH']}"
    assert MPIEXEC is not None
    t = time.monotonic()
    r = subprocess.run([MPIEXEC, "-n", "2", "-iface", "lo", *HLOFORGE, "train", "mnist-mlp", "--epochs", "1",
                        "--run-dir", str(tmp_path / "r"), "--no-progress"], capture_output=True, text=True,
                       timeout=120, env=e)
    assert r.returncode == 130 and time.monotonic() - t < 60, r.stdout + r.stderr
    assert [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()] == ["hloforge: interrupted"], \
        r.stdout + r.stderr
    assert not Path(tmp_path / "r" / "checkpoint.safetensors").exists()


@needs_mpi
def test_a_ctrl_c_to_a_rank_waiting_in_mpi_init_for_a_rank_that_never_comes_ends_the_job(tmp_path):
    """Rank 0 waits in MPI_Init (C, where Python's handler never runs) for rank 1, a process that will not init MPI
    and outlives the Ctrl-C (as a rank the Ctrl-C ended before its MPI_Init leaves the others). Before: the job
    hung for good, its worker's Ctrl-C pending; now its parent stops the worker 10 s on (INTERRUPTED_WAIT_S)."""
    assert MPIEXEC is not None
    job = subprocess.Popen([MPIEXEC, "-iface", "lo", "-n", "1", *HLOFORGE, "train", "mnist-mlp", "--epochs", "1",
                            "--run-dir", str(tmp_path / "r"), "--no-progress", ":", "-n", "1", "bash", "-c",
                            "trap '' INT; sleep 5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env())
    time.sleep(3)
    job.send_signal(signal.SIGINT)
    t = time.monotonic()
    try:
        out, _ = job.communicate(timeout=60)
    finally:
        job.kill()
    assert time.monotonic() - t < 25, out
    assert job.returncode == 130, out
    assert [ln for ln in out.splitlines() if ln.startswith("hloforge")] == ["hloforge: interrupted"], out
    assert "Traceback" not in out and not Path(tmp_path / "r" / "checkpoint.safetensors").exists()
