"""The framework API (hloforge.api, docs/api.md): fit / evaluate / predict on arrays, named tensors,
save / load and `hloforge eval` on a saved directory, callbacks, input refusals, summaries."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import hloforge as hf
from hloforge.callbacks import Callback
from hloforge.core.errors import DataError, HloforgeError
from hloforge.core.registry import default_registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_net(classes: int = 3) -> hf.NetSpec:
    Dense = hf.layers.Dense
    return hf.NetSpec("api-tiny", (4,), [Dense(8, act="relu"), Dense(classes)], classes)


def blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three separable clusters in 4-d."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int32)
    x = (rng.normal(size=(n, 4)) * 0.3 + np.eye(4, dtype=np.float64)[y] * 3).astype(np.float32)
    return x, y


@pytest.fixture(scope="module")
def fitted() -> hf.Model:
    x, y = blobs(96)
    m = hf.Model(tiny_net(), lr=1e-2, schedule="constant")
    m.fit(x, y, epochs=4, batch_size=16, verbose=False)
    return m


def test_public_names() -> None:
    assert isinstance(hf.__version__, str) and hf.PLUGIN_API_VERSION == 1
    for name in hf.__all__:
        assert getattr(hf, name) is not None
    assert hf.layers.Conv2d is hf.layers["conv2d"]
    assert hf.losses["crossEntropy"].__name__ == "CrossEntropy" and hf.losses.CrossEntropy is hf.losses["crossEntropy"]
    assert hf.optimizers["adam"] is hf.optimizers.Adam
    with pytest.raises(AttributeError, match="no layer class 'Nope'"):
        hf.layers.Nope  # noqa: B018


def test_import_is_cheap() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, hloforge; print(sorted(m for m in sys.modules if "
                          "m.startswith(('jax', 'hloforge.core.registry', 'hloforge.train'))))"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_fit_evaluate_predict(fitted: hf.Model) -> None:
    x, y = blobs(60, seed=1)
    assert len(fitted.history) == 4 and fitted.history[-1]["loss"] < fitted.history[0]["loss"]
    s = fitted.evaluate(x, y)
    assert s["n"] == 60 and s["top1"] > 0.9 and s["top1_lo"] <= s["top1"] <= s["top1_hi"] + 1e-12
    assert "top5" not in s  # 3 classes: every label is in the top 5, always 100%
    assert np.isfinite(s["loss"])


def test_predict_37_rows_batch_16(fitted: hf.Model) -> None:
    x, _ = blobs(37, seed=2)
    out = fitted.predict(x, batch_size=16)
    assert out.shape == (37, 3)
    # each row's logits do not depend on which batch (or padding) it was scored with
    assert np.allclose(out[32:], fitted.predict(x[32:], batch_size=5), atol=1e-5)
    ref = np.maximum(x @ fitted.params["0.w"] + fitted.params["0.b"], 0) @ fitted.params["1.w"] + fitted.params["1.b"]
    assert np.allclose(out, ref, atol=1e-4)


def test_ragged_batch_dropped_and_said(capfd: pytest.CaptureFixture[str]) -> None:
    x, y = blobs(40)
    m = hf.Model(tiny_net())
    m.fit(x, y, epochs=1, batch_size=16)
    assert "8 of 40 rows do not fill a batch of 16" in capfd.readouterr().err
    assert m._step == 2  # two full batches, no padded third


def test_params_assignment_checked(fitted: hf.Model) -> None:
    m = hf.Model(tiny_net())
    m.params = fitted.params
    assert all(np.array_equal(m.params[n], w) for n, w in fitted.params.items())
    with pytest.raises(HloforgeError, match=r"params\['0.w'\] has shape \[2, 2\], expected \[4, 8\]"):
        m.params = {"0.w": np.zeros((2, 2), np.float32)}
    with pytest.raises(HloforgeError, match=re.escape("dtype int64, expected a float one (float16, bfloat16, float32, "
                                                      "float64; read as float32)")):
        m.params = {"0.w": np.zeros((4, 8), np.int64)}
    with pytest.raises(HloforgeError, match=re.escape("params['0.w'] holds values beyond float32's range")):
        m.params = {"0.w": np.full((4, 8), 1e300)}
    m.params = {"0.w": np.full((4, 8), 0.1)}  # float64, as numpy makes it: read as float32, as --init reads it
    assert m.params["0.w"].dtype == np.float32 and np.array_equal(m.params["0.w"], np.full((4, 8), 0.1, np.float32))
    with pytest.raises(HloforgeError, match="no tensor named 'nope'"):
        m.params = {"nope": np.zeros(1, np.float32)}
    assert set(m.state) >= {"m/0.w", "v/1.b"}


def test_save_load_bit_identical(fitted: hf.Model, tmp_path: str) -> None:
    d = os.path.join(tmp_path, "run")
    fitted.save(d)
    back = hf.load(d)
    for a, b in ((fitted.params, back.params), (fitted.state, back.state)):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert (back._step, back._epoch) == (fitted._step, fitted._epoch)
    with pytest.raises(HloforgeError, match="already holds a checkpoint"):
        fitted.save(d)


def test_hloforge_eval_prints_the_evaluate_top1(tmp_path: str) -> None:
    from hloforge.datasets.digits import Digits

    data = Digits()
    (x, y), (xt, yt) = data.arrays("train"), data.arrays("test")
    m = hf.Model("mnist-linear", lr=1e-3)
    m.fit(x.reshape(len(x), 784), y, epochs=1, batch_size=64, verbose=False)
    ours = m.evaluate(xt.reshape(len(xt), 784), yt)
    d = os.path.join(tmp_path, "lin")
    m.save(d, data="digits")  # its arrays were digits': named, as `hloforge eval` scores on it
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-m", "hloforge.cli", "eval", d], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    hit = re.search(r"top-1 ([\d.]+)% \[[\d., ]+\] \((\d+)/(\d+)\)", out.stdout)
    assert hit, out.stdout
    assert (int(hit.group(2)), int(hit.group(3))) == (ours["correct"], ours["n"])


class Plateau(Callback):
    """Feeds EarlyStopping a validation metric that stops improving after epoch 2."""

    def __init__(self, inner: Callback):
        self.inner, self.epochs = inner, 0

    def on_train_begin(self, logs: dict) -> None:
        self.inner.model = self.model
        self.inner.on_train_begin(logs)

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        self.epochs += 1
        self.inner.on_epoch_end(epoch, {**logs, "val_loss": max(1.0 - 0.1 * self.epochs, 0.8)})


def test_early_stopping_stops_on_a_plateau() -> None:
    x, y = blobs(32)
    m = hf.Model(tiny_net())
    stop = hf.EarlyStopping("val_loss", patience=2)
    probe = Plateau(stop)
    h = m.fit(x, y, epochs=20, batch_size=16, callbacks=[probe], verbose=False)
    assert len(h) == 4 and stop.stopped_epoch == 4  # best at epoch 2, two epochs without improvement


def test_early_stopping_on_real_validation(tmp_path: str) -> None:
    x, y = blobs(64)
    m = hf.Model(tiny_net(), lr=1e-2)
    log = os.path.join(tmp_path, "log.csv")
    h = m.fit(x, y, epochs=40, batch_size=16, validation_data=blobs(32, 3), verbose=False,
              callbacks=[hf.EarlyStopping("val_top1", patience=1), hf.CSVLogger(log)])
    assert len(h) < 40
    with open(log) as f:
        rows = f.read().splitlines()
    assert rows[0].startswith("epoch,step,loss,lr,val_top1,") and len(rows) == len(h) + 1


@pytest.mark.parametrize(("x", "y", "message"), [
    (np.zeros((8, 4), np.complex64), np.zeros(8, int), "fit x has dtype complex64, expected real numbers"),
    (np.zeros((8, 5), np.float32), np.zeros(8, int), r"fit x has shape \[8, 5\], expected \[N, 4\]"),
    (np.zeros((8, 4), np.float32), np.full(8, 3), r"fit labels span 3..3, expected ids 0..2"),
    (np.zeros((8, 4), np.float32), np.zeros(8, np.float32), "fit labels have dtype float32, expected integer ids"),
    (np.zeros((0, 4), np.float32), np.zeros(0, int), r"fit x is empty \(0 rows\)"),
    (np.full((8, 4), np.nan, np.float32), np.zeros(8, int), "fit x holds NaN or inf"),
    (np.zeros((8, 4), np.float32), np.zeros(7, int), "x has 8 rows but y has 7"),
])
def test_bad_input_one_line_nothing_written(x: np.ndarray, y: np.ndarray, message: str, tmp_path: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    m = hf.Model(tiny_net())
    before = {k: v.copy() for k, v in m.params.items()}
    with pytest.raises(HloforgeError, match=message) as e:
        m.fit(x, y, epochs=1, batch_size=4, callbacks=[hf.CSVLogger("log.csv")])
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path) == [] and m._step == 0
    assert all(np.array_equal(before[k], v) for k, v in m.params.items())


@pytest.mark.parametrize(("net", "total"), [("resnet18", 11_689_512), ("mobilenet_v2", 3_504_872),
                                            ("mnist-mlp", 669_706)])
def test_summary_totals(net: str, total: int) -> None:
    text = hf.Model(net).summary()
    assert f"{total:,} parameters" in text.splitlines()[-1]
    rows = [r for r in text.splitlines()[2:-2]]
    assert sum(int(r.split()[-1].replace(",", "")) for r in rows) == total


def test_summary_of_a_frozen_model_counts_its_frozen_parameters_apart() -> None:
    """Before, a model with `frozen` layers said every parameter was trainable ("669,706 parameters (trainable)")."""
    text = hf.Model("mnist-mlp", frozen=["0", "1.w"]).summary()  # 784·512 + 512, then 512·512 of layer 1
    frozen = 784 * 512 + 512 + 512 * 512
    assert f"669,706 parameters ({669_706 - frozen:,} trainable, {frozen:,} frozen)" in text.splitlines()[-1]


def test_cli_summary(capsys: pytest.CaptureFixture[str]) -> None:
    from hloforge.cli import main

    assert main(["summary", "resnet18"]) == 0
    assert "11,689,512 parameters" in capsys.readouterr().out


def python_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)


def test_docs_api_blocks_run(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(os.path.join(ROOT, "docs", "api.md"))
    assert len(blocks) >= 4
    headline = blocks[0].strip().splitlines()
    assert len(headline) <= 15
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/api.md block {i}", "exec"), ns)
    finally:
        default_registry.cache_clear()  # the layer a block registers (hf.register) is gone for the other tests
    assert ns["scores"]["top1"] >= 0.97
    assert ns["scaled"].params["0.s"].shape == (784,)


def test_fit_trains_what_hloforge_train_trains(tmp_path: str) -> None:
    """The same seed, net and defaults: Model.fit on the digits arrays and `hloforge train`'s loop give
    the same weights bit for bit, and hf.load reads the CLI's run directory."""
    from hloforge.datasets.digits import Digits
    from hloforge.train.trainer import TrainConfig, train

    d = os.path.join(tmp_path, "cli")
    train(TrainConfig(net="mnist-linear", epochs=2, run_dir=d), log=lambda s: None, progress=False)
    x, y = Digits().arrays("train")
    m = hf.Model("mnist-linear")
    m.fit(x.reshape(len(x), 784), y, epochs=2, batch_size=64, verbose=False)
    cli = hf.load(d)
    assert cli._step == m._step and all(np.array_equal(cli.params[n], w) for n, w in m.params.items())


