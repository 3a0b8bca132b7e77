"""What the train and eval paths refuse before anything runs: config values, batches, checkpoints
of another net; and what a non-finite run leaves behind (issue 22)."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hloforge.cli import main
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.f32 import F32_MAX, F32_TINY
from hloforge.train.config import TAG_FORBIDDEN
from hloforge.train.trainer import TrainConfig, load_config


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ------------------------------------------------------------------ config values
@pytest.mark.parametrize("field,value", [
    ("warmup_epochs", math.inf), ("warmup_epochs", -1.0), ("lr", math.nan), ("decay_rate", -math.inf),
    ("clip", math.inf), ("beta_end", math.nan), ("weight_decay", -0.5), ("seed", -3), ("epochs", 2.5),
    ("batch", True), ("lr", "0.1"), ("tag", 7), ("input", "3,32,32"), ("input", [3, -1]), ("data_options", 5),
])
def test_a_bad_config_value_is_refused_naming_it(field, value):
    with pytest.raises(UnsupportedSpec, match=rf"^(config value )?{field}\b"):
        TrainConfig(**{field: value})


# given as FLAG=VALUE: argparse reads a bare -inf as a flag
@pytest.mark.parametrize("flag,value", [("--warmup-epochs", "inf"), ("--lr", "nan"), ("--weight-decay", "-inf"),
                                        ("--clip", "inf"), ("--seed", "-1"), ("--beta-end", "nan")])
def test_a_non_finite_or_negative_train_flag_is_one_line_and_writes_nothing(flag, value, capsys, tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", f"{flag}={value}", "--epochs", "1"]) != 0
    line = one_line_error(capsys)  # the CLI refuses it naming the flag; the config, naming its field
    assert flag in line or flag.removeprefix("--").replace("-", "_") in line
    assert not (tmp_path / "runs").exists()


def test_a_config_file_with_infinity_is_refused(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text("warmup_epochs = inf\n")  # what a TOML writer may hold; the config refuses it
    assert main(["train", "--config", str(path), "--run-dir", str(tmp_path / "r")]) != 0
    assert "warmup_epochs" in one_line_error(capsys)
    assert not (tmp_path / "r").exists()


finite = st.just(0.0) | st.floats(min_value=F32_TINY, max_value=F32_MAX)  # what f32 holds (core.f32.f32_holds)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # any Unicode scalar value


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tag=text.filter(lambda s: not s.startswith(".") and not set(s) & set(TAG_FORBIDDEN)),  # a tag names a dir
       data_dir=text, opts=st.lists(text.map(lambda s: f"k={s.strip() or 'v'}"), max_size=3),
       lr=finite.filter(lambda v: v > 0), warmup=finite, beta=finite, wd=st.none() | finite,
       dims=st.none() | st.lists(st.integers(1, 2**40), min_size=1, max_size=3))
def test_config_toml_reads_back_equal(tmp_path_factory, tag, data_dir, opts, lr, warmup, beta, wd, dims):
    """Whatever a config holds, the config.toml a run writes is TOML that `--config` reads back to it."""
    cfg = TrainConfig(tag=tag, data_dir=data_dir, data_options=opts, lr=lr, warmup_epochs=warmup, beta_end=beta,
                      weight_decay=wd, input=dims, tuned=("0:conv=im2col",), augment=False)
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    path.write_text(cfg.to_toml(), encoding="utf-8")
    assert load_config(str(path)) == cfg


def test_a_lone_surrogate_is_refused_not_written():
    with pytest.raises(UnsupportedSpec, match="lone surrogate"):
        TrainConfig(tag="run\udcff").to_toml()


# ------------------------------------------------------------------ batches handed to the train and eval paths
def tiny_session(**kw):
    from hloforge.core.spec import NetSpec
    from hloforge.core.variant import Variant
    from hloforge.plugins.layers.dense import Dense
    from hloforge.train.session import TrainSession, make_backend

    spec = NetSpec("tiny", (6,), [Dense(8, act="relu"), Dense(10)], 10)
    return TrainSession(spec, Variant("sgd", **kw), 4, make_backend("xla"))


GOOD_X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)


@pytest.mark.parametrize("x,y,needle", [
    (GOOD_X, np.array([1, 2, 12, 3]), r"labels span 1\.\.12, expected ids 0\.\.9"),
    (GOOD_X, np.array([1, -1, 0, 3]), r"labels span -1\.\.3, expected ids 0\.\.9"),
    (GOOD_X, np.array([1.0, 2.5, 0.0, 3.0]), r"labels are real numbers \(float64, not whole\): regression targets\?"),
    (GOOD_X, np.array([[1], [2], [0], [3]]), r"labels have shape \[4, 1\], expected \[4\]"),
    (np.where(np.eye(4, 6, dtype=bool), np.nan, GOOD_X), np.array([1, 2, 0, 3]), "x holds NaN or inf"),
    (np.where(np.eye(4, 6, dtype=bool), -np.inf, GOOD_X), np.array([1, 2, 0, 3]), "x holds NaN or inf"),
    (GOOD_X.astype(np.float64) * 1e300, np.array([1, 2, 0, 3]), "beyond float32.s range"),  # finite, inf in float32
    (GOOD_X.astype(str), np.array([1, 2, 0, 3]), "x has dtype <U.*, expected real numbers"),
    (GOOD_X[:3], np.array([1, 2, 0]), r"x has shape \[3, 6\], expected \[4, 6\]"),
])
def test_a_bad_train_batch_is_refused_before_the_step(x, y, needle):
    """Labels out of range trained with loss -0.0 (a plausible wrong number); now one line, and no step."""
    s = tiny_session()
    before = s.read_params()
    with pytest.raises(DataError, match=needle):
        s.train_step(x, y, 0.1)
    assert s.step == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, s.read_params(), strict=True))
    assert math.isfinite(s.train_step(GOOD_X, np.array([1, 2, 0, 9]), 0.1)) and s.step == 1


def test_soft_targets_must_be_finite():
    s = tiny_session(mixup=0.2)  # mixing: float targets [B, classes]
    y = np.full((4, 10), 0.1, np.float32)
    y[2, 3] = np.nan
    with pytest.raises(DataError, match="labels hold NaN or inf"):
        s.train_step(GOOD_X, y, 0.1)
    assert math.isfinite(s.train_step(GOOD_X, np.full((4, 10), 0.1, np.float32), 0.1))


@pytest.mark.parametrize("loss,out,classes", [("crossEntropy", (10,), 10), ("tokenCrossEntropy", (16, 65), 65),
                                              ("perPixelCE", (3, 8, 8), 3), ("fpnYolo", (21, 1, 7), None),
                                              ("mse", (3, 8, 8), None)])
def test_every_label_kind_is_checked_as_its_loss_reads_it(loss, out, classes):
    from hloforge.core.modules import label_type
    from hloforge.core.registry import default_registry
    from hloforge.train.inputs import checked_labels, label_classes

    y_shape, y_dtype = label_type(default_registry().make("loss", loss), out, "f32")
    assert label_classes(y_dtype, y_shape, out) == classes
    shape = (2, *y_shape)
    if classes is None:  # float targets (boxes, noise): finite
        bad = np.zeros(shape)
        bad.flat[1] = np.inf
        with pytest.raises(DataError, match="labels hold NaN or inf"):
            checked_labels(bad, shape, y_dtype, classes, "train batch")
        return
    bad = np.zeros(shape, np.int64)
    bad.flat[-1] = classes  # one past the last class (token id, mask class)
    with pytest.raises(DataError, match=rf"labels span 0\.\.{classes}, expected ids 0\.\.{classes - 1}"):
        checked_labels(bad, shape, y_dtype, classes, "train batch")
    ok = checked_labels(np.clip(bad, 0, classes - 1), shape, y_dtype, classes, "train batch")
    assert ok.dtype == np.int32 and ok.max() == classes - 1


def test_the_eval_paths_refuse_bad_rows_and_labels():
    from hloforge.train.session import ForwardSession
    from hloforge.train.trainer import evaluate, evaluate_lm

    s = tiny_session()
    fwd = ForwardSession(s.spec, 4, s.backend)
    theta = s.read_params()
    x = np.tile(GOOD_X, (2, 1))
    assert evaluate(fwd, theta, x, np.arange(8)).n == 8
    with pytest.raises(DataError, match=r"eval labels span 0\.\.10, expected ids 0\.\.9"):
        evaluate(fwd, theta, x, np.array([0, 1, 2, 3, 4, 5, 6, 10]))
    with pytest.raises(DataError, match="eval labels have dtype float64"):
        evaluate(fwd, theta, x, np.arange(8.0))
    x[5, 2] = np.nan
    with pytest.raises(DataError, match="eval x holds NaN or inf"):
        fwd.logits(x, theta)

    class Tokens:  # per-token logits [n, T, V] of a V = 5 language model
        def logits(self, x, buffers):
            return np.zeros((len(x), 3, 5), np.float32)

    assert evaluate_lm(Tokens(), [], np.zeros((2, 3)), np.array([[0, 4, -1], [1, 2, 3]])).n == 5  # −1: padding
    with pytest.raises(DataError, match=r"eval token labels span -1\.\.5, expected ids -1\.\.4"):
        evaluate_lm(Tokens(), [], np.zeros((2, 3)), np.array([[0, 5, -1], [1, 2, 3]]))


# ------------------------------------------------------------------ eval of a run directory
def quiet_train(tmp_path, name, **kw):
    from hloforge.train.trainer import train

    return train(TrainConfig(**{"net": "mnist-mlp", "epochs": 1, "run_dir": str(tmp_path / name), **kw}),
                 progress=False, log=lambda s: None)


def test_eval_refuses_a_run_dir_whose_config_names_another_net(tmp_path, capsys):
    import shutil

    from hloforge.train.trainer import CHECKPOINT

    quiet_train(tmp_path, "mlp")
    quiet_train(tmp_path, "linear", net="mnist-linear")
    shutil.copy(tmp_path / "linear" / CHECKPOINT, tmp_path / "mlp" / CHECKPOINT)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "mlp")]) != 0
    err = one_line_error(capsys)
    assert "config.toml" in err and "'mnist-linear', not 'mnist-mlp'" in err, err
    assert main(["eval", str(tmp_path / "linear")]) == 0  # its own directory scores as before


def test_eval_defaults_to_the_shadow_when_the_run_kept_one(tmp_path, capsys):
    m = quiet_train(tmp_path, "ema", ema=0.9)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "ema")]) == 0
    out = capsys.readouterr().out
    assert "(ema)" in out and f"({m['correct_ema']}/{m['n']})" in out, out
    quiet_train(tmp_path, "plain")
    assert main(["eval", str(tmp_path / "plain")]) == 0
    assert "(live)" in capsys.readouterr().out


# ------------------------------------------------------------------ non-finite runs
def test_a_nan_update_on_an_epochs_last_step_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    """The update of an epoch's last step turns θ to NaN with that step's loss finite: the loss check
    cannot see it, and the epoch's eval and checkpoint would have scored and kept NaN weights."""
    from hloforge.train import checkpoint as ckpt
    from hloforge.train.session import TrainSession
    from hloforge.train.trainer import CHECKPOINT, train

    quiet_train(tmp_path, "run")
    path = str(tmp_path / "run" / CHECKPOINT)
    good, meta = ckpt.load_checkpoint(path)
    bitmap = (tmp_path / "run" / "eval_correct.npz").read_bytes()
    last = 2 * meta["step"]  # epoch 2's last step
    real = TrainSession.train_step

    def poisoned(self, x, y, lr, masks=None):
        loss = real(self, x, y, lr, masks)
        if self.step == last:
            self.replace_params([np.full_like(p, np.nan) for p in self.read_params()])
        return loss

    monkeypatch.setattr(TrainSession, "train_step", poisoned)
    cfg = TrainConfig(net="mnist-mlp", epochs=2, run_dir=str(tmp_path / "run"))
    with pytest.raises(HloforgeError, match=rf"is not finite after step {last} .*last good checkpoint is {path}"):
        train(cfg, resume=True, progress=False, log=lambda s: None)
    kept, meta2 = ckpt.load_checkpoint(path)
    assert meta2["epoch"] == 1 and all(np.array_equal(good[k], kept[k]) for k in good)
    assert (tmp_path / "run" / "eval_correct.npz").read_bytes() == bitmap


