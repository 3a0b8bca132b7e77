"""A run of a net from a spec file opens from its checkpoint's own copy of the spec: evaluated from
another folder, after the file was deleted, or after the run directory (a saved NetSpec's included)
was moved, instead of "unknown net" for a path that no longer resolves."""

from __future__ import annotations

import os
import shutil

import numpy as np

import hloforge as hf
from hloforge.cli import main
from hloforge.zoo import get_net


def trained_spec_file_run(tmp_path, monkeypatch) -> None:
    """work/run: mnist-linear trained from work/ for an epoch, its net a spec file named relatively
    (specs/net.json); tmp_path/elsewhere made for the run or its reader to move to. Leaves the cwd in work/."""
    os.makedirs(tmp_path / "work" / "specs")
    os.makedirs(tmp_path / "elsewhere")
    (tmp_path / "work" / "specs" / "net.json").write_text(get_net("mnist-linear").to_json(), encoding="utf-8")
    monkeypatch.chdir(tmp_path / "work")
    assert main(["train", "specs/net.json", "--epochs", "1", "--run-dir", "run", "--no-progress"]) == 0


def test_a_spec_file_run_evaluates_from_elsewhere_with_its_file_gone(tmp_path, monkeypatch, capsys):
    trained_spec_file_run(tmp_path, monkeypatch)
    os.remove("specs/net.json")
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "work" / "run")]) == 0, capsys.readouterr().err
    assert "epoch 1" in capsys.readouterr().out


def test_a_saved_netspec_run_loads_and_evaluates_after_its_directory_moved(tmp_path, capsys):
    m = hf.Model(get_net("mnist-linear"))
    x, y = np.random.default_rng(0).normal(size=(64, 784)).astype(np.float32), np.arange(64) % 10
    m.fit(x, y, epochs=1, verbose=0)
    m.save(str(tmp_path / "saved"), data="digits")
    shutil.move(tmp_path / "saved", tmp_path / "moved")
    loaded = hf.load(str(tmp_path / "moved"))
    assert all(np.array_equal(a, b) for a, b in zip(loaded.params, m.params, strict=True))
    assert main(["eval", str(tmp_path / "moved")]) == 0, capsys.readouterr().err


def test_api_paths_starting_with_a_tilde_are_under_home(tmp_path, monkeypatch):
    """Was: save("~/saved") wrote a folder named `~` in the current one (hf.load("~/saved") then read it
    back from there alone, and `rm -rf ~` is how a user would clear it); now `~` is the home folder, as
    a shell reads it, for save, hf.load, plot and ModelCheckpoint."""
    from hloforge.callbacks import ModelCheckpoint

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    os.makedirs(tmp_path / "home")
    os.makedirs(tmp_path / "work")
    monkeypatch.chdir(tmp_path / "work")
    m = hf.Model(get_net("mnist-linear"))
    x, y = np.random.default_rng(0).normal(size=(64, 784)).astype(np.float32), np.arange(64) % 10
    m.fit(x, y, epochs=1, verbose=0, validation_data=(x, y),
          callbacks=[ModelCheckpoint("~/best", monitor="val_loss")])
    assert m.save("~/saved") == str(tmp_path / "home" / "saved")
    m.plot("~/curves.png")
    assert {"best", "curves.png", "saved"} <= set(os.listdir(tmp_path / "home"))
    assert os.listdir(tmp_path / "work") == []  # no folder named ~
    monkeypatch.chdir(tmp_path)
    loaded = hf.load("~/saved")
    assert all(np.array_equal(a, b) for a, b in zip(loaded.params.values(), m.params.values(), strict=True))


def test_a_model_of_a_spec_file_under_home_named_with_a_tilde(tmp_path, monkeypatch):
    """Was: Model("~/net.json") refused, `spec file '~/net.json' does not exist`, where save("~/…") writes."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "net.json").write_text(get_net("mnist-linear").to_json(), encoding="utf-8")
    monkeypatch.chdir(tmp_path / "..")
    m = hf.Model("~/net.json")
    assert m.spec == get_net("mnist-linear")
    m.save(str(tmp_path / "saved"))
    assert f'net = "{tmp_path}/net.json"' in (tmp_path / "saved" / "config.toml").read_text(encoding="utf-8")


def test_config_of_a_moved_spec_file_run_trains_the_runs_net(tmp_path, monkeypatch, capsys):
    """`train --config RUN/config.toml` reproduces the run. Its net is a spec file's absolute path: on
    another machine (the file gone) it was `spec file ... does not exist`, now the checkpoint's copy; where
    the path holds another net now it trained that one unsaid, now one line naming the difference."""
    trained_spec_file_run(tmp_path, monkeypatch)
    trained = last_epoch(capsys.readouterr().out)
    shutil.copytree(tmp_path / "work" / "run", tmp_path / "elsewhere" / "run")
    os.remove("specs/net.json")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["train", "--config", "run/config.toml", "--run-dir", "again", "--no-progress"]) == 0, \
        capsys.readouterr().err
    assert last_epoch(capsys.readouterr().out) == trained
    (tmp_path / "work" / "specs" / "net.json").write_text(get_net("mnist-mlp").to_json(), encoding="utf-8")
    assert main(["train", "--config", "run/config.toml", "--run-dir", "other", "--no-progress"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "now holds another net than its run trained" in err, err
    assert not os.path.exists("other")
    net = str(tmp_path / "work" / "specs" / "net.json")  # given on the command line: the file as it is now
    assert main(["train", net, "--config", "run/config.toml", "--run-dir", "other", "--no-progress"]) == 0
    assert "mnist-mlp" in capsys.readouterr().out


def last_epoch(out: str) -> str:
    """The last epoch line's loss and top-1, without its speed."""
    return [ln for ln in out.splitlines() if ln.startswith("epoch ")][-1].split(" img/s")[0].rsplit("  ", 1)[0]
