"""The framework API's argument checks (hloforge.api): a wrong type, range, shape or destination is one
HloforgeError naming the argument and what was expected, never a raw TypeError / ValueError /
FileNotFoundError from numpy or the file system, and never a plausible wrong result."""

from __future__ import annotations

import math
import os
import pathlib
import re
import sys

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError, HloforgeError


def tiny_net() -> hf.NetSpec:
    Dense = hf.layers.Dense
    return hf.NetSpec("api-args", (4,), [Dense(8, act="relu"), Dense(3)], 3)


def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype(np.float32), (np.arange(n) % 3).astype(np.int32)


@pytest.fixture(scope="module")
def fitted() -> hf.Model:
    m = hf.Model(tiny_net(), lr=1e-2, schedule="constant")
    m.fit(*rows(16), epochs=1, batch_size=8, verbose=False)
    return m


@pytest.mark.parametrize("kw, message", [
    ({"lr": "0.1"}, "Model option lr='0.1': expected a number"),
    ({"lr": None}, "Model option lr=None: expected a number"),
    ({"lr": True}, "Model option lr=True: expected a number"),
    ({"lr": -1.0}, "lr must be a positive number, got -1.0"),
    ({"seed": -1}, "Model option seed=-1: expected a finite number ≥ 0"),
    ({"seed": "a"}, "Model option seed='a': expected an integer"),
    ({"seed": 1.5}, "Model option seed=1.5: expected an integer"),
    ({"seed": True}, "Model option seed=True: expected an integer"),
    ({"warmup_epochs": "1"}, "Model option warmup_epochs='1': expected a number"),
    ({"warmup_epochs": math.nan}, "Model option warmup_epochs=nan: expected a finite number ≥ 0"),
    ({"decay_rate": None}, "Model option decay_rate=None: expected a number"),
    ({"decay_rate": 2.0}, "decay_rate must be in (0, 1]"),
    ({"bn_momentum": "x"}, "Model option bn_momentum='x': expected a number"),
    ({"bn_momentum": 1.5}, "bn_momentum must be in [0, 1), got 1.5"),
    ({"ema": "x"}, "Model option ema='x': expected a number"),
    ({"clip": "x"}, "Model option clip='x': expected a number"),
    ({"mixup": "x"}, "Model option mixup='x': expected a number"),
    ({"bn_eps": "x"}, "Model option bn_eps='x': expected a number (or nothing)"),
    ({"weight_decay": "x"}, "Model option weight_decay='x': expected a number (or nothing)"),
    ({"schedule": None}, "Model option schedule=None: expected a string"),
])
def test_model_numbers_of_the_wrong_type_or_range_are_one_line(kw: dict, message: str) -> None:
    with pytest.raises(HloforgeError, match=re.escape(message)):
        hf.Model(tiny_net(), **kw)


def test_bn_momentum_on_a_net_without_batchnorm_is_one_line() -> None:
    """As bn_eps there: an option that would do nothing is refused, naming the net (the default is no option)."""
    with pytest.raises(HloforgeError, match=re.escape("bn_momentum 0.5: net 'api-args' has no BatchNorm")):
        hf.Model(tiny_net(), bn_momentum=0.5)
    assert hf.Model(tiny_net(), bn_momentum=0.9).bn_momentum == 0.9
    assert hf.Model("resnet-mini", bn_momentum=0.5).bn_momentum == 0.5


def test_zoo_overrides_of_the_wrong_type_are_one_line() -> None:
    with pytest.raises(HloforgeError, match=re.escape("Model option classes='3': expected an integer (or nothing)")):
        hf.Model("mnist-mlp", classes="3")
    with pytest.raises(HloforgeError, match=re.escape("Model option input=5: expected a list")):
        hf.Model("mnist-mlp", input=5)


def test_numpy_scalars_are_taken_as_python_numbers() -> None:
    m = hf.Model(tiny_net(), lr=np.float32(0.5), seed=np.int64(3), accum=np.int64(1))
    assert type(m.lr) is float and m.lr == 0.5 and type(m.seed) is int and m.seed == 3
    assert m._config("", "digits").lr == 0.5  # the run config takes it (a numpy scalar is no TOML number)


