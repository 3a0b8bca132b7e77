"""fp8 (E4M3) training: the host-side projection, one step against a hand-computed update at the
quantized operands, and short digits runs of the trainer."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hloforge.core.errors import HloforgeError
from hloforge.core.spec import ParamSlot
from hloforge.core.variant import Variant
from hloforge.train.fp8 import E4M3_MAX, channel_axis, fp8_train_step, quantize_e4m3, quantize_params
from hloforge.train.session import TrainSession, make_backend
from hloforge.train.trainer import TrainConfig, train
from hloforge.zoo import get_net


def on_grid(q: np.ndarray, scale: np.ndarray) -> bool:
    v = q / scale
    return bool(np.all(v.astype(ml_dtypes.float8_e4m3fn).astype(np.float32) == v))


def test_per_channel_projection_is_on_the_grid_and_keeps_each_channel_max() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 5)) * np.array([1e-3, 1, 10, 100, 0.5])).astype(np.float32)
    w[:, 4] = 0.0  # an all-zero column stays zero (no 0/0)
    q = quantize_e4m3(w, channel_axis=-1)
    amax = np.abs(w).max(axis=0, keepdims=True)
    scale = np.where(amax > 0, amax / E4M3_MAX, 1.0)
    assert on_grid(q, scale)
    np.testing.assert_array_equal(np.abs(q).max(axis=0), amax[0])  # each column's max is exact
    assert np.all(q[:, 4] == 0)
    # E4M3 keeps 3 mantissa bits: relative error ≤ 2⁻⁴ in the normal range (here every entry ≥ 2⁻⁶·scale)
    big = np.abs(w) >= scale * 2.0**-6
    assert np.all(np.abs(q - w)[big] <= np.abs(w)[big] * 2.0**-4 + 1e-12)
    np.testing.assert_array_equal(quantize_e4m3(q, channel_axis=-1), q)  # a projection: idempotent


def test_which_slots_are_quantized_and_along_which_axis() -> None:
    assert channel_axis(ParamSlot("w", (8, 3, 3, 3), "he_fan_out", True)) == 0  # conv: per output channel
    assert channel_axis(ParamSlot("w", (784, 10), "glorot", True)) == -1  # dense: per output column
    for init in ("zeros", "ones", "layer_scale"):
        assert channel_axis(ParamSlot("b", (10,), init, False)) is None
    conv = np.random.default_rng(1).standard_normal((4, 2, 3, 3)).astype(np.float32)
    b = np.ones(4, np.float32) * 0.1234567
    qc, qb = quantize_params([conv, b], [ParamSlot("w", conv.shape, "he_fan_out", True),
                                         ParamSlot("b", (4,), "zeros", False)])
    np.testing.assert_array_equal(np.abs(qc).max(axis=(1, 2, 3)), np.abs(conv).max(axis=(1, 2, 3)))
    np.testing.assert_array_equal(qb, b)  # biases stay fp32


def test_one_fp8_step_folds_the_update_at_the_quantized_operands_into_the_master() -> None:
    spec = get_net("mnist-linear")
    rng = np.random.default_rng(2)
    init = [p + rng.standard_normal(p.shape).astype(np.float32) * 0.01 for p in spec.init_params(0)]
    s = TrainSession(spec, Variant("sgd"), 16, make_backend("xla"), params=init)
    x = rng.standard_normal((16, 784)).astype(np.float32)
    y = rng.integers(0, 10, 16).astype(np.int32)
    fp8_train_step(s, x, y, 0.5)
    w, b = init
    wq, xq = quantize_e4m3(w, -1).astype(np.float64), quantize_e4m3(x).astype(np.float64)
    z = xq @ wq + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = (p - np.eye(10)[y]) / 16
    want = [w - 0.5 * (xq.T @ d), b - 0.5 * d.sum(0)]  # the fp32 master minus lr·∇ at (Wq, xq)
    got = s.read_params()
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(got[0], quantize_e4m3(got[0], -1))  # θ between steps is the fp32 master


def test_fp8_with_an_ema_shadow_is_refused(tmp_path) -> None:
    with pytest.raises(HloforgeError, match="fp8 with an EMA shadow"):
        train(TrainConfig(net="mnist-linear", epochs=1, precision="fp8", ema=0.9, run_dir=str(tmp_path)),
              log=lambda s: None, progress=False)


def test_fp8_on_a_net_of_token_ids_is_refused_before_the_compile(tmp_path, capsys) -> None:
    """E4M3 rounds most ids to other ids: the run failed after its compile, blaming the data's ids."""
    from hloforge.cli import main

    assert main(["train", "tinygpt-nano", "--data", "text", "--precision", "fp8", "--epochs", "1", "--no-progress",
                 "--run-dir", str(tmp_path / "run")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hloforge: error: precision fp8 with net 'tinygpt-nano', whose input is token ids (vocabulary 65): "
                   "E4M3 cannot hold the ids, the input would be other tokens; expected precision fp32"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("net", ["mnist-linear", "mnist-mlp"])
def test_fp8_training_on_digits_tracks_fp32(tmp_path, net) -> None:
    top = {}
    for precision in ("fp32", "fp8"):
        m = train(TrainConfig(net=net, epochs=2, batch=64, optimizer="sgd", lr=0.1, precision=precision,
                              run_dir=str(tmp_path / precision)), log=lambda s: None, progress=False)
        top[precision] = m["top1"]
    assert top["fp8"] > 0.85 and abs(top["fp8"] - top["fp32"]) < 0.05, top
