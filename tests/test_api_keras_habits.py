"""Keras's (and PyTorch's) habits met by the framework API: a keyword hloforge does not take is one line naming
the keyword and the hloforge way, never Python's 'got an unexpected keyword argument'; a typo keeps its own
line, with the close match."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError, UnsupportedSpec

X = np.zeros((64, 784), np.float32)
Y = np.arange(64) % 10


@pytest.fixture(scope="module")
def model() -> hf.Model:
    return hf.Model("mnist-linear")


def said(call) -> str:
    with pytest.raises(UnsupportedSpec) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("keyword, value, way", [
    ("validation_split", 0.1, "split x and y yourself and pass validation_data=(x_val, y_val)"),
    ("class_weight", {0: 2.0}, "repeat a rarer class's rows (np.repeat) or train with loss='focalCrossEntropy'"),
    ("sample_weight", np.ones(64), "repeat the rows to weigh more"),
    ("steps_per_epoch", 2, "an epoch is len(x) // batch_size steps"),
    ("initial_epoch", 1, "a fit goes on from the model's own epoch"),
    ("workers", 4, "in this process"),
])
def test_a_keras_keyword_of_fit_names_the_hloforge_way(model, keyword, value, way) -> None:
    """Before: TypeError: Model.fit() got an unexpected keyword argument 'validation_split'."""
    line = said(lambda: model.fit(X, Y, batch_size=32, verbose=False, **{keyword: value}))
    assert line.startswith(f"fit takes no keyword {keyword!r} (Keras's): ") and way in line, line


@pytest.mark.parametrize("method, keyword, way", [
    ("evaluate", "verbose", "evaluate and predict print nothing"),
    ("evaluate", "return_dict", "returns a dict of its scores already"),
    ("evaluate", "sample_weight", "the loss weighs every row alike"),
    ("predict", "verbose", "evaluate and predict print nothing"),
    ("predict", "steps", "every row of x is scored"),
    ("predict", "callbacks", "callbacks run during fit alone"),
])
def test_a_keras_keyword_of_evaluate_or_predict_names_the_hloforge_way(model, method, keyword, way) -> None:
    args = (X, Y) if method == "evaluate" else (X,)
    line = said(lambda: getattr(model, method)(*args, **{keyword: 0}))
    assert line.startswith(f"{method} takes no keyword {keyword!r} (Keras's): ") and way in line, line


def test_a_typo_is_still_an_unknown_keyword_with_the_close_match(model) -> None:
    line = said(lambda: model.fit(X, Y, epocs=2))
    assert line.startswith("fit takes no keyword 'epocs'; did you mean 'epochs'? expected one of ['batch_size', ")
    assert said(lambda: model.evaluate(X, Y, bach_size=8)).startswith(
        "evaluate takes no keyword 'bach_size'; did you mean 'batch_size'?")
    assert said(lambda: model.save("x", overwite=True)).startswith(
        "save takes no keyword 'overwite'; did you mean 'overwrite'?")
    assert said(lambda: model.predict(X, zzz=1)).startswith("predict takes no keyword 'zzz'; expected one of [")


def test_model_names_a_keras_keyword_and_a_typos_close_match() -> None:
    assert said(lambda: hf.Model("mnist-linear", metrics=["accuracy"])) == (
        "Model takes no keyword 'metrics' (Keras's): evaluate returns the task's own scores (a classifier's top1, "
        "top5 and loss)")
    assert said(lambda: hf.Model("mnist-linear", dropuot=0.1)).endswith("; did you mean 'dropout'?")
    assert "(verbose: give it to fit)" in said(lambda: hf.Model("mnist-linear", verbose=True))


def test_a_keras_callback_names_hloforges_own_of_that_name(model) -> None:
    early = type("EarlyStopping", (), {"__module__": "keras.src.callbacks.early_stopping"})
    assert said(lambda: model.fit(X, Y, callbacks=[early()])) == (
        "callbacks must be hloforge Callback instances, got EarlyStopping from keras; hloforge's own is "
        "hf.callbacks.EarlyStopping")


def test_fits_arguments_after_x_and_y_are_keywords(model) -> None:
    """Before: Keras's fit(x, y, batch_size, epochs) order, fit(x, y, 16, 2), trained 16 epochs at batch 2."""
    assert said(lambda: model.fit(X, Y, 16, 2)) == (
        "fit takes at most 2 arguments by position (x, y), got 4; pass the others by keyword (epochs=, "
        "batch_size=, validation_data=, callbacks=, shuffle=, drop_last=, verbose=, data=, data_options=)")
    assert model.history == []  # nothing trained


