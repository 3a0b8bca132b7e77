"""A user's data mistakes are named in one line, never dropped unseen or read as a plausible wrong thing:
images prepare cannot use, a YOLO split without labels, a dataset option of the wrong type, a text model's
export without its corpus and vocabulary, and `compare` of an EMA run on weights eval does not score."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from hloforge.cli import EXIT_BAD_INPUT, EXIT_OK, main
from hloforge.core.errors import DataError

TRAIN, VAL = 12, 8  # stored sides: small, so every prepare takes milliseconds


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _images(folder, names, colour=(200, 30, 30)) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Image.new("RGB", (20, 16), colour).save(folder / name)


# ------------------------------------------------------------------ 1. prepare imagenette
def _tree(src, extra_classes: dict[str, list[str]] | None = None) -> None:
    """SRC/{train,val}/{cat,dog}/*.jpg, plus `extra_classes` (class -> file names) in both splits."""
    for split in ("train", "val"):
        _images(src / split / "cat", ["a.jpg", "b.jpg"])
        _images(src / split / "dog", ["a.jpg"], (30, 200, 30))
        for cls, names in (extra_classes or {}).items():
            _images(src / split / cls, names)


def _prepare(src, out) -> int:
    return main(["prepare", "imagenette", str(src), str(out), "--train-size", str(TRAIN), "--val-size", str(VAL)])


def test_prepare_imagenette_refuses_a_class_of_images_it_cannot_read(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    _tree(src, {"bird": ["x.webp", "y.webp"], "fish": ["z.bmp"]})
    assert _prepare(src, tmp_path / "out") == EXIT_BAD_INPUT
    err = _one_line(capsys)
    assert err == (f"hloforge: error: {src}/train: class folders bird, fish hold no .jpeg/.jpg/.png image "
                   "(bird: 2 other image files, the first x.webp; fish: 1 other image file, the first z.bmp); each "
                   "class needs at least one in each split: convert them, or remove the class from both splits")
    assert not (tmp_path / "out" / "train.bin").exists()


def test_prepare_imagenette_refuses_an_empty_class_folder(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    _tree(src)
    (src / "val" / "cow").mkdir()
    (src / "train" / "cow").mkdir()
    _images(src / "train" / "cow", ["a.png"])
    assert _prepare(src, tmp_path / "out") == EXIT_BAD_INPUT
    assert _one_line(capsys) == (f"hloforge: error: {src}/val: class folder cow holds no .jpeg/.jpg/.png image; "
                                 "each class needs at least one in each split: add some, or remove the class from "
                                 "both splits")


def test_prepare_imagenette_names_the_images_it_skips(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    _tree(src)
    _images(src / "train" / "cat", ["c.webp", "d.tif"])
    _images(src / "train" / "dog" / "more", ["b.jpg"])  # a nested folder: its images are not the class's
    (src / "train" / "dog" / "notes.txt").write_text("no image")  # not an image: not reported
    (src / "train" / "dog" / ".DS_Store").write_bytes(b"\0")
    out = tmp_path / "out"
    assert _prepare(src, out) == EXIT_OK
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"prepared imagenette: {out}/train.bin (3 records), {out}/val.bin (3 records)"
    assert said[1:3] == [
        f"  {src}/train: skipped 2 image files that are not .jpeg/.jpg/.png (convert them to use them): "
        f"{src}/train/cat/c.webp, {src}/train/cat/d.tif",
        f"  {src}/train: skipped 1 folder inside class folders (a class's images lie directly in its folder): "
        f"{src}/train/dog/more",
    ]



def test_prepare_imagenette_says_one_skipped_image_in_the_singular(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    _tree(src)
    _images(src / "train" / "cat", ["c.webp"])
    assert _prepare(src, tmp_path / "out") == EXIT_OK
    assert f"  {src}/train: skipped 1 image file that is not .jpeg/.jpg/.png (convert it to use it): " \
           f"{src}/train/cat/c.webp" in capsys.readouterr().out.splitlines()


def test_prepare_imagenette_on_class_folders_not_yet_split_says_where_their_images_go(tmp_path, capsys) -> None:
    """A user's own SRC/<class>/*.jpg: before, 'SRC/train not found; expected class folders of images
    (SRC/train/<class>/*.JPEG)', naming no val split and not seeing the classes it held."""
    src = tmp_path / "src"
    _images(src / "cat", ["a.jpg"])
    _images(src / "dog", ["a.jpg"])
    assert _prepare(src, tmp_path / "out") == EXIT_BAD_INPUT
    assert _one_line(capsys) == (f"hloforge: error: {src}/train not found: {src} holds folders cat, dog, its classes "
                                 f"not yet split? move each class's images into {src}/train/<class>/ and some of them "
                                 f"(a fifth, say) into {src}/val/<class>/; expected class folders of images "
                                 "(SRC/train/<class>/*.JPEG and SRC/val/<class>/*.JPEG)")
    assert _prepare(tmp_path / "nowhere", tmp_path / "out") == EXIT_BAD_INPUT
    assert _one_line(capsys).startswith(f"hloforge: error: {tmp_path}/nowhere not found; expected a folder of class ")
    assert not (tmp_path / "out").exists()


def test_prepare_imagenette_says_when_folders_named_by_number_are_not_their_labels(tmp_path, capsys) -> None:
    """Folders 1, 2, 10 are labels 0, 2, 1 (names sort as text, '10' before '2'): before, not a word, so a user
    reading label 1 as class 1 (or 2) read every prediction wrong. Folders 0, 1, 2 are their labels: no word."""
    src = tmp_path / "src"
    for split in ("train", "val"):
        for name in ("1", "2", "10"):
            _images(src / split / name, ["a.jpg"])
    assert _prepare(src, tmp_path / "out") == EXIT_OK
    out = capsys.readouterr().out
    assert (f"  {src}/train: class folders named by number are labelled by their place in name order, not by their "
            f"number (label 0 is folder '1', label 1 is folder '10'); label i is the i-th name of "
            f"{tmp_path}/out/classes.json\n") in out
    assert json.loads((tmp_path / "out" / "classes.json").read_text()) == ["1", "10", "2"]
    for split in ("train", "val"):
        (src / split / "10").rename(src / split / "0")
    assert _prepare(src, tmp_path / "out2") == EXIT_OK
    assert "named by number" not in capsys.readouterr().out


def test_prepare_imagenette_says_when_class_names_differ_in_unicode_form_alone(tmp_path, capsys) -> None:
    """'café' composed in train, decomposed in val (as macOS writes names): before, 'val has class folders ['café']
    not in train and lacks ['café']', two names that print alike."""
    import unicodedata

    src = tmp_path / "src"
    for split, form in (("train", "NFC"), ("val", "NFD")):
        _images(src / split / unicodedata.normalize(form, "café"), ["a.jpg"])
        _images(src / split / "dog", ["a.jpg"])
    assert _prepare(src, tmp_path / "out") == EXIT_BAD_INPUT
    assert "; the names differ in Unicode form alone (é as one code point in one split, e + accent in the other, " \
        "as macOS writes them): rename one split's folders; both splits must use the same classes" in _one_line(capsys)


def test_training_on_the_jpeg_folders_themselves_says_to_prepare_them(tmp_path, capsys) -> None:
    """--data-dir at a user's own SRC/{train,val}/<class> folders: before, 'SRC/val.bin not found' and no more."""
    src = tmp_path / "src"
    _tree(src)
    train = ["train", "resnet-mini", "--classes", "2", "--input", f"3,{VAL},{VAL}", "--data", "imagenette",
             "--data-opt", f"train_size={TRAIN}", "--data-opt", f"crop={VAL}", "--epochs", "1", "--batch", "2",
             "--no-progress", "--run-dir", str(tmp_path / "run")]
    assert main([*train, "--data-dir", str(src)]) == EXIT_BAD_INPUT
    assert _one_line(capsys) == (f"hloforge: error: {src}/val.bin not found: {src} holds the class folders themselves "
                                 "(train/, val/); expected the binaries `hloforge prepare imagenette SRC OUT` writes "
                                 "from SRC/train/<class>/*.JPEG and SRC/val/<class>/*.JPEG, then --data-dir OUT")
    assert not (tmp_path / "run").exists()
    assert _prepare(src, tmp_path / "out") == EXIT_OK
    capsys.readouterr()
    assert main([*train, "--data-dir", str(tmp_path / "out")]) == EXIT_OK  # what the line says to do trains


# ------------------------------------------------------------------ 2. prepare yolo
def _yolo(src, label_splits=("train", "val")) -> None:
    for split in ("train", "val"):
        _images(src / "images" / split, ["0.png", "1.png"])
    for split in label_splits:
        (src / "labels" / split).mkdir(parents=True)
        (src / "labels" / split / "1.txt").write_text("1 0.5 0.5 0.4 0.4\n")


def _prepare_yolo(src, out) -> int:
    return main(["prepare", "yolo", str(src), str(out), "--size", "32", "--grid", "4", "--classes", "3"])


def test_prepare_yolo_refuses_a_split_without_its_labels_folder(tmp_path, capsys) -> None:
    src = tmp_path / "y4"
    _yolo(src, label_splits=("val",))
    assert _prepare_yolo(src, tmp_path / "out") == EXIT_BAD_INPUT
    assert _one_line(capsys) == (f"hloforge: error: {src}/labels/train not found; expected the label files (<image "
                                 f"stem>.txt) of {src}/images/train there")
    assert not (tmp_path / "out").exists()  # before: the OUT it made, left empty
    out = tmp_path / "new" / "out"
    assert _prepare_yolo(src, out) == EXIT_BAD_INPUT
    assert not (tmp_path / "new").exists()  # all or nothing: no folder made on the way to OUT either
    _one_line(capsys)


def test_prepare_yolo_names_a_near_miss_labels_folder(tmp_path, capsys) -> None:
    src = tmp_path / "y4"
    _yolo(src, label_splits=("train", "valid"))  # Roboflow's name for val
    assert _prepare_yolo(src, tmp_path / "out") == EXIT_BAD_INPUT
    assert _one_line(capsys) == (f"hloforge: error: {src}/labels/val not found; expected the label files (<image "
                                 f"stem>.txt) of {src}/images/val there ({src}/labels/valid is there: rename it "
                                 "val)")


def test_prepare_yolo_reports_label_files_of_no_image_whatever_their_suffix(tmp_path, capsys) -> None:
    src = tmp_path / "y4"
    _yolo(src)
    (src / "labels" / "train" / "0.TXT").write_text("0 0.5 0.5 0.2 0.2\n")  # image 0's, not read as its label
    (src / "labels" / "val" / "9.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    assert _prepare_yolo(src, tmp_path / "out") == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert (f"  {src}/labels/train: 1 label file(s) of no image (their boxes are not used); the first: 0.TXT (image "
            "0.png's label must be named 0.txt)") in lines
    assert f"  {src}/labels/val: 1 label file(s) of no image (their boxes are not used); the first: 9.txt" in lines


def test_prepare_yolo_refuses_a_split_none_of_whose_images_has_a_label(tmp_path, capsys) -> None:
    src = tmp_path / "y4"
    _yolo(src)
    os.rename(src / "labels" / "val" / "1.txt", src / "labels" / "val" / "1.TXT")
    assert _prepare_yolo(src, tmp_path / "out") == EXIT_BAD_INPUT
    assert _one_line(capsys) == (f"hloforge: error: {src}/labels/val: no label file of any image in {src}/images/val "
                                 "(expected <image stem>.txt; it holds 1 other file(s), the first 1.TXT); every image "
                                 "would have no boxes")


def test_prepare_yolo_skips_the_hidden_files_macos_writes_beside_each_image(tmp_path, capsys) -> None:
    """A dataset copied from a Mac to a USB drive or zipped there holds `._0.png` (AppleDouble) beside each image:
    prepare yolo read it as an image and refused the whole set ("cannot decode it as an image"), where prepare
    imagenette skips hidden files. It now skips them too, and writes what it writes without them."""
    src = tmp_path / "y4"
    _yolo(src)
    assert _prepare_yolo(src, tmp_path / "clean") == EXIT_OK
    for split in ("train", "val"):
        (src / "images" / split / "._0.png").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
        (src / "labels" / split / "._1.txt").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    capsys.readouterr()
    assert _prepare_yolo(src, tmp_path / "out") == EXIT_OK
    assert "._" not in capsys.readouterr().out  # nothing said of them: no one's data
    for name in ("train.bin", "test.bin"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()


# ------------------------------------------------------------------ 3. dataset options
@pytest.mark.parametrize(("data", "options", "message"), [
    ("shapes", {"n_train": 100.0}, "shapes n_train must be an integer ≥ 1, got 100.0"),
    ("shapes", {"n_test": "many"}, "shapes n_test must be an integer ≥ 1, got 'many'"),
    ("shapes", {"max_shapes": 1.5}, "shapes max_shapes must be an integer ≥ 1, got 1.5"),
    ("shapes", {"size": True}, "shapes size must be an integer ≥ 16, got True"),
    ("shapes", {"seed": -1}, "shapes seed must be an integer ≥ 0, got -1"),
    ("shapes", {"noise": "abc"}, "shapes noise must be a finite number ≥ 0, got 'abc'"),
    ("shapes", {"noise": float("nan")}, "shapes noise must be a finite number ≥ 0, got nan"),
    ("text", {"vocab": 65.0}, "text vocab must be an integer ≥ 2, got 65.0"),
    ("text", {"seq_len": "long"}, "text seq_len must be an integer ≥ 1, got 'long'"),
    ("text", {"data_file": 0}, "text data_file must be a path, got 0"),
    ("digits", {"size": 28.0}, "digits size must be an integer ≥ 8, got 28.0"),
    ("yolo", {"grid": 7.0}, "yolo grid must be an integer ≥ 1, got 7.0"),
    ("imagenette", {"classes": 2.0}, "imagenette classes must be an integer ≥ 1, got 2.0"),
    ("imagenette", {"crop": "big"}, "imagenette crop must be an integer ≥ 1, got 'big'"),
    ("brats", {"context": 0.5}, "brats context must be an integer ≥ 0, got 0.5"),
    ("mnist", {"data_dir": 5}, "mnist data_dir must be a path, got 5"),
    ("cifar10", {"data_dir": 5}, "cifar10 data_dir must be a path, got 5"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_every_builtin_dataset_checks_its_options_types(data, options, message, tmp_path) -> None:
    from hloforge.datasets.brats import Brats
    from hloforge.datasets.cifar10 import Cifar10
    from hloforge.datasets.digits import Digits
    from hloforge.datasets.imagenette import Imagenette
    from hloforge.datasets.mnist import Mnist
    from hloforge.datasets.shapes import Shapes
    from hloforge.datasets.text import Text
    from hloforge.datasets.yolo import Yolo

    cls = {"shapes": Shapes, "text": Text, "digits": Digits, "yolo": Yolo, "imagenette": Imagenette,
           "brats": Brats, "mnist": Mnist, "cifar10": Cifar10}[data]
    if "data_dir" not in options and data in ("yolo", "imagenette", "brats"):
        options = {"data_dir": str(tmp_path), **options}
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        cls(**options)


def test_a_mistyped_data_option_is_one_line_through_the_cli(tmp_path, capsys) -> None:
    assert main(["train", "unet-mini", "--data", "shapes", "--data-opt", "noise=abc", "--epochs", "1",
                 "--run-dir", str(tmp_path / "r"), "--no-progress"]) == EXIT_BAD_INPUT
    err = _one_line(capsys)
    assert "shapes noise must be a finite number ≥ 0, got 'abc'" in err and "<=" not in err


def test_a_corpus_of_fewer_windows_than_the_batch_says_its_windows_and_the_batch_that_fits(tmp_path, capsys) -> None:
    """A 2,000-character corpus at tinygpt-nano's default batch 64: "batch 64 is larger than the 28-image training
    split", the corpus's windows called images and no batch named; now examples, and the batch that fits."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(("the quick brown fox jumps over the lazy dog. " * 45)[:2000], encoding="utf-8")
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-file", str(corpus), "--epochs", "1",
                 "--run-dir", str(tmp_path / "r"), "--no-progress"]) == EXIT_BAD_INPUT
    assert _one_line(capsys) == ("hloforge: error: batch 64 is larger than the 28-example training split; expected a "
                                 "batch of at most 28")


# ------------------------------------------------------------------ 4. export of a text model
def test_a_text_models_export_records_its_corpus_and_vocabulary(tmp_path, capsys) -> None:
    from hloforge.datasets.text import Text, default_corpus

    corpus, run, out = str(tmp_path / "corpus.txt"), str(tmp_path / "g1"), str(tmp_path / "eg1")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(default_corpus()[20000:26000].upper())  # a vocabulary the default corpus's is not
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-file", corpus, "--epochs", "1", "--batch", "16",
                 "--run-dir", run, "--no-progress"]) == EXIT_OK
    assert main(["export", run, "--out", out]) == EXIT_OK
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    pre = manifest["preprocessing"]
    chars = Text(corpus).chars
    assert manifest["output"]["kind"] == "tokens" and manifest["output"]["shape"][-1] == manifest["classes"]
    assert "pixels" not in pre  # text: no pixels to scale
    assert chars != Text().chars
    assert pre["data"] == "text" and pre["data_file"] == corpus and pre["data_dir"] == ""
    # every id as the run encoded and decoded it: this corpus has 53 characters, so ids 53..63 are unused and
    # every rarer character is id 64 (the last), where the manifest said 53 (the other token at the list's end)
    text = Text(corpus)
    assert len(chars) == 54 and len(pre["vocabulary"]) == manifest["classes"] == 65
    assert pre["other_token"] == 64 == int(text.encode("€")[0])
    assert pre["vocabulary"] == [text.decode([i]) for i in range(65)] and pre["vocabulary"][:53] == chars[:53]


# ------------------------------------------------------------------ 5. compare on an EMA run
def test_compare_scores_the_region_eval_scores(tmp_path, capsys) -> None:
    ema, plain = str(tmp_path / "r2"), str(tmp_path / "ti2")
    for run, extra in ((ema, ["--ema", "0.9"]), (plain, [])):
        assert main(["train", "mnist-linear", *extra, "--epochs", "1", "--run-dir", run, "--no-progress"]) == EXIT_OK
    capsys.readouterr()
    assert main(["eval", ema]) == EXIT_OK
    evaluated = re.search(r"\(ema\).*\((\d+)/360\)", capsys.readouterr().out)
    assert evaluated, "eval's line names the ema region and its count"
    assert main(["compare", ema, plain]) == EXIT_OK
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"A {ema} (epoch 1, ema weights): {evaluated.group(1)}/360   B {plain} (epoch 1, live "
                            "weights): "), first
    live = np.load(os.path.join(ema, "eval_correct.npz"))["correct"].sum()
    assert main(["compare", ema, plain, "--region", "live"]) == EXIT_OK
    assert capsys.readouterr().out.startswith(f"A {ema} (epoch 1, live weights): {live}/360")
    assert main(["compare", plain, ema, "--region", "ema"]) == EXIT_BAD_INPUT
    assert "has no EMA shadow" in _one_line(capsys)


def test_compare_says_a_run_that_is_no_classifier_keeps_no_per_example_results(tmp_path, capsys) -> None:
    """It said '<run>/eval_correct.npz does not exist; expected a run directory holding eval_correct.npz', as if
    the language model's run were broken, when no such run ever writes one."""
    from hloforge.datasets.text import default_corpus

    corpus, lm, plain = str(tmp_path / "corpus.txt"), str(tmp_path / "lm"), str(tmp_path / "plain")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(default_corpus()[:3000])
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-file", corpus, "--epochs", "1", "--batch", "16",
                 "--run-dir", lm, "--no-progress"]) == EXIT_OK
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", plain, "--no-progress"]) == EXIT_OK
    capsys.readouterr()
    for a, b in ((plain, lm), (lm, plain)):
        assert main(["compare", a, b]) == EXIT_BAD_INPUT
        assert _one_line(capsys) == (f"hloforge: error: run {lm} trained 'tinygpt-nano' (output [64, 65]), no "
                                     "classifier: its eval scores no example right or wrong, so it keeps no "
                                     "eval_correct.npz; compare takes two classifier runs")
    os.remove(os.path.join(plain, "eval_correct.npz"))  # a classifier's run without one: its checkpoint scored
    assert main(["compare", plain, plain]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[1] == "A right, B wrong: 0   A wrong, B right: 0   McNemar exact p = 1"


def test_compare_scores_a_saved_model_that_keeps_no_bitmap(tmp_path, capsys) -> None:
    """A Model.save directory (as import-weights' and ModelCheckpoint's) holds a checkpoint and no eval_correct.npz:
    compare refused it ('saved/eval_correct.npz does not exist; expected a run directory holding
    eval_correct.npz'), naming nothing to do. It now scores the checkpoint as `hloforge eval` does, on the region
    eval scores (an EMA model's shadow), and the counts are predict's."""
    import hloforge as hf
    from hloforge.datasets.digits import Digits

    saved, run = str(tmp_path / "saved"), str(tmp_path / "run")
    m = hf.Model("mnist-linear", ema=0.9, seed=1)
    m.fit("digits", epochs=1, batch_size=64, verbose=False)
    m.save(saved)
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", run, "--no-progress"]) == EXIT_OK
    capsys.readouterr()
    x, y = Digits().arrays("test")
    x = x.reshape(len(x), -1)
    a = hf.load(saved).predict(x).argmax(1) == y  # the shadow's, as eval scores it
    b = np.load(os.path.join(run, "eval_correct.npz"))["correct"]
    assert main(["compare", saved, run]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"A {saved} (epoch 1, ema weights): {a.sum()}/360   B {run} (epoch 1, live weights): "
                             f"{b.sum()}/360"), out
    assert out[1].startswith(f"A right, B wrong: {(a & ~b).sum()}   A wrong, B right: {(~a & b).sum()}   "), out
    live = hf.load(saved).predict(x, region="live").argmax(1) == y
    assert main(["compare", saved, run, "--region", "live"]) == EXIT_OK
    assert capsys.readouterr().out.startswith(f"A {saved} (epoch 1, live weights): {live.sum()}/360")


def test_a_language_model_is_not_scored_on_a_corpus_of_another_vocabulary(tmp_path) -> None:
    """hf.Model fit on one corpus, evaluate(data="text") on another whose vocabulary numbers the characters
    otherwise (each corpus's ids are its own characters in code-point order) gave a plausible bits_per_char of
    ids read as other characters (`hloforge eval --data-file` refuses it as changed data). Refused now; a corpus of
    the same vocabulary is scored."""
    import hloforge.api as hf

    words = "the quick brown fox jumps over a lazy dog".split()
    rng = np.random.default_rng(0)
    own, same, other = (tmp_path / n for n in ("own.txt", "same.txt", "other.txt"))
    own.write_text(" ".join(rng.choice(words, 900)), encoding="utf-8")
    same.write_text(" ".join(rng.choice(words, 900)), encoding="utf-8")  # the same characters, other text
    other.write_text(own.read_text(encoding="utf-8").upper(), encoding="utf-8")
    model = hf.Model("tinygpt-nano", seed=0)
    model.fit(data="text", data_options={"data_file": str(own)}, batch_size=16, verbose=False)
    assert model.evaluate(data="text", data_options={"data_file": str(same)})["n"] > 0
    with pytest.raises(DataError, match=r"^evaluate: corpus '.*other.txt' numbers its characters otherwise than the "
                                        r"one the model was fit on \(id 1: 'A' here, 'a' in training\), so each id "
                                        r"would be read as another character; expected a corpus of the model's "
                                        r"vocabulary$"):
        model.evaluate(data="text", data_options={"data_file": str(other)})
    with pytest.raises(DataError, match=r"^fit: corpus '.*other.txt' numbers its characters otherwise"):  # nor trained
        model.fit(data="text", data_options={"data_file": str(other)}, batch_size=16, verbose=False)
    model.fit(data="text", data_options={"data_file": str(same)}, batch_size=16, verbose=False)


def test_a_language_model_whose_training_corpus_is_gone_is_still_not_scored_on_another_vocabulary(tmp_path) -> None:
    """The vocabulary was read off the training corpus again, so once that file was moved or deleted a corpus of
    another vocabulary was scored (a plausible bits_per_char of ids read as other characters). A run records its
    vocabulary, which `fit`, `evaluate` and `hf.load` keep."""
    import hloforge.api as hf
    from hloforge.loading import load

    words = "the quick brown fox jumps over a lazy dog".split()
    rng = np.random.default_rng(0)
    own, same, other = (tmp_path / n for n in ("own.txt", "same.txt", "other.txt"))
    own.write_text(" ".join(rng.choice(words, 900)), encoding="utf-8")
    same.write_text(" ".join(rng.choice(words, 900)), encoding="utf-8")
    other.write_text(own.read_text(encoding="utf-8").upper(), encoding="utf-8")
    model = hf.Model("tinygpt-nano", seed=0)
    model.fit(data="text", data_options={"data_file": str(own)}, batch_size=16, verbose=False)
    model.save(str(tmp_path / "run"))
    own.unlink()
    for m in (model, load(str(tmp_path / "run"))):
        with pytest.raises(DataError, match=r"^evaluate: corpus '.*other.txt' numbers its characters otherwise than "
                                            r"the one the model was fit on \(id 1: 'A' here, 'a' in training\)"):
            m.evaluate(data="text", data_options={"data_file": str(other)})
        assert m.evaluate(data="text", data_options={"data_file": str(same)})["n"] > 0


def test_init_from_a_language_models_run_on_a_corpus_of_another_vocabulary_is_refused(tmp_path, capsys) -> None:
    """hloforge train --init RUN on another corpus fine-tuned its weights on ids that stand for other characters
    (a plausible falling loss); refused now before anything is written, and the same corpus still fine-tunes."""
    own, other = tmp_path / "own.txt", tmp_path / "other.txt"
    words = "the quick brown fox jumps over a lazy dog".split()
    own.write_text(" ".join(np.random.default_rng(0).choice(words, 900)), encoding="utf-8")
    other.write_text(own.read_text(encoding="utf-8").upper(), encoding="utf-8")
    base = ["train", "tinygpt-nano", "--data", "text", "--epochs", "1", "--batch", "16", "--no-progress"]
    assert main([*base, "--data-file", str(own), "--run-dir", str(tmp_path / "a")]) == EXIT_OK
    capsys.readouterr()
    assert main([*base, "--data-file", str(other), "--init", str(tmp_path / "a"), "--run-dir", str(tmp_path / "b")]) \
        == EXIT_BAD_INPUT
    assert _one_line(capsys) == (f"hloforge: error: --init {tmp_path}/a/checkpoint.safetensors: corpus '{other}' "
                                 "numbers its characters otherwise than the one the model was fit on (id 1: 'A' here, "
                                 "'a' in training), so each id would be read as another character; expected a corpus "
                                 "of the model's vocabulary")
    assert not (tmp_path / "b").exists()
    assert main([*base, "--data-file", str(own), "--init", str(tmp_path / "a"), "--run-dir", str(tmp_path / "c")]) \
        == EXIT_OK


def test_generate_counts_the_corpus_characters_and_says_when_the_other_token_was_never_trained(tmp_path) -> None:
    """On a 27-character corpus the prompt's unknown characters were said to be outside 'the run's vocabulary of 64
    characters' (the head's size less one) and read as the other-character token with no word that the net never
    saw that token (a corpus of fewer characters than the vocabulary has no rarer one in training)."""
    from hloforge.commands.generate import generate
    from hloforge.core.errors import HloforgeWarning

    corpus = tmp_path / "corpus.txt"
    words = "the quick brown fox jumps over a lazy dog".split()
    corpus.write_text(" ".join(np.random.default_rng(0).choice(words, 900)), encoding="utf-8")
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-file", str(corpus), "--epochs", "1", "--batch",
                 "16", "--run-dir", str(tmp_path / "r"), "--no-progress"]) == EXIT_OK
    known = len(set(corpus.read_text(encoding="utf-8")))
    with pytest.warns(HloforgeWarning, match=rf"^the prompt's 'Z', '€' are not in the run's vocabulary of {known} "
                                             r"characters: each is read as its other-character token, which training "
                                             r"never showed the net \(its corpus has none\)$"):
        generate(str(tmp_path / "r"), prompt="Zebra€", tokens=1)


def test_a_corpus_saved_with_a_byte_order_mark_has_the_vocabulary_of_the_same_text_without(tmp_path) -> None:
    """Windows Notepad's UTF-8 starts with U+FEFF: it was read as the corpus's first character, a vocabulary entry
    of its own (so a model trained on the file was refused on the same text saved without it)."""
    from hloforge.datasets.text import Text

    body = "the quick brown fox jumps over the lazy dog. " * 40
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + body.encode())
    (tmp_path / "plain.txt").write_text(body, encoding="utf-8")
    bom, plain = Text(str(tmp_path / "bom.txt"), seq_len=16), Text(str(tmp_path / "plain.txt"), seq_len=16)
    assert "\ufeff" not in bom.chars and bom.vocabulary == plain.vocabulary
    np.testing.assert_array_equal(bom.train_ids, plain.train_ids)


@pytest.mark.parametrize("data,file,said", [
    ("cifar10", "test_batch.bin", "not found; expected CIFAR-10's binary version (data_batch_1.bin … "
     "data_batch_5.bin, test_batch.bin: cifar-10-binary.tar.gz, unpacked) in {d}, or --data-dir where it is"),
    ("mnist", "t10k-images-idx3-ubyte", "[.gz] not found; expected the MNIST IDX files in {d}, or --data-dir where "
     "they are"),
    ("yolo", "test.bin", "not found; expected the binaries `hloforge prepare yolo SRC OUT` writes from "
     "SRC/images/{{train,val}} and SRC/labels/{{train,val}}, then --data-dir OUT"),
    ("brats224-25d", "val.bin", "not found; expected the binaries `hloforge prepare brats SRC OUT --size 224 "
     "--context 1` writes from MSD's Task01_BrainTumour, then --data-dir OUT"),
])
def test_a_file_dataset_not_there_says_where_to_get_it(data, file, said, tmp_path):
    """Was '{d}/test_batch.bin not found' alone: no word of what the file is or how to point at it."""
    from hloforge.core.registry import default_registry

    with pytest.raises(DataError) as e:
        default_registry().make("dataset", data, data_dir=str(tmp_path)).arrays("test")
    assert str(e.value) == f"{tmp_path / file}" + ("" if said.startswith("[") else " ") + said.format(d=tmp_path)
