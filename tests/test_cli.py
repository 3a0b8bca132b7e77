"""The `hloforge` command: plugins, render, train, its help and version, and its exit codes (0 ok,
1 a failed check, 2 usage, 3 bad input in one line, 4 an internal error with its traceback's file)."""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hloforge.backends.xla import default_client
from hloforge.cli import EXIT_CODES, EXIT_OUTPUT_GONE, main, parser
from hloforge.commands import options
from hloforge.core.registry import hloforge_version
from hloforge.core.variant import Variant
from hloforge.train.trainer import TrainConfig
from hloforge.zoo import NETS, get_net

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hloforge-groupnorm"
BUILTINS = {
    "layer": {"dense", "conv2d", "flatten", "maxPool", "globalAvgPool", "relu", "relu6", "gelu", "swish",
              "sigmoid", "hSwish", "hSigmoid", "identity"},
    "loss": {"crossEntropy", "mse"},
    "optimizer": {"sgd", "momentum", "adam", "adamw"},
    "backend": {"xla"},
    "dataset": {"digits"},
    "callback": {"early_stopping", "model_checkpoint", "csv_logger", "tensorboard"},
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
        monkeypatch.setattr(registry, "default_registry", functools.cache(lambda: reg))  # as cached as the real one
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
    assert names == ["manifest.json", "mnist_mlp_fwd.mlir", "mnist_mlp_fwd_eval.mlir", "mnist_mlp_sgd_train_step.mlir"]
    for name in names[1:]:
        text = (tmp_path / name).read_text()
        exe = default_client().compile(text)  # XLA parses and compiles each one
        assert exe.num_outputs >= 1
        exe.close()


def test_render_manifest_names_every_input_and_output_in_order(tmp_path, capsys):
    """manifest.json: each module's inputs and outputs by name (a checkpoint's tensor names), shape and element
    type, each donated input's output, and the train step's schedule scalars; before, the order was prose."""
    assert main(["render", "resnet-mini", "--batch", "4", "--ema", "0.99", "--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "manifest.json").read_text())
    spec = get_net("resnet-mini")
    params, stats = [f"param/{n}" for n, _ in spec.params()], [f"stat/{n}" for n, _ in spec.stats()]
    assert m["format"] == "hloforge-render-1"
    fwd, ev, step = (m["modules"][f"resnet_mini_{f}.mlir"] for f in ("fwd", "fwd_eval", "adam_ema0p99_train_step"))
    assert fwd["net"] == "resnet-mini" and step["batch"] == 4 and step["variant"] == "adam_ema0p99"
    assert fwd["hloforge_version"] == step["hloforge_version"] == hloforge_version()  # the release that rendered it
    assert [i["name"] for i in fwd["inputs"]] == ["x", *params]
    assert [i["name"] for i in ev["inputs"]] == ["x", *params, *stats]
    assert ev["inputs"][0] == {"name": "x", "shape": [4, 1, 28, 28], "dtype": "f32"}
    assert fwd["outputs"] == ev["outputs"] == [{"name": "out", "shape": [4, 10], "dtype": "f32"}]
    state = [f"state/{g}/{p[len('param/'):]}" for g in ("m", "v", "E") for p in params]
    assert [i["name"] for i in step["inputs"]] == [*params, *state, "schedule", "x", "y"]
    assert step["schedule"][:3] == ["lr", "bc1", "bc2"] and "ema_decay" in step["schedule"]
    assert step["inputs"][-3]["shape"] == [len(step["schedule"])] and step["inputs"][-1]["dtype"] == "i32"
    carried = len(params) + len(state)
    assert [o["name"] for o in step["outputs"]] == [*params, *state, "loss", *(f"batch_{s}" for s in stats)]
    for i, arg in enumerate(step["inputs"]):  # θ and the state are donated to their own updated outputs
        assert arg.get("donated_to") == (i if i < carried else None)
        if i < carried:
            assert step["outputs"][i]["shape"] == arg["shape"]
    assert step["outputs"][carried] == {"name": "loss", "shape": [], "dtype": "f32"}
    # another net rendered into the same directory adds its modules to the one manifest
    assert main(["render", "mnist-mlp", "--batch", "4", "--out", str(tmp_path)]) == 0
    listed = json.loads((tmp_path / "manifest.json").read_text())["modules"]
    assert len(listed) == 6 and listed["mnist_mlp_fwd.mlir"]["net"] == "mnist-mlp" and step == \
        listed["resnet_mini_adam_ema0p99_train_step.mlir"]


def test_a_run_checkpoint_drives_the_rendered_train_step_by_the_manifest_names(tmp_path, capsys):
    """The portable artifact: a run's checkpoint tensors fed to the rendered step by name, the schedule packed as
    the manifest lists it, run on the PJRT client; the step's θ′ equals what the session's own step computes."""
    from safetensors.numpy import load_file

    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession, make_backend

    run = tmp_path / "run"
    assert main(["train", "mnist-mlp", "--epochs", "1", "--batch", "32", "--run-dir", str(run), "--no-progress"]) == 0
    assert main(["render", "mnist-mlp", "--batch", "8", "--out", str(tmp_path / "r")]) == 0
    entry = json.loads((tmp_path / "r" / "manifest.json").read_text())["modules"]["mnist_mlp_adam_train_step.mlir"]
    tensors = load_file(str(run / "checkpoint.safetensors"))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 784)).astype(np.float32), rng.integers(0, 10, 8).astype(np.int32)
    lr, t = 1e-3, 5
    feed = {**tensors, "x": x, "y": y,
            "schedule": np.array([lr, 1 - 0.9 ** t, 1 - 0.999 ** t], np.float32)}  # adam: lr, 1−β₁ᵗ, 1−β₂ᵗ
    assert entry["schedule"] == ["lr", "bc1", "bc2"]
    exe = default_client().compile((tmp_path / "r" / "mnist_mlp_adam_train_step.mlir").read_text())
    got = dict(zip([o["name"] for o in entry["outputs"]],
                   [np.asarray(o) for o in exe.run([feed[i["name"]] for i in entry["inputs"]])], strict=True))
    exe.close()
    session = TrainSession(get_net("mnist-mlp"), Variant("adam"), 8, make_backend("xla"))
    held = [tensors[i["name"]] for i in entry["inputs"] if i["name"].startswith(("param/", "state/"))]
    session.load(held[:6], held[6:], t - 1)  # mnist-mlp's 6 θ, then adam's m and v
    loss = session.train_step(x, y, lr)
    assert got["loss"] == pytest.approx(loss, rel=1e-6)
    np.testing.assert_allclose(got["param/0.w"], session.read_params()[0], rtol=1e-6, atol=1e-7)


def test_render_onto_a_full_disk_says_which_file_in_one_line_and_leaves_none_torn(tmp_path):
    """A write limit (RLIMIT_FSIZE; EFBIG, as ENOSPC) the train step's module passes: before, 'hloforge: error: a
    file: file too large', naming none, and the module cut at the limit in --out, read later as a broken module."""
    import resource

    limit = 2000  # mnist-mlp's forward modules fit under it, its train step does not

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "hloforge", "render", "mnist-mlp", "--out", "o"], cwd=tmp_path,
                          capture_output=True, text=True, preexec_fn=capped, timeout=120)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "hloforge: error: could not write module o/mnist_mlp_adam_train_step.mlir: File too large (there was no "
        "module before, the temp file removed); free space and render again")
    written = {p.name: p.stat().st_size for p in (tmp_path / "o").iterdir()}
    assert set(written) == {"mnist_mlp_fwd.mlir", "mnist_mlp_fwd_eval.mlir"} and max(written.values()) < limit


