"""The framework API: `hf.Model(net).fit(x, y)` on numpy arrays, `evaluate`, `predict`, named
`params` / `state`, `save` to a run directory `hloforge eval` reads, `hf.load` back, `summary()`.

A thin layer over the trainer: `fit` runs `hloforge train`'s own loop (hloforge.train.trainer.Run.loop)
on a Run that writes nothing, over the user's arrays (ArrayData) or a registered dataset; `evaluate`
scores through the run's Task, as an epoch does. One TrainSession per batch size (the batch is fixed
at compile time). The authoritative state between calls is on the host (θ, the optimizer state, the
BN running statistics, the EMA shadow's, and the step count); `fit` loads it into the session and
takes the loop's host copy back at the end of every epoch.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.backends.base import ProcessLock
from hloforge.backends.host_memory import kept_while
from hloforge.callbacks import Callback, History, Monitor, checked_callbacks
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.regions import DEFAULT_REGION
from hloforge.core.registry import default_registry
from hloforge.core.slots import check_stats
from hloforge.core.spec import NetSpec, summary_table
from hloforge.core.variant import SHADOW, Variant
from hloforge.keywords import check_model_options, checked_keywords, no_method
from hloforge.registering import check_layer_classes
from hloforge.saving import Saving
from hloforge.train import arraydata
from hloforge.train import checkpoint as ckpt
from hloforge.train.arraydata import ARRAYS, ArrayData, InputKind, checked_batch_size, label_kind, plain, row_count
from hloforge.train.config import TrainConfig, parse_data_options
from hloforge.train.diffusion import is_time_conditioned
from hloforge.train.exclusive import one_at_a_time, own_callbacks
from hloforge.train.inputs import checked_labels
from hloforge.train.rundir import checked_path
from hloforge.train.session import ForwardSession, TrainSession, make_backend

# What fit reads of an iterable of batches before it refuses it as endless (it holds them all, then a copy).
FIT_BATCHES_MAX_BYTES = 8 << 30
_HOST_STATE = ProcessLock()  # a model's host θ and state, replaced whole at each epoch's end of a fit
# The forwards a model keeps compiled, the last used: a server predicting with batch_size=len(x) of varying x would
# otherwise keep one per row count (200 sizes: RSS 255 -> 374 MB); one dropped is remade from the compile cache.
FORWARDS_KEPT = 8


class _Keep(Callback):
    """First of a fit's callbacks: each epoch's end state becomes the model's (so the callbacks after
    it see it, and an error in a later epoch leaves the last good one), its metrics the history's. Under
    MPI it runs on every rank: each rank's Model holds the (identical) weights."""

    every_rank = True

    def __init__(self, model: Model, run: Any, history: History):
        self.model, self.run, self.history = model, run, history

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        assert self.run.kept is not None
        self.model._kept(self.run, *self.run.kept)
        logs.pop("kind", None)  # every record is an epoch's
        self.history.append(dict(logs))
        self.model.history.append(dict(logs))


def _digest(arrays: Sequence[np.ndarray]) -> str:
    """A short hash of the arrays' values and shapes, in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(repr(np.shape(a)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


class _ReadEachEpoch(Callback):
    """A fit's re-iterable batches (a DataLoader, a class with __iter__) read afresh at each epoch after the first, as
    PyTorch and Keras read them (a loader's augmentation and order are new each pass), checked as the first pass was,
    in place of the last pass's rows. Under MPI every rank reads its own."""

    every_rank = True

    def __init__(self, model: Model, run: Any, arrays: ArrayData, batches: Iterable[Any]):
        self.model, self.run, self.arrays, self.batches = model, run, arrays, batches
        self.dtype = arrays.arrays("train")[0].dtype  # x's as the first pass gave it
        self.first = True

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any]) -> None:
        if self.first:  # the first pass, read by fit before the compile
            self.first = False
            return
        self.run.feed.x = self.run.feed.y = None  # the last pass's rows freed before this one is read
        self.arrays.renew_train(None)
        said = f"fit batches, read again for epoch {epoch},"
        try:
            x, y, _ = arraydata.read_batches(self.batches, FIT_BATCHES_MAX_BYTES)
        except DataError as e:
            raise DataError(f"{said} {e}") from None
        if len(x) != self.arrays.n or x.dtype != self.dtype:
            raise DataError(f"{said} gave {len(x)} rows of {x.dtype} where the first pass gave {self.arrays.n} of "
                            f"{self.dtype}; expected a loader of the same rows each epoch (as a DataLoader of one "
                            "dataset gives)")
        x, y = self.model._check_xy(x, y, f"{said[:-1]}:")
        self.arrays.renew_train((x, y))
        self.run.feed.x, self.run.feed.y = x, y


