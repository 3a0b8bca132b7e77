"""Segmentation: the U-Net layers and skip stack, the per-pixel losses and their probes, the
confusion-matrix scores with the BraTS Dice convention, and training on `shapes`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hloforge.core import modules
from hloforge.core.autodiff import inject_fault
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.spec import Ctx, NetSpec, walk_layers
from hloforge.losses.seg import Dice, DiceCE, PerPixelCE, PerPixelFocal
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.pool import MaxPool
from hloforge.plugins.layers.unet import BilinearUpsample, Concat, PushSkip, UnetDown, UnetUp
from hloforge.testing.gate import _client, _jax, gate_loss
from hloforge.train import segmentation as seg
from hloforge.zoo import get_net
from hloforge.zoo.unet import unet_spec


def run(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    exe = _client().compile(text)
    try:
        return [np.asarray(o) for o in exe.run(inputs)]
    finally:
        exe.close()


# ------------------------------------------------------------------ the zoo and the skip stack
def test_unet_has_the_reference_parameter_count():
    assert get_net("unet", classes=3).param_count() == 7_849_667
    spec = get_net("unet-mini")
    assert spec.walk()[-1].out_shape == (4, 32, 32)


def test_skip_stack_is_checked_by_the_walk():
    with pytest.raises(UnsupportedSpec, match=r"layer 0 \(unetUp.*takes a skip \[4, 8, 8\] but no earlier layer"):
        walk_layers([UnetUp(4)], (6, 4, 4))
    with pytest.raises(UnsupportedSpec, match=r"layer 0 \(unetDown.*leaves a skip \[4, 8, 8\] that no later"):
        walk_layers([UnetDown(4)], (3, 8, 8))
    with pytest.raises(UnsupportedSpec, match=r"layer 2 \(unetUp.*takes a skip \[5, 8, 8\] but the one layer 0 left "
                                              r"is \[4, 8, 8\]"):
        walk_layers([UnetDown(4), ConvBn(6), UnetUp(5)], (3, 8, 8))
    with pytest.raises(UnsupportedSpec, match="stride 2 does not divide the 7x7 input"):
        walk_layers([UnetDown(4), UnetUp(4)], (3, 7, 7))
    with pytest.raises(UnsupportedSpec, match=r"ends in shape \[3, 8, 8\], expected \[2\]"):
        NetSpec("bad", (3, 8, 8), [Conv2d(3, k=1)], 2).walk()


def _reference_net(layers, params, x):
    """The net's jax.numpy reference, one skip stack for the whole walk (training mode)."""
    walk = walk_layers(layers, tuple(x.shape[1:]))
    it, skips = iter(params), []
    for ls in walk:
        x = ls.layer.reference({s.name: next(it) for s in ls.slots}, x, Ctx(train=True, skips=skips))
    return x


def test_nested_skips_forward_and_backward_match_the_reference():
    """Two levels: the inner unetUp must meet the inner unetDown's skip (last in, first out)."""
    jax = _jax()
    spec = unet_spec("tiny", (2, 3), (4,), 3, (2, 8, 8))
    walk = spec.walk()
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s.shape) * 0.5 for _, s in spec.params()]
    x = rng.standard_normal((2, 2, 8, 8))
    gbar = rng.standard_normal((2, *walk[-1].out_shape))
    got = run(modules.vjp_module(spec.layers, spec.input_shape, 2, dtype="f64"), [*params, x, gbar])
    y, pull = jax.vjp(lambda ps, xv: _reference_net(spec.layers, ps, xv), params, x)
    dps, dx = pull(gbar)
    want = [np.asarray(y), *map(np.asarray, dps), np.asarray(dx)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11)


