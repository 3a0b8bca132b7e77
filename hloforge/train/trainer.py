"""`hloforge train`: the loop, per-epoch evaluation, the run directory, checkpoints and resume.

What a run directory holds: hloforge.train.config; opening a checkpoint for the commands:
hloforge.commands.opening.

A net with per-token logits [T, vocab] is a language model: it trains with the per-token
loss `tokenCrossEntropy` on a token dataset (`text`), and each epoch is scored in bits per
character over every validation window (no bitmap; the banner prints the character-bigram
baseline of the same corpus). Everything else — run directory, checkpoints, resume — is shared.

Launched by MPI (`mpirun -np P hloforge train ...`: hloforge.train.mpi), every rank runs this loop on
its rows of each global batch; rank 0 alone writes the run directory, logs and draws the progress bar.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, HloforgeError, PluginError, UnsupportedSpec
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.core.variant import SHADOW, bn_weight, ema_decay_at
from hloforge.datasets.stream import (
    DataRef,
    Feed,
    check_rows,
    dataset_classes,
    recorded_names,
    split_labels,
    split_pair,
)
from hloforge.train import autotune, curves, finetune, fp8, mpi, rundir, tasks
from hloforge.train import checkpoint as ckpt
from hloforge.train.arraydata import ARRAYS

# the config and the evaluation helpers, re-exported: `from hloforge.train.trainer import TrainConfig, ...`
from hloforge.train.config import (  # noqa: F401
    BITMAP,
    CHECKPOINT,
    CONFIG,
    TrainConfig,
    data_path_options,
    lm_seq_len,
    load_config,
    option_items,
    parse_data_options,
)
from hloforge.train.evaluation import (  # noqa: F401
    EvalResult,
    LMEvalResult,
    evaluate,
    evaluate_lm,
    evaluate_stream,
    fit_input,
)
from hloforge.train.metrics import eval_set_id
from hloforge.train.mixing import Mixer
from hloforge.train.parallel import DataParallelTrainSession, RankShardedForward, make_forward_session
from hloforge.train.schedule import lr_at, warmup_updates
from hloforge.train.session import ForwardSession, TrainSession, make_backend, replica_devices
from hloforge.train.tasks import classes_mismatch, make_task
from hloforge.zoo import get_net


def is_lm(spec: NetSpec) -> bool:
    """A language model: its output is per-token logits [T, vocab]."""
    return len(spec.out_shape) == 2


class Run:
    """One training run: its config, data, sessions and run directory."""

    # The schedule's origin (epoch, step): `hloforge train` counts from (0, 0) even when resuming; a
    # Model's fit from its own epoch and step, the schedule over that call's epochs.
    origin: tuple[int, int] = (0, 0)

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = print, progress: bool = True,
                 resume: bool = False, eval_only: bool = False, *, spec: NetSpec | None = None, data: Any = None,
                 directory: bool = True, backend: Any = None, shuffle: bool = True):
        """`spec` / `data` (a dataset object) / `backend` in place of the ones `cfg` names (hf.Model's own
        net, arrays and backend); `directory` False: a run that writes nothing (no run directory,
        checkpoint or logs); `shuffle` False: each epoch in the split's order."""
        # The processes an MPI launcher started (one alone): --replicas counts them all (hloforge.train.mpi);
        # a Model's fit too (its session spread over them: Model._session). Scoring alone is one process's.
        self.world = mpi.world() if not eval_only else mpi.World()
        if not self.world.is_root:  # rank 0 logs and draws the progress bar; the others are quiet
            log, progress = (lambda line: None), False
        failed: HloforgeError | None = None
        try:  # the options and the net alone decide these refusals: said once, whichever ranks refuse
            cfg.check(training=not eval_only)
            if self.world.size > 1:
                cfg = attrs.evolve(cfg, replicas=mpi.global_replicas(cfg.replicas, cfg.sync_bn, self.world))
            devices = replica_devices(cfg.backend or None, cfg.replicas // self.world.size, cfg.devices)
            self.backend = backend if backend is not None else \
                make_backend(cfg.backend or None, **({"devices": devices} if devices else {}))
            cfg = attrs.evolve(cfg, backend=self.backend.name)
            self.cfg, self.log, self.progress = cfg, log, progress
            reg = default_registry()
            self.spec = spec if spec is not None else get_net(cfg.net, cfg.classes, cfg.input)
            self.lm = is_lm(self.spec)
            self.variant = cfg.variant(self.spec)
            self.spec = self.variant.apply_to(self.spec)  # dropout, drop_path, BN ε: train and eval one net
            self.mixer = (Mixer(self.spec.num_classes, self.variant.mixup, self.variant.cutmix, cfg.label_smoothing)
                          if self.variant.soft_labels else None)
            if self.mixer is not None:
                self.mixer.check_input(self.spec.input_shape)
            cfg.check_net(self.variant, self.spec, training=not eval_only)  # BN options on a BN-less net, fp8
            opts: dict[str, Any] = data_path_options(cfg, None if data is not None or cfg.data == ARRAYS
                                                     else reg.get("dataset", cfg.data))
        except (UnsupportedSpec, PluginError) as e:  # an unknown plugin name is the options' too
            failed = e
        mpi.refuse_together(self.world, failed)
        opts.update(parse_data_options(cfg.data_options))
        if self.lm:
            opts["seq_len"] = lm_seq_len(opts, self.spec, data if data is not None else reg.get("dataset", cfg.data),
                                         cfg.data)
        if data is None and cfg.data == ARRAYS:  # a Model.save of a fit on the user's arrays: nothing to read here
            raise DataError(f"run {cfg.run_dir or '?'} was trained on arrays from Python, not a registered dataset; "
                            f"continue it there (hf.load({cfg.run_dir or 'DIR'!r}).fit(x, y)), or on a dataset its net "
                            "fits (--data NAME)")
        self.data = data if data is not None else reg.make("dataset", cfg.data, **opts)
        # its class names as the run starts, in each checkpoint: an export then names them wherever the data went
        self.named = recorded_names(self.data, self.spec)
        # under workers the eval streams too: its labels here, the float split only if a consumer asks (x_te)
        x_te, self.y_te = (None, split_labels(self.data, "test")) if cfg.workers else split_pair(self.data, "test")
        if data is None:  # a registered dataset's; the user's arrays may have no test split (fit without validation)
            check_rows(self.data, "test", len(self.y_te))
        # what the loss's label kind trains: feed shape, train-step inputs, evaluation (LM: its own path)
        self.task = None if self.lm else make_task(self)
        labels = None if self.task is None else self.task.labels
        if labels is not None:  # the task's targets in place of the dataset's own labels
            self.data = labels
            self.y_te = self.data.arrays("test")[1]
        if self.lm and dataset_classes(self.data) != self.spec.num_classes:
            raise classes_mismatch(cfg.data, self.data.num_classes, cfg.net, self.spec)
        self.feed = Feed(self.data, DataRef(cfg.data, opts), batch=cfg.batch, seed=cfg.seed, workers=cfg.workers,
                         augment=cfg.augment, input_shape=self.task.feed_shape if self.task else self.spec.input_shape,
                         train=not eval_only, shuffle=shuffle)
        if data is None and not eval_only:
            check_rows(self.data, "train", self.feed.n)
            if self.task is not None:
                self.task.check_train(self.feed.y, self.feed.n)
        self._x_te = None if x_te is None else self._fit_input(x_te)
        self.eval_set = eval_set_id(cfg.data, "test", self.y_te, self._x_te)  # a streamed eval's: its labels'
        self.steps_per_epoch = self.feed.steps_per_epoch
        try:  # the options and the split's size decide these, so every rank refuses alike: said once
            cfg.check_steps(self.variant.accum, self.steps_per_epoch, self.feed.n, training=not eval_only)
        except HloforgeError as e:
            raise mpi.shared(e, self.world) from None
        self.dir = cfg.resolved_run_dir(self.spec, resume) if directory else None
        self.end_epoch = cfg.epochs
        self.eval_prefix = ""  # "val_": a Model's history names its validation scores so
        self.stop_training = False  # set by a callback: the loop ends after this epoch
        self.kept: tuple[int, tuple[list[str], list[np.ndarray]]] | None = None  # (epoch, host state) last kept
        self.stat_names = [n for n, _ in self.spec.stats()]
        self.running = [s.initial() for _, s in self.spec.stats()]
        self.state_layout = self.variant.state_layout(self.variant.make_optimizer(reg))
        self.frozen = self.variant.frozen_indices([n for n, _ in self.spec.params()], f"net {self.spec.name!r}")
        # The EMA shadow's BN statistics (seed 003's ema_bn): the running statistics averaged with the
        # shadow's decay at the shadow's cadence, from the same start, so the shadow is scored with
        # statistics that lag as its weights do (timm's ModelEma averages the BN buffers the same way).
        self.shadow_running = [r.copy() for r in self.running] if self.state_layout.shadows else []

    def _fit_input(self, x: np.ndarray) -> np.ndarray:
        return self.task.fit_input(x) if self.task else fit_input(x, self.spec, self.cfg.data, self.cfg.net)

    @property
    def x_te(self) -> np.ndarray:
        """The eval split's inputs shaped for the net, in memory. A run that streams its eval (workers > 0)
        never needs them; they load on first use, for the consumers that need random access (cam)."""
        if self._x_te is None:
            self._x_te = self._fit_input(split_pair(self.data, "test")[0])
        return self._x_te

    # ------------------------------------------------------------------ checkpoints
    @property
    def ckpt_path(self) -> str:
        assert self.dir is not None, "a run without a directory has no checkpoint"
        return os.path.join(self.dir, CHECKPOINT)

    def meta(self, epoch: int, step: int) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "variant": attrs.asdict(self.variant), "backend": self.cfg.backend,
                "epoch": epoch, "step": step, "seed": self.cfg.seed, "config": attrs.asdict(self.cfg),
                "eval_set": self.eval_set, **self.named}

    def save(self, session: TrainSession, epoch: int,
             host: tuple[list[str], list[np.ndarray]] | None = None) -> None:
        names, tensors = host or self.host_state(session)
        ckpt.save_checkpoint(self.ckpt_path, names, tensors, self.meta(epoch, session.step))

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files: a run with a directory, on rank 0 (the one writer)."""
        return self.dir is not None and self.world.is_root

    @property
    def last_good(self) -> str:
        """What an error that stops the run says is left: the last good checkpoint, or (no directory,
        a Model's fit) the weights of the last epoch, which the Model keeps."""
        if self.dir is None:
            return "The weights kept are those after the last epoch"
        return f"The last good checkpoint is {self.ckpt_path if os.path.exists(self.ckpt_path) else 'none'}"

    def copy_to(self, path: str) -> None:
        """This run's directory as it now is, copied to `path` (ModelCheckpoint's best epoch): rundir.copy_run."""
        rundir.copy_run(os.path.dirname(self.ckpt_path), path)

    def holds_copy(self, path: str) -> bool:
        """Whether `path` holds a copy_to of an epoch this run has reached (rundir.holds_copy)."""
        return self.dir is not None and rundir.holds_copy(self.ckpt_path, path)

    def logged_metrics(self) -> frozenset[str] | None:
        """The keys of every epoch's metrics as the callbacks get them ("kind" aside: no number), known
        before the first step, so a callback monitoring another is refused then, not after an epoch; None
        where the task's scores are not known ahead."""
        base = {"epoch", "step", "loss", "lr", "seconds"}
        scored = len(self.y_te) > 0
        if self.lm:  # _lm_epoch's
            return frozenset({*base, "tokens_per_s", *(("val_bits_per_char", "n") if scored else ())})
        base.add("images_per_s")
        assert self.task is not None
        scores = self.task.metric_names() if scored else set()
        if scores is None:
            return None
        p = self.eval_prefix
        keys = base | {p + k for k in scores}
        if p and scores and type(self.task) is tasks.ClassificationTask:  # the one Evaluation with a loss
            keys.add(f"{p}loss")
        if scores and self.variant.ema:  # as loop scores the shadow
            keys |= {p + k for k in self.task.ema_metrics(tasks.Evaluation(dict.fromkeys(scores, 0.0), ""))}
        return frozenset(keys)

    def check_callbacks(self, callbacks: Sequence[Any]) -> None:
        """Each callback's `check_begin`, then its options against the metrics this run logs (its
        `check_metrics`, with the keys the callbacks before it add: their `adds_metrics`), refused on every
        rank alike: under a fit, rank 0 alone holds the callbacks."""
        keys, failed, world = self.logged_metrics(), None, self.world
        try:
            for cb in callbacks:  # what a callback cannot do whatever the metrics (a path it would write over)
                getattr(cb, "check_begin", lambda: None)()
            if keys is not None:
                for cb in callbacks:
                    check = getattr(cb, "check_metrics", None)
                    if check is not None:
                        check(keys)
                    keys |= frozenset(getattr(cb, "adds_metrics", ()))
        except HloforgeError as e:
            failed = e
        if world.size > 1:
            said = world.bcast("" if failed is None else str(failed), "the callbacks' check")
            if said:  # else a refusal of this rank's own (an every_rank callback's), raised as it is
                same = failed is not None and str(failed) == said
                failed = mpi.shared(failed if same and failed is not None else UnsupportedSpec(said), world)
        if failed is not None:
            raise failed

    def host_state(self, session: TrainSession) -> tuple[list[str], list[np.ndarray]]:
        """What a checkpoint holds (names, tensors), copied to the host once an epoch and refused if
        not finite. Each step's loss is checked as it is read; an update that turns θ to NaN on an
        epoch's last step has a finite loss, and its θ would be scored and checkpointed over the last
        good one."""
        lay = session.layout
        names = ckpt.tensor_names([n for n, _ in lay.params], lay.state, self.stat_names,
                                  shadow_stats=self.state_layout.shadows, trained=lay.trained_names)
        tensors = session.read_params() + session.read_state() + self.running + self.shadow_running
        bad = next((n for n, t in zip(names, tensors, strict=True) if not np.isfinite(t).all()), None)
        if bad is not None:
            raise mpi.PeerError(f"{bad} is not finite after step {session.step} (its loss was); stopped. "
                                f"{self.last_good}", quiet=not self.world.is_root)
        return names, tensors

    def expected_tensors(self) -> tuple[dict[str, tuple[int, ...]], list[str], list[str]]:
        """Every tensor this run's checkpoint holds, name -> shape, the optional ones and the variances."""
        return ckpt.expected_tensors([(n, s.shape) for n, s in self.spec.params()], self.state_layout.slots,
                                     self.spec.stats(), self.state_layout.shadows, self.frozen)

    def restore(self, session: TrainSession, cross_backend: bool = False) -> int:
        """Load the run's checkpoint into the session; returns the epoch it ended."""
        tensors, meta = ckpt.load_checkpoint(self.ckpt_path)
        rundir.check_matches(self.ckpt_path, meta, self.spec, self.variant, self.cfg.backend, cross_backend)
        session.state_layout.check_slots(f"checkpoint {self.ckpt_path}", list(tensors))
        rundir.check_same_data(self.ckpt_path, meta, self.cfg.data, self.eval_set)
        rundir.check_steps(self.ckpt_path, meta, self.steps_per_epoch, self.cfg, self.feed.n)
        ckpt.check_tensors(self.ckpt_path, tensors, *self.expected_tensors())
        lay = session.layout
        pn = [n for n, _ in lay.params]
        try:
            params = [tensors[t] for t in ckpt.names_in(ckpt.PARAMS, pn)]
            state = [tensors[t] for k in lay.state for t in ckpt.names_in(ckpt.state_group(k), lay.trained_names)]
            self.running = [tensors[t] for t in ckpt.names_in(ckpt.STATS, self.stat_names)]
        except KeyError as e:
            raise DataError(f"checkpoint {self.ckpt_path} lacks tensor {e.args[0]}; it is not of this net") from None
        if self.state_layout.shadows:
            self.shadow_running = ckpt.shadow_stats(tensors, self.stat_names, f"checkpoint {self.ckpt_path}",
                                                    "resuming would restart them; start a new run")
        session.load(params, state, meta["step"])
        return int(meta["epoch"])

    def _share_restored(self, session: TrainSession, start: int) -> int:
        """Under MPI: rank 0's state (θ, optimizer state, step, running statistics), restored or as drawn, on every
        rank, so no other rank reads the run directory; returns the epoch rank 0's checkpoint ended (0: a new run)."""
        w = self.world
        if w.size == 1:
            return start
        got = w.bcast((*session.read_all(), session.step, self.running, self.shadow_running, start) if w.is_root
                      else None, "the restored checkpoint", slow=True)
        params, state, step, self.running, self.shadow_running, start = got
        if not w.is_root:
            session.load(params, state, step)
        return int(start)

    # ------------------------------------------------------------------ the loop
    def step(self, session: TrainSession, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One micro-batch: mixed into soft targets on the host when the variant mixes, through the
        E4M3 weights and input when its precision is fp8."""
        if self.task is not None:
            x, y = self.task.train_batch(x, y, session.step + 1)
        if self.mixer is not None:
            x, y = self.mixer.mix(x, y, self.cfg.seed, session.step + 1)
        if self.variant.precision == "fp8":
            return fp8.fp8_train_step(session, x, y, lr)
        return session.train_step(x, y, lr)

    def _track_shadow_stats(self, micro_step: int) -> None:
        """After 1-based micro-batch `micro_step` has moved the running statistics: when it applied an
        update (so the shadow moved too), move the shadow's statistics toward them with the shadow's
        decay for that update, min(d, (1 + t)/(10 + t))."""
        lay = self.state_layout
        if not self.shadow_running or not lay.applies(micro_step):
            return
        d = ema_decay_at(lay.ema, lay.update_index(micro_step))
        self.shadow_running = [e * d + r * (1.0 - d) for e, r in zip(self.shadow_running, self.running, strict=True)]

    def lr(self, step: int) -> float:
        """The learning rate of the micro-batch after `step` micro-batches: the schedule runs over
        optimizer updates, one per `accum` micro-batches."""
        c, k = self.cfg, self.variant.accum
        per_epoch = self.steps_per_epoch // k
        return lr_at((step - self.origin[1]) // k, base=c.lr, total_steps=c.epochs * per_epoch,
                     warmup_steps=warmup_updates(c.warmup_epochs, per_epoch), schedule=c.schedule,
                     decay_rate=c.decay_rate, steps_per_epoch=per_epoch, decay_epochs=c.decay_epochs)

    def train(self, resume: bool = False, cross_backend: bool = False, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
        """The run, holding its directory's lock throughout (rundir.locked; rank 0's, the one writer).
        `callbacks`: objects with hloforge.callbacks.Callback's hooks; they see this run as `model`."""
        assert self.dir is not None
        for cb in callbacks:
            cb.model = self
        w = self.world
        self.check_callbacks(callbacks)  # before anything is read, compiled or written
        if w.size > 1:  # every rank started alike, and writing where rank 0 says
            w.agree("config, net or data", mpi.started_as(self, resume))
            self.dir = w.bcast(self.dir, "the run directory")
        # the init weights read and matched before anything is written (resume reads the run's own checkpoint)
        init, failed = None, None
        try:
            if resume and w.is_root and not os.path.isdir(self.dir):  # said before the lock makes it
                rundir.check_resumable(self.dir, "" if self.cfg.run_dir else self.cfg.net)
            init = finetune.read_init(self, self.log) if self.cfg.init and not resume and w.is_root else None
        except HloforgeError as e:
            failed = e
        mpi.raise_roots(w, failed, "the init weights read")  # rank 0 reads them (a path the others may not see)
        init = w.bcast(init, "the init weights", slow=True) if self.cfg.init and not resume else None
        with contextlib.ExitStack() as held:  # rank 0's lock; a run dir it cannot take is refused by every rank
            taken = None
            try:
                if w.is_root:
                    held.enter_context(rundir.locked(self.dir, self.ckpt_path, resume=resume))
                    if not resume and os.path.exists(self.ckpt_path):  # before the compile
                        raise HloforgeError(f"run directory {self.dir} already holds a checkpoint; pass --resume to "
                                            "continue it, or --tag/--run-dir for a new run")
            except HloforgeError as e:
                taken = e
            mpi.raise_roots(w, taken, "the run directory's lock")
            out = self._train(resume, cross_backend, init, callbacks)
        w.finalize()
        return out

    def _train(self, resume: bool, cross_backend: bool, init: finetune.Init | None = None,
               callbacks: Sequence[Any] = ()) -> dict[str, Any]:
        assert self.dir is not None
        cfg, world = self.cfg, self.world
        if resume:  # under rank 0's lock (a run in its first epoch holds it), before the compile; every rank alike
            missing = None
            try:
                if world.is_root:
                    rundir.check_resumable(self.dir, "" if cfg.run_dir else cfg.net)
            except HloforgeError as e:
                missing = e
            mpi.raise_roots(world, missing, "the resume check", DataError)
        recorded = cfg.tuned
        if world.size > 1 and not recorded:  # rank 0 times, every rank renders its choices
            tuned = autotune.resolve(self.spec, cfg.batch // cfg.replicas, self.backend,
                                     autotune=cfg.autotune) if world.is_root else None
            recorded = world.bcast(tuned.records() if tuned is not None else (), "the tuned strategies", slow=True)
        tuning = autotune.resolve(self.spec, cfg.batch // cfg.replicas, self.backend, autotune=cfg.autotune,
                                  recorded=recorded)
        if tuning is not None:  # the config records that tuning was on and what it chose
            cfg = self.cfg = attrs.evolve(cfg, autotune=True, tuned=tuning.records())
        t0 = time.perf_counter()
        with autotune.rendering(tuning):
            session: TrainSession
            if world.size > 1:
                try:
                    session = mpi.MpiTrainSession(self.spec, self.variant, cfg.batch, self.backend, world=world,
                                                  replicas=cfg.replicas, seed=cfg.seed, sync_bn=cfg.sync_bn)
                except UnsupportedSpec as e:  # of the config every rank agreed on: every rank refuses alike
                    raise mpi.shared(e, world) from None
            elif cfg.replicas == 1:
                session = TrainSession(self.spec, self.variant, cfg.batch, self.backend, seed=cfg.seed)
            else:
                session = DataParallelTrainSession(self.spec, self.variant, cfg.batch, self.backend, seed=cfg.seed,
                                                   replicas=cfg.replicas, sync_bn=cfg.sync_bn)
            evaluator: Any = make_forward_session(self.spec, cfg.batch // cfg.replicas, self.backend,
                                                  cfg.replicas // world.size)
            if world.size > 1:  # each rank scores its slice of the split, the logits gathered
                evaluator = RankShardedForward(evaluator, world)
        world.barrier("the compile", slow=True)
        compile_s = time.perf_counter() - t0
        start = self.restore(session, cross_backend) if resume and world.is_root else 0
        # rank 0's state on every rank, a new run's too: a plugin's initialisation that differs across machines (yet
        # renders one program) gave each rank its own θ, which the averaged ∂θ never brings together
        start = self._share_restored(session, start)
        if resume and start >= cfg.epochs:
            if callbacks or world.size > 1:  # no epoch; their start on its history (every rank: its collectives)
                self.loop(session, evaluator, start, callbacks, resumed=True)  # does what a kill at the end cut
                # off (ModelCheckpoint's copy; the curves)
            undrawn = world.is_root and not os.path.exists(os.path.join(self.dir, curves.PNG))
            if undrawn and (done := self._history()):  # the end's plot, which a kill while drawn left undrawn
                self.plot(done)
            raise mpi.PeerError(f"run {self.dir} already finished: its checkpoint is at epoch {start} of "
                                f"{cfg.epochs}; raise --epochs to train further", quiet=not world.is_root)
        if init is not None:
            finetune.start_from(self, session, init)
        if world.is_root:
            ckpt.write_atomic(os.path.join(self.dir, CONFIG), cfg.to_toml().encode(), "config")
            if not resume:  # a new run: not the identity of a run stopped here before (its TensorBoard files)
                rundir.run_id(self.dir, new=True)
        used = self.steps_per_epoch * cfg.batch  # whole batches only (of each worker's shard, when streamed)
        kept = f", {used} of them an epoch in whole batches" if used < self.feed.n else ""
        self.log(f"hloforge: {self.spec.name} ({self.spec.param_count():,} params) on {cfg.data} "
                 f"({self.feed.n} train{kept} / {len(self.y_te)} test) | backend {self.backend.backend_name()}")
        if self.lm and hasattr(self.data, "bigram_bits"):
            self.log(f"  text {getattr(self.data, 'source', cfg.data)}: vocab {self.data.num_classes}, validation "
                     f"character-bigram baseline {self.data.bigram_bits():.4f} bits/char")
        dp = (f" over {cfg.replicas} replicas" + (" (sync BN)" if cfg.sync_bn else "")) if cfg.replicas > 1 else ""
        self.log(f"  {self.variant.slug}: lr {cfg.lr:g} {cfg.schedule}, batch {cfg.batch}{dp}, {cfg.epochs} epochs, "
                 f"run dir {self.dir} | compiled in {compile_s:.1f}s"
                 + (f" | resumed after epoch {start}" if resume else "")  # epoch 0: an import's
                 + (f" | from {init.path}" if init is not None else "")
                 + (f" | frozen {list(self.variant.frozen)} ({len(self.frozen)} tensors)" if self.frozen else ""))
        if tuning is not None:
            self.log(f"  {tuning.summary()}")
        return self.loop(session, evaluator, start, callbacks, t0, resumed=resume)

    def loop(self, session: TrainSession, evaluator: ForwardSession, start: int, callbacks: Sequence[Any] = (),
             t0: float | None = None, owner: Any = None, resumed: bool = False) -> dict[str, Any]:
        """The one training loop (`hloforge train` and hf.Model.fit): epochs start+1 .. end_epoch, each
        scored on the eval split (when it has rows), logged, checkpointed (when the run has a directory)
        and handed to the callbacks; `owner.stop_training` (default this run's) ends it after an epoch.
        `resumed`: the run goes on from its checkpoint, one at epoch 0 (an import's, a save's) too."""
        cfg, owner = self.cfg, self if owner is None else owner
        t0 = time.perf_counter() if t0 is None else t0
        self.check_callbacks(callbacks)  # a Model's fit's: against its val_ prefix
        w = bn_weight(cfg.bn_momentum, self.variant.accum)
        metrics: dict[str, Any] = {}
        if start and self.writes:
            rundir.rewind_metrics(self.dir, session.step)
        history = self._history() if start and self.writes else []
        mlog: Any = (open(os.path.join(self.dir, "metrics.jsonl"), "a" if start else "w", encoding="utf-8")
                     if self.writes else io.StringIO())
        # The epochs a resumed run has (Callback's doc), none when its checkpoint is at epoch 0: TensorBoard
        # still cuts what a killed run logged past it.
        begin = {"history": list(history)} if self.writes and (start or resumed) else {}
        for cb in callbacks:
            cb.on_train_begin(begin)
        if self.world.size > 1:  # a stop decided there (EarlyStopping's patience out in a resumed history): rank 0's
            owner.stop_training = self.world.bcast(owner.stop_training, "whether to stop", slow=True)
        try:
            for epoch in range(start + 1, self.end_epoch + 1):
                if owner.stop_training:
                    break
                for cb in callbacks:
                    cb.on_epoch_begin(epoch, {})
                t = time.perf_counter()
                losses = []
                bar = self._bar(epoch)
                for s, (xb, yb) in enumerate(self.feed.epoch(epoch)):
                    ckpt.mark("step", epoch, s)
                    step = session.step
                    lr = self.lr(step)
                    loss = self.step(session, xb, yb, lr)
                    if not math.isfinite(loss):  # the same loss on every rank: rank 0 says it
                        raise mpi.PeerError(
                            f"loss is {loss} at step {step + 1} (epoch {epoch}, lr {lr:g}); stopped. {self.last_good}",
                            quiet=not self.world.is_root)
                    if self.stat_names:
                        self.running = [r * (1.0 - w) + b * w for r, b in
                                        zip(self.running, session.batch_stats(), strict=True)]
                        self._track_shadow_stats(session.step)
                    losses.append(loss)
                    for cb in callbacks:
                        cb.on_step_end(session.step, {"loss": loss, "lr": lr})
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}",
                                        img_s=f"{(s + 1) * cfg.batch / (time.perf_counter() - t):.0f}")
                    if cfg.log_every and session.step % cfg.log_every == 0:
                        mlog.write(json.dumps({"kind": "step", "step": session.step, "epoch": epoch,
                                               "loss": loss, "lr": lr}) + "\n")
                if bar is not None:
                    bar.close()
                secs = time.perf_counter() - t
                host = self.host_state(session)  # before anything scores or keeps it
                self.kept = (epoch, host)
                if self.lm:
                    metrics = self._lm_epoch(evaluator, session, epoch, losses, secs, mlog, history, host)
                    self._epoch_end(epoch, metrics, callbacks, owner)
                    continue
                assert self.task is not None
                ckpt.mark("eval", epoch)
                scored = len(self.y_te) > 0  # a Model's fit without validation data scores nothing
                ev = self.task.evaluate(evaluator, self._eval_buffers(session)) if scored else None
                p = self.eval_prefix
                metrics = {"kind": "epoch", "epoch": epoch, "step": session.step, "loss": float(np.mean(losses)),
                           "lr": self.lr(session.step - 1),
                           **({f"{p}{k}": v for k, v in ev.metrics.items()} if ev is not None else {}),
                           **({f"{p}loss": ev.loss} if p and ev is not None and ev.loss is not None else {}),
                           "images_per_s": self.steps_per_epoch * cfg.batch / secs, "seconds": secs}
                ema_line = ""
                if scored and self.variant.ema:
                    # The shadow, found through the state layout (never a literal region), with its own BN stats.
                    ev_ema = self.task.evaluate(evaluator, self._eval_buffers(session, shadow=True))
                    metrics.update({f"{p}{k}": v for k, v in self.task.ema_metrics(ev_ema).items()})
                    ema_line = f"  ema {ev_ema.line.removeprefix('test ')}"
                ckpt.mark("logs", epoch)
                mlog.write(json.dumps(metrics) + "\n")
                mlog.flush()
                history.append(metrics)
                if self.writes:
                    if ev is not None and ev.correct is not None:
                        rundir.save_npz(os.path.join(self.dir, BITMAP), correct=ev.correct,
                                        set_id=self.meta(0, 0)["eval_set"], epoch=epoch)
                    self.save(session, epoch, host)
                line = "" if ev is None else ev.line if not p else f"val {ev.line.removeprefix('test ')}"
                self.log("  ".join(part for part in (f"epoch {epoch}/{self.end_epoch}", f"loss {metrics['loss']:.4f}",
                                                     f"{line}{ema_line}", f"{metrics['images_per_s']:.0f} img/s")
                                   if part))
                self.world.barrier(f"epoch {epoch}'s checkpoint", slow=True)  # the others wait out rank 0's writes
                self._epoch_end(epoch, metrics, callbacks, owner)
        finally:
            mlog.close()
            for cb in callbacks:
                cb.on_train_end(metrics)
        if self.writes and history:
            self.plot(history)  # once, at the end: `hloforge plot RUN` redraws it on demand
        metrics["wall_s"] = time.perf_counter() - t0
        return metrics

    def _epoch_end(self, epoch: int, metrics: dict[str, Any], callbacks: Sequence[Any], owner: Any = None) -> None:
        """The callbacks and the epoch-end hook, on rank 0 (the one writer; a callback with `every_rank`
        on every rank); a stop it decides (`owner.stop_training`, default this run's), every rank's."""
        owner = self if owner is None else owner
        for cb in callbacks:
            if self.world.is_root or getattr(cb, "every_rank", False):
                cb.on_epoch_end(epoch, metrics)
        if self.world.is_root:
            default_registry().pm.hook.hloforge_on_epoch_end(run=self, epoch=epoch, metrics=metrics)
        if self.world.size > 1:
            owner.stop_training = self.world.bcast(owner.stop_training, "whether to stop", slow=True)

    def _lm_epoch(self, evaluator: ForwardSession, session: TrainSession, epoch: int, losses: list[float],
                  secs: float, mlog: Any, history: list[dict[str, Any]],
                  host: tuple[list[str], list[np.ndarray]]) -> dict[str, Any]:
        """A language model's epoch end: bits/char on every validation window, log, checkpoint, plot."""
        cfg = self.cfg
        res = evaluate_lm(evaluator, self._eval_buffers(session), self.x_te, self.y_te) if len(self.y_te) else None
        metrics: dict[str, Any] = {
                   "kind": "epoch", "epoch": epoch, "step": session.step, "loss": float(np.mean(losses)),
                   "lr": self.lr(session.step - 1),
                   **({"val_bits_per_char": res.bits_per_char, "n": res.n} if res is not None else {}),
                   "tokens_per_s": self.steps_per_epoch * cfg.batch * self.spec.input_shape[0] / secs,
                   "seconds": secs}
        mlog.write(json.dumps(metrics) + "\n")
        mlog.flush()
        history.append(metrics)
        if self.writes:
            self.save(session, epoch, host)
        self.log(f"epoch {epoch}/{self.end_epoch}  loss {metrics['loss']:.4f} ({metrics['loss'] / math.log(2):.4f} "
                 f"bits/char)  {'val ' + res.line() if res is not None else ''}  {metrics['tokens_per_s']:.0f} tok/s")
        self.world.barrier(f"epoch {epoch}'s checkpoint", slow=True)
        return metrics

    def _eval_buffers(self, session: TrainSession, shadow: bool = False) -> list[Any]:
        """θ (`shadow`: the EMA shadow) and its BN statistics as the evaluator takes them."""
        running = self.shadow_running if shadow else self.running
        if isinstance(session, DataParallelTrainSession) and session.replicas > 1:  # each replica: its own copy
            thetas = session.replica_slot_buffers(SHADOW) if shadow else session.replica_params()
            return [[*theta, *(self.backend.to_device(s, device=r) for s in running)] for r, theta in enumerate(thetas)]
        theta = session.slot_buffers(SHADOW) if shadow else session.params
        return [*theta, *(self.backend.to_device(r) for r in running)]

    def _bar(self, epoch: int) -> Any:
        if not self.progress or sys.stderr is None:  # None: started without one (`python fit.py 2>&-`)
            return None
        from tqdm.auto import tqdm  # a notebook's widget, a terminal's bar

        tqdm.get_lock()  # made on tqdm's own class, so that every epoch's Bar writes under the one lock, as before
        bar = type("Bar", (tqdm,), {"monitor_interval": 0})  # no monitor: one left running for good, the bar off or not
        return bar(total=self.steps_per_epoch, desc=f"epoch {epoch}/{self.end_epoch}", leave=False,
                   file=sys.stderr, dynamic_ncols=True, disable=None)  # None: off when not a terminal

    def _history(self) -> list[dict[str, Any]]:
        return curves.history(self.dir) if self.dir is not None else []

    def plot(self, history: list[dict[str, Any]]) -> None:
        """curves.png in the run directory: the loss and the task's metric over the epochs."""
        assert self.dir is not None
        ckpt.write_atomic(os.path.join(self.dir, curves.PNG), curves.draw(history, self.spec.name), "plot")


def train(cfg: TrainConfig, *, resume: bool = False, cross_backend: bool = False, spec: NetSpec | None = None,
          log: Callable[[str], None] = print, progress: bool = True, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train per `cfg` (`spec`: its net, where not the one cfg names); `resume` continues the run directory's checkpoint
    (a spec file's net as it holds it), `cross_backend` lets it be another backend's; `callbacks` see the Run."""
    failed = None
    try:  # the data each rank reads itself (a file missing on every machine, or on one): met, said once
        run = Run(cfg, log, progress, resume, spec=spec or rundir.resumed_spec(cfg, resume))
    except HloforgeError as e:
        if getattr(e, "together", None) is not None or not mpi.world_made():  # already met, or never could
            raise
        failed = e
    mpi.refuse_together(mpi.world(), failed, "the data read", "every rank reads its own copy of the data")
    return run.train(resume=resume, cross_backend=cross_backend, callbacks=mpi.on_rank(run.world, callbacks))
