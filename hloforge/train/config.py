"""A training run's config: TrainConfig, read from and written to TOML (config.toml in a run directory),
and the names of the files a run directory holds.

A run directory holds config.toml (the whole resolved config: `--config` on it
reproduces the run), metrics.jsonl, checkpoint.safetensors, eval_correct.npz
(the per-example bitmap of the last eval) and loss/accuracy plots, each replaced whole, and
`.lock`, held by the one process training into it (hloforge.train.rundir).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Collection
from typing import Any

import attrs

from hloforge.core.contracts import constructor_options
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.regions import DEFAULT_REGION, check_region
from hloforge.core.registry import hloforge_version, near_name
from hloforge.core.spec import SPEC_KEYS, NetSpec
from hloforge.core.variant import Variant, VariantFields
from hloforge.train.configio import as_tuple, check_fields, toml_value
from hloforge.train.schedule import SCHEDULES, warmup_updates

CHECKPOINT = "checkpoint.safetensors"
CONFIG = "config.toml"
BITMAP = "eval_correct.npz"

# A count that starts processes or devices (--workers, --devices, and a config's): a typo of a few digits must not
# fork a million producers or ask the XLA CPU plugin for a million devices.
MAX_PROCESSES = 1024


TAG_FORBIDDEN = ("/", "\\", "\0")  # a tag with these would name a directory elsewhere than under runs/ (or none)


@attrs.frozen
class TrainConfig(VariantFields):
    """A run's options. Its variant keys (optimizer, weight_decay, label_smoothing, ema, ..., precision) are
    VariantFields', inherited: a field added to the Variant is a config key here with no other edit."""

    net: str = attrs.field(default="mnist-mlp", converter=lambda v: spec_path(v))
    classes: int | None = None  # override a zoo net's class count
    input: tuple[int, ...] | None = attrs.field(default=None,
                                                converter=lambda v: None if v is None else as_tuple(v, "input"))
    data: str = "digits"
    # the paths a run reads are kept absolute, so its config.toml names them for eval and --resume from any
    # folder: a dataset's directory, a file-based dataset's file (e.g. text's UTF-8 corpus)
    data_dir: str = attrs.field(default="", converter=lambda v: absolute(v))
    data_file: str = attrs.field(default="", converter=lambda v: absolute(v))
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
    lr: float = 1e-3
    schedule: str = "cosine"
    warmup_epochs: float = 0.0
    decay_rate: float = 0.97
    decay_epochs: float = 1.0  # --schedule exp: the lr is ×decay_rate every decay_epochs epochs
    # the Variant's, but empty by default: the one the net and dataset call for (hloforge.train.tasks.default_loss)
    loss: str = ""
    # a DDPM's linear β schedule (hloforge.train.diffusion); sampling reads it back from the checkpoint
    diffusion_steps: int = 1000
    beta_start: float = 1e-4
    beta_end: float = 0.02
    # the weights a new run starts from (hloforge.train.finetune): a run directory, a checkpoint file or an
    # export directory; its optimizer state is not taken. Kept with the run; --resume reads its own checkpoint.
    init: str = ""
    # which of an hloforge checkpoint's weights `init` takes: auto (its EMA shadow where the run kept one, the
    # weights `hloforge eval` scored), live or ema
    init_region: str = DEFAULT_REGION
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
    tuned: tuple[str, ...] = attrs.field(default=(),
                                         converter=lambda v: (v,) if isinstance(v, str) else as_tuple(v, "tuned"))

    def __attrs_post_init__(self) -> None:
        check_fields(self)
        self.check()  # its own lines first (lr must be positive, …), then every number finite and ≥ 0
        check_fields(self, numbers=True)

    @classmethod
    def checked(cls, owner: str, **values: Any) -> TrainConfig:
        """TrainConfig(**values), a value its field checks refuse said as `owner`'s keyword as the user wrote it
        (`Model option lr=1e-50: ...`), not as a config file's key."""
        try:
            return cls(**values)
        except UnsupportedSpec as e:
            if not hasattr(e, "field"):  # a check of its own (lr must be positive, ...): said in the option's name
                raise
            name, v, expected = e.field
            raise UnsupportedSpec(f"{owner} option {name}={v!r}: expected {expected}") from None

    def variant(self, spec: NetSpec | None = None) -> Variant:
        """The loss: `loss` if given, else the net's and dataset's (tokenCrossEntropy for per-token logits,
        crossEntropy for classes, perPixelCE for masks, mse for a DDPM, a detector head's yolov1 or fpnYolo:
        hloforge.train.tasks)."""
        from hloforge.train.tasks import default_loss

        loss = self.loss or ("crossEntropy" if spec is None else default_loss(spec, self.data))
        fields = {f.name: getattr(self, f.name) for f in attrs.fields(VariantFields)}
        return Variant(**{**fields, "loss": loss})

    def scope(self, spec: NetSpec) -> str:
        """Net, variant, backend and tag: two arms of an ablation never share a run directory."""
        dp = f"dp{self.replicas}" + ("syncbn" if self.sync_bn else "") if self.replicas > 1 else ""
        return "_".join(p for p in (spec.ident, self.variant(spec).slug, dp, self.backend, self.tag) if p)

    def resolved_run_dir(self, spec: NetSpec, resume: bool = False) -> str:
        """An explicit run_dir as given; otherwise runs/<scope>, runs/<scope>_2, ...: a new run takes
        the one after the last that holds a checkpoint (nothing is overwritten; one a run left without a
        checkpoint is taken again). A resumed run takes the newest, the one the last new run took: that
        next directory where it exists (a run stopped before its first checkpoint, which the trainer
        refuses, saying so), else the last holding a checkpoint."""
        if self.run_dir:
            return self.run_dir
        base = os.path.join("runs", self.scope(spec))
        named = [base] + [f"{base}_{i}" for i in range(2, 10_000)]
        # after the last directory holding a checkpoint (not the count of them: one deleted between others)
        last = max((k for k, d in enumerate(named) if os.path.exists(os.path.join(d, CHECKPOINT))), default=-1)
        after = named[last + 1]
        # not the last checkpoint when a newer run sits after it: resuming that older, finished run would
        # extend it (overwriting its checkpoint) and leave the interrupted one behind
        return named[last] if resume and last >= 0 and not os.path.isdir(after) else after

    def to_toml(self) -> str:
        """The config as TOML that `load_config` reads back to an equal config (None: left out), under a
        comment naming the hloforge release that wrote it."""
        return f"# hloforge {hloforge_version()}\n" + "".join(
            f"{f.name} = {toml_value(getattr(self, f.name))}\n" for f in attrs.fields(TrainConfig)
            if getattr(self, f.name) is not None)

    def check(self, training: bool = False) -> None:
        """The options' own ranges and combinations; `training`: also what only a run that trains refuses (a
        config that names a run to score or save may carry any epochs): a warm-up of its epochs or more,
        which never reaches the lr. `epochs` is the run's total (a resumed run's schedule counts from its
        start), a Model's fit's its own."""
        if set(self.tag) & set(TAG_FORBIDDEN) or self.tag.startswith("."):  # it ends a directory's name under runs/
            raise UnsupportedSpec(f"tag {self.tag!r}: expected a name without {' '.join(map(repr, TAG_FORBIDDEN))} "
                                  "that does not start with '.' (it ends the run directory's name under runs/)")
        check_region(self.init_region, "init_region")
        if self.init_region != DEFAULT_REGION and not self.init:
            raise UnsupportedSpec(f"init_region {self.init_region!r} picks which of --init's weights a new run "
                                  "starts from; give --init too")
        for key in ("epochs", "batch"):  # the one that is wrong named alone
            if getattr(self, key) < 1:
                raise UnsupportedSpec(f"{key} must be a positive integer, got {getattr(self, key)}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise UnsupportedSpec(f"lr must be a positive number, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise UnsupportedSpec(f"unknown schedule {self.schedule!r}; expected one of {list(SCHEDULES)}")
        if not 0.0 < self.decay_rate <= 1.0:
            raise UnsupportedSpec(f"decay_rate must be in (0, 1], got {self.decay_rate}")
        if not self.decay_epochs > 0.0:
            raise UnsupportedSpec(f"decay_epochs must be positive, got {self.decay_epochs}")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise UnsupportedSpec(f"bn_momentum must be in [0, 1), got {self.bn_momentum}")
        # the XLA CPU client takes a 32-bit device count: 2**31 aborts the process, 2**32 wraps to the default
        if self.replicas < 1:
            raise UnsupportedSpec(f"replicas must be positive, got {self.replicas}")
        # the command line's bounds too, so a config.toml cannot fork 1500 producers or ask for 2000 devices
        if self.devices is not None and not 1 <= self.devices <= MAX_PROCESSES:  # None: one per replica
            raise UnsupportedSpec(f"devices must be from 1 to {MAX_PROCESSES}, got {self.devices}")
        if not 0 <= self.workers <= MAX_PROCESSES:
            raise UnsupportedSpec(f"workers must be from 0 to {MAX_PROCESSES}, got {self.workers}")
        if self.batch % self.replicas:
            raise UnsupportedSpec(f"batch {self.batch} (the global batch) does not split evenly over "
                                  f"{self.replicas} replicas")
        if self.sync_bn and self.replicas == 1 and launched_processes() == 1:  # MPI: the processes pool it
            raise UnsupportedSpec("sync_bn pools BN statistics across replicas; it needs replicas > 1")
        if training and self.warmup_epochs and self.warmup_epochs >= self.epochs:
            raise UnsupportedSpec(f"warmup_epochs {self.warmup_epochs:g} is not fewer than the run's {self.epochs} "
                                  f"epochs, so the lr would never reach {self.lr:g}; expected fewer warm-up epochs "
                                  "than epochs")

    def check_steps(self, accum: int, steps: int, rows: int, training: bool = True) -> None:
        """What the options refuse of the training split's batches (`steps` an epoch, of its `rows`): none at all,
        an epoch that does not end on an applied update, and (`training`) a warm-up worth no whole update."""
        if steps == 0 and training:
            # "examples": a language model's are windows of its corpus, a DDPM's or a classifier's images
            raise DataError(f"batch {self.batch} is larger than the {rows}-example training split"
                            + (f" shared by {self.workers} workers" if self.workers else
                               f"; expected a batch of at most {rows}"))
        if steps % accum:
            # An epoch must end on an applied update, or its checkpoint would hold a half-full accumulator.
            raise UnsupportedSpec(f"accum {accum}: the {steps} batches of an epoch do not divide into updates of "
                                  f"{accum} micro-batches; pick a batch size or accum that divides them")
        if training:
            warmup_updates(self.warmup_epochs, steps // accum)

    def check_bn(self, spec: NetSpec) -> None:
        """sync_bn or a bn_momentum other than the default, refused on a net without BatchNorm statistics."""
        said = [k for k in ("sync_bn", "bn_momentum") if getattr(self, k) != attrs.fields_dict(TrainConfig)[k].default]
        if said and not spec.stats():
            what = " and ".join("sync_bn" if k == "sync_bn" else f"bn_momentum {self.bn_momentum:g}" for k in said)
            raise UnsupportedSpec(f"{what}: net {spec.name!r} has no BatchNorm")

    def check_net(self, variant: Variant, spec: NetSpec, training: bool = True) -> None:
        """What the options refuse of the net they train (`variant` and `spec` the run's, the variant applied):
        an optimizer or loss no plugin registers (or options it does not take), fp8's, and (`training`)
        BatchNorm's options on a net without it, as the Variant refuses bn_eps there: an option that would do
        nothing is a mistake said, not taken unsaid (a run's own config is scored as it is). Each rank of an
        MPI run refuses them alike, so the trainer says them once."""
        from hloforge.core.registry import default_registry

        variant.make_optimizer(default_registry())
        variant.make_loss(default_registry())
        if training:
            self.check_bn(spec)
        if variant.precision == "fp8":
            from hloforge.train import fp8

            fp8.check_variant(variant, spec)
            if self.replicas > 1:
                raise UnsupportedSpec("precision fp8 runs on one replica (its master weights live on the host)")


def absolute(path: Any) -> Any:
    """A file a run reads, made absolute when its config is made, so the config.toml it writes names it for
    `hloforge eval` and `--resume` from another folder. An old run's relative path resolves from the current
    folder, as the dataset resolved it before; "" (none) and a non-string (refused by check_fields) as given."""
    return os.path.abspath(path) if isinstance(path, str) and path else path


def spec_path(net: Any) -> Any:
    """A net given as a spec file, its path made absolute as `absolute` makes a data path (and hf.Model names it),
    so `--config` on the run's config.toml reads it from another folder; a zoo name as given."""
    from hloforge.zoo import SPEC_SUFFIXES

    return absolute(net) if isinstance(net, str) and net.endswith(SPEC_SUFFIXES) else net


def launched_processes() -> int:
    """How many processes an MPI launcher started (1 for a plain run): --replicas defaults to one each."""
    from hloforge.core.launcher import launched

    return launched()[1]


def load_config(path: str, **overrides: Any) -> TrainConfig:
    """A config file (TOML), with command-line values on top."""
    d = read_toml(path)
    if not d:  # a file not saved, or the wrong one: not train's defaults all through, run as if it were the config
        raise UnsupportedSpec(f"config {path} sets nothing (it is empty); expected train's options, as a run's "
                              "config.toml holds them (net = \"...\", epochs = ..., ...)")
    return config_of(d, path, **overrides)


def read_toml(path: str) -> dict[str, Any]:
    """A config file's table, or its refusal in one line."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except IsADirectoryError:  # a run directory, most likely: its config is the file in it
        own = os.path.join(path, CONFIG)
        raise UnsupportedSpec(f"config {path} is a directory; expected a config file (TOML)"
                              + (f": the run's own is {own}" if os.path.isfile(own) else "")) from None
    except OSError as e:  # no such file, no permission: the OS's reason, not a TOML error with its errno
        raise UnsupportedSpec(f"config {path}: {(e.strerror or str(e)).lower()}; expected a config file (TOML), "
                              "as a run's config.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise UnsupportedSpec(f"config {path}: cannot read it as TOML ({e})") from None


def config_of(d: dict[str, Any], path: str, **overrides: Any) -> TrainConfig:
    """The config a table read from `path` holds, with command-line values on top."""
    known = {f.name for f in attrs.fields(TrainConfig)}
    unknown = sorted(set(d) - known)
    if unknown and set(SPEC_KEYS) <= set(d):  # a net's spec file, given where a config goes
        raise UnsupportedSpec(f"config {path} is a net's spec file ({', '.join(SPEC_KEYS)}), not train's options; "
                              f"give it as the net (`hloforge train {path}`), or name it in a config: net = \"{path}\"")
    if unknown:
        # a flag's spelling (data-dir) or a typo (sed) named for what it likely is, as a spec's keys are
        near = near_name(unknown[0].replace("-", "_"), known) if len(unknown) == 1 else ""
        raise UnsupportedSpec(f"config {path}: unknown key(s) {unknown}; expected some of {sorted(known)}{near}")
    if "data_options" in overrides and "data_options" in d:  # --data-opt adds to the file's options (later wins)
        overrides["data_options"] = (*option_items(d["data_options"]), *option_items(overrides["data_options"]))
    return TrainConfig(**{**d, **overrides})


def option_items(v: Any) -> tuple[str, ...]:
    """`data_options` as its "key=value" items: a list of them, or one "key=value,…" string."""
    if isinstance(v, str):
        return tuple(p.strip() for p in v.split(",") if p.strip())
    return tuple(str(p).strip() for p in as_tuple(v, "data_options"))


def file_fields(items: Any) -> dict[str, Any]:
    """`data_options` items as a config's fields: a data_dir or data_file item (a Model's fit records them so)
    as its own field, which `hloforge eval --data-dir/--data-file` replace where the data moved; the rest as
    data_options."""
    rest, files = [], {}
    for item in option_items(items):
        key, _, value = (s.strip() for s in item.partition("="))
        if key in ("data_dir", "data_file") and value:
            files[key] = value
        else:
            rest.append(item)
    return {**files, "data_options": tuple(rest)}


def parse_data_options(items: Any, what: str = "data option", once: bool = False) -> dict[str, Any]:
    """`data_options` ("key=value" items) as the dataset's keyword arguments, a later key over an
    earlier one (`once`: a key given twice refused): each value an int, else a float, else true/false,
    else the string as written."""
    opts: dict[str, Any] = {}
    for item in option_items(items):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if eq and key and not raw:  # `logdir=`: a key whose value was left out, not a malformed item
            raise UnsupportedSpec(f"{what} {item!r} gives {key} no value; expected {key}=VALUE")
        if not eq or not key:
            raise UnsupportedSpec(f"{what} {item!r} is not KEY=VALUE")
        if once and key in opts:
            raise UnsupportedSpec(f"{what} {key} given twice ({key}={opts[key]}, then {item}); expected each once")
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


def lm_seq_len(opts: dict[str, Any], spec: NetSpec, data_cls: Any, data: str) -> int:
    """The windows language model `spec` reads from dataset `data` (its class or instance): the net's
    context. A dataset without token labels, or a `seq_len` data option of another length, is refused:
    the option is never overridden unseen (the net's input length is what reshapes the windows)."""
    if getattr(data_cls, "label_kind", "class") != "tokens":
        raise DataError(f"net {spec.name!r} is a language model (per-token logits); dataset {data!r} has no token "
                        "labels — use --data text")
    context = int(spec.input_shape[0])
    asked = opts.get("seq_len", context)
    if asked != context:
        other = f"; a net of another context: --input {asked}" if isinstance(asked, int) and asked > 0 else ""
        raise DataError(f"data option seq_len={asked}: a language model's windows are its context, {context} "
                        f"tokens for net {spec.name!r}{other}")
    return context


RunRecord = tuple[str, dict[str, Any] | None]
"""What a resume reads of its run directory (run_record): the directory and its config.toml's table, None
where it holds no checkpoint."""


def run_record(cfg: TrainConfig) -> RunRecord:
    """The run directory `hloforge train --resume` with `cfg` continues, and its config.toml as read. A
    checkpoint without its config.toml is refused: the defaults would stand in for the run's own settings,
    a plausible and wrong resume. Under MPI rank 0 alone reads it (the others' machines may not hold it)."""
    from hloforge.backends.base import backend_name
    from hloforge.zoo import get_net

    spec = get_net(cfg.net, cfg.classes, cfg.input)
    named = attrs.evolve(cfg, backend=backend_name(cfg.backend))
    run_dir = named.resolved_run_dir(named.variant(spec).apply_to(spec), resume=True)
    path = os.path.join(run_dir, CONFIG)
    if not os.path.exists(os.path.join(run_dir, CHECKPOINT)):
        return run_dir, None
    if not os.path.exists(path):
        raise DataError(f"run directory {run_dir} holds a checkpoint but no {CONFIG}, so the run's own settings "
                        f"(lr, schedule, seed, ...) are not known; restore its {CONFIG} to resume it, or start a new "
                        "run from its weights with --init")
    return run_dir, read_toml(path)


def resumed_config(cfg: TrainConfig, given: Collection[str], record: RunRecord | None = None) -> TrainConfig:
    """What `hloforge train --resume` continues: the run directory's own config.toml (`record`, read here
    where None) with `cfg`'s values for the fields in `given` (the flags on the command line) on top, so a
    flag left out keeps the run's value, not the default. Another batch or data is refused
    (KEPT_ON_RESUME): the run's steps and schedule are counted in its batches, its checkpoint and metrics
    are of its data. With no checkpoint there, `cfg` (the trainer then says what there is to resume, not
    this check of a run that has nothing to resume)."""
    run_dir, table = run_record(cfg) if record is None else record
    if table is None:
        return cfg
    path = os.path.join(run_dir, CONFIG)
    recorded = config_of(table, path)
    resumed = config_of(table, path, **{name: getattr(cfg, name) for name in given})
    for name, (flag, what, why) in KEPT_ON_RESUME.items():  # before anything is read, compiled or written
        was, now = getattr(recorded, name), getattr(resumed, name)
        if name == "data_options":  # --data-opt adds to the run's own: refused where it changes one
            was, now = parse_data_options(was), parse_data_options(now)
        elif name in ("data_dir", "data_file") and not (was and os.path.exists(was)):
            continue  # the run's data moved (or was the dataset's default): restore checks its test split
        if name in given and was != now:
            given_as = getattr(cfg, name)
            given_as = " ".join(given_as) if isinstance(given_as, tuple) else given_as
            raise UnsupportedSpec(f"{flag} {given_as}: the run in {run_dir} trains with {what} "
                                  f"{shown(getattr(recorded, name))} (its config.toml), and {why}; resume with "
                                  f"the run's {what}, or start a new run")
    return resumed


# What `--resume` refuses to change, by field: (its flag, what it is, why the run depends on it). One check
# (resumed_config) for all of them; the data ones come first in the run's refusals, before its checkpoint's
# step is compared with this run's epochs (rundir.check_steps), which another data size would also fail.
OF_ITS_DATA = "its checkpoint and metrics are of that data"
KEPT_ON_RESUME = {
    "batch": ("--batch", "batch", "its steps and schedule are counted in those"),
    "data": ("--data", "dataset", OF_ITS_DATA),
    "data_dir": ("--data-dir", "data directory", OF_ITS_DATA + " (another is taken where that one has moved away)"),
    "data_file": ("--data-file", "data file", OF_ITS_DATA + " (another is taken where that one has moved away)"),
    "data_options": ("--data-opt", "data options", OF_ITS_DATA),
}


def shown(v: Any) -> str:
    """A config value as a refusal says it: a name quoted, a path as it is, options as KEY=VALUE items."""
    if isinstance(v, tuple):
        return " ".join(v) or "none"
    return repr(v) if isinstance(v, str) and not os.path.isabs(v) else str(v)


DATA_PATH_FLAGS = {"data_dir": "--data-dir", "data_file": "--data-file"}


def data_path_options(cfg: TrainConfig, dataset: type | None) -> dict[str, str]:
    """The dataset options --data-dir and --data-file give. One the dataset (its class, when known) does not
    take is refused naming the flag: the dataset's own refusal names an option the user never wrote."""
    opts = {k: getattr(cfg, k) for k in DATA_PATH_FLAGS if getattr(cfg, k)}
    takes = constructor_options(dataset)[0] if dataset is not None else list(opts)
    for k, v in opts.items():
        if k not in takes:
            other = [f for o, f in DATA_PATH_FLAGS.items() if o != k and o in takes]
            raise UnsupportedSpec(f"{DATA_PATH_FLAGS[k]} {v}: dataset {cfg.data!r} reads no {k.replace('_', ' ')} "
                                  f"(its options are {takes}); expected " + (f"{other[0]} for it" if other else
                                                                             f"no {DATA_PATH_FLAGS[k]} for it"))
    return opts
