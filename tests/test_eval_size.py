"""Scoring at another size (seed 003, timm's test protocol): `hloforge eval RUN --size S [--crop F]`
renders the eval graph at S and feeds the eval images resized and center-cropped to match, for nets
whose every parameter keeps its shape at S; others are refused with the reason."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from test_datasets import tiny_mnist  # tests/ is on sys.path (rootdir-relative, no package)

from hloforge.cli import main
from hloforge.commands import opening
from hloforge.commands.opening import evaluate_checkpoint
from hloforge.commands.resolution import PROTOCOLS, scoring_size, spec_at_size
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.resample import resize_center_crop, resize_short_side
from hloforge.train.trainer import TrainConfig, train
from hloforge.zoo import get_net


def quiet(s: str) -> None:
    pass


@pytest.fixture(scope="module")
def resnet28(tmp_path_factory) -> str:
    """resnet-mini trained on the digits resized to 28×28: one epoch, batch 32."""
    run = tmp_path_factory.mktemp("eval-size") / "resnet28"
    train(TrainConfig(net="resnet-mini", data="digits", epochs=1, batch=32, run_dir=str(run)),
          progress=False, log=quiet)
    return str(run)


@pytest.fixture
def compiled(monkeypatch) -> list[str]:
    """The names of the forward modules the eval sessions (one device and sharded) compile."""
    from hloforge.train import parallel, session

    names: list[str] = []
    for mod in (session, parallel):
        def spy(*a, _render=mod.forward_module, **k):
            text = _render(*a, **k)
            names.append(text.split(" ", 2)[1])
            return text
        monkeypatch.setattr(mod, "forward_module", spy)
    return names


def tiny_run(tmp_path, net: str) -> str:
    data = tmp_path / "data"
    data.mkdir()
    tiny_mnist(data, n_train=32, n_test=8)
    run = tmp_path / net
    train(TrainConfig(net=net, data="mnist", data_dir=str(data), epochs=1, batch=32, run_dir=str(run)),
          progress=False, log=quiet)
    return str(run)


# ------------------------------------------------------------------ the transform
def test_resize_center_crop_follows_timms_crop_pct() -> None:
    assert resize_short_side(224, 0.875) == 256 and resize_short_side(224, 0.95) == 235  # floor, as timm
    x = np.random.default_rng(0).normal(size=(2, 3, 8, 16)).astype(np.float32)
    # the short side already at floor(4 / 0.5) = 8: no resampling, the center 4×4 of the 8×16
    np.testing.assert_array_equal(resize_center_crop(x, 4, 0.5), x[..., 2:6, 6:10])
    assert resize_center_crop(x, 8, 1.0).shape == (2, 3, 8, 8)
    sq = x[..., :8]
    np.testing.assert_array_equal(resize_center_crop(sq, 8, 1.0), sq)  # its own size at crop 1: unchanged
    up = resize_center_crop(sq, 12, 0.75)  # 8 -> 16, center 12
    assert up.shape == (2, 3, 12, 12) and up.dtype == np.float32
    const = np.full((1, 1, 8, 8), 2.5, np.float32)
    np.testing.assert_allclose(resize_center_crop(const, 5, 0.9), 2.5, rtol=1e-6)  # bilinear keeps constants


# ------------------------------------------------------------------ which nets can be scored at S
def test_a_global_pooling_net_keeps_every_parameter_shape() -> None:
    spec = get_net("resnet-mini")
    at = spec_at_size(spec, 32)
    assert at.input_shape == (1, 32, 32)
    assert [(n, s.shape) for n, s in at.params()] == [(n, s.shape) for n, s in spec.params()]


@pytest.mark.parametrize("net, size, reason", [
    ("mnist-cnn", 32, r"parameter 7\.w would be \[4096, 512\] there, \[3136, 512\] as trained"),
    ("vit-cifar", 36, r"parameter 0\.pos would be \[82, 128\] there, \[65, 128\] as trained"),
    ("mnist-mlp", 32, r"scores an image net \(input C×H×W\); net 'mnist-mlp' takes input \[784\]"),
    ("convnext_tiny", 60, r"cannot be scored at 60×60: layer .*stride 2 does not divide the 15x15 input"),
])
def test_a_net_whose_shapes_depend_on_the_size_is_refused_with_the_reason(net, size, reason) -> None:
    with pytest.raises(UnsupportedSpec, match=reason):
        spec_at_size(get_net(net), size)


def test_the_crop_defaults_to_the_nets_timm_protocol_else_one() -> None:
    assert PROTOCOLS["resnet18"].crop == 0.875
    assert scoring_size(get_net("resnet18"), "resnet18", 224, None).crop == 0.875
    assert scoring_size(get_net("resnet18"), "resnet18", 224, 1.0).crop == 1.0  # --crop wins
    assert scoring_size(get_net("resnet-mini"), "resnet-mini", 32, None).crop == 1.0


# ------------------------------------------------------------------ the acceptance
def test_resnet_mini_trained_at_28_scores_at_32_and_24(resnet28, capsys, compiled) -> None:
    capsys.readouterr()
    lines = {}
    for s in (32, 24):
        assert main(["eval", resnet28, "--size", str(s)]) == 0
        out = capsys.readouterr().out.strip().splitlines()[-1]
        assert f"at {s}×{s} (trained 28×28; crop 1 " in out and "test top-1 " in out and "(" in out
        lines[s] = out
    assert "graph resnet_mini_fwd_eval_s32" in lines[32] and "graph resnet_mini_fwd_eval_s24" in lines[24]
    # the modules compiled carry the size in their names: never the trained size's artifact
    assert main(["eval", resnet28]) == 0
    assert compiled == ["@resnet_mini_fwd_eval_s32", "@resnet_mini_fwd_eval_s24", "@resnet_mini_fwd_eval"]
    assert main(["eval", resnet28, "--size", "32", "--crop", "0.875"]) == 0
    assert "crop 0.875 [--crop]: resized to 36, center 32×32" in capsys.readouterr().out


def test_the_trained_size_at_crop_one_is_plain_evals_top1_exactly(resnet28) -> None:
    plain = evaluate_checkpoint(resnet28, log=quiet)
    lines: list[str] = []
    same = evaluate_checkpoint(resnet28, size=28, crop=1.0, log=lines.append)
    assert (same.top1, same.top5, same.n) == (plain.top1, plain.top5, plain.n) == (same.top1, same.top5, 360)
    np.testing.assert_array_equal(same.correct, plain.correct)
    assert "graph resnet_mini_fwd_eval_s28" in lines[-1]  # its own artifact, the same numbers


def test_a_streamed_eval_is_resized_as_the_loaded_one(resnet28, monkeypatch) -> None:
    """workers > 0 streams the eval split from producer processes: each batch resized as it arrives."""
    loaded = evaluate_checkpoint(resnet28, size=24, log=quiet)
    run = opening.Run
    monkeypatch.setattr(opening, "Run", lambda cfg, *a, **k: run(attrs.evolve(cfg, workers=1), *a, **k))
    passes, stream = [], opening.evaluate_stream
    monkeypatch.setattr(opening, "evaluate_stream", lambda *a: passes.append(1) or stream(*a))
    streamed = evaluate_checkpoint(resnet28, size=24, log=quiet)
    assert passes == [1] and streamed.n == loaded.n == 360
    np.testing.assert_array_equal(streamed.correct, loaded.correct)


def test_a_sharded_eval_at_another_size_is_one_devices(resnet28, compiled) -> None:
    one = evaluate_checkpoint(resnet28, size=32, log=quiet)
    two = evaluate_checkpoint(resnet28, size=32, replicas=2, devices=2, log=quiet)
    np.testing.assert_array_equal(two.correct, one.correct)
    assert compiled == ["@resnet_mini_fwd_eval_s32"] * 2


def test_a_flatten_head_run_refuses_size_in_one_line(tmp_path, capsys) -> None:
    run = tiny_run(tmp_path, "mnist-cnn")
    capsys.readouterr()
    assert main(["eval", run, "--size", "32"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot be scored at 32×32" in err and "flatten + dense" in err


@pytest.mark.parametrize("argv, rc, says", [
    (["--size", "0"], 2, "argument --size: expected an integer ≥ 1, got '0'"),
    (["--size", "32", "--crop", "1.5"], 2, "argument --crop: expected a number in (0, 1], got '1.5'"),
    (["--size", "32", "--crop", "0"], 2, "argument --crop: expected a number in (0, 1], got '0'"),
    (["--crop", "0.9"], 3, "--crop 0.9 needs --size"),
])
def test_bad_sizes_and_crops_are_one_line_each(argv, rc, says, tmp_path, capsys) -> None:
    assert main(["eval", str(tmp_path / "none"), *argv]) == rc  # refused before the run is opened
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err


def test_size_on_a_non_image_net_is_one_line(tmp_path, capsys) -> None:
    run = tiny_run(tmp_path, "mnist-mlp")
    capsys.readouterr()
    assert main(["eval", run, "--size", "28"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "takes input [784]" in err
    with pytest.raises(UnsupportedSpec, match="--size must be a positive integer"):
        evaluate_checkpoint(run, size=-3, log=quiet)
