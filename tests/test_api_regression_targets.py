"""Regression targets given to a net hloforge trains no regression on are told so first: before, the user heard
that y's shape was wrong (a classifier's [N], or mse's [N, 10] of a classifier's logits), a fix that fixes
nothing; the real reason came only once the shape matched."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError

X = np.zeros((64, 784), np.float32)
RNG = np.random.default_rng(0)
NO_DDPM = ("mse wants float targets shaped like the net's output ([N, 10]) and trains only a DDPM (images plus a "
           "time channel [C + 1, ...] to their noise [C, ...]), which a net from [784] to [10] is not")


def said(call) -> str:
    with pytest.raises(DataError) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("y", [RNG.random(64, np.float32), RNG.random((64, 1), np.float32),
                               RNG.random((64, 3), np.float32)], ids=["[N]", "[N, 1]", "[N, 3]"])
def test_real_targets_to_a_classifier_are_said_as_regression_first(y) -> None:
    """Before: 'fit labels have shape [64, 3], expected [64]' (or of dtype float32 for [N])."""
    m = hf.Model("mnist-linear")
    for call, what in ((lambda: m.fit(X, y, batch_size=32, verbose=False), "fit"),
                       (lambda: m.evaluate(X, y), "evaluate")):
        assert said(call) == (f"{what} labels are real numbers (float32, not whole): regression targets? the loss "
                              "trains on classes, not on real values; expected integer class ids of shape [64] (int32)")


def test_one_hot_and_whole_number_labels_keep_their_own_fix() -> None:
    m = hf.Model("mnist-linear")
    assert said(lambda: m.evaluate(X, np.eye(10, dtype=np.float32)[np.arange(64) % 10])).endswith(
        "(one-hot rows of the 10 classes? y.argmax(1) gives the ids)")
    assert said(lambda: m.evaluate(X, (np.arange(64) % 10).astype(np.float32))).endswith(
        "(whole numbers: y.astype(np.int64) gives the ids)")


@pytest.mark.parametrize("y, gives", [(RNG.random(64, np.float32), "float targets of shape [N]"),
                                      (RNG.random((64, 1), np.float32), "float targets of shape [N, 1]"),
                                      (np.arange(64) % 10, "integer class indices of shape [N]")])
def test_mse_on_a_net_that_is_no_ddpm_says_so_before_ys_shape(y, gives) -> None:
    """Before: 'fit labels have shape [64], expected [64, 10]', as if [N, 10] floats would train it."""
    m = hf.Model("mnist-mlp", loss="mse")
    for call in (lambda: m.fit(X, y, batch_size=32, verbose=False), lambda: m.evaluate(X, y)):
        line = said(call)
        assert line.startswith(f"loss 'mse' does not fit net 'mnist-mlp' on dataset 'arrays': the dataset gives "
                               f"{gives}; {NO_DDPM}; "), line
