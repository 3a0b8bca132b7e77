"""EarlyStopping and ModelCheckpoint across resumes and repeated fits: a run resumed after a kill ends as the
run it resumes would have, and a best epoch already kept is never replaced by a worse one."""

from __future__ import annotations

import json
import os

from hloforge.cli import main


def _epochs(run: str) -> list[int]:
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(ln)["epoch"] for ln in f if '"kind": "epoch"' in ln]


def test_a_run_its_early_stopping_ended_resumes_to_no_epoch_more(tmp_path) -> None:
    """A run killed after its EarlyStopping stopped it (while drawing its curves, say) is resumed with the same
    callback: its patience ran out in the history, so no epoch is trained. Before, the resume trained one more
    epoch (and so ended with other weights than the run that was not killed)."""
    d = str(tmp_path / "run")
    stop = ["--callback", "early_stopping:monitor=lr,mode=max,patience=1"]  # cosine lr: best at epoch 1
    args = ["train", "mnist-linear", "--epochs", "6", "--run-dir", d, "--no-progress", *stop]
    assert main(args) == 0
    assert _epochs(d) == [1, 2]
    with open(os.path.join(d, "checkpoint.safetensors"), "rb") as f:
        ended = f.read()
    os.remove(os.path.join(d, "curves.png"))  # what a kill while they were drawn leaves
    assert main([*args, "--resume"]) == 0
    assert _epochs(d) == [1, 2]
    with open(os.path.join(d, "checkpoint.safetensors"), "rb") as f:
        assert f.read() == ended
    assert os.path.exists(os.path.join(d, "curves.png"))


def test_a_model_checkpoint_reused_by_the_models_next_fit_keeps_its_best_epoch(tmp_path) -> None:
    """A notebook's second fit of one Model with the same ModelCheckpoint goes on from the first's best: an epoch
    no better than the one kept does not replace it. Before, each fit started its best afresh, so the second fit's
    first epoch, however worse, was written over the best epoch kept."""
    import numpy as np

    import hloforge as hf

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 784)).astype(np.float32), rng.integers(0, 10, 64)
    model = hf.Model("mnist-linear", lr=1e-2)
    best = hf.ModelCheckpoint(str(tmp_path / "best"), monitor="lr", mode="max")  # cosine: best at each fit's first
    model.fit(x, y, epochs=2, batch_size=32, callbacks=[best], verbose=False)
    with open(tmp_path / "best" / "checkpoint.safetensors", "rb") as f:
        kept = f.read()
    model.lr = 1e-3  # every epoch of the next fit is worse by the monitor
    model.fit(x, y, epochs=2, batch_size=32, callbacks=[best], verbose=False)
    assert best.best_epoch == 1 and best.best == model.history["lr"][0]
    with open(tmp_path / "best" / "checkpoint.safetensors", "rb") as f:
        assert f.read() == kept
    other = hf.Model("mnist-linear", lr=1e-3)  # another model's fit starts its own best, as before
    other.fit(x, y, epochs=1, batch_size=32, callbacks=[best], verbose=False)
    assert best.best_epoch == 1 and best.best == other.history["lr"][0]


def _epoch_of(folder: str) -> tuple[int | None, int | None]:
    """(the checkpoint's epoch, the eval bitmap's epoch) in `folder`; None for one it lacks."""
    import numpy as np

    from hloforge.train.checkpoint import load_meta

    ckpt = os.path.join(folder, "checkpoint.safetensors")
    bitmap = os.path.join(folder, "eval_correct.npz")
    got_ckpt = int(load_meta(ckpt)["epoch"]) if os.path.exists(ckpt) else None
    if not os.path.exists(bitmap):
        return got_ckpt, None
    with np.load(bitmap) as z:
        return got_ckpt, int(z["epoch"])


