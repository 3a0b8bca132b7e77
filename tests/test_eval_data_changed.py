"""A run's checkpoint is opened (eval, generate, cam, ...) only on the data it was scored on: a corpus
edited after training is refused in one line, not scored (and decoded) plausibly and wrongly."""

from __future__ import annotations

import os

import numpy as np

from hloforge.cli import main
from hloforge.datasets.text import default_corpus


def test_eval_and_generate_refuse_a_corpus_changed_since_the_run(tmp_path, capsys):
    corpus, run = os.path.join(tmp_path, "corpus.txt"), os.path.join(tmp_path, "run")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(default_corpus()[:6000])
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-file", corpus, "--epochs", "1", "--batch", "16",
                 "--run-dir", run, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", run]) == 0
    scored = capsys.readouterr().out
    assert "bits/char" in scored
    with open(corpus, "w", encoding="utf-8") as f:  # the same length, other text
        f.write(default_corpus()[6000:12000])
    for command in (["eval", run], ["generate", run, "--tokens", "8"]):
        assert main(command) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is not the one the run was scored on" in err, err


def test_eval_refuses_other_images_under_the_same_labels(tmp_path, capsys):
    """Before: the eval set's id hashed its labels alone, so a moved run given another data directory whose
    test images differed under identical labels (two class-sorted sets of the same counts) was scored as its
    own. A run saved before inputs were hashed (its id the labels' alone) still opens on its data."""
    import json

    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    from test_datasets import write_idx

    def idx_dir(d, seed):
        rng = np.random.default_rng(seed)
        d.mkdir()
        for split, n in (("train", 32), ("t10k", 10)):
            labels = np.arange(n) % 10  # the same in both directories
            write_idx(d / f"{split}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28)), 0x803)
            write_idx(d / f"{split}-labels-idx1-ubyte", labels, 0x801)

    own, other, run = tmp_path / "own", tmp_path / "other", str(tmp_path / "run")
    idx_dir(own, 1)
    idx_dir(other, 5)
    assert main(["train", "mnist-linear", "--data", "mnist", "--data-dir", str(own), "--epochs", "1", "--batch", "16",
                 "--run-dir", run, "--no-progress"]) == 0
    capsys.readouterr()
    os.rename(own, tmp_path / "away")
    assert main(["eval", run, "--data-dir", str(other)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not the one the run was scored on" in err and "inputs hash" in err, err
    # the same checkpoint as an older version wrote it: the eval set's id without its inputs' hash
    ckpt = os.path.join(run, "checkpoint.safetensors")
    with safe_open(ckpt, "np") as f:
        meta = f.metadata()
    set_id = json.loads(meta["eval_set"])
    assert set_id.count(":") == 4
    save_file(load_file(ckpt), ckpt, metadata={**meta, "eval_set": json.dumps(set_id.rsplit(":", 1)[0])})
    assert main(["eval", run, "--data-dir", str(tmp_path / "away")]) == 0


def test_eval_set_ids_name_labels_and_inputs():
    import numpy as np

    from hloforge.train.metrics import describe_eval_set, eval_set_id, same_eval_set

    y = np.arange(12) % 3
    x = np.random.default_rng(0).standard_normal((12, 1, 4, 4)).astype(np.float32)
    full, labels_only = eval_set_id("d", "test", y, x), eval_set_id("d", "test", y, None)
    assert full.startswith(labels_only + ":") and full == eval_set_id("d", "test", y, x.astype(np.float64))
    assert same_eval_set(full, labels_only) and same_eval_set(labels_only, full) and same_eval_set(full, full)
    other = x.copy()
    other[5, 0, 2, 2] += 1.0  # one value of 192, inside the sample
    assert not same_eval_set(full, eval_set_id("d", "test", y, other))
    assert not same_eval_set(full, eval_set_id("d", "test", y[::-1], x))  # other labels: no match either way
    assert not same_eval_set(labels_only, eval_set_id("d", "test", y[::-1], x))
    assert describe_eval_set(full).startswith("12 examples, labels hash ")
    assert describe_eval_set(labels_only).startswith("12 labels, hash ")


def test_an_eval_set_is_one_set_to_nets_of_flat_rows_and_of_images(tmp_path, capsys):
    """Before: the id hashed the inputs' whole shape, so `compare` refused an mnist-mlp and an mnist-cnn run on
    the digits ("different eval sets"), and the ids a checkpoint of then holds must still match."""
    import hashlib

    from hloforge.cli import main
    from hloforge.train.metrics import eval_set_id, same_eval_set

    rng = np.random.default_rng(0)
    x, y = rng.random((6, 1, 4, 4), np.float32), rng.integers(0, 3, 6)
    images, rows = eval_set_id("d", "test", y, x), eval_set_id("d", "test", y, x.reshape(6, 16))
    assert images == rows and same_eval_set(images, rows)
    h = hashlib.sha256(np.ascontiguousarray(y, np.int64).tobytes()).hexdigest()[:16]
    for shape in ((6, 1, 4, 4), (6, 16)):  # the id as written before, for either net
        old = f"d:test:6:{h}:" + hashlib.sha256(repr(shape).encode() + x.reshape(-1).tobytes()).hexdigest()[:16]
        assert same_eval_set(old, eval_set_id("d", "test", y, x.reshape(shape)))
    assert not same_eval_set(images, eval_set_id("d", "test", y, x[:, :, :2]))  # other values per example
    for net in ("mnist-linear", "mnist-cnn"):
        assert main(["train", net, "--epochs", "1", "--run-dir", str(tmp_path / net), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "mnist-linear"), str(tmp_path / "mnist-cnn")]) == 0
    assert "McNemar exact p =" in capsys.readouterr().out
