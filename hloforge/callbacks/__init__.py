"""Callbacks for the training loop (`Model.fit` and `hloforge train --callback NAME`): hooks at the
start and end of training, of each epoch and after each step. A callback sees the epoch's metrics
(`logs`) and stops training by setting `model.stop_training = True`.

The built-ins register through the `hloforge.callbacks` entry-point group as a third party's do
(the `hloforge_callbacks` hook, in hloforge.callbacks.builtin); this package is also the
lookup of every registered callback: `hf.callbacks["early_stopping"]`, `hf.callbacks.EarlyStopping`
(hloforge.core.lookup)."""

from __future__ import annotations

import contextlib
import csv
import inspect
import math
import os
import sys
import tempfile
import time
import typing
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from hloforge.callbacks import tbevents
from hloforge.core.errors import HloforgeError, PluginError, UnsupportedSpec
from hloforge.core.lookup import LookupModule
from hloforge.core.registry import component_label
from hloforge.core.spec import conforms
from hloforge.keywords import no_metric


class History(list):  # type: ignore[type-arg]
    """One dict of metrics per epoch (loss, lr, seconds; val_* with validation_data)."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):  # history["val_top1"]: that metric over the epochs
            if not all(key in h for h in self):
                raise no_metric(key, list(self))
            return [h[key] for h in self]
        return super().__getitem__(key)

    @property
    def history(self) -> dict[str, list[Any]]:
        """Keras's History.history: each metric over the epochs (None in an epoch that has not it)."""
        return {k: [h.get(k) for h in self] for k in dict.fromkeys(k for h in self for k in h)}


class Callback:
    """Override any of the hooks; `self.model` is the Model being fitted, or the `hloforge train` run
    (hloforge.train.trainer.Run), set before on_train_begin. A registered one has a `name`. A resumed run's
    on_train_begin gets `logs["history"]`: the metrics of the epochs it already trained, in order (none when
    its checkpoint is at epoch 0)."""

    name = ""
    model: Any = None
    # The keys this callback's on_epoch_end adds to each epoch's logs: the callbacks after it may monitor them.
    adds_metrics: tuple[str, ...] = ()

    def check_metrics(self, metrics: frozenset[str]) -> None:
        """Refuse, with one line, an option this run cannot honour, before its first step (not after an
        epoch's training): `metrics` are the keys every epoch's logs will hold."""

    def check_begin(self) -> None:
        """Refuse, with one line, what this fit cannot do whatever its metrics (a path it would write over),
        before its first step; `self.model` is set for `hloforge train`, maybe not yet for a Model's fit."""

    def on_train_begin(self, logs: dict[str, Any]) -> None: ...

    def on_train_end(self, logs: dict[str, Any]) -> None: ...

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any]) -> None: ...

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None: ...

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None: ...


# The hooks the loop calls (and how: with the base's parameters, positionally); an override is held to them.
HOOKS = tuple(n for n, v in vars(Callback).items() if inspect.isfunction(v) and not n.startswith("_"))


def check_hooks(cb: Callback) -> None:
    """Refuse, when it is made, a callback whose hook cannot take the call the loop makes (an `on_epoch_end(self,
    epoch)` without logs): its TypeError would come only after a whole epoch has trained."""
    for hook in HOOKS:
        args = list(inspect.signature(getattr(Callback, hook)).parameters)[1:]
        mine = getattr(cb, hook, None)
        try:
            inspect.signature(mine).bind(*args)  # type: ignore[arg-type]  # a non-callable: TypeError too
        except ValueError:  # no signature to read (a builtin function): left to the call itself
            continue
        except TypeError:
            label = component_label("callback", cb) if cb.name else f"callback {type(cb).__name__!r}"
            own = getattr(type(cb), hook, mine)
            said = f"{hook}{_bare(inspect.signature(own))}" if callable(own) else f"{hook} = {own!r}"
            want = str(inspect.signature(getattr(Callback, hook), eval_str=True)).replace("typing.", "")
            raise PluginError(f"{label}: its {said} cannot take the loop's call {hook}({', '.join(args)}); expected "
                              f"{hook}{want} as hloforge.callbacks.Callback declares it") from None


