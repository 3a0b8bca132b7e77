"""`hloforge classify`: a classifier run's classes for image files, each read as the run's dataset reads its eval
images (`image_file`: imagenette's resize and centre crop, CIFAR-10's 32×32), through its eval transform."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hloforge.commands.opening import open_checkpoint
from hloforge.core.errors import DataError
from hloforge.core.regions import DEFAULT_REGION
from hloforge.datasets.augment import step_rng
from hloforge.train.inputs import net_inputs
from hloforge.train.session import ForwardSession
from hloforge.train.tasks import ClassificationTask

# what a run's task (by its label kind) trains, where it is no classifier; None: a language model (no task)
NOT_CLASSIFIERS = {"mask": "segmenter", "boxes": "detector", "noise": "DDPM", None: "language model"}


def classify_run(run_path: str, images: Sequence[str], top: int = 5, *, backend: str | None = None,
                 region: str = DEFAULT_REGION, log: Callable[[str], None] = print, data_dir: str | None = None,
                 data_file: str | None = None) -> np.ndarray:
    """Each image's `top` classes with their probabilities (softmax of the logits), one line an image, through the
    weights `region` picks (eval's: by default the EMA shadow where the run kept one). Returns the probabilities
    [N, classes]."""
    oc = open_checkpoint(run_path, backend, log=lambda _: None, data_dir=data_dir, data_file=data_file)
    run, spec = oc.run, oc.spec
    if not isinstance(run.task, ClassificationTask):
        what = NOT_CLASSIFIERS.get(getattr(run.task, "kind", None), "net of another task")
        raise DataError(f"run {run_path} trained {spec.name!r}, a {what}, not a classifier; classify takes a "
                        "classifier's run (detect: a detector's)")
    image_file = getattr(run.data, "image_file", None)
    if image_file is None:
        raise DataError(f"dataset {run.cfg.data!r} does not say how an image file becomes its input (a dataset's "
                        "image_file); classify reads images for cifar10 and imagenette runs (cam takes a .npy of the "
                        "net's input)")
    stored = np.stack([image_file(p) for p in images])
    x, _ = run.data.transform("test")(stored, np.zeros(len(stored), np.int32), step_rng(0))
    x = net_inputs(np.asarray(x).reshape(len(stored), *spec.input_shape), spec, len(stored), "classify")
    region, params, running = oc.region_weights(region)
    logits = ForwardSession(spec, 1, run.backend).logits(x, params + running).reshape(len(stored), -1)
    shifted = np.exp(logits - logits.max(1, keepdims=True), dtype=np.float64)
    probs = shifted / shifted.sum(1, keepdims=True)
    names = oc.meta.get("class_names") or []
    for path, p in zip(images, probs, strict=True):
        best = np.argsort(-p, kind="stable")[:top]  # ties: the lower id first, as argmax
        said = ", ".join(f"{names[i] if i < len(names) else f'class {i}'} {p[i]:.1%}" for i in best)
        log(f"{path}: {said}")
    log(f"({len(images)} image(s) through {spec.name}, epoch {oc.meta['epoch']}, {region} weights)")
    return probs
