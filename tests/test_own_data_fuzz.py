"""A user's own weights files: bfloat16 / float16 / float64 tensors, a DataParallel's `module.` prefix,
and an `--init` file of another class count that does not say its count (the findings of the own-data
fuzz: each once a traceback, a refusal with no way forward, or a refusal of a file that is fine)."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hloforge.cli import EXIT_BAD_INPUT, EXIT_OK, main
from hloforge.core.errors import DataError
from hloforge.interop import read_state_dict, torch_state_dict
from hloforge.train import finetune
from hloforge.train.trainer import Run, TrainConfig
from hloforge.zoo import get_net

R18 = "torchvision:resnet18"
INPUT = (3, 32, 32)


def _r18_state_dict() -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    spec = get_net("resnet18", input=INPUT)
    params = spec.init_params(1)
    sd = torch_state_dict(R18, spec, params, [s.initial() + 0.25 for _, s in spec.stats()])
    return sd, params


def _imported(tmp_path, name: str, sd: dict[str, np.ndarray], capsys) -> dict[str, np.ndarray]:
    src, out = str(tmp_path / f"{name}.safetensors"), str(tmp_path / f"{name}-zoo.safetensors")
    save_file(sd, src)
    capsys.readouterr()
    code = main(["import-weights", R18, src, "--input", ",".join(map(str, INPUT)), "--out", out])
    err = capsys.readouterr().err
    assert code == EXIT_OK, err
    return load_file(out)


def test_bfloat16_weights_import_as_float32_instead_of_an_internal_error(tmp_path, capsys) -> None:
    sd, _ = _r18_state_dict()
    half = {k: (v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 else v) for k, v in sd.items()}
    save_file(half, str(tmp_path / "bf16.safetensors"))
    out = str(tmp_path / "bf16-zoo.safetensors")
    # a fresh process: this one imported ml_dtypes above, which hides the crash of one that did not
    r = subprocess.run([sys.executable, "-m", "hloforge.cli", "import-weights", R18, str(tmp_path / "bf16.safetensors"),
                        "--input", ",".join(map(str, INPUT)), "--out", out], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == EXIT_OK, r.stderr
    want = _imported(tmp_path, "f32", {k: (v.astype(ml_dtypes.bfloat16).astype(np.float32) if v.dtype == np.float32
                                           else v) for k, v in sd.items()}, capsys)
    got = load_file(out)
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    assert {a.dtype for a in got.values()} == {np.dtype(np.float32)}


def test_a_pickled_bfloat16_state_dict_reads_as_float32(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "w.pth")
    torch.save({"a": torch.tensor([1.5, -2.0]).bfloat16(), "n": torch.tensor(3)}, path)
    got = read_state_dict(path)
    assert got["a"].dtype == np.float32 and got["a"].tolist() == [1.5, -2.0] and int(got["n"]) == 3


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_a_wrapped_models_prefixed_state_dict_imports_as_the_bare_one(tmp_path, capsys, prefix: str) -> None:
    sd, _ = _r18_state_dict()
    got = _imported(tmp_path, "wrapped", {prefix + k: v for k, v in sd.items()}, capsys)
    want = _imported(tmp_path, "bare", sd, capsys)
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def _mlp_weights(classes: int = 10) -> dict[str, np.ndarray]:
    spec = get_net("mnist-mlp")
    w = {f"param/{n}": p + 0.5 for (n, _), p in zip(spec.params(), spec.init_params(4), strict=True)}
    if classes != 10:  # another head: a [512, classes] kernel and a [classes] bias
        w["param/2.w"] = np.ones((512, classes), np.float32)
        w["param/2.b"] = np.ones((classes,), np.float32)
    return w


def _read_init(tmp_path, w: dict[str, np.ndarray]) -> finetune.Init:
    path = str(tmp_path / "mine.safetensors")
    save_file(w, path)  # a file of the user's own: no metadata, no manifest beside it
    return finetune.read_init(Run(TrainConfig(net="mnist-mlp", init=path, seed=2, run_dir=str(tmp_path / "r")),
                                  progress=False), log=print)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_init_reads_half_bfloat16_and_double_weights_as_float32(tmp_path, dtype) -> None:
    w = _mlp_weights()
    init = _read_init(tmp_path, {k: v.astype(dtype) for k, v in w.items()})
    names = [n for n, _ in get_net("mnist-mlp").params()]
    for n, p in zip(names, init.params, strict=True):
        assert p.dtype == np.float32 and np.array_equal(p, w[f"param/{n}"].astype(dtype).astype(np.float32))


def test_init_of_an_own_file_with_another_class_count_reinitialises_the_head(tmp_path, capsys) -> None:
    w = _mlp_weights(classes=7)
    capsys.readouterr()
    init = _read_init(tmp_path, w)
    assert "7 classes there, 10 here: head ['2.w', '2.b'] re-initialised" in capsys.readouterr().out
    fresh = get_net("mnist-mlp").init_params(2)
    assert np.array_equal(init.params[0], w["param/0.w"]) and np.array_equal(init.params[-2], fresh[-2])
    assert init.reinit == ("param/2.w", "param/2.b")


def test_a_head_that_is_not_another_class_count_is_still_refused_in_one_line(tmp_path, capsys) -> None:
    w = _mlp_weights()
    w["param/2.w"] = np.ones((256, 10), np.float32)  # another fan-in: not a class count
    with pytest.raises(DataError) as e:
        _read_init(tmp_path, w)
    msg = str(e.value)
    assert "\n" not in msg and "None" not in msg and "param/2.w is float32 [256, 10], expected float32 [512, 10]" in msg
    save_file(w, str(tmp_path / "cli.safetensors"))
    assert main(["train", "mnist-mlp", "--init", str(tmp_path / "cli.safetensors"), "--run-dir",
                 str(tmp_path / "run"), "--no-progress"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[256, 10]" in err and not (tmp_path / "run").exists()


def _prepared(tmp_path, capsys) -> tuple[str, str]:
    """A 2-class JPEG tree prepared at 12² / 8² (not the dataset's 10 classes at 256² / 224²); prepare's output."""
    from PIL import Image

    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (tmp_path / "src" / split / c).mkdir(parents=True)
            Image.new("RGB", (20, 16), (200, 30, 30)).save(tmp_path / "src" / split / c / "a.jpg")
    out = str(tmp_path / "out")
    capsys.readouterr()
    assert main(["prepare", "imagenette", str(tmp_path / "src"), out, "--train-size", "12", "--val-size", "8"]) == 0
    return out, capsys.readouterr().out


def test_prepare_names_the_data_options_its_files_need(tmp_path, capsys) -> None:
    out, said = _prepared(tmp_path, capsys)
    assert f"train on them with: --data imagenette --data-dir {out} --data-opt train_size=12 --data-opt crop=8\n" \
        in said  # the class count the dataset reads from classes.json


@pytest.mark.parametrize("opts, what", [
    ([], "its length fits 8×8 images, not 224×224: prepared at another size? pass --data-opt crop=8"),
    (["--data-opt", "crop=8", "--data-opt", "classes=10"],  # mnist-cnn's 10 classes, else that is refused first
     "its length fits 12×12 images, not 256×256: prepared at another size? pass --data-opt train_size=12"),
])
def test_imagenette_files_of_another_size_name_the_option_that_reads_them(tmp_path, capsys, opts, what) -> None:
    out, _ = _prepared(tmp_path, capsys)
    assert main(["train", "mnist-cnn", "--data", "imagenette", "--data-dir", out, *opts, "--run-dir",
                 str(tmp_path / "run"), "--no-progress"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and what in err


def test_a_whole_pickled_model_is_refused_naming_it_and_the_state_dict_to_save(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "model.pth")
    torch.save(torch.nn.Linear(2, 3), path)  # the model object, not its state_dict()
    with pytest.raises(DataError) as e:
        read_state_dict(path)
    msg = str(e.value)
    assert "\n" not in msg and "\x1b" not in msg and "weights_only" not in msg and "two options" not in msg
    assert "it builds a torch.nn.modules.linear.Linear: a whole model saved with torch.save(model)? save its " \
           "state_dict() instead" in msg
