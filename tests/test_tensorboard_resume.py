"""A run stopped after its last checkpoint and resumed shows in TensorBoard as the uninterrupted run does:
every tag's value at each step once, the epochs' equal to metrics.jsonl's. Before, the steps logged after
the checkpoint showed twice (the killed run's and the resumed run's), and an epoch checkpointed before the
callback logged it not at all."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Collection
from pathlib import Path

import attrs
import numpy as np
import pytest

from hloforge.callbacks import Callback, TensorBoard, tbevents
from hloforge.train.trainer import TrainConfig, train

pytest.importorskip("tensorboardX")
loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")

QUIET = {"log": lambda s: None, "progress": False}
STEPS = 22  # mnist-linear's steps an epoch on the digits at batch 64


class Stopped(Exception):
    """The kill: raised out of the loop, which closes the callbacks (their files flushed) on the way out."""


class StopAt(Callback):
    def __init__(self, step: int = 0, epoch: int = 0) -> None:
        self.step, self.epoch = step, epoch

    def on_step_end(self, step: int, logs: dict) -> None:
        if step == self.step:
            raise Stopped

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if epoch == self.epoch:
            raise Stopped


def scalars(logdir: str, skip: Collection[str] = ()) -> dict[str, list[tuple[int, float]]]:
    """Each tag's (step, value) in the order a reader meets them: every event file (but those in `skip`),
    oldest first, read raw (no purge marker honoured), so a step held twice shows twice."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(set(glob.glob(os.path.join(logdir, "*tfevents*"))) - set(skip)):
        for ev in loader.EventFileLoader(path).Load():
            for v in ev.summary.value:
                value = v.tensor.float_val[0] if v.HasField("tensor") else v.simple_value  # tensorboardX: a tensor
                out.setdefault(v.tag, []).append((ev.step, value))
    return out


def run(tmp_path, name: str, *stops: Callback) -> tuple[str, str]:
    d, logdir = str(tmp_path / name), str(tmp_path / name / "tb")
    cfg = TrainConfig(net="mnist-linear", epochs=3, run_dir=d)
    if stops:
        with pytest.raises(Stopped):
            train(cfg, callbacks=[*stops, TensorBoard(logdir, every_step=True)], **QUIET)
    train(cfg, resume=bool(stops), callbacks=[TensorBoard(logdir, every_step=True)], **QUIET)
    return d, logdir


@pytest.mark.parametrize("stop", [
    StopAt(step=2 * STEPS + 5),  # in epoch 3, checkpoint at 2: steps 45-49 logged past it
    StopAt(epoch=2),  # before TensorBoard, after epoch 2's checkpoint: its epoch scalars never logged
], ids=["steps-past-checkpoint", "epoch-checkpointed-unlogged"])
def test_a_resumed_runs_events_are_the_uninterrupted_runs(stop: StopAt, tmp_path) -> None:
    _, whole = run(tmp_path, "whole")
    d, resumed = run(tmp_path, "resumed", stop)
    want, got = scalars(whole), scalars(resumed)
    assert got.keys() == want.keys()
    for tag, seen in got.items():
        steps = [s for s, _ in seen]
        assert steps == [s for s, _ in want[tag]] == sorted(set(steps)), tag  # each step once, in order
    assert np.allclose([v for _, v in got["step/loss"]], [v for _, v in want["step/loss"]])
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
        epochs = [r for r in map(json.loads, f) if r["kind"] == "epoch"]
    for tag in ("epoch/loss", "epoch/top1", "epoch/step", "epoch/seconds"):
        assert got[tag] == [(r["epoch"], pytest.approx(r[tag.removeprefix("epoch/")], rel=1e-6)) for r in epochs], tag


