"""User mistakes the framework API answered with a raw numpy or scipy error, a silently ignored argument, a
replaced checkpoint or a refusal after an epoch of training; each is now one line, before anything is done."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError, UnsupportedSpec

RNG = np.random.default_rng(0)
X = RNG.standard_normal((64, 784)).astype(np.float32)
Y = RNG.integers(0, 10, 64)


def one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


@pytest.fixture(scope="module")
def model() -> hf.Model:
    return hf.Model("mnist-mlp")


@pytest.mark.parametrize("call, said", [
    (lambda m: m.fit(X[:2], [[0], [1, 2]], batch_size=1, verbose=False), "fit y is ragged (its rows differ in length)"),
    (lambda m: m.evaluate(X[:2], [[0], [1, 2]]), "evaluate y is ragged (its rows differ in length)"),
    (lambda m: m.fit([([[1.0] * 784, [1.0] * 783], [0, 1])], verbose=False),
     "fit batch 0 has a ragged x (its rows differ in length)"),
    (lambda m: m.fit([(X[:2], [[0], [1, 2]])], verbose=False), "fit batch 0 has a ragged y"),
    (lambda m: m.fit([(X[:0], Y[:0]), (X[:16], Y[:16])], verbose=False),
     "fit batch 0 has x of shape [0, 784], expected an array with one row per example, at least one"),
])
def test_ragged_or_empty_arrays_are_one_line(model, call, said) -> None:
    """Before: numpy's ValueError ('setting an array element with a sequence') from deep in arraydata, and an
    empty first batch said as 'batch_size must be an integer ≥ 1, got 0' with no batch_size given."""
    with pytest.raises(DataError) as error:
        call(model)
    assert said in one_line(error)


def test_a_scipy_sparse_matrix_is_one_line(model) -> None:
    """Before: scipy's TypeError ('sparse array length is ambiguous')."""
    sparse = pytest.importorskip("scipy.sparse")
    for call, what in ((lambda: model.fit(sparse.csr_matrix(X), Y, batch_size=16, verbose=False), "fit x"),
                       (lambda: model.predict(sparse.csr_matrix(X)), "predict x"),
                       (lambda: model.fit(X, sparse.csr_matrix(Y.reshape(-1, 1)), batch_size=16, verbose=False),
                        "fit y")):
        with pytest.raises(DataError) as error:
            call()
        assert one_line(error) == (f"{what} is a scipy sparse csr_matrix; expected a dense array (its .toarray())")


def test_a_masked_array_with_values_masked_is_one_line(model) -> None:
    """Before: np.asarray read the values under the mask (the missing ones a file filled in) as x and labels."""
    x, y = np.ma.masked_array(X, np.zeros_like(X, bool)), np.ma.masked_array(Y, np.zeros_like(Y, bool))
    x[3, 1], y[5] = np.ma.masked, np.ma.masked
    for call, what, n in ((lambda: model.fit(x, Y, batch_size=16, verbose=False), "fit x", X.size),
                          (lambda: model.evaluate(X, y), "evaluate y", Y.size),
                          (lambda: model.predict(x), "predict x", X.size),
                          (lambda: model.fit([(x[:16], Y[:16])], verbose=False), "fit batch 0's x", 16 * X.shape[1])):
        with pytest.raises(DataError) as error:
            call()
        assert one_line(error) == (f"{what} is a masked array with 1 of its {n} values masked, which would be read as "
                                   "the values under the mask; expected every value real: fill them (.filled(value)) "
                                   "or drop their rows")
    assert model.predict(np.ma.masked_array(X, np.zeros_like(X, bool))).shape == (len(X), 10)  # none masked: read


def test_paths_to_array_files_are_said_to_be_paths(model, tmp_path, monkeypatch) -> None:
    """Before: fit("x.npy", "y.npy") read x as a dataset's name and said 'fit(data=NAME) ... pass no x, y'."""
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    path = str(tmp_path / "x.npy")
    for call, what in ((lambda: model.fit(path, str(tmp_path / "y.npy"), verbose=False), "fit"),
                       (lambda: model.fit(path, verbose=False), "fit"),
                       (lambda: model.evaluate(path, str(tmp_path / "y.npy")), "evaluate")):
        with pytest.raises(DataError) as error:
            call()
        assert one_line(error) == (f"{what} x is the path {path!r}, a file's name, not its arrays; expected arrays "
                                   "(np.load(path) reads a .npy) or a registered dataset's name")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits").mkdir()  # a folder named as a dataset: the name is the dataset's
    assert model.evaluate("digits")["n"] == 360


def test_a_dict_of_arrays_is_said_to_be_one(model) -> None:
    """Before: fit iterated its keys and said 'fit batch 0 is a str, expected a pair (x, y)'."""
    with pytest.raises(DataError) as error:
        model.fit({"image": X, "label": Y}, verbose=False)
    assert one_line(error) == ("fit x is a dict (keys 'image', 'label'), not batches; expected arrays x and y "
                               "(fit(d['x'], d['y']) of a dict d holding them) or an iterable of (x, y) batches")


def test_bool_features_say_how_to_read_them_as_numbers(model) -> None:
    """Before: 'fit x has dtype bool, expected real numbers (float32)' and no more."""
    with pytest.raises(DataError) as error:
        model.fit(X > 0, Y, batch_size=16, verbose=False)
    assert one_line(error) == ("fit x has dtype bool, expected real numbers (float32) (x.astype(np.float32) reads "
                               "False, True as 0, 1)")
    assert model.predict((X > 0).astype(np.float32)).shape == (len(X), 10)


