"""The imagenette dataset's class count from the classes.json `hloforge prepare imagenette` writes (a
2-class folder once trained a 10-class head silently), and prepare skipping an image it cannot decode
instead of aborting the whole run (fuzz3 findings 5 and 10). Tiny JPEG trees written with Pillow."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from test_prepare import write_jpeg_tree

import hloforge as hf
from hloforge.cli import EXIT_BAD_INPUT, EXIT_OK, main
from hloforge.core.errors import DataError, HloforgeError
from hloforge.datasets import imagenette
from hloforge.datasets.imagenette import Imagenette
from hloforge.datasets.prepare import prepare
from hloforge.datasets.records import COUNT_HEADER

CLASSES = ("cat", "dog")
TRAIN, VAL = 12, 8  # the stored sides: small, so every test prepares in milliseconds


def prepared(tmp_path) -> str:
    write_jpeg_tree(tmp_path / "src", per_class=3, classes=CLASSES)
    out = str(tmp_path / "out")
    prepare("imagenette", str(tmp_path / "src"), out, train_size=TRAIN, val_size=VAL)
    return out


def train_args(out: str, run_dir, *extra: str) -> list[str]:
    return ["train", *extra, "--data", "imagenette", "--data-dir", out, "--data-opt", f"train_size={TRAIN}",
            "--data-opt", f"crop={VAL}", "--epochs", "1", "--batch", "2", "--run-dir", str(run_dir), "--no-progress"]


# ------------------------------------------------------------------ the class count
def test_a_head_and_an_input_that_both_differ_are_said_in_one_line(tmp_path, capsys) -> None:
    """The README's prepare-then-train walk: before, the class count was refused first, and with --classes added the
    input next, one flag a try; now the first line names both, and the flags it gives train."""
    out = prepared(tmp_path)
    capsys.readouterr()
    assert main(train_args(out, tmp_path / "r", "resnet-mini")) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == (f"hloforge: error: dataset 'imagenette' has 2 classes and inputs of shape [3, {VAL}, {VAL}], net "
                   f"'resnet-mini' has 10 and takes [1, 28, 28]; pass --classes 2 --input 3,{VAL},{VAL} (hf.Model's "
                   f"classes=2, input=(3, {VAL}, {VAL})) to give the net a head of 2 and that input\n")
    flags = err.split("pass ", 1)[1].split(" (", 1)[0].split()
    assert main(train_args(out, tmp_path / "r", "resnet-mini", *flags)) == EXIT_OK


def test_the_dataset_takes_its_class_count_from_classes_json(tmp_path) -> None:
    out = prepared(tmp_path)
    ds = Imagenette(out, train_size=TRAIN, crop=VAL)
    assert ds.num_classes == 2
    assert list(ds.records("train")[1]) == [0, 0, 0, 1, 1, 1]
    assert Imagenette(out, train_size=TRAIN, crop=VAL, classes=5).num_classes == 5  # a wider head, asked for
    with pytest.raises(DataError, match=rf"^imagenette: classes 1, but {out}/classes.json names 2; leave the option "
                                        "out to read its count$"):
        Imagenette(out, train_size=TRAIN, crop=VAL, classes=1)
    os.remove(os.path.join(out, "classes.json"))  # files without one: Imagenette's 10, as before
    assert Imagenette(out, train_size=TRAIN, crop=VAL).num_classes == imagenette.CLASSES == 10


def test_a_two_class_folder_trains_a_two_class_head_or_says_what_to_pass(tmp_path, capsys) -> None:
    out = prepared(tmp_path)
    capsys.readouterr()
    net = ["resnet-mini", "--input", f"3,{VAL},{VAL}"]
    assert main(train_args(out, tmp_path / "ten", *net)) == EXIT_BAD_INPUT  # the net's own 10 classes
    err = capsys.readouterr().err
    assert err == ("hloforge: error: dataset 'imagenette' has 2 classes, net 'resnet-mini' has 10; pass --classes 2 "
                   "(hf.Model's classes=2) to give the net a head of 2\n")
    assert main(train_args(out, tmp_path / "two", *net, "--classes", "2")) == EXIT_OK
    assert "test top-1" in capsys.readouterr().out
    assert hf.load(str(tmp_path / "two")).spec.num_classes == 2
    # a net defined at one size: --classes cannot reshape it, and the line says so
    assert main(train_args(out, tmp_path / "fixed", "mnist-cnn")) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dataset 'imagenette' has 2 classes, net 'mnist-cnn' has 10, a head it states " \
        "itself (--classes does not reshape it): train a net of 2 classes, e.g. a zoo net that takes --classes 2 " \
        "(hf.Model's classes=2)" in err


def test_a_models_fit_on_the_folder_names_the_keywords_it_takes(tmp_path) -> None:
    """Before: hf.Model's fit said 'pass --classes 2' and 'pass --input 3,8,8', flags it takes no such way."""
    out = prepared(tmp_path)
    opts = {"data_dir": out, "train_size": TRAIN, "crop": VAL}
    with pytest.raises(HloforgeError, match=re.escape(f"pass --classes 2 --input 3,{VAL},{VAL} (hf.Model's classes=2, "
                                                      f"input=(3, {VAL}, {VAL})) to give")):
        hf.Model("resnet-mini").fit("imagenette", data_options=opts, batch_size=2, verbose=False)
    with pytest.raises(HloforgeError, match=re.escape(f"--input 3,{VAL},{VAL} (hf.Model's input=(3, {VAL}, {VAL}))")):
        hf.Model("resnet-mini", classes=2).fit("imagenette", data_options=opts, batch_size=2, verbose=False)
    model = hf.Model("resnet-mini", classes=2, input=(3, VAL, VAL))  # as the lines say
    assert "val_top1" in model.fit("imagenette", data_options=opts, batch_size=2, verbose=False)[-1]