def test_fit_batch_size_is_checked_on_every_path() -> None:
    m = hf.Model(tiny_net())
    with pytest.raises(HloforgeError, match=re.escape("batch_size must be an integer ≥ 1, got 'x'")):
        m.fit(data="digits", batch_size="x", verbose=False)
    # 0 is a mistake, not "the first batch's size"
    with pytest.raises(HloforgeError, match=re.escape("batch_size must be an integer ≥ 1, got 0")):
        m.fit([rows(8)], batch_size=0, verbose=False)
    assert m._step == 0


def test_fewer_rows_than_the_default_batch_say_the_batch_was_the_default() -> None:
    """Before: 'batch_size 32 is larger than the 10 rows of x' to a user who gave no batch_size."""
    m = hf.Model(tiny_net())
    with pytest.raises(DataError, match=re.escape("batch_size 32 (fit's default) is larger than the 10 rows of x; "
                                                  "expected at most 10")):
        m.fit(*rows(10), verbose=False)
    with pytest.raises(DataError, match=re.escape("batch_size 16 is larger than the 10 rows of x; expected at most")):
        m.fit(*rows(10), batch_size=16, verbose=False)
    assert m._step == 0


def test_a_single_row_is_said_to_want_a_batch() -> None:
    m = hf.Model(tiny_net())
    x, y = rows(8)
    want = "expected [N, 4] (a batch of rows; one row is x[None])"
    with pytest.raises(DataError, match=re.escape(f"predict x has shape [4], {want}")):
        m.predict(x[0])
    with pytest.raises(DataError, match=re.escape("evaluate x has shape [8, 2, 2], expected [N, 4] (rows of the "
                                                  "same size in another shape; x.reshape(len(x), 4) gives the net's)")):
        m.evaluate(x.reshape(8, 2, 2), y)
    with pytest.raises(DataError, match=re.escape(f"fit x has shape [4], {want}")):
        m.fit(x[0], y[:4], verbose=False)
    with pytest.raises(DataError, match=re.escape(f"validation_data x has shape [4], {want}")):
        m.fit(x, y, validation_data=(x[0], y[:1]), verbose=False)
    with pytest.raises(DataError, match=re.escape("predict x is ragged (its rows differ in length); expected an "
                                                  "array of shape [N, 4]")):
        m.predict([[1.0, 2.0, 3.0, 4.0], [1.0]])


def test_fits_pair_or_batches_where_x_alone_is_taken_are_named_as_such() -> None:
    m = hf.Model(tiny_net())
    x, y = rows(8)
    with pytest.raises(DataError, match=re.escape("evaluate x is a pair (x, y), not x alone; expected an array of "
                                                  "shape [N, 4]")):
        m.evaluate((x, y))
    with pytest.raises(DataError, match=re.escape("predict x is a sequence of (x, y) batches, not x alone "
                                                  "(np.concatenate each side's batches); expected an array of shape "
                                                  "[N, 4]")):
        m.predict([(x[:4], y[:4]), (x[4:], y[4:])])


def test_save_to_an_unwritable_place_is_one_line(tmp_path: pathlib.Path) -> None:
    m = hf.Model(tiny_net())
    (tmp_path / "f").write_text("")
    with pytest.raises(HloforgeError, match=r"^run directory .*f/run: .*f is a file, where a directory was "
                                            "expected; pass a directory, or a path where one can be made$"):
        m.save(str(tmp_path / "f" / "run"))  # its parent is a file
    if sys.platform.startswith("linux"):
        with pytest.raises(HloforgeError, match="cannot save to /proc/nope: "):
            m.save("/proc/nope")
    with pytest.raises(HloforgeError, match=re.escape("save takes a path (a non-empty str or os.PathLike), got 5")):
        m.save(5)  # type: ignore[arg-type]
    assert m.save(tmp_path / "run") == str(tmp_path / "run")  # a Path is a path
    assert os.path.exists(tmp_path / "run" / "checkpoint.safetensors")


