"""Training variants in combination compute what their flags say, checked against independent numbers:
mixup on a Model's class-label arrays (an f64 numpy MLP), a frozen BN net's statistics kept by fit, and
the EMA shadow scored under --replicas and --workers as on one process (the shadow scored again by hand)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import hloforge as hf
from hloforge.train.mixing import MIX_STREAM
from hloforge.train.trainer import TrainConfig, train

Dense = hf.layers.Dense


def mlp() -> hf.NetSpec:
    return hf.NetSpec("combo-mlp", (6,), [Dense(5, act="relu"), Dense(3)], 3)


def rows(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def mlp_grads(p: list[np.ndarray], x: np.ndarray, t: np.ndarray) -> list[np.ndarray]:
    """∂/∂(w0, b0, w1, b1) of mean_b −Σ_c t·log softmax(relu(x·w0 + b0)·w1 + b1), by hand in f64."""
    w0, b0, w1, b1 = p
    a = x @ w0 + b0
    h = np.maximum(a, 0.0)
    z = h @ w1 + b1
    e = np.exp(z - z.max(1, keepdims=True))
    dz = (e / e.sum(1, keepdims=True) * t.sum(1, keepdims=True) - t) / len(x)
    da = (dz @ w1.T) * (a > 0)
    return [x.T @ da, da.sum(0), h.T @ dz, dz.sum(0)]


def test_mixup_with_label_smoothing_fits_class_label_arrays() -> None:
    """Model(mixup=…).fit(x, y) takes class labels (the host mixes them into soft targets), and trains
    on exactly the mixed batches and smoothed targets: SGD at a constant lr against an f64 reference."""
    x, y = rows()
    m = hf.Model(mlp(), optimizer="sgd", lr=0.1, schedule="constant", mixup=0.4, label_smoothing=0.2)
    m.fit(x, y, epochs=1, batch_size=8, shuffle=False, verbose=False)
    p = [np.asarray(a, np.float64) for a in mlp().init_params(0)]
    for s in range(8):
        xb, yb = x[8 * s:8 * s + 8].astype(np.float64), y[8 * s:8 * s + 8]
        lam = float(np.random.default_rng([0, MIX_STREAM, s + 1]).beta(0.4, 0.4))  # the mixer's draw for step s+1
        t = np.full((8, 3), 0.2 / 3)
        t[np.arange(8), yb] = 1 - 0.2 + 0.2 / 3
        g = mlp_grads(p, lam * xb + (1 - lam) * xb[::-1], lam * t + (1 - lam) * t[::-1])
        p = [a - 0.1 * d for a, d in zip(p, g, strict=True)]
    got = [m.params[n] for n in ("0.w", "0.b", "1.w", "1.b")]
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, p, strict=True)) < 1e-5
    scores = m.evaluate(x, y)  # scored on the class labels too
    assert scores["n"] == 64 and 0 <= scores["correct"] <= 64


def test_fit_keeps_the_running_statistics_of_a_frozen_bn_net() -> None:
    """fit on a net with BatchNorm and a frozen layer keeps the run's BN statistics (the optimizer state
    holds the trained θ alone): evaluate scores what the last epoch's validation scored, and a second
    fit goes on from the kept state."""
    L = hf.layers
    net = hf.NetSpec("combo-bn", (6,), [L.Dense(5), L.BatchNorm(), L.Dense(3)], 3)
    x, y = rows()
    m = hf.Model(net, lr=0.05, frozen=("0",), ema=0.9)
    h = m.fit(x, y, epochs=1, batch_size=16, shuffle=False, validation_data=(x, y), verbose=False)
    assert m.evaluate(x, y, region="live")["loss"] == pytest.approx(h[-1]["val_loss"], abs=1e-6)
    assert not np.array_equal(m.state["stat/1.mean"], np.zeros(5))  # moved from the initial statistics
    m.fit(x, y, epochs=1, batch_size=16, shuffle=False, verbose=False)
    assert m._step == 8


@pytest.fixture(scope="module")
def digits_mlp(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("net") / "mlp.json")
    with open(path, "w") as f:
        json.dump(hf.NetSpec("combo-digits", (784,), [Dense(16, act="relu"), Dense(10)], 10).to_dict(), f)
    return path


def shadow_correct(run_dir: str) -> int:
    """The EMA shadow scored by hand: the run's E/* tensors as θ, through Model.evaluate on digits."""
    m = hf.load(run_dir)
    m.params = {n: m.state[f"E/{n}"] for n in m.params}
    return int(m.evaluate("digits")["correct"])


@pytest.mark.parametrize("parallel", [dict(replicas=2), dict(workers=1)])
def test_the_ema_shadow_is_scored_under_replicas_and_workers(parallel: dict, digits_mlp: str, tmp_path: str) -> None:
    """--ema with --replicas 2 or --workers 1 logs the shadow's scores (top1_ema), as one process does, and
    they are the shadow's own (scored again from the checkpoint's E/* tensors)."""
    got = {}
    for tag, extra in (("one", {}), ("par", parallel)):
        d = os.path.join(tmp_path, tag)
        got[tag] = train(TrainConfig(net=digits_mlp, epochs=1, lr=0.01, optimizer="momentum", ema=0.9, run_dir=d,
                                     **extra), log=lambda s: None, progress=False)
        got[tag]["by_hand"] = shadow_correct(d)
    one, par = got["one"], got["par"]
    assert "top1_ema" in par and par["correct_ema"] == par["by_hand"] == one["correct_ema"] == one["by_hand"]
    assert par["correct"] == one["correct"]