@pytest.mark.parametrize("text, what", [
    ("not json", "cannot read it as JSON (Expecting value: line 1 column 1 (char 0)); expected the list of class "
                 "names `hloforge prepare imagenette` writes"),
    ('{"cat": 0}', "an object, not a list; expected a JSON list of 1..256 distinct class names"),
    ('"cat"', "a string, not a list; expected"),
    ("[]", "0 names; expected"),
    ('["cat", 7]', "a name that is not a string (7); expected"),
    ('["cat", "cat"]', "names repeated ('cat'); expected"),
    (json.dumps([f"c{i}" for i in range(257)]), "257 names; expected"),
])
def test_a_malformed_classes_json_is_one_line(tmp_path, capsys, text, what) -> None:
    out = prepared(tmp_path)
    path = os.path.join(out, "classes.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(DataError, match="^" + re.escape(f"{path}: {what}")):
        Imagenette(out, train_size=TRAIN, crop=VAL)
    capsys.readouterr()
    assert main(train_args(out, tmp_path / "run", "resnet-mini", "--input", f"3,{VAL},{VAL}")) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"hloforge: error: {path}: {what}") and err.count("\n") == 1


def test_labels_past_the_count_classes_json_gives_are_refused(tmp_path) -> None:
    out = prepared(tmp_path)
    with open(os.path.join(out, "classes.json"), "w", encoding="utf-8") as f:
        json.dump(["cat"], f)  # the files hold labels 0 and 1
    ds = Imagenette(out, train_size=TRAIN, crop=VAL)
    assert ds.num_classes == 1
    for split, fname in imagenette.FILES.items():
        with pytest.raises(DataError, match=rf"^{out}/{fname}: label 1 out of range 0..0 \(the class count "
                                            rf"{out}/classes.json gives\)$"):
            ds.records(split)


# ------------------------------------------------------------------ undecodable images
def counted(path: str, side: int) -> tuple[int, int]:
    """(the header's record count, the records the file's length holds)."""
    with open(path, "rb") as f:
        (count,) = COUNT_HEADER.unpack(f.read(COUNT_HEADER.size))
    held, over = divmod(os.path.getsize(path) - COUNT_HEADER.size, imagenette.record_bytes(side))
    assert over == 0
    return count, held


