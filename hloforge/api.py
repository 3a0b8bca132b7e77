"""The framework API: `hf.Model(net).fit(x, y)` on numpy arrays, `evaluate`, `predict`, named
`params` / `state`, `save` to a run directory `hloforge eval` reads, `hf.load` back, `summary()`.

A thin layer over the engine: one TrainSession per batch size (the batch is fixed at compile time),
the trainer's learning-rate schedules, its evaluation statistics (hloforge.train.metrics) and its
checkpoint and config writers. The authoritative state between calls is on the host (θ, the
optimizer state, the BN running statistics and the step count); `fit` loads it into the session
and reads it back at the end of every epoch.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.callbacks import Callback
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.datasets.augment import step_rng
from hloforge.train import checkpoint as ckpt
from hloforge.train.metrics import eval_set_id, topk_correct, wilson
from hloforge.train.schedule import SCHEDULES, lr_at
from hloforge.train.session import ForwardSession, TrainSession, checked_labels, finite_inputs, make_backend

CHECKPOINT = "checkpoint.safetensors"  # the name `hloforge train` gives it (trainer.CHECKPOINT)
CONFIG = "config.toml"
NET_FILE = "net.json"  # a NetSpec the zoo does not name, written next to the checkpoint so `eval` rebuilds it
# Variant fields this first slice of the API does not drive yet (`hloforge train` does).
NOT_YET = {"ema": 0.0, "accum": 1, "mixup": 0.0, "cutmix": 0.0, "precision": "fp32", "frozen": ()}


class History(list):  # type: ignore[type-arg]
    """One dict of metrics per epoch (loss, lr, seconds; val_* with validation_data)."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):  # history["val_top1"]: that metric over the epochs
            return [h[key] for h in self]
        return super().__getitem__(key)


def _spec_of(net: NetSpec | str, classes: int | None, input: Sequence[int] | None) -> tuple[NetSpec, str]:
    """(the net, what a config names it by: a zoo name or a spec file's path; "" for a NetSpec object)."""
    from hloforge.zoo import get_net

    if isinstance(net, NetSpec):
        if classes is not None or input is not None:
            raise UnsupportedSpec("classes / input override a zoo net's defaults; a NetSpec states its own")
        net.walk()  # refuse an impossible net here, naming the layer
        return net, ""
    if not isinstance(net, str):
        raise UnsupportedSpec(f"net must be a NetSpec, a zoo name or a spec file path, got {type(net).__name__}")
    spec = get_net(net, classes, input)
    return spec, (os.path.abspath(net) if net.endswith((".toml", ".json")) else net)


def _rows(a: Any, what: str) -> int:
    if not hasattr(a, "__len__") or np.ndim(a) == 0:
        raise DataError(f"{what} is a {type(a).__name__}, expected an array with one row per example")
    n = len(a)
    if n == 0:
        raise DataError(f"{what} is empty (0 rows), expected at least one example")
    return n


