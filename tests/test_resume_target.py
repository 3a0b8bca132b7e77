"""Which run `hloforge train --resume` continues: with no --run-dir, the newest default directory, the
one the last new run took, even when that run stopped before its first checkpoint (then refused in one
line that says so and how to start it again), never the older finished run before it, whose checkpoint
following the "raise --epochs" advice would replace."""

from __future__ import annotations

import hashlib
import os
import shlex
import tomllib

import pytest

from hloforge.cli import main
from hloforge.train import trainer
from hloforge.train.config import CHECKPOINT, CONFIG, TrainConfig
from hloforge.train.rundir import locked
from hloforge.zoo import get_net

NET = ["train", "mnist-linear", "--no-progress"]


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _make(d: str, checkpoint: bool) -> None:
    os.makedirs(d)
    if checkpoint:
        open(os.path.join(d, CHECKPOINT), "wb").close()


def test_a_resume_aims_at_the_directory_the_last_new_run_took(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg, spec = TrainConfig(backend="xla"), get_net("mnist-mlp")
    base = cfg.resolved_run_dir(spec)
    assert cfg.resolved_run_dir(spec, resume=True) == base  # nothing yet: the first name (refused by the trainer)
    _make(base, checkpoint=True)
    assert cfg.resolved_run_dir(spec, resume=True) == base and cfg.resolved_run_dir(spec) == f"{base}_2"
    _make(f"{base}_2", checkpoint=False)  # a new run stopped in its first epoch
    assert cfg.resolved_run_dir(spec, resume=True) == f"{base}_2"  # not the finished run before it
    assert cfg.resolved_run_dir(spec) == f"{base}_2"  # and a new run starts there again (nothing to lose)
    _make(f"{base}_5", checkpoint=False)  # a stray directory past the next name is no newer run
    assert cfg.resolved_run_dir(spec, resume=True) == f"{base}_2"
    open(os.path.join(f"{base}_2", CHECKPOINT), "wb").close()
    assert cfg.resolved_run_dir(spec, resume=True) == f"{base}_2" and cfg.resolved_run_dir(spec) == f"{base}_3"
    assert TrainConfig(run_dir="mine").resolved_run_dir(spec, resume=True) == "mine"


def test_resume_after_an_interrupted_first_epoch_refuses_and_leaves_the_finished_run_alone(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*NET, "--epochs", "1"]) == 0
    old = os.path.join("runs", "mnist_linear_adam_xla")
    kept = _digest(os.path.join(old, CHECKPOINT))

    real_step = trainer.Run.step

    def ctrl_c(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Run, "step", ctrl_c)  # Ctrl-C in the new run's first epoch
    assert main([*NET, "--epochs", "3", "--lr", "0.01"]) == 130
    monkeypatch.setattr(trainer.Run, "step", real_step)
    new = f"{old}_2"
    assert os.path.exists(os.path.join(new, CONFIG)) and not os.path.exists(os.path.join(new, CHECKPOINT))
    capsys.readouterr()

    for extra in ([], ["--epochs", "3"]):  # the old message's advice, followed, extended the finished run
        assert main([*NET, "--resume", *extra]) == 3
        err = capsys.readouterr().err.strip()
        again = f"hloforge train --config {os.path.join(new, CONFIG)} --run-dir {new}"
        assert err == (f"hloforge: error: run directory {new} has no checkpoint yet: it stopped before its first "
                       f"epoch ended, so there is nothing to resume; start it again with `{again}`")
        assert _digest(os.path.join(old, CHECKPOINT)) == kept

    # the advice works: a fresh start into the directory it names, with that run's own options
    assert main([*shlex.split(again)[1:], "--no-progress"]) == 0
    with open(os.path.join(new, CONFIG), "rb") as f:
        assert (tomllib.load(f)["epochs"], os.path.exists(os.path.join(new, CHECKPOINT))) == (3, True)
    assert _digest(os.path.join(old, CHECKPOINT)) == kept


def test_an_explicit_run_dir_without_a_checkpoint_says_so_and_how_to_go_on(tmp_path, capsys):
    run = str(tmp_path / "r un")  # quoted in the advice, so it can be pasted
    os.makedirs(run)
    assert main([*NET, "--run-dir", run, "--resume"]) == 3
    err = capsys.readouterr().err.strip()
    assert err == (f"hloforge: error: run directory {run} has no checkpoint yet: it stopped before its first epoch "
                   f"ended, so there is nothing to resume; start it again with "
                   f"`hloforge train NET [OPTIONS] --run-dir {shlex.quote(run)}`")
    assert set(os.listdir(run)) <= {".lock"}  # refused before anything was written (the lock is the trainer's)


def test_a_missing_run_to_resume_names_the_default_net_it_looked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "--no-progress"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing to resume: run directory runs/mnist_mlp_adam_xla does not " \
        "exist (the default for net 'mnist-mlp'" in err, err
    assert main([*NET, "--run-dir", "gone", "--resume"]) == 3
    assert capsys.readouterr().err.strip() == "hloforge: error: nothing to resume: run directory gone does not exist"
    assert not os.path.exists("runs") and not os.path.exists("gone")  # nothing made


def test_a_run_still_in_its_first_epoch_is_in_use_not_stopped(tmp_path, capsys):
    run = str(tmp_path / "live")
    with locked(run, os.path.join(run, CHECKPOINT)):  # another trainer, before its first checkpoint
        with open(os.path.join(run, CONFIG), "w") as f:
            f.write("")
        assert main([*NET, "--run-dir", run, "--resume"]) == 3
    err = capsys.readouterr().err.strip()
    assert "is in use by another hloforge process" in err and "stopped" not in err, err


@pytest.mark.parametrize("resume", [False, True])
def test_resume_config_reads_no_config_of_a_run_without_a_checkpoint(tmp_path, resume, capsys):
    # its config.toml's batch is not "the run's": a differing --batch is no reason to refuse, the missing
    # checkpoint is
    run = str(tmp_path / "r")
    os.makedirs(run)
    with open(os.path.join(run, CONFIG), "w") as f:
        f.write(TrainConfig(net="mnist-linear", batch=16).to_toml())
    code = main([*NET, "--run-dir", run, "--batch", "32", *(["--resume"] if resume else []), "--epochs", "1"])
    err = capsys.readouterr().err
    assert (code, "has no checkpoint yet" in err) == ((3, True) if resume else (0, False)), err


def test_a_bare_resume_with_no_default_run_names_the_runs_there(tmp_path, monkeypatch, capsys):
    """Before: `hloforge train --resume` after training mnist-linear said only that runs/mnist_mlp_adam_xla does not
    exist, not which runs --resume could have meant."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "mnist-linear", "--epochs", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", "--epochs", "2"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("hloforge: error: nothing to resume: run directory runs/mnist_mlp_adam_xla does not exist")
    assert err.endswith("or its --run-dir); runs/ holds: mnist_linear_adam_xla"), err
