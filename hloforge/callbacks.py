"""Callbacks for `Model.fit`: hooks at the start and end of training, of each epoch and after each
step. A callback sees the epoch's metrics (`logs`) and stops training by setting
`model.stop_training = True`."""

from __future__ import annotations

import csv
import math
import os
from typing import Any

from hloforge.core.errors import HloforgeError, UnsupportedSpec


class Callback:
    """Override any of the hooks; `self.model` is the Model being fitted (set before on_train_begin)."""

    model: Any = None

    def on_train_begin(self, logs: dict[str, Any]) -> None: ...

    def on_train_end(self, logs: dict[str, Any]) -> None: ...

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any]) -> None: ...

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None: ...

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None: ...


class EarlyStopping(Callback):
    """Stop when `monitor` (a key of the epoch's metrics, e.g. "val_loss" or "val_top1") has not
    improved by more than `min_delta` for `patience` epochs. `mode` "min", "max", or "auto": max for
    an accuracy (a key holding "top"), min otherwise."""

    def __init__(self, monitor: str = "val_loss", patience: int = 2, min_delta: float = 0.0, mode: str = "auto"):
        if mode not in ("auto", "min", "max"):
            raise UnsupportedSpec(f"EarlyStopping mode {mode!r}; expected 'auto', 'min' or 'max'")
        if patience < 0 or not min_delta >= 0:
            raise UnsupportedSpec(f"EarlyStopping wants patience ≥ 0 and min_delta ≥ 0, got {patience} and {min_delta}")
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.mode = ("max" if "top" in monitor else "min") if mode == "auto" else mode
        self.best = math.inf if self.mode == "min" else -math.inf
        self.wait = 0
        self.stopped_epoch = 0

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        self.best = math.inf if self.mode == "min" else -math.inf
        self.wait, self.stopped_epoch = 0, 0

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        if self.monitor not in logs:
            raise UnsupportedSpec(f"EarlyStopping monitors {self.monitor!r}, but the epoch's metrics are "
                                  f"{sorted(logs)} (val_* need validation_data)")
        v = float(logs[self.monitor])
        better = v < self.best - self.min_delta if self.mode == "min" else v > self.best + self.min_delta
        if better:
            self.best, self.wait = v, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            self.model.stop_training = True


class CSVLogger(Callback):
    """One row per epoch (its metrics) to `path`, the header from the first epoch's keys."""

    def __init__(self, path: str):
        self.path = path
        self._keys: list[str] = []

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        self._keys = []

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        first = not self._keys
        if first:
            self._keys = list(logs)
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "w" if first else "a", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, self._keys, extrasaction="ignore")
            if first:
                w.writeheader()
            w.writerow(logs)


class TensorBoard(Callback):
    """Each epoch's numeric metrics as TensorBoard scalars under `logdir` (and each step's loss when
    `every_step`), written by tensorboardX's SummaryWriter: `pip install tensorboardX` (read back with
    tensorboard's EventAccumulator or `tensorboard --logdir`)."""

    def __init__(self, logdir: str, every_step: bool = False):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise HloforgeError("the TensorBoard callback writes event files with tensorboardX, which is not "
                                "installed; pip install tensorboardX") from None
        self._writer_cls, self.logdir, self.every_step = SummaryWriter, logdir, every_step
        self._writer: Any = None

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        self._writer = self._writer_cls(self.logdir)

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        if self.every_step:
            self._writer.add_scalar("step/loss", logs["loss"], step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        for k, v in logs.items():
            if k != "epoch" and isinstance(v, (int, float)):
                self._writer.add_scalar(f"epoch/{k}", v, epoch)
        self._writer.flush()

    def on_train_end(self, logs: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
