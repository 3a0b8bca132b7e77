"""`hloforge detect`: a detector run's checkpoint on one image, drawn with its detections."""

from __future__ import annotations

from typing import Any

import numpy as np

from hloforge.commands.argtypes import image_out
from hloforge.commands.opening import open_checkpoint
from hloforge.core.errors import DataError
from hloforge.core.regions import DEFAULT_REGION
from hloforge.train.detection import DetectionHead, boxes_to, describe, draw_detections, load_image
from hloforge.train.session import ForwardSession


def detect_run(run_path: str, image: str | None, out: str, *, index: int | None = None,
               score_min: float = 0.3, backend: str | None = None, log: Any = print, data_dir: str | None = None,
               data_file: str | None = None, region: str = DEFAULT_REGION) -> np.ndarray:
    """`hloforge detect`: a run's checkpoint on one image — a PNG/JPEG file (normalised as the
    run's dataset normalises, which it must say how: `normalize`) or test image `index` of the
    run's dataset — drawn with its detections to `out`, by the weights `region` picks (eval's: by default the
    EMA shadow where the run kept one, the weights its mAP was scored with). Returns the detections."""
    if (image is None) == (index is None):
        raise DataError("detect takes an image file or --index N (a test image of the run's dataset), one of them")
    image_out(out)
    oc = open_checkpoint(run_path, backend, log=lambda _: None, data_dir=data_dir, data_file=data_file)
    run, spec = oc.run, oc.spec
    head = getattr(run.task, "head", None)
    if not isinstance(head, DetectionHead):
        raise DataError(f"run {run_path} trained {spec.name!r}, which is not a detector")
    truth, original = None, None
    if index is not None:
        if not 0 <= index < len(run.x_te):
            raise DataError(f"--index {index}: the run's test split has {len(run.x_te)} images")
        x, shown, truth = run.x_te[index], run.x_te[index], run.task.truth[index]
    else:
        assert image is not None
        normalize = getattr(run.data, "normalize", None)
        if normalize is None:
            raise DataError(f"dataset {run.cfg.data!r} does not say how to normalise an image file for this net; "
                            "use --index N to take one of its test images")
        shown = load_image(image)
        size = head.image_size
        if shown.shape[1:] != (size, size):  # the net sees it resized; the user reads boxes on their own image
            original, shown = shown, load_image(image, size)
            log(f"{image} is {original.shape[2]}×{original.shape[1]}: resized to the net's {size}×{size} input; "
                "boxes are in the image's own pixels")
        x = normalize(shown)
    region, params, running = oc.region_weights(region)  # θ or the EMA shadow, each with its own BN statistics
    evaluator = ForwardSession(spec, 1, run.backend)
    raw = evaluator.logits(np.asarray(x, np.float32)[None], params + running)
    (dets,) = head.decode(raw, score_min=score_min)
    if original is not None:
        dets, shown = boxes_to(dets, head.image_size, *original.shape[1:]), original
    names = getattr(run.data, "box_names", None)
    scale = max(1, 256 // max(shown.shape[-2:]))
    draw_detections(shown, dets, out, names=names, truth=truth, scale=scale)
    for line in describe(dets, names):
        log(f"  {line}")
    log(f"{len(dets)} detection(s) (score ≥ {score_min}, {region} weights) written to {out}")
    return dets