def test_tensorboard_without_its_writer_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if not installed
    with pytest.raises(HloforgeError, match="pip install tensorboardX"):
        hf.TensorBoard("tb")


def test_tensorboard_events_read_back(tmp_path: str) -> None:
    pytest.importorskip("tensorboardX")
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    x, y = blobs(32)
    m = hf.Model(tiny_net())
    h = m.fit(x, y, epochs=3, batch_size=16, verbose=False, callbacks=[hf.TensorBoard(str(tmp_path))])
    acc = ea.EventAccumulator(str(tmp_path))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("epoch/loss")]
    assert [s for s, _ in got] == [1, 2, 3] and np.allclose([v for _, v in got], h["loss"])


@pytest.mark.parametrize("kw", [dict(ema=0.9, accum=2, mixup=0.2), dict(precision="fp8")])
def test_fit_on_a_dataset_by_name_is_hloforge_train_with_the_variants_wrappers(kw: dict, tmp_path: str) -> None:
    """The variant's wrappers the loop drives (EMA shadow, accumulation, mixup, fp8) reach the Model
    through the one loop: fit(data="digits") and `hloforge train` with the same seed agree bit for
    bit, live and shadow weights, and the history holds the epochs' scores the CLI logs (val_*)."""
    from hloforge.train.trainer import TrainConfig, train

    d = os.path.join(tmp_path, "cli")
    cli_metrics = train(TrainConfig(net="mnist-linear", epochs=2, run_dir=d, **kw), log=lambda s: None,
                        progress=False)
    m = hf.Model("mnist-linear", **kw)
    h = m.fit(data="digits", epochs=2, batch_size=64, verbose=False)
    cli = hf.load(d)
    assert cli._step == m._step == 2 * 22
    assert all(np.array_equal(cli.params[n], w) for n, w in m.params.items())
    assert cli.state.keys() == m.state.keys() and any(k.startswith("E/") for k in m.state) == ("ema" in kw)
    assert all(np.array_equal(cli.state[n], w) for n, w in m.state.items())
    assert h[-1]["val_top1"] == cli_metrics["top1"] and h[-1].get("val_top1_ema") == cli_metrics.get("top1_ema")
    assert m.evaluate("digits", region="live")["correct"] == cli_metrics["correct"]
    # by default (auto) the shadow when there is one, as `hloforge eval` scores the run
    assert m.evaluate("digits")["correct"] == cli_metrics.get("correct_ema", cli_metrics["correct"])


