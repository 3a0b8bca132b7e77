"""The `hloforge` command: plugins, render, train, and one-line errors with exit code 2."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hloforge.backends.xla import default_client
from hloforge.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hloforge-groupnorm"
BUILTINS = {
    "layer": {"dense", "conv2d", "flatten", "maxPool", "globalAvgPool", "relu", "relu6", "gelu", "swish",
              "sigmoid", "hSwish", "hSigmoid", "identity"},
    "loss": {"crossEntropy", "mse"},
    "optimizer": {"sgd", "momentum", "adam", "adamw"},
    "backend": {"xla"},
    "dataset": {"digits"},
}


@pytest.mark.parametrize("third_party", [False, True])
def test_plugins_lists_every_builtin_from_hloforge(capsys, monkeypatch, third_party):
    if third_party:  # the example plugin installed beside hloforge (tox's plugin env, .ci/run): listed too
        from hloforge.core import registry

        reg = registry.default_registry()
        if "groupNorm" not in {e.name for e in reg.entries()}:  # not installed here: registered as if it were
            monkeypatch.syspath_prepend(str(EXAMPLE))
            layers = importlib.import_module("hloforge_groupnorm.layers")
            reg = registry.Registry(extra_plugins=((layers, "hloforge-groupnorm"),))
        monkeypatch.setattr(registry, "default_registry", lambda: reg)
    assert main(["plugins"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    listed: dict[str, dict[str, str]] = {}
    for kind, name, dist in rows:
        listed.setdefault(kind, {})[name] = dist
    for kind, names in BUILTINS.items():
        got = listed.get(kind, {})
        assert names <= set(got), f"missing {kind}s: {names - set(got)}"
        assert {got[n] for n in names} == {"hloforge"}, f"{kind}s not from hloforge: {got}"
    if third_party:
        assert listed["layer"]["groupNorm"] == "hloforge-groupnorm"


def test_render_writes_three_files_that_compile_and_run(tmp_path, capsys):
    assert main(["render", "mnist-mlp", "--out", str(tmp_path), "--batch", "8", "--optimizer", "sgd"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["mnist_mlp_fwd.mlir", "mnist_mlp_fwd_eval.mlir", "mnist_mlp_sgd_train_step.mlir"]
    for name in names:
        text = (tmp_path / name).read_text()
        exe = default_client().compile(text)  # XLA parses and compiles each one
        assert exe.num_outputs >= 1
        exe.close()


def test_render_from_a_toml_spec(tmp_path, capsys):
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "Tiny Net"\ninput_shape = [1, 8, 8]\nnum_classes = 3\n\n'
                    '[[layers]]\nkind = "conv2d"\nout = 4\nact = "relu"\n\n[[layers]]\nkind = "globalAvgPool"\n\n'
                    '[[layers]]\nkind = "dense"\nunits = 3\n')
    assert main(["render", str(spec), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "tiny_net_adam_train_step.mlir").exists()


@pytest.mark.parametrize("argv,needle", [
    (["render", "nope", "--out", "x"], "unknown net 'nope'"),
    (["render", "mnist-mlp", "--out", "x", "--optimizer", "adagrad"], "unknown optimizer 'adagrad'; registered:"),
    (["render", "mnist-mlp", "--out", "x", "--loss", "mse", "--label-smoothing", "0.1"], "label_smoothing"),
    (["train", "--data", "imagenet"], "unknown dataset 'imagenet'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_shape_mismatch_names_the_layer(tmp_path, capsys):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"name": "bad", "input_shape": [1, 8, 8], "num_classes": 10,
                                "layers": [{"kind": "conv2d", "out": 4}, {"kind": "dense", "units": 10}]}))
    assert main(["render", str(spec), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "layer 1 (dense(" in err and "flatten" in err


def test_train_default_job_learns_digits(tmp_path, backend):
    """The README's main job, as a user runs it (a subprocess), shortened to 2 epochs; run twice,
    the second run takes a new run directory instead of refusing or overwriting."""
    argv = [sys.executable, "-m", "hloforge.cli", "train", "--epochs", "2"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"backend {backend} (" in r.stdout  # $HLOFORGE_BACKEND reaches the command
    last = [line for line in r.stdout.splitlines() if line.startswith("epoch 2/2")][0]
    top1 = float(last.split("top-1 ")[1].split("%")[0])
    assert top1 > 90.0, r.stdout
    r2 = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r2.returncode == 0 and f"run dir runs/mnist_mlp_adam_{backend}_2" in r2.stdout, r2.stderr


def test_classes_and_input_reshape_a_zoo_net(tmp_path, capsys):
    assert main(["render", "resnet18", "--classes", "10", "--input", "3,32,32", "--out", str(tmp_path)]) == 0
    assert "11,181,642 params" in capsys.readouterr().err  # 11,689,512 − 513·1000 + 513·10
    assert "tensor<128x3x32x32xf32>" in (tmp_path / "resnet18_fwd.mlir").read_text()
    with pytest.raises(SystemExit):  # argparse: exit 2 with the usage line
        main(["render", "resnet18", "--input", "3,x", "--out", str(tmp_path)])
    assert "expected a shape like 3,32,32" in capsys.readouterr().err
