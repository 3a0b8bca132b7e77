"""What the train and eval paths refuse before anything runs: config values, batches, checkpoints
of another net; and what a non-finite run leaves behind (issue 22)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hloforge.cli import main
from hloforge.core.errors import UnsupportedSpec
from hloforge.train.trainer import TrainConfig, load_config


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ------------------------------------------------------------------ config values
@pytest.mark.parametrize("field,value", [
    ("warmup_epochs", math.inf), ("warmup_epochs", -1.0), ("lr", math.nan), ("decay_rate", -math.inf),
    ("clip", math.inf), ("beta_end", math.nan), ("weight_decay", -0.5), ("seed", -3), ("epochs", 2.5),
    ("batch", True), ("lr", "0.1"), ("tag", 7), ("input", "3,32,32"), ("input", [3, -1]), ("data_options", 5),
])
def test_a_bad_config_value_is_refused_naming_it(field, value):
    with pytest.raises(UnsupportedSpec, match=rf"^(config value )?{field}\b"):
        TrainConfig(**{field: value})


# given as FLAG=VALUE: argparse reads a bare -inf as a flag
@pytest.mark.parametrize("flag,value", [("--warmup-epochs", "inf"), ("--lr", "nan"), ("--weight-decay", "-inf"),
                                        ("--clip", "inf"), ("--seed", "-1"), ("--beta-end", "nan")])
def test_a_non_finite_or_negative_train_flag_is_one_line_and_writes_nothing(flag, value, capsys, tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", f"{flag}={value}", "--epochs", "1"]) != 0
    assert flag.removeprefix("--").replace("-", "_") in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()


def test_a_config_file_with_infinity_is_refused(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text("warmup_epochs = inf\n")  # what a TOML writer may hold; the config refuses it
    assert main(["train", "--config", str(path), "--run-dir", str(tmp_path / "r")]) != 0
    assert "warmup_epochs" in one_line_error(capsys)
    assert not (tmp_path / "r").exists()


finite = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # any Unicode scalar value


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tag=text, data_dir=text, opts=st.lists(text.map(lambda s: f"k={s.strip() or 'v'}"), max_size=3),
       lr=finite.filter(lambda v: v > 0), warmup=finite, beta=finite, wd=st.none() | finite,
       dims=st.none() | st.lists(st.integers(1, 2**40), min_size=1, max_size=3))
def test_config_toml_reads_back_equal(tmp_path_factory, tag, data_dir, opts, lr, warmup, beta, wd, dims):
    """Whatever a config holds, the config.toml a run writes is TOML that `--config` reads back to it."""
    cfg = TrainConfig(tag=tag, data_dir=data_dir, data_options=opts, lr=lr, warmup_epochs=warmup, beta_end=beta,
                      weight_decay=wd, input=dims, tuned=("0:conv=im2col",), augment=False)
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    path.write_text(cfg.to_toml(), encoding="utf-8")
    assert load_config(str(path)) == cfg


def test_a_lone_surrogate_is_refused_not_written():
    with pytest.raises(UnsupportedSpec, match="lone surrogate"):
        TrainConfig(tag="run\udcff").to_toml()
