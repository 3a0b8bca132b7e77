"""`hloforge train`: the loop, per-epoch evaluation, the run directory, checkpoints and resume.

A run directory holds config.toml (the whole resolved config: `--config` on it
reproduces the run), metrics.jsonl, checkpoint.safetensors, eval_correct.npz
(the per-example bitmap of the last eval) and loss/accuracy plots.

A net with per-token logits [T, vocab] is a language model: it trains with the per-token
loss `tokenCrossEntropy` on a token dataset (`text`), and each epoch is scored in bits per
character over every validation window (no bitmap; the banner prints the character-bigram
baseline of the same corpus). Everything else — run directory, checkpoints, resume — is shared.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.core.variant import SHADOW, Variant, ema_decay_at
from hloforge.datasets.stream import DataRef, Feed, split_labels
from hloforge.train import autotune, fp8
from hloforge.train import checkpoint as ckpt
from hloforge.train.metrics import eval_set_id, topk_correct, wilson
from hloforge.train.mixing import Mixer
from hloforge.train.parallel import DataParallelTrainSession, make_forward_session
from hloforge.train.schedule import SCHEDULES, lr_at
from hloforge.train.session import ForwardSession, TrainSession, make_backend
from hloforge.train.tasks import make_task
from hloforge.zoo import get_net

CHECKPOINT = "checkpoint.safetensors"
BITMAP = "eval_correct.npz"


MAX_DEVICES = 4096  # far above any host's devices, far below the backend's 32-bit count


@attrs.frozen
class TrainConfig:
    net: str = "mnist-mlp"
    classes: int | None = None  # override a zoo net's class count
    input: tuple[int, ...] | None = attrs.field(default=None, converter=lambda v: None if v is None else tuple(v))
    data: str = "digits"
    data_dir: str = ""
    data_file: str = ""  # a file-based dataset's file (e.g. text's UTF-8 corpus)
    # the dataset's own options as "key=value" items (--data-opt, repeatable; e.g. shapes "size=48"):
    # stored with the run, so eval, detect and sample rebuild the same dataset (parse_data_options)
    data_options: tuple[str, ...] = attrs.field(default=(), converter=lambda v: option_items(v))
    workers: int = 0  # producer processes streaming the batches (seed 003); 0: drawn in process
    augment: bool = True  # the dataset's training augmentation (crop, flip, ...), seeded per step
    backend: str = ""  # empty: $HLOFORGE_BACKEND, else xla; the run records the resolved name
    # Data parallelism (hloforge.train.parallel): `batch` is the global batch, split over the replicas.
    replicas: int = 1
    devices: int | None = None  # the backend's device count (the XLA CPU plugin's cpu_device_count)
    sync_bn: bool = False  # BN statistics over the global batch; default: each replica's own (replica 0's read)
    epochs: int = 5
    batch: int = 64
    optimizer: str = "adam"
    lr: float = 1e-3
    schedule: str = "cosine"
    warmup_epochs: float = 0.0
    decay_rate: float = 0.97
    weight_decay: float | None = None
    label_smoothing: float = 0.0
    loss: str = ""  # empty: the one the net and dataset call for (hloforge.train.tasks.default_loss)
    # a DDPM's linear β schedule (hloforge.train.diffusion); sampling reads it back from the checkpoint
    diffusion_steps: int = 1000
    beta_start: float = 1e-4
    beta_end: float = 0.02
    # the rest of the variant (hloforge.core.variant.Variant): wrappers, mixing, masks, BN ε, precision
    ema: float = 0.0
    accum: int = 1
    clip: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    dropout: float = 0.0
    drop_path: float = 0.0
    bn_eps: float | None = None
    precision: str = "fp32"
    # PyTorch's convention (running ← 0.9·running + 0.1·batch). Seed 003's 0.99 suits ImageNet-length
    # runs; on a 22-step digits epoch it leaves eval normalising by near-initial statistics.
    bn_momentum: float = 0.9
    seed: int = 0
    run_dir: str = ""
    tag: str = ""
    log_every: int = 50
    # Per-layer lowering strategies timed on the backend at render time (hloforge.train.autotune; also
    # $HLOFORGE_AUTOTUNE=1). A tuned run records its choices in `tuned` ("layer index:kind=choice,…"),
    # which a config that has them applies as they are, untimed: `--config` re-renders the same modules.
    autotune: bool = False
    tuned: tuple[str, ...] = attrs.field(default=(), converter=lambda v: (v,) if isinstance(v, str) else tuple(v))

    def variant(self, spec: NetSpec | None = None) -> Variant:
        """The loss: `loss` if given, else the net's and dataset's (tokenCrossEntropy for per-token logits,
        crossEntropy for classes, perPixelCE for masks, mse for a DDPM: hloforge.train.tasks)."""
        from hloforge.train.tasks import default_loss

        loss = self.loss or ("crossEntropy" if spec is None else default_loss(spec, self.data))
        return Variant(self.optimizer, self.weight_decay, loss, self.label_smoothing, ema=self.ema,
                       accum=self.accum, clip=self.clip, mixup=self.mixup, cutmix=self.cutmix, dropout=self.dropout,
                       drop_path=self.drop_path, bn_eps=self.bn_eps, precision=self.precision)

    def scope(self, spec: NetSpec) -> str:
        """Net, variant, backend and tag: two arms of an ablation never share a run directory."""
        dp = f"dp{self.replicas}" + ("syncbn" if self.sync_bn else "") if self.replicas > 1 else ""
        return "_".join(p for p in (spec.ident, self.variant(spec).slug, dp, self.backend, self.tag) if p)

    def resolved_run_dir(self, spec: NetSpec, resume: bool = False) -> str:
        """An explicit run_dir as given; otherwise runs/<scope>, runs/<scope>_2, ...: a new run
        takes the first free one (nothing is overwritten), a resumed run the latest."""
        if self.run_dir:
            return self.run_dir
        base = os.path.join("runs", self.scope(spec))
        taken = [base] + [f"{base}_{i}" for i in range(2, 10_000) if os.path.exists(f"{base}_{i}")]
        taken = [d for d in taken if os.path.exists(os.path.join(d, CHECKPOINT))]
        if resume:
            return taken[-1] if taken else base
        return base if not taken else f"{base}_{len(taken) + 1}"

    def to_toml(self) -> str:
        lines = []
        for f in attrs.fields(TrainConfig):
            v = getattr(self, f.name)
            if v is not None:
                lines.append(f"{f.name} = {json.dumps(v)}")
        return "\n".join(lines) + "\n"

    def check(self) -> None:
        if self.epochs < 1 or self.batch < 1:
            raise UnsupportedSpec(f"epochs and batch must be positive, got epochs={self.epochs} batch={self.batch}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise UnsupportedSpec(f"lr must be a positive number, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise UnsupportedSpec(f"unknown schedule {self.schedule!r}; expected one of {list(SCHEDULES)}")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise UnsupportedSpec(f"bn_momentum must be in [0, 1), got {self.bn_momentum}")
        # the XLA CPU client takes a 32-bit device count: 2**31 aborts the process, 2**32 wraps to the default
        if self.replicas < 1 or (self.devices is not None and not 1 <= self.devices <= MAX_DEVICES):
            raise UnsupportedSpec(f"replicas and devices must be positive (devices at most {MAX_DEVICES}), got "
                                  f"replicas={self.replicas} "
                                  f"devices={self.devices}")
        if self.batch % self.replicas:
            raise UnsupportedSpec(f"batch {self.batch} (the global batch) does not split evenly over "
                                  f"{self.replicas} replicas")
        if self.sync_bn and self.replicas == 1:
            raise UnsupportedSpec("sync_bn pools BN statistics across replicas; it needs replicas > 1")


def load_config(path: str, **overrides: Any) -> TrainConfig:
    """A config file (TOML), with command-line values on top."""
    try:
        with open(path, "rb") as f:
            d = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UnsupportedSpec(f"config {path}: cannot read it as TOML ({e})") from None
    known = {f.name for f in attrs.fields(TrainConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise UnsupportedSpec(f"config {path}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    if "data_options" in overrides and "data_options" in d:  # --data-opt adds to the file's options (later wins)
        overrides["data_options"] = (*option_items(d["data_options"]), *option_items(overrides["data_options"]))
    return TrainConfig(**{**d, **overrides})


def option_items(v: Any) -> tuple[str, ...]:
    """`data_options` as its "key=value" items: a list of them, or one "key=value,…" string."""
    if isinstance(v, str):
        return tuple(p.strip() for p in v.split(",") if p.strip())
    return tuple(str(p).strip() for p in v)


def parse_data_options(items: Any) -> dict[str, Any]:
    """`data_options` ("key=value" items) as the dataset's keyword arguments, a later key over an
    earlier one: each value an int, else a float, else true/false, else the string as written."""
    opts: dict[str, Any] = {}
    for item in option_items(items):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if not eq or not key or not raw:
            raise UnsupportedSpec(f"data option {item!r} is not KEY=VALUE")
        value: Any = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                pass
        else:
            value = {"true": True, "false": False}.get(raw.lower(), raw)
        opts[key] = value
    return opts


def is_lm(spec: NetSpec) -> bool:
    """A language model: its output is per-token logits [T, vocab]."""
    return len(spec.walk()[-1].out_shape) == 2


def bn_weight(momentum: float, accum: int = 1) -> float:
    """The weight the running statistics put on a new batch (seed 003): exactly 0.01 at the
    default 0.99, not 1 − 0.99 = 0.010000000000000009. Under accumulation over k micro-batches the
    statistics move once per MICRO-batch, so the momentum is k-th-rooted: k chained updates
    compose to one update at `momentum` per optimizer step."""
    if accum == 1:
        return 0.01 if momentum == 0.99 else 1.0 - momentum
    return 1.0 - momentum ** (1.0 / accum)


def fit_input(x: np.ndarray, spec: NetSpec, data_name: str) -> np.ndarray:
    """Reshape dataset rows to the net's input shape when only the layout differs (28×28 → 784)."""
    if tuple(x.shape[1:]) == spec.input_shape:
        return x
    if math.prod(x.shape[1:]) == math.prod(spec.input_shape):
        return x.reshape(len(x), *spec.input_shape)
    raise DataError(f"dataset {data_name!r} gives inputs of shape {list(x.shape[1:])}, but net {spec.name!r} "
                    f"expects {list(spec.input_shape)}")


