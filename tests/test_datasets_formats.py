"""cifar10, imagenette and brats on tiny files in their real on-disk formats, and the augmentation."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hloforge.core.errors import DataError
from hloforge.core.registry import default_registry
from hloforge.datasets import augment as A
from hloforge.datasets import brats, cifar10, imagenette


# ------------------------------------------------------------------ writers of the real formats
def write_cifar(d, n_per_file=6, seed=0):
    """Six CIFAR-10 binary batch files; returns {file: (images, labels)} as written."""
    rng = np.random.default_rng(seed)
    written = {}
    for name in [*cifar10.FILES["train"], *cifar10.FILES["test"]]:
        labels = rng.integers(0, 10, n_per_file).astype(np.uint8)
        images = rng.integers(0, 256, (n_per_file, 3, 32, 32)).astype(np.uint8)
        raw = b"".join(bytes([lab]) + img.tobytes() for lab, img in zip(labels, images, strict=True))
        (d / name).write_bytes(raw)
        written[name] = (images, labels)
    return written


def write_counted(path, records):
    path.write_bytes(struct.pack("<I", len(records)) + b"".join(records))


def write_imagenette(d, n_train=5, n_val=3, train_size=12, crop=8, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for fname, n, side in (("train.bin", n_train, train_size), ("val.bin", n_val, crop)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 256, (n, 3, side, side)).astype(np.uint8)
        write_counted(d / fname, [bytes([lab]) + im.tobytes() for lab, im in zip(labels, images, strict=True)])
        out[fname] = (images, labels)
    return out


def write_brats(d, n=4, size=16, context=0, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for fname in ("train.bin", "val.bin"):
        images = rng.integers(0, 256, (n, brats.channels(context), size, size)).astype(np.uint8)
        masks = rng.integers(0, 4, (n, size, size)).astype(np.uint8)
        write_counted(d / fname, [im.tobytes() + m.tobytes() for im, m in zip(images, masks, strict=True)])
        out[fname] = (images, masks)
    return out


# ------------------------------------------------------------------ cifar10
def test_cifar10_round_trip(tmp_path):
    written = write_cifar(tmp_path)
    ds = default_registry().make("dataset", "cifar10", data_dir=str(tmp_path))
    xs, ys = ds.records("train")
    want_x = np.concatenate([written[f][0] for f in cifar10.FILES["train"]])
    want_y = np.concatenate([written[f][1] for f in cifar10.FILES["train"]])
    assert xs.shape == (30, 3, 32, 32) and np.array_equal(xs, want_x) and np.array_equal(ys, want_y)
    x, y = ds.arrays("test")
    ti, tl = written["test_batch.bin"]
    expect = (ti / 255.0 - np.array(cifar10.MEAN)[:, None, None]) / np.array(cifar10.STD)[:, None, None]
    assert x.dtype == np.float32 and y.dtype == np.int32 and np.allclose(x, expect, atol=1e-5)
    assert np.array_equal(y, tl)


def test_cifar10_subfolder_and_bad_files(tmp_path):
    sub = tmp_path / "cifar-10-batches-bin"
    sub.mkdir()
    write_cifar(sub)
    assert cifar10.Cifar10(str(tmp_path)).records("test")[0].shape == (6, 3, 32, 32)
    f = sub / "data_batch_3.bin"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"data_batch_3\.bin: 18,428 bytes is not a whole number of 3,073-byte"):
        cifar10.Cifar10(str(tmp_path)).records("train")
    raw = bytearray((sub / "test_batch.bin").read_bytes())
    raw[3073] = 10  # the second record's label byte
    (sub / "test_batch.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="label 10 out of range 0..9"):
        cifar10.Cifar10(str(tmp_path)).records("test")
    with pytest.raises(DataError, match="not found"):
        cifar10.Cifar10(str(tmp_path / "nowhere")).records("test")


def test_cifar10_training_transform_crops_with_padding_and_flips(tmp_path):
    write_cifar(tmp_path)
    ds = cifar10.Cifar10(str(tmp_path))
    x, y = ds.records("train")
    t = ds.transform("train", augment=True)
    xa, ya = t(np.asarray(x), y, A.step_rng(0, 1, 0))
    assert xa.shape == (30, 3, 32, 32) and np.array_equal(ya, y)
    xb, _ = t(np.asarray(x), y, A.step_rng(0, 1, 0))
    assert np.array_equal(xa, xb), "the same step seed must give the same batch"
    xc, _ = t(np.asarray(x), y, A.step_rng(0, 1, 1))
    assert not np.array_equal(xa, xc)
    pad_value = (0.0 - np.array(cifar10.MEAN)) / np.array(cifar10.STD)
    assert any(np.isclose(xa[i, c], pad_value[c]).any() for i in range(30) for c in range(3)), "no padding seen"
    xe, _ = ds.transform("train", augment=False)(np.asarray(x), y, A.step_rng(0))
    assert np.allclose(xe, ds.transform("test")(np.asarray(x), y, A.step_rng(0))[0])


# ------------------------------------------------------------------ imagenette
def test_imagenette_round_trip_and_crops(tmp_path):
    written = write_imagenette(tmp_path)
    ds = default_registry().make("dataset", "imagenette", data_dir=str(tmp_path), train_size=12, crop=8)
    xs, ys = ds.records("train")
    assert np.array_equal(xs, written["train.bin"][0]) and np.array_equal(ys, written["train.bin"][1])
    x, y = ds.arrays("test")
    vi, vl = written["val.bin"]
    mean, std = np.array(A.IMAGENET_MEAN)[:, None, None], np.array(A.IMAGENET_STD)[:, None, None]
    assert x.shape == (3, 3, 8, 8) and np.allclose(x, (vi / 255.0 - mean) / std, atol=1e-5)
    assert np.array_equal(y, vl)
    centre, _ = ds.transform("train", augment=False)(np.asarray(xs), ys, A.step_rng(0))
    assert np.allclose(centre, (xs[:, :, 2:10, 2:10] / 255.0 - mean) / std, atol=1e-5)
    crop, _ = ds.transform("train", augment=True)(np.asarray(xs), ys, A.step_rng(3, 0, 0))
    assert crop.shape == (5, 3, 8, 8)
    # every random crop is some 8×8 window of its 12×12 image, possibly mirrored
    raw = (crop * std + mean) * 255.0
    for i in range(5):
        windows = [xs[i, :, r:r + 8, c:c + 8] for r in range(5) for c in range(5)]
        assert any(np.allclose(raw[i], w, atol=1e-3) or np.allclose(raw[i], w[:, :, ::-1], atol=1e-3)
                   for w in windows)


def test_imagenette_length_checked_before_reading(tmp_path):
    write_imagenette(tmp_path)
    # the val file (8²) read as train (12²): the header's count cannot fit the length
    with pytest.raises(DataError, match=r"train\.bin: .* bytes, but its header's 5 records of 769 bytes .* need 3,849"):
        imagenette.Imagenette(str(tmp_path), train_size=16, crop=8).records("train")
    f = tmp_path / "val.bin"
    f.write_bytes(f.read_bytes()[:-1])
    with pytest.raises(DataError, match=r"val\.bin: 582 bytes, but its header's 3 records of 193 bytes .* need 583"):
        imagenette.Imagenette(str(tmp_path), train_size=12, crop=8).records("test")
    with pytest.raises(DataError, match="crop 300 must be"):
        imagenette.Imagenette(str(tmp_path), crop=300)


# ------------------------------------------------------------------ brats
@pytest.mark.parametrize("name,size,context", [("brats", 16, 0), ("brats224", 16, 0), ("brats224-25d", 16, 1)])
def test_brats_variants_round_trip(tmp_path, name, size, context):
    written = write_brats(tmp_path, size=size, context=context)
    ds = default_registry().make("dataset", name, data_dir=str(tmp_path), size=size)
    assert ds.context == context and ds.regions is brats.BRATS_REGIONS and ds.label_kind == "mask"
    x, y = ds.arrays("test")
    vi, vm = written["val.bin"]
    assert x.shape == (4, brats.channels(context), size, size) and y.shape == (4, size, size)
    assert y.dtype == np.int32 and np.array_equal(y, vm)
    assert np.allclose(x, (vi.astype(np.float64) - 128) * 5.0 / 127.0, atol=1e-6)


def test_brats_defaults_and_regions():
    assert brats.Brats().size == 240 and brats.Brats224().size == 224 and brats.Brats224Context().context == 1
    assert brats.channels(0) == 4 and brats.channels(2) == 20
    assert dict(brats.BRATS_REGIONS) == {"WT": {1, 2, 3}, "TC": {2, 3}, "ET": {3}}


def test_brats_quantisation_round_trips_and_keeps_background_zero():
    z = np.array([-7.0, -5.0, -1.0, 0.0, 0.02, 1.0, 5.0, 9.0])
    q = brats.quantize(z)
    assert q[3] == 128 and q[0] == 0 and q[1] == 1 and q[-1] == 255
    back = brats.dequantize(q)
    assert back[3] == 0.0
    assert np.allclose(back[1:-1], z[1:-1], atol=5.0 / 127 / 2 + 1e-6)


def test_brats_2d_file_read_as_25d_fails_naming_what_fits(tmp_path):
    write_brats(tmp_path, size=16, context=0)
    with pytest.raises(DataError, match=r"train\.bin: .*fits 4 channels at 16² — a 2D file read as 2\.5D "
                                        r"\(context 1\)"):
        brats.Brats(str(tmp_path), size=16, context=1).records("train")
    write_brats(tmp_path, size=16, context=1)
    with pytest.raises(DataError, match=r"fits 12 channels at 16² — a 2\.5D \(context 1\) file read as 2D"):
        brats.Brats(str(tmp_path), size=16, context=0).records("train")


def test_brats_file_of_another_size_names_the_size_it_fits(tmp_path):
    """A set of one's own in brats' format at 32², read at the default 240², was "truncated, or not this format"
    and nothing more (only 240² and 224² were tried): the size is now solved from the file's length."""
    write_brats(tmp_path, size=32, context=0)
    with pytest.raises(DataError, match=r"train\.bin: .*not this format; its length fits 4 channels at 32² — a 32² "
                                        r"file read at 240²\? \(the data option size=32\)$"):
        brats.Brats(str(tmp_path)).records("train")
    with pytest.raises(DataError, match=r"fits 4 channels at 32² — a 2D file read as 2\.5D \(context 1\) at 224²\? "
                                        r"\(the data options size=32 context=0\)$"):
        brats.Brats224Context(str(tmp_path)).records("train")
    assert brats.Brats(str(tmp_path), size=32).records("train")[0].shape == (4, 4, 32, 32)  # as the hint says


