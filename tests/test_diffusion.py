"""DDPM: the schedule and host-side noising, ancestral sampling, timeCondAdd's time channel,
timeResBlock and noiseHead, the task's loss choice, the schedule kept with the run, shapes'
clean-background option, and training + `hloforge sample` end to end."""

from __future__ import annotations

import json
import math

import attrs
import numpy as np
import pytest

from hloforge.core import modules
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.datasets.shapes import Shapes
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.ddpm import NoiseHead, TimeCondAdd, TimeResBlock, frequencies
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.pool import MaxPool
from hloforge.plugins.layers.unet import BilinearUpsample, Concat, PushSkip
from hloforge.testing.gate import _client
from hloforge.train import diffusion
from hloforge.train.tasks import default_loss
from hloforge.train.trainer import TrainConfig
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


def test_the_schedule_is_the_runs_config_and_an_older_run_reads_the_default():
    assert diffusion.LinearSchedule.of(TrainConfig()) == diffusion.LinearSchedule()  # Ho et al.'s
    short = diffusion.LinearSchedule.of(TrainConfig(diffusion_steps=250, beta_start=4e-4, beta_end=0.08))
    assert short.steps == 250 and short.betas[-1] == pytest.approx(0.08)
    # a checkpoint's config from before the schedule keys: what that run trained with
    old = {k: v for k, v in attrs.asdict(TrainConfig()).items() if k not in ("diffusion_steps", "beta_start",
                                                                               "beta_end")}
    assert diffusion.LinearSchedule.of(TrainConfig(**old)) == diffusion.LinearSchedule(1000, 1e-4, 0.02)


@pytest.mark.parametrize(("kw", "match"), [
    ({"steps": 1}, "at least 2"),
    ({"beta_start": 0.0}, r"beta_start is a noise variance per step, in \(0, 1\); got 0.0"),
    ({"beta_end": 1.5}, r"beta_end .* got 1.5"),
    ({"beta_start": 0.03, "beta_end": 0.02}, "is below beta_start"),
    ({"steps": 100}, r"leaves √ᾱ_T = 0.603 of the image"),  # 1e-4 … 0.02 over 100 steps: far from noise
])
def test_the_schedule_refuses_what_cannot_be_sampled(kw, match):
    with pytest.raises(UnsupportedSpec, match=match):
        diffusion.LinearSchedule(**kw)


def test_ancestral_sampling_with_the_exact_noise_predictor_lands_on_the_data_point():
    """For data that is one point x*, ε̂(x_t, t) = (x_t − √ᾱ_t·x*)/√(1−ᾱ_t) is exact, and every
    ancestral chain ends on x* (the last step removes the remaining noise exactly)."""
    s = diffusion.LinearSchedule(steps=50, beta_start=1e-3, beta_end=0.4)
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
    # clipping x̂0 to a range that holds x* changes nothing; one that cuts it off lands on the bound
    lo, hi = np.full(1, -5.0), np.full(1, 5.0)
    clipped = diffusion.ancestral_sample(predict, 5, target.shape, s, np.random.default_rng(2), (lo, hi))
    np.testing.assert_allclose(clipped, out, atol=1e-9)
    cut = diffusion.ancestral_sample(predict, 5, target.shape, s, np.random.default_rng(2), (lo, np.full(1, 0.0)))
    np.testing.assert_allclose(cut, np.broadcast_to(np.minimum(target, 0.0), out.shape), atol=1e-9)


def test_the_unclipped_posterior_step_is_ho_et_als_update():
    """x_{t−1} through the posterior mean of x̂0 equals (x_t − β_t/√(1−ᾱ_t)·ε̂)/√α_t + σ_t·z, for any ε̂."""
    s = diffusion.LinearSchedule(steps=20, beta_start=0.01, beta_end=0.6)
    w = np.random.default_rng(4).standard_normal((2, 2))

    def predict(xin: np.ndarray) -> np.ndarray:  # an arbitrary (wrong) predictor that depends on x and t
        return np.einsum("oc,bchw->bohw", w, xin[:, :2]) * (1.0 + xin[:, 2:])

    got = diffusion.ancestral_sample(predict, 3, (2, 2, 2), s, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 2, 2))
    for t in range(s.steps - 1, -1, -1):
        eps = predict(diffusion.with_time_channel(x, np.full(3, t), s.steps)).astype(np.float64)
        x = (x - s.betas[t] / math.sqrt(1 - s.alpha_bar[t]) * eps) / math.sqrt(s.alphas[t])
        if t > 0:
            x = x + math.sqrt(s.betas[t]) * rng.standard_normal(x.shape)
    np.testing.assert_allclose(got, x, rtol=1e-9, atol=1e-9)


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


