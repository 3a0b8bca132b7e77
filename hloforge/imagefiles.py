"""`hf.image_inputs(model, paths)`: the user's own image files as a model's net input, each read as the dataset the
model was trained on reads its eval images (the dataset's `image_file`: imagenette's resize to train_size and centre
crop, CIFAR-10's 32×32), then through that dataset's eval transform: what `model.predict` and `hloforge classify`
take. The dataset's files are not read (a run copied alone to another machine classifies the same)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.registry import default_registry
from hloforge.datasets.augment import step_rng
from hloforge.train.arraydata import ARRAYS
from hloforge.train.config import parse_data_options

if TYPE_CHECKING:
    from hloforge.api import Model


def image_inputs(model: Model, paths: Sequence[str]) -> np.ndarray:
    """The image files `paths` as `model`'s input rows [N, *input], float32 (see the module). A model fit on arrays,
    or on a dataset that says nothing of image files, is refused in one line."""
    if isinstance(paths, (str, bytes)) or not len(paths):
        raise DataError(f"image_inputs takes a list of image files, got {paths!r}")
    name = model._data
    if name in (None, ARRAYS):
        raise DataError("the model was not trained on a registered dataset, so none says how an image file becomes its "
                        "input; pass predict rows prepared as its training x was")
    data = default_registry().make("dataset", name, **parse_data_options(model._data_options))
    image_file = getattr(data, "image_file", None)
    if image_file is None:
        raise DataError(f"dataset {name!r} does not say how an image file becomes its input (a dataset's "
                        "image_file); image files are read for cifar10 and imagenette models")
    stored = np.stack([image_file(str(p)) for p in paths])
    x, _ = data.transform("test")(stored, np.zeros(len(stored), np.int32), step_rng(0))
    return np.asarray(x, np.float32).reshape(len(stored), *model.spec.input_shape)
