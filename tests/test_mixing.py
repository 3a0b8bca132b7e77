"""Mixup / cutmix on the host: soft targets with the smoothing in them, deterministic per step,
and a soft-label run through the trainer."""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.core.errors import HloforgeError
from hloforge.train.mixing import Mixer, smooth_one_hot
from hloforge.train.trainer import TrainConfig, train


def test_smooth_one_hot_is_timms() -> None:
    t = smooth_one_hot(np.array([2, 0]), 4, 0.1)
    np.testing.assert_allclose(t[0], [0.025, 0.025, 0.925, 0.025])
    np.testing.assert_allclose(t.sum(1), 1.0)


def test_mixup_blends_images_and_targets_with_one_lambda() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 1, 4, 4)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 4, 5])
    xm, t = Mixer(6, mixup=0.4, label_smoothing=0.1).mix(x, y, seed=1, step=3)
    lam = (xm[0] - x[5]).ravel() @ (x[0] - x[5]).ravel() / np.sum((x[0] - x[5]) ** 2)
    np.testing.assert_allclose(xm, lam * x + (1 - lam) * x[::-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t, lam * smooth_one_hot(y, 6, 0.1) + (1 - lam) * smooth_one_hot(y[::-1], 6, 0.1),
                               atol=1e-6)
    np.testing.assert_allclose(t.sum(1), 1.0, atol=1e-6)
    xm2, t2 = Mixer(6, mixup=0.4, label_smoothing=0.1).mix(x, y, seed=1, step=3)  # (seed, step) alone
    np.testing.assert_array_equal(xm2, xm)
    assert not np.array_equal(Mixer(6, mixup=0.4).mix(x, y, seed=1, step=4)[0], xm)


def test_cutmix_pastes_a_box_and_weights_targets_by_its_area() -> None:
    x = np.zeros((2, 1, 8, 8), np.float32)
    x[1] = 1.0  # image 0 is all 0, image 1 all 1: the pasted box is visible in image 0
    for step in range(1, 20):
        xm, t = Mixer(3, cutmix=1.0).mix(x, np.array([0, 1]), seed=0, step=step)
        area = xm[0].sum() / 64  # the share of image 0 that came from image 1
        np.testing.assert_allclose(t[0], [1 - area, area, 0.0], atol=1e-6)


def test_cutmix_needs_an_image(tmp_path) -> None:
    with pytest.raises(HloforgeError, match="cutmix pastes a box"):
        train(TrainConfig(net="mnist-mlp", epochs=1, cutmix=1.0, run_dir=str(tmp_path)), log=lambda s: None,
              progress=False)


def test_a_mixup_run_trains_on_soft_labels(tmp_path) -> None:
    m = train(TrainConfig(net="mnist-linear", epochs=2, batch=64, optimizer="sgd", lr=0.1, mixup=0.2,
                          label_smoothing=0.1, run_dir=str(tmp_path)), log=lambda s: None, progress=False)
    assert m["top1"] > 0.85
