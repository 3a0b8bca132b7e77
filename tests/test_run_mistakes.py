"""User mistakes around a run that must be one line and lose nothing, never a plausible wrong number: a
ModelCheckpoint path that holds another run, a resume on other data, an lr f32 rounds to zero, a warm-up
longer than the run, a dataset with an empty split."""

from __future__ import annotations

import os
import shutil
import tomllib

import pytest
from test_datasets import tiny_mnist  # tests/ is on sys.path (rootdir-relative, no package)

import hloforge as hf
from hloforge.cli import main
from hloforge.core.errors import HloforgeError, UnsupportedSpec
from hloforge.train.trainer import TrainConfig

TRAIN = ["train", "mnist-linear", "--epochs", "1", "--no-progress"]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def snapshot(d) -> dict[str, bytes]:
    """Every file of a directory, by name, with its bytes."""
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out


def config(run) -> dict:
    with open(os.path.join(run, "config.toml"), "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> str:
    """A finished `hloforge train` run directory (metrics, curves, eval bitmap, checkpoint)."""
    run = str(tmp_path_factory.mktemp("victim") / "victim")
    assert main([*TRAIN, "--run-dir", run]) == 0
    assert {"metrics.jsonl", "curves.png", "eval_correct.npz", "checkpoint.safetensors"} <= set(os.listdir(run))
    return run


# ------------------------------------------------------------------ 1. ModelCheckpoint over another run
def test_model_checkpoint_refuses_a_path_holding_another_run_before_a_step(finished_run, tmp_path):
    victim = str(tmp_path / "victim")
    shutil.copytree(finished_run, victim)
    before = snapshot(victim)
    m = hf.Model("mnist-mlp")
    with pytest.raises(HloforgeError, match=r"ModelCheckpoint path .*victim already holds a run .*overwrite=True"):
        m.fit(data="digits", epochs=1, verbose=False, callbacks=[hf.ModelCheckpoint(victim, monitor="val_top1")])
    assert m._step == 0  # refused before any step
    assert snapshot(victim) == before


def test_cli_model_checkpoint_refuses_an_existing_run_dir_and_overwrite_replaces_it_whole(finished_run, tmp_path,
                                                                                         capsys):
    rc = str(tmp_path / "rc")
    shutil.copytree(finished_run, rc)
    before = snapshot(rc)
    new = str(tmp_path / "new")
    capsys.readouterr()
    assert main([*TRAIN, "--run-dir", new, "--callback", f"model_checkpoint:path={rc},monitor=top1"]) == 3
    err = one_line_error(capsys)
    assert f"ModelCheckpoint path {rc} already holds a run" in err and "overwrite=true" in err, err
    assert snapshot(rc) == before and not os.path.exists(os.path.join(new, "checkpoint.safetensors"))
    # the opt-in: the old run's files go with it, no mixed directory is left
    assert main([*TRAIN, "--run-dir", new, "--callback",
                 f"model_checkpoint:path={rc},monitor=top1,overwrite=true"]) == 0
    assert set(os.listdir(rc)) - {".lock"} == {"config.toml", "checkpoint.safetensors", "eval_correct.npz"}
    assert config(rc)["run_dir"] == new
    assert main([*TRAIN, "--run-dir", str(tmp_path / "n2"), "--callback",
                 f"model_checkpoint:path={tmp_path / 'b'},overwrite=yes"]) == 3
    assert "ModelCheckpoint wants overwrite true or false, got 'yes'" in one_line_error(capsys)


def test_model_checkpoint_keeps_replacing_its_own_files_across_fits(tmp_path):
    keep = hf.ModelCheckpoint(str(tmp_path / "best"), monitor="loss")
    m = hf.Model("mnist-linear", lr=1e-2)
    m.fit(data="digits", epochs=2, verbose=False, callbacks=[keep])
    m.fit(data="digits", epochs=1, verbose=False, callbacks=[keep])  # its own directory: no refusal
    assert hf.load(str(tmp_path / "best"))._epoch == 3 and keep.best_epoch == 3


# ------------------------------------------------------------------ 2. resume on other data
def test_resume_refuses_another_dataset_naming_both_before_the_step_check(finished_run, tmp_path, capsys):
    run, data = str(tmp_path / "rr2"), tmp_path / "m"
    shutil.copytree(finished_run, run)
    data.mkdir()
    tiny_mnist(data, n_train=128, n_test=60)
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "--run-dir", run, "--resume", "--data", "mnist", "--data-dir", str(data),
                 "--epochs", "2", "--no-progress"]) == 3
    err = one_line_error(capsys)
    assert "--data mnist" in err and "'digits'" in err and "step" not in err, err
    assert snapshot(run) == before