def test_prepare_skips_an_undecodable_image_and_names_the_first_per_split(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    write_jpeg_tree(src, per_class=3, classes=CLASSES)
    (src / "train" / "cat" / "img_1.JPEG").write_bytes(b"not a jpeg")
    (src / "train" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    good = (src / "val" / "dog" / "img_0.JPEG").read_bytes()
    (src / "val" / "dog" / "img_2.JPEG").write_bytes(good[:len(good) // 3])  # a truncated JPEG
    out = str(tmp_path / "out")
    capsys.readouterr()
    assert main(["prepare", "imagenette", str(src), out, "--train-size", str(TRAIN), "--val-size", str(VAL)]) == EXIT_OK
    said, err = capsys.readouterr()
    assert err == "" and "Traceback" not in said
    lines = said.splitlines()
    assert lines[0] == f"prepared imagenette: {out}/train.bin (5 records), {out}/val.bin (5 records)"
    assert lines[1] == (f"  {src}/train: skipped 2 of 7 images that cannot be decoded; the first: "
                        f"{src}/train/cat/img_1.JPEG (cannot identify image file '{src}/train/cat/img_1.JPEG')")
    assert lines[2].startswith(f"  {src}/val: skipped 1 of 6 images that cannot be decoded; the first: "
                               f"{src}/val/dog/img_2.JPEG (") and lines[2].endswith(")")
    assert len(lines) == 4 and lines[3].startswith("  train on them with:")
    # the headers count the records written, so the dataset's length check reads both files
    assert counted(os.path.join(out, "train.bin"), TRAIN) == (5, 5)
    assert counted(os.path.join(out, "val.bin"), VAL) == (5, 5)
    ds = Imagenette(out, train_size=TRAIN, crop=VAL)
    x, y = ds.records("train")
    # green (channel 1) is the second class's colour in write_jpeg_tree
    assert list(y) == [0, 0, 1, 1, 1] and np.abs(x[:, 1].astype(int) - np.array([30, 30, 200, 200, 200])[:, None,
                                                                                  None]).max() <= 3
    assert list(ds.records("test")[1]) == [0, 0, 0, 1, 1]


def test_prepare_refuses_a_class_or_split_with_no_readable_image(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    write_jpeg_tree(src, per_class=2, classes=CLASSES)
    for i in range(2):
        (src / "val" / "dog" / f"img_{i}.JPEG").write_bytes(b"garbage")
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["prepare", "imagenette", str(src), str(out), "--train-size", str(TRAIN), "--val-size",
                 str(VAL)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err == (f"hloforge: error: {src}/val/dog: none of its 2 images can be decoded (the first: "
                   f"{src}/val/dog/img_0.JPEG (cannot identify image file '{src}/val/dog/img_0.JPEG')); "
                   "each class needs at least one\n")
    assert not (out / "val.bin").exists() and not (out / "val.bin.tmp").exists()
    for i in range(2):  # no image files left in val at all: the split is refused, and leaves no empty val.bin
        os.remove(src / "val" / "dog" / f"img_{i}.JPEG")
        os.remove(src / "val" / "cat" / f"img_{i}.JPEG")
    with pytest.raises(DataError, match=rf"^{src}/val: no images \(.jpeg, .jpg, .png\) in its class folders$"):
        prepare("imagenette", str(src), str(out), train_size=TRAIN, val_size=VAL)
    assert not out.exists()  # not even the train split it had written, nor the OUT it made


def test_a_prepare_that_fails_on_its_second_split_leaves_the_earlier_files_whole(tmp_path) -> None:
    """Before, the new train.bin was renamed into place before val failed, beside the old val.bin and the
    old classes.json: a set whose class counts disagree, read without a word."""
    out = tmp_path / "out"
    before = tmp_path / "before"
    write_jpeg_tree(before, per_class=1, classes=("ant", "bee", "cow"))
    prepare("imagenette", str(before), str(out), train_size=TRAIN, val_size=VAL)
    earlier = {name: (out / name).read_bytes() for name in os.listdir(out)}
    assert sorted(earlier) == ["classes.json", "train.bin", "val.bin"]
    src = tmp_path / "src"
    write_jpeg_tree(src, per_class=2, classes=CLASSES)
    for i in range(2):
        (src / "val" / "dog" / f"img_{i}.JPEG").write_bytes(b"garbage")
    with pytest.raises(DataError, match="none of its 2 images can be decoded"):
        prepare("imagenette", str(src), str(out), train_size=TRAIN, val_size=VAL)
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == earlier
    assert imagenette.stated_classes(str(out)) == 3