def test_plot_refuses_a_suffix_it_cannot_write(fitted: hf.Model, tmp_path: pathlib.Path) -> None:
    for name, got in (("p.txt", "suffix '.txt'"), ("p.svg", "suffix '.svg'"), ("curves", "no suffix")):
        path = str(tmp_path / name)
        with pytest.raises(HloforgeError, match=re.escape(f"plot cannot write {path}: it has {got}; expected a path "
                                                          "ending in one of ['.png']")):
            fitted.plot(path)
        assert not os.path.exists(path)  # nothing written
    path = fitted.plot(tmp_path / "P.PNG")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_to_a_missing_directory_is_one_line(fitted: hf.Model, tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "missing" / "p.png")
    with pytest.raises(HloforgeError, match=re.escape(f"cannot write the plot to {path}: No such file or directory; "
                                                      "expected a writable file in an existing directory")):
        fitted.plot(path)


@pytest.mark.parametrize(("kw", "message"), [
    ({"decay_rate": 0.5}, "Model option(s) ['decay_rate'] set the exp schedule's decay, but schedule is 'cosine'; "
                          "expected schedule='exp' with them, or neither"),
    ({"schedule": "constant", "decay_epochs": 2.4}, "Model option(s) ['decay_epochs'] set the exp schedule's decay, "
                                                    "but schedule is 'constant'"),
    ({"diffusion_steps": 50, "beta_end": 0.3}, "Model option(s) ['diffusion_steps', 'beta_end'] set a DDPM's noise "
                                               "schedule; net 'mnist-mlp' is no DDPM"),
])
def test_model_options_its_schedule_or_net_never_reads_are_one_line(kw: dict, message: str) -> None:
    """Before: taken and never read (the lr never decayed by them), as `hloforge train` took the flags."""
    with pytest.raises(HloforgeError) as error:
        hf.Model("mnist-mlp", **kw)
    assert message in str(error.value) and "\n" not in str(error.value)
    hf.Model("mnist-mlp", schedule="exp", decay_rate=0.5, decay_epochs=2.4)  # read there


def test_a_fit_option_given_to_model_says_fit_takes_it() -> None:
    """Before: `hf.Model(net, epochs=3)` listed only the variant's options, not lr or seed, nor where epochs goes."""
    with pytest.raises(HloforgeError) as e:
        hf.Model("mnist-mlp", lr=1e-3, epochs=3)
    said = str(e.value)
    assert said.startswith("Model takes no option(s) ['epochs'] (epochs: give it to fit); expected its own ['net', "
                           "'optimizer', 'lr',"), said
    assert "the variant's ['accum'," in said


@pytest.mark.parametrize("name", ["Model", "fit", "evaluate", "predict", "save", "plot", "load", "register", "NetSpec",
                                  "Variant"])
def test_every_public_parameter_is_in_its_docstring(name: str) -> None:
    """help(hf.Model) and its methods' help name every parameter they take, and Model's every Variant field it takes
    as a keyword: before, fit's docstring left out validation_data, callbacks and verbose, Model's bn_momentum and
    frozen, save's overwrite and hf.load's backend, and hf.NetSpec and hf.Variant had no docstring at all."""
    import inspect

    import attrs

    from hloforge.core.variant import Variant

    fn = getattr(hf, name) if name in ("load", "register", "Model", "NetSpec", "Variant") else getattr(hf.Model, name)
    params = [p.name for p in inspect.signature(fn).parameters.values()
              if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    if name == "Model":
        params += [f.name for f in attrs.fields(Variant)]
    doc = re.sub(r"\s+", " ", inspect.getdoc(fn) or "")
    unsaid = [p for p in params if not re.search(rf"(?<![\w.]){p}(?!\w)", doc)]
    assert unsaid == [], f"{name}'s docstring does not name {unsaid}"
