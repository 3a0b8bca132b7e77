"""User mistakes around a run that must be one line and lose nothing, never a plausible wrong number: a
ModelCheckpoint path that holds another run, a resume on other data, an lr f32 rounds to zero, a warm-up
longer than the run or worth no whole update, a dataset with an empty split."""

from __future__ import annotations

import os
import re
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


def test_resume_refuses_a_checkpoint_without_its_config(tmp_path, capsys):
    """Before: the run resumed under the defaults (lr 0.001, cosine, seed 0) for its own lr 0.01, constant,
    seed 7, exit 0, and wrote them into a new config.toml."""
    run = str(tmp_path / "run")
    assert main([*TRAIN, "--lr", "0.01", "--schedule", "constant", "--seed", "7", "--run-dir", run]) == 0
    os.remove(os.path.join(run, "config.toml"))
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "--resume", "--run-dir", run, "--epochs", "2", "--no-progress"]) == 3
    err = one_line_error(capsys)
    assert f"run directory {run} holds a checkpoint but no config.toml" in err and "--init" in err, err
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
    holds = "that f32 holds (1.2e-38 to 3.4e38 in size): the programs take it as f32"  # not "0, or": lr refuses 0
    said = f"config value lr = {float(value)}: expected a number {holds}"
    with pytest.raises(UnsupportedSpec, match=re.escape(said)):
        TrainConfig(lr=float(value))
    with pytest.raises(UnsupportedSpec) as e:  # named as the user wrote it: Model's keyword
        hf.Model("mnist-linear", lr=float(value))
    assert str(e.value) == f"Model option lr={float(value)}: expected a number {holds}"
    (tmp_path / "c.toml").write_text(f"lr = {value}\n")
    assert main(["train", "--config", str(tmp_path / "c.toml"), "--run-dir", "r"]) == 3
    assert one_line_error(capsys).endswith(said)
    assert not (tmp_path / "r").exists()
    with pytest.raises(UnsupportedSpec, match=re.escape("Model option weight_decay=1e-50: expected a number that f32 "
                                                        "holds (0, or 1.2e-38")):  # a field that takes 0 offers it
        hf.Model("mnist-linear", weight_decay=1e-50)


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


def test_a_warmup_of_one_update_warms_up_and_one_of_none_is_refused(tmp_path, capsys, monkeypatch):
    """A warm-up of one whole update is a step below the lr (as PyTorch's and timm's ramps are), not a step at
    it; one worth less than an update would warm up nothing, and is refused saying what it amounts to."""
    from types import SimpleNamespace

    from hloforge.train.schedule import warmup_updates
    from hloforge.train.trainer import Run

    fake = SimpleNamespace(cfg=TrainConfig(lr=1.0, epochs=2, warmup_epochs=0.1, schedule="constant"),
                           variant=SimpleNamespace(accum=1), steps_per_epoch=10, origin=(0, 0))  # 1 update
    assert [Run.lr(fake, s) for s in range(3)] == [0.5, 1.0, 1.0]
    assert warmup_updates(0.0455, 22) == 1 and warmup_updates(0.29, 100) == 29  # f64's 28.999999999999996
    monkeypatch.chdir(tmp_path)
    assert main([*TRAIN, "--warmup-epochs", "0.01"]) == 3  # digits at batch 64: 22 updates an epoch
    assert one_line_error(capsys) == ("hloforge: error: warmup_epochs 0.01 is less than one optimizer update (0.01 "
                                      "of an epoch of 22), so it would warm up nothing; expected at least 0.0455 (one "
                                      "update), or 0 for no warm-up")
    assert not (tmp_path / "runs").exists()
    m = hf.Model("mnist-linear", warmup_epochs=0.01)
    with pytest.raises(UnsupportedSpec, match=r"update \(0\.01 of an epoch of 44\)"):  # batch 32
        m.fit(data="digits", epochs=1, verbose=False)
    assert m._step == 0


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


# ------------------------------------------------------------------ 6. a directory of the user's own files
def own_files(d) -> dict[str, bytes]:
    """A directory the user made, holding files of the names a run writes, none a run's."""
    os.makedirs(d, exist_ok=True)
    for name, text in (("config.toml", b"important\n"), ("metrics.jsonl", b'{"mine":1}\n'), ("notes.txt", b"n\n")):
        with open(os.path.join(d, name), "wb") as f:
            f.write(text)
    return snapshot(d)


