"""Opening a run's checkpoint with the run that wrote it rebuilt: what eval, detect, sample, generate and
cam start from. Above the loop: it rebuilds a Run; nothing in the loop imports it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.commands.resolution import check_size_crop, scoring_size
from hloforge.core.errors import DataError, HloforgeError, SettingError, UnsupportedSpec
from hloforge.core.regions import DEFAULT_REGION, check_region
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.train import checkpoint as ckpt
from hloforge.train.arraydata import ARRAYS, check_dataset_kind, check_input_kind, no_rows, saved_inputs
from hloforge.train.config import BITMAP, CHECKPOINT, CONFIG, TrainConfig, data_path_options, load_config
from hloforge.train.curves import PNG
from hloforge.train.evaluation import EvalResult, evaluate, evaluate_lm, evaluate_stream
from hloforge.train.finetune import EXPORT_MANIFEST
from hloforge.train.metrics import check_eval_set
from hloforge.train.parallel import make_forward_session
from hloforge.train.rundir import METRICS, RUN_ID, check_matches, own_spec
from hloforge.train.session import ForwardSession, make_backend, replica_devices
from hloforge.train.tasks import ClassCountMismatch
from hloforge.train.trainer import Run
from hloforge.zoo import get_net


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
            return [self.tensors[t] for t in ckpt.names_in(prefix, names)]
        except KeyError as e:
            raise DataError(f"checkpoint {self.file} lacks tensor {e.args[0]}") from None

    def check_input(self, given: Any, x: np.ndarray, what: str, otherwise: str) -> None:
        """Refuse an input (`given` as the user gave it; `x` its float32 form) of another kind than the model
        was trained on (raw uint8 pixels to a net fit on standardised images), by the rule predict applies
        (hf.load(RUN).predict), so a command never answers for input the model never saw the like of."""
        check_input_kind(saved_inputs(self.file, self.meta, self.run.cfg.data, self.spec), np.asarray(given), x,
                         what, otherwise)

    def region_weights(self, region: str) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
        """(the region, resolved; its θ; its BN statistics) for scoring or sampling (ckpt.region_weights:
        live, ema or auto, the meaning `Model.evaluate` shares)."""
        run = self.run
        return ckpt.region_weights(self.tensors, region, [n for n, _ in self.spec.params()], run.stat_names,
                                   run.frozen, run.state_layout.shadows, f"checkpoint {self.file}", run.variant.slug,
                                   "--region live")


def check_run_dir(path: str, file: str, meta: dict[str, Any]) -> None:
    """A run directory whose config.toml names another net or variant than its checkpoint holds is
    refused, as --resume refuses it: scoring it would report the checkpoint's net as the run's."""
    cfg = load_config(os.path.join(path, CONFIG))
    spec = own_spec(cfg.net, NetSpec.from_dict(meta["spec"], source=file)) or get_net(cfg.net, cfg.classes, cfg.input)
    variant = cfg.variant(spec)
    try:
        check_matches(file, meta, variant.apply_to(spec), variant, cfg.backend, allow_cross_backend=True)
    except DataError as e:
        raise DataError(f"run directory {path}: its config.toml and checkpoint disagree: {e}") from None


# the paths a run's config records for its data, and the flag that names where each is now
DATA_PATHS = {"data_dir": "--data-dir", "data_file": "--data-file"}


def moved_data_hint(cfg: TrainConfig) -> str:
    """For a refusal opening a run: the flag that says where its data is now, when a path its config
    records is gone ("" when none is)."""
    gone = [flag for k, flag in DATA_PATHS.items() if getattr(cfg, k) and not os.path.exists(getattr(cfg, k))]
    return f"; if the run's data moved, give where it is now with {gone[0]}" if gone else ""


def no_checkpoint(path: str, or_file: bool = True) -> DataError:
    """A directory given for a run that holds no checkpoint, said with what it holds instead (an export, runs);
    `or_file`: a checkpoint file would do too (the commands; hf.load takes a directory)."""
    runs = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, CHECKPOINT)))
    if os.path.isfile(os.path.join(path, EXPORT_MANIFEST)):
        what = "; it is an export (manifest.json), whose weights `train --init` reads"
    elif os.path.isfile(os.path.join(path, CONFIG)):  # a run stopped (or still running) before its first checkpoint
        what = ("; it is a run with no checkpoint yet: one is written as each epoch ends, so a run stopped before "
                "its first epoch ended kept none (train it again; one still running has one after that epoch)")
    elif runs:
        what = f"; it holds run directories: {', '.join(os.path.join(path, r) for r in runs[:4])}" + \
            (f" and {len(runs) - 4} more" if len(runs) > 4 else "")
    else:
        what = ""
    return DataError(f"{path} holds no {CHECKPOINT}; expected a run directory (that hloforge train, import-weights "
                     f"or Model.save wrote){' or a checkpoint file' if or_file else ''}{what}")


def check_batch_stats(spec: NetSpec, batch: int, rows: int) -> None:
    """`eval --batch-stats` refused where it cannot differ from plain eval (no BatchNorm), or where the run's
    batches leave a padded last one (its zeros would shift the real rows' statistics)."""
    if not spec.stats():
        raise UnsupportedSpec(f"--batch-stats: net {spec.name!r} keeps no BatchNorm statistics, so it would score as "
                              "plain eval does; expected a net with BatchNorm")
    if rows % batch:
        fits = [b for b in range(2, rows + 1) if rows % b == 0 and b != batch]
        near = sorted(fits, key=lambda b: (abs(b - batch), b))[:4]
        raise UnsupportedSpec(f"--batch-stats scores in batches of {batch}, and the test split's {rows} rows "
                              f"leave a last batch of {rows % batch} whose zero padding would shift the real rows' "
                              f"statistics; expected a --batch dividing {rows} "
                              f"(such as {', '.join(map(str, sorted(near)))})")


@attrs.frozen
class NoBackend:
    """The run's backend by name alone, where nothing is compiled or run (`open_checkpoint(runs=False)`)."""

    name: str


def open_checkpoint(path: str, backend: str | None = None, log: Callable[[str], None] = print,
                    devices: int | None = None, needs_data: bool = True, data_dir: str | None = None,
                    data_file: str | None = None, replicas: int = 1, runs: bool = True) -> OpenedCheckpoint:
    """A run directory's (or a file's) checkpoint, its run rebuilt from the stored config
    (on `backend` if given, else the run's own, with `devices` devices if given, else those `replicas`
    ask of that backend: `replica_devices`), refused if the net as defined now
    differs from the stored spec. A run trained on the user's arrays (no registered dataset) is
    refused where the caller `needs_data`; else (export) it opens on no rows. `data_dir`, `data_file`:
    where the run's data is now, when it moved since (its test split is still checked against the run's).
    `runs` False (export: its net and weights alone): no backend is made, so the run's need not be installed."""
    file = os.path.join(path, CHECKPOINT) if os.path.isdir(path) else path
    if os.path.isdir(path) and not os.path.exists(file):
        raise no_checkpoint(path)
    run = os.path.dirname(path) or "."
    if (os.path.basename(path) in (CONFIG, BITMAP, METRICS, PNG, RUN_ID)  # a run's own file, tab-completed
            and os.path.isfile(path) and os.path.isfile(os.path.join(run, CHECKPOINT))):
        raise DataError(f"{path} is a file of run directory {run}, not a checkpoint; expected the run directory "
                        f"({run}) or its {CHECKPOINT}")
    tensors, meta = ckpt.load_checkpoint(file)
    if os.path.isdir(path) and os.path.exists(os.path.join(path, CONFIG)):
        check_run_dir(path, file, meta)
    cfg = ckpt.config_from(file, TrainConfig, meta["config"])
    if backend and backend != cfg.backend:
        cfg = attrs.evolve(cfg, backend=backend)
    devices = replica_devices(cfg.backend, replicas, devices)  # the backend the run opens on, not $HLOFORGE_BACKEND
    # The caller's backend or device count is made here, so its refusal (an unknown name, IREE given a device
    # count) reads as the caller's options, not as a fault of the checkpoint's config.
    chosen = make_backend(cfg.backend, **({"devices": devices} if devices else {})) if backend or devices else None
    if not runs:
        chosen = NoBackend(cfg.backend)
    moved = {k: v for k, v in (("data_dir", data_dir), ("data_file", data_file)) if v}
    if moved:
        cfg = attrs.evolve(cfg, **moved)
        if cfg.data != ARRAYS and cfg.data in default_registry().names("dataset"):  # this command's flag, in its words
            data_path_options(cfg, default_registry().get("dataset", cfg.data))
    spec = NetSpec.from_dict(meta["spec"], source=file)
    arrays, where = None, path if os.path.isdir(path) else os.path.dirname(file) or "."
    if cfg.data == ARRAYS:
        if needs_data:
            raise DataError(f"{where} was trained on arrays, not a registered dataset, so it has no test split to "
                            f"read; score it with hf.load({where!r}).evaluate(x, y), or name a dataset its net fits "
                            f"with hf.load({where!r}).save({where!r}, data=NAME, overwrite=True)")
        arrays = no_rows(spec, cfg.variant(spec))
    elif needs_data:  # a model fit on uint8 pixels, saved naming a dataset (refused since): its images are standardised
        check_dataset_kind(saved_inputs(file, meta, cfg.data, spec), cfg.data, spec, f"checkpoint {file}: scoring it "
                           "on", f"score it with hf.load({where!r}).evaluate(x, y) on x of its kind")
    try:  # scoring never opens the train split
        run = Run(cfg, log, progress=False, eval_only=True, spec=own_spec(cfg.net, spec), data=arrays, backend=chosen)
    except SettingError:  # an environment variable's, named by itself: no fault of the checkpoint's
        raise
    except HloforgeError as e:  # the stored config's net, variant or data refused: say whose config it is
        said = str(e)
        if isinstance(e, ClassCountMismatch):  # not '--classes N', which shapes a net to train, not a checkpoint
            said = f"{e.stated}: expected the data it was trained on, of {spec.num_classes} classes"
        raise type(e)(f"checkpoint {file}: {said}{'' if moved else moved_data_hint(cfg)}") from None  # not twice
    if spec != run.spec:
        raise DataError(f"checkpoint {file} holds a spec that differs from net {cfg.net!r} as defined now "
                        f"({ckpt.first_difference(spec.to_dict(), run.spec.to_dict())})")
    check_eval_set(meta.get("eval_set"), run.eval_set, cfg.data, f"checkpoint {file}")  # the data as it reads now
    # what the tensors were trained as, against what the config makes (a field newer than the checkpoint aside)
    made = json.loads(json.dumps(attrs.asdict(run.variant)))  # as stored: tuples as lists
    if any(k not in made or made[k] != v for k, v in meta["variant"].items()):
        raise DataError(f"checkpoint {file}: its variant differs from the one its config makes "
                        f"({ckpt.first_difference(meta['variant'], {k: made.get(k) for k in meta['variant']})}); "
                        "tampered")
    # every consumer (eval, sample, generate, cam, detect) reads tensors of the layout, shapes and dtype checked
    run.state_layout.check_slots(f"checkpoint {file}", list(tensors))
    ckpt.check_tensors(file, tensors, *run.expected_tensors())
    return OpenedCheckpoint(file, tensors, meta, run, spec)


def evaluate_checkpoint(path: str, backend: str | None = None, region: str = DEFAULT_REGION,
                        log: Callable[[str], None] = print, replicas: int = 1,
                        devices: int | None = None, batch_stats: bool = False,
                        size: int | None = None, crop: float | None = None, data_dir: str | None = None,
                        data_file: str | None = None, batch: int | None = None) -> EvalResult:
    """Score a run directory's (or a file's) checkpoint alone, with the training run's batching.
    `region` picks the weights: the live ones, the EMA shadow of an EMA variant, or (the default, as
    `sample`'s) auto: the shadow when the run kept one. `replicas` > 1
    scores sharded over that many devices (the training batch split over them), with the same
    result as one device: the same eval loop, the logits gathered in row order. `batch_stats`:
    seed 003's diagnostic, BN with each batch's statistics instead of the running ones (ForwardSession).
    `size` (and `crop`): a classifier scored at size×size, its eval graph rendered there and the eval
    images resized and center-cropped to match (hloforge.commands.resolution: timm's test protocol).
    `data_dir`, `data_file`: where the run's data is now, when it moved (open_checkpoint). `batch`: score in
    batches of that many rows (default the run's), on a device the run's batch does not fit: every row is
    scored alone (a padded tail's zeros never read), so the scores are the same (but --batch-stats')."""
    check_region(region)  # a bad name is refused before anything is opened
    check_size_crop(size, crop)  # a bad value is refused before anything is opened
    oc = open_checkpoint(path, backend, log, devices, data_dir=data_dir, data_file=data_file, replicas=replicas)
    run, spec, meta, cfg = oc.run, oc.spec, oc.meta, oc.run.cfg
    batch = cfg.batch if batch is None else batch
    # each region with its own BN statistics: the live weights with the running ones, the shadow with its EMA
    region, params, running = oc.region_weights(region)
    if batch_stats and (replicas > 1 or run.lm or (run.task is not None and run.task.kind != "class")):
        raise UnsupportedSpec("--batch-stats scores a classifier on one replica; this run is "
                              + ("sharded" if replicas > 1 else "not a classifier"))
    if batch_stats:  # said here, with what would do, rather than by the session at the last batch
        check_batch_stats(spec, batch, len(run.y_te))
    at = None
    if size is not None:
        kind = "a language model" if run.lm else None if run.task is None or run.task.kind == "class" \
            else f"a {run.task.kind} task"
        if kind:
            raise UnsupportedSpec(f"--size scores an image classifier; this run is {kind}")
        at = scoring_size(spec, cfg.net, size, crop)
    net, suffix = (at.spec, at.suffix) if at else (spec, "")
    evaluator = (ForwardSession(net, batch, run.backend, batch_stats=True, suffix=suffix) if batch_stats else
                 make_forward_session(net, -(-batch // replicas), run.backend, replicas, suffix=suffix))
    buffers = [*params, *([] if batch_stats else running)]  # host arrays: the session pushes them once
    if run.lm:
        lres = evaluate_lm(evaluator, buffers, run.x_te, run.y_te)
        log(f"{spec.name} epoch {meta['epoch']} ({region}) on {run.backend.backend_name()}: val {lres.line()}")
        return lres  # type: ignore[return-value]
    if run.task is not None and run.task.kind != "class":
        ev = run.task.evaluate(evaluator, buffers)
        log(f"{spec.name} epoch {meta['epoch']} ({region}) on {run.backend.backend_name()}: {ev.line}")
        return ev  # type: ignore[return-value]
    # the training run's eval pass: streamed when it streamed (the split is never loaded whole)
    if at is None:
        res = (evaluate_stream(evaluator, buffers, run.feed.eval_batches(), len(run.y_te)) if run.feed.streams
               else evaluate(evaluator, buffers, run.x_te, run.y_te))
    else:  # the same pass over the images resized and cropped to the size
        res = (evaluate_stream(evaluator, buffers, ((at.images(x), y) for x, y in run.feed.eval_batches()),
                               len(run.y_te)) if run.feed.streams
               else evaluate(evaluator, buffers, at.images(run.x_te), run.y_te))
    stats = ", batch statistics" if batch_stats else ""
    where = f" {at.describe()}" if at else ""
    log(f"{spec.name} epoch {meta['epoch']} ({region}{stats}) on {run.backend.backend_name()}{where}: "
        f"test {res.line()}")
    return res