def test_a_resume_cuts_its_own_events_not_another_runs_in_a_shared_logdir(tmp_path) -> None:
    """Two runs logging into one logdir: resuming one cut every event file there back to its checkpoint,
    the other run's epochs and steps past it gone. Now a run's files bear its identity (kept in its run
    directory), and its resume cuts those alone."""
    logdir = str(tmp_path / "tb")
    train(TrainConfig(net="mnist-linear", epochs=3, run_dir=str(tmp_path / "other")),
          callbacks=[TensorBoard(logdir, every_step=True)], **QUIET)
    theirs = {}
    for path in glob.glob(os.path.join(logdir, "*tfevents*")):
        with open(path, "rb") as f:
            theirs[path] = f.read()
    cfg = TrainConfig(net="mnist-linear", epochs=3, run_dir=str(tmp_path / "mine"))
    with pytest.raises(Stopped):
        train(cfg, callbacks=[StopAt(step=2 * STEPS + 5), TensorBoard(logdir, every_step=True)], **QUIET)
    train(cfg, resume=True, callbacks=[TensorBoard(logdir, every_step=True)], **QUIET)
    for path, raw in theirs.items():
        with open(path, "rb") as f:
            assert f.read() == raw, path
    mine = scalars(logdir, skip=theirs)
    assert [s for s, _ in mine["step/loss"]] == list(range(1, 3 * STEPS + 1))  # each step once: cut as before
    assert [e for e, _ in mine["epoch/loss"]] == [1, 2, 3]


def test_a_rewind_cuts_the_files_of_its_run_or_of_before_runs_had_one(tmp_path) -> None:
    """A run's files end in its identity (any fit's do): its resume cuts those; a run from before runs had one
    cuts the files that bear none (written then), and never another run's or a fit's."""
    from tensorboardX import SummaryWriter


    def logged(name: str, suffix: str) -> str:
        w = SummaryWriter(str(tmp_path), filename_suffix=suffix)
        for step in (1, 2, 3):
            w.add_scalar("step/loss", step / 10, step)
        w.close()
        return max(glob.glob(str(tmp_path / f"*{suffix}")))

    files = {name: logged(name, suffix) for name, suffix in (
        ("old", ".1"), ("mine", tbevents.own_suffix("a" * 32)), ("theirs", tbevents.own_suffix("b" * 32)),
        ("fit", tbevents.own_suffix("c" * 32)))}

    def steps() -> dict[str, list[int]]:
        return {n: [s for s, _ in scalars(str(tmp_path), skip=set(files.values()) - {p})["step/loss"]]
                for n, p in files.items()}

    tbevents.rewind(str(tmp_path), epoch=0, step=2, run_id="a" * 32)
    assert steps() == {"old": [1, 2, 3], "mine": [1, 2], "theirs": [1, 2, 3], "fit": [1, 2, 3]}
    tbevents.rewind(str(tmp_path), epoch=0, step=1, run_id=None)
    assert steps() == {"old": [1], "mine": [1, 2], "theirs": [1, 2, 3], "fit": [1, 2, 3]}