def _bare(sig: inspect.Signature) -> inspect.Signature:
    """A signature without its annotations (a plugin's may be strings of names that do not resolve here)."""
    return sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                       return_annotation=sig.empty)


def check_option_types(cls: type, options: Mapping[str, Any]) -> None:
    """Refuse a plugin callback's option (parsed from --callback NAME:KEY=VALUE) not of the type its __init__
    annotates, as a spec's layer options are (`conforms`): else it fails in the callback after an epoch."""
    try:
        hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    except (NameError, TypeError):  # annotations that do not resolve: the callback checks its own
        return
    for key, value in options.items():
        if key in hints and not conforms(value, hints[key]):
            want = getattr(hints[key], "__name__", None) or str(hints[key]).replace("typing.", "")
            raise UnsupportedSpec(f"{component_label('callback', cls)} option {key}={value!r} is not of its type "
                                  f"{want}")


# mode "auto": max for a key holding one (correct: the count right; ap50/CLASS: a detector's per-class AP)
HIGHER_IS_BETTER = ("top", "miou", "map", "ap50", "acc", "dice", "iou", "correct")


class Monitor(Callback):
    """What EarlyStopping and ModelCheckpoint share: one metric watched for improvement. `mode` "min",
    "max", or "auto": max for a score (a key holding top, miou, map, ap50, acc, dice, iou or correct), min
    otherwise."""

    def __init__(self, monitor: str, mode: str, min_delta: float = 0.0):
        what = type(self).__name__
        if not isinstance(monitor, str) or not monitor:
            raise UnsupportedSpec(f"{what} wants monitor a metric name (e.g. 'val_loss' or 'top1'), got {monitor!r}")
        if mode not in ("auto", "min", "max"):
            raise UnsupportedSpec(f"{what} mode {mode!r}; expected 'auto', 'min' or 'max'")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not min_delta >= 0:
            raise UnsupportedSpec(f"{what} wants min_delta a number ≥ 0, got {min_delta!r}")
        self.monitor, self.min_delta = monitor, min_delta
        self.mode = (("max" if any(k in monitor for k in HIGHER_IS_BETTER) else "min") if mode == "auto" else mode)
        self.best = math.inf if self.mode == "min" else -math.inf

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        self.best = math.inf if self.mode == "min" else -math.inf

    def check_metrics(self, metrics: frozenset[str]) -> None:
        if self.monitor not in metrics:
            raise self.missing(metrics)

    def missing(self, keys: Collection[str]) -> UnsupportedSpec:
        """The refusal of a monitor that is not one of `keys` (an epoch's metrics), with a hint at the prefix."""
        hint = ""
        if self.monitor.startswith("val_") and not any(k.startswith("val_") for k in keys):
            hint = " (hloforge train scores its test split unprefixed: monitor=top1, say)"
        elif f"val_{self.monitor}" in keys:  # a Model's fit prefixes its validation scores
            hint = f" (the validation scores are prefixed: monitor=val_{self.monitor}, say)"
        return UnsupportedSpec(f"{type(self).__name__} monitors {self.monitor!r}, but the epoch's metrics are "
                               f"{sorted(keys)}{hint}")

    def past_epochs(self, logs: dict[str, Any]) -> list[dict[str, Any]]:
        """A resumed run's earlier epochs that logged the monitored metric (on_train_begin's logs)."""
        return [m for m in logs.get("history", ()) if self.monitor in m]

    def improved(self, logs: dict[str, Any]) -> bool:
        """Whether this epoch's value beats the best so far (and it becomes the best)."""
        if self.monitor not in logs:  # else refused before the first step (check_metrics): logs a callback made
            raise self.missing(logs)
        v = float(logs[self.monitor])
        better = v < self.best - self.min_delta if self.mode == "min" else v > self.best + self.min_delta
        if better:
            self.best = v
        return better