def clipped(wrappers, grads):
    """θ' of one SGD step (lr 1) from θ = 0 through `wrappers`' update on `grads`: −(the clipped gradient)."""
    from hloforge.backends.xla import default_client
    from hloforge.core.modules import optimizer_step_module
    from hloforge.core.spec import ParamSlot
    from hloforge.plugins.optimizers.sgd import SGD

    opt = SGD()
    slots = [ParamSlot(f"p{i}", g.shape, "glorot", True) for i, g in enumerate(grads)]
    lay = wrappers.layout(opt)
    params = [np.zeros_like(g) for g in grads]
    exe = default_client().compile(optimizer_step_module(slots, opt, wrappers=wrappers))
    try:
        outs = exe.run([*params, *lay.initial(opt, slots, params), *grads, lay.host_schedule(opt, 1, 1.0)])
    finally:
        exe.close()
    return [-np.asarray(o) for o in outs[:len(grads)]]


def nan_survives(wrappers) -> bool:
    """A NaN (or inf) anywhere in the gradient leaves the clipped gradient non-finite where it was."""
    for bad in (np.nan, np.inf):
        g = [np.full((3, 4), 0.5, np.float32), np.arange(5, dtype=np.float32)]
        g[1][2] = bad
        out = clipped(wrappers, g)
        if np.isfinite(out[1][2]):
            return False
    return True