def test_brats_bad_mask_label(tmp_path):
    write_brats(tmp_path, size=16)
    raw = bytearray((tmp_path / "val.bin").read_bytes())
    raw[-1] = 4
    (tmp_path / "val.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"val\.bin: mask label 4 in records 0\.\.3, out of range 0\.\.3"):
        brats.Brats(str(tmp_path), size=16).records("test")


# ------------------------------------------------------------------ augmentation
def test_transforms_compose_and_are_pure_functions_of_the_step_seed():
    x = np.arange(2 * 3 * 6 * 6, dtype=np.uint8).reshape(2, 3, 6, 6)
    y = np.array([1, 2], np.int32)
    t = A.compose(A.RandomCrop(4, padding=1), A.HorizontalFlip(p=1.0), A.Normalize((0, 0, 0), (1, 1, 1), 1.0))
    a, ya = t(x, y, A.step_rng(5, 2, 7))
    b, _ = t(x, y, A.step_rng(5, 2, 7))
    assert a.dtype == np.float32 and a.shape == (2, 3, 4, 4) and np.array_equal(a, b) and ya is y
    flipped, _ = A.HorizontalFlip(p=1.0)(x, y, A.step_rng(0))
    assert np.array_equal(flipped, x[..., ::-1])
    same, _ = A.HorizontalFlip(p=0.0)(x, y, A.step_rng(0))
    assert np.array_equal(same, x)
    centre, _ = A.CenterCrop(4)(x, y, A.step_rng(0))
    assert np.array_equal(centre, x[:, :, 1:5, 1:5])
    with pytest.raises(DataError, match="too small"):
        A.RandomCrop(9)(x, y, A.step_rng(0))


def test_random_resized_crop_full_box_is_identity_and_boxes_are_in_range():
    x = np.random.default_rng(0).random((3, 2, 8, 8)).astype(np.float32)
    full, _ = A.RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(1.0, 1.0))(x, np.zeros(3), A.step_rng(0))
    assert np.allclose(full, x, atol=1e-6)
    t = A.RandomResizedCrop(5)
    rng = A.step_rng(1)
    for _ in range(200):
        top, left, bh, bw = t.box(20, 30, rng)
        assert 0 <= top and top + bh <= 20 and 0 <= left and left + bw <= 30 and bh > 0 and bw > 0
    out, _ = t(x, np.zeros(3), A.step_rng(2))
    assert out.shape == (3, 2, 5, 5) and out.min() >= 0.0 and out.max() <= 1.0
