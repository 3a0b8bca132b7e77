"""Dataset plugins: digits (embedded) and MNIST IDX files the tests write."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys

import numpy as np
import pytest

from hloforge.core.errors import DataError
from hloforge.core.registry import default_registry
from hloforge.core.resample import bilinear_matrix
from hloforge.datasets.digits import N_TRAIN, Digits, bundled_digits, read_digits_table
from hloforge.datasets.mnist import Mnist


def write_idx(path, array: np.ndarray, magic: int, gz: bool = False) -> None:
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)


def tiny_mnist(d, n_train=40, n_test=12, gz=False, seed=0):
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28))
        for i, c in enumerate(labels):  # a learnable mark: a bright column per class
            images[i, :, 2 + 2 * c] = 255
        write_idx(d / f"{split}-images-idx3-ubyte", images, 0x803, gz)
        write_idx(d / f"{split}-labels-idx1-ubyte", labels, 0x801, gz)


def test_digits_split_is_fixed_and_standardised():
    a, b = Digits(), Digits()
    xa, ya = a.arrays("train")
    xb, yb = b.arrays("train")
    assert xa.shape == (N_TRAIN, 1, 28, 28) and len(a.arrays("test")[1]) == 1797 - N_TRAIN
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert abs(float(xa.mean())) < 1e-5 and abs(float(xa.std()) - 1) < 1e-4
    assert set(np.unique(ya)) == set(range(10))
    with pytest.raises(DataError, match="no split 'val'"):
        a.arrays("val")


def test_digits_read_from_the_bundled_file_are_load_digits_own() -> None:
    from sklearn.datasets import load_digits

    images, labels = bundled_digits()
    d = load_digits()
    assert np.array_equal(images, d.images) and np.array_equal(labels, d.target)


def test_a_truncated_digits_file_is_one_line(tmp_path) -> None:
    path = tmp_path / "digits.csv.gz"
    path.write_bytes(gzip.compress(b"0,1,2\n3,4,5\n" * 100)[:-12])
    with pytest.raises(DataError, match=r"digits file .*digits.csv.gz cannot be read .*; reinstall scikit-learn"):
        read_digits_table(path)


def test_digits_load_without_importing_scikit_learn() -> None:
    code = ("import sys; from hloforge.datasets.digits import Digits; Digits(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy', 'ml_dtypes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_bilinear_matrix_rows_sum_to_one_and_preserve_constants():
    m = bilinear_matrix(8, 28)
    assert m.shape == (28, 8) and np.allclose(m.sum(1), 1.0)
    assert np.allclose(m @ np.full(8, 3.0), 3.0)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_reads_idx_files(tmp_path, gz):
    tiny_mnist(tmp_path, gz=gz)
    ds = default_registry().make("dataset", "mnist", data_dir=str(tmp_path))
    x, y = ds.arrays("train")
    assert x.shape == (40, 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int32
    assert np.isclose(x.max(), (1.0 - 0.1307) / 0.3081)
    assert ds.arrays("test")[0].shape == (12, 1, 28, 28)


def test_mnist_bad_files_are_one_clear_error(tmp_path):
    tiny_mnist(tmp_path)
    img = tmp_path / "train-images-idx3-ubyte"
    raw = img.read_bytes()
    img.write_bytes(raw[:-100])
    with pytest.raises(DataError, match="truncated or corrupt"):
        Mnist(str(tmp_path)).arrays("train")
    img.write_bytes(struct.pack(">I", 0x801) + raw[4:])
    with pytest.raises(DataError, match="magic 0x00000801, expected 0x00000803"):
        Mnist(str(tmp_path)).arrays("train")
    with pytest.raises(DataError, match="not found"):
        Mnist(str(tmp_path / "nowhere")).arrays("test")


def test_an_idx_gz_far_longer_than_its_header_is_not_read_whole(tmp_path):
    """Before: the whole stream was decompressed, then measured (a 7 MB .gz of 1.5 GiB: 3.2 GB of memory before
    the refusal). Now the header, then one byte past what it says: the refusal names no length it read whole."""
    tiny_mnist(tmp_path, gz=True)
    header = struct.pack(">4I", 0x803, 20, 28, 28)
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(header)
        for _ in range(16):
            f.write(bytes(1 << 22))  # 64 MiB past a header of 15 680 bytes' images
    with pytest.raises(DataError, match=r"images-idx3-ubyte\.gz: more than 15696 bytes, but its header \[20, 28, "
                                        r"28\] needs 15696; truncated or corrupt"):
        Mnist(str(tmp_path)).arrays("train")


def test_the_run_header_says_how_many_examples_an_epoch_trains(tmp_path, capsys):
    """Whole batches only: 20 images in batches of 8 train 16 an epoch, said where the split's size is."""
    from hloforge.cli import main

    tiny_mnist(tmp_path, n_train=20, n_test=8)
    assert main(["train", "mnist-linear", "--data", "mnist", "--data-dir", str(tmp_path), "--batch", "8", "--epochs",
                 "1", "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    assert "on mnist (20 train, 16 of them an epoch in whole batches / 8 test)" in capsys.readouterr().out


def test_train_on_mnist_idx_files(tmp_path):
    from hloforge.train.trainer import TrainConfig, train

    tiny_mnist(tmp_path / "data", n_train=128, n_test=32) if (tmp_path / "data").mkdir() is None else None
    m = train(TrainConfig(net="mnist-cnn", data="mnist", data_dir=str(tmp_path / "data"), epochs=2, batch=32,
                          run_dir=str(tmp_path / "run")), progress=False)
    assert m["n"] == 32 and m["top1"] > 0.3


def test_eval_only_never_opens_the_train_split(tmp_path, capsys):
    """`hloforge eval RUN` scores the test split alone: the run's train files may be gone."""
    from hloforge.cli import main
    from hloforge.commands.opening import evaluate_checkpoint
    from hloforge.train.trainer import TrainConfig, train

    data = tmp_path / "data"
    data.mkdir()
    tiny_mnist(data, n_train=64, n_test=16)
    m = train(TrainConfig(net="mnist-mlp", data="mnist", data_dir=str(data), epochs=1, batch=32,
                          run_dir=str(tmp_path / "run")), progress=False, log=lambda s: None)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (data / stem).unlink()
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        Mnist(str(data)).arrays("train")  # the train split really is gone
    res = evaluate_checkpoint(str(tmp_path / "run"), log=lambda s: None)
    assert res.n == 16 and res.top1 / res.n == m["top1"]  # the number the training run scored
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run")]) == 0
    assert "test" in capsys.readouterr().out
