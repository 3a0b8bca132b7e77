"""A third-party backend, dataset or callback that breaks its contract is refused in one line naming it, before
anything compiles or trains: a backend without `execute`, a dataset without an int `num_classes` or whose x is
unscaled integers, a callback hook that cannot take the loop's call or an option not of its annotated type. A
dataset's nested lists are the arrays they hold. (Each was once an internal error after an epoch, or a run that
trained on 0…255 and exited 0.)

The "pip-installed" distribution is a module and a dist-info on sys.path (tests/plugin_site.py), found by a default
registry built afresh for each test."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from plugin_site import fake_dist, installed_in_process

import hloforge as hf
from hloforge.callbacks import Callback
from hloforge.cli import main
from hloforge.core.errors import PluginError
from hloforge.datasets.stream import split_pair

DIST = "hloforge-data-author"

PLUGIN = textwrap.dedent('''
    import numpy as np

    from hloforge.callbacks import Callback
    from hloforge.core.hookspecs import hookimpl


    class Blobs:
        name = "blobs"
        num_classes = 3

        def arrays(self, split):
            rng = np.random.default_rng(0 if split == "train" else 1)
            y = rng.integers(0, 3, 64).astype(np.int32)
            return (rng.standard_normal((64, 2)) + y[:, None]).astype(np.float32), y


    class NoClasses:
        name = "noClasses"
        arrays = Blobs.arrays


    class ClassesStr(Blobs):
        name = "classesStr"
        num_classes = "3"


    class Lists(Blobs):
        name = "lists"

        def arrays(self, split):
            x, y = super().arrays(split)
            return x.tolist(), y.tolist()


    class Uint8(Blobs):
        name = "uint8"

        def arrays(self, split):
            x, y = super().arrays(split)
            return np.clip(x * 40 + 128, 0, 255).astype(np.uint8), y


    class TestColumn(Blobs):
        name = "testColumn"

        def arrays(self, split):
            x, y = super().arrays(split)
            return (x, y) if split == "train" else (x, y[:, None])  # the test labels a column [N, 1]


    class TrainFromOne(Blobs):
        name = "trainFromOne"

        def arrays(self, split):
            x, y = super().arrays(split)
            return (x, y + 1) if split == "train" else (x, y)  # the train split's classes counted from 1


    class WrongSig(Callback):
        name = "wrongSig"

        def on_epoch_end(self, epoch):  # logs left out
            print("epoch", epoch)


    class InitOpt(Callback):
        name = "initOpt"

        def __init__(self, every: int = 1):
            self.every = every

        def on_epoch_end(self, epoch, logs):
            if epoch % self.every == 0:
                print("every", self.every)


    class ChannelsLast(Blobs):
        name = "channelsLast"

        def arrays(self, split):
            x, y = super().arrays(split)
            return np.repeat(x[:, None, :], 24, axis=1).reshape(64, 4, 4, 3), y  # [H, W, C] images


    class NotACallback:  # the hooks, without the base
        name = "notACallback"

        def on_epoch_end(self, epoch, logs):
            pass


    class Incomplete:
        name = "incomplete"  # compile and to_device, no to_host or execute

        def __init__(self):
            from hloforge.backends.xla.backend import XlaBackend

            self.inner = XlaBackend()

        def backend_name(self):
            return "incomplete"

        def compile(self, mlir_text, num_replicas=1):
            return self.inner.compile(mlir_text, num_replicas)

        def to_device(self, array, borrow=False, device=0):
            return self.inner.to_device(array, borrow=borrow)


    @hookimpl
    def hloforge_datasets():
        return [Blobs, NoClasses, ClassesStr, Lists, Uint8, TestColumn, ChannelsLast, TrainFromOne]


    @hookimpl
    def hloforge_callbacks():
        return [WrongSig, InitOpt, NotACallback]


    @hookimpl
    def hloforge_backends():
        return [Incomplete]
''')


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("author")
    groups = ("datasets", "callbacks", "backends")
    fake_dist(site, DIST, {"hf_author_data": PLUGIN}, {f"hloforge.{g}": {"author": "hf_author_data"} for g in groups})
    return site


@pytest.fixture
def installed(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The distribution installed; the default registry built afresh with it, and dropped after the test."""
    yield from installed_in_process(site, tmp_path, monkeypatch)


