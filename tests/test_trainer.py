"""The trainer: run directory, checkpoints, resume, eval, compare, refusals, statistics."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from hloforge.cli import main
from hloforge.commands.opening import evaluate_checkpoint
from hloforge.core.errors import DataError, HloforgeError
from hloforge.train import checkpoint as ckpt
from hloforge.train.metrics import label_rank, mcnemar_exact, wilson
from hloforge.train.schedule import lr_at
from hloforge.train.trainer import CHECKPOINT, TrainConfig, bn_weight, train


def cfg(tmp_path, name="run", **kw) -> TrainConfig:
    base = {"net": "mnist-mlp", "epochs": 2, "batch": 64, "run_dir": str(tmp_path / name)}
    return TrainConfig(**{**base, **kw})


def params_of(run_dir) -> dict[str, np.ndarray]:
    tensors, _ = ckpt.load_checkpoint(os.path.join(run_dir, CHECKPOINT))
    return tensors


# ------------------------------------------------------------------ statistics
def test_wilson_known_values():
    lo, hi = wilson(3336, 3925)  # p ≈ 0.85 on 3,925 images: ±1.11 pt (seed 003)
    assert (hi - lo) / 2 == pytest.approx(0.01115, abs=5e-5)
    lo, hi = wilson(0, 50)  # finite at 0 correct, unlike the normal approximation
    assert lo == 0.0 and 0.05 < hi < 0.08
    lo, hi = wilson(50, 50)
    assert hi == 1.0 and 0.92 < lo < 0.95
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def test_mcnemar_exact_known_values():
    a = np.array([1] * 10 + [0] * 2 + [1] * 5, bool)
    b = np.array([0] * 10 + [1] * 2 + [1] * 5, bool)
    nb, nc, p = mcnemar_exact(a, b)
    assert (nb, nc) == (10, 2)
    assert p == pytest.approx(0.0385742, abs=1e-6)  # 2·P[Binom(12, ½) ≤ 2] = 2·79/4096
    assert mcnemar_exact(a, a)[2] == 1.0


def exact_mcnemar(b: int, c: int) -> float:
    """2·P[Binom(b+c, ½) ≤ min(b, c)] in integers (Python's int / int rounds once, whatever the size)."""
    n, k = b + c, min(b, c)
    total, term = 0, 1
    for i in range(k + 1):
        total, term = total + term, term * (n - i) // (i + 1)
    return min(1.0, 2 * total / (1 << n))


@pytest.mark.parametrize("b,c,p", [(950, 1050, 0.026824146240281), (1000, 1000, 1.0),
                                   (800, 1200, 3.505006206935645e-19), (49_500, 50_500, 0.0015823598788516),
                                   (49_000, 51_000, 2.5887160383469e-10)])
def test_mcnemar_exact_past_1023_disagreements(b, c, p):
    """`compare` on a CIFAR- or ImageNet-sized eval set: 2^n overflowed a float past n = 1023."""
    a = np.array([1] * b + [0] * c + [1] * 7, bool)
    z = np.array([0] * b + [1] * c + [1] * 7, bool)
    nb, nc, got = mcnemar_exact(a, z)
    assert (nb, nc) == (b, c)
    assert got == pytest.approx(exact_mcnemar(b, c), rel=1e-9, abs=1e-300)
    assert got == pytest.approx(p, rel=1e-9, abs=1e-300)


def test_mcnemar_exact_in_the_millions():
    n = 2_000_000
    a = np.zeros(n, bool)
    a[: n // 2 - 1000] = True
    _, _, p = mcnemar_exact(a, ~a)  # b = 999,000, c = 1,001,000: z ≈ 1.41
    assert p == pytest.approx(0.1575, abs=2e-3)  # the normal approximation, 0.15751, is good here


def test_topk_and_schedule_and_bn_weight():
    logits = np.array([[0.1, 0.5, 0.2], [0.9, 0.0, 0.3]])
    assert (label_rank(logits, np.array([2, 2])) < 1).tolist() == [False, False]
    assert (label_rank(logits, np.array([2, 2])) < 2).tolist() == [True, True]
    warm = [lr_at(s, base=1.0, total_steps=10, warmup_steps=2, schedule="constant") for s in range(4)]
    assert warm == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])  # both warm-up steps below the lr
    assert lr_at(10, base=1.0, total_steps=10) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(6, base=1.0, total_steps=10, schedule="exp", decay_rate=0.5, steps_per_epoch=3) == 0.25
    assert bn_weight(0.99) == 0.01 and bn_weight(0.9) == pytest.approx(0.1)


