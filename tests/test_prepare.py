"""`hloforge prepare` end to end: tiny real inputs (JPEGs written with Pillow, NIfTI volumes written
with nibabel) -> the binaries -> the dataset loaders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hloforge.cli import main
from hloforge.core.errors import DataError
from hloforge.datasets import brats
from hloforge.datasets.brats import Brats
from hloforge.datasets.imagenette import Imagenette
from hloforge.datasets.prepare import PREPARERS, fit_plane, prepare, znorm_brain

CLASSES = ("n01440764", "n02102040", "n02979186")


def write_jpeg_tree(root, per_class=2, classes=CLASSES):
    """SRC/{train,val}/<class>/img_<i>.JPEG: solid colour images, one colour per class (JPEG keeps flat
    colour), and a stray notes.txt in each class folder."""
    from PIL import Image

    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    for split in ("train", "val"):
        for c, wnid in enumerate(classes):
            d = root / split / wnid
            d.mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (40 + 7 * i, 30), colours[c]).save(d / f"img_{i}.JPEG", quality=95)
            (d / "notes.txt").write_text("not an image")


def test_prepare_onto_a_full_disk_names_the_file_in_one_line(tmp_path):
    """A write limit (RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC) the first record file passes: before, 'hloforge:
    error: a file: file too large', naming none. Nothing of this prepare is left: not the OUT it made."""
    import resource
    import subprocess
    import sys

    write_jpeg_tree(tmp_path / "src")

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))

    done = subprocess.run([sys.executable, "-m", "hloforge", "prepare", "imagenette", "src", "out", "--train-size",
                           "32", "--val-size", "24"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=capped)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "hloforge: error: could not write out/train.bin: File too large (what out held before is untouched, the new "
        "files removed); free space and prepare again")
    assert not (tmp_path / "out").exists()


def test_prepare_imagenette_from_jpeg_folders_through_the_cli(tmp_path, capsys):
    write_jpeg_tree(tmp_path / "src")
    out = tmp_path / "out"
    assert main(["prepare", "imagenette", str(tmp_path / "src"), str(out), "--train-size", "12",
                 "--val-size", "8"]) == 0
    assert "train.bin (6 records)" in capsys.readouterr().out
    assert json.loads((out / "classes.json").read_text()) == list(CLASSES)
    ds = Imagenette(str(out), train_size=12, crop=8, classes=3)
    x, y = ds.records("train")
    assert x.shape == (6, 3, 12, 12) and list(y) == [0, 0, 1, 1, 2, 2]
    assert np.abs(x[0, 0].astype(int) - 200).max() <= 3 and np.abs(x[0, 1].astype(int) - 30).max() <= 3
    assert np.abs(x[4, 2].astype(int) - 200).max() <= 3
    xv, yv = ds.arrays("test")
    assert xv.shape == (6, 3, 8, 8) and list(yv) == [0, 0, 1, 1, 2, 2]


def test_prepare_imagenette_val_shows_what_training_centre_crop_shows(tmp_path):
    """A val image is the centre crop of the image resized as train's are (resize to train_size, centre val_size),
    the window training takes without augmentation: before, the whole image resized to val_size, its objects
    train_size/val_size smaller than training ever saw them (256/224 at the defaults)."""
    from PIL import Image

    from hloforge.datasets.augment import CenterCrop

    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    for split in ("train", "val"):  # the same picture in both splits, as PNG (lossless)
        (tmp_path / "src" / split / "a").mkdir(parents=True)
        picture.save(tmp_path / "src" / split / "a" / "p.png")
    prepare("imagenette", str(tmp_path / "src"), str(tmp_path / "out"), train_size=16, val_size=10)
    ds = Imagenette(str(tmp_path / "out"), train_size=16, crop=10, classes=1)
    x_train, _ = ds.records("train")
    x_val, _ = ds.records("test")
    want, _ = CenterCrop(10)(x_train, np.zeros(1), rng)
    assert np.array_equal(x_val, want)


