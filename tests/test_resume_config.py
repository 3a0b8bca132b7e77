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


def test_a_checkpoint_of_another_batch_copied_in_is_refused_on_resume(tmp_path, capsys):
    """A checkpoint copied from a run at batch 32 (44 steps an epoch) over a batch-64 run's (22) resumed at
    step 44 as if at epoch 1's end: its epochs ended at steps 66 and 88 and the cosine schedule ran past
    its end (lr rising again), with no word. Refused in one line, before anything is written."""
    a, b = os.path.join(tmp_path, "a"), os.path.join(tmp_path, "b")
    for run, batch in ((a, "32"), (b, "64")):
        assert main(["train", "mnist-linear", "--run-dir", run, "--no-progress", "--epochs", "1",
                     "--batch", batch]) == 0
    with open(os.path.join(b, "metrics.jsonl"), "rb") as f:
        logged = f.read()
    with open(os.path.join(a, "checkpoint.safetensors"), "rb") as src, \
            open(os.path.join(b, "checkpoint.safetensors"), "wb") as dst:
        dst.write(src.read())
    capsys.readouterr()
    assert main(["train", "--run-dir", b, "--no-progress", "--epochs", "2", "--resume"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "is at step 44 after epoch 1, not this run's step 22" in err and "batch 32" in err and "--init" in err
    assert _config(b)["epochs"] == 1  # nothing rewritten
    with open(os.path.join(b, "metrics.jsonl"), "rb") as f:
        assert f.read() == logged


def test_another_variant_on_resume_is_named_by_its_fields(tmp_path, capsys):
    """Before: --dropout said the net 'mnist-mlp' was not 'mnist-mlp' (a cut spec dump), --optimizer sgd named
    state slots, and --clip dumped both variants whole to compare by eye."""
    run = os.path.join(tmp_path, "run")
    first = ["train", "mnist-mlp", "--run-dir", run, "--no-progress"]
    assert main([*first, "--epochs", "1"]) == 0
    capsys.readouterr()
    for flags, said in ((["--dropout", "0.1"], "dropout=0.0, not dropout=0.1"),
                        (["--optimizer", "sgd"], "optimizer='adam', not optimizer='sgd'"),
                        (["--clip", "1", "--label-smoothing", "0.1"],
                         "label_smoothing=0.0, clip=0.0, not label_smoothing=0.1, clip=1.0")):
        assert main([*first, "--epochs", "2", "--resume", *flags]) == 3
        err = capsys.readouterr().err.strip()
        assert err == (f"hloforge: error: checkpoint {run}/checkpoint.safetensors was trained with {said}; "
                       "expected its own variant (another is a new run)")


def test_a_resume_streamed_from_another_worker_count_says_so(tmp_path, capsys):
    """3 workers each drop their own shard's ragged batch: 21 steps an epoch, not the run's 22. Before: the
    checkpoint was said to be copied from another run, with --init as the way on."""
    run = os.path.join(tmp_path, "run")
    first = ["train", "mnist-linear", "--run-dir", run, "--no-progress"]
    assert main([*first, "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main([*first, "--epochs", "2", "--resume", "--workers", "3"]) == 3
    assert capsys.readouterr().err.strip() == (
        f"hloforge: error: checkpoint {run}/checkpoint.safetensors is at step 22 after epoch 1: its run streamed "
        "from no workers, 22 steps an epoch, and --workers 3 makes 21; expected --workers 0 to continue it")