def test_fit_on_an_iterable_of_batches() -> None:
    x, y = blobs(64)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    a, b = hf.Model(tiny_net()), hf.Model(tiny_net())
    a.fit(iter(batches), epochs=2, verbose=False)
    b.fit(x, y, epochs=2, batch_size=16, verbose=False)
    assert a._step == 8 and all(np.array_equal(a.params[n], w) for n, w in b.params.items())
    with pytest.raises(HloforgeError, match="fit batch 0 is a int, expected a pair"):
        a.fit([1, 2], verbose=False)


def test_model_checkpoint_keeps_the_best_epoch(tmp_path: str) -> None:
    x, y = blobs(64)
    vx, vy = blobs(32, 3)
    best = os.path.join(tmp_path, "best")
    keep = hf.ModelCheckpoint(best, monitor="val_loss")
    m = hf.Model(tiny_net(), lr=3e-2, schedule="constant")
    h = m.fit(x, y, epochs=6, batch_size=16, validation_data=(vx, vy), verbose=False, callbacks=[keep])
    want = min(range(len(h)), key=lambda i: h[i]["val_loss"]) + 1
    back = hf.load(best)
    assert keep.best_epoch == want == back._epoch and back.evaluate(vx, vy)["loss"] == h[want - 1]["val_loss"]