def test_resume_refuses_another_data_dir_or_option_but_takes_a_moved_one(tmp_path, capsys):
    a, b, run = tmp_path / "a", tmp_path / "b", str(tmp_path / "run")
    for d, n in ((a, 64), (b, 96)):
        d.mkdir()
        tiny_mnist(d, n_train=n, n_test=16, seed=n)
    first = ["train", "mnist-linear", "--run-dir", run, "--no-progress", "--batch", "32"]
    assert main([*first, "--data", "mnist", "--data-dir", str(a), "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main([*first, "--resume", "--data-dir", str(b), "--epochs", "2"]) == 3
    err = one_line_error(capsys)
    assert f"--data-dir {b}" in err and str(a) in err and "step" not in err, err
    assert main([*first, "--resume", "--data-opt", "x=1", "--epochs", "2"]) == 3
    assert "--data-opt" in one_line_error(capsys)
    assert config(run)["epochs"] == 1
    moved = tmp_path / "moved"
    os.rename(a, moved)  # the run's data moved: its new place is taken, once its test split is the run's
    assert main([*first, "--resume", "--data-dir", str(b), "--epochs", "2"]) == 3
    err = one_line_error(capsys)
    assert "is not the one the run was scored on" in err and "step" not in err, err
    assert main([*first, "--resume", "--data-dir", str(moved), "--epochs", "2"]) == 0
    assert config(run)["epochs"] == 2 and config(run)["data_dir"] == str(moved)


# ------------------------------------------------------------------ 3. an lr f32 cannot hold
@pytest.mark.parametrize("value", ["1e-50", "1e-39"])
def test_an_lr_that_rounds_to_zero_in_f32_is_refused(value, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*TRAIN, "--lr", value]) == 2
    assert "argument --lr: expected a finite number > 0 that f32 holds" in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(UnsupportedSpec, match=rf"config value lr = {float(value)}: expected .*f32"):
        TrainConfig(lr=float(value))
    with pytest.raises(UnsupportedSpec, match="lr"):
        hf.Model("mnist-linear", lr=float(value))
    (tmp_path / "c.toml").write_text(f"lr = {value}\n")
    assert main(["train", "--config", str(tmp_path / "c.toml"), "--run-dir", "r"]) == 3
    assert "config value lr" in one_line_error(capsys) and not (tmp_path / "r").exists()


def test_an_f32_subnormal_or_overflowing_option_is_refused_a_normal_one_taken(capsys):
    assert main([*TRAIN, "--weight-decay", "1e-45"]) == 2
    assert "--weight-decay" in one_line_error(capsys)
    with pytest.raises(UnsupportedSpec, match="weight_decay"):
        TrainConfig(weight_decay=1e300)
    TrainConfig(lr=1.2e-38, weight_decay=0.0, warmup_epochs=0.0)  # f32's smallest normal and zero are fine


# ------------------------------------------------------------------ 4. a warm-up longer than the run
def test_a_warmup_as_long_as_the_run_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "mnist-mlp", "--warmup-epochs", "5", "--epochs", "1", "--no-progress"]) == 3
    err = one_line_error(capsys)
    assert "warmup_epochs 5" in err and "1 epochs" in err and "expected fewer" in err, err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "c.toml").write_text("epochs = 2\nwarmup_epochs = 2.0\n")
    assert main(["train", "--config", "c.toml", "--run-dir", "r", "--no-progress"]) == 3
    assert "warmup_epochs 2" in one_line_error(capsys) and not (tmp_path / "r").exists()
    m = hf.Model("mnist-linear", warmup_epochs=3)  # the model's fits may be longer: refused by the fit
    with pytest.raises(UnsupportedSpec, match="warmup_epochs 3"):
        m.fit(data="digits", epochs=2, verbose=False)
    assert m._step == 0


def test_a_resume_checks_the_warmup_against_the_runs_total_epochs(tmp_path, capsys):
    run = ["train", "mnist-linear", "--run-dir", str(tmp_path / "r"), "--no-progress"]
    assert main([*run, "--epochs", "2", "--warmup-epochs", "1"]) == 0
    assert main([*run, "--resume", "--epochs", "4", "--warmup-epochs", "3"]) == 0  # 3 of the run's 4 epochs
    capsys.readouterr()
    assert main([*run, "--resume", "--epochs", "5", "--warmup-epochs", "5"]) == 3
    assert "warmup_epochs 5" in one_line_error(capsys)


# ------------------------------------------------------------------ 5. an empty split
@pytest.mark.parametrize(("n_train", "n_test", "split"), [(512, 0, "test"), (0, 16, "train")])
def test_a_dataset_with_an_empty_split_is_refused_naming_it(n_train, n_test, split, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "d"
    data.mkdir()
    tiny_mnist(data, n_train=n_train, n_test=n_test)
    assert main(["train", "mnist-cnn", "--data", "mnist", "--data-dir", str(data), "--epochs", "1",
                 "--no-progress"]) == 3
    err = one_line_error(capsys)
    assert f"its {split} split holds no examples" in err and str(data) in err, err
    assert not (tmp_path / "runs").exists()


def test_a_callback_option_given_twice_is_refused_not_the_last_taken() -> None:
    from hloforge.callbacks import from_items

    with pytest.raises(UnsupportedSpec, match=r"^callback option monitor given twice \(monitor=top1, then "
                                              r"monitor=loss\); expected each once$"):
        from_items(["early_stopping:monitor=top1,monitor=loss"])
    assert len(from_items(["early_stopping:monitor=top1,patience=2"])) == 1