class Model(Saving):
    """A net with its training variant, weights and optimizer state.

    `net`: a NetSpec, a zoo name (`classes` / `input` override its defaults) or a .toml/.json spec file; `backend`
    None: $HLOFORGE_BACKEND, else xla. `optimizer`, `lr`, `schedule` ("cosine", "exp", "constant"), `warmup_epochs`,
    `decay_rate`, `decay_epochs`, a DDPM's `diffusion_steps`, `beta_start` and `beta_end`, `seed`, `bn_momentum` (a
    config.toml key, no flag) and `augment` (False: `--no-augment`, for a fit on a dataset by name) as `hloforge train`
    takes them (hf.load: the run's own); the other Variant fields (loss, weight_decay, label_smoothing, ema, accum,
    mixup, cutmix, precision, clip, dropout, drop_path, bn_eps, frozen) as keywords."""

    def __init__(self, net: NetSpec | str, optimizer: str = "adam", lr: float = 1e-3, schedule: str = "cosine",
                 backend: str | None = None, seed: int = 0, *, warmup_epochs: float = 0.0, decay_rate: float = 0.97,
                 bn_momentum: float = 0.9, classes: int | None = None, input: Sequence[int] | None = None,
                 decay_epochs: float = 1.0, diffusion_steps: int = 1000, beta_start: float = 1e-4,
                 beta_end: float = 0.02, augment: bool = True, **variant_fields: Any):
        from hloforge.train.tasks import default_loss
        from hloforge.zoo import net_of

        check_model_options(variant_fields, {f.name for f in attrs.fields(Variant)} - {"optimizer"}, Model.__init__,
                            Model.fit)
        lr, seed, warmup_epochs, decay_rate, bn_momentum, classes = map(
            plain, (lr, seed, warmup_epochs, decay_rate, bn_momentum, classes))
        variant_fields = {k: plain(v) for k, v in variant_fields.items()}
        # the run's other keys (a loaded run's own): fit (its augmentation too), a DDPM's scores and save use them
        self._run_options = {k: plain(v) for k, v in (
            ("decay_epochs", decay_epochs), ("diffusion_steps", diffusion_steps), ("beta_start", beta_start),
            ("beta_end", beta_end), ("augment", augment))}
        if isinstance(input, (list, tuple, np.ndarray)):
            input = [plain(d) for d in input]
        # The run config's own checks (each value's type, then its range: lr > 0, seed an integer ≥ 0, ...), the
        # one definition `hloforge train` refuses by: a bad value is one line here, not a TypeError from numpy.
        config = TrainConfig.checked("Model", optimizer=optimizer, lr=lr, schedule=schedule,
                                     warmup_epochs=warmup_epochs, decay_rate=decay_rate, bn_momentum=bn_momentum,
                                     seed=seed, classes=classes, input=input, **self._run_options, **variant_fields)
        spec, self._net_ref = net_of(net, classes, input)
        check_layer_classes(spec.layers, spec.name)  # a class of the program's own: gated by hf.register first
        config.check_bn(spec)  # bn_momentum on a net without BatchNorm, as apply_to refuses bn_eps
        # an option its schedule or net never reads is a mistake said, as `hloforge train` says it of the flags
        given = {k: v for k, v in {"decay_rate": decay_rate, **self._run_options}.items()
                 if v != attrs.fields_dict(TrainConfig)[k].default}
        if schedule != "exp" and (said := [k for k in ("decay_rate", "decay_epochs") if k in given]):
            raise UnsupportedSpec(f"Model option(s) {said} set the exp schedule's decay, but schedule is {schedule!r}; "
                                  "expected schedule='exp' with them, or neither")
        if (said := [k for k in ("diffusion_steps", "beta_start", "beta_end") if k in given]) and \
                not is_time_conditioned(spec):
            raise UnsupportedSpec(f"Model option(s) {said} set a DDPM's noise schedule; net {spec.name!r} is no DDPM "
                                  "(no layer reads the time channel)")
        self._classes, self._input = classes, (None if input is None else tuple(input))
        variant_fields.setdefault("loss", default_loss(spec, None))
        self.variant = Variant(optimizer, **variant_fields)
        self._declared_spec = spec  # as given; the variant's (dropout, BN ε) below is what trains and scores
        self.spec = self.variant.apply_to(spec)
        self.lr, self.schedule, self.warmup_epochs, self.decay_rate = lr, schedule, warmup_epochs, decay_rate
        self.bn_momentum, self.seed = bn_momentum, seed
        self.backend = make_backend(backend)
        reg = default_registry()
        self._state_layout = self.variant.state_layout(self.variant.make_optimizer(reg))
        self.variant.make_loss(reg)  # an unknown loss or option: refused now, not at the first fit
        self._param_slots = self.spec.params()
        self._stat_names = [n for n, _ in self.spec.stats()]
        self._params = self.spec.init_params(seed)
        self._opt_state: list[np.ndarray] | None = None  # None: the optimizer's initial state (made by a session)
        self._running = [s.initial() for _, s in self.spec.stats()]
        # the EMA shadow's BN statistics (the trainer's shadow_running); None: the initial ones
        self._shadow_running: list[np.ndarray] | None = None
        self._step, self._epoch, self._batch = 0, 0, 32
        # The dataset a saved run directory names for `hloforge eval`: the one the model last trained on (its
        # last fit's, or the loaded run's); ARRAYS, none, until a fit on a registered dataset.
        self._data, self._data_options = ARRAYS, ()  # and its options ("key=value" items), as a config has them
        self._eval_set: str | None = None  # the id of that dataset's test split as last scored (None: not known)
        self._named: dict[str, list[str]] = {}  # what its ids stand for, as recorded: class_names, a vocabulary
        # the kind of x it was fit on (refused of another kind when scored); None: not known, nothing checked
        self._inputs: InputKind | None = None
        self._fit_inputs: InputKind | None = None  # the fit in progress's, the model's when an epoch is kept
        self._sessions: dict[tuple[int, int], TrainSession] = {}  # by (batch, processes)
        self._live: Any = None  # the session the last fit ran on
        self._fitting: Any = None  # (the Run, its session, the fit's thread) while a fit runs (see _here)
        self._forwards: dict[int, ForwardSession] = {}
        self.stop_training = False
        self.history = History()

    # ------------------------------------------------------------------ sessions
    def _session(self, batch: int, spread: bool = False) -> TrainSession:
        """The train session at `batch`; `spread` (fit's): under an MPI launch, the data-parallel step over
        the ranks (hloforge.train.mpi: one replica each, `batch` the global batch), as `hloforge train`'s."""
        from hloforge.train import mpi

        w = mpi.world() if spread else mpi.World()
        key = (batch, w.size)
        for other in self._sessions.values():  # θ and the state live on the host between fits, and each
            other.release()                     # session left held a device copy of them (load places them)
        s = self._sessions.get(key)
        if s is None:
            if w.size > 1:
                try:
                    s = mpi.MpiTrainSession(self.spec, self.variant, batch, self.backend, world=w, replicas=w.size,
                                            seed=self.seed, params=self._params)
                except HloforgeError as e:  # every rank refuses alike (the same script): rank 0 says it
                    raise mpi.shared(e, w) from None
            else:
                s = TrainSession(self.spec, self.variant, batch, self.backend, seed=self.seed, params=self._params)
            self._sessions[key] = s
            if self._opt_state is None:
                self._opt_state = s.read_state()
        s.load(self._params, self._opt_state, self._step)  # the host state, whichever session ran last
        return s

    def _forward(self, batch: int) -> ForwardSession:
        forward = self._forwards.pop(batch, None) or ForwardSession(self.spec, batch, self.backend)
        self._forwards[batch] = forward  # the last used last: the first is the one to drop
        while len(self._forwards) > FORWARDS_KEPT:
            del self._forwards[next(iter(self._forwards))]
        return forward

    # ------------------------------------------------------------------ checks
    def _check_x(self, x: Any, what: str, trained: InputKind | None = None) -> np.ndarray:
        """x as the net's rows, refused if of another kind than `trained` (the model's, to score): float32, or
        integers as given (8-bit pixels, token ids; each batch is cast as it is read, so x is never copied whole)."""
        given, xa = arraydata.input_rows(x, self.spec, what, integers_as_given=True)
        arraydata.check_input_kind(trained, given, xa, what)
        return xa

    def _check_xy(self, x: Any, y: Any, what: str, scored: bool = False, trained: InputKind | None = None,
                  x_checked: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """x and y checked whole, against the labels the loss takes (as a train step's layout has them:
        no compile needed); `scored`: labels only scored (a language model's may hold its padding); `x_checked`: x is
        the rows `_check_x` gave (not read again: an array on disk is read from the file at each check)."""
        from hloforge.core.modules import label_type
        from hloforge.datasets.text import IGNORE
        from hloforge.train.inputs import label_classes

        xa = x if x_checked else self._check_x(x, what, trained)
        n = row_count(y, f"{what} y")
        if n != len(xa):
            raise DataError(f"{what}: x has {len(xa)} rows but y has {n}; expected one label per row")
        arraydata.refuse_misfit(self.spec, self.variant, y)  # mse on a classifier: before y's shape
        out = self.spec.out_shape
        y_shape, y_dtype = label_type(self.variant.label_loss(default_registry()), out, "f32")
        lowest = IGNORE if scored and self._label_kind() == "tokens" else 0
        ya = checked_labels(y, (n, *y_shape), y_dtype, label_classes(y_dtype, y_shape, out), what, lowest)
        arraydata.check_next_tokens(self._label_kind(), xa, ya, what)
        return xa, ya

    # ------------------------------------------------------------------ training
    def _run(self, data: Any, batch: int, epochs: int = 1, shuffle: bool = True, verbose: bool = False,
             data_options: Mapping[str, Any] | None = None, eval_only: bool = False) -> Any:
        """The trainer's Run over `data` (a registered dataset's name, or an ArrayData), on this model's
        net, variant and backend, writing nothing: the one loop `hloforge train` runs."""
        from hloforge.train.trainer import Run

        name = data if isinstance(data, str) else ARRAYS
        if data_options is not None and not isinstance(data_options, Mapping):
            raise UnsupportedSpec("data_options must be a mapping of option names to values, got a "
                                  f"{type(data_options).__name__}")
        opts = tuple(f"{k}={v}" for k, v in (data_options or {}).items())
        cfg = self._config("", name, epochs=epochs, batch=batch, data_options=opts)
        log = (lambda s: print(s, file=sys.stderr)) if verbose else (lambda s: None)
        return Run(cfg, log, progress=verbose, eval_only=eval_only, spec=self._declared_spec,
                   data=None if isinstance(data, str) else data, directory=False, backend=self.backend, shuffle=shuffle)

    def _arrays(self, x: Any, y: Any, validation_data: Any, batch_size: int | None) -> tuple[Any, int]:
        """(the ArrayData fit trains on, the batch size): arrays, or an iterable of (x, y) batches, its first pass
        read (its batches' size the batch size unless given), each checked whole before any compile."""
        if y is None:
            if not isinstance(x, Iterable) or isinstance(x, np.ndarray):
                raise DataError(f"fit x is a {type(x).__name__} without y; expected arrays x and y, an iterable of "
                                "(x, y) batches, or a dataset name")
            x, y, first = arraydata.read_batches(x, FIT_BATCHES_MAX_BYTES)
            batch_size = first if batch_size is None else batch_size  # 0 is refused below, not defaulted
        default = " (fit's default)" if batch_size is None else ""  # a user who gave none still reads why
        batch_size = checked_batch_size(batch_size, 32)
        # before the compile: a bad x is refused at once
        given, xa = arraydata.input_rows(x, self.spec, "fit", integers_as_given=True)
        # a fit goes on from the weights so far: x of another kind than they were trained on undoes them
        arraydata.check_input_kind(self._inputs, given, xa, "fit", otherwise="build a new Model to train on x of "
                                   "this kind")
        self._fit_inputs = arraydata.input_kind(given, xa, self.spec)  # the model's once an epoch of it is kept
        arraydata.warn_unscaled(self._fit_inputs, self._inputs)  # a first fit on pixels 0…255 is said
        if validation_data is not None:
            arraydata.check_pair(validation_data, "validation_data")
            val_x = self._check_x(validation_data[0], "validation_data", self._fit_inputs)
        if batch_size > len(xa):
            raise DataError(f"batch_size {batch_size}{default} is larger than the {len(xa)} rows of x; expected at "
                            f"most {len(xa)}")
        xa, ya = self._check_xy(xa, y, "fit", x_checked=True)
        val = None
        if validation_data is not None:  # checked whole here, so a bad one is refused before any step
            val = self._check_xy(val_x, validation_data[1], "validation_data", scored=True, x_checked=True)
        return ArrayData(self.spec, self._label_kind(), (xa, ya), val), batch_size

    def _label_kind(self) -> str:
        return label_kind(self.spec, self.variant)

    @checked_keywords
    @one_at_a_time("model")
    @own_callbacks
    @kept_while()
    def fit(self, x: Any = None, y: Any = None, *, epochs: int = 1, batch_size: int | None = None,
            validation_data: tuple[Any, Any] | None = None, callbacks: Iterable[Callback] = (),
            shuffle: bool = True, drop_last: bool = True, verbose: bool = True, data: str | None = None,
            data_options: Mapping[str, Any] | None = None) -> History:
        """Train `epochs` passes; returns the history (also `self.history`, over all fits). Only x, y go by position.

        On arrays `fit(x, y)` (`batch_size` default 32); on an iterable of (x, y) batches `fit(batches)` (the batch
        size its first batch's; a list or generator read once, a re-iterable such as a DataLoader each epoch); on a
        registered dataset `fit("digits")` or `fit(data="digits")` (its options a `data_options` mapping; batch default
        32; scored each epoch on its test split as val_*). `validation_data`: (x, y) arrays scored each epoch as val_*;
        `callbacks`: hf.Callback instances run in the loop; `verbose=False`: no progress bar or lines. Every epoch is
        `hloforge train`'s loop (hloforge.train.trainer.Run.loop): the rows in the order it draws them (a permutation
        from (seed, epoch); `shuffle=False`: as given), `len(x) // batch_size` steps — a ragged last batch is dropped
        (`drop_last`, the only mode) and said once, never padded into the gradient. The schedule runs over this call's
        steps. Every array is checked whole before the first step."""
        epochs = plain(epochs)
        for flag, on in (("shuffle", shuffle), ("drop_last", drop_last), ("verbose", verbose)):
            arraydata.checked_flag(flag, on)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise UnsupportedSpec(f"epochs must be an integer ≥ 1, got {epochs!r}")
        if not drop_last:
            raise UnsupportedSpec("drop_last=False would train on a ragged last batch's padding; only True is taken")
        callbacks = checked_callbacks(callbacks)
        every_rank: list[Callback] = []  # the fit's own, on every rank under MPI, after _Keep
        x, data = arraydata.dataset_named(x, data, data_options, "fit")
        if data is not None:
            if x is not None or y is not None or validation_data is not None:
                raise UnsupportedSpec("fit(data=NAME) trains on the dataset's train split and scores its test split; "
                                      "pass no x, y or validation_data with it")
            batch = checked_batch_size(batch_size, 32)
            arraydata.check_dataset_kind(self._inputs, data, self.spec, "fit on", "build a new Model to train on it")
            self._fit_inputs = arraydata.dataset_inputs(data, self.spec)
            run = self._run(data, batch, epochs, shuffle, verbose, data_options)
            arraydata.check_names(run, self._named, lambda: self._data_fit_on(data, batch), "fit")
        else:
            if x is None:
                raise DataError("fit takes arrays x and y, an iterable of (x, y) batches or a dataset name; got none")
            arraydata.refuse_ddpm_arrays(self.spec, "fit")
            if validation_data is None:  # else the monitor would find no val_* after the first epoch's training
                for cb in callbacks:
                    if isinstance(cb, Monitor) and cb.monitor.startswith("val_"):
                        raise UnsupportedSpec(f"{type(cb).__name__} monitors {cb.monitor!r}, but fit has no "
                                              "validation_data to score val_* on; pass validation_data=(x, y) "
                                              "or monitor 'loss'")
            arrays, batch = self._arrays(x, y, validation_data, batch_size)
            run = self._run(arrays, batch, epochs, shuffle, verbose)
            if y is None and arraydata.passes_again(x) and run.data is arrays:  # (not a task's targets in their place)
                every_rank.append(_ReadEachEpoch(self, run, arrays, x))
            n = arrays.n
            if verbose and n % batch and run.world.is_root:
                print(f"hloforge: {n % batch} of {n} rows do not fill a batch of {batch}; each epoch "
                      f"trains on {n // batch * batch} of them (drop_last)", file=sys.stderr)
        run.origin, run.end_epoch, run.eval_prefix = (self._epoch, self._step), self._epoch + epochs, "val_"
        # Under MPI every rank trains and keeps the weights (_Keep); the callbacks are rank 0's alone, and a
        # stop one of them decides reaches every rank (Run._epoch_end).
        mine = callbacks if run.world.is_root else []
        for cb in callbacks:
            cb.model = self
        run.check_callbacks(mine)  # before the compile: a callback's wrong option costs none
        session, evaluator = self._session(batch, spread=True), self._forward(batch)
        self._live = session  # the session this fit's epochs run on (_kept reads its step)
        self._batch = batch
        run.running = [r.copy() for r in self._running]
        if self._shadow_running is not None:
            run.shadow_running = [r.copy() for r in self._shadow_running]
        if run.world.size > 1:  # the ranks average ∂θ, never θ: a rank starting from other weights stays apart for good
            run.world.agree("model state", {"weights": _digest([*self._params, *self._opt_state, *self._running]),
                                            "step": self._step}, "make the Model alike on every rank (one seed, the "
                            "same weights loaded) before its fit")
        history = History()
        self.stop_training = False
        self._fitting = (run, session, threading.get_ident())
        try:
            run.loop(session, evaluator, self._epoch, [_Keep(self, run, history), *every_rank, *mine], owner=self)
        finally:
            self._fitting = None
        run.world.finalize()
        return history

    def _kept(self, run: Any, epoch: int, host: tuple[list[str], list[np.ndarray]]) -> None:
        """An epoch's end state (the loop's host copy, checked finite) as this model's."""
        tensors = host[1]
        n, m = len(self._param_slots), len(self._stat_names)
        k = len(run.state_layout.slots) * (n - len(run.frozen))  # each state slot holds the trained θ's alone
        with _HOST_STATE:  # another thread's read (_now, a copy) sees one epoch's θ, statistics and step, never a mix
            self._params, self._opt_state, self._running = tensors[:n], tensors[n:n + k], tensors[n + k:n + k + m]
            if run.state_layout.shadows:
                self._shadow_running = tensors[n + k + m:]
            self._epoch, self._step = epoch, self._live.step
        # weights trained on it now: a registered dataset's name (with its options), or ARRAYS
        self._data, self._data_options, self._inputs = run.cfg.data, run.cfg.data_options, self._fit_inputs
        self._eval_set, self._named = run.eval_set, run.named

    def plot(self, path: str = "curves.png") -> str:
        """This model's curves over `self.history` (loss, and the validation metric) as a PNG at `path`; returns it."""
        from hloforge.train import curves

        return curves.write_plot(checked_path(path, "plot"), list(self.history), self.spec.name)

    # ------------------------------------------------------------------ scoring
    @checked_keywords
    @kept_while()
    def predict(self, x: Any, batch_size: int | None = None, *, region: str = DEFAULT_REGION) -> np.ndarray:
        """Eval-mode logits of every row of x (a short last batch padded, its padding dropped), by `region`'s weights
        as `evaluate`'s, in batches of `batch_size` (default: the last fit's or loaded run's, else 32)."""
        buffers = self._region_buffers(region)
        xa = self._check_x(x, "predict", self._inputs)
        return self._forward(self._scoring_batch(batch_size, len(xa))).logits(xa, buffers)

    def _scoring_batch(self, batch_size: Any, rows: int) -> int:
        """The forward's batch: the last fit's, or `batch_size` cut to the power of two that holds the rows (10**6 for 5
        rows would take gigabytes; a power of two, so varying row counts share a few compiled forwards)."""
        batch = checked_batch_size(batch_size, self._batch)
        return batch if batch_size is None else min(batch, 1 << (rows - 1).bit_length())

    @checked_keywords
    @kept_while()
    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, *, data: str | None = None,
                 data_options: Mapping[str, Any] | None = None, region: str = DEFAULT_REGION) -> dict[str, Any]:
        """The task's own scores, as `hloforge train` scores an epoch (its Task's evaluation), on
        every row (the short last batch included): a classifier's top1 (a fraction), its 95% Wilson
        interval top1_lo / top1_hi, top5 (of more than 5 classes), the mean cross-entropy `loss`, `correct`, `n`; a
        segmenter's miou, pixel_acc, iou/*, dice/*; a DDPM's noise_mse; a language model's
        bits_per_char. On arrays (x, y), or a registered dataset's test split (`evaluate("shapes")`
        or `data=`, its `data_options`; a detector's mAP@0.5 scores its boxes: map50, ap50/*). `region`: the weights
        `hloforge eval --region` scores: "live" (θ with the running BN statistics), "ema" (the EMA shadow with its
        own), "auto" (the default: the shadow when the variant keeps one, else θ). `batch_size` as predict's."""
        from hloforge.train.evaluation import evaluate_lm

        batch = checked_batch_size(batch_size, self._batch)
        buffers = self._region_buffers(region)
        x, data = arraydata.dataset_named(x, data, data_options, "evaluate")
        if data is not None:
            if x is not None or y is not None:
                raise UnsupportedSpec("evaluate(data=NAME) scores the dataset's test split; pass no x or y with it")
            arraydata.check_dataset_kind(self._inputs, data, self.spec, "evaluate on", "score it on x of its own kind")
            if data_options is None and data == self._data:  # as it trained on it: the split `hloforge eval` scores
                run = arraydata.own_dataset_run(lambda opts: self._run(data, batch, data_options=opts, eval_only=True),
                                                data, self._data_options, self._eval_set)
            else:
                run = self._run(data, batch, data_options=data_options, eval_only=True)
                arraydata.check_names(run, self._named, lambda: self._data_fit_on(data, batch), "evaluate")
        else:
            arraydata.refuse_ddpm_arrays(self.spec, "evaluate")
            xa, ya = self._check_xy(x, y, "evaluate", scored=True, trained=self._inputs)
            run = self._run(ArrayData(self.spec, self._label_kind(), None, (xa, ya)), batch, eval_only=True)
        forward = self._forward(self._scoring_batch(batch_size, max(len(run.y_te), 1)))
        if run.lm:
            res = evaluate_lm(forward, buffers, run.x_te, run.y_te)
            return {"bits_per_char": res.bits_per_char, "n": res.n}
        ev = run.task.evaluate(forward, buffers)
        return {**ev.metrics, **({"loss": ev.loss} if ev.loss is not None else {})}

    # ------------------------------------------------------------------ named tensors
    @property
    def params(self) -> dict[str, np.ndarray]:
        """θ by the names checkpoints use (`0.w`, `1.b`, ...), in their declared layouts; copies, whose item
        assignment (`model.params["0.w"] = w`) sets the model's too."""
        return ckpt.NamedTensors(self, "params", zip((n for n, _ in self._param_slots), self._now()[0], strict=True))

    @params.setter
    def params(self, new: Mapping[str, Any]) -> None:
        """θ assigned by name; an EMA shadow restarts at it (with the live BN statistics), as a new model's
        starts at its initialisation: `evaluate` scores the shadow, which is of the weights before."""
        self._adopt_live()
        last = self._param_slots[-1][0].split(".")[0] if self._param_slots else None  # the head's layer
        head = [n for n, _ in self._param_slots if n.split(".")[0] == last]
        self._params = ckpt.assigned(new, [(n, s.shape) for n, s in self._param_slots], "params", self._params, head)
        if self._opt_state is not None and self._state_layout.shadows:
            trained = [p for i, p in enumerate(self._params) if i not in self._frozen()]
            self._opt_state = self._state_layout.shadow_restarted(self._opt_state, trained)
            self._shadow_running = [r.copy() for r in self._running]
        self._push_live()

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The optimizer state (`m/0.w`, ...; an EMA shadow's `E/0.w`), the BN running statistics
        (`stat/1.mean`, ...) and the shadow's (`stat/E/1.mean`)."""
        return ckpt.NamedTensors(self, "state", zip(self._state_names(), self._state_tensors(), strict=True))

    @state.setter
    def state(self, new: Mapping[str, Any]) -> None:
        self._adopt_live()
        cur = self._state_tensors()
        got = ckpt.assigned(new, [(n, a.shape) for n, a in zip(self._state_names(), cur, strict=True)], "state", cur)
        k, m = len(cur) - len(self._running) - len(self._shadow_stats()), len(self._running)
        check_stats(self.spec.stats() * (1 + int(self._state_layout.shadows)), got[k:], "state")  # the shadow's too
        self._opt_state, self._running = got[:k], got[k:k + m]
        if self._state_layout.shadows:
            # A shadow that is θ itself (a new model's, or restarted by `params`) takes the assigned live statistics
            # unless its own (stat/E/…) are given: else `evaluate`, which scores it, used stale ones.
            theta = dict(zip((n for n, _ in self._param_slots), self._params, strict=True))
            at_theta = all(np.array_equal(a, theta[n.removeprefix(f"{SHADOW}/")])
                           for n, a in zip(self._state_names()[:k], got[:k], strict=True) if n.startswith(f"{SHADOW}/"))
            own_stats = any(str(n).startswith(f"{ckpt.SHADOW_STATS}/") for n in new)
            self._shadow_running = [r.copy() for r in self._running] if at_theta and not own_stats else got[k + m:]
        self._push_live()

    def _here(self) -> Any:
        """The running fit's (Run, session) on its own thread, where a callback's reads and writes go; None elsewhere:
        another thread reads the model as the fit's last epoch left it (the session's θ is donated each step)."""
        f = self._fitting
        return f[:2] if f is not None and f[2] == threading.get_ident() else None

    def _now(self) -> tuple[list[np.ndarray], list[np.ndarray] | None, list[np.ndarray], list[np.ndarray] | None]:
        """(θ, optimizer state, BN statistics, the shadow's): the model's; during a fit (a callback) its session's."""
        if (here := self._here()) is None:
            with _HOST_STATE:
                return self._params, self._opt_state, self._running, self._shadow_running
        run, s = here
        return (s.read_params(), s.read_state(), [r.copy() for r in run.running],
                [r.copy() for r in run.shadow_running] if self._state_layout.shadows else None)

    def _adopt_live(self) -> None:
        """Before a callback's assignment during a fit: the session's state becomes the model's (the rest goes on)."""
        if self._fitting is None:
            return
        if (here := self._here()) is None:  # the fit's next epoch end would overwrite what is assigned here
            raise UnsupportedSpec("params / state assigned from another thread while this model fits; assign them "
                                  "from a callback of the fit, or before or after it")
        if here[0].world.size > 1:  # callbacks run on rank 0 alone
            raise UnsupportedSpec("params / state assigned by a callback during an MPI fit would change rank 0's "
                                  "weights alone; assign them before or after fit")
        (self._params, self._opt_state, self._running, self._shadow_running) = self._now()
        self._step = here[1].step

    def _push_live(self) -> None:
        """After an assignment during a fit: the session and the loop train on from the assigned tensors."""
        if (here := self._here()) is not None:
            run, s = here
            s.load(self._params, self._opt_state, s.step)
            run.running = [r.copy() for r in self._running]
            run.shadow_running = [r.copy() for r in self._shadow_running or []]  # [] without a shadow, as Run has

    def _shadow_stats(self) -> list[np.ndarray]:
        if not self._state_layout.shadows:
            return []
        return self._shadow_running or [s.initial() for _, s in self.spec.stats()]

    def _state_tensors(self) -> list[np.ndarray]:
        _, opt, running, shadow = self._now()
        return [*(self._initial_state() if opt is None else opt), *running,
                *(self._shadow_stats() if shadow is None else shadow)]

    def _state_names(self) -> list[str]:
        """The checkpoint's names of `_state_tensors` (ckpt.tensor_names, less the θ group)."""
        names = [n for n, _ in self._param_slots]
        full = ckpt.tensor_names(names, self._state_layout.slots, self._stat_names,
                                 shadow_stats=self._state_layout.shadows, trained=self._trained_names())
        return [t.removeprefix(f"{ckpt.STATE}/") for t in full[len(names):]]

    def _checkpoint_tensors(self) -> dict[str, np.ndarray]:
        """Every tensor by its checkpoint name (ckpt.tensor_names): what `save` writes."""
        names = ckpt.tensor_names([n for n, _ in self._param_slots], self._state_layout.slots, self._stat_names,
                                  shadow_stats=self._state_layout.shadows, trained=self._trained_names())
        return dict(zip(names, [*self._now()[0], *self._state_tensors()], strict=True))

    def _region_buffers(self, region: str) -> list[np.ndarray]:
        """θ and the BN statistics of `region` as the forward takes them: ckpt.region_weights, the meaning
        `hloforge eval --region` has. The live weights are read as they are, without gathering every tensor
        (a model not yet fit would make its optimizer's whole initial state for it)."""
        whose, shadows = f"model {self.spec.name!r}", self._state_layout.shadows
        if ckpt.resolved_region(region, shadows, whose, self.variant.slug, "region='live'") == "live":
            params, _, running, _ = self._now()
            return [*params, *running]
        names = [n for n, _ in self._param_slots]
        _, theta, stats = ckpt.region_weights(self._checkpoint_tensors(), "ema", names, self._stat_names,
                                              self._frozen(), shadows, whose, self.variant.slug, "region='live'")
        return [*theta, *stats]

    def _frozen(self) -> tuple[int, ...]:
        """The positions of the θ the variant freezes: no state, and no shadow of their own."""
        return self.variant.frozen_indices([n for n, _ in self._param_slots], f"net {self.spec.name!r}")

    def _trained_names(self) -> list[str]:
        """The parameters the step updates (all but the frozen ones): each state group holds one tensor per each."""
        frozen = self._frozen()
        return [n for i, (n, _) in enumerate(self._param_slots) if i not in frozen]

    def _initial_state(self) -> list[np.ndarray]:
        trained = set(self._trained_names())
        kept = [(s, p) for (n, s), p in zip(self._param_slots, self._params, strict=True) if n in trained]
        return [np.asarray(a, np.float32) for a in
                self._state_layout.initial(self.variant.make_optimizer(default_registry()), [s for s, _ in kept],
                                           [p for _, p in kept])]

    def _data_fit_on(self, data: str, batch: int) -> Any:
        """The dataset this model last trained on, read with the options it trained with, where that is `data`
        (else None): a corpus whose vocabulary its weights read."""
        if self._data != data:
            return None
        return self._run(data, batch, eval_only=True, data_options=parse_data_options(self._data_options)).data

    def summary(self) -> str:
        """The layer table: index, kind, input → output shape, parameters; then the totals (the frozen apart)."""
        return summary_table(self.spec, self._frozen())

    def __getstate__(self) -> dict[str, Any]:
        """pickle's and deepcopy's: host state (a callback's: the step's); sessions and backend remade by name."""
        if self._here() is None:
            with _HOST_STATE:  # one epoch's θ, state and step together, a fit on another thread keeping them
                state = dict(self.__dict__)
        else:
            live = dict(zip(("_params", "_opt_state", "_running", "_shadow_running"), self._now(), strict=True))
            state = {**self.__dict__, **live, "_step": self._live.step}
        return {**state, "_sessions": {}, "_forwards": {}, "_live": None, "_fitting": None,
                "backend": self.backend.name, "history": History(self.history)}  # copy.copy's: a history of its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        check_layer_classes(state["_declared_spec"].layers, state["_declared_spec"].name)  # as Model() refuses
        self.__dict__.update(state, backend=make_backend(state["backend"]))

    def __getattr__(self, name: str) -> Any:  # only for a name Model has not: Keras's compile, PyTorch's state_dict
        raise no_method(self, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise no_method(self, "__call__")

    def __repr__(self) -> str:
        return (f"Model({self.spec.name!r}, {self.spec.param_count():,} params, {self.variant.slug}, "
                f"backend {self.backend.name}, epoch {self._epoch})")