@pytest.mark.parametrize("kw, line", [
    ({"loss": "sparse_categorical_crossentropy"}, "unknown loss 'sparse_categorical_crossentropy'; registered: "),
    ({"optimizer": "Adam_W"}, "unknown optimizer 'Adam_W'; registered: "),
])
def test_an_unknown_name_with_an_underscore_is_said_unknown(kw, line) -> None:
    """Before: 'loss name 'sparse_categorical_crossentropy' cannot appear in a variant slug: expected a letter then
    letters and digits', a rule of the run's slug, where the name is registered nowhere."""
    from hloforge.core.errors import PluginError

    with pytest.raises(PluginError) as e:
        hf.Model("mnist-linear", **kw)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


@pytest.mark.parametrize("name, ours", [
    ("sparse_categorical_crossentropy", "crossEntropy"), ("CategoricalCrossentropy", "crossEntropy"),
    ("CrossEntropyLoss", "crossEntropy"), ("binary_crossentropy", "bce"), ("MeanSquaredError", "mse")])
def test_another_frameworks_loss_name_names_hloforges_own(name, ours) -> None:
    """Before: 'did you mean 'focalCrossEntropy'?' for Keras's sparse_categorical_crossentropy: the closest spelling,
    a different loss that trains plausibly (and wrongly) if taken."""
    from hloforge.core.errors import PluginError

    with pytest.raises(PluginError) as e:
        hf.Model("mnist-linear", loss=name)
    assert str(e.value).endswith(f"; {name!r} is loss {ours!r} here"), str(e.value)


@pytest.mark.parametrize("call, line", [
    (lambda m: m(X), "hf.Model is not called as a Keras or PyTorch model is: model.predict(x) gives the eval-mode "
                     "logits, model.evaluate(x, y) the scores, model.fit(x, y) trains"),
    (lambda m: m.compile(optimizer="adam"), "hf.Model has no compile() (Keras's or PyTorch's): hf.Model takes the "
                                            "optimizer, lr and loss itself: "),
    (lambda m: m.state_dict(), "hf.Model has no state_dict() (Keras's or PyTorch's): model.params and model.state "),
    (lambda m: m.eval(), "hf.Model has no eval() (Keras's or PyTorch's): predict and evaluate run the eval forward"),
    (lambda m: m.to("cuda"), "hf.Model has no to() (Keras's or PyTorch's): the backend runs it"),
])
def test_another_frameworks_model_method_names_the_way_here(model, call, line) -> None:
    """Before: TypeError: 'Model' object is not callable; AttributeError: 'Model' object has no attribute 'compile'."""
    assert said(lambda: call(model)).startswith(line)


def test_missing_attributes_stay_attribute_errors(model) -> None:
    assert not hasattr(model, "compile") and getattr(model, "state_dict", None) is None
    with pytest.raises(AttributeError, match="'Model' object has no attribute 'paramz'"):
        model.paramz  # noqa: B018


def test_an_iterable_of_batches_to_evaluate_or_predict_says_fit_alone_reads_them(model) -> None:
    """Before: 'evaluate x is a DataLoader, expected an array with one row per example', nothing on why fit took it."""
    for call, what in ((lambda: model.evaluate(iter([(X, Y)])), "evaluate"),
                       (lambda: model.predict(iter([X])), "predict")):
        with pytest.raises(DataError) as e:
            call()
        assert str(e.value) == (f"{what} x is a list_iterator, expected an array with one row per example (an "
                                "iterable, of batches? fit alone reads batches: np.concatenate their rows here)")