@attrs.frozen
class EvalResult:
    top1: int
    top5: int
    n: int
    correct: np.ndarray

    def line(self) -> str:
        lo, hi = wilson(self.top1, self.n)
        return (f"top-1 {100 * self.top1 / self.n:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}] ({self.top1}/{self.n})  "
                f"top-5 {100 * self.top5 / self.n:.2f}%")


@attrs.frozen
class LMEvalResult:
    bits_per_char: float
    n: int  # targets scored

    def line(self) -> str:
        return f"{self.bits_per_char:.4f} bits/char ({self.n} chars)"


def evaluate_lm(evaluator: ForwardSession, buffers: list[Any], x: np.ndarray, y: np.ndarray) -> LMEvalResult:
    """Bits per character over every validation target (labels −1 are padding, not scored)."""
    from hloforge.datasets.text import bits_per_char

    return LMEvalResult(*bits_per_char(evaluator.logits(x, buffers), y))


def evaluate(evaluator: ForwardSession, buffers: list[Any], x: np.ndarray, y: np.ndarray) -> EvalResult:
    """Every eval image scored exactly once, the short last batch included."""
    logits = evaluator.logits(x, buffers)
    c1 = topk_correct(logits, y, 1)
    return EvalResult(int(c1.sum()), int(topk_correct(logits, y, 5).sum()), len(y), c1)