def test_prepare_imagenette_refuses_mismatched_classes_and_bad_images(tmp_path):
    write_jpeg_tree(tmp_path / "src")
    (tmp_path / "src" / "val" / "n99999999").mkdir()
    with pytest.raises(DataError, match=r"val has class folders \['n99999999'\] not in train"):
        prepare("imagenette", str(tmp_path / "src"), str(tmp_path / "out"))
    (tmp_path / "src" / "val" / "n99999999").rmdir()
    for i in range(2):  # every image of one class undecodable (one alone is skipped: test_imagenette_classes)
        (tmp_path / "src" / "train" / CLASSES[0] / f"img_{i}.JPEG").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=rf"train/{CLASSES[0]}: none of its 2 images can be decoded"):
        prepare("imagenette", str(tmp_path / "src"), str(tmp_path / "out"), train_size=12, val_size=8)
    assert not (tmp_path / "out" / "train.bin").exists() and not (tmp_path / "out" / "train.bin.tmp").exists()
    with pytest.raises(DataError, match="no preparer for 'mnist'"):
        prepare("mnist", "a", "b")


# ------------------------------------------------------------------ brats
def write_msd_task(root, n_cases=3, shape=(20, 18, 6), seed=0):
    """A tiny Task01_BrainTumour: dataset.json, imagesTr 4D (X, Y, Z, 4), labelsTr 3D; returns the volumes."""
    import nibabel as nib

    rng = np.random.default_rng(seed)
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    vols, entries = {}, []
    for i in range(n_cases):
        name = f"BRATS_{i + 1:03d}.nii.gz"
        img = np.zeros((*shape, 4), np.float32)
        img[3:17, 3:15] = rng.normal(100 + 10 * np.arange(4), 20, (14, 12, shape[2], 4))  # the "brain"
        lbl = np.zeros(shape, np.uint8)
        for z in (1, 2, 4):  # tumour on three slices; slices 0, 3 and 5 have none
            lbl[6:10, 5:9, z] = rng.integers(1, 4, (4, 4))
        nib.save(nib.Nifti1Image(img, np.eye(4)), str(root / "imagesTr" / name))
        nib.save(nib.Nifti1Image(lbl, np.eye(4)), str(root / "labelsTr" / name))
        vols[name] = (img, lbl)
        entries.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    (root / "dataset.json").write_text(json.dumps({"name": "BRATS", "training": entries}))
    return vols


def test_prepare_brats_2d_and_25d_from_nifti(tmp_path):
    vols = write_msd_task(tmp_path / "task")
    s2 = prepare("brats", str(tmp_path / "task"), str(tmp_path / "2d"), size=16, val_frac=0.34, stride=1)
    assert len(s2["train_volumes"]) == 2 and len(s2["val_volumes"]) == 1
    assert s2["records"] == {"train.bin": 6, "val.bin": 3}  # three tumour slices per volume
    assert json.loads((tmp_path / "2d" / "split.json").read_text())["val_volumes"] == s2["val_volumes"]
    x, y = Brats(str(tmp_path / "2d"), size=16).arrays("test")
    img, lbl = vols[s2["val_volumes"][0]]
    for k, z in enumerate((1, 2, 4)):
        want_mask = fit_plane(lbl, 16)[:, :, z].T  # rows y, columns x
        assert np.array_equal(y[k], want_mask)
        for m in range(4):
            want = fit_plane(znorm_brain(img[..., m]), 16)[:, :, z].T
            assert np.allclose(x[k, m], np.clip(want, -5, 5), atol=5 / 127 / 2 + 1e-5)
    assert (x[:, :, 0, 0] == 0).all(), "background (outside the brain) must come back as exact zero"

    s3 = prepare("brats", str(tmp_path / "task"), str(tmp_path / "25d"), size=16, val_frac=0.34, stride=1, context=1)
    assert s3["records"] == s2["records"] and s3["channels"] == 12
    # the options that read them, which `hloforge prepare` prints as its train line (they were not said)
    assert s2["data_options"] == ["size=16"] and s3["data_options"] == ["size=16", "context=1"]
    assert "data_options" not in json.loads((tmp_path / "25d" / "split.json").read_text())
    x3, y3 = Brats(str(tmp_path / "25d"), size=16, context=1).arrays("test")
    assert np.array_equal(y3, y) and np.array_equal(x3[:, 4:8], x), "the centre slice sits at channels 4..7"
    assert np.array_equal(x3[1, 0:4], x[0]), "slice 2's lower neighbour is slice 1, the first kept slice"
    with pytest.raises(DataError, match="a 2.5D \\(context 1\\) file read as 2D"):
        Brats(str(tmp_path / "25d"), size=16).records("test")