def test_exp_schedule_decay_period():
    """Seed 003's exponential schedule: ×rate every decay_epochs epochs after warmup (EfficientNet's
    ×0.97 every 2.4), from the CLI's flags through TrainConfig to the trainer's per-step lr."""
    from types import SimpleNamespace

    from hloforge.cli import parser, train_config
    from hloforge.train.trainer import Run

    kw = dict(base=1.0, total_steps=100, schedule="exp", decay_rate=0.97, steps_per_epoch=10, decay_epochs=2.4)
    assert lr_at(0, **kw) == 1.0
    assert lr_at(24, **kw) == pytest.approx(0.97)  # one period: 2.4 epochs of 10 steps
    assert lr_at(48, **kw) == pytest.approx(0.97 ** 2)
    assert lr_at(12, **kw) == pytest.approx(0.97 ** 0.5)
    assert lr_at(5 + 24, **kw, warmup_steps=5) == pytest.approx(0.97)  # the decay starts after warmup
    assert lr_at(24, **{**kw, "decay_epochs": 1.0}) == pytest.approx(0.97 ** 2.4)  # the default: per epoch
    args = parser().parse_args(["train", "mlp", "--schedule", "exp", "--decay-rate", "0.97", "--decay-epochs", "2.4"])
    c = train_config(args)
    assert (c.schedule, c.decay_rate, c.decay_epochs) == ("exp", 0.97, 2.4)
    assert TrainConfig().decay_epochs == 1.0
    c = TrainConfig(lr=1.0, epochs=10, schedule="exp", decay_epochs=2.4)
    fake = SimpleNamespace(cfg=c, variant=SimpleNamespace(accum=2), steps_per_epoch=20,
                           origin=(0, 0))  # 10 updates per epoch
    assert Run.lr(fake, 2 * 24) == pytest.approx(0.97)
    with pytest.raises(HloforgeError, match=r"^decay_epochs must be positive, got 0.0$"):
        TrainConfig(decay_epochs=0.0).check()
    assert main(["train", "mlp", "--decay-epochs", "0"]) == 2


# ------------------------------------------------------------------ runs
def test_main_job_reaches_97_percent_and_leaves_a_readable_run(tmp_path):
    m = train(cfg(tmp_path, epochs=5), progress=False)
    assert m["top1"] >= 0.97, m
    d = tmp_path / "run"
    assert {"config.toml", "metrics.jsonl", CHECKPOINT, "eval_correct.npz", "curves.png"} <= set(os.listdir(d))
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4, 5]
    assert epochs[-1]["n"] == 360  # every test image scored once, the short last batch included (360 = 5·64 + 40)


def test_eval_prints_the_same_top1_as_training(tmp_path, capsys):
    m = train(cfg(tmp_path), progress=False)
    capsys.readouterr()
    res = evaluate_checkpoint(str(tmp_path / "run"))
    assert res.top1 == m["correct"] and res.n == m["n"]
    assert main(["eval", str(tmp_path / "run")]) == 0
    assert f"({m['correct']}/{m['n']})" in capsys.readouterr().out


def test_config_toml_reproduces_the_run(tmp_path):
    a = train(cfg(tmp_path, "a", epochs=1), progress=False)
    assert main(["train", "--config", str(tmp_path / "a" / "config.toml"), "--run-dir", str(tmp_path / "b"),
                 "--no-progress"]) == 0
    pa, pb = params_of(tmp_path / "a"), params_of(tmp_path / "b")
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert a["epoch"] == 1


def test_resume_after_a_crash_mid_checkpoint_is_bit_identical(tmp_path):
    """Kill the process while it writes epoch 2's checkpoint: epoch 1's stays whole, and
    resuming to the end equals an uninterrupted run bit for bit."""
    train(cfg(tmp_path, "straight", epochs=3), progress=False)
    crashed = tmp_path / "crashed"
    env = {**os.environ, ckpt.FAULT_ENV: "2"}
    argv = [sys.executable, "-m", "hloforge.cli", "train", "--epochs", "3", "--run-dir", str(crashed),
            "--no-progress"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr
    _, meta = ckpt.load_checkpoint(str(crashed / CHECKPOINT))
    assert meta["epoch"] == 1
    with open(crashed / "metrics.jsonl", "a") as f:  # a kill mid-line of the buffered step lines
        f.write('{"kind": "step", "st')
    r = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "resumed after epoch 1" in r.stdout
    # epoch 2 was logged before the kill: logged once, not twice; the torn line is gone; no temp file is left
    rows = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "epoch"] == [1, 2, 3]
    assert sorted(os.listdir(crashed)) == sorted(os.listdir(tmp_path / "straight"))
    a, b = params_of(tmp_path / "straight"), params_of(crashed)
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_refusals(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HLOFORGE_BACKEND", "xla")  # it checks an xla run is refused on iree, whatever the env says
    train(cfg(tmp_path, epochs=1), progress=False)
    run = str(tmp_path / "run")
    with pytest.raises(HloforgeError, match="already holds a checkpoint"):
        train(cfg(tmp_path, epochs=1), progress=False)
    with pytest.raises(HloforgeError, match="already finished"):
        train(cfg(tmp_path, epochs=1), resume=True, progress=False)
    with pytest.raises(DataError, match="is of net 'mnist-mlp', not 'mnist-linear'"):
        train(cfg(tmp_path, net="mnist-linear", epochs=2), resume=True, progress=False)
    with pytest.raises(DataError, match="variant"):
        train(cfg(tmp_path, optimizer="sgd", epochs=2), resume=True, progress=False)
    with pytest.raises(DataError, match="backend 'xla', not 'iree'"):
        from hloforge.train.rundir import check_matches
        from hloforge.zoo import get_net

        _, meta = ckpt.load_checkpoint(os.path.join(run, CHECKPOINT))
        check_matches(run, meta, get_net("mnist-mlp"), cfg(tmp_path).variant(), "iree")
    # A truncated checkpoint is one clear error, not a crash.
    path = os.path.join(run, CHECKPOINT)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 3])
    assert main(["eval", run]) == 3
    assert "truncated" in capsys.readouterr().err


