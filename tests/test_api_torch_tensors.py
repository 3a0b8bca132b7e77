"""Torch tensors as a PyTorch user hands them to `hf.Model`: an nn.Parameter or a forward's output (requires grad)
and bfloat16 ones, which np.asarray cannot read, are read as their float32 values, as other float dtypes are.
Before: torch's RuntimeError ("Can't call numpy() on Tensor that requires grad") or TypeError ("Got unsupported
ScalarType BFloat16") out of fit, predict, evaluate and the params setter."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf

torch = pytest.importorskip("torch", reason="the tensors are torch's")


def test_tensors_that_require_grad_or_are_bfloat16_are_read_as_their_values() -> None:
    net = hf.NetSpec("tiny", (6,), [hf.layers.Dense(5, act="relu"), hf.layers.Dense(3)], 3)
    model = hf.Model(net, seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    init = model.params
    model.params = {n: torch.nn.Parameter(torch.from_numpy(w) * 2) for n, w in init.items()}
    assert all(np.array_equal(model.params[n], w * 2) for n, w in init.items())
    grad_x = torch.from_numpy(x).requires_grad_()
    want = model.predict(x)
    np.testing.assert_array_equal(model.predict(grad_x), want)
    halved = torch.from_numpy(x).to(torch.bfloat16)
    np.testing.assert_array_equal(model.predict(halved), model.predict(halved.float().numpy()))
    scores = model.evaluate(grad_x, torch.from_numpy(y))
    assert scores == model.evaluate(x, y)
    history = model.fit(grad_x, torch.from_numpy(y), epochs=1, batch_size=4, verbose=False)
    assert len(history) == 1 and np.isfinite(history[0]["loss"])


def test_batches_of_such_tensors_are_read_too() -> None:
    # A DataLoader under autocast yields bfloat16 x; before, TypeError ("Got unsupported ScalarType BFloat16").
    net = hf.NetSpec("tiny", (6,), [hf.layers.Dense(5, act="relu"), hf.layers.Dense(3)], 3)
    rng = np.random.default_rng(0)
    x, y = torch.from_numpy(rng.standard_normal((8, 6)).astype(np.float32)), torch.from_numpy(rng.integers(0, 3, 8))
    batches = [(x[:4].to(torch.bfloat16), y[:4]), (x[4:].requires_grad_(), y[4:])]
    history = hf.Model(net, seed=0).fit(batches, epochs=1, verbose=False)
    assert len(history) == 1 and np.isfinite(history[0]["loss"])