def evaluate_stream(evaluator: ForwardSession, buffers: list[Any], batches: Iterable[tuple[np.ndarray, np.ndarray]],
                    n_eval: int) -> EvalResult:
    """The eval pass over streamed batches, in stream order. A pass that does not score the whole
    split (a dropped tail) is an error, never a plausible accuracy over fewer images."""
    c1, c5 = [np.zeros(0, bool)], [np.zeros(0, bool)]
    for x, y in batches:
        logits = evaluator.logits(x, buffers)
        c1.append(topk_correct(logits, y, 1))
        c5.append(topk_correct(logits, y, 5))
    top1 = np.concatenate(c1)
    if len(top1) != n_eval:
        raise DataError(f"the streamed eval pass scored {len(top1)} images; the eval split has {n_eval}")
    return EvalResult(int(top1.sum()), int(np.concatenate(c5).sum()), n_eval, top1)


class Run:
    """One training run: its config, data, sessions and run directory."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = print, progress: bool = True,
                 resume: bool = False):
        cfg.check()
        self.backend = make_backend(cfg.backend or None, **({"devices": cfg.devices} if cfg.devices else {}))
        cfg = attrs.evolve(cfg, backend=self.backend.name)
        self.cfg, self.log, self.progress = cfg, log, progress
        reg = default_registry()
        self.spec = get_net(cfg.net, cfg.classes, cfg.input)
        self.lm = is_lm(self.spec)
        self.variant = cfg.variant(self.spec)
        self.spec = self.variant.apply_to(self.spec)  # dropout, drop_path, BN ε: train and eval one net
        self.mixer = (Mixer(self.spec.num_classes, self.variant.mixup, self.variant.cutmix, cfg.label_smoothing)
                      if self.variant.soft_labels else None)
        if self.mixer is not None:
            self.mixer.check_input(self.spec.input_shape)
        if self.variant.precision == "fp8":
            fp8.check_variant(self.variant)
            if cfg.replicas > 1:
                raise UnsupportedSpec("precision fp8 runs on one replica (its master weights live on the host)")
        opts: dict[str, Any] = {"data_dir": cfg.data_dir} if cfg.data_dir else {}
        if cfg.data_file:
            opts["data_file"] = cfg.data_file
        opts.update(parse_data_options(cfg.data_options))
        if self.lm:
            if getattr(reg.get("dataset", cfg.data), "label_kind", "class") != "tokens":
                raise DataError(f"net {self.spec.name!r} is a language model (per-token logits); dataset "
                                f"{cfg.data!r} has no token labels — use --data text")
            opts["seq_len"] = self.spec.input_shape[0]
        self.data = reg.make("dataset", cfg.data, **opts)
        x_te: np.ndarray | None = None
        if cfg.workers:  # the eval streams too: its labels here, the float split only if a consumer asks (x_te)
            self.y_te = split_labels(self.data, "test")
        else:
            x_te, self.y_te = self.data.arrays("test")
        # what the loss's label kind trains: feed shape, train-step inputs, evaluation (LM: its own path)
        self.task = None if self.lm else make_task(self)
        if self.lm and self.data.num_classes != self.spec.num_classes:
            raise DataError(f"dataset {cfg.data!r} has {self.data.num_classes} classes, net {self.spec.name!r} "
                            f"has {self.spec.num_classes}")
        self.feed = Feed(self.data, DataRef(cfg.data, opts), batch=cfg.batch, seed=cfg.seed, workers=cfg.workers,
                         augment=cfg.augment, input_shape=self.task.feed_shape if self.task else self.spec.input_shape)
        self._x_te = None if x_te is None else self._fit_input(x_te)
        self.steps_per_epoch = self.feed.steps_per_epoch
        if self.steps_per_epoch == 0:
            raise DataError(f"batch {cfg.batch} is larger than the {self.feed.n}-image training split"
                            + (f" split over {cfg.workers} workers" if cfg.workers else ""))
        if self.steps_per_epoch % self.variant.accum:
            # An epoch must end on an applied update, or its checkpoint would hold a half-full accumulator.
            raise UnsupportedSpec(f"accum {self.variant.accum}: the {self.steps_per_epoch} batches of an epoch do not "
                                  f"divide into updates of {self.variant.accum} micro-batches; pick a batch size or "
                                  "accum that divides them")
        self.dir = cfg.resolved_run_dir(self.spec, resume)
        self.stat_names = [n for n, _ in self.spec.stats()]
        self.running = [s.initial() for _, s in self.spec.stats()]
        self.state_layout = self.variant.state_layout(self.variant.make_optimizer(reg))
        # The EMA shadow's BN statistics (seed 003's ema_bn): the running statistics averaged with the
        # shadow's decay at the shadow's cadence, from the same start, so the shadow is scored with
        # statistics that lag as its weights do (timm's ModelEma averages the BN buffers the same way).
        self.shadow_running = [r.copy() for r in self.running] if self.state_layout.shadows else []

    def _fit_input(self, x: np.ndarray) -> np.ndarray:
        return self.task.fit_input(x) if self.task else fit_input(x, self.spec, self.cfg.data)

    @property
    def x_te(self) -> np.ndarray:
        """The eval split's inputs shaped for the net, in memory. A run that streams its eval (workers > 0)
        never needs them; they load on first use, for the consumers that need random access (cam)."""
        if self._x_te is None:
            self._x_te = self._fit_input(self.data.arrays("test")[0])
        return self._x_te

    # ------------------------------------------------------------------ checkpoints
    @property
    def ckpt_path(self) -> str:
        return os.path.join(self.dir, CHECKPOINT)

    def meta(self, epoch: int, step: int) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "variant": attrs.asdict(self.variant), "backend": self.cfg.backend,
                "epoch": epoch, "step": step, "seed": self.cfg.seed, "config": attrs.asdict(self.cfg),
                "eval_set": eval_set_id(self.cfg.data, "test", self.y_te)}

    def save(self, session: TrainSession, epoch: int) -> None:
        lay = session.layout
        names = ckpt.tensor_names([n for n, _ in lay.params], lay.state, self.stat_names,
                                  shadow_stats=self.state_layout.shadows)
        params, state = session.read_params(), session.read_state()
        ckpt.save_checkpoint(self.ckpt_path, names, params + state + self.running + self.shadow_running,
                             self.meta(epoch, session.step))

    def expected_tensors(self) -> tuple[dict[str, tuple[int, ...]], list[str]]:
        """Every tensor this run's checkpoint holds, name -> shape, and the optional ones."""
        return ckpt.expected_tensors([(n, s.shape) for n, s in self.spec.params()], self.state_layout.slots,
                                     [(n, s.shape) for n, s in self.spec.stats()], self.state_layout.shadows)

    def restore(self, session: TrainSession, cross_backend: bool = False) -> int:
        """Load the run's checkpoint into the session; returns the epoch it ended."""
        tensors, meta = ckpt.load_checkpoint(self.ckpt_path)
        session.state_layout.check_slots(f"checkpoint {self.ckpt_path}", list(tensors))
        check_matches(self.ckpt_path, meta, self.spec, self.variant, self.cfg.backend, cross_backend)
        ckpt.check_tensors(self.ckpt_path, tensors, *self.expected_tensors())
        lay = session.layout
        pn = [n for n, _ in lay.params]
        try:
            params = [tensors[f"param/{n}"] for n in pn]
            state = [tensors[f"state/{k}/{n}"] for k in lay.state for n in pn]
            self.running = [tensors[f"{ckpt.STATS}/{n}"] for n in self.stat_names]
        except KeyError as e:
            raise DataError(f"checkpoint {self.ckpt_path} lacks tensor {e.args[0]}; it is not of this net") from None
        if self.state_layout.shadows:
            self.shadow_running = ckpt.shadow_stats(tensors, self.stat_names, self.ckpt_path,
                                                    "resuming would restart them; start a new run")
        session.load(params, state, meta["step"])
        return int(meta["epoch"])

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
        return lr_at(step // k, base=c.lr, total_steps=c.epochs * per_epoch,
                     warmup_steps=int(c.warmup_epochs * per_epoch), schedule=c.schedule,
                     decay_rate=c.decay_rate, steps_per_epoch=per_epoch)

    def train(self, resume: bool = False, cross_backend: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        tuning = autotune.resolve(self.spec, cfg.batch // cfg.replicas, self.backend, autotune=cfg.autotune,
                                  recorded=cfg.tuned)
        if tuning is not None:  # the config records that tuning was on and what it chose
            cfg = self.cfg = attrs.evolve(cfg, autotune=True, tuned=tuning.records())
        t0 = time.perf_counter()
        with autotune.rendering(tuning):
            session = (TrainSession(self.spec, self.variant, cfg.batch, self.backend, seed=cfg.seed)
                       if cfg.replicas == 1 else
                       DataParallelTrainSession(self.spec, self.variant, cfg.batch, self.backend, seed=cfg.seed,
                                                replicas=cfg.replicas, sync_bn=cfg.sync_bn))
            evaluator = make_forward_session(self.spec, cfg.batch // cfg.replicas, self.backend, cfg.replicas)
        compile_s = time.perf_counter() - t0
        start = 0
        if resume:
            start = self.restore(session, cross_backend)
            if start >= cfg.epochs:
                raise HloforgeError(f"run {self.dir} already finished: its checkpoint is at epoch {start} of "
                                    f"{cfg.epochs}; raise --epochs to train further")
        elif os.path.exists(self.ckpt_path):
            raise HloforgeError(f"run directory {self.dir} already holds a checkpoint; pass --resume to continue it, "
                                "or --tag/--run-dir for a new run")
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "config.toml"), "w", encoding="utf-8") as f:
            f.write(cfg.to_toml())
        self.log(f"hloforge: {self.spec.name} ({self.spec.param_count():,} params) on {cfg.data} "
                 f"({self.feed.n} train / {len(self.y_te)} test) | backend {self.backend.backend_name()}")
        if self.lm and hasattr(self.data, "bigram_bits"):
            self.log(f"  text {getattr(self.data, 'source', cfg.data)}: vocab {self.data.num_classes}, validation "
                     f"character-bigram baseline {self.data.bigram_bits():.4f} bits/char")
        dp = (f" over {cfg.replicas} replicas" + (" (sync BN)" if cfg.sync_bn else "")) if cfg.replicas > 1 else ""
        self.log(f"  {self.variant.slug}: lr {cfg.lr:g} {cfg.schedule}, batch {cfg.batch}{dp}, {cfg.epochs} epochs, "
                 f"run dir {self.dir} | compiled in {compile_s:.1f}s"
                 + (f" | resumed after epoch {start}" if start else ""))
        if tuning is not None:
            self.log(f"  {tuning.summary()}")
        w = bn_weight(cfg.bn_momentum, self.variant.accum)
        metrics: dict[str, Any] = {}
        history = self._history() if start else []
        mlog = open(os.path.join(self.dir, "metrics.jsonl"), "a" if start else "w", encoding="utf-8")
        try:
            for epoch in range(start + 1, cfg.epochs + 1):
                t = time.perf_counter()
                losses = []
                bar = self._bar(epoch)
                for s, (xb, yb) in enumerate(self.feed.epoch(epoch)):
                    step = session.step
                    lr = self.lr(step)
                    loss = self.step(session, xb, yb, lr)
                    if not math.isfinite(loss):
                        raise HloforgeError(
                            f"loss is {loss} at step {step + 1} (epoch {epoch}, lr {lr:g}); stopped. The last good "
                            f"checkpoint is {self.ckpt_path if os.path.exists(self.ckpt_path) else 'none'}")
                    if self.stat_names:
                        self.running = [r * (1.0 - w) + b * w for r, b in
                                        zip(self.running, session.batch_stats(), strict=True)]
                        self._track_shadow_stats(session.step)
                    losses.append(loss)
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
                if self.lm:
                    metrics = self._lm_epoch(evaluator, session, epoch, losses, secs, mlog, history)
                    continue
                assert self.task is not None
                ev = self.task.evaluate(evaluator, self._eval_buffers(session))
                metrics = {"kind": "epoch", "epoch": epoch, "step": session.step, "loss": float(np.mean(losses)),
                           "lr": self.lr(session.step - 1), **ev.metrics,
                           "images_per_s": self.steps_per_epoch * cfg.batch / secs, "seconds": secs}
                ema_line = ""
                if self.variant.ema and not self.feed.streams and not isinstance(session, DataParallelTrainSession):
                    # The shadow, found through the state layout (never a literal region), with its own BN stats.
                    shadow = [*session.slot_buffers(SHADOW), *(self.backend.to_device(r) for r in self.shadow_running)]
                    ev_ema = self.task.evaluate(evaluator, shadow)
                    metrics.update(self.task.ema_metrics(ev_ema))
                    ema_line = f"  ema {ev_ema.line.removeprefix('test ')}"
                mlog.write(json.dumps(metrics) + "\n")
                mlog.flush()
                history.append(metrics)
                if ev.correct is not None:
                    np.savez(os.path.join(self.dir, BITMAP), correct=ev.correct, set_id=self.meta(0, 0)["eval_set"],
                             epoch=epoch)
                self.save(session, epoch)
                self.log(f"epoch {epoch}/{cfg.epochs}  loss {metrics['loss']:.4f}  {ev.line}{ema_line}  "
                         f"{metrics['images_per_s']:.0f} img/s")
                self._plot(history)
                default_registry().pm.hook.hloforge_on_epoch_end(run=self, epoch=epoch, metrics=metrics)
        finally:
            mlog.close()
        metrics["wall_s"] = time.perf_counter() - t0
        return metrics

    def _lm_epoch(self, evaluator: ForwardSession, session: TrainSession, epoch: int, losses: list[float],
                  secs: float, mlog: Any, history: list[dict[str, Any]]) -> dict[str, Any]:
        """A language model's epoch end: bits/char on every validation window, log, checkpoint, plot."""
        cfg = self.cfg
        res = evaluate_lm(evaluator, self._eval_buffers(session), self.x_te, self.y_te)
        metrics: dict[str, Any] = {
                   "kind": "epoch", "epoch": epoch, "step": session.step, "loss": float(np.mean(losses)),
                   "lr": self.lr(session.step - 1), "val_bits_per_char": res.bits_per_char, "n": res.n,
                   "tokens_per_s": self.steps_per_epoch * cfg.batch * self.spec.input_shape[0] / secs,
                   "seconds": secs}
        mlog.write(json.dumps(metrics) + "\n")
        mlog.flush()
        history.append(metrics)
        self.save(session, epoch)
        self.log(f"epoch {epoch}/{cfg.epochs}  loss {metrics['loss']:.4f} ({metrics['loss'] / math.log(2):.4f} "
                 f"bits/char)  val {res.line()}  {metrics['tokens_per_s']:.0f} tok/s")
        self._plot(history)
        default_registry().pm.hook.hloforge_on_epoch_end(run=self, epoch=epoch, metrics=metrics)
        return metrics

    def _eval_buffers(self, session: TrainSession) -> list[Any]:
        if isinstance(session, DataParallelTrainSession):  # each replica scores with its own copy
            return [[*theta, *(self.backend.to_device(s, device=r) for s in self.running)]
                    for r, theta in enumerate(session.replica_params())]
        return [*session.params, *(self.backend.to_device(r) for r in self.running)]

    def _bar(self, epoch: int) -> Any:
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=self.steps_per_epoch, desc=f"epoch {epoch}/{self.cfg.epochs}", leave=False,
                    file=sys.stderr, dynamic_ncols=True, disable=None)  # None: off when not a terminal

    def _history(self) -> list[dict[str, Any]]:
        path = os.path.join(self.dir, "metrics.jsonl")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as f:
            return [r for r in map(json.loads, f) if r.get("kind") == "epoch"]

    def _plot(self, history: list[dict[str, Any]]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ep = [h["epoch"] for h in history]
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
        a.plot(ep, [h["loss"] for h in history], marker="o")
        a.set(xlabel="epoch", ylabel="train loss", title=self.spec.name)
        if self.lm:
            b.plot(ep, [h["val_bits_per_char"] for h in history], marker="o")
            b.set(xlabel="epoch", ylabel="validation bits/char")
        elif self.task is not None and self.task.kind != "class":
            key, label = self.task.plot
            b.plot(ep, [h[key] for h in history], marker="o")
            b.set(xlabel="epoch", ylabel=label)
        else:
            b.plot(ep, [100 * h["top1"] for h in history], marker="o", label="top-1")
            b.fill_between(ep, [100 * h["top1_lo"] for h in history], [100 * h["top1_hi"] for h in history],
                           alpha=0.2, label="95% Wilson")
            b.set(xlabel="epoch", ylabel="test accuracy (%)")
            b.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(self.dir, "curves.png"), dpi=90)
        plt.close(fig)


