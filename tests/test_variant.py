"""The typed Variant: its slug round trip, the one state layout every consumer reads, the net it
trains, and the checkpoint refusals that layout makes possible."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hloforge.commands.opening import evaluate_checkpoint
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.modules import forward_module, train_step_module
from hloforge.core.registry import default_registry
from hloforge.core.variant import PRECISIONS, StateLayout, Variant
from hloforge.train.trainer import TrainConfig, train
from hloforge.zoo import get_net

REG = default_registry()
OPTIMIZERS = REG.names("optimizer")
LOSSES = [n for n in REG.names("loss") if re.match(r"^[A-Za-z][A-Za-z0-9]*$", n)]

unit = st.one_of(st.just(0.0), st.sampled_from([0.1, 0.5, 0.9999]),
                 st.floats(0.0, 1.0, exclude_max=True, allow_nan=False, allow_subnormal=True))
positive = st.floats(1e-12, 1e6, allow_nan=False)
nonneg = st.one_of(st.just(0.0), positive)
variants = st.builds(
    Variant,
    optimizer=st.sampled_from(OPTIMIZERS), weight_decay=st.one_of(st.none(), nonneg), loss=st.sampled_from(LOSSES),
    label_smoothing=unit, ema=unit, accum=st.integers(1, 64), clip=nonneg, mixup=nonneg, cutmix=nonneg,
    dropout=unit, drop_path=unit, bn_eps=st.one_of(st.none(), positive), precision=st.sampled_from(PRECISIONS))


@settings(max_examples=300, deadline=None)
@given(variants)
def test_slug_parses_back_to_the_same_variant(v: Variant) -> None:
    assert re.fullmatch(r"[A-Za-z0-9_]+", v.slug), v.slug  # an MLIR symbol and a file name as it is
    assert Variant.parse(v.slug) == v


@settings(max_examples=100, deadline=None)
@given(variants, variants)
def test_different_variants_have_different_slugs(a: Variant, b: Variant) -> None:
    assert (a.slug == b.slug) == (a == b)


def test_default_slugs_stay_what_artifacts_are_named() -> None:
    assert Variant().slug == "adam" and Variant("sgd").slug == "sgd"
    v = Variant("lamb", 0.02, "bce", ema=0.9999, accum=4, clip=1.0, mixup=0.1, cutmix=1.0, drop_path=0.05,
                bn_eps=1e-3, precision="fp8")
    assert v.slug == "lamb_wd0p02_ema0p9999_acc4_clip1_mixup0p1_cutmix1_drop0p05_eps0p001_lossbce_fp8"
    assert Variant.parse(v.slug) == v
    assert Variant(weight_decay=1e-5).slug == "adam_wd1em05"


@pytest.mark.parametrize("slug, what", [
    ("adam_acc1", "not canonical"),  # a default spelled out
    ("adam_clip1_ema0p5", "not canonical"),  # out of order
    ("adam_acc4_acc4", "twice"),
    ("adam_bogus3", "cannot read part"),
    ("adam_acc", "cannot read part"),
    ("adam_acc2p5", "needs a whole number after 'acc'"),
    ("adam_fp16", "cannot read part"),
])
def test_a_slug_that_is_not_a_rendering_is_refused(slug: str, what: str) -> None:
    with pytest.raises(HloforgeError, match=what):
        Variant.parse(slug)


@pytest.mark.parametrize("kw, what", [
    ({"accum": 0}, "accum"), ({"accum": 2.0}, "accum"), ({"ema": 1.0}, "ema"), ({"clip": -1.0}, "clip"),
    ({"precision": "fp16"}, "precision"), ({"optimizer": 3}, "optimizer name"), ({"dropout": 1.0}, "dropout"),
    ({"bn_eps": 0.0}, "bn_eps"), ({"mixup": float("nan")}, "mixup"),
])
def test_bad_options_are_one_clear_error(kw: dict, what: str) -> None:
    with pytest.raises(UnsupportedSpec, match=what):
        Variant(**kw)


# ------------------------------------------------------------------ the state layout
def layout(**kw) -> StateLayout:
    v = Variant(**kw)
    return v.state_layout(v.make_optimizer(REG))


def test_layout_regions_and_scalars_follow_the_seed_ordering() -> None:
    assert layout().slots == ("m", "v") and layout().scalars == ("lr", "bc1", "bc2")
    acc, ema, both = layout(accum=4), layout(ema=0.999), layout(accum=4, ema=0.999)
    assert acc.slots == ("m", "v", "G") and acc.scalars == ("lr", "bc1", "bc2", "accum_apply")
    assert ema.slots == ("m", "v", "E") and ema.scalars == ("lr", "bc1", "bc2", "ema_decay", "ema_weight")
    assert both.slots == ("m", "v", "G", "E")
    assert both.scalars == ("lr", "bc1", "bc2", "accum_apply", "ema_decay", "ema_weight")
    # G before E: a single-wrapper layout keeps its extra slot at the same region either way
    assert acc.region("G") == ema.region("E") == 3 and both.region("E") == 4
    with pytest.raises(UnsupportedSpec, match="no 'E' slot"):
        acc.region("E")
    assert layout(optimizer="sgd", ema=0.5).slots == ("E",) and layout(optimizer="rmsprop").slots == ("m", "v")


def test_the_train_step_signature_reads_the_layout() -> None:
    spec = get_net("mnist-linear")
    v = Variant("momentum", accum=2, ema=0.9, clip=1.0)
    text, lay = train_step_module(spec, v, 4)
    st_ = v.state_layout(v.make_optimizer(REG))
    assert lay.state == st_.slots == ("m", "G", "E") and lay.scalars == st_.scalars
    assert lay.n_carried == 2 * 4
    head = text.split("\n", 2)[1]
    assert head.count(f"tensor<{len(st_.scalars)}xf32>") == 1  # the scalars: one schedule vector
    assert head.count("tensor<f32>") == 1  # the loss


def test_host_scalars_carry_the_cadence_and_the_ema_warmup() -> None:
    v = Variant("sgd", accum=3, ema=0.99)
    opt = v.make_optimizer(REG)
    lay = v.state_layout(opt)
    rows = [lay.host_scalars(opt, t, 0.1) for t in range(1, 7)]
    assert [r[1] for r in rows] == [0, 0, 1, 0, 0, 1]  # accum_apply on every 3rd micro-batch
    assert rows[0][2] == pytest.approx(1 / 10) and rows[3][2] == pytest.approx(2 / 11)  # min(d, (1+t)/(10+t))
    assert all(r[2] + r[3] == pytest.approx(1.0) for r in rows)
    assert Variant("adam").state_layout(REG.make("optimizer", "adam")).host_scalars(
        REG.make("optimizer", "adam"), 2, 0.1) == pytest.approx([0.1, 1 - 0.9**2, 1 - 0.999**2])


def test_check_slots_names_the_missing_and_the_extra() -> None:
    names = ["param/0.w", "state/m/0.w", "state/v/0.w", "state/G/0.w"]
    layout(accum=2).check_slots("ckpt", names)  # the same layout: fine
    with pytest.raises(DataError, match=r"missing slot\(s\) \['E'\] and extra slot\(s\) \['G'\]"):
        layout(ema=0.9).check_slots("ckpt", names)
    with pytest.raises(DataError, match=r"extra slot\(s\) \['G'\]"):
        layout().check_slots("ckpt", names)


# ------------------------------------------------------------------ the net a variant trains
def test_apply_to_is_idempotent_and_renders_eval_at_the_variant_eps() -> None:
    mlp = get_net("mnist-mlp")
    v = Variant(dropout=0.2)
    once = v.apply_to(mlp)
    assert [layer.kind for layer in once.layers] == ["dense", "dense", "dropout", "dense"]
    assert v.apply_to(once) == once
    _, lay = train_step_module(once, v, 4)
    assert [n for n, _ in lay.masks] == ["2.mask"]
    res = get_net("resnet-mini")
    eps = Variant(bn_eps=1e-3)
    assert eps.eval_suffix == "_eps0p001"
    text = forward_module(eps.apply_to(res), 2, eval_mode=True)
    assert "dense<0x3A83126F>" in text and "dense<0x3727C5AC>" not in text  # f32 hex of 1e-3, of 1e-5
    with pytest.raises(UnsupportedSpec, match="no BatchNorm"):
        eps.apply_to(mlp)
    with pytest.raises(UnsupportedSpec, match="drop_path"):
        Variant(drop_path=0.1).apply_to(mlp)
    vit = Variant(drop_path=0.1).apply_to(get_net("vit-mini"))
    assert all(getattr(layer, "drop_path", 0.1) == 0.1 for layer in vit.layers)


def test_soft_labels_come_from_mixing_and_need_a_soft_loss() -> None:
    spec = get_net("mnist-linear")
    _, lay = train_step_module(spec, Variant("sgd", mixup=0.2, label_smoothing=0.1), 4)
    assert lay.y_shape == (4, 10) and lay.y_dtype == "f32"
    _, lay = train_step_module(spec, Variant("sgd", loss="bce", cutmix=1.0), 4)
    assert lay.y_shape == (4, 10)
    with pytest.raises(UnsupportedSpec, match="takes no soft labels"):
        Variant("sgd", loss="focalCrossEntropy", mixup=0.2).make_loss(REG)


# ------------------------------------------------------------------ checkpoints and the scorer
def test_a_checkpoint_of_another_layout_is_refused_naming_the_slots(tmp_path) -> None:
    base = {"net": "mnist-linear", "epochs": 1, "batch": 64, "run_dir": str(tmp_path / "r"), "optimizer": "sgd",
            "lr": 0.05}
    m = train(TrainConfig(**base, ema=0.9), log=lambda s: None, progress=False)
    assert 0.5 < m["top1_ema"] <= 1.0
    # the scorer finds the shadow through the layout: the number the run printed, to the image
    assert evaluate_checkpoint(str(tmp_path / "r"), region="ema", log=lambda s: None).top1 == m["correct_ema"]
    assert evaluate_checkpoint(str(tmp_path / "r"), region="auto", log=lambda s: None).top1 == m["correct_ema"]
    assert evaluate_checkpoint(str(tmp_path / "r"), region="live", log=lambda s: None).top1 == m["correct"]
    # another variant is named by the fields that differ, before its slots (check_slots' own test is above)
    with pytest.raises(HloforgeError, match=r"was trained with ema=0\.9, accum=1, not ema=0\.0, accum=2; expected its "
                                            r"own variant"):
        train(TrainConfig(**{**base, "epochs": 2}, accum=2), resume=True, log=lambda s: None, progress=False)


def test_accumulation_that_does_not_divide_an_epoch_is_refused(tmp_path) -> None:
    with pytest.raises(HloforgeError, match="22 batches of an epoch do not divide into updates of 4"):
        train(TrainConfig(net="mnist-linear", epochs=1, batch=64, accum=4, run_dir=str(tmp_path)),
              log=lambda s: None, progress=False)