def counter_plugin() -> object:
    """A third party's callback module: one class through the hloforge_callbacks hook."""
    import types

    from hloforge.core.hookspecs import hookimpl

    class EpochCounter(Callback):
        name = "test_epoch_counter"
        seen: list[int] = []

        def __init__(self, stop_after: int = 0):
            self.stop_after = stop_after

        def on_epoch_end(self, epoch: int, logs: dict) -> None:
            EpochCounter.seen.append(epoch)
            if epoch == self.stop_after:
                self.model.stop_training = True

    mod = types.ModuleType("test_callback_plugin")

    @hookimpl
    def hloforge_callbacks() -> list[type]:
        return [EpochCounter]

    mod.hloforge_callbacks = hloforge_callbacks  # type: ignore[attr-defined]
    mod.EpochCounter = EpochCounter  # type: ignore[attr-defined]
    return mod


def test_cli_runs_registered_callbacks_in_its_loop(tmp_path: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A third-party callback found by name through the registry, and the built-in best-checkpoint
    one, both run in `hloforge train`'s loop; `hloforge eval` reads the kept directory."""
    from hloforge.cli import main
    from hloforge.core import registry

    plugin = counter_plugin()
    reg = registry.Registry(extra_plugins=((plugin, "test-callbacks"),))  # beside the built-ins' entry points
    monkeypatch.setattr(registry, "default_registry", functools.cache(lambda: reg))  # as cached as the real one
    assert hf.callbacks["test_epoch_counter"] is plugin.EpochCounter and "model_checkpoint" in hf.callbacks
    d, best = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "best")
    assert main(["train", "mnist-linear", "--epochs", "5", "--run-dir", d, "--no-progress",
                 "--callback", "test_epoch_counter:stop_after=3",
                 "--callback", f"model_checkpoint:path={best},monitor=top1"]) == 0
    assert plugin.EpochCounter.seen == [1, 2, 3]  # stopped after epoch 3
    capsys.readouterr()
    assert main(["eval", best]) == 0
    assert "epoch" in capsys.readouterr().out
    assert main(["train", "mnist-linear", "--run-dir", os.path.join(tmp_path, "r2"), "--callback", "nope"]) != 0
    assert "unknown callback 'nope'" in capsys.readouterr().err and not os.path.exists(os.path.join(tmp_path, "r2"))


