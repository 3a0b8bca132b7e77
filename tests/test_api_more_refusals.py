"""Python API mistakes refused in one line before any work: an endless iterable of batches, a shuffle that is
no bool, an unknown loss at construction; and an interrupted atomic write leaves no temp file behind."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import hloforge as hf
import hloforge.api as api
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.train import checkpoint as ckpt


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))


def test_an_endless_iterable_of_batches_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(api, "FIT_BATCHES_MAX_BYTES", 1 << 20)
    x, y = np.zeros((20, 784), np.float32), np.zeros(20, np.int32)
    m = hf.Model("mnist-linear")
    with pytest.raises(DataError, match=r"fit read \d+ batches \(0\.0 GiB\) from its iterable without reaching its "
                                        r"end; .*itertools\.islice"):
        m.fit(itertools.cycle([(x, y)]), epochs=1, verbose=False)
    assert m._step == 0


def test_shuffle_must_be_a_bool() -> None:
    with pytest.raises(UnsupportedSpec, match="shuffle must be True or False, got 'no'"):
        hf.Model("mnist-linear").fit(np.zeros((32, 784), np.float32), np.zeros(32, np.int32), shuffle="no",
                                     verbose=False)


def test_an_unknown_loss_is_refused_when_the_model_is_made() -> None:
    with pytest.raises(HloforgeError, match="crossentropy"):
        hf.Model("mnist-mlp", loss="crossentropy")


def test_an_interrupted_write_leaves_no_temp_file(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "checkpoint.safetensors")
    ckpt.write_atomic(path, b"old", "checkpoint")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ckpt.write_atomic(path, b"new", "checkpoint")
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"] and open(path, "rb").read() == b"old"


def test_a_csv_that_cannot_be_written_any_more_is_one_line(tmp_path) -> None:
    log = hf.CSVLogger(str(tmp_path / "logs" / "log.csv"))
    (tmp_path / "logs").write_text("a file where its folder was")  # made after the check, as a full disk is
    with pytest.raises(HloforgeError, match=r"CSVLogger cannot write .*log\.csv: ") as e:
        log.on_epoch_end(1, {"epoch": 1, "loss": 0.5})
    assert "\n" not in str(e.value)


def test_a_fit_without_validation_data_lists_no_val_metric() -> None:
    x, y = np.zeros((32, 784), np.float32), np.zeros(32, np.int32)
    with pytest.raises(HloforgeError, match=r"monitors 'acc', but the epoch's metrics are \['epoch', 'images_per_s', "
                                            r"'loss', 'lr', 'seconds', 'step'\]$"):
        hf.Model("mnist-linear").fit(x, y, verbose=False, callbacks=[hf.EarlyStopping("acc")])