class EarlyStopping(Monitor):
    """Stop when `monitor` (a key of the epoch's metrics, e.g. "val_loss" or "val_top1") has not
    improved by more than `min_delta` for `patience` epochs (`mode` as Monitor's)."""

    name = "early_stopping"

    def __init__(self, monitor: str = "val_loss", patience: int = 2, min_delta: float = 0.0, mode: str = "auto"):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise UnsupportedSpec(f"EarlyStopping wants patience an integer ≥ 0, got {patience!r}")
        super().__init__(monitor, mode, min_delta)
        self.patience = patience
        self.wait = 0
        self.stopped_epoch = 0

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        super().on_train_begin(logs)
        self.wait, self.stopped_epoch = 0, 0
        past = self.past_epochs(logs)
        for m in past:  # a resumed run's patience counts from its real best epoch
            self.wait = 0 if self.improved(m) else self.wait + 1
        # Its patience ran out in those epochs (a run killed as it ended, after the stop): no epoch more, as the
        # run it resumes trained none. on_epoch_end's test: a stop follows at least one epoch without improvement.
        if past and self.wait >= max(self.patience, 1):
            self._stop(int(past[-1].get("epoch", 0)))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        if self.improved(logs):
            self.wait = 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self._stop(epoch)

    def _stop(self, epoch: int) -> None:
        self.stopped_epoch = epoch
        self.model.stop_training = True
        say = getattr(self.model, "log", None)  # a `hloforge train` run's lines: else it ended short unsaid
        if callable(say):
            say(f"  early_stopping: {self.monitor} not better than {self.best:.6g} for {self.wait} epoch(s); "
                f"stopped after epoch {epoch} of {getattr(self.model, 'end_epoch', '?')}")


