"""`hloforge classify RUN IMAGE...`: a classifier run's classes for the user's own image files, each read as the run's
dataset stores its eval images and through its eval transform, so a file of the eval split is classified exactly as
`hloforge eval` scores its stored row; what it cannot classify is one line."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.cli import EXIT_BAD_INPUT, EXIT_OK, main
from hloforge.commands.classify import classify_run
from hloforge.core.errors import DataError
from hloforge.datasets.imagenette import Imagenette
from hloforge.datasets.prepare import prepare

TRAIN, VAL = 12, 8  # the stored sides: small, so the run trains in seconds


@pytest.fixture(scope="module")
def imagenette_run(tmp_path_factory) -> dict[str, str]:
    """Two classes of noise images of other sizes (PNG: lossless), prepared, and resnet-mini trained on them."""
    from PIL import Image

    d = tmp_path_factory.mktemp("classify")
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c, name in enumerate(("cat", "dog")):
            folder = d / "src" / split / name
            folder.mkdir(parents=True)
            for i in range(4):
                pixels = rng.integers(0, 128, (20 + 3 * i, 17 + 5 * i, 3)) + 100 * c
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{name}_{i}.png")
    out = str(d / "out")
    prepare("imagenette", str(d / "src"), out, train_size=TRAIN, val_size=VAL)
    run = str(d / "run")
    assert main(["train", "resnet-mini", "--classes", "2", "--input", f"3,{VAL},{VAL}", "--data", "imagenette",
                 "--data-dir", out, "--data-opt", f"train_size={TRAIN}", "--data-opt", f"crop={VAL}", "--epochs", "2",
                 "--batch", "4", "--run-dir", run, "--no-progress"]) == EXIT_OK
    return {"src": str(d / "src"), "out": out, "run": run, "dir": str(d)}


def test_each_val_image_file_is_classified_as_its_stored_row_is_scored(imagenette_run):
    src = imagenette_run["src"]
    files = [f"{src}/val/{name}/{name}_{i}.png" for name in ("cat", "dog") for i in range(4)]  # prepare's order
    lines: list[str] = []
    probs = classify_run(imagenette_run["run"], files, top=2, log=lines.append)
    data = Imagenette(imagenette_run["out"], train_size=TRAIN, crop=VAL)
    stored = data.records("test")[0]
    assert all(np.array_equal(data.image_file(f), row) for f, row in zip(files, stored, strict=True))
    logits = hf.load(imagenette_run["run"]).predict(data.arrays("test")[0]).astype(np.float64)
    expected = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(probs, expected / expected.sum(1, keepdims=True), rtol=1e-6)
    top = probs[0].argmax()
    assert lines[0] == (f"{files[0]}: {('cat', 'dog')[top]} {probs[0, top]:.1%}, {('cat', 'dog')[1 - top]} "
                        f"{probs[0, 1 - top]:.1%}")
    assert len(lines) == 9 and lines[-1].startswith("(8 image(s) through resnet-mini, epoch 2, ")


def test_what_classify_cannot_read_is_one_line(imagenette_run, tmp_path, capsys):
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    capsys.readouterr()
    assert main(["classify", imagenette_run["run"], str(text)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hloforge: error: {text}: cannot decode it as an image") and len(err.splitlines()) == 1
    assert main(["classify", imagenette_run["run"], str(tmp_path / "gone.png")]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == (f"hloforge: error: {tmp_path / 'gone.png'}: no such file or "
                                               "directory; expected an image file")


def test_a_run_copied_alone_classifies_without_its_datasets_files(imagenette_run, tmp_path):
    """The run directory alone on another machine (here: its dataset's files moved away): classify reads the run, not
    the dataset, and gives the same probabilities; the API's hf.image_inputs is the same rows."""
    import shutil

    files = [f"{imagenette_run['src']}/val/dog/dog_{i}.png" for i in range(2)]
    before = classify_run(imagenette_run["run"], files, log=lambda _: None)
    moved = tmp_path / "moved-data"
    shutil.move(imagenette_run["out"], moved)
    try:
        after = classify_run(imagenette_run["run"], files, log=lambda _: None)
        model = hf.load(imagenette_run["run"])
        logits = model.predict(hf.image_inputs(model, files)).astype(np.float64)
    finally:
        shutil.move(moved, imagenette_run["out"])
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(1, keepdims=True), before, rtol=1e-6)


def test_a_run_of_a_dataset_without_image_files_or_no_classifier_is_refused(imagenette_run, capsys):
    digits = f"{imagenette_run['dir']}/digits"
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", digits, "--no-progress"]) == EXIT_OK
    image = f"{imagenette_run['src']}/val/cat/cat_0.png"
    capsys.readouterr()
    assert main(["classify", digits, image]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == ("hloforge: error: dataset 'digits' does not say how an image file becomes its "
                                       "input (a dataset's image_file); image files are read for cifar10 and "
                                       "imagenette models\n")
    unet = f"{imagenette_run['dir']}/unet"
    assert main(["train", "unet-mini", "--data", "shapes", "--data-opt", "n_train=16", "--data-opt", "n_test=4",
                 "--epochs", "1", "--batch", "8", "--run-dir", unet, "--no-progress"]) == EXIT_OK
    capsys.readouterr()
    assert main(["classify", unet, image]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (f"hloforge: error: run {unet} trained 'unet-mini', a segmenter, not a "
                                       "classifier; classify takes a classifier's run (detect: a detector's)\n")
    with pytest.raises(DataError, match="^the model was not trained on a registered dataset"):
        hf.image_inputs(hf.Model("mnist-linear"), [image])
