"""Fuzzed dataset files: every format reader on tiny valid files, truncated at arbitrary byte counts,
with flipped (header) bytes, lying counts and extra bytes. Each input is read and works (shapes, finite
values, labels in range) or is refused in one line naming the file; nothing on disk changes."""

from __future__ import annotations

import gzip
import os
import struct
import tempfile

import numpy as np
import pytest
from fuzz_util import REFUSED, corrupt, outcome
from hypothesis import given
from hypothesis import strategies as st

from hloforge.core.errors import DataError
from hloforge.datasets import brats, cifar10, imagenette, mnist, text, yolo

# a corruption: a short list of operations, biased to the header where the formats keep their counts
_pos = st.one_of(st.integers(0, 24), st.integers(0, 1 << 16))
OPS = st.lists(st.one_of(
    st.tuples(st.just("truncate"), _pos, st.just(0)),
    st.tuples(st.just("flip"), _pos, st.integers(1, 255)),
    st.tuples(st.just("append"), st.integers(1, 64), st.integers(0, 255)),
    st.tuples(st.just("u32"), st.integers(0, 24), st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1))),
), min_size=1, max_size=3)


def _write(d: str, name: str, data: bytes) -> str:
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _check_arrays(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...], classes: int) -> None:
    assert x.dtype == np.float32 and x.shape[1:] == shape and np.isfinite(x).all()
    assert len(x) == len(y)
    assert y.dtype == np.int32 and (len(y) == 0 or (0 <= y.min() and y.max() < classes))


# ------------------------------------------------------------------ MNIST IDX (plain and gzipped)
def _idx(magic: int, dims: tuple[int, ...], data: bytes) -> bytes:
    return struct.pack(f">I{len(dims)}I", magic, *dims) + data


def _mnist_files(rng: np.random.Generator, n: int = 3) -> dict[str, bytes]:
    img = _idx(mnist.IMAGES_MAGIC, (n, 28, 28), rng.integers(0, 256, n * 784, dtype=np.uint8).tobytes())
    lab = _idx(mnist.LABELS_MAGIC, (n,), rng.integers(0, 10, n, dtype=np.uint8).tobytes())
    return {mnist.FILES["test"][0]: img, mnist.FILES["test"][1]: lab}


@given(which=st.sampled_from([0, 1]), ops=OPS, gz=st.booleans(), gz_after=st.booleans())
def test_mnist_idx_fuzzed(which, ops, gz, gz_after):
    files = _mnist_files(np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, (name, data) in enumerate(files.items()):
            if i == which and not (gz and gz_after):
                data = corrupt(data, ops)
            if gz:
                data = gzip.compress(data, mtime=0)
                if i == which and gz_after:  # the gzip stream itself corrupted
                    data = corrupt(data, ops)
            paths.append(_write(d, name + (".gz" if gz else ""), data))
        got = outcome("mnist IDX", lambda: mnist.Mnist(d).arrays("test"), [d], [d])
        if got is not REFUSED:
            _check_arrays(*got, mnist.Mnist.image_shape, 10)


# ------------------------------------------------------------------ CIFAR-10 batches
def _cifar_batch(rng: np.random.Generator, n: int = 2) -> bytes:
    return b"".join(bytes([int(rng.integers(0, 10))]) + rng.integers(0, 256, 3072, dtype=np.uint8).tobytes()
                    for _ in range(n))


@given(ops=OPS)
def test_cifar10_batch_fuzzed(ops):
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "test_batch.bin", corrupt(_cifar_batch(np.random.default_rng(0)), ops))
        got = outcome("cifar10 batch", lambda: cifar10.Cifar10(d).arrays("test"), [path], [d])
        if got is not REFUSED:
            _check_arrays(*got, cifar10.Cifar10.image_shape, 10)


# ------------------------------------------------------------------ the counted record files
def _counted(records: list[bytes]) -> bytes:
    return struct.pack("<I", len(records)) + b"".join(records)