def test_clip_never_turns_a_nan_gradient_finite():
    from hloforge.core.variant import Wrappers, clip_by_global_norm

    for w in (Wrappers(clip=1.0), Wrappers(clip=1e9), Wrappers(clip=1.0, ema=0.9)):
        assert nan_survives(w), w
    g = [np.full((3, 4), 0.5, np.float32), np.arange(5, dtype=np.float32)]
    norm = math.sqrt(sum(float((a * a).sum()) for a in g))
    assert [np.allclose(o, a / norm) for o, a in zip(clipped(Wrappers(clip=1.0), g), g, strict=True)] == [True] * 2

    class SkipsOverflow(Wrappers):  # the loss scaler's habit: a non-finite norm zeroes the step
        def emit_update(self, b, opt, slots, params, grads, state, scalars):
            clipped_g = clip_by_global_norm(b, grads, self.clip)
            sq = [b.sum(g * g) for g in grads]
            total = sq[0]
            for s in sq[1:]:
                total = total + s
            finite = b.compare(total, total * 0.0, "EQ")  # x·0 = 0 exactly when x is finite
            safe = [b.select(b.broadcast_to(finite, g.shape), g, b.full(0.0, g.shape)) for g in clipped_g]
            return Wrappers.emit_update(attrs.evolve(self, clip=0.0), b, opt, slots, params, safe, state, scalars)

    assert not nan_survives(SkipsOverflow(clip=1.0))  # the check above can fail


