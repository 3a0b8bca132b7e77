"""`Model.evaluate` / `predict` score the weights `hloforge eval --region` scores (one definition:
hloforge.train.checkpoint.region_weights): by default (auto) the EMA shadow with its own BatchNorm
statistics when the variant keeps one, `live` θ with the running ones; a wrong region is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import hloforge as hf
from hloforge.cli import main
from hloforge.commands.opening import evaluate_checkpoint
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.train import checkpoint as ckpt
from hloforge.train.config import CHECKPOINT


def test_bn_statistics_assigned_after_params_are_the_restarted_shadows_too(ema_run: str) -> None:
    """The documented warm start (params, then state's stat/…) of a model with an EMA shadow: `evaluate` and
    `predict` score the shadow, restarted at the assigned θ. Before: with the statistics from before the
    assignment (a new model's initial 0 and 1), a plausible wrong score."""
    donor = hf.load(ema_run)
    x = np.random.default_rng(0).normal(size=(16, 1, 28, 28)).astype(np.float32)
    want = donor.predict(x, region="live")
    live_stats = {k: v for k, v in donor.state.items() if k.startswith("stat/") and not k.startswith("stat/E/")}
    for model in (hf.Model(donor.spec, ema=0.9), hf.load(ema_run)):  # a new model, and a fitted one
        model.params = donor.params
        model.state = live_stats
        # a new model's forward is compiled at its own batch, whose GEMM kernels may round otherwise (AVX-512)
        np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5)
        # the shadow's own statistics, assigned by hand, are taken as given
        model.state = {k.replace("stat/", "stat/E/"): np.ones_like(v) for k, v in live_stats.items()}
        assert not np.allclose(model.predict(x), want, rtol=1e-3, atol=1e-3)


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory) -> str:
    """A CLI-trained run on digits with an EMA shadow and a BatchNorm, so the shadow's statistics matter."""
    d = tmp_path_factory.mktemp("regions")
    net = d / "bn-mlp.json"
    net.write_text(json.dumps({"name": "bn-mlp", "input_shape": [1, 28, 28], "num_classes": 10, "layers": [
        {"kind": "flatten"}, {"kind": "dense", "units": 32}, {"kind": "batchNorm"}, {"kind": "dense", "units": 10}]}))
    run = str(d / "run")
    assert main(["train", str(net), "--ema", "0.9", "--epochs", "1", "--batch", "64", "--lr", "3e-3",
                 "--run-dir", run, "--no-progress"]) == 0
    return run


def test_load_evaluate_scores_what_hloforge_eval_scores(ema_run: str, capsys) -> None:
    model = hf.load(ema_run)
    for region in ("auto", "live"):
        cli = evaluate_checkpoint(ema_run, region=region, log=quiet)
        api = model.evaluate(data="digits") if region == "auto" else model.evaluate(data="digits", region=region)
        assert (api["correct"], api["n"]) == (cli.top1, cli.n), region
        assert api["top1"] == cli.top1 / cli.n and api["loss"] == pytest.approx(cli.nll, rel=1e-6), region
    # the two regions are told apart (the shadow's θ and statistics are not the live ones)
    assert evaluate_checkpoint(ema_run, region="ema", log=quiet).nll != evaluate_checkpoint(
        ema_run, region="live", log=quiet).nll
    # the number `hloforge eval` prints is the one evaluate returns
    capsys.readouterr()
    assert main(["eval", ema_run]) == 0
    assert f"({model.evaluate(data='digits')['correct']}/" in capsys.readouterr().out


def bn_net_and_rows(name: str, n: int, seed: int) -> tuple[hf.NetSpec, np.ndarray, np.ndarray]:
    """A small net with BatchNorm (so the shadow's own statistics matter) and n separable rows of 3 classes."""
    layers = hf.layers
    spec = hf.NetSpec(name, (4,), [layers.Dense(8), layers.BatchNorm(), layers.Dense(3)], 3)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int32)
    return spec, (rng.normal(size=(n, 4)) + np.eye(4)[y] * 2).astype(np.float32), y


def test_predict_by_region(ema_run: str) -> None:
    model = hf.load(ema_run)
    x = np.random.default_rng(0).normal(size=(40, 1, 28, 28)).astype(np.float32)
    ema, live = model.predict(x, region="ema"), model.predict(x, region="live")
    assert not np.allclose(ema, live, rtol=1e-3, atol=1e-4)
    assert np.array_equal(model.predict(x), ema) and np.array_equal(model.predict(x, region="auto"), ema)


