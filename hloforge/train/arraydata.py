"""The user's own arrays as the dataset a Run reads (what `Model.fit(x, y)` and `Model.evaluate(x, y)`
train and score on), and the name a run directory's config gives them: no registered dataset. A run
saved from them opens without data (`hloforge export`: its net and weights alone) on `no_rows`."""

from __future__ import annotations

import numpy as np

from hloforge.core.modules import label_type
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant

ARRAYS = "arrays"  # what a fit on arrays names its data in the run's config (no registered dataset)


class ArrayData:
    """A fit's arrays as a dataset the trainer's Run reads: `train` (x, y) and `test` (the validation
    data, or none), rows already net input; `num_classes` and `label_kind` the net's own."""

    name = ARRAYS

    def __init__(self, spec: NetSpec, label_kind: str, train: tuple[np.ndarray, np.ndarray] | None,
                 test: tuple[np.ndarray, np.ndarray] | None):
        out = spec.out_shape
        self.label_kind = label_kind
        self.num_classes = out[0] if label_kind == "mask" else spec.num_classes
        self.image_shape = tuple(out)  # a DDPM's images (hloforge.train.tasks.DiffusionTask)
        ref = train or test
        assert ref is not None
        empty = (np.zeros((0, *ref[0].shape[1:]), ref[0].dtype), np.zeros((0, *ref[1].shape[1:]), ref[1].dtype))
        self._splits = {"train": train or empty, "test": test or empty}
        self.n = len(self._splits["train"][0])

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        return self._splits[split]


def label_kind(spec: NetSpec, variant: Variant) -> str:
    """The labels `spec` trains on under `variant`'s loss: a language model's tokens, else the loss's kind."""
    from hloforge.train.tasks import loss_label_kind

    out = spec.out_shape
    return "tokens" if len(out) == 2 else loss_label_kind(variant.make_loss(default_registry()), out)


def no_rows(spec: NetSpec, variant: Variant) -> ArrayData:
    """The data of a run trained on arrays when only its net and weights are wanted (export): the net's
    own input and label shapes, no rows; nothing is scored on it."""
    y_shape, y_dtype = label_type(variant.make_loss(default_registry()), tuple(spec.out_shape), "f32")
    x = np.zeros((0, *spec.input_shape), np.float32)
    y = np.zeros((0, *y_shape), np.int32 if y_dtype == "i32" else np.float32)
    return ArrayData(spec, label_kind(spec, variant), None, (x, y))
