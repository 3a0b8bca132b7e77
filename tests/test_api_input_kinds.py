"""The kind of input a Model was fit on (integer pixels or real numbers), kept and saved with it so x of
the other kind is refused rather than scored; the hints for x with its channels last and for a weights
file's names given to `model.params`; and `--init` of an .npz, a PyTorch pickle or a wrapped model's
prefixed file (the own-data fuzz's findings 6, 8, 11 and 12)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import hloforge as hf
from hloforge.cli import EXIT_BAD_INPUT, main
from hloforge.core.errors import DataError, HloforgeWarning
from hloforge.train import arraydata, finetune
from hloforge.train.config import CHECKPOINT
from hloforge.train.trainer import Run, TrainConfig
from hloforge.zoo import get_net

Dense = hf.layers.Dense


def tiny_net(inputs: int = 4) -> hf.NetSpec:
    return hf.NetSpec("kinds-tiny", (inputs,), [Dense(8, act="relu"), Dense(3)], 3)


def standardised(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def pixels(n: int = 64) -> np.ndarray:
    x = np.random.default_rng(1).integers(0, 256, (n, 4)).astype(np.uint8)
    x[0, :2] = 0, 255  # the whole range, as images have it
    return x


def fitted(x: np.ndarray, y: np.ndarray) -> hf.Model:
    m = hf.Model(tiny_net(), seed=0)
    m.fit(x, y, epochs=1, batch_size=16, verbose=False)
    return m


@pytest.fixture(scope="module")
def on_floats() -> hf.Model:
    return fitted(*standardised())


def one_line(e: pytest.ExceptionInfo[DataError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_uint8_pixels_for_a_model_fit_on_standardised_floats_are_refused_naming_both_kinds(on_floats) -> None:
    x, y = standardised()
    with pytest.raises(DataError) as e:
        on_floats.evaluate(pixels(), y)
    msg = one_line(e)
    lo, hi = float(x.min()), float(x.max())
    assert msg.startswith("evaluate x is uint8 in 0 … 255, but the model was trained on real numbers (float32 in "
                          f"{lo:.3g} … {hi:.3g}); scale x as the training data was"), msg
    with pytest.raises(DataError, match=r"^predict x is int64 in 200 … 200, .*trained on real numbers"):
        on_floats.predict(np.full((3, 4), 200))
    assert on_floats.predict(x[:3].astype(np.float64)).shape == (3, 3)  # floats of any width are floats


def test_a_model_fit_on_integer_pixels_refuses_scaled_floats_and_takes_the_same_pixels_as_floats() -> None:
    _, y = standardised()
    m = fitted(pixels(), y)  # fit on integers trains as before
    xu = pixels()[:5]
    assert np.array_equal(m.predict(xu.astype(np.float32)), m.predict(xu))
    with pytest.raises(DataError) as e:
        m.predict(xu / 255.0)
    msg = one_line(e)
    assert "predict x is float64 in" in msg and "not whole numbers" in msg and "trained on integers (uint8 in" in msg
    assert "as uint8" in msg
    with pytest.raises(DataError, match=r"^validation_data x is float32 in .*, but the model was trained on integers"):
        hf.Model(tiny_net(), seed=0).fit(pixels(), y, epochs=1, batch_size=16, verbose=False,
                                         validation_data=(standardised()[0], y))


def test_a_further_fit_on_x_of_the_other_kind_is_refused_before_a_step() -> None:
    """A fit goes on from the weights so far; pixels for weights trained on standardised floats (or the
    reverse) would undo them without a word."""
    x, y = standardised()
    m = fitted(x, y)
    before = {k: v.copy() for k, v in m.params.items()}
    with pytest.raises(DataError) as e:
        m.fit(pixels(), y, epochs=1, batch_size=16, verbose=False)
    assert one_line(e).startswith("fit x is uint8 in 0 … 255, but the model was trained on real numbers (float32 in")
    assert one_line(e).endswith("or build a new Model to train on x of this kind")
    assert all(np.array_equal(v, m.params[k]) for k, v in before.items())
    m.fit(x * 1.5, y, epochs=1, batch_size=16, verbose=False)  # real numbers again: trains
    on_pixels = fitted(pixels(), y)
    with pytest.raises(DataError, match=r"^fit x is float32 in .*, but the model was trained on integers"):
        on_pixels.fit(x, y, epochs=1, batch_size=16, verbose=False)
    digits = hf.Model(hf.NetSpec("kinds-digits-u8", (784,), [Dense(10)], 10), seed=0)
    rows = np.random.default_rng(2).integers(0, 17, (32, 784)).astype(np.uint8)
    digits.fit(rows, np.arange(32) % 10, epochs=1, batch_size=16, verbose=False)
    with pytest.raises(DataError) as e:
        digits.fit("digits", epochs=1, batch_size=256, verbose=False)
    assert one_line(e) == ("fit on dataset 'digits': its x is real numbers (dataset 'digits', which scales and "
                           "standardises its images), but the model was trained on integers (uint8 in 0 … 16); "
                           "build a new Model to train on it")


def test_the_kind_is_saved_with_the_model_and_one_saved_without_it_is_scored_as_before(on_floats, tmp_path) -> None:
    path = str(tmp_path / "run")
    on_floats.save(path)
    with pytest.raises(DataError, match=r"^predict x is uint8 in 0 … 255, but the model was trained on real"):
        hf.load(path).predict(pixels()[:3])
    file = str(tmp_path / "run" / CHECKPOINT)  # as Model.save wrote it before it kept the record
    with safe_open(file, "np") as f:
        meta = dict(f.metadata())
    assert json.loads(meta.pop("inputs"))["integer"] is False
    save_file(load_file(file), file, metadata=meta)
    assert hf.load(path).predict(pixels()[:3]).shape == (3, 3)
    meta["inputs"] = json.dumps({"integer": "no"})
    save_file(load_file(file), file, metadata=meta)
    with pytest.raises(DataError, match=r"its metadata 'inputs' is .*tampered"):
        hf.load(path)


def test_a_model_fit_on_a_builtin_dataset_counts_as_trained_on_floats() -> None:
    m = hf.Model(hf.NetSpec("kinds-digits", (784,), [Dense(10)], 10), seed=0)
    m.fit("digits", epochs=1, batch_size=256, verbose=False)
    with pytest.raises(DataError) as e:
        m.predict(np.zeros((2, 784), np.uint8))
    assert "trained on real numbers (dataset 'digits', which scales and standardises its images)" in one_line(e)
    raw = np.random.default_rng(0).integers(0, 17, (2, 784)).astype(np.float32)  # sklearn's digits as loaded
    with pytest.raises(DataError, match=r"^predict x holds whole numbers 0 … 16, but the model was trained on real "
                                        r"numbers \(dataset 'digits', .*; scale and standardise x as it does"):
        m.predict(raw)
    m.predict(raw / 16 - 0.5)  # not whole numbers: taken
    assert arraydata.dataset_inputs(arraydata.ARRAYS, m.spec) is None
    assert arraydata.input_kind(np.zeros((1, 16), np.int32), np.zeros((1, 16), np.float32),
                                get_net("tinygpt-nano")) is None  # token ids are ids, whatever their dtype


def test_images_with_their_channels_last_are_refused_with_the_transpose_that_fixes_them() -> None:
    m = hf.Model(hf.NetSpec("kinds-conv", (3, 8, 8), [hf.layers.Conv2d(4), hf.layers.Flatten(), Dense(2)], 2))
    with pytest.raises(DataError) as e:
        m.predict(np.zeros((5, 8, 8, 3), np.float32))
    assert one_line(e) == ("predict x has shape [5, 8, 8, 3], expected [N, 3, 8, 8] (images with their channels "
                           "last; x.transpose(0, 3, 1, 2) puts them first, as the net takes them)")
    with pytest.raises(DataError, match=r"one image with its channels last; x\.transpose\(2, 0, 1\)\[None\]"):
        m.predict(np.zeros((8, 8, 3), np.float32))
    with pytest.raises(DataError, match=r"expected \[N, 3, 8, 8\]$"):  # nothing to suggest: no hint
        m.predict(np.zeros((5, 8, 3, 8), np.float32))


def test_a_weights_files_names_given_to_params_say_how_to_hand_them_over() -> None:
    net = hf.NetSpec("kinds-bn", (4,), [Dense(8), hf.layers.BatchNorm(act="relu"), Dense(3)], 3)
    m = hf.Model(net, seed=0)
    src = hf.Model(net, seed=5)
    file = {**{f"param/{k}": v for k, v in src.params.items()},  # a bare weights / export file's names
            **{k: v + 1 for k, v in src.state.items() if k.startswith("stat/")}}
    with pytest.raises(DataError) as e:
        m.params = file
    msg = one_line(e)
    assert msg.startswith("params: no tensor named 'param/0.b'; the names are ['0.w', ")
    assert "drop it ({k.removeprefix('param/'): v for k, v in d.items() if k.startswith('param/')})" in msg
    assert "stat/… tensors to model.state" in msg
    d = file  # the hint, followed
    m.params = {k.removeprefix('param/'): v for k, v in d.items() if k.startswith('param/')}
    m.state = {k: v for k, v in d.items() if k.startswith("stat/")}
    assert all(np.array_equal(m.params[k], v) for k, v in src.params.items())
    assert np.array_equal(m.state["stat/1.mean"], src.state["stat/1.mean"] + 1)
    with pytest.raises(DataError, match=r"stat/… tensors are BatchNorm statistics: model\.state takes them"):
        m.params = {"stat/1.mean": np.zeros(8)}
    with pytest.raises(DataError, match=r"model\.params takes them without the prefix 'param/'$"):
        m.state = {"param/0.w": np.zeros((4, 8))}


def test_init_of_an_npz_or_a_pytorch_pickle_says_what_it_is_and_what_init_reads(tmp_path, capsys) -> None:
    np.savez(tmp_path / "w.npz", a=np.zeros(3))
    (tmp_path / "w.pth").write_bytes(b"\x80\x02}q\x00.")  # a pickled {} as torch.save's legacy format starts
    for name, said in (("w.npz", "is a NumPy .npz archive; --init reads safetensors files (an hloforge run "
                                 "directory or checkpoint, a weights file of param/… and stat/… tensors, "
                                 "`hloforge import-weights` output)"),
                       ("w.pth", "is a PyTorch pickle; --init reads safetensors files: map a torchvision / timm "
                                 "state dict onto its zoo net with `hloforge import-weights SOURCE")):
        run = tmp_path / f"run-{name}"
        capsys.readouterr()
        assert main(["train", "mnist-mlp", "--init", str(tmp_path / name), "--run-dir", str(run),
                     "--no-progress"]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and not run.exists(), err


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_init_of_a_wrapped_models_prefixed_file_reads_as_the_bare_one(tmp_path, prefix: str) -> None:
    spec = get_net("mnist-mlp")
    w = {f"param/{n}": p + 0.5 for (n, _), p in zip(spec.params(), spec.init_params(4), strict=True)}
    path = str(tmp_path / "wrapped.safetensors")
    save_file({prefix + k: v for k, v in w.items()}, path)
    init = finetune.read_init(Run(TrainConfig(net="mnist-mlp", init=path, seed=2, run_dir=str(tmp_path / "r")),
                                  progress=False), log=print)
    assert all(np.array_equal(p, w[f"param/{n}"]) for (n, _), p in zip(spec.params(), init.params, strict=True))


def test_flat_rows_and_unflattened_images_get_the_reshape_that_fixes_them() -> None:
    flat = hf.Model(hf.NetSpec("kinds-flat", (64,), [Dense(2)], 2))
    with pytest.raises(DataError) as e:
        flat.predict(np.zeros((5, 8, 8), np.float32))
    assert one_line(e) == ("predict x has shape [5, 8, 8], expected [N, 64] (rows of the same size in another "
                           "shape; x.reshape(len(x), 64) gives the net's)")
    image = hf.Model(hf.NetSpec("kinds-image", (1, 8, 8), [hf.layers.Flatten(), Dense(2)], 2))
    with pytest.raises(DataError, match=r"x\.reshape\(len\(x\), 1, 8, 8\) gives the net's\)$"):
        image.predict(np.zeros((5, 64), np.float32))


def test_flat_colour_images_get_both_reshapes_not_one_that_scrambles_hwc_rows() -> None:
    """Before: 'x.reshape(len(x), 3, 4, 4) gives the net's' alone, which reads rows flattened from HWC images
    (PIL's, TensorFlow's) as CHW: every image scrambled, trained on without a word."""
    colour = hf.Model(hf.NetSpec("kinds-colour", (3, 4, 4), [hf.layers.Flatten(), Dense(2)], 2))
    images = np.random.default_rng(0).random((5, 4, 4, 3)).astype(np.float32)  # HWC, as PIL gives them
    with pytest.raises(DataError) as e:
        colour.predict(images.reshape(5, -1))
    assert one_line(e) == ("predict x has shape [5, 48], expected [N, 3, 4, 4] (flat images; x.reshape(len(x), 3, 4, "
                           "4) gives the net's if each row holds its channels one after another (CHW), x.reshape("
                           "len(x), 4, 4, 3).transpose(0, 3, 1, 2) if each pixel's channels side by side (HWC: PIL, "
                           "TensorFlow))")
    x = images.reshape(5, -1)
    assert np.array_equal(x.reshape(len(x), 4, 4, 3).transpose(0, 3, 1, 2), images.transpose(0, 3, 1, 2))


def test_images_without_their_channel_axis_or_of_another_size_get_the_hint_that_fits() -> None:
    m = hf.Model(hf.NetSpec("kinds-grey", (1, 8, 8), [hf.layers.Flatten(), Dense(2)], 2))
    with pytest.raises(DataError) as e:
        m.predict(np.zeros((5, 8, 8), np.float32))  # greyscale images as most loaders give them
    assert one_line(e) == ("predict x has shape [5, 8, 8], expected [N, 1, 8, 8] (rows without the net's leading axis "
                           "of 1; x[:, None] adds it)")
    with pytest.raises(DataError, match=r"\(images with 3 channels; the net takes 1\)$"):
        m.predict(np.zeros((5, 3, 8, 8), np.float32))
    with pytest.raises(DataError, match=r"\(images of 6×6; the net takes 8×8: resize them as it was trained\)$"):
        m.predict(np.zeros((5, 1, 6, 6), np.float32))


def test_x_far_past_the_span_the_model_was_fit_on_is_refused_as_another_scale() -> None:
    x = pixels()
    y = np.random.default_rng(2).integers(0, 3, len(x)).astype(np.int32)
    scaled = fitted(x.astype(np.float32) / 255, y)
    with pytest.raises(DataError) as e:
        scaled.evaluate(x.astype(np.float32), y)  # the test set's / 255 forgotten
    assert one_line(e) == ("evaluate x spans 0 … 255, far past the 0 … 1 of the float32 the model was trained on; "
                           "pass x in the training data's scale (scaled and standardised as it was), or fit the model "
                           "on x of this kind")
    scaled.evaluate(x.astype(np.float32) / 255 * 3 - 1, y)  # other data on the same scale, past its span: scored
    with pytest.raises(DataError, match=r"^predict x spans 0 … 65535, far past the 0 … 255 of the uint8 "):
        fitted(x, y).predict(x.astype(np.uint16) * 257)


def test_batches_of_integer_and_real_x_are_refused_before_a_step() -> None:
    m = hf.Model(tiny_net(), seed=0)
    x, y = standardised(32)
    with pytest.raises(DataError) as e:
        m.fit([(x[:16], y[:16]), (pixels(16), y[16:])], epochs=1, verbose=False)
    assert one_line(e) == ("fit batch 1 has x of uint8 (integers), but batch 0's is float32 (real numbers); expected "
                           "every batch's x of one kind, scaled alike")
    assert m._step == 0


def test_a_model_fit_on_integer_pixels_is_neither_scored_nor_saved_on_a_standardised_dataset(tmp_path) -> None:
    m = hf.Model(hf.NetSpec("kinds-digits8", (784,), [Dense(10)], 10), seed=0)
    rng = np.random.default_rng(0)
    m.fit(rng.integers(0, 256, (64, 784)).astype(np.uint8), rng.integers(0, 10, 64).astype(np.int32), epochs=1,
          batch_size=32, verbose=False)
    with pytest.raises(DataError) as e:
        m.evaluate("digits")
    assert one_line(e).startswith("evaluate on dataset 'digits': its x is real numbers (dataset 'digits', which "
                                  "scales and standardises its images), but the model was trained on integers "
                                  "(uint8 in 0 … 255)")
    with pytest.raises(DataError, match=r"^cannot save \S+ naming dataset 'digits': .*; save it with no dataset"):
        m.save(str(tmp_path / "run"), data="digits")  # `hloforge eval` of it would score the standardised images
    assert not (tmp_path / "run").exists()


def test_hloforge_eval_refuses_an_older_save_of_a_pixel_model_naming_a_standardised_dataset(tmp_path, monkeypatch,
                                                                                             capsys) -> None:
    m = hf.Model(hf.NetSpec("kinds-digits8", (784,), [Dense(10)], 10), seed=0)
    rng = np.random.default_rng(0)
    m.fit(rng.integers(0, 256, (64, 784)).astype(np.uint8), rng.integers(0, 10, 64).astype(np.int32), epochs=1,
          batch_size=32, verbose=False)
    with monkeypatch.context() as old_save:  # as save wrote it before it refused this
        old_save.setattr(arraydata, "check_dataset_kind", lambda *args: None, raising=False)
        m.save(str(tmp_path / "run"), data="digits")
    assert main(["eval", str(tmp_path / "run")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "scoring it on dataset 'digits': its x is real numbers" in err and "trained on integers (uint8" in err
    assert "top-1" not in err


def test_a_first_fit_on_pixels_0_to_255_says_they_train_unscaled() -> None:
    """Before: uint8 pixels trained as they were without a word (mnist-mlp on digits: 95.8% top-1, not 98.6%)."""
    x, y = standardised()
    m = hf.Model(tiny_net(), seed=0)
    with pytest.warns(HloforgeWarning, match=r"^fit x is integers \(uint8 in 0 … 255\), trained on unscaled: .* "
                                             r"x\.astype\(np\.float32\) / 255, then standardised$") as said:
        m.fit(pixels(), y, epochs=1, batch_size=16, verbose=False)
    assert len(said) == 1 and said[0].filename == __file__  # the user's own line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, and never of scaled, standardised, 0/1 or ±1 x
        m.fit(pixels(), y, epochs=1, batch_size=16, verbose=False)
        for scaled in (x, pixels() / np.float32(255), (x > 0).astype(np.float32), np.sign(x).astype(np.int8)):
            hf.Model(tiny_net(), seed=0).fit(scaled, y, epochs=1, batch_size=16, verbose=False)