def check_matches(path: str, meta: dict[str, Any], spec: NetSpec, variant: Variant, backend: str,
                  allow_cross_backend: bool = False) -> None:
    """Refuse a checkpoint of another net, variant or backend with one clear line."""
    if meta.get("spec") != spec.to_dict():
        raise DataError(f"checkpoint {path} is of net {meta.get('spec', {}).get('name')!r}, not {spec.name!r} "
                        f"(its spec differs: {ckpt.first_difference(meta.get('spec'), spec.to_dict())})")
    if meta.get("variant") != attrs.asdict(variant):
        raise DataError(f"checkpoint {path} was trained as variant {meta.get('variant')}, not {attrs.asdict(variant)}")
    if meta.get("backend") != backend and not allow_cross_backend:
        raise DataError(f"checkpoint {path} was trained on backend {meta.get('backend')!r}, not {backend!r}; "
                        "pass --cross-backend to load it anyway")


def train(cfg: TrainConfig, *, resume: bool = False, cross_backend: bool = False,
          log: Callable[[str], None] = print, progress: bool = True) -> dict[str, Any]:
    """Train per `cfg`; `resume` continues the run directory's checkpoint, `cross_backend`
    lets that checkpoint come from another backend (results then differ in the last bits)."""
    return Run(cfg, log, progress, resume).train(resume=resume, cross_backend=cross_backend)


