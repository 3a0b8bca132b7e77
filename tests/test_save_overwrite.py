"""Model.save into a run directory: under the directory's lock (a run training there is refused, never
overwritten), and what the run before wrote beside its checkpoint (metrics, curves, eval bitmap) goes with
it. hf.load checks the tensors as `hloforge eval` does: a NaN, another shape or an extra tensor is one line."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.cli import main
from hloforge.core.errors import DataError, HloforgeError
from hloforge.train import checkpoint as ckpt
from hloforge.train.rundir import locked


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))


def test_a_save_into_a_run_in_progress_is_refused(tmp_path) -> None:
    run = tmp_path / "run"
    hf.Model("mnist-linear").save(str(run))
    before = (run / "checkpoint.safetensors").read_bytes()
    with locked(str(run), str(run / "checkpoint.safetensors")):  # as a training process holds it
        with pytest.raises(HloforgeError, match="is in use by another hloforge process"):
            hf.Model("mnist-mlp").save(str(run), overwrite=True)
    assert (run / "checkpoint.safetensors").read_bytes() == before
    assert hf.load(str(run)).spec.name == "mnist-linear"


def test_an_overwritten_run_keeps_nothing_of_the_model_before(tmp_path) -> None:
    run = tmp_path / "run"
    assert main(["train", "mnist-linear", "--epochs", "1", "--no-progress", "--run-dir", str(run)]) == 0
    derived = ("metrics.jsonl", "eval_correct.npz", "curves.png")
    assert all((run / name).exists() for name in derived)
    fresh = hf.Model("mnist-linear", seed=7)
    fresh.save(str(run), overwrite=True)
    assert not any((run / name).exists() for name in derived)  # another model's results
    assert all(np.array_equal(a, b) for a, b in zip(hf.load(str(run)).params.values(), fresh.params.values(),
                                                      strict=True))


def _tamper(run, edit) -> None:
    file = str(run / "checkpoint.safetensors")
    tensors, meta = ckpt.load_checkpoint(file)
    edit(tensors)
    ckpt.save_checkpoint(file, list(tensors), list(tensors.values()), meta)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t["param/0.w"].__setitem__((0, 0), np.nan), "tensor param/0.w holds a NaN or an infinity; corrupt"),
    (lambda t: t.__setitem__("param/0.w", np.zeros((3, 3), np.float32)),
     r"tensor param/0.w is float32 \[3, 3\], expected float32 \[784, 10\]"),
    (lambda t: t.__setitem__("param/9.w", np.zeros(3, np.float32)), "holds tensor param/9.w that this net does not"),
], ids=["nan", "shape", "extra"])
def test_load_refuses_tensors_eval_would_refuse(tmp_path, edit, message) -> None:
    run = tmp_path / "run"
    hf.Model("mnist-linear").save(str(run))
    _tamper(run, edit)
    with pytest.raises(DataError, match=message):
        hf.load(str(run))
