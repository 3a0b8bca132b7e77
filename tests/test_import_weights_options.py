"""`hloforge import-weights` (and `hloforge.interop.import_weights`) as a researcher with weights of their own
meets it: options that the output they asked for cannot hold, and the run's dataset they never named. The
state dicts are made without torch (the exporter's own `torch_state_dict` of a zoo net's init)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_image_commands_input import refused  # tests/ is on sys.path (rootdir-relative, no package)

from hloforge.core.errors import UnsupportedSpec
from hloforge.interop import import_weights, torch_state_dict
from hloforge.zoo import get_net

INPUT = (3, 32, 32)


def _weights_file(tmp_path) -> str:
    from safetensors.numpy import save_file

    spec = get_net("resnet18", classes=10, input=INPUT)
    sd = torch_state_dict("torchvision:resnet18", spec, spec.init_params(0), [s.initial() for _, s in spec.stats()])
    file = str(tmp_path / "r18.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, file)
    return file


@pytest.mark.parametrize("flags", [["--data", "digits"], ["--data-opt", "size=32"], ["--data-dir", "d"],
                                   ["--data-file", "f"], ["--backend", "iree"]])
def test_run_options_with_a_bare_weights_out_are_refused_not_dropped(tmp_path, capsys, flags) -> None:
    # Before: written without a word, the dataset, its options or the backend asked for in no file.
    file, out = _weights_file(tmp_path), tmp_path / "w.safetensors"
    err = refused(["import-weights", "torchvision:resnet18", file, "--input", "3,32,32", "--out", str(out), *flags],
                  capsys)
    assert f"{out}: a .safetensors out is the bare weights" in err and flags[0] in err
    assert not out.exists()
    with pytest.raises(UnsupportedSpec, match=r"so data / backend \(--data / --backend\) would be dropped"):
        import_weights("torchvision:resnet18", file, str(out), input=INPUT, data="digits", backend="xla")
    assert not out.exists()


def test_a_run_out_without_data_says_the_dataset_is_trains_default(tmp_path, capsys) -> None:
    # Before: "dataset 'digits' gives inputs of shape [1, 28, 28], but net 'resnet18' expects [3, 32, 32]",
    # a dataset the user never named, with no word of --data or of the weights-alone out.
    file, out = _weights_file(tmp_path), tmp_path / "run"
    err = refused(["import-weights", "torchvision:resnet18", file, "--input", "3,32,32", "--out", str(out)], capsys)
    assert err.startswith("hloforge: error: dataset 'digits' gives inputs of shape [1, 28, 28]")
    assert "no --data was given ('digits' is train's default)" in err and "--out FILE.safetensors" in err
    assert not out.exists()


def test_paths_as_pathlib_are_taken(tmp_path) -> None:
    # Before: AttributeError ('PosixPath' object has no attribute 'endswith'), where save, hf.load and export_run
    # take them.
    from safetensors.numpy import load_file

    from hloforge.interop import read_state_dict

    file, out = tmp_path / "r18.safetensors", tmp_path / "w.safetensors"
    _weights_file(tmp_path)
    assert import_weights("torchvision:resnet18", file, out, input=INPUT, log=lambda s: None) == str(out)
    assert any(k.startswith("param/") for k in load_file(str(out)))
    assert read_state_dict(file).keys() == read_state_dict(str(file)).keys()
    with pytest.raises(UnsupportedSpec, match=r"import_weights out takes a path \(a non-empty str or os.PathLike\)"):
        import_weights("torchvision:resnet18", file, 3, input=INPUT)


def test_data_options_as_model_fit_takes_them_or_a_str_is_one_line(tmp_path) -> None:
    # Before: a dict (Model.fit's form) was refused as "data option 'size' is not KEY=VALUE", and a str read
    # character by character ("data option 's' is not KEY=VALUE").
    from hloforge.train.config import CONFIG

    file = _weights_file(tmp_path)
    out = import_weights("torchvision:resnet18", file, str(tmp_path / "run"), input=INPUT, data="digits",
                         data_options={"size": 32, "channels": 3}, log=lambda s: None)
    assert 'data_options = ["size=32", "channels=3"]' in (tmp_path / "run" / CONFIG).read_text()
    assert out == str(tmp_path / "run")
    with pytest.raises(UnsupportedSpec, match=r"import_weights data_options is a str \('size=32'\); expected a "
                                              r"mapping of option names to values"):
        import_weights("torchvision:resnet18", file, str(tmp_path / "run2"), input=INPUT, data="digits",
                       data_options="size=32")
    assert not (tmp_path / "run2").exists()


@pytest.mark.parametrize("given", [32, "3,32,32"])
def test_an_input_that_is_no_shape_is_one_line(tmp_path, given) -> None:
    # Before: 32 was a TypeError ('int' object is not iterable), "3,32,32" a list of its characters.
    with pytest.raises(UnsupportedSpec, match=r"import_weights input is .*; expected the net's input shape without "
                                              r"the batch, a sequence of positive integers such as \(3, 64, 64\)$"):
        import_weights("torchvision:resnet18", _weights_file(tmp_path), str(tmp_path / "w.safetensors"), input=given)


def test_a_safetensors_suffix_in_another_case_is_a_weights_file(tmp_path, capsys) -> None:
    # Before: --out W.SafeTensors was taken as a run directory (refused for want of --data, or written as one),
    # and a state dict R18.SAFETENSORS refused as "expected a .safetensors file, or .pth/...".
    from safetensors.numpy import load_file

    from hloforge.cli import main

    file = tmp_path / "R18.SAFETENSORS"
    os.rename(_weights_file(tmp_path), file)
    out = tmp_path / "W.SafeTensors"
    assert import_weights("torchvision:resnet18", str(file), str(out), input=INPUT, log=lambda s: None) == str(out)
    assert out.is_file() and any(k.startswith("param/") for k in load_file(str(out)))
    out = tmp_path / "cli.SAFETENSORS"
    assert main(["import-weights", "torchvision:resnet18", str(file), "--input", "3,32,32", "--out", str(out)]) == 0
    assert out.is_file() and capsys.readouterr().out.rstrip().endswith(f"-> {out}")
    err = refused(["import-weights", "torchvision:resnet18", str(file), "--input", "3,32,32", "--out",
                   str(tmp_path / "x.SafeTensors"), "--data", "digits"], capsys)
    assert "a .safetensors out is the bare weights" in err


@pytest.mark.parametrize("name,wrap", [("model_best.pth.tar", lambda sd: {"epoch": 3, "state_dict": sd}),
                                       ("last.ckpt", lambda sd: {"state_dict": {f"model.{k}": v for k, v in
                                                                                sd.items()}})])
def test_a_training_scripts_checkpoint_file_name_is_read(tmp_path, name, wrap) -> None:
    # timm's train.py writes model_best.pth.tar, Lightning last.ckpt: both torch.save files, refused before by
    # their suffix ("expected a .safetensors file, or .pth/.pt/.bin").
    torch = pytest.importorskip("torch", reason="reading a torch.save file needs torch")
    from safetensors.numpy import load_file

    from hloforge.interop import read_state_dict

    file = _weights_file(tmp_path)
    sd = {k: torch.from_numpy(v) for k, v in read_state_dict(file).items()}
    path = str(tmp_path / name)
    torch.save(wrap(sd), path)
    out = str(tmp_path / f"{name}.safetensors")
    import_weights("torchvision:resnet18", path, out, input=INPUT, log=lambda s: None)
    want = str(tmp_path / "want.safetensors")
    import_weights("torchvision:resnet18", file, want, input=INPUT, log=lambda s: None)
    got, ref = load_file(out), load_file(want)
    assert got.keys() == ref.keys() and all(np.array_equal(got[k], ref[k]) for k in ref)


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling would create the marker file


def test_a_checkpoint_with_its_scripts_args_and_numpy_scalars_is_read_and_code_still_refused(tmp_path) -> None:
    # timm's train.py saves `args` (an argparse.Namespace), many scripts a best accuracy as np.float64: before,
    # such a file was refused whole ("it builds a argparse.Namespace: a whole model saved with torch.save(model)?").
    import argparse

    torch = pytest.importorskip("torch", reason="reading a torch.save file needs torch")
    from hloforge.core.errors import DataError
    from hloforge.interop import read_state_dict

    file = _weights_file(tmp_path)
    sd = {k: torch.from_numpy(v) for k, v in read_state_dict(file).items()}
    path = str(tmp_path / "model_best.pth.tar")
    torch.save({"epoch": 3, "state_dict": sd, "args": argparse.Namespace(model="resnet18", lr=0.1),
                "best_acc": np.float64(0.9), "seen": np.int64(5)}, path)
    got = read_state_dict(path)
    assert got.keys() == sd.keys() and all(np.array_equal(got[k], sd[k].numpy()) for k in sd)
    marker = tmp_path / "ran"
    evil = str(tmp_path / "evil.pth")
    torch.save({"state_dict": sd, "args": argparse.Namespace(hook=_RunsCode(str(marker)))}, evil)
    with pytest.raises(DataError, match="refused, its pickle would run code"):
        read_state_dict(evil)
    assert not marker.exists()


class HyperParameters(dict):
    """A training framework's config object, as Lightning's hyper_parameters (an AttributeDict) is."""


def test_an_object_beside_the_weights_is_not_called_a_whole_model(tmp_path) -> None:
    # Before: "it builds a …HyperParameters: a whole model saved with torch.save(model)? save its state_dict()
    # instead", of a checkpoint that holds the state dict, beside its script's config object.
    torch = pytest.importorskip("torch", reason="reading a torch.save file needs torch")
    from hloforge.core.errors import DataError
    from hloforge.interop import read_state_dict

    sd = {k: torch.from_numpy(v) for k, v in read_state_dict(_weights_file(tmp_path)).items()}
    path = str(tmp_path / "last.ckpt")
    torch.save({"state_dict": sd, "hyper_parameters": HyperParameters(lr=0.1)}, path)
    with pytest.raises(DataError) as e:
        read_state_dict(path)
    text = str(e.value)
    assert "HyperParameters: a whole model saved with torch.save(model), or an object a training script saved " \
           "beside the weights (its config)? save the state dict alone" in text and len(text.splitlines()) == 1


def test_a_run_directory_on_data_elsewhere_takes_train_s_data_dir(tmp_path, capsys) -> None:
    """Before: `import-weights ... --data cifar10 --data-dir DIR`, as train and eval name a dataset's folder, was
    a usage error (unrecognized arguments: --data-dir), and only `--data-opt data_dir=DIR` reached it."""
    from test_datasets_formats import write_cifar

    from hloforge.cli import main

    data = tmp_path / "cifar"
    data.mkdir()
    write_cifar(data, n_per_file=16)  # 80 training rows: more than the run's batch of 64
    out = tmp_path / "run"
    assert main(["import-weights", "torchvision:resnet18", _weights_file(tmp_path), "--input", "3,32,32", "--out",
                 str(out), "--data", "cifar10", "--data-dir", str(data)]) == 0
    assert f'data_dir = "{data}"' in (out / "config.toml").read_text()
    capsys.readouterr()
    assert main(["eval", str(out)]) == 0
    assert "resnet18 epoch 0 (live)" in capsys.readouterr().out


def test_the_fine_tune_advice_is_a_command_that_runs(tmp_path, capsys) -> None:
    """An ImageNet head imported as a run on the digits is refused, advising the bare weights and `train --init`.
    Before, the advice was `hloforge train resnet18 --init FILE.safetensors --data digits`, which train refused in
    turn (its 1000-class head, its 3×224×224 input) and which dropped the data options given; now it carries the
    class count, the input and the data flags, as the worked example in docs/interop.md runs them."""
    from safetensors.numpy import save_file

    from hloforge.cli import main

    spec = get_net("resnet18", input=INPUT)  # 1000 classes
    sd = torch_state_dict("torchvision:resnet18", spec, spec.init_params(0), [s.initial() for _, s in spec.stats()])
    file = str(tmp_path / "in1k.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, file)
    capsys.readouterr()
    assert main(["import-weights", "torchvision:resnet18", file, "--input", "3,32,32", "--out", str(tmp_path / "r"),
                 "--data", "digits", "--data-opt", "size=32", "--data-opt", "channels=3"]) == 3
    assert ("`hloforge train resnet18 --init FILE.safetensors --classes 10 --input 3,32,32 --data digits --data-opt "
            "size=32 --data-opt channels=3` re-initialises the head") in capsys.readouterr().err


def test_interop_doc_table_lists_every_source():
    """docs/interop.md's SOURCE table is the sources import-weights maps (hloforge.interop.torch_names.SOURCES): a
    family added without a row, or a row left after one goes, fails here."""
    import re

    from hloforge.interop.torch_names import SOURCES

    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "interop.md"), encoding="utf-8").read()
    listed = set()
    for row in text.split("| SOURCE | zoo net |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]:
        prefix = ""
        for token in re.findall(r"`([\w:]+)`", row.split("|")[1]):
            prefix, name = token.split(":") if ":" in token else (prefix, token)
            listed.add(f"{prefix}:{name}")
    assert listed == set(SOURCES)
