"""A model trained on the user's own arrays saves a run directory that names no dataset (config
data = "arrays"): `hloforge eval` refuses it in one line instead of scoring it on digits, `hloforge
export` and `hf.load` need no dataset, and `save(data=NAME)` is refused unless the net fits NAME.
A model fit on a registered dataset (or loaded from its run) still names it."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import hloforge as hf
from hloforge.cli import main
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.train import checkpoint as ckpt
from hloforge.train.config import CHECKPOINT, CONFIG, load_config


def tiny_net(inputs: int = 64, classes: int = 3) -> hf.NetSpec:
    Dense = hf.layers.Dense
    return hf.NetSpec("arrays-tiny", (inputs,), [Dense(8, act="relu"), Dense(classes)], classes)


def fit_on_arrays(net: hf.NetSpec | str, inputs: int, classes: int) -> tuple[hf.Model, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, inputs)).astype(np.float32)
    y = (np.arange(64) % classes).astype(np.int32)
    m = hf.Model(net, lr=1e-2)
    m.fit(x, y, epochs=1, batch_size=16, verbose=False)
    return m, x, y


def saved_data(d: str) -> tuple[str, dict]:
    """(the dataset the run's config names, its checkpoint's meta)."""
    return load_config(os.path.join(d, CONFIG)).data, ckpt.load_checkpoint(os.path.join(d, CHECKPOINT))[1]


@pytest.mark.parametrize("net", ["tiny", "mnist-linear"], ids=["3-class-8x8", "digits-shaped"])
def test_eval_of_a_run_fit_on_arrays_is_refused_not_scored_on_digits(net, tmp_path, capsys) -> None:
    # mnist-linear (784 inputs, 10 classes) fits digits: its run was scored on digits, a set it never saw
    m, _, _ = fit_on_arrays(tiny_net(), 64, 3) if net == "tiny" else fit_on_arrays("mnist-linear", 784, 10)
    d = m.save(str(tmp_path / "run"))
    data, meta = saved_data(d)
    assert data == "arrays" and "eval_set" not in meta  # no registered eval set to compare a later eval against
    capsys.readouterr()
    assert main(["eval", d]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(r"run was trained on arrays, not a registered dataset, so it has no test split to read; score "
                     r"it with hf.load\(.*run'\)\.evaluate\(x, y\), or name a dataset its net fits", err), err


def test_a_run_fit_on_arrays_exports_and_loads_without_a_dataset(tmp_path, capsys) -> None:
    m, x, y = fit_on_arrays(tiny_net(), 64, 3)
    d, out = m.save(str(tmp_path / "run")), str(tmp_path / "exported")
    assert main(["export", d, "--out", out]) == 0, capsys.readouterr().err
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["input_shape"] == [64] and manifest["classes"] == 3
    from safetensors.numpy import load_file

    weights = load_file(os.path.join(out, "weights.safetensors"))
    assert all(np.array_equal(weights[f"param/{n}"], w) for n, w in m.params.items())
    back = hf.load(d)
    assert all(np.array_equal(back.params[n], w) for n, w in m.params.items())
    assert back.evaluate(x, y) == m.evaluate(x, y)
    again = back.save(str(tmp_path / "again"))  # a loaded arrays run still names no dataset
    assert saved_data(again)[0] == "arrays"


def test_save_naming_a_dataset_the_net_does_not_fit_is_refused(tmp_path) -> None:
    three, _, _ = fit_on_arrays(tiny_net(), 64, 3)
    with pytest.raises(DataError, match=re.escape("naming dataset 'digits': dataset 'digits' has 10 classes, net "
                                                  "'arrays-tiny' has 3")):
        three.save(str(tmp_path / "classes"), data="digits")
    ten = hf.Model(tiny_net(64, 10))  # digits' classes, but 8×8 = 64 inputs against its 28×28 rows
    with pytest.raises(DataError, match=re.escape("naming dataset 'digits': dataset 'digits' gives inputs of shape "
                                                  "[1, 28, 28], but net 'arrays-tiny' expects [64]")):
        ten.save(str(tmp_path / "input"), data="digits")
    with pytest.raises(HloforgeError, match="naming dataset 'nope': "):
        three.save(str(tmp_path / "unknown"), data="nope")
    assert not any(os.path.exists(tmp_path / n) for n in ("classes", "input", "unknown"))  # nothing written


def test_a_model_fit_on_digits_still_names_digits(tmp_path, capsys) -> None:
    m = hf.Model("mnist-linear")
    m.fit("digits", epochs=1, batch_size=64, verbose=False)
    d = m.save(str(tmp_path / "run"))
    data, meta = saved_data(d)
    assert data == "digits" and meta["eval_set"].startswith("digits:test:")
    assert main(["eval", d]) == 0, capsys.readouterr().err
    loaded = hf.load(d)
    assert saved_data(loaded.save(str(tmp_path / "resaved")))[0] == "digits"
    x = np.random.default_rng(0).normal(size=(64, 784)).astype(np.float32)
    loaded.fit(x, np.arange(64) % 10, epochs=1, batch_size=32, verbose=False)  # now trained on arrays last
    assert saved_data(loaded.save(str(tmp_path / "tuned")))[0] == "arrays"


def test_a_dataset_fit_with_options_saves_them(tmp_path, capsys) -> None:
    """digits at size 16 for a 16×16 net: the saved config keeps size=16, so eval rebuilds the dataset the
    net fits; a loaded run's save keeps them too, and naming another dataset takes that one's defaults."""
    net = hf.NetSpec("digits16", (1, 16, 16), [hf.layers.Flatten(), hf.layers.Dense(10)], 10)
    m = hf.Model(net, lr=1e-2)
    m.fit(data="digits", data_options={"size": 16}, epochs=1, verbose=False)
    d, again = str(tmp_path / "d"), str(tmp_path / "again")
    m.save(d)
    assert load_config(os.path.join(d, CONFIG)).data_options == ("size=16",)
    assert main(["eval", d]) == 0
    hf.load(d).save(again)
    assert load_config(os.path.join(again, CONFIG)).data_options == ("size=16",)
    with pytest.raises(HloforgeError, match=re.escape(f"cannot save {tmp_path / 'x'} naming dataset 'shapes'")):
        m.save(str(tmp_path / "x"), data="shapes")


def test_resuming_an_arrays_run_from_the_command_line_says_how(tmp_path, capsys) -> None:
    m, _, _ = fit_on_arrays(tiny_net(), 64, 3)
    d = str(tmp_path / "d")
    m.save(d)
    assert main(["train", "--resume", "--run-dir", d, "--no-progress"]) == 3
    err = capsys.readouterr().err.strip()
    assert err == (f"hloforge: error: run {d} was trained on arrays from Python, not a registered dataset; "
                   f"continue it there (hf.load({d!r}).fit(x, y)), or on a dataset its net fits (--data NAME)")


def test_save_names_a_dataset_with_the_options_the_net_needs(tmp_path, capsys) -> None:
    # Before: save(data=NAME) took no options, so a net of another input than the dataset's default (mnist-mlp's
    # 784 rows are digits' 28x28 images; resnet-mini at 12x12 is not) could never name it: refused, and
    # data_options= a TypeError.
    model = hf.Model("resnet-mini", input=(1, 12, 12))
    with pytest.raises(HloforgeError, match=r"gives inputs of shape \[1, 28, 28\]"):
        model.save(str(tmp_path / "plain"), data="digits")
    d = model.save(str(tmp_path / "run"), data="digits", data_options={"size": 12})
    assert 'data_options = ["size=12"]' in (tmp_path / "run" / CONFIG).read_text()
    assert main(["eval", d]) == 0, capsys.readouterr().err
    assert "test top-1" in capsys.readouterr().out
    with pytest.raises(UnsupportedSpec, match="save's data_options are the options of the dataset it names"):
        model.save(str(tmp_path / "arrays"), data_options={"size": 12})
