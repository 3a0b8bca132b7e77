"""A run's data_file (the text dataset's corpus, say) and data_dir are stored absolute in its config.toml and
checkpoint, so `hloforge eval` and `train --resume` find them from any folder; an older run that stored one
relative still opens from the folder it names it from, as before."""

from __future__ import annotations

import os

import pytest

from hloforge.cli import main
from hloforge.core.errors import HloforgeError
from hloforge.datasets.text import default_corpus
from hloforge.train import checkpoint as ckpt
from hloforge.train.config import TrainConfig, load_config

TRAIN = ["train", "tinygpt-nano", "--data", "text", "--batch", "16", "--no-progress"]


@pytest.fixture
def folders(tmp_path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(the folder holding corpus.txt, where the run is trained; another folder), the first the current one."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    (here / "corpus.txt").write_text(default_corpus()[:6000], encoding="utf-8")
    monkeypatch.chdir(here)
    return str(here), str(elsewhere)


def test_the_config_holds_the_absolute_path(folders: tuple[str, str], tmp_path) -> None:
    here, _ = folders
    cfg = TrainConfig(data="text", data_file="corpus.txt")
    assert cfg.data_file == os.path.join(here, "corpus.txt")
    assert TrainConfig().data_file == ""  # none: the dataset's own corpus
    assert TrainConfig(data="cifar10", data_dir="data/c").data_dir == os.path.join(here, "data", "c")
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml(), encoding="utf-8")
    assert load_config(str(path)) == cfg
    with pytest.raises(HloforgeError, match="config value data_file = 5: expected a string"):
        TrainConfig(data_file=5)  # type: ignore[arg-type]


def test_eval_and_resume_from_another_folder_find_the_file(folders: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    here, elsewhere = folders
    run = os.path.join(here, "run")
    assert main([*TRAIN, "--data-file", "corpus.txt", "--epochs", "1", "--run-dir", run]) == 0
    assert load_config(os.path.join(run, "config.toml")).data_file == os.path.join(here, "corpus.txt")
    assert ckpt.load_checkpoint(os.path.join(run, "checkpoint.safetensors"))[1]["config"]["data_file"] == \
        os.path.join(here, "corpus.txt")
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["eval", run]) == 0, capsys.readouterr().err
    assert "bits/char" in capsys.readouterr().out
    assert main([*TRAIN, "--epochs", "2", "--run-dir", run, "--resume"]) == 0, capsys.readouterr().err
    assert "resumed after epoch 1" in capsys.readouterr().out


def test_a_missing_file_is_still_one_line_and_nothing_is_written(folders: tuple[str, str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    here, _ = folders
    assert main([*TRAIN, "--data-file", "nope.txt", "--epochs", "1", "--run-dir", "run"]) == 3
    err = capsys.readouterr().err.strip()
    # not "cannot read it as UTF-8 ([Errno 2] ...)": a file that is not there has no encoding to blame
    assert err == (f"hloforge: error: text: {os.path.join(here, 'nope.txt')}: no such file or directory; expected "
                   "a UTF-8 text file (--data-file)"), err
    assert sorted(os.listdir(here)) == ["corpus.txt"]


def test_an_older_run_with_a_relative_path_opens_as_before(folders: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A run written before data_file was stored absolute: eval and --resume from the folder its relative
    path names the file from still work; the resumed run's config.toml then names the file absolutely."""
    here, elsewhere = folders
    run = os.path.join(here, "run")
    assert main([*TRAIN, "--data-file", "corpus.txt", "--epochs", "1", "--run-dir", run]) == 0
    # rewritten as an older hloforge wrote it: the path as given, in config.toml and the checkpoint's config
    toml = os.path.join(run, "config.toml")
    with open(toml, encoding="utf-8") as f:
        text = f.read()
    with open(toml, "w", encoding="utf-8") as f:
        f.write(text.replace(f'data_file = "{os.path.join(here, "corpus.txt")}"', 'data_file = "corpus.txt"'))
    file = os.path.join(run, "checkpoint.safetensors")
    tensors, meta = ckpt.load_checkpoint(file)
    meta["config"]["data_file"] = "corpus.txt"
    ckpt.save_checkpoint(file, list(tensors), list(tensors.values()), meta)
    capsys.readouterr()
    assert main(["eval", run]) == 0, capsys.readouterr().err
    assert main([*TRAIN, "--epochs", "2", "--run-dir", run, "--resume"]) == 0, capsys.readouterr().err
    assert load_config(toml).data_file == os.path.join(here, "corpus.txt")
    monkeypatch.chdir(elsewhere)  # resumed, the run now opens from anywhere
    capsys.readouterr()
    assert main(["eval", run]) == 0, capsys.readouterr().err


def test_a_spec_file_net_is_stored_absolute_so_config_reproduces_the_run_from_elsewhere(folders, capsys):
    """Before: config.toml kept `net = "tiny.toml"` as given, so `train --config RUN/config.toml` from another
    folder said the spec file does not exist (hf.Model already stored it absolute)."""
    here, elsewhere = folders
    spec = os.path.join(here, "tiny.toml")
    with open(spec, "w") as f:
        f.write('name = "tiny"\ninput_shape = [784]\nnum_classes = 10\n[[layers]]\nkind = "dense"\nunits = 10\n')
    assert main(["train", "tiny.toml", "--epochs", "1", "--run-dir", "run", "--no-progress"]) == 0
    config = os.path.join(here, "run", "config.toml")
    assert load_config(config).net == spec
    os.chdir(elsewhere)
    assert main(["train", "--config", config, "--run-dir", "again", "--no-progress"]) == 0
    capsys.readouterr()
