"""`hloforge classify`: a classifier run's classes for image files, each read as the run's dataset reads its eval
images (`hf.image_inputs`), by the weights `hloforge eval` scores. The run alone is read: not its dataset's files."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.regions import DEFAULT_REGION
from hloforge.train.config import CHECKPOINT

# what a run's net trains on (its labels' kind), where it is no classifier
NOT_CLASSIFIERS = {"mask": "segmenter", "boxes": "detector", "noise": "DDPM", "tokens": "language model"}


def classify_run(run_path: str, images: Sequence[str], top: int = 5, *, backend: str | None = None,
                 region: str = DEFAULT_REGION, log: Callable[[str], None] = print) -> np.ndarray:
    """Each image's `top` classes with their probabilities (softmax of the logits), one line an image, through the
    weights `region` picks (eval's: by default the EMA shadow where the run kept one). Returns the probabilities
    [N, classes]."""
    from hloforge.imagefiles import image_inputs
    from hloforge.loading import load

    folder = (os.path.dirname(run_path) or ".") if os.path.basename(run_path) == CHECKPOINT else run_path
    model = load(folder, backend)
    kind = model._label_kind()
    if kind != "class" or len(model.spec.out_shape) != 1:
        what = NOT_CLASSIFIERS.get(str(kind), "net of other labels than class ids")
        raise DataError(f"run {run_path} trained {model.spec.name!r}, a {what}, not a classifier; classify takes a "
                        "classifier's run (detect: a detector's)")
    logits = model.predict(image_inputs(model, images), batch_size=1, region=region).astype(np.float64)
    shifted = np.exp(logits - logits.max(1, keepdims=True))
    probs = shifted / shifted.sum(1, keepdims=True)
    names = model._named.get("class_names") or []
    for path, p in zip(images, probs, strict=True):
        best = np.argsort(-p, kind="stable")[:top]  # ties: the lower id first, as argmax
        said = ", ".join(f"{names[i] if i < len(names) else f'class {i}'} {p[i]:.1%}" for i in best)
        log(f"{path}: {said}")
    log(f"({len(images)} image(s) through {model.spec.name}, epoch {model._epoch}, {region} weights)")
    return probs
