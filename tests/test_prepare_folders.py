"""`hloforge prepare imagenette` on a user's own class folders as they are found on disk: what else lies
beside the class folders (hidden folders, links). Tiny trees written with Pillow."""

from __future__ import annotations

import json

from test_prepare import write_jpeg_tree

from hloforge.cli import EXIT_OK, main
from hloforge.datasets.imagenette import Imagenette

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
