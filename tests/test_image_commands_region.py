"""cam and detect on a run that kept an EMA shadow use the weights `hloforge eval` scores (the shadow, with its own
BN statistics, by default; `--region live` the live θ), as predict, export and sample do."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.cli import main
from hloforge.commands.cam import cam_run, gradcam
from hloforge.commands.detect import detect_run
from hloforge.commands.opening import open_checkpoint
from hloforge.train.trainer import TrainConfig, train


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("ema-image-cmds")
    out = {"cnn": str(d / "cnn"), "det": str(d / "det")}
    train(TrainConfig(net="resnet-mini", input=(1, 16, 16), data_options=("size=16",), ema=0.5, epochs=1, batch=64,
                      run_dir=out["cnn"]), progress=False, log=quiet)
    assert main(["train", "yolov1-mini", "--data", "shapes", "--data-opt", "n_train=32", "--data-opt", "n_test=4",
                 "--epochs", "1", "--batch", "16", "--ema", "0.5", "--no-progress", "--run-dir", out["det"]]) == 0
    return out


def test_cam_explains_through_the_weights_eval_scores(runs: dict[str, str], tmp_path) -> None:
    """Before, cam read the live θ and running statistics whatever the run kept: on an EMA run it explained the
    class the live weights predict, where `hloforge eval`, predict and export give the shadow's."""
    run = runs["cnn"]
    oc = open_checkpoint(run, log=quiet)
    image = oc.run.x_te[1]
    by = {r: gradcam(oc.spec, *oc.region_weights(r)[1:], image, oc.run.backend) for r in ("ema", "live")}
    assert not np.array_equal(by["ema"], by["live"])
    lines: list[str] = []
    np.testing.assert_array_equal(cam_run(run, "test:1", str(tmp_path / "a.png"), log=lines.append), by["ema"])
    assert lines[-1].endswith("epoch 1, ema weights)")
    np.testing.assert_array_equal(cam_run(run, "test:1", str(tmp_path / "b.png"), log=quiet, region="live"),
                                  by["live"])
    # the class explained by default is the one predict gives
    shown = hf.load(run).predict(image[None]).argmax(1)[0]
    np.testing.assert_array_equal(gradcam(oc.spec, *oc.region_weights("ema")[1:], image, oc.run.backend, shown),
                                  by["ema"])
    assert main(["cam", run, "test:1", "--region", "live", "--out", str(tmp_path / "c.png")]) == 0


def test_detect_draws_the_boxes_of_the_weights_eval_scored(runs: dict[str, str], tmp_path) -> None:
    """Before, detect decoded the live θ's head on an EMA run, whose mAP `hloforge eval` scored with the shadow."""
    from hloforge.train.session import ForwardSession

    run = runs["det"]
    oc = open_checkpoint(run, log=quiet)
    forward = ForwardSession(oc.spec, 1, oc.run.backend)

    def decoded(region: str) -> np.ndarray:
        _, params, stats = oc.region_weights(region)
        (dets,) = oc.run.task.head.decode(forward.logits(oc.run.x_te[0][None], params + stats), score_min=0.0)
        return dets

    ema, live = decoded("ema"), decoded("live")
    assert ema.shape != live.shape or not np.array_equal(ema, live)
    lines: list[str] = []
    np.testing.assert_array_equal(detect_run(run, None, str(tmp_path / "a.png"), index=0, score_min=0.0,
                                             log=lines.append), ema)
    assert "ema weights) written to" in lines[-1]
    np.testing.assert_array_equal(detect_run(run, None, str(tmp_path / "l.png"), index=0, score_min=0.0, log=quiet,
                                             region="live"), live)
    assert main(["detect", run, "--index", "0", "--region", "live", "--out", str(tmp_path / "b.png")]) == 0