def test_too_many_open_files_says_the_limit_and_what_to_raise(tmp_path, capsys, monkeypatch):
    """The open-file limit reached as --workers starts its producers (ulimit -n 12 does it): before, 'hloforge:
    error: a file: too many open files', as if a file of the user's were at fault."""
    import errno
    import os
    import resource

    from hloforge.datasets import stream

    def no_more(*args, **kwargs):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(stream.subprocess, "Popen", no_more)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "mnist-linear", "--epochs", "1", "--workers", "2", "--run-dir", "r", "--no-progress"]) == 3
    held = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hloforge: error: too many open files: this process may hold {held} at once (ulimit -n); expected a higher "
        "limit (ulimit -n 4096), or fewer files at once (--workers: each producer holds its pipes)")


def test_render_from_a_toml_spec(tmp_path, capsys):
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "Tiny Net"\ninput_shape = [1, 8, 8]\nnum_classes = 3\n\n'
                    '[[layers]]\nkind = "conv2d"\nout = 4\nact = "relu"\n\n[[layers]]\nkind = "globalAvgPool"\n\n'
                    '[[layers]]\nkind = "dense"\nunits = 3\n')
    assert main(["render", str(spec), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "tiny_net_adam_train_step.mlir").exists()


def test_render_of_another_net_whose_file_names_are_the_same_is_refused_not_written_over(tmp_path, capsys):
    """'my-Net ü' and 'my-Net ö' both render to my_net___*.mlir: the second used to replace the first's modules and
    manifest entries without a word. Re-rendering the same net into the same --out still replaces its own."""
    for name, file in (("my-Net ü", "a.toml"), ("my-Net ö", "b.toml")):
        (tmp_path / file).write_text(f'name = "{name}"\ninput_shape = [4]\nnum_classes = 2\n\n'
                                     '[[layers]]\nkind = "dense"\nunits = 2\n', encoding="utf-8")
    out = tmp_path / "o"
    assert main(["render", str(tmp_path / "a.toml"), "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["render", str(tmp_path / "b.toml"), "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert "already holds my_net___fwd.mlir, rendered from net 'my-Net ü'; net 'my-Net ö' renders" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert main(["render", str(tmp_path / "a.toml"), "--out", str(out)]) == 0


@pytest.mark.parametrize("argv,needle", [
    (["render", "nope", "--out", "x"], "unknown net 'nope'"),
    (["render", "mnist-mlp", "--out", "x", "--optimizer", "adagrad"], "unknown optimizer 'adagrad'; registered:"),
    (["render", "mnist-mlp", "--out", "x", "--loss", "mse", "--label-smoothing", "0.1"], "label_smoothing"),
    (["train", "--data", "imagenet"], "unknown dataset 'imagenet'"),
])
def test_bad_input_is_one_line_and_exit_3(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_shape_mismatch_names_the_layer(tmp_path, capsys):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"name": "bad", "input_shape": [1, 8, 8], "num_classes": 10,
                                "layers": [{"kind": "conv2d", "out": 4}, {"kind": "dense", "units": 10}]}))
    assert main(["render", str(spec), "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert "layer 1 (dense(" in err and "flatten" in err
    assert not (tmp_path / "o").exists()  # a refused net writes nothing


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
    assert main(["render", "resnet18", "--input", "3,x", "--out", str(tmp_path)]) == 2  # argparse: usage
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "argument --input: expected a shape like 3,32,32" in err, err


# The loss `train` picks for each zoo family on its own dataset (README), where it is not crossEntropy.
FAMILY_LOSS = {"tinygpt": ("tokenCrossEntropy", "text"), "unet": ("perPixelCE", "shapes"),
               "ddpm": ("mse", "shapes"), "yolov1": ("yolov1", "shapes"), "fpn": ("fpnYolo", "shapes")}


@pytest.mark.parametrize("net", sorted(NETS))
def test_every_zoo_net_renders_with_the_loss_train_picks(net, tmp_path, capsys):
    """render builds the train step with the loss `train` would (tasks.default_loss), not always
    crossEntropy: unet, ddpm-mini and the language models were refused before."""
    loss, data = next((v for k, v in FAMILY_LOSS.items() if net.startswith(k)), ("crossEntropy", "digits"))
    spec = get_net(net)
    assert TrainConfig(net=net, data=data).variant(spec).loss == loss  # what `hloforge train NET --data DATA` uses
    assert main(["render", net, "--out", str(tmp_path), "--batch", "1"]) == 0
    slug = Variant(loss=loss).slug
    assert (tmp_path / f"{spec.ident}_{slug}_train_step.mlir").exists(), sorted(p.name for p in tmp_path.iterdir())
    assert len(list(tmp_path.iterdir())) == 4  # and manifest.json, naming the three
    assert len(json.loads((tmp_path / "manifest.json").read_text())["modules"]) == 3


def test_render_data_picks_the_loss_on_that_dataset(tmp_path, capsys):
    # unet-mini on digits (no masks) has no default loss: the same refusal `train` gives
    assert main(["render", "unet-mini", "--data", "digits", "--out", str(tmp_path / "o")]) == 3
    assert "pass --loss" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["render", "unet-mini", "--data", "shapes", "--out", str(tmp_path / "o"), "--batch", "1"]) == 0


def test_bare_hloforge_prints_help_and_runs_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hloforge.cli"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("usage: hloforge") and "train" in r.stderr and "exit codes:" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no runs/: it used to start the default training run


def test_python_dash_m_hloforge_is_the_command():
    """`python -m hloforge` (a venv whose scripts are not on PATH) was 'No module named hloforge.__main__'."""
    r = subprocess.run([sys.executable, "-m", "hloforge", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"hloforge {importlib.metadata.version('hloforge')}", r.stderr


def test_version_is_the_distribution_metadata(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hloforge {importlib.metadata.version('hloforge')}"


def _parsers(p: argparse.ArgumentParser, path: str = "hloforge"):
    """Every parser under `p` (sub-commands, and prepare's datasets), with its command line."""
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, q in a.choices.items():
                yield from _parsers(q, f"{path} {name}")


def test_every_flag_has_help_and_shows_its_default():
    from hloforge import bench

    checked = 0
    for path, p in [*_parsers(parser()), ("hloforge bench", bench.parser())]:
        fmt = p._get_formatter()
        for a in p._actions:
            if isinstance(a, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction) or \
                    a.help == argparse.SUPPRESS:  # bench's internal child-process flags
                continue
            name = "/".join(a.option_strings) or a.dest
            assert a.help and a.help.strip(), f"{path} {name} has no help text"
            text = fmt._expand_help(a)  # what -h prints for it, the formatter's default included
            takes_value = a.nargs != 0  # a switch (--resume) says what it does, not a default
            optional = bool(a.option_strings) or a.nargs in ("?", "*")
            if takes_value and optional and not a.required:
                assert "default" in text, f"{path} {name}: its help does not show its default: {text!r}"
            if not takes_value and a.default is True:  # on unless turned off (bench --roofline, sample --no-clip)
                assert "default" in text, f"{path} {name}: on by default, and its help does not say so: {text!r}"
            checked += 1
    assert checked > 100  # every subcommand's flags were walked, prepare's datasets' included


def test_a_command_that_writes_a_jpeg_too_does_not_call_its_output_a_png():
    """detect's and sample's one-line help said 'drawn to a PNG' / 'as a PNG grid'; their --out takes .jpg too."""
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    said = {c.dest: c.help for c in sub._choices_actions}
    for name, p in sub.choices.items():
        outs = [a for a in p._actions if "--out" in a.option_strings and a.help == options.IMAGE_OUT_HELP]
        if outs:
            assert "PNG" not in said[name], f"{name}: {said[name]!r}, but --out takes {options.IMAGE_OUT_HELP!r}"


def test_exit_codes_are_documented_in_help_and_readme(capsys):
    assert main(["-h"]) == 0
    out = capsys.readouterr().out
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in EXIT_CODES:
        assert f"\n  {code:<5}" in out, f"hloforge -h does not list exit code {code}"
        assert f"| {code} |" in section, f"README's Exit codes section does not list {code}"


def _boom(args):
    raise RuntimeError("an invariant broke\nsecond line")


def test_an_internal_error_on_a_full_disk_is_still_one_line(tmp_path, capsys, monkeypatch):
    """Neither the cache nor the temp dir could take the traceback file (a full disk, maybe the error's own cause):
    before, the write's OSError came out of the handler as a second, raw traceback; now the line says the
    traceback could not be saved and how to see it, and no empty file is left."""
    import errno
    import os

    def full(fd: int, *args, **kwargs):
        os.close(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HLOFORGE_DEBUG", raising=False)
    monkeypatch.setattr(options, "_plugins", _boom)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(os, "fdopen", full)
    assert main(["plugins"]) == 4
    assert capsys.readouterr().err == (
        "hloforge: internal error: RuntimeError: an invariant broke (a bug; the traceback could not be saved (No "
        "space left on device); run with HLOFORGE_DEBUG=1 to see it)\n")
    assert not list((tmp_path / "cache" / "tracebacks").iterdir()) and sorted(os.listdir(tmp_path)) == ["cache"]


def test_internal_error_is_one_line_naming_the_traceback_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HLOFORGE_DEBUG", raising=False)
    monkeypatch.setattr(options, "_plugins", _boom)
    assert main(["plugins"]) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error: RuntimeError: an invariant broke" in err, err
    path = Path(err.split("the full traceback is in ")[1].split(",")[0])
    assert path.parent == tmp_path / "cache" / "tracebacks"
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "_boom" in text and "second line" in text
    monkeypatch.setenv("HLOFORGE_DEBUG", "1")  # the traceback itself, on stderr
    assert main(["plugins"]) == 4
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "_boom" in err


def test_interrupt_is_one_line_and_exit_130(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(options, "_plugins", interrupted)
    assert main(["plugins"]) == 130
    assert capsys.readouterr().err.strip() == "hloforge: interrupted"


def test_output_piped_into_a_reader_that_went_away_ends_quietly():
    """`hloforge ... | head -1`: head exits after its line. Before, the next write's broken pipe was an error,
    'hloforge: error: a file: broken pipe', exit 3; now nothing is said (nobody reads on) and the exit is
    141, a command that SIGPIPE ended."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader gone before the first line
    try:
        r = subprocess.run([sys.executable, "-m", "hloforge", "plugins"], stdout=write_end, stderr=subprocess.PIPE,
                           text=True, timeout=300)
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (EXIT_OUTPUT_GONE, "")


def test_a_command_started_with_stderr_closed_trains_and_keeps_its_errors_off_stdout(tmp_path):
    """`hloforge train 2>&-` (a daemon's, a cron job's): Python leaves sys.stderr None. Before, the progress bar
    failed writing to it (an internal error after the compile, no epoch trained) and every error line went to
    stdout; now standard error is /dev/null: the run trains, and an error is said nowhere, not on stdout."""
    def without_stderr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", sys.executable, "-m", "hloforge", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    r = without_stderr("train", "mnist-linear", "--epochs", "1", "--run-dir", "run")
    assert r.returncode == 0 and "epoch 1/1" in r.stdout, r.stdout
    r = without_stderr("eval", "no-such-run")
    assert (r.returncode, r.stdout) == (3, "")


def test_a_working_directory_deleted_under_the_shell_is_named(tmp_path):
    """A shell left in a directory that was deleted (a checkout, a build's clean). Before, numpy's loadtxt
    asking for it failed reading the digits, said as 'scikit-learn's digits file ... cannot be read;
    reinstall scikit-learn'; now the working directory is named."""
    r = subprocess.run(["sh", "-c", 'mkdir gone && cd gone && rmdir ../gone && exec "$@"', "sh", sys.executable,
                        "-m", "hloforge", "train", "mnist-linear", "--epochs", "1", "--run-dir", str(tmp_path / "run")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 3 and r.stderr.startswith("hloforge: error: the working directory "), r.stderr
    assert len(r.stderr.splitlines()) == 1 and "gone no longer exists" in r.stderr, r.stderr


def test_a_file_that_cannot_be_written_is_bad_input(tmp_path, capsys):
    (tmp_path / "f").write_text("")  # --out is a file: the directory cannot be made
    assert main(["render", "mnist-linear", "--out", str(tmp_path / "f" / "o"), "--batch", "1"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "f") in err, err


def test_the_readmes_variant_line_runs_as_written(tmp_path):
    """Before: the README's `--accum 4` line was refused (digits' 22 batches an epoch are no multiple of 4)."""
    import shlex

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    line = next(s for s in readme.splitlines() if s.startswith("hloforge train mnist-mlp --optimizer lamb"))
    argv = shlex.split(line.split("#")[0])[1:]
    assert main([*argv, "--epochs", "1", "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0


def test_a_flag_the_command_does_not_take_points_at_that_commands_help(capsys):
    """Before: `hloforge render NET --backend iree` said "(see `hloforge -h`)", a help listing no command's flags."""
    for argv, prog in ((["render", "mnist-mlp", "--out", "d", "--backend", "iree"], "hloforge render"),
                       (["prepare", "imagenette", "a", "b", "--foo"], "hloforge prepare imagenette"),
                       (["--bogus"], "hloforge")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"{prog}: error: unrecognized arguments: ") and err.endswith(f"(see `{prog} -h`)"), err


def test_the_readmes_resume_line_continues_the_first_run_as_written(tmp_path, monkeypatch):
    """The README's walk in order: `hloforge train` (here 1 epoch), then its `--resume` line as written. Before,
    the line was a bare `hloforge train --resume`, refused on the run step 1 had finished ('already finished')."""
    import shlex

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    line = next(s for s in readme.splitlines() if s.startswith("hloforge train --resume"))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--epochs", "1", "--no-progress"]) == 0
    assert main([*shlex.split(line.split("#")[0])[1:], "--no-progress"]) == 0
    assert len(list((tmp_path / "runs").iterdir())) == 1  # continued, not a new run beside it


def test_the_readme_shows_every_command():
    """Before: `hloforge summary` (a net's layers, shapes and parameters) was in `hloforge -h` but nowhere in the
    README's command list, so a newcomer reading it never met it. Each command the parser has is shown there."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("## What you get", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = [c for c in commands if f"\nhloforge {c}" not in block]
    assert not missing, f"commands the README's list does not show: {missing}"


def test_the_readme_names_every_install_extra():
    """Before: the README named the test, mpi and gate extras only, so `pip install .` then its IREE, bench or
    TensorBoard line met a missing package, and the extra that brings it was in pyproject.toml alone."""
    import re
    import tomllib

    root = Path(__file__).parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (root / "README.md").read_text()
    named = {e for group in re.findall(r"(?:hloforge|\.)\[([a-z,]+)\]", readme) for e in group.split(",")}
    assert set(extras) <= named, f"extras the README does not name: {sorted(set(extras) - named)}"


@pytest.mark.parametrize("doc", ["README.md", "docs/api.md", "docs/distributed.md", "docs/interop.md",
                                 "docs/plugins.md", "docs/composition.md"])
def test_every_flag_the_docs_show_is_a_flag_of_its_command(doc: str) -> None:
    """Each `hloforge CMD ... --flag` a doc shows (a command line, in a block or in the text) names a flag CMD's
    parser has (prepare's: its dataset's), so a renamed or removed flag fails here, not in a reader's terminal."""
    import re

    from hloforge import bench

    parsers = {path.removeprefix("hloforge "): p for path, p in _parsers(parser())}
    parsers["bench"] = bench.parser()
    text = (Path(__file__).parents[1] / doc).read_text().replace("\\\n", " ")
    unknown = []
    for cmd, rest in re.findall(r"hloforge ([a-z-]+)([^#`|;)\n]*)", text):
        words = rest.split()
        p = parsers.get(f"{cmd} {words[0]}" if cmd == "prepare" and words else cmd)
        if p is None:
            continue
        known = {o for a in p._actions for o in a.option_strings}
        unknown += [f"hloforge {cmd} {f}" for f in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest) if f not in known]
    assert unknown == []


def test_loss_help_names_every_loss_train_picks_by_default():
    """`--loss`'s help lists the losses train picks when it is not given; before, it left out the detectors' (yolov1,
    fpnYolo), which `hloforge train fpn-mini --data shapes` picks."""
    import attrs

    from hloforge.core.variant import OPTION
    from hloforge.train.tasks import default_loss

    picked = {default_loss(get_net(n), None) for n in NETS}
    assert {"crossEntropy", "yolov1", "fpnYolo"} <= picked
    shown = attrs.fields_dict(Variant)["loss"].metadata[OPTION].help
    assert sorted(name for name in picked if name not in shown) == []


def test_drop_path_help_says_its_default_keeps_the_specs_own():
    """--drop-path's help said 'replacing the spec's own (default 0)', while 0 (given or not) keeps each block's own."""
    from hloforge.core.trained_net import trained_net

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    flag = next(a for a in sub.choices["train"]._actions if "--drop-path" in a.option_strings)
    assert flag.help.endswith("(default 0: each block's own; 0 replaces nothing)")
    spec = get_net("convnext-mini")
    own = spec.to_dict()
    own["layers"] = [{**d, "drop_path": 0.2} if "drop_path" in d else d for d in own["layers"]]
    kept = trained_net(type(spec).from_dict(own), 0.0, 0.0, None)
    assert [d.get("drop_path") for d in kept.to_dict()["layers"]] == [d.get("drop_path") for d in own["layers"]]
    assert 0.2 in [d.get("drop_path") for d in own["layers"]]