@given(split=st.sampled_from(["train", "test"]), ops=OPS)
def test_imagenette_records_fuzzed(split, ops):
    rng = np.random.default_rng(0)
    side = 6 if split == "train" else 4
    recs = [bytes([int(rng.integers(0, 10))]) + rng.integers(0, 256, 3 * side * side, dtype=np.uint8).tobytes()
            for _ in range(3)]
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, imagenette.FILES[split], corrupt(_counted(recs), ops))
        ds = imagenette.Imagenette(d, train_size=6, crop=4)
        got = outcome("imagenette records", lambda: ds.arrays(split), [path], [d])
        if got is not REFUSED:
            _check_arrays(*got, (3, 4, 4), 10)


@given(context=st.sampled_from([0, 1]), read_context=st.sampled_from([0, 1]), ops=OPS)
def test_brats_records_fuzzed(context, read_context, ops):
    rng = np.random.default_rng(0)
    size = 16
    recs = [rng.integers(0, 256, brats.channels(context) * size * size, dtype=np.uint8).tobytes()
            + rng.integers(0, 4, size * size, dtype=np.uint8).tobytes() for _ in range(2)]
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "val.bin", corrupt(_counted(recs), ops))
        ds = brats.Brats(d, size=size, context=read_context)
        got = outcome("brats records", lambda: ds.arrays("test"), [path], [d])
        if got is not REFUSED:
            x, y = got
            assert x.shape[1:] == ds.image_shape and np.isfinite(x).all() and x.dtype == np.float32
            assert y.shape == (len(x), size, size) and y.dtype == np.int32 and (y.size == 0 or y.max() < 4)


def _yolo_record(rng: np.random.Generator, ds: yolo.Yolo) -> bytes:
    cells = ds.grid ** 2
    nb = int(rng.integers(0, 3))
    table = bytearray(yolo.MAX_BOXES * yolo.BOX_ROW.size)
    for k in range(nb):
        yolo.BOX_ROW.pack_into(table, k * yolo.BOX_ROW.size, int(rng.integers(0, ds.num_classes)), 0.1, 0.1, 0.5, 0.6)
    return (rng.integers(0, 256, 3 * ds.size ** 2, dtype=np.uint8).tobytes()
            + rng.random((ds.per_cell + 1) * cells).astype("<f4").tobytes() + struct.pack("<i", nb) + bytes(table))


@given(ops=OPS)
def test_yolo_records_fuzzed(ops):
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        ds = yolo.Yolo(d, size=4, grid=2, boxes=1, classes=2)
        path = _write(d, "test.bin", corrupt(_counted([_yolo_record(rng, ds) for _ in range(2)]), ops))
        got = outcome("yolo records", lambda: (*ds.arrays("test"), ds.boxes("test")), [path], [d])
        if got is not REFUSED:
            x, y, boxes = got
            assert x.shape[1:] == ds.image_shape and np.isfinite(x).all()
            assert y.shape == (len(x), ds.per_cell + 1, 2, 2) and np.isfinite(y).all()
            for b in boxes:
                assert np.isfinite(b).all() and ((0 <= b[:, 0]) & (b[:, 0] < ds.num_classes)).all()


# ------------------------------------------------------------------ YOLO label text files (prepare yolo)
LABEL_TEXT = "0 0.5 0.5 0.2 0.3\n1 0.25 0.75 0.1 0.1\n"


@given(ops=OPS, raw=st.one_of(st.none(), st.binary(max_size=64), st.text(max_size=64)))
def test_yolo_label_file_fuzzed(ops, raw):
    if raw is None:
        data = corrupt(LABEL_TEXT.encode(), ops)
    else:
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "a.txt", data)
        got = outcome("yolo label txt", lambda: yolo.read_label_file(path, 2), [path], [d])
        if got is not REFUSED:
            assert got.shape[1:] == (5,) and np.isfinite(got).all()
            assert ((0 <= got[:, 0]) & (got[:, 0] < 2)).all() and (got[:, 3:] > 0).all()


# ------------------------------------------------------------------ text (character LM)
TEXT = "the quick brown fox jumps over the lazy dog. " * 3 + "naïve café — ünïcödé ✓\n"


@given(ops=OPS, seq_len=st.sampled_from([1, 4, 16, 10**6]), vocab=st.sampled_from([2, 8, 300]))
def test_text_file_fuzzed(ops, seq_len, vocab):
    with tempfile.TemporaryDirectory() as d:
        path = _write(d, "corpus.txt", corrupt(TEXT.encode(), ops))
        got = outcome("text file", lambda: text.Text(path, seq_len=seq_len, vocab=vocab), [path], [d])
        if got is not REFUSED:
            for split in ("train", "test"):
                x, y = got.arrays(split)
                assert x.shape == y.shape and x.shape[1:] == (seq_len,) and len(x) > 0
                assert ((-1 <= y) & (y < vocab)).all() and ((0 <= x) & (x < vocab)).all()