class ModelCheckpoint(Monitor):
    """Keep the best checkpoint: whenever `monitor` improves (`mode` and `min_delta` as Monitor's),
    write the run directory `path` — config.toml and checkpoint.safetensors, the format `hloforge
    train` writes, so `hloforge eval PATH` and `hf.load(PATH)` read it — replacing the one before.
    A Model's directory names `data` as its eval dataset (Model.save's); a `hloforge train` run's
    is a copy of its own run directory at that epoch. `best_epoch`: the epoch kept.

    A `path` that already holds files it did not write (another run, another fit's checkpoint) is
    refused before the fit's first step, as Model.save refuses one; `overwrite=True` replaces what is
    there, the old run's metrics, curves and eval bitmap included, but never files of those names that
    are no run's (rundir.check_own_files: the user's own, refused either way). What it writes itself it replaces
    (its later epochs; a resumed `hloforge train` run's best so far, which it kept before)."""

    name = "model_checkpoint"

    def __init__(self, path: str, monitor: str = "val_loss", mode: str = "auto", min_delta: float = 0.0,
                 data: str | None = None, overwrite: bool = False):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise UnsupportedSpec(f"ModelCheckpoint wants path a directory name, got {path!r}")
        path = os.path.expanduser(os.fspath(path))  # `~/best` is under the home folder, as save's path
        if os.path.isfile(path):  # else refused only when the first improvement is written
            raise UnsupportedSpec(f"ModelCheckpoint writes a run directory, but {path} is a file")
        from hloforge.train.rundir import check_save_dir

        check_save_dir(path, "ModelCheckpoint path")  # a new one named as a file (`best.keras`)
        if not isinstance(overwrite, bool):  # "no" would be true
            raise UnsupportedSpec(f"ModelCheckpoint wants overwrite true or false, got {overwrite!r}")
        writable(path, "ModelCheckpoint", directory=True)
        if data is not None:  # a Model's save reads it at the first improvement: an unknown one is refused now
            from hloforge.core.registry import default_registry

            if not isinstance(data, str) or not data:
                raise UnsupportedSpec(f"ModelCheckpoint wants data a registered dataset's name, got {data!r}")
            try:
                default_registry().get("dataset", data)
            except HloforgeError as e:
                raise UnsupportedSpec(f"ModelCheckpoint data: {e}") from None
        super().__init__(monitor, mode, min_delta)
        self.path, self.data, self.overwrite = path, data, overwrite
        self.best_epoch = 0
        self._wrote: frozenset[tuple[str, int, int]] | None = None  # `path` as its last write left it
        self._kept_of: Any = None  # the model (or run) whose epoch that write kept

    def check_begin(self) -> None:
        from hloforge.train.rundir import check_own_files, holds_run

        # the user's own files (no run's) are refused, overwrite=True or not: it replaces a run, not them
        check_own_files(self.path, "ModelCheckpoint path", "its checkpoints", "give another path", UnsupportedSpec)
        eval_set_of = getattr(self.model, "_eval_set_of", None)  # a Model's fit: its saves name `data`
        if eval_set_of is not None and self.data is not None:  # refused now, not at the first improvement
            eval_set_of(self.path, self.data)
        if self.overwrite:
            return
        dir_ = run_dir_of(self.model)
        if dir_ and same_path(dir_, self.path):
            raise UnsupportedSpec(f"ModelCheckpoint path {self.path} is this run's own directory; expected "
                                  "another, where the best epoch's copy is kept")
        now = listing(self.path)
        if not now or now == self._wrote:
            return
        holds_copy = getattr(self.model, "holds_copy", None)  # a resumed run's best so far, kept by it before
        if holds_copy is not None and holds_copy(self.path):
            return
        what = "a run" if holds_run(self.path) else "files"
        held = sorted(n for n, _, _ in now)
        names = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise UnsupportedSpec(f"ModelCheckpoint path {self.path} already holds {what} ({names}), which its "
                              "checkpoints would replace; expected a new or empty directory: give another path, "
                              "or overwrite=True (--callback model_checkpoint:...,overwrite=true) to replace it")

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        from hloforge.train.config import CHECKPOINT

        kept = self.best, self.best_epoch
        super().on_train_begin(logs)
        self.best_epoch = 0
        # A later fit of the Model whose epoch it keeps, `path` as it left it (a notebook's next fit): only a better
        # one replaces that epoch, as in a resumed run. Else that fit's first epoch, however worse, would.
        if "history" not in logs and self._kept_of is self.model and listing(self.path) == self._wrote:
            self.best, self.best_epoch = kept
            return
        # A resumed run whose best epoch so far is already at `path`: only a better one replaces it.
        if os.path.exists(os.path.join(self.path, CHECKPOINT)):
            past = self.past_epochs(logs)
            for m in past:
                if self.improved(m):
                    self.best_epoch = int(m.get("epoch", 0))
            # That best is the epoch the run resumes from, yet `path` holds no whole copy of it (an earlier epoch, or
            # no bitmap): a kill cut its copy off. The run's checkpoint is that epoch: copied now, else lost for good.
            from hloforge.train.rundir import copy_whole

            dir_ = run_dir_of(self.model)
            if past and self.best_epoch == int(past[-1].get("epoch", 0)) and dir_ \
                    and not copy_whole(dir_, self.path, self.best_epoch):
                self.model.copy_to(self.path)
                self._wrote, self._kept_of = listing(self.path), self.model

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        if not self.improved(logs):
            return
        copy = getattr(self.model, "copy_to", None)  # a `hloforge train` run: its directory as it now is
        if copy is not None:
            copy(self.path)
        else:  # over its own files alone: another's were refused before the first step (check_begin)
            self.model.save(self.path, data=self.data, overwrite=True)
        self._wrote, self._kept_of = listing(self.path), self.model
        self.best_epoch = epoch