def test_a_resumed_run_keeps_its_monitors_best_so_far(tmp_path: str) -> None:
    """On --resume, ModelCheckpoint and EarlyStopping start from the run's best epoch so far, not afresh: the
    learning rate (cosine, falling) monitored for its max is best at epoch 1 and never again."""
    from hloforge.cli import main

    d, best = os.path.join(tmp_path, "run"), os.path.join(tmp_path, "best")
    watch = ["--callback", f"model_checkpoint:path={best},monitor=lr,mode=max",
             "--callback", "early_stopping:monitor=lr,mode=max,patience=2"]
    assert main(["train", "mnist-linear", "--epochs", "2", "--run-dir", d, "--no-progress", *watch]) == 0
    with open(os.path.join(best, "checkpoint.safetensors"), "rb") as f:
        kept = f.read()
    assert main(["train", "mnist-linear", "--epochs", "6", "--run-dir", d, "--no-progress", "--resume", *watch]) == 0
    with open(os.path.join(best, "checkpoint.safetensors"), "rb") as f:
        assert f.read() == kept  # epoch 1's, not the resumed run's first epoch
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
        epochs = [json.loads(ln)["epoch"] for ln in f if '"kind": "epoch"' in ln]
    assert epochs == [1, 2, 3]  # patience 2 ran out at epoch 3, counted from epoch 1