# ------------------------------------------------------------------ what the properties found (each failed before)
def test_mnist_corrupt_gzip_stream_is_one_line(tmp_path):
    files = _mnist_files(np.random.default_rng(0))
    for name, data in files.items():
        gz = gzip.compress(data, mtime=0)
        _write(str(tmp_path), name + ".gz", gz[:3] + bytes(12) if "images" in name else gz)  # zlib.error before
    with pytest.raises(DataError, match=r"images-idx3-ubyte.gz: cannot read it"):
        mnist.Mnist(str(tmp_path)).arrays("test")


def test_mnist_file_that_is_a_directory_is_said_without_an_errno(tmp_path):
    """Was '... cannot read it ([Errno 21] Is a directory: PATH)', the path twice."""
    os.mkdir(os.path.join(tmp_path, mnist.FILES["test"][0]))
    with pytest.raises(DataError) as e:
        mnist.Mnist(str(tmp_path)).arrays("test")
    assert str(e.value) == (f"{os.path.join(tmp_path, mnist.FILES['test'][0])}: cannot read it (is a directory); "
                            "expected an MNIST IDX file")


def test_mnist_images_of_another_size_are_refused(tmp_path):
    _write(str(tmp_path), mnist.FILES["test"][0], _idx(mnist.IMAGES_MAGIC, (3, 14, 56), bytes(3 * 784)))
    _write(str(tmp_path), mnist.FILES["test"][1], _idx(mnist.LABELS_MAGIC, (3,), bytes(3)))
    with pytest.raises(DataError, match=r"images of 14×56 pixels, expected 28×28"):
        mnist.Mnist(str(tmp_path)).arrays("test")


def test_yolo_label_file_not_utf8_or_with_a_nan_box_is_refused(tmp_path):
    bad = _write(str(tmp_path), "a.txt", LABEL_TEXT.encode() + b"\x80")
    with pytest.raises(DataError) as e:
        yolo.read_label_file(bad, 2)
    assert str(e.value) == (f"{bad}: cannot read it as a UTF-8 YOLO label file (byte 0x80 at offset "
                            f"{len(LABEL_TEXT.encode()):,} is not UTF-8)")
    for line in ("0 0.5 0.5 nan 0.2", "0 0.5 0.5 inf 0.2", "1 0.5 0.5 0.2 1.5"):
        path = _write(str(tmp_path), "b.txt", (line + "\n").encode())
        with pytest.raises(DataError, match=r"b.txt:1: box centre must lie in \[0, 1\] and its size in \(0, 1\]"):
            yolo.read_label_file(path, 2)


def test_yolo_record_box_of_another_class_or_a_nan_target_is_refused(tmp_path):
    ds = yolo.Yolo(str(tmp_path), size=4, grid=2, boxes=1, classes=2)
    good = _yolo_record(np.random.default_rng(0), ds)
    table = 3 * 16 + 4 * (ds.per_cell + 1) * 4 + 4  # where the box rows start
    bad_class = bytearray(good)
    struct.pack_into("<i", bad_class, table - 4, 1)
    yolo.BOX_ROW.pack_into(bad_class, table, 3, 0.1, 0.1, 0.5, 0.6)
    _write(str(tmp_path), "test.bin", _counted([bytes(bad_class)]))
    with pytest.raises(DataError, match=r"test.bin: record 0 box 0 is \[3.0, .*expected a class in 0..1"):
        ds.arrays("test")  # accepted before: class 3 of a 2-class set
    nan_target = bytearray(good)
    struct.pack_into("<f", nan_target, 3 * 16, float("nan"))
    _write(str(tmp_path), "test.bin", _counted([bytes(nan_target)]))
    with pytest.raises(DataError, match=r"test.bin: record 0's target holds a NaN"):
        yolo.Yolo(str(tmp_path), size=4, grid=2, boxes=1, classes=2).arrays("test")
