"""The EMA shadow's BatchNorm statistics (seed 003's `ema_bn`): kept beside the running ones, scored
with the shadow, and a checkpoint without them refused for the shadow."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from hloforge.cli import main
from hloforge.commands import opening
from hloforge.commands.opening import evaluate_checkpoint
from hloforge.core.errors import DataError
from hloforge.core.variant import ema_decay_at
from hloforge.train import checkpoint as ckpt
from hloforge.train import evaluation
from hloforge.train.trainer import CHECKPOINT, Run, TrainConfig, train

QUIET = {"log": lambda s: None, "progress": False}


def bn_net(tmp_path) -> str:
    """Two conv+BN units on 28×28 digits: small enough to compile and train in seconds."""
    path = tmp_path / "bn-net.json"
    path.write_text(json.dumps({"name": "bn-net", "input_shape": [1, 28, 28], "num_classes": 10, "layers": [
        {"kind": "convBn", "out": 8, "stride": 2}, {"kind": "convBn", "out": 16, "stride": 2},
        {"kind": "flatten"}, {"kind": "dense", "units": 10}]}))
    return str(path)


def test_shadow_stats_move_at_the_shadows_cadence_with_its_decay(tmp_path) -> None:
    run = Run(TrainConfig(net=bn_net(tmp_path), batch=64, epochs=1, accum=2, ema=0.9,
                          run_dir=str(tmp_path / "r")), progress=False, log=lambda s: None)
    assert run.stat_names and len(run.shadow_running) == len(run.running)
    start = [e.copy() for e in run.shadow_running]
    run.running = [r + 1.0 for r in run.running]
    run._track_shadow_stats(1)  # micro-batch 1 of 2 applies nothing: the shadow has not moved
    assert all(np.array_equal(e, s) for e, s in zip(run.shadow_running, start, strict=True))
    run._track_shadow_stats(2)  # update 0: decay min(0.9, 1/10)
    d = ema_decay_at(0.9, 0)
    assert d == pytest.approx(0.1)
    for e, s, r in zip(run.shadow_running, start, run.running, strict=True):
        np.testing.assert_allclose(e, d * s + (1 - d) * r, rtol=1e-6)
    mnist = Run(TrainConfig(net="mnist-mlp", epochs=1, run_dir=str(tmp_path / "m"), ema=0.9), progress=False,
                log=lambda s: None)
    assert mnist.shadow_running == []  # no BatchNorm, nothing to shadow


def test_the_shadow_is_scored_with_its_own_bn_stats_and_a_checkpoint_without_them_is_refused(tmp_path, capsys,
                                                                                              monkeypatch) -> None:
    # Top-1 counts on digits barely move with the BN statistics, so compare the logits themselves.
    logits: list[np.ndarray] = []
    score = evaluation.evaluate

    def spy(evaluator, buffers, x, y):
        logits.append(evaluator.logits(x, buffers))
        return score(evaluator, buffers, x, y)

    monkeypatch.setattr(evaluation, "evaluate", spy)  # the run's (through its task) and the eval command's
    monkeypatch.setattr(opening, "evaluate", spy)
    run_dir = tmp_path / "r"
    m = train(TrainConfig(net=bn_net(tmp_path), epochs=2, batch=64, lr=3e-3, ema=0.9, run_dir=str(run_dir)), **QUIET)
    live_logits, shadow_logits = logits[-2:]  # the last epoch scores the live weights, then the shadow
    # the scorer's number for each region is the one the training run printed for it, to the image and the bit
    assert evaluate_checkpoint(str(run_dir), region="ema", log=lambda s: None).top1 == m["correct_ema"]
    assert np.array_equal(logits[-1], shadow_logits)
    assert evaluate_checkpoint(str(run_dir), region="auto", log=lambda s: None).top1 == m["correct_ema"]
    assert np.array_equal(logits[-1], shadow_logits)
    assert evaluate_checkpoint(str(run_dir), region="live", log=lambda s: None).top1 == m["correct"]
    assert np.array_equal(logits[-1], live_logits) and not np.array_equal(live_logits, shadow_logits)

    file = str(run_dir / CHECKPOINT)
    tensors = load_file(file)
    stats = sorted(n.removeprefix("stat/") for n in tensors if n.startswith("stat/") and "/E/" not in n)
    assert stats and all(f"{ckpt.SHADOW_STATS}/{n}" in tensors for n in stats)
    # the shadow's statistics lag the running ones: after 22 updates at decay ≤ 0.9 they differ everywhere
    for n in stats:
        live, shadow = tensors[f"stat/{n}"], tensors[f"{ckpt.SHADOW_STATS}/{n}"]
        assert shadow.shape == live.shape and not np.allclose(shadow, live, rtol=1e-3, atol=1e-4), n

    # The same checkpoint without the shadow's statistics: the shadow is refused, never scored with the
    # live ones; the live weights still score.
    with safe_open(file, "np") as f:
        meta = f.metadata()
    save_file({k: v for k, v in tensors.items() if not k.startswith(f"{ckpt.SHADOW_STATS}/")}, file, metadata=meta)
    for region in ("ema", "auto"):
        with pytest.raises(DataError, match="no BatchNorm statistics for its EMA shadow"):
            evaluate_checkpoint(str(run_dir), region=region, log=lambda s: None)
    assert evaluate_checkpoint(str(run_dir), region="live", log=lambda s: None).top1 == m["correct"]
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--region", "ema"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--region live" in err, err
    with pytest.raises(DataError, match="no BatchNorm statistics for its EMA shadow"):
        train(TrainConfig(net=bn_net(tmp_path), epochs=3, batch=64, lr=3e-3, ema=0.9, run_dir=str(run_dir)),
              resume=True, **QUIET)
    assert os.path.exists(file)


def test_bn_running_stats_under_accumulation_move_by_the_kth_root(tmp_path, monkeypatch) -> None:
    """Seed 003: under accumulation over k micro-batches the running statistics move once per
    MICRO-batch with weight 1 − m^(1/k), so k chained updates compose to one update at the
    momentum m per optimizer step. The run's stored statistics are replayed by hand from every
    micro-batch's batch statistics."""
    from hloforge.train.session import TrainSession

    seen: list[list[np.ndarray]] = []
    batch_stats = TrainSession.batch_stats

    def spy(self):
        out = batch_stats(self)
        seen.append([np.asarray(b, np.float64) for b in out])
        return out

    monkeypatch.setattr(TrainSession, "batch_stats", spy)
    k, m = 2, 0.9  # digits: 22 batches of 64 an epoch, 11 updates
    run_dir = tmp_path / "r"
    train(TrainConfig(net=bn_net(tmp_path), epochs=1, batch=64, accum=k, bn_momentum=m, run_dir=str(run_dir)),
          **QUIET)
    w = 1.0 - math.sqrt(0.9)  # by hand: the square root of the momentum, not 1 − m = 0.1
    assert (1.0 - w) ** 2 == pytest.approx(m) and abs(w - 0.1) > 0.04
    run = Run(TrainConfig(net=bn_net(tmp_path), run_dir=str(tmp_path / "fresh")), progress=False, log=lambda s: None)
    names, running = run.stat_names, [r.astype(np.float64) for r in run.running]
    assert seen and len(seen) % k == 0  # every micro-batch moved them
    for stats in seen:
        running = [r * (1.0 - w) + b * w for r, b in zip(running, stats, strict=True)]
    tensors = load_file(str(run_dir / CHECKPOINT))
    for n, r in zip(names, running, strict=True):
        np.testing.assert_allclose(tensors[f"{ckpt.STATS}/{n}"], r, rtol=1e-5, atol=1e-6)
    plain = [r.astype(np.float64) for r in run.running]  # the unrooted weight 1 − m ends elsewhere
    for stats in seen:
        plain = [r * m + b * (1.0 - m) for r, b in zip(plain, stats, strict=True)]
    assert not all(np.allclose(tensors[f"{ckpt.STATS}/{n}"], p, rtol=1e-3) for n, p in zip(names, plain, strict=True))