def test_save_refuses_a_directory_holding_the_users_own_files_overwrite_or_not(tmp_path):
    proj = str(tmp_path / "proj")
    before = own_files(proj)
    m = hf.Model("mnist-linear")
    for overwrite in (False, True):  # overwrite=True replaces a run, not files that are none
        with pytest.raises(HloforgeError, match=r"^save directory .*proj holds config\.toml, metrics\.jsonl, which are "
                                                r"not a run's and .* would replace or delete; expected a new or empty "
                                                r"directory, or a run's"):
            m.save(proj, overwrite=overwrite)
        assert snapshot(proj) == before  # nothing written, not even the lock
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("n\n")  # a file no run writes is no obstacle, and is kept
    m.save(str(tmp_path / "mine"))
    m.save(str(tmp_path / "mine"), overwrite=True)  # its own save replaced
    assert (tmp_path / "mine" / "notes.txt").read_text() == "n\n" and hf.load(str(tmp_path / "mine"))._epoch == 0


def test_train_refuses_a_run_dir_holding_the_users_own_files_before_the_compile(tmp_path, capsys):
    proj = str(tmp_path / "proj2")
    before = own_files(proj)
    capsys.readouterr()
    assert main([*TRAIN, "--run-dir", proj]) == 3
    err = one_line_error(capsys)
    assert f"run directory {proj} holds config.toml, metrics.jsonl, which are not a run's" in err, err
    assert "compiled" not in capsys.readouterr().out and snapshot(proj) == before
    with open(os.path.join(proj, "checkpoint.safetensors"), "wb") as f:
        f.write(b"my weights")  # not hloforge's: named, not taken for a run to --resume
    assert main([*TRAIN, "--run-dir", proj]) == 3
    assert "holds checkpoint.safetensors, config.toml, metrics.jsonl, which are not a run's" in one_line_error(capsys)


def test_train_takes_again_a_crashed_runs_directory_and_a_resumed_run(finished_run, tmp_path, capsys):
    crashed = str(tmp_path / "crashed")
    shutil.copytree(finished_run, crashed)
    for name in ("checkpoint.safetensors", "curves.png", "eval_correct.npz"):  # stopped in its first epoch
        os.remove(os.path.join(crashed, name))
    assert main([*TRAIN, "--run-dir", crashed]) == 0
    assert main(["train", "mnist-linear", "--epochs", "2", "--no-progress", "--run-dir", crashed, "--resume"]) == 0


def test_model_checkpoint_refuses_the_users_own_files_even_with_overwrite(tmp_path, capsys):
    best = str(tmp_path / "best")
    before = own_files(best)
    capsys.readouterr()
    assert main([*TRAIN, "--run-dir", str(tmp_path / "r"), "--callback",
                 f"model_checkpoint:path={best},monitor=top1,overwrite=true"]) == 3
    err = one_line_error(capsys)
    assert f"ModelCheckpoint path {best} holds config.toml, metrics.jsonl, which are not a run's" in err, err
    assert snapshot(best) == before and not (tmp_path / "r").exists()


def test_import_weights_refuses_an_out_directory_holding_the_users_own_files(tmp_path, capsys):
    from safetensors.numpy import save_file

    from hloforge.interop import torch_state_dict
    from hloforge.zoo import get_net

    spec = get_net("resnet18", classes=10, input=(3, 32, 32))
    sd = str(tmp_path / "sd.safetensors")
    save_file(torch_state_dict("torchvision:resnet18", spec, spec.init_params(0), [s.initial() for _, s in
                                                                                  spec.stats()]), sd)
    proj = str(tmp_path / "proj3")
    before = own_files(proj)
    capsys.readouterr()
    assert main(["import-weights", "torchvision:resnet18", sd, "--input", "3,32,32", "--data-opt", "size=32",
                 "--data-opt", "channels=3", "--out", proj]) == 3
    err = one_line_error(capsys)
    assert f"--out {proj} holds config.toml, metrics.jsonl, which are not a run's" in err, err
    assert snapshot(proj) == before