def test_unet_levels_equal_their_primitives():
    """unetDown = convBn, convBn, pushSkip, maxPool; unetUp = bilinearUpsample, concat, convBn, convBn."""
    blocks = [UnetDown(3), ConvBn(5), UnetUp(3)]
    prims = [ConvBn(3), ConvBn(3), PushSkip(), MaxPool(2), ConvBn(5),
             BilinearUpsample(2), Concat(3), ConvBn(3), ConvBn(3)]
    rng = np.random.default_rng(1)
    shape = (2, 6, 6)
    params = [rng.standard_normal(s.shape) for _, s in NetSpec("a", shape, blocks, 3).params()]
    assert [s.shape for _, s in NetSpec("b", shape, prims, 3).params()] == [p.shape for p in params]
    x = rng.standard_normal((2, *shape))
    a = run(modules.layers_forward_module(blocks, shape, 2, dtype="f64"), [*params, x])[0]
    b = run(modules.layers_forward_module(prims, shape, 2, dtype="f64"), [*params, x])[0]
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_bilinear_upsample_keeps_constants_and_clamps_edges():
    x = np.broadcast_to(np.arange(3.0)[None, None, None, :], (1, 1, 2, 3)).copy()
    y = run(modules.layers_forward_module([BilinearUpsample(2)], (1, 2, 3), 1, dtype="f64"), [x])[0]
    # half-pixel centres: output column j samples (j + 0.5)/2 − 0.5, clamped at the edges
    np.testing.assert_allclose(y[0, 0, 0], [0, 0.25, 0.75, 1.25, 1.75, 2])
    np.testing.assert_allclose(y[0, 0, 0], y[0, 0, 3])


# ------------------------------------------------------------------ the losses: probes, γ = 0, faults
LOSSES = [PerPixelCE(), PerPixelCE(label_smoothing=0.1), Dice(), Dice(eps=1e-3), DiceCE(label_smoothing=0.1),
          PerPixelFocal(), PerPixelFocal(gamma=0.5)]