REGIONS = ("live", "ema", "auto")


@attrs.frozen
class OpenedCheckpoint:
    """A checkpoint with the run that wrote it rebuilt: what eval, generate and cam start from."""

    file: str
    tensors: dict[str, np.ndarray]
    meta: dict[str, Any]
    run: Run
    spec: NetSpec

    def weights(self, prefix: str, names: Sequence[str]) -> list[np.ndarray]:
        try:
            return [self.tensors[f"{prefix}/{n}"] for n in names]
        except KeyError as e:
            raise DataError(f"checkpoint {self.file} lacks tensor {e.args[0]}") from None

    def region_weights(self, region: str) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
        """(the region, resolved; its θ; its BN statistics) for scoring or sampling: `live` is θ with the
        running statistics, `ema` the shadow E (found through the state layout, never by position) with
        the shadow's own statistics, `auto` the shadow when the variant keeps one."""
        if region not in REGIONS:
            raise UnsupportedSpec(f"region {region!r}; expected one of {list(REGIONS)}")
        run, layout = self.run, self.run.state_layout
        if region == "auto":  # the shadow when the variant keeps one: what its training run reported first
            region = "ema" if layout.shadows else "live"
        if region == "ema" and not layout.shadows:
            raise DataError(f"checkpoint {self.file} has no EMA shadow (its variant {run.variant.slug!r} keeps "
                            "none); use --region live")
        names = [n for n, _ in self.spec.params()]
        if region == "live":
            return region, self.weights("param", names), self.weights(ckpt.STATS, run.stat_names)
        return region, self.weights(f"state/{SHADOW}", names), \
            ckpt.shadow_stats(self.tensors, run.stat_names, self.file, "use the live weights (--region live)")


