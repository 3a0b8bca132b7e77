"""Malformed run files and impossible options for `compare`, `plot` and `prepare`: one line naming what
is wrong (exit 2 at parse time, 3 for a file or a combination), never a traceback or a wrong result."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from hloforge.cli import main
from hloforge.core.errors import DataError


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ compare
def _bitmap(**fields) -> bytes:
    b = io.BytesIO()
    np.savez(b, **{"correct": np.arange(50) % 3 == 0, "set_id": "x:test:50:00", "epoch": 1, **fields})
    return b.getvalue()


def _npy() -> bytes:
    b = io.BytesIO()
    np.save(b, np.zeros(3))
    return b.getvalue()


@pytest.mark.parametrize(("content", "message"), [
    (_bitmap()[:100], "is not an eval bitmap (BadZipFile: File is not a zip file)"),  # `head -c 100`
    (_bitmap()[:-30], "is not an eval bitmap (BadZipFile"),
    (b"hello\n", "is not an eval bitmap (neither an .npz archive nor a .npy array); expected the eval_correct.npz "
                  "a run writes, whole"),  # was numpy's ValueError, with its advice to load the file unsafely
    (_npy(), "is not an eval bitmap (TypeError"),  # a bare array: np.load gives no archive
    (_bitmap(epoch=np.arange(3)), "is not an eval bitmap (TypeError"),
    (_bitmap(correct=np.array(["False", "True"] * 25)), "'correct' holds <U5, expected bool"),
], ids=["head-c-100", "cut-tail", "text", "npy", "epoch-array", "string-correct"])
def test_compare_refuses_a_corrupt_bitmap_in_one_line(content: bytes, message: str, tmp_path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval_correct.npz").write_bytes(_bitmap())
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    capsys.readouterr()
    (tmp_path / "b" / "eval_correct.npz").write_bytes(content)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 3
    err = _one_line(capsys)
    assert f"{tmp_path / 'b' / 'eval_correct.npz'}" in err and message in err


def test_compare_scores_the_checkpoint_of_a_run_stopped_after_its_bitmap(tmp_path, capsys) -> None:
    """A run killed between an epoch's bitmap and its checkpoint: the bitmap is of epoch 3's weights, which were never
    kept. Before: compare counted that bitmap as the run's (here all wrong: 0/360, where `hloforge eval` scores the
    checkpoint of epoch 2); now it scores the checkpoint, as eval does."""
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "mnist-linear", "--epochs", "2", "--run-dir", str(a), "--no-progress"]) == 0
    shutil.copytree(a, b)
    with np.load(b / "eval_correct.npz") as z:
        right, set_id = z["correct"], str(z["set_id"])
    np.savez(b / "eval_correct.npz", correct=np.zeros_like(right), set_id=set_id, epoch=3)
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"A {a} (epoch 2, live weights): {right.sum()}/{len(right)}   B {b} (epoch 2, live weights): "
                   f"{right.sum()}/{len(right)}", "A right, B wrong: 0   A wrong, B right: 0   McNemar exact p = 1"]


# ------------------------------------------------------------------ plot
GOOD = '{"kind": "epoch", "epoch": 1, "loss": 0.5, "top1": 0.4, "top1_lo": 0.3, "top1_hi": 0.5}\n'


@pytest.mark.parametrize(("line", "message"), [
    ('{"kind":"epoch","epoch":2,"loss":0.3,"top1":null}', "'top1' is null, expected a number"),
    ('{"kind":"epoch","epoch":2,"loss":"x"}', "'loss' is \"x\", expected a finite number"),
    ('{"kind":"epoch","epoch":2,"loss":NaN}', "'loss' is NaN, expected a finite number"),
    ('{"kind":"epoch","epoch":2,"loss":1e999}', "'loss' is Infinity, expected a finite number"),
    ('{"kind":"epoch","epoch":"2","loss":0.3}', "'epoch' is \"2\", expected an integer ≥ 1"),
    ('{"kind":"epoch","epoch":2.5,"loss":0.3}', "'epoch' is 2.5, expected an integer ≥ 1"),
    ('{"kind":"epoch","epoch":2,"loss":true}', "'loss' is true, expected a finite number"),
    ('{"kind":"epoch","epoch":2,"loss":0.3,"top1":0.5,"top1_lo":null,"top1_hi":0.6}',
     "'top1_lo' is null, expected a finite number"),
    ('{"kind":"epoch","epoch":2,"loss":0.3,"val_miou":[1]}', "'val_miou' is [1], expected a number"),
])
def test_plot_refuses_a_metric_that_is_no_number(line: str, message: str, tmp_path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "metrics.jsonl").write_text(GOOD + line + "\n")
    assert main(["plot", str(tmp_path)]) == 3
    err = _one_line(capsys)
    assert f"{tmp_path / 'metrics.jsonl'} line 2 (epoch record): {message}" in err, err
    assert not (tmp_path / "curves.png").exists()


def test_plot_draws_a_nan_score_and_epochs_without_the_metric(tmp_path) -> None:
    """A diverged net's eval score (NaN) is drawn as a gap; epochs of a fit without validation data lack
    the metric the last epoch has and are left out of that panel, not a KeyError."""
    (tmp_path / "metrics.jsonl").write_text('{"kind": "epoch", "epoch": 1, "loss": 0.9}\n' + GOOD.replace(
        '"epoch": 1', '"epoch": 2') + '{"kind": "epoch", "epoch": 3, "loss": 0.4, "top1": NaN}\n')
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_plot_given_a_file_says_it_is_a_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`plot RUN/checkpoint.safetensors` said the file 'does not exist' while it was there."""
    (tmp_path / "metrics.jsonl").write_text(GOOD)
    given = tmp_path / "checkpoint.safetensors"
    given.write_bytes(b"weights")
    assert main(["plot", str(given)]) == 3
    assert _one_line(capsys) == f"hloforge: error: run directory {given} is a file; expected a run directory that " \
                                "trained an epoch"
    assert main(["plot", str(tmp_path / "gone")]) == 3
    assert "gone does not exist; expected a run directory" in _one_line(capsys)