def test_compare_refuses_bitmaps_of_different_lengths_under_one_set_id(tmp_path, capsys):
    from hloforge.train.compare import compare_runs

    for name, n in (("a", 2000), ("b", 1999)):
        (tmp_path / name).mkdir()
        np.savez(tmp_path / name / "eval_correct.npz", correct=np.arange(n) % 3 == 0, set_id="x:test:2000:00", epoch=1)
    with pytest.raises(DataError, match=r"hold \[2000\] and \[1999\] results"):
        compare_runs(str(tmp_path / "a"), str(tmp_path / "b"), log=lambda s: None)
    np.savez(tmp_path / "b" / "eval_correct.npz", correct=np.arange(2000) % 3 != 0, set_id="x:test:2000:00", epoch=1)
    nb, nc, p = compare_runs(str(tmp_path / "a"), str(tmp_path / "b"), log=lambda s: None)  # all 2,000 disagree
    assert (nb, nc) == (667, 1333) and p == pytest.approx(6.12997224342e-51, rel=1e-9)


def test_a_checkpoint_of_a_net_with_nested_tuples_matches_its_own_net():
    """fpnDetect's anchors are tuples of tuples; the checkpoint's spec comes back through JSON as lists,
    and `--resume` (and eval of its run directory) refused fpn-mini's own run as "not 'fpn-mini'"."""
    import json

    from hloforge.train.rundir import check_matches
    from hloforge.zoo import get_net

    cfg = TrainConfig(net="fpn-mini", data="shapes")
    spec = get_net(cfg.net)
    variant = cfg.variant(spec)
    meta = json.loads(json.dumps({"spec": spec.to_dict(), "variant": attrs.asdict(variant), "backend": "xla"}))
    check_matches("ckpt", meta, variant.apply_to(spec), variant, "xla")
    with pytest.raises(DataError, match="is of net 'fpn-mini', not 'fpn-mini-2'"):
        check_matches("ckpt", meta, attrs.evolve(spec, name="fpn-mini-2"), variant, "xla")