def test_compare_refuses_different_eval_sets(tmp_path, capsys):
    train(cfg(tmp_path, "a", epochs=1), progress=False)
    train(cfg(tmp_path, "b", epochs=1, seed=1), progress=False)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "McNemar exact p =" in capsys.readouterr().out
    z = dict(np.load(tmp_path / "b" / "eval_correct.npz"))
    z["set_id"] = np.array("digits:test:360:0000")
    np.savez(tmp_path / "b" / "eval_correct.npz", **z)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 3
    assert "different eval sets" in capsys.readouterr().err


def test_nan_loss_stops_with_the_step_and_keeps_the_checkpoint(tmp_path):
    train(cfg(tmp_path, epochs=1), progress=False)
    with pytest.raises(HloforgeError, match=r"loss is nan at step \d+ \(epoch 2"):
        train(cfg(tmp_path, epochs=2, lr=1e30), resume=True, progress=False)
    _, meta = ckpt.load_checkpoint(str(tmp_path / "run" / CHECKPOINT))
    assert meta["epoch"] == 1 and math.isfinite(meta["step"])


@pytest.mark.parametrize("argv,rc,needle", [
    (["train", "--epochs", "0"], 2, "argument --epochs: expected an integer ≥ 1, got '0'"),  # usage (argparse)
    (["train", "--lr", "-1"], 2, "argument --lr: expected a finite number > 0"),
    # bad input (HloforgeError); was "cannot read it as TOML ([Errno 2] No such file or directory: ...)"
    (["train", "--config", "/nonexistent.toml"], 3, "hloforge: error: config /nonexistent.toml: no such file or "
                                                    "directory; expected a config file (TOML), as a run's config.toml"),
    (["train", "--batch", "5000"], 3, "larger than the 1437-example training split"),
    # before: trained into r, the tag dropped without a word
    (["train", "--tag", "x", "--run-dir", "r"], 3, "--tag 'x' ends the default run directory's name"),
])
def test_bad_train_options(argv, rc, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == rc
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert os.listdir(tmp_path) == []  # nothing written (no runs/, no --run-dir)


def test_cross_backend_resume_needs_the_flag(tmp_path, monkeypatch):
    pytest.importorskip("iree.runtime")
    monkeypatch.setenv("HLOFORGE_BACKEND", "xla")  # trained on xla, resumed on iree, whatever the env says
    train(cfg(tmp_path, epochs=1), progress=False)
    with pytest.raises(DataError, match="--cross-backend"):
        train(cfg(tmp_path, epochs=2, backend="iree"), resume=True, progress=False)
    m = train(cfg(tmp_path, epochs=2, backend="iree"), resume=True, cross_backend=True, progress=False)
    assert m["epoch"] == 2 and m["top1"] > 0.9


def test_eval_region_ema_is_refused_without_a_shadow(tmp_path, capsys):
    train(cfg(tmp_path, epochs=1), progress=False)
    assert main(["eval", str(tmp_path / "run"), "--region", "ema"]) == 3
    assert "no EMA shadow" in capsys.readouterr().err


def test_cam_writes_a_heatmap_overlay(tmp_path, capsys):
    train(cfg(tmp_path, net="mnist-cnn", epochs=1), progress=False)
    out = tmp_path / "cam.png"
    assert main(["cam", str(tmp_path / "run"), "test:3", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["cam", str(tmp_path / "run"), "test:9999", "--out", str(out)]) == 3
    assert "expected test:N with 0 ≤ N < 360" in capsys.readouterr().err