# ------------------------------------------------------------------ 7. a run's metrics log lost or logged over
def test_an_empty_atomic_write_writes_an_empty_file(tmp_path, monkeypatch):
    from hloforge.train.checkpoint import SLOW_WRITE_ENV, write_atomic

    for slow in ("", "0.001"):
        monkeypatch.setenv(SLOW_WRITE_ENV, slow)
        (tmp_path / "f").write_bytes(b"old")
        write_atomic(str(tmp_path / "f"), b"", "metrics log")
        assert (tmp_path / "f").read_bytes() == b"" and os.listdir(tmp_path) == ["f"]


def test_resume_with_a_metrics_log_that_lost_its_lines_is_refused_until_it_is_removed(finished_run, tmp_path,
                                                                                      capsys):
    run = str(tmp_path / "rz")
    shutil.copytree(finished_run, run)
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write("\n")
    before = snapshot(run)
    resume = ["train", "--resume", "--run-dir", run, "--epochs", "2", "--no-progress"]
    capsys.readouterr()
    assert main(resume) == 3
    err = one_line_error(capsys)
    assert f"{run}/metrics.jsonl holds no record of the 1 epoch" in err and "remove it" in err, err
    assert snapshot(run) == before
    os.remove(os.path.join(run, "metrics.jsonl"))  # resumed without the history, as the user chose
    assert main(resume) == 0
    assert config(run)["epochs"] == 2


def test_a_csv_logger_over_the_runs_own_files_is_refused_before_the_first_step(finished_run, tmp_path, capsys):
    run = str(tmp_path / "rc")
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    capsys.readouterr()
    for name in ("metrics.jsonl", "config.toml"):
        assert main(["train", "--resume", "--run-dir", run, "--epochs", "2", "--no-progress", "--callback",
                     f"csv_logger:path={run}/{name}"]) == 3
        err = one_line_error(capsys)
        assert f"CSVLogger path {run}/{name} is this run's own {name}" in err, err
        assert snapshot(run) == before
    assert main(["train", "--resume", "--run-dir", run, "--epochs", "2", "--no-progress", "--callback",
                 f"csv_logger:path={run}/log.csv"]) == 0
    assert open(os.path.join(run, "log.csv")).read().startswith("kind,epoch,step")


def test_save_into_the_directory_of_its_own_spec_file_is_refused_not_deleting_it(tmp_path):
    spec = tmp_path / "proj" / "net.json"
    spec.parent.mkdir()
    spec.write_text(hf.Model("mnist-linear").spec.to_json())
    m = hf.Model(str(spec))  # the config would name proj/net.json, which a save there removed as stale
    with pytest.raises(HloforgeError, match=r"holds net\.json, which is not a run's"):
        m.save(str(spec.parent))
    assert os.listdir(spec.parent) == ["net.json"]


def test_a_run_directory_as_config_names_its_config_file(tmp_path, capsys):
    """`train --config RUN` (the run directory, not its config.toml) said "cannot read it as TOML ([Errno 21] Is a
    directory: ...)"; now it says it is a directory and, where it holds one, which config file was meant."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('net = "mnist-linear"\n')
    assert main(["train", "--config", str(run), "--run-dir", str(tmp_path / "r")]) == 3
    assert one_line_error(capsys) == (f"hloforge: error: config {run} is a directory; expected a config file (TOML): "
                                      f"the run's own is {run / 'config.toml'}")
    assert not (tmp_path / "r").exists()


def test_an_empty_config_is_refused_not_trained_as_the_defaults(tmp_path, capsys):
    """`train --config c.toml` of an empty file (not saved yet, or the wrong one) trained train's defaults
    (mnist-mlp, 5 epochs) as if they were the config's, into runs/. Now one line saying it sets nothing."""
    (tmp_path / "c.toml").write_text("# my settings, to come\n")
    assert main(["train", "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "r")]) == 3
    assert one_line_error(capsys) == (f"hloforge: error: config {tmp_path / 'c.toml'} sets nothing (it is empty); "
                                      "expected train's options, as a run's config.toml holds them (net = \"...\", "
                                      "epochs = ..., ...)")
    assert not (tmp_path / "r").exists()
