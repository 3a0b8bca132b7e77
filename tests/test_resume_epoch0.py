"""`hloforge train --resume` of a run directory whose checkpoint is at epoch 0 (`hloforge import-weights`'s,
or `Model.save` of a model never fit): the log says it resumed, as it does after any other epoch. Before,
its line read as a fresh start, so the imported weights looked ignored."""

from __future__ import annotations

import numpy as np

import hloforge as hf
from hloforge.train.trainer import TrainConfig, train


def test_a_resume_from_epoch_0_says_so_and_starts_from_its_weights(tmp_path) -> None:
    model = hf.Model("mnist-linear", seed=5)
    model.params = {n: w * 0.5 for n, w in model.params.items()}  # not the init a fresh run draws
    run_dir = model.save(str(tmp_path / "run"), data="digits")
    lines: list[str] = []
    train(TrainConfig(net="mnist-linear", run_dir=run_dir, epochs=1, seed=5), resume=True, log=lines.append,
          progress=False)
    assert any("| resumed after epoch 0" in line for line in lines), lines
    fresh = str(tmp_path / "fresh")
    train(TrainConfig(net="mnist-linear", run_dir=fresh, epochs=1, seed=5), log=lambda s: None, progress=False)
    resumed, scratch = hf.load(run_dir).params, hf.load(fresh).params
    assert not any(np.array_equal(resumed[n], scratch[n]) for n in scratch)  # it went on from the saved weights
