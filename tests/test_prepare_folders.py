"""`hloforge prepare imagenette` on a user's own class folders as they are found on disk: what else lies
beside the class folders (hidden folders, links). Tiny trees written with Pillow."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_prepare import write_jpeg_tree

from hloforge.cli import EXIT_BAD_INPUT, EXIT_OK, main
from hloforge.core.errors import DataError
from hloforge.datasets.imagenette import Imagenette
from hloforge.datasets.prepare import prepare

CLASSES = ("cat", "dog")
TRAIN, VAL = 12, 8


def test_a_hidden_folder_beside_the_class_folders_is_no_class(tmp_path, capsys) -> None:
    """Jupyter writes .ipynb_checkpoints into the folder a notebook is opened in: before, it was class 0 (every
    label shifted by one, a head one wider), or, in one split alone, the whole prepare was refused for lacking it."""
    src, out = tmp_path / "src", tmp_path / "out"
    write_jpeg_tree(src, per_class=2, classes=CLASSES)
    for split in ("train", "val"):
        (src / split / ".ipynb_checkpoints").mkdir()
        (src / split / "cat" / "img_0.JPEG").rename(src / split / ".ipynb_checkpoints" / "img_0.JPEG")
    (src / "train" / ".git").mkdir()  # in train alone
    assert main(["prepare", "imagenette", str(src), str(out), "--train-size", str(TRAIN),
                 "--val-size", str(VAL)]) == EXIT_OK
    assert "Traceback" not in capsys.readouterr().err
    assert json.loads((out / "classes.json").read_text()) == list(CLASSES)
    ds = Imagenette(str(out), train_size=TRAIN, crop=VAL)
    assert ds.num_classes == 2 and list(ds.records("train")[1]) == [0, 1, 1]


def test_a_link_to_a_class_folder_that_is_not_there_is_one_line(tmp_path, capsys) -> None:
    """A class folder linked from a drive not mounted, or a link loop: before, no folder, left out without a word,
    its class missing from both splits and the rest prepared as if it never was."""
    src, out = tmp_path / "src", tmp_path / "out"
    write_jpeg_tree(src, per_class=2, classes=CLASSES)
    for split in ("train", "val"):
        (src / split / "eel").symlink_to(tmp_path / "unmounted" / split / "eel")
    assert main(["prepare", "imagenette", str(src), str(out)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (
        f"hloforge: error: {src}/train/eel: a link to {tmp_path}/unmounted/train/eel, which is not there (or links "
        "back to itself); expected a class folder: mount or mend what it links to, or remove the link\n")
    assert not out.exists()
    for split in ("train", "val"):
        (src / split / "eel").unlink()
        (src / split / "loop").symlink_to("loop")
    (src / "train" / "loop2").symlink_to("loop2")
    assert main(["prepare", "imagenette", str(src), str(out)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith(f"hloforge: error: {src}/train/loop: a link to loop, which is not "
                                              f"there (or links back to itself); so are {src}/train/loop2; expected")


def test_a_class_whose_images_lie_one_folder_down_is_told_to_move_them_up(tmp_path) -> None:
    """cat/batch1/*.JPEG: before, 'class folder cat holds no image ...: add some', when its images are there, one
    folder too deep (the nested-folder warning that says so is never shown when the class is refused)."""
    src = tmp_path / "src"
    write_jpeg_tree(src, per_class=2, classes=CLASSES)
    (src / "train" / "cat" / "batch1").mkdir()
    for i in range(2):
        (src / "train" / "cat" / f"img_{i}.JPEG").rename(src / "train" / "cat" / "batch1" / f"img_{i}.JPEG")
    with pytest.raises(DataError) as e:
        prepare("imagenette", str(src), str(tmp_path / "out"))
    assert str(e.value) == (f"{src}/train: class folder cat holds no .jpeg/.jpg/.png image (cat: 1 folder inside it, "
                            "batch1); each class needs at least one in each split: move their images up (a class's "
                            "images lie directly in its folder), or remove the class from both splits")
    for cls in CLASSES:  # every class of a split so
        (src / "val" / cls / "2019").mkdir()
        for i in range(2):
            (src / "val" / cls / f"img_{i}.JPEG").rename(src / "val" / cls / "2019" / f"img_{i}.JPEG")
    (src / "train" / "cat" / "batch1" / "img_0.JPEG").rename(src / "train" / "cat" / "img_0.JPEG")
    with pytest.raises(DataError) as e:
        prepare("imagenette", str(src), str(tmp_path / "out"))
    assert str(e.value) == (f"{src}/val: no images (.jpeg, .jpg, .png) in its class folders but in folders inside "
                            "them (cat/2019, dog/2019): move their images up")


def test_a_split_given_as_src_is_told_to_pass_its_parent(tmp_path) -> None:
    """SRC/train passed for SRC: before, 'SRC/train holds folders cat, dog, its classes not yet split? move each
    class's images into SRC/train/train/<class>/ ...', sending the user to nest the split in itself."""
    src = tmp_path / "src"
    write_jpeg_tree(src, per_class=1, classes=CLASSES)
    for split, other in (("train", "val"), ("val", "train")):
        with pytest.raises(DataError) as e:
            prepare("imagenette", str(src / split), str(tmp_path / "out"))
        assert str(e.value).startswith(f"{src}/{split}/train not found: {src}/{split} is itself a split, beside "
                                       f"{src}/{other}; pass their parent, {src}, as SRC; expected")
    assert not (tmp_path / "out").exists()


def test_an_image_past_pillows_warning_limit_is_prepared_without_its_warning(tmp_path, capsys, monkeypatch) -> None:
    """An image past Pillow's MAX_IMAGE_PIXELS (89M pixels, a 108-megapixel phone photo's; lowered here) and under
    twice it: before, decoded, and a raw 'DecompressionBombWarning: ... could be decompression bomb DOS attack.' and
    '  warnings.warn(' printed amid prepare's lines. One past twice the limit is skipped and said, as before."""
    import warnings

    from PIL import Image

    src, out = tmp_path / "src", tmp_path / "out"
    write_jpeg_tree(src, per_class=1, classes=CLASSES)  # 40×30 and 30×30: under the limit
    Image.new("RGB", (60, 40), (9, 9, 9)).save(src / "train" / "cat" / "big.png")  # 2400 pixels: past it
    Image.new("RGB", (80, 80), (9, 9, 9)).save(src / "train" / "dog" / "bomb.png")  # 6400: past twice it
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be raised, the image skipped as undecodable
        assert main(["prepare", "imagenette", str(src), str(out), "--train-size", str(TRAIN),
                     "--val-size", str(VAL)]) == EXIT_OK
    said, err = capsys.readouterr()
    assert err == "" and "train.bin (3 records)" in said
    assert f"skipped 1 of 4 images that cannot be decoded; the first: {src}/train/dog/bomb.png (Image size" in said


def test_a_palette_png_with_transparency_is_prepared_without_pillows_warning(tmp_path, capsys) -> None:
    """A palette PNG whose tRNS chunk gives each palette entry an alpha (a web-optimised PNG's): before, Pillow's
    raw 'UserWarning: Palette images with Transparency expressed in bytes should be converted to RGBA images' and
    '  warnings.warn(' amid prepare's lines. The pixels stored are the palette's colours, as before."""
    import warnings

    from PIL import Image

    src, out = tmp_path / "src", tmp_path / "out"
    write_jpeg_tree(src, per_class=1, classes=CLASSES)
    rgb = np.random.default_rng(0).integers(0, 256, (TRAIN, TRAIN, 3), dtype=np.uint8)
    pal = Image.fromarray(rgb).quantize(16)
    pal.save(src / "train" / "cat" / "web.png", transparency=bytes([0] * 4 + [255] * 12))
    assert Image.open(src / "train" / "cat" / "web.png").info["transparency"][:5] == bytes([0] * 4 + [255])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be raised, the image skipped as undecodable
        assert main(["prepare", "imagenette", str(src), str(out), "--train-size", str(TRAIN),
                     "--val-size", str(VAL)]) == EXIT_OK
    said, err = capsys.readouterr()
    assert err == "" and "train.bin (3 records)" in said and "skipped" not in said
    x, _ = Imagenette(str(out), train_size=TRAIN, crop=VAL).records("train")
    assert np.array_equal(x[1], np.asarray(pal.convert("RGB")).transpose(2, 0, 1))  # cat's 2nd image, sorted


def test_a_jpeg_with_exif_cut_short_is_prepared_without_pillows_warning(tmp_path, capsys) -> None:
    """A camera's JPEG whose EXIF block is cut short: before, Pillow's raw 'UserWarning: Truncated File Read' and
    '  warnings.warn(str(msg))' amid prepare's lines (its pixels decoded all the same)."""
    import warnings

    from PIL import Image

    src, out = tmp_path / "src", tmp_path / "out"
    write_jpeg_tree(src, per_class=1, classes=CLASSES)
    exif = Image.Exif()
    exif[0x010E] = "a description " * 4
    Image.new("RGB", (20, 16), (200, 30, 30)).save(src / "train" / "cat" / "camera.jpg",
                                                   exif=exif.tobytes()[:-20], quality=95)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be raised, the image skipped as undecodable
        assert main(["prepare", "imagenette", str(src), str(out), "--train-size", str(TRAIN),
                     "--val-size", str(VAL)]) == EXIT_OK
    said, err = capsys.readouterr()
    assert err == "" and "train.bin (3 records)" in said and "skipped" not in said


def test_a_run_scored_on_a_folder_prepared_with_another_class_count_is_told_so(tmp_path, capsys) -> None:
    """A class folder added (or removed) and the folder prepared again, the run then scored on it: before,
    'pass --classes 3 (hf.Model's classes=3) to give the net a head of 3', a flag eval does not take and a head a
    checkpoint cannot change."""
    src, out, more = tmp_path / "src", tmp_path / "out", tmp_path / "more"
    write_jpeg_tree(src, per_class=2, classes=CLASSES)
    size = ["--train-size", str(TRAIN), "--val-size", str(VAL)]
    assert main(["prepare", "imagenette", str(src), str(out), *size]) == EXIT_OK
    assert main(["train", "resnet-mini", "--input", f"3,{VAL},{VAL}", "--classes", "2", "--data", "imagenette",
                 "--data-dir", str(out), "--data-opt", f"train_size={TRAIN}", "--data-opt", f"crop={VAL}",
                 "--epochs", "1", "--batch", "2", "--run-dir", str(tmp_path / "run"), "--no-progress"]) == EXIT_OK
    for split in ("train", "val"):
        (src / split / "eel").mkdir()
        (src / split / "cat" / "img_0.JPEG").rename(src / split / "eel" / "img_0.JPEG")
    assert main(["prepare", "imagenette", str(src), str(more), *size]) == EXIT_OK
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data-dir", str(more)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (
        f"hloforge: error: checkpoint {tmp_path}/run/checkpoint.safetensors: dataset 'imagenette' has 3 classes, net "
        "'resnet-mini' has 2: expected the data it was trained on, of 2 classes\n")


def test_the_macosx_folder_a_macs_zip_unpacks_is_no_class(tmp_path) -> None:
    """train.zip made on a Mac unpacks __MACOSX/<class>/._img.JPEG (AppleDouble files) beside the class folders:
    before, a class, refused as holding no image with 'move their images up', or, in one split alone, the whole
    prepare refused for val lacking it."""
    src, out = tmp_path / "src", tmp_path / "out"
    write_jpeg_tree(src, per_class=1, classes=CLASSES)
    for cls in CLASSES:
        (src / "train" / "__MACOSX" / cls).mkdir(parents=True)
        (src / "train" / "__MACOSX" / cls / "._img_0.JPEG").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    prepare("imagenette", str(src), str(out), train_size=TRAIN, val_size=VAL)
    assert json.loads((out / "classes.json").read_text()) == list(CLASSES)


def test_a_classifier_of_one_class_is_refused_before_it_trains(tmp_path, capsys) -> None:
    """A folder of one class folder, prepared and trained: before, 'loss 0.0000  test top-1 100.00%', a plausible
    number of a net that learnt nothing (cross-entropy over one class is 0 whatever the weights)."""
    src, out = tmp_path / "src", tmp_path / "out"
    write_jpeg_tree(src, per_class=2, classes=CLASSES[:1])
    prepare("imagenette", str(src), str(out), train_size=TRAIN, val_size=VAL)  # prepared: a DDPM may train on it
    capsys.readouterr()
    assert main(["train", "resnet-mini", "--input", f"3,{VAL},{VAL}", "--classes", "1", "--data", "imagenette",
                 "--data-dir", str(out), "--data-opt", f"train_size={TRAIN}", "--data-opt", f"crop={VAL}",
                 "--epochs", "1", "--batch", "2", "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (
        "hloforge: error: net 'resnet-mini' on dataset 'imagenette' has 1 class: a classifier of one class calls every "
        "example it (top-1 100%, its loss 0 whatever the weights), so it learns nothing; expected at least 2 classes\n")
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()


def test_a_named_pipe_among_the_images_is_skipped_not_waited_on(tmp_path) -> None:
    """A FIFO named like an image (a stream someone left in the folder): before, prepare opened it and waited for a
    writer forever. Run in a subprocess, so a hang fails the test rather than stalling it."""
    import os
    import subprocess
    import sys

    src = tmp_path / "src"
    write_jpeg_tree(src, per_class=1, classes=CLASSES)
    os.mkfifo(src / "train" / "cat" / "stream.png")
    done = subprocess.run([sys.executable, "-m", "hloforge", "prepare", "imagenette", "src", "out", "--train-size",
                           str(TRAIN), "--val-size", str(VAL)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == EXIT_OK and done.stderr == "", done.stderr
    assert ("  src/train: skipped 1 of 3 images that cannot be decoded; the first: src/train/cat/stream.png (a named "
            "pipe, socket or device, not a file, whose reading would never end; expected an image file)"
            in done.stdout.splitlines())


def test_a_named_pipe_for_a_yolo_label_file_is_one_line_not_waited_on(tmp_path) -> None:
    """prepare yolo with a FIFO where an image's label file is: before, it opened it and waited forever."""
    import os
    import subprocess
    import sys

    from PIL import Image

    for split in ("train", "val"):
        (tmp_path / "src" / "images" / split).mkdir(parents=True)
        (tmp_path / "src" / "labels" / split).mkdir(parents=True)
        for stem in ("a", "b"):
            Image.new("RGB", (16, 16), (200, 30, 30)).save(tmp_path / "src" / "images" / split / f"{stem}.png")
            (tmp_path / "src" / "labels" / split / f"{stem}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    os.remove(tmp_path / "src" / "labels" / "train" / "a.txt")
    os.mkfifo(tmp_path / "src" / "labels" / "train" / "a.txt")
    done = subprocess.run([sys.executable, "-m", "hloforge", "prepare", "yolo", "src", "out", "--size", "16",
                           "--grid", "2", "--classes", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_BAD_INPUT and done.stderr == (
        "hloforge: error: src/labels/train/a.txt: a named pipe, socket or device, not a file, whose reading would "
        "never end; expected a YOLO label file\n")
    assert not (tmp_path / "out").exists()


def test_a_model_is_not_scored_on_class_folders_renamed_since(tmp_path) -> None:
    """A class folder renamed (cat → zcat) and the folder prepared again numbers the classes otherwise (ids follow
    the names' order): `Model.evaluate(data=..., data_options=...)` scored it silently, each id read as another
    class (top-1 0.333 where it was 0.667 on the audit's set). The names recorded when it trained are checked, by the
    model that trained and by hf.load of its save alike; the folder as it was still scores."""
    import hloforge as hf

    src, out, renamed = tmp_path / "src", tmp_path / "out", tmp_path / "renamed"
    write_jpeg_tree(src, per_class=2, classes=("cat", "dog", "eel"))
    size = ["--train-size", str(TRAIN), "--val-size", str(VAL)]
    assert main(["prepare", "imagenette", str(src), str(out), *size]) == EXIT_OK
    for split in ("train", "val"):
        (src / split / "cat").rename(src / split / "zcat")
    assert main(["prepare", "imagenette", str(src), str(renamed), *size]) == EXIT_OK
    opts = {"train_size": TRAIN, "crop": VAL}
    m = hf.Model("resnet-mini", classes=3, input=(3, VAL, VAL))
    m.fit(data="imagenette", data_options={"data_dir": str(out), **opts}, epochs=1, batch_size=4, verbose=False)
    m.save(str(tmp_path / "run"))
    for model in (m, hf.load(str(tmp_path / "run"))):
        with pytest.raises(DataError, match=r"^evaluate: dataset 'imagenette' names its classes otherwise than the "
                                            r"data the model was fit on \(id 0: 'dog' here, 'cat' in training\)"):
            model.evaluate(data="imagenette", data_options={"data_dir": str(renamed), **opts})
        assert model.evaluate(data="imagenette", data_options={"data_dir": str(out), **opts})["n"] > 0