class Model:
    """A net with its training variant, weights and optimizer state.

    `net`: a NetSpec, a zoo name (`classes` / `input` override its defaults) or a .toml/.json spec
    file. `optimizer`, `lr`, `schedule` ("cosine", "exp", "constant"), `warmup_epochs` and `seed` as
    `hloforge train` takes them; the other Variant fields (loss, weight_decay, label_smoothing,
    clip, dropout, drop_path, bn_eps) as keywords. `backend` None: $HLOFORGE_BACKEND, else xla."""

    def __init__(self, net: NetSpec | str, optimizer: str = "adam", lr: float = 1e-3, schedule: str = "cosine",
                 backend: str | None = None, seed: int = 0, *, warmup_epochs: float = 0.0, decay_rate: float = 0.97,
                 bn_momentum: float = 0.9, classes: int | None = None, input: Sequence[int] | None = None,
                 **variant_fields: Any):
        from hloforge.train.tasks import default_loss

        if not (lr > 0 and math.isfinite(lr)):
            raise UnsupportedSpec(f"lr must be a positive number, got {lr}")
        if schedule not in SCHEDULES:
            raise UnsupportedSpec(f"unknown schedule {schedule!r}; expected one of {list(SCHEDULES)}")
        known = {f.name for f in attrs.fields(Variant)} - {"optimizer"}
        unknown = sorted(set(variant_fields) - known)
        if unknown:
            raise UnsupportedSpec(f"Model takes no option(s) {unknown}; the variant's are {sorted(known)}")
        later = sorted(k for k, off in NOT_YET.items() if variant_fields.get(k, off) != off)
        if later:
            raise UnsupportedSpec(f"hf.Model does not drive {', '.join(later)} yet; `hloforge train` does")
        spec, self._net_ref = _spec_of(net, classes, input)
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
        self._param_slots = self.spec.params()
        self._stat_names = [n for n, _ in self.spec.stats()]
        self._params = self.spec.init_params(seed)
        self._opt_state: list[np.ndarray] | None = None  # None: the optimizer's initial state (made by a session)
        self._running = [s.initial() for _, s in self.spec.stats()]
        self._step, self._epoch, self._batch = 0, 0, 32
        self._data = "digits"  # the dataset a saved run directory names for `hloforge eval` (TrainConfig's default)
        self._sessions: dict[int, TrainSession] = {}
        self._forwards: dict[int, ForwardSession] = {}
        self.stop_training = False
        self.history = History()

    # ------------------------------------------------------------------ sessions
    def _session(self, batch: int) -> TrainSession:
        s = self._sessions.get(batch)
        if s is None:
            s = self._sessions[batch] = TrainSession(self.spec, self.variant, batch, self.backend, seed=self.seed,
                                                     params=self._params)
            if self._opt_state is None:
                self._opt_state = s.read_state()
        s.load(self._params, self._opt_state, self._step)  # the host state, whichever session ran last
        return s

    def _forward(self, batch: int) -> ForwardSession:
        if batch not in self._forwards:
            self._forwards[batch] = ForwardSession(self.spec, batch, self.backend)
        return self._forwards[batch]

    # ------------------------------------------------------------------ checks
    def _check_x(self, x: Any, what: str) -> np.ndarray:
        n = _rows(x, f"{what} x")
        return finite_inputs(x, (n, *self.spec.input_shape), what)

    def _check_xy(self, x: Any, y: Any, session: TrainSession, what: str) -> tuple[np.ndarray, np.ndarray]:
        xa = self._check_x(x, what)
        n = _rows(y, f"{what} y")
        if n != len(xa):
            raise DataError(f"{what}: x has {len(xa)} rows but y has {n}; expected one label per row")
        lay = session.layout
        return xa, checked_labels(y, (n, *lay.y_shape[1:]), lay.y_dtype, session.label_classes, what)

    # ------------------------------------------------------------------ training
    def _lr(self, update: int, total: int, per_epoch: int) -> float:
        return lr_at(update, base=self.lr, total_steps=total, warmup_steps=int(self.warmup_epochs * per_epoch),
                     schedule=self.schedule, decay_rate=self.decay_rate, steps_per_epoch=per_epoch)

    def fit(self, x: Any, y: Any, epochs: int = 1, batch_size: int = 32,
            validation_data: tuple[Any, Any] | None = None, callbacks: Iterable[Callback] = (),
            shuffle: bool = True, drop_last: bool = True, verbose: bool = True) -> History:
        """Train `epochs` passes over (x, y); returns the history (also `self.history`, over all fits).

        Each epoch visits the rows in the order `hloforge train` does (a permutation drawn from
        (seed, epoch); `shuffle=False`: as given) in `len(x) // batch_size` steps: a ragged last batch
        is dropped (`drop_last`, the only mode so far) and said once, never padded into the gradient.
        The schedule runs over this call's steps. Every array is checked whole before the first step."""
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise UnsupportedSpec(f"epochs must be an integer ≥ 1, got {epochs!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UnsupportedSpec(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
        if not drop_last:
            raise UnsupportedSpec("drop_last=False: a ragged last batch would train on padding; only drop_last=True "
                                  "is supported")
        callbacks = list(callbacks)
        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise UnsupportedSpec(f"callbacks must be hloforge Callback instances, got {type(cb).__name__}")
        xa = self._check_x(x, "fit")  # before the compile: a bad x is refused at once
        if validation_data is not None:
            if not (isinstance(validation_data, (tuple, list)) and len(validation_data) == 2):
                raise DataError("validation_data must be a pair (x, y)")
            self._check_x(validation_data[0], "validation_data")
        if batch_size > len(xa):
            raise DataError(f"batch_size {batch_size} is larger than the {len(xa)} rows of x; expected at most "
                            f"{len(xa)}")
        session = self._session(batch_size)
        xa, ya = self._check_xy(xa, y, session, "fit")
        if validation_data is not None:  # checked whole here, so a bad one is refused before any step
            vx, vy = self._check_xy(*validation_data, session, "validation_data")
            self._check_eval_labels(vy, "validation_data")
        per_epoch = len(xa) // batch_size
        if verbose and len(xa) % batch_size:
            print(f"hloforge: {len(xa) % batch_size} of {len(xa)} rows do not fill a batch of {batch_size}; each epoch "
                  f"trains on {per_epoch * batch_size} of them (drop_last)", file=sys.stderr)
        self._batch = batch_size
        total = epochs * per_epoch
        w = bn_weight(self.bn_momentum)
        history = History()
        self.stop_training = False
        for cb in callbacks:
            cb.model = self
            cb.on_train_begin({})
        start_step = session.step
        try:
            for e in range(1, epochs + 1):
                epoch = self._epoch + 1
                for cb in callbacks:
                    cb.on_epoch_begin(epoch, {})
                t = time.perf_counter()
                order = step_rng(self.seed, epoch).permutation(len(xa)) if shuffle else np.arange(len(xa))
                losses = []
                lr = self.lr
                for s in range(per_epoch):
                    idx = order[s * batch_size:(s + 1) * batch_size]
                    lr = self._lr(session.step - start_step, total, per_epoch)
                    loss = session.train_step(xa[idx], ya[idx], lr)
                    if not math.isfinite(loss):
                        raise HloforgeError(f"loss is {loss} at step {session.step} (epoch {epoch}, lr {lr:g}); "
                                            "stopped, the weights kept are those after the last epoch")
                    if self._stat_names:
                        self._running = [r * (1.0 - w) + b * w
                                         for r, b in zip(self._running, session.batch_stats(), strict=True)]
                    losses.append(loss)
                    for cb in callbacks:
                        cb.on_step_end(session.step, {"loss": loss, "lr": lr})
                params, state = session.read_all()
                bad = next((n for (n, _), p in zip(self._param_slots, params, strict=True)
                            if not np.isfinite(p).all()), None)
                if bad is not None:
                    raise HloforgeError(f"param {bad} is not finite after step {session.step}; stopped, the weights "
                                        "kept are those after the last epoch")
                self._params, self._opt_state, self._step, self._epoch = params, state, session.step, epoch
                logs: dict[str, Any] = {"epoch": epoch, "loss": float(np.mean(losses)), "lr": lr,
                                        "seconds": time.perf_counter() - t}
                if validation_data is not None:
                    logs.update({f"val_{k}": v for k, v in self._scores(vx, vy, batch_size).items()})
                history.append(logs)
                self.history.append(logs)
                if verbose:
                    val = "".join(f"  {k} {logs[k]:.4f}" for k in ("val_loss", "val_top1") if k in logs)
                    print(f"epoch {epoch} ({e}/{epochs})  loss {logs['loss']:.4f}{val}", file=sys.stderr)
                for cb in callbacks:
                    cb.on_epoch_end(epoch, logs)
                if self.stop_training:
                    break
        finally:
            for cb in callbacks:
                cb.on_train_end(history[-1] if history else {})
        return history

    # ------------------------------------------------------------------ scoring
    def predict(self, x: Any, batch_size: int | None = None) -> np.ndarray:
        """The eval-mode logits of every row of x (a short last batch padded, its padding dropped)."""
        xa = self._check_x(x, "predict")
        return self._forward(batch_size or self._batch).logits(xa, [*self._params, *self._running])

    def _check_eval_labels(self, y: np.ndarray, what: str) -> None:
        if len(self.spec.walk()[-1].out_shape) != 1:
            raise UnsupportedSpec(f"evaluate scores classifiers so far; net {self.spec.name!r} outputs "
                                  f"{list(self.spec.walk()[-1].out_shape)} (`hloforge eval` scores its task)")
        if y.dtype.kind not in "iu" or y.ndim != 1:
            raise DataError(f"{what} y has dtype {y.dtype} and shape {list(y.shape)}, expected integer class ids [N]")

    def _scores(self, x: np.ndarray, y: np.ndarray, batch: int) -> dict[str, Any]:
        logits = self._forward(batch).logits(x, [*self._params, *self._running])
        c1 = topk_correct(logits, y, 1)
        n, top1 = len(y), int(c1.sum())
        lo, hi = wilson(top1, n)
        z = logits.astype(np.float64)
        z = z - z.max(axis=1, keepdims=True)
        nll = np.log(np.exp(z).sum(axis=1)) - z[np.arange(n), y]
        return {"top1": top1 / n, "top1_lo": lo, "top1_hi": hi, "top5": float(topk_correct(logits, y, 5).mean()),
                "loss": float(nll.mean()), "correct": top1, "n": n}

    def evaluate(self, x: Any, y: Any, batch_size: int | None = None) -> dict[str, Any]:
        """top1 (a fraction), its 95% Wilson interval top1_lo / top1_hi, top5, the mean cross-entropy
        `loss`, `correct` and `n`, on every row (the short last batch included)."""
        xa = self._check_x(x, "evaluate")
        n = _rows(y, "evaluate y")
        if n != len(xa):
            raise DataError(f"evaluate: x has {len(xa)} rows but y has {n}; expected one label per row")
        ya = np.asarray(y)
        self._check_eval_labels(ya, "evaluate")
        return self._scores(xa, ya, batch_size or self._batch)

    # ------------------------------------------------------------------ named tensors
    @property
    def params(self) -> dict[str, np.ndarray]:
        """θ by the names checkpoints use (`0.w`, `1.b`, ...), in their declared layouts; copies."""
        return {n: p.copy() for (n, _), p in zip(self._param_slots, self._params, strict=True)}

    @params.setter
    def params(self, new: Mapping[str, Any]) -> None:
        self._params = self._assigned(new, [(n, s.shape) for n, s in self._param_slots], "params", self._params)

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The optimizer state (`m/0.w`, ...) and the BN running statistics (`stat/1.mean`, ...)."""
        opt = self._opt_state if self._opt_state is not None else self._initial_state()
        return {n: a.copy() for n, a in zip(self._state_names(), [*opt, *self._running], strict=True)}

    @state.setter
    def state(self, new: Mapping[str, Any]) -> None:
        cur = [*(self._opt_state if self._opt_state is not None else self._initial_state()), *self._running]
        got = self._assigned(new, [(n, a.shape) for n, a in zip(self._state_names(), cur, strict=True)], "state", cur)
        k = len(cur) - len(self._running)
        self._opt_state, self._running = got[:k], got[k:]

    def _state_names(self) -> list[str]:
        names = [n for n, _ in self._param_slots]
        return [f"{k}/{n}" for k in self._state_layout.slots for n in names] + [f"{ckpt.STATS}/{n}"
                                                                               for n in self._stat_names]

    def _initial_state(self) -> list[np.ndarray]:
        slots = [s for _, s in self._param_slots]
        return [np.asarray(a, np.float32) for a in
                self._state_layout.initial(self.variant.make_optimizer(default_registry()), slots, self._params)]

    @staticmethod
    def _assigned(new: Mapping[str, Any], want: list[tuple[str, tuple[int, ...]]], what: str,
                  current: list[np.ndarray]) -> list[np.ndarray]:
        """`current` with the tensors `new` names replaced, each checked for name, shape and dtype."""
        if not isinstance(new, Mapping):
            raise DataError(f"{what} must be a mapping of name → array, got {type(new).__name__}")
        index = {n: i for i, (n, _) in enumerate(want)}
        unknown = sorted(set(new) - set(index))
        if unknown:
            raise DataError(f"{what}: no tensor named {unknown[0]!r}; the names are {list(index)[:6]}...")
        out = list(current)
        for name, a in new.items():
            a = np.asarray(a)
            shape = want[index[name]][1]
            if tuple(a.shape) != tuple(shape):
                raise DataError(f"{what}[{name!r}] has shape {list(a.shape)}, expected {list(shape)}")
            if a.dtype != np.float32:
                raise DataError(f"{what}[{name!r}] has dtype {a.dtype}, expected float32")
            if not np.isfinite(a).all():
                raise DataError(f"{what}[{name!r}] holds NaN or inf, expected finite numbers")
            out[index[name]] = a.copy()
        return out

    # ------------------------------------------------------------------ run directories
    def _config(self, path: str, data: str) -> Any:
        from hloforge.train.trainer import TrainConfig

        v = self.variant
        return TrainConfig(net=self._net_ref or os.path.join(os.path.abspath(path), NET_FILE), classes=self._classes,
                           input=self._input, data=data, backend=self.backend.name, epochs=max(self._epoch, 1),
                           batch=self._batch, optimizer=v.optimizer, lr=self.lr, schedule=self.schedule,
                           warmup_epochs=self.warmup_epochs, decay_rate=self.decay_rate, weight_decay=v.weight_decay,
                           label_smoothing=v.label_smoothing, loss=v.loss, clip=v.clip, dropout=v.dropout,
                           drop_path=v.drop_path, bn_eps=v.bn_eps, bn_momentum=self.bn_momentum, seed=self.seed,
                           run_dir=path)

    def save(self, path: str, data: str | None = None, overwrite: bool = False) -> str:
        """Write the run directory `hloforge train` writes (config.toml and checkpoint.safetensors, by
        the trainer's own writers), so `hloforge eval DIR` scores it on `data`'s test split (the
        dataset the config names; default: the one a loaded run named, else digits, `hloforge train`'s)
        and `hf.load(DIR)` reads it back bit for bit. Returns `path`."""
        data = data or self._data
        file = os.path.join(path, CHECKPOINT)
        if os.path.exists(file) and not overwrite:
            raise HloforgeError(f"{path} already holds a checkpoint; pass overwrite=True to replace it")
        cfg = self._config(path, data)  # checked before anything is written
        y_te = default_registry().make("dataset", data).arrays("test")[1]
        names = ckpt.tensor_names([n for n, _ in self._param_slots], self._state_layout.slots, self._stat_names)
        opt = self._opt_state if self._opt_state is not None else self._initial_state()
        meta = {"spec": self.spec.to_dict(), "variant": attrs.asdict(self.variant), "backend": self.backend.name,
                "epoch": self._epoch, "step": self._step, "seed": self.seed, "config": attrs.asdict(cfg),
                "eval_set": eval_set_id(data, "test", y_te)}
        os.makedirs(path, exist_ok=True)
        if not self._net_ref:
            with open(os.path.join(path, NET_FILE), "w", encoding="utf-8") as f:
                f.write(self._declared_spec.to_json())
        with open(os.path.join(path, CONFIG), "w", encoding="utf-8") as f:
            f.write(cfg.to_toml())
        ckpt.save_checkpoint(file, names, [*self._params, *opt, *self._running], meta)
        return path

    def summary(self) -> str:
        """The layer table: index, kind, input → output shape, parameters; then the totals."""
        return summary_table(self.spec)

    def __repr__(self) -> str:
        return (f"Model({self.spec.name!r}, {self.spec.param_count():,} params, {self.variant.slug}, "
                f"backend {self.backend.name}, epoch {self._epoch})")


def bn_weight(momentum: float) -> float:
    from hloforge.train.trainer import bn_weight as trainer_bn_weight  # the one definition (seed 003's 0.01)

    return trainer_bn_weight(momentum)


def load(path: str, backend: str | None = None) -> Model:
    """A run directory written by `Model.save` or `hloforge train`, as a Model: θ, optimizer state,
    BN statistics, step and epoch as saved, bit for bit."""
    from hloforge.train.trainer import load_config

    file = os.path.join(path, CHECKPOINT)
    tensors, meta = ckpt.load_checkpoint(file)
    if not os.path.exists(os.path.join(path, CONFIG)):
        raise DataError(f"{path} has no {CONFIG}; expected a run directory (Model.save or hloforge train)")
    cfg = load_config(os.path.join(path, CONFIG))
    v = Variant(**meta["variant"])
    later = sorted(k for k, off in NOT_YET.items() if getattr(v, k) != off)
    if later:
        raise UnsupportedSpec(f"{path} was trained with {', '.join(later)}, which hf.Model does not drive yet")
    fields = {k: getattr(v, k) for k in ("weight_decay", "loss", "label_smoothing", "clip", "dropout", "drop_path",
                                         "bn_eps")}
    model = Model(cfg.net, v.optimizer, cfg.lr, cfg.schedule, backend or meta["backend"], cfg.seed,
                  warmup_epochs=cfg.warmup_epochs, decay_rate=cfg.decay_rate, bn_momentum=cfg.bn_momentum,
                  classes=cfg.classes, input=cfg.input, **fields)
    if json.loads(json.dumps(model.spec.to_dict())) != meta["spec"]:
        raise DataError(f"checkpoint {file} holds a spec that differs from net {cfg.net!r} as defined now")
    if os.path.basename(cfg.net) == NET_FILE:
        model._net_ref = ""  # a saved NetSpec: saving it again writes its own net.json
    try:
        model._params = [tensors[f"param/{n}"] for n, _ in model._param_slots]
        state = model._state_names()
        k = len(state) - len(model._stat_names)
        model._opt_state = [tensors[f"state/{n}"] for n in state[:k]]
        model._running = [tensors[n] for n in state[k:]]
    except KeyError as e:
        raise DataError(f"checkpoint {file} lacks tensor {e.args[0]}; it is not of this net") from None
    model._step, model._epoch, model._batch, model._data = int(meta["step"]), int(meta["epoch"]), cfg.batch, cfg.data
    return model


def summary_table(spec: NetSpec) -> str:
    """A net's layers as a table (index, kind, input → output shape, parameters) and its totals."""
    walk = spec.walk()
    rows = [(str(w.index), w.layer.kind, f"{list(w.in_shape)} → {list(w.out_shape)}",
             f"{sum(s.size for s in w.slots):,}") for w in walk]
    head = ("#", "kind", "input → output", "params")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]

    def line(r: Sequence[str]) -> str:
        return "  ".join([r[0].rjust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]), r[3].rjust(widths[3])])

    rule = "-" * len(line(head))
    total = spec.param_count()
    stats = sum(math.prod(s.shape) for _, s in spec.stats())
    foot = [f"{spec.name}: {len(walk)} layers, {total:,} parameters (trainable), "
            f"{stats:,} running statistics, input {list(spec.input_shape)}"]
    return "\n".join([line(head), rule, *map(line, rows), rule, *foot])