def test_prepare_brats_stride_options_and_bad_input(tmp_path):
    write_msd_task(tmp_path / "task")
    s = prepare("brats", str(tmp_path / "task"), str(tmp_path / "o"), size=16, val_frac=0.34, stride=2)
    assert s["records"] == {"train.bin": 4, "val.bin": 2}  # kept slices 1 and 4 of each volume
    s = prepare("brats", str(tmp_path / "task"), str(tmp_path / "o"), size=16, val_frac=0.34, stride=1,
                min_tumor_px=0)
    assert s["records"] == {"train.bin": 12, "val.bin": 6}
    with pytest.raises(DataError, match="not a positive multiple of 16"):
        prepare("brats", str(tmp_path / "task"), str(tmp_path / "o"), size=20)
    with pytest.raises(DataError, match=r"dataset\.json: cannot read MSD's training list"):
        prepare("brats", str(tmp_path / "nowhere"), str(tmp_path / "o"), size=16)
    (tmp_path / "task" / "labelsTr" / "BRATS_002.nii.gz").write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"BRATS_002\.nii\.gz: cannot read it as NIfTI"):
        prepare("brats", str(tmp_path / "task"), str(tmp_path / "o"), size=16, val_frac=0.34)


def test_prepare_brats_refuses_what_it_stored_wrong_or_crashed_on(tmp_path):
    """Before: a NaN voxel stored its whole modality as zeros (its z-score NaN), a label 1.4 was stored as
    class 1, both with exit 0; a training list of another shape was a TypeError or KeyError."""
    import nibabel as nib

    vols = write_msd_task(tmp_path / "task")
    name = sorted(vols)[1]
    img, lbl = vols[name]
    meta = (tmp_path / "task" / "dataset.json").read_text()
    for training in ([1, 2], [{"label": "x"}], None, 5, [{"image": None}], "ab"):
        (tmp_path / "task" / "dataset.json").write_text(json.dumps({"training": training}))
        with pytest.raises(DataError, match=r'dataset\.json: its "training" holds .*; expected a list of'):
            prepare("brats", str(tmp_path / "task"), str(tmp_path / "o"), size=16)
    (tmp_path / "task" / "dataset.json").write_text(meta)
    for value, modality in ((np.nan, 0), (np.inf, 1)):
        bad = img.copy()
        bad[10, 10, 2, modality] = value
        nib.save(nib.Nifti1Image(bad, np.eye(4)), str(tmp_path / "task" / "imagesTr" / name))
        with pytest.raises(DataError, match=rf"imagesTr/{name}: 1 voxels are NaN or infinite \(the first at "
                                            rf"\[10, 10, 2, {modality}\]\)"):
            prepare("brats", str(tmp_path / "task"), str(tmp_path / "o"), size=16, val_frac=0.34)
    nib.save(nib.Nifti1Image(img, np.eye(4)), str(tmp_path / "task" / "imagesTr" / name))
    frac = lbl.astype(np.float32)
    frac[7, 6, 2] = 1.4
    nib.save(nib.Nifti1Image(frac, np.eye(4)), str(tmp_path / "task" / "labelsTr" / name))
    with pytest.raises(DataError, match=rf"labelsTr/{name}: labels such as 1.4 are not whole numbers"):
        prepare("brats", str(tmp_path / "task"), str(tmp_path / "o"), size=16, val_frac=0.34)
    assert not (tmp_path / "o" / "train.bin").exists()


def test_preparers_table_is_the_cli_dispatch():
    assert {"imagenette", "brats"} <= set(PREPARERS)
    assert brats.NATIVE_SIZE == [o for o in PREPARERS["brats"].options if o.name == "size"][0].default