def test_a_best_epoch_copy_a_stop_cut_off_is_never_mixed_and_is_made_again_on_resume(tmp_path, monkeypatch) -> None:
    """SIGTERM while ModelCheckpoint copied the run's best epoch (epoch 2 of 4) to its path. Before: the path held
    epoch 2's eval bitmap beside epoch 1's checkpoint (so `compare` and `eval` of it spoke of two epochs), and the
    resumed run, taking epoch 2 as kept, never copied it: the best epoch was lost, the path kept epoch 1's weights.
    Now a cut-off copy leaves no bitmap beside another epoch's checkpoint, and the resume makes the copy again."""
    from safetensors.numpy import load_file

    from hloforge.commands.exits import Stopped
    from hloforge.train import rundir

    d, best = str(tmp_path / "run"), str(tmp_path / "best")
    args = ["train", "mnist-linear", "--epochs", "4", "--warmup-epochs", "1.5", "--run-dir", d, "--no-progress",
            "--callback", f"model_checkpoint:path={best},monitor=lr,mode=max"]  # the lr peaks at epoch 2
    write, copies = rundir.write_atomic, []

    def stopped_at_the_second_copy(path: str, data: bytes, what: str) -> None:
        if os.path.dirname(path) == best and os.path.basename(path) == "checkpoint.safetensors":
            copies.append(path)
            if len(copies) == 2:
                raise Stopped(15)
        write(path, data, what)

    monkeypatch.setattr(rundir, "write_atomic", stopped_at_the_second_copy)
    assert main(args) == 143
    kept, bitmap = _epoch_of(best)
    assert bitmap is None or bitmap == kept  # never epoch 2's bitmap beside epoch 1's checkpoint
    monkeypatch.setattr(rundir, "write_atomic", write)
    assert main([*args, "--resume"]) == 0
    assert _epoch_of(best) == (2, 2)
    ref, ref_best = str(tmp_path / "ref"), str(tmp_path / "ref_best")
    assert main([a.replace(d, ref).replace(best, ref_best) for a in args]) == 0
    got, want = load_file(os.path.join(best, "checkpoint.safetensors")), \
        load_file(os.path.join(ref_best, "checkpoint.safetensors"))
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)


def test_a_csv_logger_reused_by_the_models_next_fit_keeps_the_earlier_fits_rows(tmp_path) -> None:
    """A notebook's second fit of one Model with the same CSVLogger adds its epochs after the first fit's. Before,
    each fit wrote the file anew: the first fit's rows were lost, unsaid."""
    import csv

    import numpy as np

    import hloforge as hf

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 784)).astype(np.float32), rng.integers(0, 10, 64)
    path = str(tmp_path / "log.csv")
    model, log = hf.Model("mnist-linear"), hf.CSVLogger(path)

    def epochs() -> list[str]:
        with open(path, newline="", encoding="utf-8") as f:
            return [row["epoch"] for row in csv.DictReader(f)]

    model.fit(x, y, epochs=2, batch_size=32, callbacks=[log], verbose=False)
    model.fit(x, y, epochs=2, batch_size=32, callbacks=[log], verbose=False)
    assert epochs() == ["1", "2", "3", "4"]


def test_a_best_epoch_copy_cut_off_at_the_runs_last_epoch_is_made_again_by_the_resume(tmp_path, monkeypatch) -> None:
    """The kill lands in the copy of the run's last epoch, its best: the resume finds the run finished and says so,
    and still makes the copy. Before, it said so and left the path without that epoch, for good; and the first
    copy of a run cut off after its config made the resume refuse the path as another run's."""
    from hloforge.commands.exits import Stopped
    from hloforge.train import rundir

    d, best = str(tmp_path / "run"), str(tmp_path / "best")
    args = ["train", "mnist-linear", "--epochs", "1", "--run-dir", d, "--no-progress",
            "--callback", f"model_checkpoint:path={best},monitor=top1"]
    write = rundir.write_atomic

    def stopped_at_the_last_file(path: str, data: bytes, what: str) -> None:
        write(path, data, what)
        if os.path.dirname(path) == best and len(os.listdir(best)) == 2:  # of the copy's three
            raise Stopped(15)

    monkeypatch.setattr(rundir, "write_atomic", stopped_at_the_last_file)
    assert main(args) == 143
    monkeypatch.setattr(rundir, "write_atomic", write)
    assert main([*args, "--resume"]) == 3  # already finished, said in one line
    assert _epoch_of(best) == (1, 1) and os.path.exists(os.path.join(best, "config.toml"))
    assert main(["eval", best]) == 0


def test_a_finished_runs_resume_with_tensorboard_leaves_no_empty_event_file(tmp_path) -> None:
    """The resume of a finished run runs its callbacks' start for no epoch (above): TensorBoard's writer, opened
    there, logs nothing and its file goes at the end. Before, each such resume left an events file of its version
    line alone beside the run's own."""
    import glob

    import pytest

    pytest.importorskip("tensorboardX")
    d, tb = str(tmp_path / "run"), str(tmp_path / "tb")
    args = ["train", "mnist-linear", "--epochs", "1", "--run-dir", d, "--no-progress", "--callback",
            f"tensorboard:logdir={tb}"]
    assert main(args) == 0
    files = sorted(glob.glob(os.path.join(tb, "*tfevents*")))
    assert len(files) == 1
    assert main([*args, "--resume"]) == 3  # already finished
    assert sorted(glob.glob(os.path.join(tb, "*tfevents*"))) == files