def open_checkpoint(path: str, backend: str | None = None,
                    log: Callable[[str], None] = print, devices: int | None = None) -> OpenedCheckpoint:
    """A run directory's (or a file's) checkpoint, its run rebuilt from the stored config
    (on `backend` if given, with `devices` devices if given), refused if the net as defined now
    differs from the stored spec."""
    file = os.path.join(path, CHECKPOINT) if os.path.isdir(path) else path
    tensors, meta = ckpt.load_checkpoint(file)
    cfg = ckpt.config_from(file, TrainConfig, meta["config"])
    if backend and backend != cfg.backend:
        cfg = attrs.evolve(cfg, backend=backend)
    if devices:
        cfg = attrs.evolve(cfg, devices=devices)
    try:
        run = Run(cfg, log, progress=False)
    except HloforgeError as e:  # the stored config's net, variant or data refused: say whose config it is
        raise type(e)(f"checkpoint {file}: {e}") from None
    spec = NetSpec.from_dict(meta["spec"], source=file)
    if spec != run.spec:
        raise DataError(f"checkpoint {file} holds a spec that differs from net {cfg.net!r} as defined now "
                        f"({ckpt.first_difference(spec.to_dict(), run.spec.to_dict())})")
    # what the tensors were trained as, against what the config makes (a field newer than the checkpoint aside)
    made = attrs.asdict(run.variant)
    if any(k not in made or made[k] != v for k, v in meta["variant"].items()):
        raise DataError(f"checkpoint {file}: its variant differs from the one its config makes "
                        f"({ckpt.first_difference(meta['variant'], {k: made.get(k) for k in meta['variant']})}); "
                        "tampered")
    # every consumer (eval, sample, generate, cam, detect) reads tensors of the layout, shapes and dtype checked
    run.state_layout.check_slots(f"checkpoint {file}", list(tensors))
    ckpt.check_tensors(file, tensors, *run.expected_tensors())
    return OpenedCheckpoint(file, tensors, meta, run, spec)


