"""DDPM: the schedule and host-side noising, ancestral sampling, timeCondAdd's time channel,
the task's loss choice, and training + `hloforge sample` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hloforge.core import modules
from hloforge.core.spec import NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.ddpm import TimeCondAdd, frequencies
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.unet import UnetDown, UnetUp
from hloforge.testing.gate import _client
from hloforge.train import diffusion
from hloforge.train.tasks import default_loss
from hloforge.zoo import get_net


def test_linear_schedule_and_noising():
    s = diffusion.LinearSchedule()
    assert s.betas[0] == 1e-4 and s.betas[-1] == pytest.approx(0.02) and len(s.betas) == 1000
    assert np.all(np.diff(s.alpha_bar) < 0) and s.alpha_bar[-1] < 1e-4  # x_T is (nearly) pure noise
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((3, 2, 4, 4))
    t = np.array([0, 10, 999])
    eps = rng.standard_normal(x0.shape)
    xin = diffusion.noised(x0, t, eps, s)
    assert xin.shape == (3, 3, 4, 4) and xin.dtype == np.float32
    np.testing.assert_allclose(xin[:, 2], np.broadcast_to((t / 1000)[:, None, None], (3, 4, 4)))
    ab = s.alpha_bar[10]
    np.testing.assert_allclose(xin[1, :2], math.sqrt(ab) * x0[1] + math.sqrt(1 - ab) * eps[1], rtol=1e-6)
    a, b = diffusion.training_pair(x0, np.random.default_rng([0, 1]), s), \
        diffusion.training_pair(x0, np.random.default_rng([0, 1]), s)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])  # (seed, step) fixes t and ε
    e1, e2 = diffusion.eval_pair(x0, s), diffusion.eval_pair(x0, s)
    assert np.array_equal(e1[0], e2[0])


def test_ancestral_sampling_with_the_exact_noise_predictor_lands_on_the_data_point():
    """For data that is one point x*, ε̂(x_t, t) = (x_t − √ᾱ_t·x*)/√(1−ᾱ_t) is exact, and every
    ancestral chain ends on x* (the last step removes the remaining noise exactly)."""
    s = diffusion.LinearSchedule(steps=50, beta_start=1e-3, beta_end=0.2)
    target = np.random.default_rng(1).standard_normal((1, 3, 3))
    seen = []

    def predict(xin: np.ndarray) -> np.ndarray:
        t = int(round(float(xin[0, -1, 0, 0]) * s.steps))
        seen.append(t)
        x, ab = xin[:, :-1].astype(np.float64), s.alpha_bar[t]
        return (x - math.sqrt(ab) * target) / math.sqrt(1 - ab)

    out = diffusion.ancestral_sample(predict, 5, target.shape, s, np.random.default_rng(2))
    assert seen == list(range(49, -1, -1))
    np.testing.assert_allclose(out, np.broadcast_to(target, out.shape), atol=1e-4)


def test_time_cond_add_reads_the_time_plane_of_the_nets_input():
    net = [Conv2d(2, k=1), TimeCondAdd(nfreq=2)]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 2, 2))
    x[:, 2] = np.array([0.25, 0.7])[:, None, None]  # the time plane
    w, b = rng.standard_normal((2, 3, 1, 1)), rng.standard_normal(2)
    pw, pb = rng.standard_normal((4, 2)), rng.standard_normal(2)
    exe = _client().compile(modules.layers_forward_module(net, (3, 2, 2), 2, dtype="f64"))
    try:
        got = np.asarray(exe.run([w, b, pw, pb, x])[0])
    finally:
        exe.close()
    conv = np.einsum("oi,bihw->bohw", w[:, :, 0, 0], x) + b[None, :, None, None]
    angle = np.array([0.25, 0.7])[:, None] * frequencies(2)[None]
    emb = np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
    np.testing.assert_allclose(got, conv + (emb @ pw + pb)[:, :, None, None], rtol=1e-12)


def test_the_net_and_dataset_pick_the_loss():
    assert default_loss(get_net("ddpm-mini"), "shapes") == "mse"  # time-conditioned: a DDPM, masks or not
    assert default_loss(get_net("unet-mini"), "shapes") == "perPixelCE"
    assert default_loss(get_net("mnist-mlp"), "digits") == "crossEntropy"
    assert diffusion.is_time_conditioned(get_net("ddpm-mini", 1, (2, 28, 28)))


def tiny_ddpm() -> NetSpec:
    return NetSpec("ddpm-tiny", (2, 28, 28), [ConvBn(4), TimeCondAdd(2), UnetDown(4), TimeCondAdd(2), ConvBn(8),
                                              UnetUp(4), Conv2d(1, k=1)], 1)


def test_train_a_tiny_ddpm_and_sample_a_grid(tmp_path, capsys):
    from hloforge.cli import main

    path = tmp_path / "ddpm.toml"
    path.write_text(tiny_ddpm().to_toml())
    run_dir = tmp_path / "run"
    assert main(["train", str(path), "--data", "digits", "--epochs", "1", "--batch", "128", "--lr", "3e-3",
                 "--run-dir", str(run_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "adam_lossmse" in out and "test noise MSE" in out
    epoch = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert epoch["kind"] == "epoch" and epoch["n"] == 360
    assert math.isfinite(epoch["noise_mse"]) and epoch["noise_mse"] > 0
    assert main(["eval", str(run_dir)]) == 0
    assert f"test noise MSE {epoch['noise_mse']:.4f}" in capsys.readouterr().out
    grid = tmp_path / "grid.png"
    assert main(["sample", str(run_dir), "-n", "4", "--out", str(grid)]) == 0
    import matplotlib.image

    img = matplotlib.image.imread(str(grid))
    assert img.shape[:2] == (2 * (28 * 4 + 1) + 1, 2 * (28 * 4 + 1) + 1)  # 2×2 samples, zoom 4, 1-pixel gaps
    assert "4 samples (1000 ancestral steps)" in capsys.readouterr().out
    # a DDPM's input is its images and the time plane: shapes (3 channels at 32²) does not fit this net
    assert main(["train", str(path), "--data", "shapes", "--run-dir", str(tmp_path / "r2")]) == 2
    assert ("a DDPM on 1-channel images [28, 28] takes input [2, 28, 28] (the images and the time channel) and "
            "predicts [1, 28, 28]; net 'ddpm-tiny' takes [2, 28, 28], dataset 'shapes' gives [3, 32, 32]") in \
        capsys.readouterr().err