def test_a_kill_mid_record_is_cut_and_the_rest_kept(tmp_path) -> None:
    """SIGKILL while tensorboardX writes leaves a torn last record: the rewind drops it with the scalars
    past the checkpoint, and keeps the other records, another writer's tags among them, as they were."""
    from tensorboardX import SummaryWriter


    w = SummaryWriter(str(tmp_path))
    for step in (1, 2, 3):
        w.add_scalar("step/loss", step / 10, step)
        w.add_scalar("mine", step, step)
    w.add_scalar("epoch/loss", 0.5, 1)
    w.add_scalar("epoch/loss", 0.25, 2)
    w.close()
    (path,) = glob.glob(str(tmp_path / "*tfevents*"))
    with open(path, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x00\x00\x00\x00\x01\x02")  # half a header
    assert tbevents.rewind(str(tmp_path), epoch=1, step=2, run_id=None) == {("epoch/loss", 1)}
    assert scalars(str(tmp_path)) == {"step/loss": [(1, pytest.approx(0.1)), (2, pytest.approx(0.2))],
                                      "mine": [(1, 1), (2, 2), (3, 3)], "epoch/loss": [(1, 0.5)]}
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # no temp file left


def test_two_fits_into_one_logdir_within_a_second_each_keep_their_events(tmp_path, monkeypatch) -> None:
    """tensorboardX names an event file by its second and host: the second fit's writer, made within the
    first's second, opened the first's file over it and its epochs were gone. Each writer has a file of its own."""
    import types

    import tensorboardX.event_file_writer as efw

    import hloforge as hf
    from hloforge.datasets.digits import Digits

    monkeypatch.setattr(efw, "time", types.SimpleNamespace(time=lambda: 1_700_000_000.5))  # one second for both
    x, y = Digits().arrays("train")
    x = x.reshape(len(x), 784)[:256]
    logdir = str(tmp_path / "tb")
    losses = [hf.Model("mnist-linear", seed=s).fit(x, y[:256], epochs=2, batch_size=64, verbose=False,
                                                   callbacks=[TensorBoard(logdir)])["loss"] for s in (1, 2)]
    assert len(glob.glob(os.path.join(logdir, "*tfevents*"))) == 2
    # each bears an identity, so a resume of a run from before runs had one (rewind's None) leaves them be
    assert all(tbevents.RUN_MARK in p for p in glob.glob(os.path.join(logdir, "*tfevents*")))
    got = sorted(v for _, v in scalars(logdir)["epoch/loss"])
    assert np.allclose(got, sorted(losses[0] + losses[1]))



def test_a_resume_from_an_epoch_0_checkpoint_cuts_the_killed_runs_events(tmp_path) -> None:
    """A run directory Model.save (or import-weights) wrote before any training is a checkpoint at epoch 0:
    a run resumed from it and killed in its first epoch, then resumed again, showed the killed run's steps
    beside the resumed run's (each step twice). Now as the uninterrupted resume from it shows them."""
    import hloforge as hf

    def resumed(name: str, *stops: Callback) -> str:
        d, logdir = str(tmp_path / name), str(tmp_path / name / "tb")
        hf.Model("mnist-linear").save(d, data="digits")
        cfg = TrainConfig(net="mnist-linear", epochs=2, run_dir=d)
        if stops:
            with pytest.raises(Stopped):
                train(cfg, resume=True, callbacks=[*stops, TensorBoard(logdir, every_step=True)], **QUIET)
        train(cfg, resume=True, callbacks=[TensorBoard(logdir, every_step=True)], **QUIET)
        return logdir

    want, got = scalars(resumed("whole")), scalars(resumed("killed", StopAt(step=5)))
    assert got.keys() == want.keys()
    for tag, seen in got.items():
        assert [s for s, _ in seen] == [s for s, _ in want[tag]], tag  # each step once, in order
    for tag in ("step/loss", "epoch/loss", "epoch/top1"):  # (not the timings)
        assert np.allclose([v for _, v in got[tag]], [v for _, v in want[tag]]), tag


FULL = """
import errno, os, sys
from tensorboardX import record_writer
from hloforge.cli import main

def full(self):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

record_writer.RecordWriter.flush = full  # the logdir's disk fills as the events are forced out
sys.exit(main(["train", "mnist-linear", "--epochs", "1", "--run-dir", "run", "--no-progress",
               "--callback", "tensorboard:logdir=tb,every_step=true"]))
"""


def test_a_full_disk_under_the_logdir_is_one_line_naming_it(tmp_path):
    """Before: tensorboardX's writer thread printed its traceback, another came at exit, and the run ended in
    'run directory run: No space left on device (a write); ...; free space and --resume', though the run directory
    had room. Now one line naming the logdir."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FULL], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == ("hloforge: error: TensorBoard cannot write its event files in tb: No "
                                            "space left on device; expected a directory with room for them")


def test_a_new_run_in_an_old_runs_directory_is_a_run_of_its_own(tmp_path) -> None:
    """A run stopped in its first epoch (no checkpoint), then a new run, not --resume, in its directory: the
    new run kept the old one's identity (run-id), so once resumed with TensorBoard it took the old run's event
    files for its own: it cut them back to its checkpoint's step and counted their scalars as its. Now a new run
    has an identity of its own and leaves the old run's files as they were."""
    d, logdir = str(tmp_path / "run"), str(tmp_path / "tb")
    with pytest.raises(Stopped):  # the old run: steps 1-9 of batch 64 logged, no checkpoint
        train(TrainConfig(net="mnist-linear", epochs=3, run_dir=d),
              callbacks=[StopAt(step=10), TensorBoard(logdir, every_step=True)], **QUIET)
    old = {p: Path(p).read_bytes() for p in glob.glob(os.path.join(logdir, "*tfevents*"))}
    assert [s for s, _ in scalars(logdir)["step/loss"]] == list(range(1, 10))
    new = TrainConfig(net="mnist-linear", epochs=1, batch=256, run_dir=d)
    train(new, **QUIET)  # a new run there (5 steps an epoch), without TensorBoard
    train(attrs.evolve(new, epochs=2), resume=True, callbacks=[TensorBoard(logdir, every_step=True)], **QUIET)
    assert {p: Path(p).read_bytes() for p in old} == old  # the old run's files as it left them
    mine = scalars(logdir, skip=old)
    assert [s for s, _ in mine["step/loss"]] == list(range(6, 11)) and [s for s, _ in mine["epoch/loss"]] == [1, 2]