def test_arguments_that_were_ignored_or_read_as_true_are_refused(model, tmp_path) -> None:
    """Before: save(overwrite="no") replaced the checkpoint ("no" is truthy), evaluate("digits", data="mnist")
    scored digits, and data_options beside arrays were dropped unread."""
    m = hf.Model("mnist-mlp")
    m.save(str(tmp_path / "s"))
    m.fit(X, Y, batch_size=16, verbose=False)
    with pytest.raises(UnsupportedSpec, match=r"^overwrite must be True or False \(or 1 or 0\), got 'no'$"):
        m.save(str(tmp_path / "s"), overwrite="no")
    assert hf.load(str(tmp_path / "s"))._epoch == 0  # the first save, not replaced
    with pytest.raises(UnsupportedSpec, match=r"^two datasets given: 'digits' and data='mnist'$"):
        model.evaluate("digits", data="mnist")
    for call, what in ((lambda: model.fit(X, Y, batch_size=16, verbose=False, data_options={"size": -5}), "fit"),
                       (lambda: model.evaluate(X, Y, data_options=5), "evaluate")):
        with pytest.raises(UnsupportedSpec) as error:
            call()
        assert one_line(error).startswith(f"data_options are a dataset's options ({what}(data=NAME, ")


def test_model_checkpoint_naming_a_dataset_the_net_cannot_read_is_refused_before_the_first_step(tmp_path) -> None:
    """Before: a whole epoch trained, then the fit stopped at the first save."""
    m = hf.Model(hf.NetSpec("n", (50,), [hf.layers.Dense(10)], 10))
    cb = hf.ModelCheckpoint(str(tmp_path / "best"), monitor="loss", data="digits")
    with pytest.raises(DataError) as error:
        m.fit(RNG.standard_normal((64, 50)).astype(np.float32), Y, batch_size=16, epochs=3, verbose=False,
              callbacks=[cb])
    assert "naming dataset 'digits': dataset 'digits' gives inputs of shape [1, 28, 28], but net 'n' expects [50]" \
        in one_line(error)
    assert m._epoch == 0 and m._step == 0 and not (tmp_path / "best").exists()


def test_load_refuses_a_run_whose_config_and_checkpoint_disagree(tmp_path) -> None:
    """Before: hf.load took the checkpoint's variant over a config naming another (hloforge eval refused the
    same directory), and an unknown key in the checkpoint's variant was Variant's own TypeError."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    hf.Model("mnist-mlp").save(str(tmp_path / "s"))
    shutil.copytree(tmp_path / "s", tmp_path / "sgd")
    config = tmp_path / "sgd" / "config.toml"
    config.write_text(re.sub(r'optimizer = "adam"', 'optimizer = "sgd"', config.read_text()))
    shutil.copytree(tmp_path / "s", tmp_path / "foo")
    ckpt = str(tmp_path / "foo" / "checkpoint.safetensors")
    with safe_open(ckpt, "np") as f:
        meta = f.metadata()
    save_file(load_file(ckpt), ckpt, metadata={**meta, "variant": json.dumps({"foo": 1})})
    for bad, needle in (("sgd", "was trained with optimizer='adam', not optimizer='sgd'"),
                        ("foo", "was trained with foo=1, not foo absent")):
        with pytest.raises(DataError) as error:
            hf.load(str(tmp_path / bad))
        said = one_line(error)
        assert said.startswith(f"run directory {tmp_path / bad}: its config.toml and checkpoint disagree: ")
        assert needle in said, said


def test_parameters_beyond_the_machine_are_refused_before_the_draw() -> None:
    """Before: numpy's MemoryError ('Unable to allocate 5.70 TiB'); a size under the address space but over
    the memory would have had the process killed as the draw touched its pages."""
    with pytest.raises(UnsupportedSpec) as error:
        hf.Model(hf.NetSpec("huge", (784,), [hf.layers.Dense(10**9), hf.layers.Dense(10)], 10))
    assert re.fullmatch(r"net 'huge' has 795,000,000,010 parameters, 2,961\.6 GiB of float32, more than this "
                        r"machine's [\d,.]+ GiB of memory", one_line(error))


def test_a_ddpm_on_arrays_is_one_line_naming_the_way_it_is_fit() -> None:
    """Before: fit on its images [N, 3, 32, 32] wanted [N, 4, 32, 32], fit on those wanted [3, 32, 32], and
    evaluate on them named a shape never passed ([4, 5, 32, 32])."""
    ddpm = hf.Model("ddpm-mini")
    for call, what in ((lambda: ddpm.fit(np.zeros((4, 3, 32, 32), np.float32), np.zeros(4, int), batch_size=2,
                                         verbose=False), "fit"),
                       (lambda: ddpm.evaluate(np.zeros((4, 4, 32, 32), np.float32), np.zeros(4, int)), "evaluate")):
        with pytest.raises(UnsupportedSpec) as error:
            call()
        assert one_line(error) == (f"net 'ddpm-mini' is a DDPM: {what} takes its clean images from a registered "
                                   f"dataset ({what}(data=NAME), or hloforge train / eval), not from arrays")