def evaluate_checkpoint(path: str, backend: str | None = None, region: str = "live",
                        log: Callable[[str], None] = print, replicas: int = 1,
                        devices: int | None = None) -> EvalResult:
    """Score a run directory's (or a file's) checkpoint alone, with the training run's batching.
    `region` picks the weights: the live ones, or the EMA shadow of an EMA variant. `replicas` > 1
    scores sharded over that many devices (the training batch split over them), with the same
    result as one device: the same eval loop, the logits gathered in row order."""
    if region not in REGIONS:
        raise UnsupportedSpec(f"region {region!r}; expected one of {list(REGIONS)}")
    oc = open_checkpoint(path, backend, log, devices)
    run, spec, meta, cfg = oc.run, oc.spec, oc.meta, oc.run.cfg
    # each region with its own BN statistics: the live weights with the running ones, the shadow with its EMA
    region, params, running = oc.region_weights(region)
    evaluator = make_forward_session(spec, -(-cfg.batch // replicas), run.backend, replicas)
    buffers = [*params, *running]  # host arrays: the session pushes them to its device(s) once
    if run.lm:
        lres = evaluate_lm(evaluator, buffers, run.x_te, run.y_te)
        log(f"{spec.name} epoch {meta['epoch']} ({region}) on {run.backend.backend_name()}: val {lres.line()}")
        return lres  # type: ignore[return-value]
    if run.task is not None and run.task.kind != "class":
        ev = run.task.evaluate(evaluator, buffers)
        log(f"{spec.name} epoch {meta['epoch']} ({region}) on {run.backend.backend_name()}: {ev.line}")
        return ev  # type: ignore[return-value]
    # the training run's eval pass: streamed when it streamed (the split is never loaded whole)
    res = (evaluate_stream(evaluator, buffers, run.feed.eval_batches(), len(run.y_te)) if run.feed.streams
           else evaluate(evaluator, buffers, run.x_te, run.y_te))
    log(f"{spec.name} epoch {meta['epoch']} ({region}) on {run.backend.backend_name()}: test {res.line()}")
    return res
