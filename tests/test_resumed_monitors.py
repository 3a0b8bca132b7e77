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