def test_validation_data_that_is_no_pair_says_what_it_is(model) -> None:
    """Before: 'validation_data must be a pair (x, y)' for Keras's (x, y, sample_weight) and a DataLoader alike."""
    for v, line in (((X, Y, np.ones(64)), "validation_data is 3 items (Keras's (x, y, sample_weight)? the loss weighs "
                                          "every row alike); expected a pair (x, y) of arrays"),
                    (iter([(X, Y)]), "validation_data is a list_iterator (batches? np.concatenate their x and their "
                                     "y); expected a pair (x, y) of arrays")):
        with pytest.raises(DataError) as e:
            model.fit(X, Y, batch_size=32, validation_data=v, verbose=False)
        assert str(e.value) == line


@pytest.mark.parametrize("level", [2, "auto"])
def test_a_keras_verbose_level_says_what_true_prints(model, level) -> None:
    """Before: 'verbose must be True or False (or 1 or 0), got 2', nothing on Keras's levels."""
    assert said(lambda: model.fit(X, Y, verbose=level)) == (
        f"verbose must be True or False (or 1 or 0), got {level!r} (Keras's verbose levels are not hloforge's: True "
        "prints the progress and each epoch's line)")


def test_a_histories_keras_metric_name_or_typo_is_one_line_and_history_history_reads_it() -> None:
    """Before: KeyError: 'val_accuracy' (a raw traceback naming nothing held) and AttributeError: 'History' object
    has no attribute 'history', Keras's hist.history['loss']."""
    m = hf.Model("mnist-linear")
    m.fit(X, Y, batch_size=32, verbose=False)
    h = m.fit(X, Y, batch_size=32, epochs=2, validation_data=(X, Y), verbose=False)
    for key, hint in (("val_accuracy", " (Keras's val_accuracy is 'val_top1' here)"),
                      ("accuracy", " (Keras's accuracy is 'top1' here)"), ("val_lose", " (did you mean 'val_loss'?)")):
        with pytest.raises(KeyError) as e:
            h[key]
        assert isinstance(e.value, DataError)
        assert str(e.value).startswith(f"history has no metric {key!r}{hint}; it holds ['epoch', 'step', 'loss', ")
    assert h.history["val_top1"] == h["val_top1"] and len(h.history["loss"]) == 2
    with pytest.raises(KeyError) as e:  # the model's history: a first fit without validation_data, then one with
        m.history["val_top1"]
    assert str(e.value) == ("history holds 'val_top1' in 2 of its 3 epochs (those of a fit that scored it); "
                            "history.history['val_top1'] reads it with None for the others")
    assert m.history.history["val_top1"] == [None, *h["val_top1"]]


@pytest.mark.parametrize("name", ["w.safetensors", "model.keras", "net.pt"])
def test_save_to_a_file_name_says_a_save_is_a_directory(model, tmp_path, name) -> None:
    """Before: `save("w.safetensors")` made a directory of that name, where Keras's save("x.keras") writes a file."""
    path = tmp_path / name
    line = said(lambda: model.save(path))
    stem = str(path).rsplit(".", 1)[0]
    assert line.startswith(f"save to {path} names a .{name.rsplit('.', 1)[1]} file, but a save is a run directory")
    assert f"hf.load(DIR) reads back; give a directory path, e.g. {stem!r}" in line, line
    assert not path.exists()
    with pytest.raises(UnsupportedSpec, match=f"ModelCheckpoint path {path} names a"):
        hf.ModelCheckpoint(path, monitor="loss")


def test_a_directory_an_earlier_save_named_as_a_file_is_still_saved_to_and_loaded(model, tmp_path) -> None:
    path = tmp_path / "w.safetensors"
    path.mkdir()  # as a save before the refusal made it
    assert model.save(path, overwrite=True) == str(path)
    assert np.array_equal(hf.load(path).params["0.w"], model.params["0.w"])
