"""A loss whose labels are not the dataset's, or whose task is not the net's, is refused in one line
naming the loss, why it does not fit, and the registered losses that would (hloforge.train.tasks)."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge.api as hf
from hloforge.cli import main
from hloforge.core.errors import DataError
from hloforge.train.tasks import losses_for
from hloforge.zoo import get_net

MSE_ON_DIGITS = (
    "loss 'mse' does not fit net 'mnist-mlp' on dataset 'digits': the dataset gives integer class indices of "
    "shape [N]; mse wants float targets shaped like the net's output ([N, 10]) and trains only a DDPM (images "
    "plus a time channel [C + 1, ...] to their noise [C, ...]), which a net from [784] to [10] is not; losses "
    "that fit: bce, crossEntropy, focalCrossEntropy")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HLOFORGE_DEBUG", raising=False)


def test_mse_on_a_classifier_is_one_line_naming_the_losses_that_fit(tmp_path, capsys):
    rc = main(["train", "mnist-mlp", "--loss", "mse", "--epochs", "1", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 3
    assert err == f"hloforge: error: {MSE_ON_DIGITS}\n"
    assert not (tmp_path / "r").exists()  # refused before the run starts


def test_the_api_gives_the_same_line():
    m = hf.Model("mnist-mlp", loss="mse")
    with pytest.raises(DataError) as e:
        m.fit("digits", epochs=1, verbose=False)
    assert str(e.value) == MSE_ON_DIGITS


def test_float_targets_on_a_net_that_is_no_ddpm_say_no_loss_fits():
    m = hf.Model("mnist-mlp", loss="mse")
    with pytest.raises(DataError, match=r"loss 'mse' does not fit net 'mnist-mlp' on dataset 'arrays': the dataset "
                                        r"gives float targets of shape \[N, 10\];.*no registered loss trains net "
                                        r"'mnist-mlp' \(output \[10\]\) on these labels$"):
        m.fit(np.zeros((64, 784), np.float32), np.zeros((64, 10), np.float32), epochs=1, verbose=False)


def test_a_class_loss_on_a_mask_dataset_names_the_masks(tmp_path, capsys):
    rc = main(["train", "mnist-cnn", "--data", "shapes", "--loss", "crossEntropy", "--epochs", "1",
               "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 3
    assert err == ("hloforge: error: loss 'crossEntropy' does not fit net 'mnist-cnn' on dataset 'shapes': the "
                   "dataset gives integer per-pixel class masks of shape [N, 32, 32]; crossEntropy wants integer "
                   "class indices of shape [N]; no registered loss trains net 'mnist-cnn' (output [10]) on these "
                   "labels\n")


def test_losses_for_reads_the_registry():
    assert losses_for(get_net("mnist-mlp", None, None), "class") == ["bce", "crossEntropy", "focalCrossEntropy"]
    unet = get_net("unet-mini", None, None)
    assert losses_for(unet, "mask") == ["dice", "diceCE", "perPixelCE", "perPixelFocal"]
    assert losses_for(unet, "noise") == []  # its input is not its output plus a time channel
    assert losses_for(get_net("ddpm-mini", None, None), "noise") == ["mse"]


def test_a_loss_of_another_output_names_the_loss_the_net_trains_with(tmp_path, capsys):
    """crossEntropy on a segmenter was 'crossEntropy takes logits [classes], got [4, 32, 32]' and no more: what
    was wrong, not what was expected. The loss the net trains with by default is now named, through the CLI,
    a dataset by name and arrays alike."""
    rc = main(["train", "unet-mini", "--loss", "crossEntropy", "--data", "shapes", "--epochs", "1",
               "--run-dir", str(tmp_path / "r")])
    assert rc == 3 and capsys.readouterr().err == (
        "hloforge: error: crossEntropy takes logits [classes], got [4, 32, 32]; net 'unet-mini' on dataset 'shapes' "
        "trains with perPixelCE (its default, with no loss given)\n")
    x, y = np.zeros((4, 3, 32, 32), np.float32), np.zeros((4, 32, 32), np.int64)
    with pytest.raises(hf.HloforgeError, match=r"got \[4, 32, 32\]; net 'unet-mini' trains with perPixelCE \(its "):
        hf.Model("unet-mini", loss="crossEntropy").fit(x, y, batch_size=4, verbose=False)
    with pytest.raises(hf.HloforgeError, match=r"got \[4, 32, 32\]; net 'unet-mini' on dataset 'shapes' trains "
                                               r"with perPixelCE \(its default, with no loss given\)$"):
        hf.Model("unet-mini", loss="crossEntropy").fit("shapes", batch_size=4, verbose=False)


@pytest.mark.parametrize(("net", "loss", "head", "own"), [
    ("yolov1-mini", "mse", "yolov1Head", "yolov1"),  # before: 'losses that fit: dice, diceCE, perPixelCE, …'
    ("yolov1-mini", "perPixelCE", "yolov1Head", "yolov1"),  # before: 'shapes has 4 mask classes, net … predicts 13'
    ("fpn-mini", "dice", "fpnDetect", "fpnYolo"),
])
def test_a_loss_not_a_detectors_own_names_its_heads_loss(net, loss, head, own):
    """Refusals of a segmentation loss (or mse) on a detector over shapes (whose labels are masks, and boxes)
    spoke of masks and named the segmentation losses, which a [13, 8, 8] output passes as a mask's shape and
    no detector trains on: now the head's own loss."""
    with pytest.raises(DataError, match=rf"^loss '{loss}' does not read the output of net '{net}''s head \({head}\); "
                                        rf"expected {own}, its own \(the default, with no loss given\)$"):
        hf.Model(net, loss=loss).fit("shapes", batch_size=4, verbose=False, data_options={"n_train": 8, "n_test": 4})