class CSVLogger(Callback):
    """One row per epoch (its metrics) to `path`, the header from the first epoch's keys. A resumed run's
    file starts with the epochs it already trained (on_train_begin's history), so none is lost; a later fit
    of the Model it logged, the file as it left it, adds its rows after the earlier fits'."""

    name = "csv_logger"

    def __init__(self, path: str):
        if not isinstance(path, (str, os.PathLike)) or not str(path):  # an int would name a file descriptor
            raise UnsupportedSpec(f"CSVLogger wants path a file name, got {path!r}")
        path = os.fspath(path)
        if os.path.isdir(path):  # else refused only after the first epoch's training
            raise UnsupportedSpec(f"CSVLogger writes a file, but {path} is a directory")
        writable(path, "CSVLogger")
        self.path = path
        self._keys: list[str] = []
        self._wrote: tuple[Any, Any] = (None, None)  # (the model logged, the file's size and mtime its rows left)

    def check_begin(self) -> None:
        from hloforge.train.rundir import LOCK, RUN_FILES

        # its rows would replace the file the run writes (its metrics log, which `hloforge plot` and a resume read)
        dir_, name = run_dir_of(self.model), os.path.basename(self.path)
        if dir_ and name in (*RUN_FILES, LOCK) and same_path(os.path.dirname(os.path.abspath(self.path)), dir_):
            raise UnsupportedSpec(f"CSVLogger path {self.path} is this run's own {name}, which the run writes; "
                                  f"expected a file of its own ({os.path.join(dir_, 'log.csv')}, say)")

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        if "history" not in logs and self._wrote == (self.model, _stamp(self.path)):
            return  # the same model's next fit (a notebook's), which goes on from its weights: its rows go on too
        self._keys = []
        history = logs.get("history", ())
        if history:
            self._write(history)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        self._write([logs])

    def _write(self, rows: Sequence[dict[str, Any]]) -> None:
        first = not self._keys
        if first:
            self._keys = list(rows[0])
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "w" if first else "a", newline="", encoding="utf-8") as f:
                w = csv.DictWriter(f, self._keys, extrasaction="ignore")
                if first:
                    w.writeheader()
                w.writerows(rows)
            self._wrote = (self.model, _stamp(self.path))
        except OSError as e:  # a full disk, the file removed or made read-only since the check
            raise HloforgeError(f"CSVLogger cannot write {self.path}: {e.strerror or e}") from None


