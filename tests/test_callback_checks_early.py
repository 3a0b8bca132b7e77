"""A callback option that cannot work is refused before the first training step, not after an epoch: a
monitor the run never logs (`hloforge train`, its --resume, and hf.Model.fit share the check), a file or
directory a callback would write that cannot be written, and the other options a callback reads late."""

from __future__ import annotations

import os
import re
import types

import numpy as np
import pytest

import hloforge as hf
from hloforge.callbacks import Callback
from hloforge.cli import main
from hloforge.core.errors import HloforgeError

TRAIN = ["train", "mnist-linear", "--epochs", "2", "--no-progress"]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    return (rng.normal(size=(n, 4)) + 3.0 * y[:, None]).astype(np.float32), y


def tiny_net() -> hf.NetSpec:
    Dense = hf.layers.Dense
    return hf.NetSpec("tiny", (4,), [Dense(8, act="relu"), Dense(3)], 3)


class Record(Callback):
    """The keys of each epoch's logs as a callback gets them."""

    def __init__(self) -> None:
        self.seen: list[set[str]] = []

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        self.seen.append(set(logs) - {"kind"})


# ------------------------------------------------------------------ hloforge train
@pytest.mark.parametrize(("item", "message"), [
    ("model_checkpoint:path={tmp}/best,monitor=zzz",
     "ModelCheckpoint monitors 'zzz', but the epoch's metrics are ['correct', 'epoch', 'images_per_s', 'loss', "),
    ("early_stopping", "EarlyStopping monitors 'val_loss', but the epoch's metrics are ['correct', 'epoch', "),
    ("early_stopping:monitor=kind", "EarlyStopping monitors 'kind', but"),  # a string: float() of it would crash
])
def test_cli_monitor_the_run_never_logs_is_refused_before_anything(item: str, message: str, tmp_path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main([*TRAIN, "--run-dir", str(run), "--callback", item.format(tmp=tmp_path)]) == 3
    err = one_line_error(capsys)
    assert message in err
    if "val_loss" in item or item == "early_stopping":
        assert "(hloforge train scores its test split unprefixed: monitor=top1, say)" in err  # the hint, kept
    assert not run.exists() and not (tmp_path / "best").exists()  # no epoch trained, nothing written


@pytest.mark.parametrize("item", ["csv_logger:path=/proc/hloforge-nowhere/log.csv",
                                  "model_checkpoint:path=/proc/hloforge-nowhere,monitor=top1",
                                  "tensorboard:logdir=/proc/hloforge-nowhere"])
def test_cli_callback_path_that_cannot_be_written_is_refused_before_anything(
        item: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    if item.startswith("tensorboard"):
        pytest.importorskip("tensorboardX")
    run = tmp_path / "run"
    assert main([*TRAIN, "--run-dir", str(run), "--callback", item]) == 3
    err = one_line_error(capsys)
    assert re.search(r"cannot write /proc/hloforge-nowhere.*: /proc is not writable .*; expected a directory that "
                     r"exists or can be created, and is writable", err), err
    assert not run.exists()


def test_a_resumed_run_checks_its_monitor_before_training_on(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", "mnist-linear", "--epochs", "1", "--no-progress", "--run-dir", str(run)]) == 0
    before = {name: (run / name).read_bytes() for name in ("checkpoint.safetensors", "metrics.jsonl", "config.toml")}
    capsys.readouterr()
    assert main(["train", "mnist-linear", "--epochs", "3", "--no-progress", "--run-dir", str(run), "--resume",
                 "--callback", "early_stopping:monitor=top_1"]) == 3
    assert "EarlyStopping monitors 'top_1', but the epoch's metrics are" in one_line_error(capsys)
    assert {name: (run / name).read_bytes() for name in before} == before  # epoch 2 never trained


def test_a_resumed_runs_csv_keeps_the_epochs_it_trained(tmp_path) -> None:
    """The CSV a resumed run writes starts with its earlier epochs (it used to hold only the new ones)."""
    import csv

    run, log = tmp_path / "run", tmp_path / "log.csv"
    assert main([*TRAIN[:3], "1", "--no-progress", "--run-dir", str(run), "--callback", f"csv_logger:path={log}"]) == 0
    assert main([*TRAIN[:3], "3", "--no-progress", "--run-dir", str(run), "--resume",
                 "--callback", f"csv_logger:path={log}"]) == 0
    with open(log, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3] and all(r["loss"] for r in rows)


def test_cli_logged_metrics_are_what_the_callbacks_get(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys checked ahead are exactly the epoch's (EMA's included), so no good monitor is refused."""
    from hloforge.train.trainer import Run, TrainConfig, train

    checked: list[frozenset[str]] = []
    real = Run.logged_metrics
    monkeypatch.setattr(Run, "logged_metrics", lambda run: checked.append(k := real(run)) or k)
    rec = Record()
    stop = hf.EarlyStopping("top1_ema", patience=5)
    train(TrainConfig(net="mnist-linear", epochs=1, ema=0.9, run_dir=str(tmp_path / "run")), log=lambda s: None,
          progress=False, callbacks=[rec, stop])
    assert "top1_ema" in rec.seen[0] and checked and all(keys == rec.seen[0] for keys in checked)


SHAPES = ["size=16", "n_train=64", "n_test=16"]


@pytest.mark.parametrize("kw", [
    dict(net="unet-mini", input=[3, 16, 16], data="shapes", data_options=SHAPES),  # iou/<c>, dice/<region>, ...
    dict(net="ddpm-mini", input=[4, 16, 16], data="shapes", data_options=SHAPES),
    dict(net="fpn-mini", data="shapes", data_options=["n_train=64", "n_test=8"]),  # ap50/<class in the truth>
    dict(net="tinygpt-nano", data="text", batch=16),  # a language model's own epoch
], ids=["segmentation", "diffusion", "detection", "language-model"])
def test_every_tasks_metrics_are_known_ahead(kw: dict, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each task's epoch keys, EMA's included, as the trainer predicts them (Run.logged_metrics mirrors
    hloforge.train.tasks): a drift there would refuse a good monitor."""
    from hloforge.datasets.text import default_corpus
    from hloforge.train.trainer import Run, TrainConfig, train

    if kw["data"] == "text":
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(default_corpus()[:6000], encoding="utf-8")
        kw = {**kw, "data_file": str(corpus)}
    checked: list[frozenset[str]] = []
    real = Run.logged_metrics
    monkeypatch.setattr(Run, "logged_metrics", lambda run: checked.append(k := real(run)) or k)
    rec = Record()
    train(TrainConfig(**{"epochs": 1, "batch": 32, "ema": 0.9, "run_dir": str(tmp_path / "run"), **kw}),
          log=lambda s: None, progress=False, callbacks=[rec])
    assert len(checked) == 2 and checked[0] == checked[1] == rec.seen[0], sorted(checked[0] ^ rec.seen[0])


# ------------------------------------------------------------------ hf.Model.fit
@pytest.mark.parametrize(("monitor", "message"), [
    ("val_los", "EarlyStopping monitors 'val_los', but the epoch's metrics are ['epoch', 'images_per_s', 'loss', "),
    ("top1", "EarlyStopping monitors 'top1', but the epoch's metrics are ['epoch', 'images_per_s', 'loss', 'lr', "
             "'seconds', 'step', 'val_correct', 'val_loss', 'val_n', 'val_top1', 'val_top1_hi', 'val_top1_lo'] "
             "(the validation scores are prefixed: monitor=val_top1, say)"),  # 3 classes: no val_top5
])
def test_fit_monitor_it_never_logs_is_refused_before_a_step(monitor: str, message: str) -> None:
    m = hf.Model(tiny_net())
    before = {k: v.copy() for k, v in m.params.items()}
    with pytest.raises(HloforgeError, match=re.escape(message)) as e:
        m.fit(*blobs(32), epochs=2, batch_size=16, validation_data=blobs(16, 1), verbose=False,
              callbacks=[hf.EarlyStopping(monitor)])
    assert "\n" not in str(e.value)
    assert m._step == 0 and not m.history and all(np.array_equal(before[k], v) for k, v in m.params.items())


def test_fit_on_a_dataset_checks_its_checkpoint_monitor_before_a_step(tmp_path) -> None:
    m = hf.Model("mnist-linear")
    with pytest.raises(HloforgeError, match=re.escape("ModelCheckpoint monitors 'zzz', but the epoch's metrics")):
        m.fit(data="digits", epochs=1, verbose=False, callbacks=[hf.ModelCheckpoint(str(tmp_path / "b"), "zzz")])
    assert m._step == 0 and not (tmp_path / "b").exists()


def test_fit_logged_metrics_are_what_the_callbacks_get(monkeypatch: pytest.MonkeyPatch) -> None:
    from hloforge.train.trainer import Run

    checked: list[frozenset[str]] = []
    real = Run.logged_metrics
    monkeypatch.setattr(Run, "logged_metrics", lambda run: checked.append(k := real(run)) or k)
    rec = Record()
    m = hf.Model(tiny_net(), ema=0.9)
    m.fit(*blobs(32), epochs=1, batch_size=16, validation_data=blobs(16, 1), verbose=False,
          callbacks=[rec, hf.EarlyStopping("val_top1_ema")])
    # checked twice alike: by fit before its compile, then by the loop
    assert {"val_loss", "val_top1_ema"} <= rec.seen[0] and checked == [frozenset(rec.seen[0])] * 2


class AddsScore(Callback):
    """A callback that puts a metric of its own into each epoch's logs for the ones after it."""

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        logs["my_score"] = -float(logs["loss"])


class DeclaresScore(AddsScore):
    adds_metrics = ("my_score",)


def test_a_metric_an_earlier_callback_declares_may_be_monitored() -> None:
    m = hf.Model(tiny_net())
    stop = hf.EarlyStopping("my_score", mode="max", patience=3)
    h = m.fit(*blobs(32), epochs=2, batch_size=16, verbose=False, callbacks=[DeclaresScore(), stop])
    assert len(h) == 2 and stop.best == max(-r["loss"] for r in h)  # watched what the callback added
    with pytest.raises(HloforgeError, match="EarlyStopping monitors 'my_score', but the epoch's metrics are"):
        hf.Model(tiny_net()).fit(*blobs(32), epochs=2, batch_size=16, verbose=False,
                                 callbacks=[AddsScore(), hf.EarlyStopping("my_score")])


# ------------------------------------------------------------------ paths and options, when the callback is made
@pytest.mark.parametrize(("make", "message"), [
    (lambda d: hf.CSVLogger("/proc/hloforge-nowhere/log.csv"),
     "CSVLogger cannot write /proc/hloforge-nowhere/log.csv: /proc is not writable"),
    (lambda d: hf.ModelCheckpoint("/proc/hloforge-nowhere", monitor="loss"),
     "ModelCheckpoint cannot write /proc/hloforge-nowhere: /proc is not writable"),
    (lambda d: hf.CSVLogger(os.path.join(d, "file", "log.csv")),
     "CSVLogger cannot write {d}/file/log.csv: {d}/file is a file, not a directory; expected a directory"),
    (lambda d: hf.ModelCheckpoint(os.path.join(d, "file", "best"), monitor="loss"),
     "ModelCheckpoint cannot write {d}/file/best: {d}/file is a file, not a directory"),
    (lambda d: hf.CSVLogger(5), "CSVLogger wants path a file name, got 5"),  # else written to descriptor 5
    (lambda d: hf.CSVLogger("log\0.csv"), "CSVLogger cannot write 'log\\x00.csv': a path cannot hold a NUL"),
    (lambda d: hf.ModelCheckpoint(os.path.join(d, "best"), monitor="loss", data="nope"),
     "ModelCheckpoint data: unknown dataset 'nope'"),
    (lambda d: hf.ModelCheckpoint(os.path.join(d, "best"), monitor="loss", data=3),
     "ModelCheckpoint wants data a registered dataset's name, got 3"),
])
def test_a_callback_that_could_not_write_is_refused_when_made(make, message: str, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(HloforgeError, match=re.escape(message.format(d=tmp_path))) as e:
        make(str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(logdir="/proc/hloforge-nowhere"), "TensorBoard cannot write /proc/hloforge-nowhere: /proc is not writable"),
    (dict(logdir="{d}/file"), "TensorBoard writes event files into a directory, but {d}/file is a file"),
    (dict(logdir=None), "TensorBoard wants logdir a directory name, got None"),
    (dict(logdir="{d}/tb", every_step="no"), "TensorBoard wants every_step true or false, got 'no'"),
])
def test_tensorboard_options_are_refused_when_made(kw: dict, message: str, tmp_path) -> None:
    pytest.importorskip("tensorboardX")
    (tmp_path / "file").write_text("")
    kw = {k: v.format(d=tmp_path) if isinstance(v, str) and k == "logdir" else v for k, v in kw.items()}
    with pytest.raises(HloforgeError, match=re.escape(message.format(d=tmp_path))):
        hf.TensorBoard(**kw)


def test_a_writable_new_path_is_taken_and_the_check_leaves_nothing(tmp_path) -> None:
    log = tmp_path / "a" / "b" / "log.csv"
    best = tmp_path / "c" / "best"
    hf.CSVLogger(str(log))
    hf.ModelCheckpoint(best, monitor="loss")  # an os.PathLike too
    assert os.listdir(tmp_path) == []  # nothing made by the check, no probe left behind
    (tmp_path / "old.csv").write_text("kept")
    hf.CSVLogger(str(tmp_path / "old.csv"))
    assert (tmp_path / "old.csv").read_text() == "kept"


@pytest.mark.parametrize("monitor", ["val_correct", "correct_ema", "ap50/circle"])
def test_auto_mode_takes_a_count_right_and_a_class_ap_as_scores(monitor):
    """Before: read as losses (min), so EarlyStopping stopped a run that kept improving and ModelCheckpoint kept
    its worst epoch."""
    stop = hf.EarlyStopping(monitor=monitor, patience=1)
    stop.model = types.SimpleNamespace(stop_training=False)
    stop.on_train_begin({})
    for epoch, value in enumerate((300, 320, 340), 1):
        stop.on_epoch_end(epoch, {monitor: value})
    assert not stop.model.stop_training and stop.best == 340


def test_a_train_run_early_stopping_ends_says_so(tmp_path, capsys):
    """Before: the run ended after epoch 2 of 3, exit 0, with no line saying why (its banner said 3 epochs)."""
    run = tmp_path / "run"
    assert main(["train", "mnist-linear", "--epochs", "3", "--run-dir", str(run), "--no-progress",
                 "--callback", "early_stopping:monitor=top1,patience=1,min_delta=1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("  early_stopping: top1 not better than ") and \
        out[-1].endswith(" for 1 epoch(s); stopped after epoch 2 of 3"), out[-2:]