# ------------------------------------------------------------------ prepare
@pytest.mark.parametrize("argv", [
    ["imagenette", "--train-size", "0"], ["imagenette", "--train-size", "-5"], ["imagenette", "--val-size", "0"],
    ["yolo", "--size", "0"], ["yolo", "--grid", "0"], ["yolo", "--boxes", "0"], ["yolo", "--classes", "0"],
    ["brats", "--seed", "-1"], ["brats", "--stride", "0"],
])
def test_prepare_refuses_an_out_of_range_flag_at_parse_time(argv: list[str], tmp_path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["prepare", argv[0], str(tmp_path / "src"), str(out), *argv[1:]]) == 2
    err = _one_line(capsys)
    assert f"argument {argv[1]}: expected an integer ≥ " in err and f"got '{argv[2]}'" in err, err
    assert not out.exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["yolo", "--size", "5", "--grid", "7"], "yolo: grid 7 is larger than the image size 5"),
    (["imagenette", "--train-size", "8", "--val-size", "9"], "val_size 9 must be positive and at most train_size 8"),
])
def test_prepare_refuses_options_that_do_not_go_together(argv: list[str], message: str, tmp_path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["prepare", argv[0], str(tmp_path / "src"), str(out), *argv[1:]]) == 3
    assert message in _one_line(capsys)
    assert not out.exists(), "refused before anything is written"


def test_prepare_functions_refuse_the_same_ranges(tmp_path) -> None:
    from hloforge.datasets.prepare import prepare
    from hloforge.datasets.yolo import prepare_yolo

    with pytest.raises(DataError, match="yolo boxes must be an integer ≥ 1, got 0"):
        prepare_yolo(str(tmp_path / "src"), str(tmp_path / "out"), boxes=0)
    with pytest.raises(DataError, match="train_size 0"):
        prepare("imagenette", str(tmp_path / "src"), str(tmp_path / "out"), train_size=0, val_size=0)
    with pytest.raises(DataError, match="seed >= 0"):
        prepare("brats", str(tmp_path / "src"), str(tmp_path / "out"), size=16, seed=-1)
    assert not (tmp_path / "out").exists()


def test_prepare_yolo_prints_the_paths_it_wrote(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    monkeypatch.chdir(tmp_path)  # a relative OUT: an absolute one hid the doubled path
    for split in ("train", "val"):
        os.makedirs(f"src/images/{split}")
        os.makedirs(f"src/labels/{split}")
        Image.new("RGB", (10, 8), (90, 20, 200)).save(f"src/images/{split}/0.png")
        with open(f"src/labels/{split}/0.txt", "w") as f:
            f.write("0 0.5 0.5 0.2 0.2\n")
    out = os.path.join("ys_out", "ok")
    assert main(["prepare", "yolo", "src", out, "--size", "8", "--grid", "2", "--classes", "1"]) == 0
    line, *rest = capsys.readouterr().out.strip().splitlines()
    train, test = os.path.join(out, "train.bin"), os.path.join(out, "test.bin")
    assert line == f"prepared yolo: {train} (1 records), {test} (1 records)"
    assert rest == [f"  train on them with: --data yolo --data-dir {out} --data-opt size=8 --data-opt grid=2 "
                    "--data-opt classes=1"]
    assert os.path.isfile(train) and os.path.isfile(test)


def test_plot_on_a_full_disk_says_to_plot_again(tmp_path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`hloforge plot RUN` on a full disk advised 'free space and --resume', a training run's advice; plot's
    is to plot again. The curves.png there before is whole."""
    import errno

    from hloforge.train import checkpoint

    (tmp_path / "metrics.jsonl").write_text(GOOD)
    (tmp_path / "curves.png").write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", full)
    assert main(["plot", str(tmp_path)]) == 3
    assert _one_line(capsys) == (f"hloforge: error: could not write plot {tmp_path / 'curves.png'}: No space left on "
                                 "device (the previous plot is whole, the temp file removed); free space and plot "
                                 "again")
    assert (tmp_path / "curves.png").read_bytes() == b"old"


def test_compare_says_a_bitmap_that_is_a_directory_without_an_errno(tmp_path, capsys) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "eval_correct.npz").write_bytes(_bitmap())
    (tmp_path / "b" / "eval_correct.npz").mkdir(parents=True)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 3
    assert _one_line(capsys) == (f"hloforge: error: {tmp_path / 'b' / 'eval_correct.npz'} is not an eval bitmap (is a "
                                 "directory); expected the eval_correct.npz a run writes, whole")


def test_plot_onto_a_directory_named_curves_png_says_so(tmp_path, capsys) -> None:
    """Was 'could not write plot D/curves.png: Is a directory (the previous plot is whole, the temp file removed);
    free space and plot again': no plot was there, and no space to free."""
    (tmp_path / "metrics.jsonl").write_text(GOOD)
    (tmp_path / "curves.png").mkdir()
    assert main(["plot", str(tmp_path)]) == 3
    assert _one_line(capsys) == (f"hloforge: error: could not write plot {tmp_path / 'curves.png'}: it is a "
                                 "directory; expected a file there (move the directory away)")
    assert os.listdir(tmp_path / "curves.png") == [] and sorted(os.listdir(tmp_path)) == ["curves.png", "metrics.jsonl"]