class TensorBoard(Callback):
    """Each epoch's numeric metrics as TensorBoard scalars under `logdir` by epoch (and each step's loss by
    global step when `every_step`), written by tensorboardX's EventsWriter in this thread: `pip install
    tensorboardX` (read back with tensorboard's EventAccumulator or `tensorboard --logdir`). A resume cuts the
    files back to its checkpoint first (tbevents.rewind). Not its SummaryWriter: that one writes from a thread
    of its own, so a full disk printed that thread's traceback and another at exit, and reached the run as the
    run directory's fault."""

    name = "tensorboard"

    def __init__(self, logdir: str, every_step: bool = False):
        try:
            from tensorboardX import summary  # the package first: a submodule loaded earlier imports without it
            from tensorboardX.event_file_writer import EventsWriter
            from tensorboardX.proto.event_pb2 import Event
        except ImportError:
            raise HloforgeError("the TensorBoard callback writes event files with tensorboardX, which is not "
                                "installed; pip install tensorboardX") from None
        if not isinstance(logdir, (str, os.PathLike)) or not str(logdir):  # None: tensorboardX's own runs/...
            raise UnsupportedSpec(f"TensorBoard wants logdir a directory name, got {logdir!r}")
        if not isinstance(every_step, bool):  # "no" would be true
            raise UnsupportedSpec(f"TensorBoard wants every_step true or false, got {every_step!r}")
        logdir = os.fspath(logdir)
        if os.path.exists(logdir) and not os.path.isdir(logdir):
            raise UnsupportedSpec(f"TensorBoard writes event files into a directory, but {logdir} is a file")
        writable(logdir, "TensorBoard", directory=True)
        self._writer_cls, self._event, self._scalar = EventsWriter, Event, summary.scalar
        self.logdir, self.every_step = logdir, every_step
        self._writer: Any = None
        self._logged = False  # whether the writer holds a scalar

    def on_train_begin(self, logs: dict[str, Any]) -> None:
        from hloforge.train.rundir import new_identity, run_id

        history, resumed, dir_ = logs.get("history", ()), "history" in logs, run_dir_of(self.model)
        kept: set[tuple[str, int]] = set()
        # The run's identity names its files, so a resume cuts its own, not another run's in a shared logdir
        # (a new run mints its own as it starts). None with a history: a run from before runs had one, whose
        # files bear none; none without: a first resume (of Model.save's directory, a ModelCheckpoint copy's),
        # which wrote no file yet.
        ident = run_id(dir_, new=False) if dir_ else None
        if resumed and (ident or history):
            # A resume: the files cut back to its checkpoint (the last epoch of its history; epoch 0, step 0
            # where it has none), then the history's epochs they lack (the run killed before this callback
            # logged its checkpoint's epoch, or a first run without this callback), as CSVLogger writes it.
            last = history[-1] if history else {"epoch": 0, "step": 0}
            try:
                if os.path.isdir(self.logdir):
                    kept = tbevents.rewind(self.logdir, last["epoch"], last["step"], ident)
            except OSError as e:
                raise HloforgeError(f"TensorBoard cannot cut the event files in {self.logdir} back to the checkpoint "
                                    f"(epoch {last['epoch']}): {e.strerror or e}") from None
        if ident is None:  # a fit's (no directory, never resumed) too: only files of before runs had one bear none
            ident = run_id(dir_, new=True) if dir_ else new_identity()
        with self._writing():
            os.makedirs(self.logdir, exist_ok=True)
            self._writer = self._writer_cls(os.path.join(self.logdir, "events"), tbevents.own_suffix(ident))
        self._logged = False
        for row in history:
            self._log_epoch(row["epoch"], row, skip=kept)

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        if self.every_step:
            self._add(f"{tbevents.STEP}loss", logs["loss"], step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        self._log_epoch(epoch, logs)

    def _log_epoch(self, epoch: int, logs: dict[str, Any], skip: Collection[tuple[str, int]] = ()) -> None:
        for k, v in logs.items():
            tag = f"{tbevents.EPOCH}{k}"
            if k != "epoch" and isinstance(v, (int, float)) and (tag, epoch) not in skip:
                self._add(tag, v, epoch)
        with self._writing():
            self._writer.flush()

    def _add(self, tag: str, value: float, step: int) -> None:
        """One scalar, as SummaryWriter.add_scalar writes it."""
        with self._writing():
            self._writer.write_event(self._event(summary=self._scalar(tag, value), step=step, wall_time=time.time()))
        self._logged = True

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write that fails (a full disk, the directory gone) in one line naming the logdir, the file closed."""
        try:
            yield
        except OSError as e:
            if self._writer is not None:
                with contextlib.suppress(OSError):
                    self._writer.close()
                self._writer = None
            raise HloforgeError(f"TensorBoard cannot write its event files in {self.logdir}: {e.strerror or e}; "
                                "expected a directory with room for them") from None

    def on_train_end(self, logs: dict[str, Any]) -> None:
        if self._writer is not None:
            with self._writing():
                self._writer.close()
            file = getattr(self._writer, "_file_name", None)  # tensorboardX's EventsWriter's own
            if not self._logged and isinstance(file, str):  # no scalar (a finished run's resume): no file of none
                with contextlib.suppress(OSError):
                    os.remove(file)
            self._writer = None


def listing(path: str) -> frozenset[tuple[str, int, int]]:
    """A directory's files as (name, size, mtime) (none where it is not a directory), its lock aside: what
    a ModelCheckpoint compares with what it last wrote there."""
    from hloforge.train.rundir import LOCK

    try:
        names = os.listdir(path) if os.path.isdir(path) else []
        return frozenset((n, (st := os.stat(os.path.join(path, n))).st_size, st.st_mtime_ns) for n in names
                         if n != LOCK)
    except OSError:  # removed meanwhile, or unreadable: the write itself says what is wrong
        return frozenset()


def _stamp(path: str) -> tuple[int, int] | None:
    """A file's (size, mtime): whether it is as a callback's last write left it. None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def run_dir_of(model: Any) -> str | None:
    """The run directory of a `hloforge train` run a callback is given (its `model`), else None (a Model's fit)."""
    return getattr(model, "dir", None) if getattr(model, "copy_to", None) is not None else None


def same_path(a: str, b: str) -> bool:
    """Whether two paths name one place (links and relative spellings resolved)."""
    return os.path.realpath(a) == os.path.realpath(b)


def checked_callbacks(callbacks: Any) -> list[Callback]:
    """`fit`'s callbacks argument as a list, refused unless an iterable of Callback instances."""
    if isinstance(callbacks, Callback) or not isinstance(callbacks, Iterable):
        got = f"one {type(callbacks).__name__} (pass [it])" if isinstance(callbacks, Callback) else repr(callbacks)
        raise UnsupportedSpec(f"callbacks must be a list of hloforge Callback instances, got {got}")
    callbacks = list(callbacks)
    for cb in callbacks:
        if not isinstance(cb, Callback):
            kind = type(cb)
            # another framework's (Keras's EarlyStopping): name hloforge's own of that name, if there is one
            ours = globals().get(kind.__name__)
            own = (f" from {kind.__module__.split('.')[0]}; hloforge's own is hf.callbacks.{kind.__name__}" if
                   isinstance(ours, type) and issubclass(ours, Callback) and ours is not kind else "")
            raise UnsupportedSpec(f"callbacks must be hloforge Callback instances, got {kind.__name__}{own}")
        check_hooks(cb)
    return callbacks


def writable(path: str, what: str, directory: bool = False) -> None:
    """Refuse, when the callback is made (before anything trains), a `path` it will write that cannot be
    written: an existing file that cannot be opened for writing, or a folder for it (`directory`: `path`
    itself) that neither is nor can be made writable. The nearest existing folder is probed by making and
    removing a file in it: access() says yes to root even under /proc or on a read-only mount."""
    if "\0" in path:  # os.path's tests say False to it; the write itself would be a ValueError
        raise UnsupportedSpec(f"{what} cannot write {path!r}: a path cannot hold a NUL character")
    full = os.path.abspath(path)
    if not directory and os.path.isfile(full):
        try:
            open(full, "ab").close()  # opened, not written: its rows are replaced on the first epoch's end
        except OSError as e:
            raise UnsupportedSpec(f"{what} cannot write {path} ({e.strerror or e}); expected a writable file") from None
        return
    near = full if directory else os.path.dirname(full)
    while not os.path.exists(near):
        near = os.path.dirname(near)
    want = "a directory that exists or can be created, and is writable"
    if not os.path.isdir(near):
        raise UnsupportedSpec(f"{what} cannot write {path}: {near} is a file, not a directory; expected {want}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".hloforge-probe-", dir=near)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise UnsupportedSpec(f"{what} cannot write {path}: {near} is not writable ({e.strerror or e}); "
                              f"expected {want}") from None


def from_items(items: Sequence[str]) -> list[Callback]:
    """Callbacks by registered name, each "NAME" or "NAME:KEY=VALUE,..." (`hloforge train --callback`),
    its options parsed as the dataset options are (hloforge.train.config.parse_data_options)."""
    from hloforge.core.registry import default_registry
    from hloforge.train.config import parse_data_options

    out = []
    for item in items:
        name, _, opts = item.partition(":")
        options = parse_data_options(opts, "callback option", once=True)
        entry = default_registry().entry("callback", name.strip())
        if not (isinstance(entry.obj, type) and issubclass(entry.obj, Callback)):  # (the registry cannot tell)
            raise PluginError(f"{component_label('callback', entry.obj)}: its class {entry.obj.__qualname__} does "
                              "not subclass hloforge.callbacks.Callback; expected a subclass, as the "
                              "hloforge_callbacks hook says")
        if not entry.builtin:  # hloforge's own check their options themselves, in words of their own
            check_option_types(entry.obj, options)
        cb = default_registry().make("callback", name.strip(), **options)
        check_hooks(cb)
        out.append(cb)
    return out


sys.modules[__name__].__class__ = LookupModule  # hf.callbacks: also the lookup of every registered callback
sys.modules[__name__]._lookup_kind = "callback"  # type: ignore[attr-defined]