def test_fit_history_keeps_both_regions_and_evaluate_matches_them() -> None:
    spec, x, y = bn_net_and_rows("regions-bn", 96, seed=0)
    model = hf.Model(spec, lr=1e-2, ema=0.9)
    history = model.fit(x[:64], y[:64], epochs=1, batch_size=16, validation_data=(x[64:], y[64:]), verbose=False)
    assert {"val_top1", "val_top1_ema"} <= set(history[-1])  # θ's and the shadow's, as before
    assert model.evaluate(x[64:], y[64:], region="live")["top1"] == history[-1]["val_top1"]
    assert model.evaluate(x[64:], y[64:])["top1"] == history[-1]["val_top1_ema"]
    assert not np.allclose(model.predict(x, region="ema"), model.predict(x, region="live"), rtol=1e-3, atol=1e-4)


def test_ema_on_a_model_without_a_shadow_is_one_line() -> None:
    model = hf.Model(hf.NetSpec("regions-plain", (4,), [hf.layers.Dense(3)], 3))
    x = np.zeros((4, 4), np.float32)
    y = np.zeros(4, np.int32)
    for call in (lambda: model.predict(x, region="ema"), lambda: model.evaluate(x, y, region="ema")):
        with pytest.raises(DataError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "has no EMA shadow" in msg and "region='live'" in msg, msg
    assert np.array_equal(model.predict(x), model.predict(x, region="live"))  # auto: θ, there being no shadow


def test_a_bad_region_name_is_one_line() -> None:
    model = hf.Model(hf.NetSpec("regions-plain", (4,), [hf.layers.Dense(3)], 3), ema=0.9)
    x = np.zeros((4, 4), np.float32)
    for call in (lambda: model.predict(x, region="shadow"),
                 lambda: model.evaluate(x, np.zeros(4, np.int32), region="Live")):
        with pytest.raises(UnsupportedSpec) as e:
            call()
        assert "\n" not in str(e.value) and "expected one of ['live', 'ema', 'auto']" in str(e.value)


def test_load_refuses_a_shadow_without_its_statistics_as_eval_does(ema_run: str, tmp_path) -> None:
    import shutil

    run = str(tmp_path / "old")
    shutil.copytree(ema_run, run)
    file = f"{run}/{CHECKPOINT}"
    with safe_open(file, "np") as f:
        meta = f.metadata()
    save_file({k: v for k, v in load_file(file).items() if not k.startswith(f"{ckpt.SHADOW_STATS}/")}, file,
              metadata=meta)
    with pytest.raises(HloforgeError, match="no BatchNorm statistics for its EMA shadow") as e:
        hf.load(run)
    assert "\n" not in str(e.value) and "--region live" in str(e.value)


def test_the_shadow_of_a_frozen_bn_net_is_its_shadow_theta_and_statistics_with_frozen_theta_as_is() -> None:
    spec, x, y = bn_net_and_rows("regions-frozen", 64, seed=1)
    model = hf.Model(spec, lr=5e-2, ema=0.9, frozen=("0",))
    history = model.fit(x, y, epochs=1, batch_size=16, validation_data=(x, y), verbose=False)
    assert model.evaluate(x, y)["top1"] == history[-1]["val_top1_ema"]
    # the same weights by hand, through the public tensors: E/… for the trained θ, the frozen ones as they
    # are, with the shadow's statistics (stat/E/…), scored as a plain model's live weights
    state, params = model.state, model.params
    assert "E/0.w" not in state and "E/2.w" in state
    by_hand = hf.Model(spec)
    by_hand.params = {n: state.get(f"E/{n}", p) for n, p in params.items()}
    by_hand.state = {k.replace("stat/E/", "stat/"): v for k, v in state.items() if k.startswith("stat/E/")}
    assert np.array_equal(by_hand.predict(x, batch_size=16), model.predict(x))
    assert not np.array_equal(model.predict(x, region="live"), model.predict(x))


def test_params_assigned_to_a_fitted_ema_model_restart_its_shadow_there(ema_run: str) -> None:
    model = hf.load(ema_run)  # a fitted EMA model: its shadow is of the weights it trained
    donor = hf.Model(model.spec, seed=7)  # other weights, the same net
    model.params = donor.params
    x = np.random.default_rng(0).normal(size=(16, 1, 28, 28)).astype(np.float32)
    live, auto = model.predict(x, region="live"), model.predict(x)
    np.testing.assert_array_equal(auto, live)  # the shadow was the trained weights': a stale score
    state = model.state
    for name, p in donor.params.items():
        np.testing.assert_array_equal(state[f"E/{name}"], p)
    for name, r in state.items():
        if name.startswith("stat/E/"):
            np.testing.assert_array_equal(r, state["stat/" + name.removeprefix("stat/E/")])
