"""A net too large for memory at its batch: one line in GiB naming the batch to reduce, on the command line
and from Model.fit, not the backend's 'Out of memory allocating 21474836480 bytes'. Real XLA runs in child
processes under an address-space limit far below what the step asks for."""

from __future__ import annotations

import importlib.util
import re
import resource
import subprocess
import sys

import pytest
from test_mpi import launch, needs_mpi  # tests/ is on sys.path (rootdir-relative, no package)

BACKENDS = ["xla", pytest.param("iree", marks=pytest.mark.skipif(
    importlib.util.find_spec("iree") is None, reason="iree packages not installed"))]
LIMIT = 8 << 30  # bytes of address space: room to load XLA and compile, far below the 20 GiB the step asks
# A conv net on digits' 28×28 images: at batch 512 its train step asks XLA for 20 GiB at once.
NET = """name = "big"
input_shape = [1, 28, 28]
num_classes = 10
layers = [{kind = "conv2d", out = 1024, act = "relu"}, {kind = "conv2d", out = 1024}, {kind = "globalAvgPool"},
          {kind = "dense", units = 10}]
"""
SAID = (r"out of memory: the train step of net 'big' at batch 512 asked for \d+\.\d GiB at once, more than the "
        r"device has free; use a smaller batch \(--batch, or fit's batch_size\)")
FIT = """
import numpy as np, hloforge as hf
from hloforge.core.errors import DeviceMemoryError
try:
    hf.Model(hf.NetSpec.from_file("net.toml")).fit(np.zeros((512, 1, 28, 28), np.float32),
                                                   np.zeros(512, np.int32), batch_size=512, verbose=False)
except DeviceMemoryError as e:
    print(e)
"""


def limited(argv: list[str], cwd) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    return subprocess.run(argv, cwd=cwd, preexec_fn=limit, capture_output=True, text=True, timeout=300)


@pytest.fixture
def net(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "net.toml").write_text(NET)
    return tmp_path


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_command_line_says_out_of_memory_in_gib_and_names_the_batch(net, backend) -> None:
    """IREE refuses the step's transient storage as it loads the module (RESOURCE_EXHAUSTED): before, an internal
    error 'RuntimeError: could not allocate buffer'; XLA refuses it as the step runs."""
    done = limited([sys.executable, "-m", "hloforge", "train", "--net", "net.toml", "--batch", "512", "--epochs", "1",
                    "--run-dir", "run", "--no-progress", "--backend", backend], net)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.fullmatch(f"hloforge: error: {SAID}", done.stderr.splitlines()[-1]), done.stderr[-3000:]


@pytest.mark.parametrize(("message", "said"), [
    ("Out of memory allocating 55838841440 bytes.", "52.0 GiB"),  # the CPU plugin's
    ("Out of memory while trying to allocate 33762398024 bytes.", "31.4 GiB"),  # the GPU allocator's
    ("Out of memory while trying to allocate 16.00GiB.", "16.0 GiB"),
    ("Failed to allocate request for 2.00MiB (2097152B) on device ordinal 0", "more memory"),  # no size said
])
def test_the_size_asked_is_read_from_each_plugins_wording(message: str, said: str) -> None:
    """Before, only the CPU plugin's 'allocating N bytes' was read: a GPU's out of memory said 'asked for more
    memory', the GiB left out. (Wordings as XLA's GPU allocator prints them; no GPU ran here.)"""
    from hloforge.backends.xla.pjrt.api import asked_bytes
    from hloforge.core.errors import DeviceMemoryError
    from hloforge.train.session import out_of_memory

    line = str(out_of_memory(DeviceMemoryError(message, asked_bytes(message)), "the train step of net 'big'", 64))
    assert line.startswith(f"out of memory: the train step of net 'big' at batch 64 asked for {said}"), line


@needs_mpi
def test_under_mpiexec_the_ranks_say_it_once(net) -> None:
    """Two ranks, each under the limit: the split step's gradient half asks for 10 GiB on each. Before, each rank
    said XLA's 'XLA failed executing: Out of memory allocating 10689216544 bytes. [RESOURCE_EXHAUSTED]'; then each
    said the same line of its own, and the launcher its MPI_Abort line after them. Now one line, naming the ranks."""
    train = " ".join([sys.executable, "-m", "hloforge", "train", "--net", "net.toml", "--batch", "512", "--epochs",
                      "1", "--run-dir", "run", "--no-progress", "--backend", "xla"])
    done = launch(2, "sh", "-c", f"ulimit -v {LIMIT >> 10}; exec {train}", cwd=net)
    assert "Traceback" not in done.stderr and "Abort" not in done.stderr, done.stderr[-3000:]
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("hloforge: error:")]
    once = SAID.replace("; use", r" \(on every rank of 2\); use")
    assert len(said) == 1 and re.fullmatch(f"hloforge: error: {once}", said[0]), done.stderr[-3000:]
    assert done.returncode == 3