def train(tmp_path: Path, *args: str, run: str = "run") -> list[str]:
    net = tmp_path / "net.toml"
    net.write_text('name = "blobnet"\ninput_shape = [2]\nnum_classes = 3\n\n[[layers]]\nkind = "dense"\nunits = 3\n')
    return ["train", str(net), "--epochs", "1", "--batch", "16", "--no-progress", "--run-dir", str(tmp_path / run),
            *args]


def refused(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a refusal made before anything compiled or trained."""
    out, err = capsys.readouterr()
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert "compiled" not in out + err and "epoch 1/1" not in out + err, out + err
    return err


LABEL = f"(dist '{DIST}')"


# ------------------------------------------------------------------ backend
def test_a_backend_without_execute_is_refused_before_any_compile(installed: None, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, "--data", "blobs", "--backend", "incomplete")) == 3
    assert refused(capsys) == (
        f"hloforge: error: backend 'incomplete' {LABEL} does not implement to_host, execute; expected every member "
        "of the Backend protocol (hloforge.core.contracts.Backend: name, backend_name, compile, to_device, to_host, "
        "execute)")


# ------------------------------------------------------------------ datasets
@pytest.mark.parametrize(("data", "said"), [
    ("noClasses", "has no num_classes"),
    ("classesStr", "has num_classes '3' (a str)"),  # once: "has 3 classes, net 'blobnet' has 3"
])
def test_a_dataset_without_an_int_num_classes_is_refused_naming_it(data: str, said: str, installed: None,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, "--data", data)) == 3
    assert refused(capsys) == (f"hloforge: error: dataset '{data}' {LABEL} {said}; expected an int ≥ 1, the classes "
                               "of its labels (a class attribute or set in __init__)")


def test_a_dataset_giving_uint8_x_is_refused_not_trained_on_0_to_255(installed: None, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, "--data", "uint8")) == 3
    err = refused(capsys)
    assert err.startswith(f"hloforge: error: dataset 'uint8' {LABEL}: arrays('test') gave x of uint8 in "), err
    assert "expected float32 net input (the Dataset contract); scale it in the dataset" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_dataset_whose_test_labels_are_a_column_is_refused_before_training(installed: None, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # once: an epoch trained, then an internal error out of the scoring (a broadcast of [N] against [N, 1])
    assert main(train(tmp_path, "--data", "testColumn")) == 3
    assert refused(capsys) == (f"hloforge: error: dataset 'testColumn' {LABEL} test split labels have shape [64, 1], "
                               "expected [64] (a trailing axis of 1: y[..., 0] drops it)")


def test_a_dataset_whose_train_labels_are_out_of_range_is_refused_before_the_compile_naming_it(
        installed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # once: refused at the first batch, after the compile, as "train batch labels span 1..3", naming no dataset
    assert main(train(tmp_path, "--data", "trainFromOne")) == 3
    assert refused(capsys) == (f"hloforge: error: dataset 'trainFromOne' {LABEL} train split labels span 1..3, "
                               "expected ids 0..2 (the net's 3 classes; counted from 1? y - 1 gives ids 0..2)")


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_dataset_giving_images_channels_last_is_refused_not_reshaped(workers: str, installed: None, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # once: reshaped [4, 4, 3] -> [3, 4, 4] (the same size), every image scrambled, and trained on
    net = tmp_path / "img.toml"
    net.write_text('name = "imgnet"\ninput_shape = [3, 4, 4]\nnum_classes = 3\n\n[[layers]]\nkind = "flatten"\n\n'
                   '[[layers]]\nkind = "dense"\nunits = 3\n')
    args = train(tmp_path, "--data", "channelsLast", "--workers", workers)
    args[1] = str(net)
    assert main(args) == 3
    assert refused(capsys) == ("hloforge: error: dataset 'channelsLast' gives images [4, 4, 3], channels last, but the "
                               "net takes [3, 4, 4], channels first; expected x.transpose(0, 3, 1, 2) of them from "
                               "its arrays")


def metrics(run: Path) -> dict[str, float]:
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return {k: last[k] for k in ("loss", "top1", "correct", "n")}


def test_a_dataset_giving_nested_lists_trains_as_on_its_arrays(installed: None, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, "--data", "lists", run="lists")) == 0
    assert main(train(tmp_path, "--data", "blobs", run="arrays")) == 0
    assert metrics(tmp_path / "lists") == metrics(tmp_path / "arrays")


class Split:
    """A dataset stand-in whose arrays are what it is given."""

    name = "standIn"
    num_classes = 3

    def __init__(self, x: object, y: object, label_kind: str = "class"):
        self.x, self.y, self.label_kind = x, y, label_kind

    def arrays(self, split: str) -> tuple[object, object]:
        return self.x, self.y


def test_split_pair_gives_nested_lists_as_arrays_and_refuses_ragged_ones() -> None:
    x, y = split_pair(Split([[0.5, 1.0], [2.0, 3.0]], [1, 2]), "train")
    assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
    np.testing.assert_array_equal(x, [[0.5, 1.0], [2.0, 3.0]])
    with pytest.raises(PluginError, match=r"^dataset 'standIn': arrays\('train'\) returned ragged nested lists, "
                                          r"expected a pair \(x, y\) of arrays"):
        split_pair(Split([[0.5, 1.0], [2.0]], [1, 2]), "train")


def test_integer_x_is_refused_from_arrays_but_not_a_token_datasets_ids() -> None:
    with pytest.raises(PluginError, match=r"arrays\('test'\) gave x of int64 in 0 … 255, expected float32"):
        split_pair(Split(np.array([[0, 255]]), np.array([1])), "test")
    ids = np.array([[1, 2, 3]], np.int32)  # ids are ids: an embedding reads them whole
    assert split_pair(Split(ids, ids, label_kind="tokens"), "train")[0] is ids


# ------------------------------------------------------------------ callbacks
def test_a_callback_hook_of_the_wrong_signature_is_refused_before_the_first_step(
        installed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, "--data", "blobs", "--callback", "wrongSig")) == 3
    assert refused(capsys) == (
        f"hloforge: error: callback 'wrongSig' {LABEL}: its on_epoch_end(self, epoch) cannot take the loop's call "
        "on_epoch_end(epoch, logs); expected on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None as "
        "hloforge.callbacks.Callback declares it")


def test_a_callback_class_not_subclassing_callback_is_refused_naming_its_distribution(
        installed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, "--data", "blobs", "--callback", "notACallback")) == 3
    assert refused(capsys) == (
        f"hloforge: error: callback 'notACallback' {LABEL}: its class NotACallback does not subclass "
        "hloforge.callbacks.Callback; expected a subclass, as the hloforge_callbacks hook says")


class NoLogs(Callback):
    def on_step_end(self, step: int) -> None:  # logs left out
        pass


def test_fit_refuses_a_callback_hook_of_the_wrong_signature_before_training() -> None:
    m = hf.Model(hf.NetSpec("tiny", (2,), [hf.layers.Dense(3)], 3))
    x = np.random.default_rng(0).normal(size=(32, 2)).astype(np.float32)
    with pytest.raises(PluginError, match=r"^callback 'NoLogs': its on_step_end\(self, step\) cannot "
                                          r"take the loop's call on_step_end\(step, logs\)"):
        m.fit(x, np.arange(32) % 3, epochs=1, batch_size=16, verbose=False, callbacks=[NoLogs()])
    assert len(m.history) == 0


def test_a_callback_option_not_of_its_annotated_type_is_refused_before_the_first_step(
        installed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, "--data", "blobs", "--callback", "initOpt:every=x")) == 3
    assert refused(capsys) == f"hloforge: error: callback 'initOpt' {LABEL} option every='x' is not of its type int"
    assert main(train(tmp_path, "--data", "blobs", "--callback", "initOpt:every=1", run="ok")) == 0
    assert "every 1" in capsys.readouterr().out