def test_a_dataset_of_another_input_shape_says_the_flag_for_a_zoo_net(tmp_path, capsys):
    """Before: a zoo net on images of another size was told the two shapes only, while a class count's refusal
    names --classes."""
    data = tmp_path / "c10"
    data.mkdir()
    rng = np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}.bin", 8) for i in range(1, 6)), ("test_batch.bin", 8)]:
        rec = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        rec[:, 0] %= 10
        rec.tofile(data / name)
    argv = ["--data", "cifar10", "--data-dir", str(data), "--epochs", "1", "--batch", "8", "--no-progress"]
    assert main(["train", "resnet-mini", *argv, "--run-dir", str(tmp_path / "a")]) == 3
    assert one_line_error(capsys).endswith("but net 'resnet-mini' expects [1, 28, 28]; pass --input 3,32,32 "
                                           "(hf.Model's input=(3, 32, 32)) to give the net that input")
    assert main(["train", "mnist-cnn", *argv, "--run-dir", str(tmp_path / "b")]) == 3  # defined at one size only
    assert one_line_error(capsys).endswith("but net 'mnist-cnn' expects [1, 28, 28]")


@pytest.mark.parametrize("flags", [[], ["--classes", "10"]])
def test_the_input_flag_is_offered_only_at_a_shape_the_net_takes(tmp_path, capsys, flags):
    """Before: vit_tiny on the digits was told `pass --input 1,28,28` (with --classes 10 where its head differed
    too), and following it met the next refusal: patch 16 does not divide the 28x28 image. The line now says why
    that input would not do, and offers only the flag that would (the head's)."""
    assert main(["train", "vit_tiny", *flags, "--epochs", "1", "--no-progress", "--run-dir", str(tmp_path / "r")]) == 3
    err = one_line_error(capsys)
    assert "pass --input" not in err and "--input 1,28,28 would not build it (layer 0 (patchEmbed(dim=192, patch=16, " \
        "cls=True)) on input [1, 28, 28]: patch 16 does not divide the 28x28 image); expected data of a shape it " \
        "takes" in err, err
    assert ("pass --classes 10 (hf.Model's classes=10) to give the net a head of 10, but" in err) == (not flags), err
    assert not (tmp_path / "r").exists()