@pytest.mark.parametrize("loss", LOSSES, ids=lambda v: repr(v))
def test_loss_probe_matches_elementwise_finite_differences(loss):
    """The probe module @main(logits, y) -> (loss, ∂loss/∂logits) in f64, every logit perturbed."""
    out_shape = (3, 2, 2)
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, *out_shape)) * 2
    y = loss.sample_labels(rng, 2, out_shape)
    exe = _client().compile(modules.loss_module(loss, out_shape, 2, dtype="f64"))
    try:
        value, grad = (np.asarray(o) for o in exe.run([logits, y]))
        h = 1e-6
        fd = np.zeros_like(logits)
        for i in np.ndindex(logits.shape):
            plus, minus = logits.copy(), logits.copy()
            plus[i] += h
            minus[i] -= h
            fd[i] = (float(np.asarray(exe.run([plus, y])[0])) - float(np.asarray(exe.run([minus, y])[0]))) / (2 * h)
    finally:
        exe.close()
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)
    jax = _jax()
    np.testing.assert_allclose(value, float(loss.reference(jax.numpy.asarray(logits), y)), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_focal_at_gamma_zero_is_cross_entropy_bit_for_bit(dtype):
    rng = np.random.default_rng(4)
    npt = np.float64 if dtype == "f64" else np.float32
    logits = (rng.standard_normal((3, 4, 5, 2)) * 3).astype(npt)
    y = rng.integers(0, 4, (3, 5, 2)).astype(np.int32)
    ce = run(modules.loss_module(PerPixelCE(), (4, 5, 2), 3, dtype=dtype), [logits, y])
    focal = run(modules.loss_module(PerPixelFocal(gamma=0.0), (4, 5, 2), 3, dtype=dtype), [logits, y])
    assert ce[0].tobytes() == focal[0].tobytes() and ce[1].tobytes() == focal[1].tobytes()
    # and γ > 0 is not CE: the easy pixels are down-weighted
    assert float(run(modules.loss_module(PerPixelFocal(), (4, 5, 2), 3, dtype=dtype), [logits, y])[0]) < float(ce[0])


@pytest.mark.parametrize("loss", [Dice(), PerPixelFocal(), PerPixelCE()], ids=lambda v: v.name)
def test_a_wrong_closed_form_backward_turns_the_gate_red(loss):
    assert gate_loss(loss, (3, 2, 3)).passed
    with inject_fault("custom") as calls:
        result = gate_loss(loss, (3, 2, 3))
    assert calls[0] > 0 and not result.passed and result.err_fd_f64 > 1e-4


def test_dice_values_and_dice_ce_smooths_only_its_ce_half():
    jnp = _jax().numpy
    y = np.array([[[0, 1], [1, 1]]], np.int32)
    perfect = np.where(np.arange(3)[None, :, None, None] == y[:, None], 30.0, -30.0)
    # classes 0 and 1 match exactly; class 2 is absent and unpredicted: ε/ε = 1 (no loss), not 0/0
    assert float(Dice().reference(jnp.asarray(perfect), y)) == pytest.approx(0.0, abs=1e-12)
    logits = np.random.default_rng(5).standard_normal((1, 3, 2, 2))
    both = DiceCE(label_smoothing=0.2).reference(jnp.asarray(logits), y)
    assert float(both) == pytest.approx(float(PerPixelCE(label_smoothing=0.2).reference(jnp.asarray(logits), y)
                                              + Dice().reference(jnp.asarray(logits), y)), rel=1e-12)
    with pytest.raises(UnsupportedSpec, match="gamma must be non-negative"):
        PerPixelFocal(gamma=-1.0)
    with pytest.raises(UnsupportedSpec, match="eps must be positive"):
        Dice(eps=0.0)
    with pytest.raises(UnsupportedSpec, match=r"perPixelCE takes per-pixel logits \[classes, H, W\], got \[5\]"):
        PerPixelCE().check((5,))


# ------------------------------------------------------------------ scores
def test_confusion_matrix_iou_and_pixel_accuracy_are_exact():
    gt = np.array([[[0, 0, 1], [1, 2, 2]]])
    pred = np.array([[[0, 1, 1], [1, 2, 0]]])
    conf = seg.confusion_matrix(gt, pred, 4)
    assert conf.dtype == np.int64
    assert conf.tolist() == [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    iou = seg.iou_per_class(conf)
    assert iou[:3].tolist() == [1 / 3, 2 / 3, 1 / 2] and np.isnan(iou[3])  # class 3: absent, no IoU
    assert seg.mean_iou(conf) == pytest.approx((1 / 3 + 2 / 3 + 1 / 2) / 3)
    assert seg.pixel_accuracy(conf) == 4 / 6
    with pytest.raises(DataError, match=r"prediction: mask labels span 4\.\.4, expected ids 0\.\.3"):
        seg.confusion_matrix(gt, np.full_like(gt, 4), 4)


def test_float_masks_are_refused_not_truncated_to_classes():
    """A dataset's float mask of 0.5s was cast to class 0 and scored: a plausible wrong mIoU."""
    gt = np.array([[[0, 0, 1], [1, 2, 2]]])
    with pytest.raises(DataError, match=r"^ground truth: mask labels have dtype float32, expected integer ids$"):
        seg.confusion_matrix(gt.astype(np.float32) + 0.5, gt, 3)
    with pytest.raises(DataError, match=r"^prediction: mask labels have dtype float64, expected integer ids$"):
        seg.confusion_matrix(gt, np.where(gt == 2, np.nan, gt), 3)
    assert seg.confusion_matrix(gt.astype(np.uint8), gt, 3).trace() == 6  # any integer dtype


def test_region_dice_with_the_brats_convention():
    from hloforge.datasets.brats import BRATS_REGIONS

    # 0 background, 1 edema, 2 non-enhancing, 3 enhancing
    gt = np.array([[[1, 1, 2, 0]]])
    pred = np.array([[[1, 2, 2, 3]]])
    conf = seg.confusion_matrix(gt, pred, 4)
    assert seg.region_counts(conf, BRATS_REGIONS["WT"]) == (3, 3, 4)  # exact ints
    assert seg.region_counts(conf, BRATS_REGIONS["TC"]) == (1, 1, 3)
    assert seg.region_counts(conf, BRATS_REGIONS["ET"]) == (0, 0, 1)
    d = seg.dice_by_region(conf, BRATS_REGIONS)
    assert d == {"WT": 6 / 7, "TC": 2 / 4, "ET": 0.0}  # ET: absent from the truth, predicted anyway → 0
    empty = seg.confusion_matrix(np.zeros((1, 2, 2), int), np.zeros((1, 2, 2), int), 4)
    assert seg.dice_by_region(empty, BRATS_REGIONS) == {"WT": 1.0, "TC": 1.0, "ET": 1.0}  # nothing to find, none found
    assert seg.region_dice(0, 5, 0) == 0.0
    # per image: the BraTS convention decides each image; over the set, the pooled counts
    confs = seg.confusion_matrices(np.array([[[3, 0]], [[0, 0]]]), np.array([[[3, 0]], [[0, 3]]]), 4)
    m = seg.scores(confs, {"ET": {3}})
    assert m["dice/ET"] == 2 / 3 and m["dice_img/ET"] == 0.5
    with pytest.raises(UnsupportedSpec, match=r"region 'X': labels \[7\] must be a non-empty subset of 0\.\.3"):
        seg.check_regions({"X": {7}}, 4)


# ------------------------------------------------------------------ training on shapes
def test_train_and_eval_a_tiny_unet_on_shapes(tmp_path, capsys, backend):
    from hloforge.cli import main

    spec = unet_spec("unet-tiny", (4,), (8,), 4, (3, 32, 32))
    path = tmp_path / "tiny.toml"
    path.write_text(spec.to_toml())
    run_dir = tmp_path / "run"
    assert main(["train", "--net", str(path), "--data", "shapes", "--epochs", "1", "--batch", "128",
                 "--backend", backend, "--run-dir", str(run_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "adam_lossperPixelCE" in out and "test mIoU" in out and "Dice circle" in out
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epoch = [r for r in rows if r["kind"] == "epoch"][-1]
    assert {"miou", "pixel_acc", "iou/0", "dice/foreground", "dice_img/triangle"} <= set(epoch)
    assert epoch["n"] == 256 and 0.0 <= epoch["miou"] <= 1.0
    assert not (run_dir / "eval_correct.npz").exists()  # a per-image bitmap is classification's
    assert main(["eval", str(run_dir)]) == 0
    assert f"test mIoU {epoch['miou']:.4f}" in capsys.readouterr().out
    assert main(["train", "--net", str(path), "--data", "digits", "--run-dir", str(tmp_path / "r2")]) == 3
    assert "no task trains net 'unet-tiny' (output [4, 32, 32]) on dataset 'digits' by default; pass --loss" in \
        capsys.readouterr().err
    assert main(["train", "--net", str(path), "--data", "digits", "--loss", "dice", "--run-dir",
                 str(tmp_path / "r3")]) == 3
    assert "predicts per-pixel classes [4, 32, 32]; dataset 'digits' has no per-pixel masks" in \
        capsys.readouterr().err


def test_a_segmenter_of_another_class_count_names_the_classes_that_fit(tmp_path, capsys):
    """unet-mini --classes 3 on shapes' 4 mask classes (or --input 4,S,S on brats without --classes 4) said the
    two counts and no way on, where a classifier's refusal names --classes; now the same."""
    from hloforge.cli import main

    assert main(["train", "unet-mini", "--classes", "3", "--data", "shapes", "--data-opt", "n_train=8", "--data-opt",
                 "n_test=4", "--batch", "4", "--run-dir", str(tmp_path / "r")]) == 3
    assert capsys.readouterr().err == ("hloforge: error: dataset 'shapes' has 4 mask classes, net 'unet-mini' predicts "
                                       "3; pass --classes 4 (hf.Model's classes=4) to give the net a head of 4\n")
    assert not (tmp_path / "r").exists()