# A rank's gradient half out of memory at its first step, by a stand-in for XLA's refusal, on the ranks listed.
FAILING = """
import os, sys
from hloforge.backends.xla.backend import XlaBackend
from hloforge.core.errors import DeviceMemoryError
execute, failing = XlaBackend.execute, os.environ["PMI_RANK"] in sys.argv.pop(1).split(",")

def refused(self, exe, args, keep=()):
    if keep and failing:  # the gradient half keeps θ
        raise DeviceMemoryError("Out of memory allocating 10737418240 bytes.", 10 << 30)
    return execute(self, exe, args, keep)

XlaBackend.execute = refused
from hloforge.cli import main
sys.exit(main())
"""


@needs_mpi
@pytest.mark.parametrize(("ranks", "on"), [("1", "rank 1 of 2"), ("0,1", "every rank of 2")])
def test_under_mpiexec_a_rank_alone_out_of_memory_is_said_once_naming_it(ranks: str, on: str, tmp_path) -> None:
    done = launch(2, sys.executable, "-c", FAILING, ranks, "train", "mnist-linear", "--epochs", "1", "--run-dir",
                  "run", "--no-progress", cwd=tmp_path)
    assert "Traceback" not in done.stderr and "Abort" not in done.stderr, done.stderr[-3000:]
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("hloforge: error:")]
    assert said == [f"hloforge: error: out of memory: the train step of net 'mnist-linear' at batch 64 asked for "
                    f"10.0 GiB at once, more than the device has free (on {on}); use a smaller batch (--batch, or "
                    "fit's batch_size)"], done.stderr[-3000:]
    assert done.returncode == 3


def test_model_fit_raises_the_same_line(net) -> None:
    done = limited([sys.executable, "-c", FIT], net)
    assert re.fullmatch(SAID, done.stdout.strip()), (done.stdout, done.stderr[-3000:])


PREDICT = """
import numpy as np, hloforge as hf
from hloforge.core.errors import DeviceMemoryError
try:
    hf.Model(hf.NetSpec.from_file("net.toml")).predict(np.zeros((8192, 1, 28, 28), np.float32), batch_size=8192)
except DeviceMemoryError as e:
    print(e)
"""


def test_predict_names_its_own_batch_size(net) -> None:
    """A forward too large for memory: before, its line sent the user to fit's batch_size, which predict has not."""
    done = limited([sys.executable, "-c", PREDICT], net)
    said = (r"out of memory: the forward of net 'big' at batch 8192 asked for \d+\.\d GiB at once, more than the "
            r"device has free; use a smaller batch \(--batch, or the batch_size of predict, evaluate or fit\)")
    assert re.fullmatch(said, done.stdout.strip()), (done.stdout, done.stderr[-3000:])


def test_out_of_host_memory_names_the_commands_own_option(monkeypatch, capsys) -> None:
    """`hloforge sample RUN -n 100000000` ran out of host memory and advised 'a smaller batch or input', though
    sample takes no batch: its -n is. The advice names the option the command takes."""
    import hloforge.commands.sample as sample
    from hloforge.cli import main

    def too_many(run: str, n: int, *args: object, **kw: object) -> None:  # as numpy says it, for the grid of n
        raise MemoryError(f"Unable to allocate 572. GiB for an array with shape ({n}, 3, 16, 16)")

    monkeypatch.setattr(sample, "sample_run", too_many)
    assert main(["sample", "RUN", "-n", "100000000"]) == 3
    assert capsys.readouterr().err == ("hloforge: error: out of host memory (MemoryError: Unable to allocate 572. GiB "
                                       "for an array with shape (100000000, 3, 16, 16)); ask for fewer images (a "
                                       "smaller -n)\n")


@pytest.mark.parametrize("argv,module,function", [
    (["detect", "RUN", "img.png"], "detect", "detect_run"),
    (["cam", "RUN", "test:0"], "cam", "cam_run"),
    (["classify", "RUN", "img.png"], "classify", "classify_run"),
])
def test_a_command_without_batch_advises_what_it_does_take(argv, module, function, monkeypatch, capsys) -> None:
    """A command that runs one image at a time ran out of device memory and advised '--batch', which it does not
    take (nor could help). It says what does: it runs one at a time already."""
    import importlib

    from hloforge.cli import main
    from hloforge.core.errors import DeviceMemoryError
    from hloforge.train.session import out_of_memory

    def oom(*args: object, **kw: object) -> None:
        raise out_of_memory(DeviceMemoryError("Out of memory allocating 21474836480 bytes", 20 << 30),
                            "the forward of net 'big'", 1)

    monkeypatch.setattr(importlib.import_module(f"hloforge.commands.{module}"), function, oom)
    assert main(argv) == 3
    assert capsys.readouterr().err == ("hloforge: error: out of memory: the forward of net 'big' at batch 1 asked for "
                                       "20.0 GiB at once, more than the device has free; it runs one input at a time "
                                       "already: free memory, or run it where there is more\n")
