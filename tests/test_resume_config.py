"""`hloforge train --resume` continues the run as it was configured: a flag left out keeps the run's own
value (its config.toml), not the default, and a different batch is refused."""

from __future__ import annotations

import os
import tomllib

from hloforge.cli import main


def _config(run: str) -> dict:
    with open(os.path.join(run, "config.toml"), "rb") as f:
        return tomllib.load(f)


def test_a_resumed_run_keeps_its_own_settings_and_refuses_another_batch(tmp_path, capsys):
    run = os.path.join(tmp_path, "run")
    first = ["train", "mnist-linear", "--run-dir", run, "--no-progress"]
    assert main([*first, "--epochs", "1", "--lr", "0.01", "--schedule", "constant", "--seed", "3"]) == 0
    capsys.readouterr()
    assert main([*first, "--epochs", "2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "lr 0.01 constant" in out and "resumed after epoch 1" in out
    kept = _config(run)
    assert (kept["lr"], kept["schedule"], kept["seed"], kept["epochs"]) == (0.01, "constant", 3, 2)

    assert main([*first, "--epochs", "3", "--resume", "--batch", "32"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--batch 32" in err and "batch 64" in err
    assert _config(run)["epochs"] == 2  # refused before anything was written

    assert main([*first, "--epochs", "3", "--resume", "--lr", "0.005"]) == 0  # a flag given is taken
    assert (_config(run)["lr"], _config(run)["seed"]) == (0.005, 3)