def test_curves_drawn_once_at_the_end_and_on_demand(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from hloforge.cli import main
    from hloforge.train import curves
    from hloforge.train.trainer import TrainConfig, train

    drawn: list[int] = []
    draw = curves.draw
    monkeypatch.setattr(curves, "draw", lambda h, title: drawn.append(len(h)) or draw(h, title))
    d = os.path.join(tmp_path, "run")
    train(TrainConfig(net="mnist-linear", epochs=3, run_dir=d), log=lambda s: None, progress=False)
    assert drawn == [3] and os.path.exists(os.path.join(d, "curves.png"))
    os.remove(os.path.join(d, "curves.png"))
    assert main(["plot", d]) == 0 and os.path.exists(os.path.join(d, "curves.png")) and drawn == [3, 3]
    m = hf.Model(tiny_net())
    m.fit(*blobs(32), epochs=2, batch_size=16, verbose=False)
    assert m.plot(os.path.join(tmp_path, "m.png")) and drawn == [3, 3, 2]


@pytest.mark.parametrize(("net", "key"), [pytest.param("unet-mini", "miou", marks=pytest.mark.slow),
                                          ("yolov1-mini", "map50")])
def test_evaluate_scores_the_task_as_the_epoch_does(net: str, key: str, tmp_path: str) -> None:
    """A segmenter's and a detector's own metrics: `evaluate` on the dataset (and a segmenter's on
    arrays) equals what the trainer's epoch evaluation logged."""
    from hloforge.train.trainer import TrainConfig, train

    opts = {"n_train": 16, "n_test": 16}
    d = os.path.join(tmp_path, "run")
    logged = train(TrainConfig(net=net, data="shapes", epochs=1, batch=16, run_dir=d,
                               data_options=tuple(f"{k}={v}" for k, v in opts.items())),
                   log=lambda s: None, progress=False)
    m = hf.load(d)
    got = m.evaluate("shapes", data_options=opts)
    assert got[key] == logged[key] and got["n"] == 16
    if key == "miou":
        from hloforge.datasets.shapes import Shapes

        x, y = Shapes(**opts).arrays("test")
        assert m.evaluate(x, y)["miou"] == logged["miou"]


def test_evaluate_a_language_model_in_bits_per_char(tmp_path: str) -> None:
    from hloforge.datasets.text import default_corpus
    from hloforge.train.trainer import TrainConfig, train

    corpus = os.path.join(tmp_path, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(default_corpus()[:6000])
    d = os.path.join(tmp_path, "run")
    logged = train(TrainConfig(net="tinygpt-nano", data="text", data_file=corpus, epochs=1, batch=16, run_dir=d),
                   log=lambda s: None, progress=False)
    m = hf.load(d)
    got = m.evaluate(data="text", data_options={"data_file": corpus})
    assert got["bits_per_char"] == logged["val_bits_per_char"] and got["n"] == logged["n"]
    from hloforge.datasets.text import Text

    xt, yt = Text(data_file=corpus, seq_len=m.spec.input_shape[0]).arrays("test")
    assert (yt == -1).any() and m.evaluate(xt, yt) == got  # its padding (−1) is not scored, not refused
    with pytest.raises(DataError, match=r"^eval token labels are all the padding id -1, so no token is scored; "):
        m.evaluate(xt, np.full_like(yt, -1))  # not bits_per_char NaN


def test_a_diverging_fit_stops_in_one_line_keeping_the_last_epoch(tmp_path: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    x, y = blobs(32)
    m = hf.Model(tiny_net(), optimizer="sgd", lr=1.0, schedule="constant")
    m.fit(x, y, epochs=1, batch_size=16, verbose=False)
    kept = m.params
    m.lr = 1e38  # the first update overflows θ
    with pytest.raises(HloforgeError, match="stopped. The weights kept are those after the last epoch") as e:
        m.fit(x, y, epochs=1, batch_size=16, verbose=False)
    assert "\n" not in str(e.value) and m._epoch == 1 and os.listdir(tmp_path) == []
    assert all(np.array_equal(kept[n], w) for n, w in m.params.items())


def test_a_generator_refilling_one_buffer_trains_on_every_batch_it_yielded() -> None:
    """`bx[:] = ...; yield bx, by` for each batch: before, every batch held was a view of the one buffer, so the
    fit trained on 4 copies of the last batch (16 distinct rows of 64) without a word."""
    x, y = blobs(64)

    def refilled():
        bx, by = np.empty((16, 4), np.float32), np.empty(16, np.int32)
        for i in range(0, 64, 16):
            bx[:], by[:] = x[i:i + 16], y[i:i + 16]
            yield bx, by

    a, b = hf.Model(tiny_net()), hf.Model(tiny_net())
    a.fit(refilled(), epochs=2, verbose=False)
    b.fit(x, y, epochs=2, batch_size=16, verbose=False)
    assert a._step == 8 and all(np.array_equal(a.params[n], w) for n, w in b.params.items())


def test_iterable_batches_of_different_shapes_is_one_line() -> None:
    x, y = blobs(32)
    m = hf.Model(tiny_net())
    with pytest.raises(HloforgeError, match=r"fit batch 1 has x of shape \[16, 3\], expected \[N, 4\] as batch 0's"):
        m.fit([(x[:16], y[:16]), (x[16:, :3], y[16:])], verbose=False)
    with pytest.raises(HloforgeError, match=r"fit batch 1 has 16 rows of x but 8 labels"):
        m.fit([(x[:16], y[:16]), (x[16:], y[16:24])], verbose=False)


def test_data_options_not_a_mapping_is_one_line() -> None:
    with pytest.raises(HloforgeError, match="data_options must be a mapping of option names to values, got a str"):
        hf.Model(tiny_net()).fit(data="digits", data_options="size=8", verbose=False)


@pytest.mark.parametrize("cb", [lambda: hf.EarlyStopping(), lambda: hf.ModelCheckpoint("never", monitor="val_top1")])
def test_a_val_monitor_without_validation_data_is_refused_before_a_step(cb, tmp_path: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    m = hf.Model(tiny_net())
    with pytest.raises(HloforgeError, match="monitors 'val_.*', but fit has no validation_data"):
        m.fit(*blobs(32), epochs=1, batch_size=16, callbacks=[cb()], verbose=False)
    assert m._step == 0 and not os.listdir(tmp_path)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: hf.EarlyStopping(patience="2"), "EarlyStopping wants patience an integer ≥ 0, got '2'"),
    (lambda: hf.EarlyStopping(patience=1.5), "EarlyStopping wants patience an integer ≥ 0, got 1.5"),
    (lambda: hf.EarlyStopping(min_delta="x"), "EarlyStopping wants min_delta a number ≥ 0, got 'x'"),
    (lambda: hf.EarlyStopping(monitor=3), "EarlyStopping wants monitor a metric name"),
    (lambda: hf.ModelCheckpoint(5), "ModelCheckpoint wants path a directory name"),
])
def test_callback_options_of_the_wrong_type_are_one_line(make, message: str) -> None:
    with pytest.raises(HloforgeError, match=re.escape(message)):
        make()


@pytest.mark.parametrize(("item", "message"), [
    ("model_checkpoint", "callback 'model_checkpoint' needs option(s) ['path']; its options are ['path',"),
    ("early_stopping:patience", "callback option 'patience' is not KEY=VALUE"),
    # before: "'logdir=' is not KEY=VALUE", though it is KEY= with the value left out
    ("tensorboard:logdir=", "callback option 'logdir=' gives logdir no value; expected logdir=VALUE"),
])
def test_cli_callback_missing_or_bare_options_are_one_line(item: str, message: str) -> None:
    from hloforge.callbacks import from_items

    with pytest.raises(HloforgeError, match=re.escape(message)):
        from_items([item])


@pytest.mark.parametrize(("text", "message"), [
    ("", "has no epoch in metrics.jsonl"),
    ('{"kind": "epoch", "epo\n', "metrics.jsonl line 1 is not JSON"),
    ("[1, 2]\n", "metrics.jsonl line 1 is a list, expected a JSON object"),
    ('{"kind": "epoch", "epoch": 1}\n', "metrics.jsonl line 1 (epoch record) lacks 'loss'"),
])
def test_plot_on_a_garbled_metrics_file_is_one_line(text: str, message: str, tmp_path: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from hloforge.cli import main

    with open(os.path.join(tmp_path, "metrics.jsonl"), "w") as f:
        f.write(text)
    assert main(["plot", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not os.path.exists(os.path.join(tmp_path, "curves.png"))


def test_plot_on_a_missing_directory_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from hloforge.cli import main

    assert main(["plot", "/nonexistent/run"]) == 3
    assert "run directory /nonexistent/run does not exist" in capsys.readouterr().err


def test_plot_skips_a_torn_last_line(tmp_path: str) -> None:
    from hloforge.train import curves

    with open(os.path.join(tmp_path, "metrics.jsonl"), "w") as f:
        f.write('{"kind": "epoch", "epoch": 1, "loss": 0.5}\n{"kind": "epoch", "ep')
    assert [r["epoch"] for r in curves.history(str(tmp_path))] == [1]


@pytest.mark.parametrize(("frozen", "want"), [(None, ()), ("0.w", ("0.w",)), (["1", "0."], ("0", "1"))])
def test_frozen_takes_none_a_prefix_or_prefixes(frozen, want) -> None:
    assert hf.Model(tiny_net(), frozen=frozen).variant.frozen == want


@pytest.mark.parametrize(("frozen", "message"), [
    (0, "frozen prefixes 0: expected a list of parameter-name prefixes"),
    ((0,), "frozen prefix 0: expected a parameter-name prefix (a string) of dot-separated letters and digits"),
])
def test_frozen_of_the_wrong_type_is_one_line(frozen, message: str) -> None:
    with pytest.raises(HloforgeError, match=re.escape(message)):
        hf.Model(tiny_net(), frozen=frozen)


def test_fit_misuses_refused_before_a_step(tmp_path: str) -> None:
    x, y = blobs(32)
    m = hf.Model(tiny_net())
    with pytest.raises(HloforgeError, match=r"fit batch 0 has x of shape \[\], expected an array with one row"):
        m.fit([(1, 2)], verbose=False)
    with pytest.raises(HloforgeError, match=re.escape("callbacks must be a list of hloforge Callback instances, "
                                                      "got one EarlyStopping (pass [it])")):
        m.fit(x, y, callbacks=hf.EarlyStopping("loss"), verbose=False)
    with pytest.raises(HloforgeError, match="CSVLogger writes a file, but .* is a directory"):
        hf.CSVLogger(str(tmp_path))
    open(os.path.join(tmp_path, "f"), "w").close()
    with pytest.raises(HloforgeError, match="ModelCheckpoint writes a run directory, but .*f is a file"):
        hf.ModelCheckpoint(os.path.join(tmp_path, "f"), monitor="loss")
    with pytest.raises(HloforgeError, match=r"cannot save to .*f: it is a file; expected a directory"):
        m.save(os.path.join(tmp_path, "f"))
    assert m._step == 0


def test_digits_size_of_the_wrong_type_is_one_line() -> None:
    with pytest.raises(HloforgeError, match="digits size must be an integer ≥ 8, got 'big'"):
        hf.Model(tiny_net()).fit(data="digits", data_options={"size": "big"}, verbose=False)


def test_evaluate_and_predict_refuse_a_bad_batch_size(fitted: hf.Model) -> None:
    x, y = blobs(16)
    for bad in (0, -1, "8", 2.0):
        with pytest.raises(HloforgeError, match=re.escape(f"batch_size must be an integer ≥ 1, got {bad!r}")):
            fitted.evaluate(x, y, batch_size=bad)
        with pytest.raises(HloforgeError, match=re.escape(f"batch_size must be an integer ≥ 1, got {bad!r}")):
            fitted.predict(x, batch_size=bad)


def test_load_of_a_checkpoint_file_names_the_directory(fitted: hf.Model, tmp_path: str) -> None:
    d = fitted.save(os.path.join(tmp_path, "m"))
    with pytest.raises(HloforgeError, match=r"hf.load reads a run directory; .*checkpoint.safetensors is a file "
                                            r"\(pass .*m, the directory holding it\)"):
        hf.load(os.path.join(d, "checkpoint.safetensors"))


def test_a_saved_model_keeps_its_frozen_prefixes(tmp_path: str) -> None:
    """Model.save's config.toml holds every Variant field (frozen included): hf.load and `hloforge eval`
    read the run the model was."""
    from hloforge.cli import main
    from hloforge.datasets.digits import Digits
    from hloforge.train.trainer import load_config

    (x, y) = Digits().arrays("train")
    m = hf.Model("mnist-mlp", lr=1e-3, frozen=("0",))
    m.fit(x[:128].reshape(128, 784), y[:128], epochs=1, batch_size=64, verbose=False)
    d = os.path.join(tmp_path, "frozen")
    m.save(d, data="digits")
    assert load_config(os.path.join(d, "config.toml")).frozen == ("0",)
    back = hf.load(d)
    assert back.variant.frozen == ("0",) and back.state.keys() == m.state.keys()
    assert main(["eval", d]) == 0


def test_a_monitor_missing_from_a_cli_runs_metrics_names_what_they_hold() -> None:
    from hloforge.callbacks import from_items

    (stop,) = from_items(["early_stopping"])  # its default monitor, val_loss: not a `hloforge train` metric
    with pytest.raises(HloforgeError, match=re.escape("EarlyStopping monitors 'val_loss', but the epoch's metrics "
                                                      "are ['loss', 'top1'] (hloforge train scores its test split "
                                                      "unprefixed: monitor=top1, say)")):
        stop.on_epoch_end(1, {"loss": 0.5, "top1": 0.9})