def run_layers(net: list, in_shape: tuple[int, ...], params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    exe = _client().compile(modules.layers_forward_module(net, in_shape, len(x), dtype="f64"))
    try:
        return np.asarray(exe.run([*params, x])[0])
    finally:
        exe.close()


def test_time_res_block_and_noise_head_start_as_the_skip_and_zero():
    """conv2 and the head start at zero: a fresh block is its skip, a fresh head predicts ε̂ = 0."""
    rng = np.random.default_rng(6)
    block = TimeResBlock(3, nfreq=2)
    slots = block.param_slots((4, 3, 3))
    assert [s.name for s in slots] == ["conv1.w", "conv1.b", "time.w", "time.b", "conv2.w", "conv2.b", "skip.w",
                                       "skip.b"]
    init = {s.name: s.initial(rng).astype(np.float64) for s in slots}
    assert not init["conv2.w"].any() and not init["conv2.b"].any() and init["conv1.w"].any()
    assert [s.name for s in TimeResBlock(4).param_slots((4, 3, 3))][-1] == "conv2.b"  # same width: identity skip
    x = rng.standard_normal((2, 4, 3, 3))
    got = run_layers([block], (4, 3, 3), list(init.values()), x)
    skip = np.einsum("oi,bihw->bohw", init["skip.w"][:, :, 0, 0], x) + init["skip.b"][None, :, None, None]
    np.testing.assert_allclose(got, skip, rtol=1e-12)
    head = NoiseHead(3)
    assert all(not s.initial(rng).any() for s in head.param_slots((5, 4, 4)))
    with pytest.raises(UnsupportedSpec, match="out must be positive"):
        TimeResBlock(0).out_shape((4, 3, 3))


def test_time_res_block_reads_the_time_plane_of_the_nets_input():
    """Behind a conv that mixes the time plane away, the block still reads t/T from the net's input:
    two inputs that differ only in the time plane's value differ through the embedding alone."""
    net = [Conv2d(3, k=1), TimeResBlock(3, nfreq=2)]
    rng = np.random.default_rng(7)
    slots = [s for layer, shape in ((net[0], (3, 2, 2)), (net[1], (3, 2, 2))) for s in layer.param_slots(shape)]
    params = [rng.standard_normal(s.shape) for s in slots]
    conv_w = params[0]
    conv_w[:, 2] = 0.0  # the conv ignores the time plane: only the block's own read of it can matter
    x = rng.standard_normal((2, 3, 2, 2))
    x[:, 2] = np.array([0.25, 0.7])[:, None, None]
    y = x.copy()
    y[:, 2] = np.array([0.5, 0.1])[:, None, None]
    a, b = run_layers(net, (3, 2, 2), params, x), run_layers(net, (3, 2, 2), params, y)
    assert np.abs(a - b).max() > 1e-3
    params[4][:] = 0.0  # time.w: no embedding, so the time plane no longer matters
    params[5][:] = 0.0
    np.testing.assert_allclose(run_layers(net, (3, 2, 2), params, x), run_layers(net, (3, 2, 2), params, y),
                               rtol=1e-12)


def test_shapes_noise_option_keeps_the_shapes_and_flattens_the_colours():
    noisy, clean = Shapes(size=16, n_train=8, n_test=4), Shapes(size=16, n_train=8, n_test=4, noise=0.0)
    for split in ("train", "test"):
        assert np.array_equal(noisy.arrays(split)[1], clean.arrays(split)[1])  # the same shapes, in place
        x, m = clean.arrays(split)
        for img, mask in zip(x, m, strict=True):
            # every shape's pixels (and the background's) are one colour at noise 0
            for cls in np.unique(mask):
                px = img[:, mask == cls]
                assert cls != 0 or np.ptp(px, axis=1).max() < 1e-5
    with pytest.raises(DataError, match="must be a finite number ≥ 0, got -0.1"):
        Shapes(size=16, n_train=8, n_test=4, noise=-0.1)


def test_shapes_max_shapes_option_draws_one_shape_per_image():
    many, one = Shapes(size=16, n_train=32, n_test=4), Shapes(size=16, n_train=32, n_test=4, max_shapes=1)
    assert max(len(b) for b in many.boxes("train")) > 1
    assert all(len(b) == 1 for split in ("train", "test") for b in one.boxes(split))
    with pytest.raises(DataError, match="max_shapes must be an integer ≥ 1, got 0"):
        Shapes(size=16, n_train=8, n_test=4, max_shapes=0)


def test_the_net_and_dataset_pick_the_loss():
    assert default_loss(get_net("ddpm-mini"), "shapes") == "mse"  # time-conditioned: a DDPM, masks or not
    assert default_loss(get_net("unet-mini"), "shapes") == "perPixelCE"
    assert default_loss(get_net("mnist-mlp"), "digits") == "crossEntropy"
    assert diffusion.is_time_conditioned(get_net("ddpm-mini", 1, (2, 28, 28)))
    assert not diffusion.is_time_conditioned(get_net("unet-mini"))


def tiny_ddpm() -> NetSpec:
    """Every DDPM layer, and BN running statistics beside an EMA shadow, at 16² on shapes."""
    return NetSpec("ddpm-tiny", (4, 16, 16), [Conv2d(6, k=3), TimeResBlock(6, nfreq=2), PushSkip(), MaxPool(2),
                                              ConvBn(8), TimeCondAdd(2), BilinearUpsample(2), Concat(6),
                                              TimeResBlock(6, nfreq=2), NoiseHead(3)], 3)


def test_train_a_tiny_ddpm_and_sample_a_grid(tmp_path, capsys, backend):
    from hloforge.cli import main

    path = tmp_path / "ddpm.toml"
    path.write_text(tiny_ddpm().to_toml())
    run_dir = tmp_path / "run"
    data = ["--data", "shapes", *(f"--data-opt={o}" for o in ("size=16", "noise=0", "n_train=96", "n_test=20")),
            "--backend", backend]
    assert main(["train", str(path), *data, "--epochs", "1", "--batch", "32", "--lr", "3e-3", "--ema", "0.9",
                 "--diffusion-steps", "40", "--beta-start", "1e-3", "--beta-end", "0.4",
                 "--run-dir", str(run_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "adam_ema0p9_lossmse" in out and "test noise MSE" in out and "ema noise MSE" in out
    epoch = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert epoch["kind"] == "epoch" and epoch["n"] == 20
    assert math.isfinite(epoch["noise_mse"]) and epoch["noise_mse"] > 0
    assert 'diffusion_steps = 40' in (run_dir / "config.toml").read_text()
    assert main(["eval", str(run_dir)]) == 0  # auto: the shadow, as the run kept one
    assert "(ema) on" in (out := capsys.readouterr().out) and f"noise MSE {epoch['noise_mse_ema']:.4f}" in out
    assert main(["eval", str(run_dir), "--region", "live"]) == 0
    assert f"test noise MSE {epoch['noise_mse']:.4f}" in capsys.readouterr().out
    grid = tmp_path / "grid.png"
    assert main(["sample", str(run_dir), "-n", "4", "--out", str(grid)]) == 0
    import matplotlib.image

    img = matplotlib.image.imread(str(grid))
    assert img.shape[:2] == (2 * (16 * 4 + 1) + 1, 2 * (16 * 4 + 1) + 1)  # 2×2 samples, zoom 4, 1-pixel gaps
    # the run's own schedule (not the module default), from the EMA shadow the run kept
    assert "(ema): 4 samples (40 ancestral steps, T 40, β 0.001 … 0.4, x̂0 clipped" in capsys.readouterr().out
    from hloforge.commands.sample import sample_run

    live = sample_run(str(run_dir), 2, str(tmp_path / "live.png"), region="live", clip=False, log=lambda _: None)
    ema = sample_run(str(run_dir), 2, str(tmp_path / "ema.png"), region="ema", clip=False, log=lambda _: None)
    assert live.shape == (2, 3, 16, 16) and not np.allclose(live, ema)  # the shadow is other weights
    # a DDPM's input is its images and the time plane: shapes at 32² does not fit this 16² net
    assert main(["train", str(path), "--data", "shapes", "--run-dir", str(tmp_path / "r2")]) == 3
    assert ("a DDPM on 3-channel images [16, 16] takes input [4, 16, 16] (the images and the time channel) and "
            "predicts [3, 16, 16]; net 'ddpm-tiny' takes [4, 16, 16], dataset 'shapes' gives [3, 32, 32]") in \
        capsys.readouterr().err
    # a run with no EMA shadow has none to sample from
    plain = tmp_path / "plain"
    assert main(["train", str(path), *data, "--epochs", "1", "--batch", "32", "--diffusion-steps", "40",
                 "--beta-start", "1e-3", "--beta-end", "0.4", "--run-dir", str(plain), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sample", str(plain), "-n", "1", "--region", "ema", "--out", str(tmp_path / "x.png")]) == 3
    assert "has no EMA shadow" in capsys.readouterr().err


def test_ddpm_mini_reads_its_image_channels_off_the_input():
    """`--input 2,28,28` alone (the module's own digits example) was refused as "ddpm-mini on 3-channel
    images", the default classes said as the user's images; the channels are now the input's less the time
    plane, and a classes that disagrees with the input names the one that fits."""
    assert get_net("ddpm-mini", None, (2, 28, 28)).out_shape == (1, 28, 28)
    assert get_net("ddpm-mini", None, (5, 16, 16)).out_shape == (4, 16, 16)
    assert get_net("ddpm-mini").out_shape == (3, 32, 32)
    with pytest.raises(UnsupportedSpec, match=r"got input \[2, 28, 28\]; expected classes 1 \(--classes 1\), or none"):
        get_net("ddpm-mini", 3, (2, 28, 28))
    # --classes 1 alone (digits' channel) against the default input: the input that fits is named too (it was not)
    with pytest.raises(UnsupportedSpec, match=r"expected classes 3 \(--classes 3\), or none, for this input, or "
                                              r"--input 2,32,32 for 1-channel images$"):
        get_net("ddpm-mini", 1)
    with pytest.raises(UnsupportedSpec, match=r"at least 2 input channels, got input \[1, 28, 28\]"):
        get_net("ddpm-mini", None, (1, 28, 28))


def test_sample_grid_shows_an_image_of_four_channels_as_its_channels_side_by_side():
    """A DDPM trained on BraTS' 4 modalities (ddpm-mini --input 5,S,S --data brats) had `hloforge sample` run all
    its ancestral steps and then refuse the grid ("shows 1- or 3-channel images"), every sample lost. Each
    sample is now its channels side by side in grey, channel k the k-th W columns of its tile."""
    images = np.random.default_rng(0).uniform(size=(3, 4, 5, 6))
    grid = diffusion.image_grid(images, cols=2, zoom=1, pad=1)
    assert grid.shape == (2 * (5 + 1) + 1, 2 * (4 * 6 + 1) + 1, 3)
    second = grid[1:6, 1 + 4 * 6 + 1:1 + 2 * (4 * 6) + 1]  # sample 1: row 0, column 1
    for k in range(4):
        for rgb in range(3):
            np.testing.assert_array_equal(second[:, k * 6:(k + 1) * 6, rgb], images[1, k])
    np.testing.assert_array_equal(diffusion.image_grid(images[:, :3], cols=2, zoom=1)[1:6, 1:7],
                                  images[0, :3].transpose(1, 2, 0))  # RGB as it was
