"""A run directory's integrity: one trainer at a time (a lock), files replaced whole, and on resume a
metrics log cut back to the checkpoint it resumes from.

The lock is fcntl.flock on `.lock` in the run directory, held for the run's life: a second process
training into the directory is refused with one line, never interleaved; the kernel drops the lock
when the holder dies, kill -9 included, so a resume after a crash is never refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import shlex
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DISK_FULL, DataError, HloforgeError, UnsupportedSpec
from hloforge.core.paths import make_dir
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.train.checkpoint import FORMAT_FAMILY, TMP_SUFFIX, first_difference, load_meta, write_atomic
from hloforge.train.config import BITMAP, CHECKPOINT, CONFIG, TrainConfig
from hloforge.train.curves import PNG
from hloforge.train.metrics import describe_eval_set, same_eval_set
from hloforge.zoo import SPEC_SUFFIXES

LOCK = ".lock"
METRICS = "metrics.jsonl"
NET_FILE = "net.json"  # Model.save's copy of a net the zoo does not name, so `eval` rebuilds it
RUN_ID = "run-id"  # the run's identity (run_id): what marks files it writes elsewhere (TensorBoard's) as its own
# What writing a run into a directory replaces or removes there: `hloforge train`, Model.save,
# `import-weights --out DIR`, a ModelCheckpoint's copy (copy_run). What else a directory holds is left be.
RUN_FILES = (CONFIG, CHECKPOINT, METRICS, PNG, BITMAP, NET_FILE, RUN_ID)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def checked_path(path: Any, what: str) -> str:
    """A str or os.PathLike path as a str, a leading `~` expanded as a shell would (not a folder named `~`
    in the current one), refused otherwise."""
    p = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(p, str) or not p:
        raise UnsupportedSpec(f"{what} takes a path (a non-empty str or os.PathLike), got {path!r}")
    return os.path.expanduser(p)


def holds_run(path: str) -> bool:
    """Whether directory `path` holds a run, whose files a run written there may replace: an hloforge
    checkpoint (of any hloforge version), or, where there is none, the config.toml a run writes before
    its first epoch (a run stopped before its first checkpoint). A checkpoint.safetensors that is not
    hloforge's (or not safetensors) makes it no run's, whatever its config."""
    from safetensors import SafetensorError, safe_open

    ckpt = os.path.join(path, CHECKPOINT)
    if os.path.exists(ckpt):
        try:
            with safe_open(ckpt, "np") as f:
                return str((f.metadata() or {}).get("format")).startswith(FORMAT_FAMILY)
        except (SafetensorError, OSError, ValueError):
            return False
    try:
        with open(os.path.join(path, CONFIG), "rb") as f:
            d = tomllib.load(f)
    except (OSError, ValueError):  # none, unreadable, or not TOML (tomllib's error is a ValueError)
        return False
    return "net" in d and set(d) <= {f.name for f in attrs.fields(TrainConfig)}


def foreign_files(path: str) -> list[str]:
    """The files of `path` a run written there would replace or remove (RUN_FILES) that are not a run's
    (holds_run), sorted: [] for a new or empty directory, one holding a run, or one holding other files."""
    try:
        held = sorted(set(os.listdir(path)) & set(RUN_FILES))
    except OSError:  # no directory (yet), or a file: the write itself says what is wrong
        return []
    return [] if not held or holds_run(path) else held


def check_own_files(path: str, what: str, writer: str, instead: str,
                    error: type[HloforgeError] = HloforgeError) -> None:
    """Refuse, with one line naming them, a directory `path` (`what`: "run directory", "--out", ...)
    holding files `writer` would replace or delete that are not a run's (foreign_files): the user's
    own, which no overwrite option is consent to lose. Before anything is written or compiled."""
    foreign = foreign_files(path)
    if foreign:
        are = "is" if len(foreign) == 1 else "are"
        raise error(f"{what} {path} holds {', '.join(foreign)}, which {are} not a run's and which {writer} would "
                    f"replace or delete; expected a new or empty directory, or a run's: move them, or {instead}")


# what a model or weights file is named (Keras's `save("x.keras")`, torch.save's `.pt`): a directory named so is
# a save's mistake, refused while no such directory exists (one an earlier save made is still written)
FILE_SUFFIXES = (".safetensors", ".keras", ".h5", ".hdf5", ".pt", ".pth", ".ckpt", ".bin", ".npz", ".pkl", ".onnx")


def check_save_dir(path: str, what: str = "save to") -> None:
    """Refuse, in one line, a save's (`what`: "save to", "ModelCheckpoint path") directory `path` that is a file,
    or a new one named as a file."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise HloforgeError(f"cannot save to {path}: it is a file; expected a directory (new or a run's)")
    suffix = os.path.splitext(path.rstrip(os.sep))[1].lower()
    if suffix in FILE_SUFFIXES and not os.path.isdir(path):
        raise UnsupportedSpec(f"{what} {path} names a {suffix} file, but a save is a run directory (config.toml + "
                              f"checkpoint.safetensors, which holds the weights) that hf.load(DIR) reads back; "
                              f"give a directory path, e.g. {os.path.splitext(path.rstrip(os.sep))[0]!r}")


@contextmanager
def locked(run_dir: str, last_good: str, resume: bool = False) -> Iterator[None]:
    """Hold `run_dir`'s lock for the block (made, with the directory, if missing). Refused with one
    line while another process holds it, and, before anything is written (the lock file too), where
    the directory holds files not a run's that a run would replace (check_own_files; not on `resume`:
    a resumed run's directory is its checkpoint's, read and checked before anything is written). A
    block that fails before writing anything leaves no trace of a directory it made. A full disk
    anywhere in the block is one line naming `last_good`, the checkpoint that is still whole."""
    if not resume:
        if not os.path.exists(run_dir):  # a new one named as a file (`--run-dir w.safetensors`): as save refuses it
            check_save_dir(run_dir, "run directory")
        check_own_files(run_dir, "run directory", "a run written there", "give another directory")
    made = not os.path.isdir(run_dir)
    path = os.path.join(run_dir, LOCK)
    try:
        make_dir(run_dir, "run directory")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:  # a read-only mount, another user's directory: nothing was written
        if e.errno not in NOT_WRITABLE:
            raise
        raise HloforgeError(f"run directory {run_dir} is not writable ({e.strerror}); a run writes its checkpoint "
                            "and logs there: pass a writable --run-dir (a copy of this run, to resume it)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise HloforgeError(f"run directory {run_dir} is in use by another hloforge process (pid {holder}); "
                            "wait for it to end, or pass --run-dir/--tag for a new run") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # A writer's killed mid-write: the lock says no one else writes them.
        for name in (CHECKPOINT, CONFIG, BITMAP, METRICS, PNG, RUN_ID):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(run_dir, name + TMP_SUFFIX))
        yield
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        whole = f"{last_good} is whole" if os.path.exists(last_good) else "there is no checkpoint yet"
        raise HloforgeError(f"run directory {run_dir}: {e.strerror} ({e.filename or 'a write'}); {whole}; "
                            "free space and --resume") from None
    finally:
        if made and os.listdir(run_dir) == [LOCK]:
            os.remove(path)
            os.rmdir(run_dir)
        os.close(fd)  # the lock goes with the last descriptor


COPIED = (CONFIG, BITMAP, CHECKPOINT)  # what copy_run copies


def copy_run(run_dir: str, path: str) -> None:
    """`run_dir` as it is now (config, eval bitmap, checkpoint) copied to `path`. What another run left
    there beside them (its metrics, curves; an eval bitmap this run has not written yet) goes, as
    Model.save removes it: a directory of two runs' files would be read as one. A copy stopped midway
    (SIGTERM, kill -9) never leaves a bitmap beside another epoch's checkpoint: the old bitmap goes before
    the checkpoint is replaced, and the new one, copied only if of the checkpoint's epoch (a run killed
    between its bitmap and its checkpoint is ahead), after. The config goes last: a first copy cut off is
    then a checkpoint alone, which a resume takes for its own (holds_copy) and copies again (copy_whole)."""
    os.makedirs(path, exist_ok=True)

    def copy(name: str) -> None:
        with open(os.path.join(run_dir, name), "rb") as f:
            write_atomic(os.path.join(path, name), f.read(), name)

    has_config = os.path.exists(os.path.join(run_dir, CONFIG))
    for stale in (*(set(RUN_FILES) - set(COPIED)), BITMAP, *(() if has_config else (CONFIG,))):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(path, stale))
    if os.path.exists(os.path.join(run_dir, CHECKPOINT)):
        copy(CHECKPOINT)
        if _bitmap_epoch(run_dir) == _checkpoint_epoch(run_dir):
            copy(BITMAP)
    if has_config:
        copy(CONFIG)


def copy_whole(run_dir: str, path: str, epoch: int) -> bool:
    """Whether `path` holds a whole copy_run of `run_dir` at `epoch`: its config, a checkpoint of that epoch, and
    its bitmap unless the run keeps none (no classifier). A copy a kill cut off lacks one of them."""
    return os.path.exists(os.path.join(path, CONFIG)) and _checkpoint_epoch(path) == epoch and \
        (_bitmap_epoch(path) == epoch or not os.path.exists(os.path.join(run_dir, BITMAP)))


def _checkpoint_epoch(folder: str) -> int | None:
    try:
        return int(load_meta(os.path.join(folder, CHECKPOINT))["epoch"])
    except (HloforgeError, KeyError, TypeError, ValueError):  # none, or not whole
        return None


def _bitmap_epoch(folder: str) -> int | None:
    from hloforge.train.compare import load_bitmap

    try:
        return load_bitmap(folder)[2]
    except HloforgeError:  # none, or not whole
        return None


def holds_copy(checkpoint: str, path: str) -> bool:
    """Whether `path` holds only what copy_run writes, of the run whose checkpoint is `checkpoint` at an
    epoch it has reached: a checkpoint of the same net, variant, seed, backend and test split, at a step
    no later than its own."""
    if not os.path.isdir(path) or set(os.listdir(path)) - {*COPIED, LOCK}:
        return False
    try:
        own, kept = load_meta(checkpoint), load_meta(os.path.join(path, CHECKPOINT))
    except HloforgeError:
        return False
    same = all(own.get(k) == kept.get(k) for k in ("spec", "variant", "seed", "backend")) and \
        same_eval_set(str(own.get("eval_set")), str(kept.get("eval_set")))
    return same and int(kept.get("step", -1)) <= int(own.get("step", -1))


def new_identity() -> str:
    """A fresh identity, in the form run_id reads back: a run's, or a fit's without a directory."""
    return uuid.uuid4().hex


def run_id(run_dir: str, new: bool) -> str | None:
    """The identity of the run in `run_dir`, kept in its RUN_ID file so it travels with the directory (a
    resume after a move, on another machine); `new`: a fresh one, minted and written over any earlier run's.
    None where the run has none (one written before runs had one, or the file tampered with)."""
    path = os.path.join(run_dir, RUN_ID)
    if new:
        ident = new_identity()
        write_atomic(path, f"{ident}\n".encode(), RUN_ID)
        return ident
    try:
        with open(path, encoding="utf-8") as f:
            ident = f.read().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return ident if re.fullmatch(r"[0-9a-f]{32}", ident) else None


def rewind_metrics(run_dir: str, step: int) -> None:
    """Cut metrics.jsonl back to the lines of steps ≤ `step` (the checkpoint's), whole lines only: a run
    killed after logging an epoch but before its checkpoint would otherwise log that epoch twice on
    resume, and a kill mid-line would leave a line json cannot read."""
    path = os.path.join(run_dir, METRICS)
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        raw = f.read()
    out = b"".join(line + b"\n" for line, _ in _records(raw, step))
    if out != raw:
        write_atomic(path, out, "metrics log")


def _records(raw: bytes, step: int) -> list[tuple[bytes, dict[str, Any]]]:
    """metrics.jsonl's whole lines (`raw`) of steps ≤ `step`, each with its record."""
    kept = []
    for line in raw.split(b"\n"):
        try:
            row = json.loads(line)
        except ValueError:  # a torn last line (or an empty one)
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append((line, row))
    return kept


def check_history(run_dir: str) -> None:
    """Refuse to resume a run whose metrics.jsonl is there but holds no record of an epoch its checkpoint
    trained (emptied, or written over by another tool). Not taken as an empty history: a resume's callbacks
    read it (ModelCheckpoint keeps its best epoch so far, EarlyStopping counts its patience from it), so
    they would replace a better kept epoch with a worse one, or wait out another patience, on a history
    that says nothing was trained. The user decides: restore the file, or remove it to resume without the
    history (as a run Model.save or import-weights wrote, which has none, resumes)."""
    path = os.path.join(run_dir, METRICS)
    if not os.path.exists(path):
        return
    try:
        meta = load_meta(os.path.join(run_dir, CHECKPOINT))
    except HloforgeError:  # the resume itself refuses the checkpoint, saying what is wrong
        return
    epoch, step = int(meta["epoch"]), int(meta["step"])
    with open(path, "rb") as f:
        raw = f.read()
    if epoch < 1 or any(row.get("kind", "epoch") == "epoch" for _, row in _records(raw, step)):
        return
    raise DataError(f"metrics log {path} holds no record of the {epoch} epoch{'s' if epoch > 1 else ''} its "
                    "checkpoint trained (emptied, or written over?): the run's history is gone, and a resume's "
                    "callbacks (EarlyStopping, ModelCheckpoint) and curves read it; restore the file, or remove it "
                    "to resume without that history")


def save_npz(path: str, **arrays: Any) -> None:
    """np.savez, replaced whole (a kill mid-write leaves the previous file, never a torn zip)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(path, buf.getvalue(), "eval bitmap")


def check_resumable(run_dir: str, default_of: str = "") -> None:
    """A run directory `--resume` can continue: it exists and holds a checkpoint, and its metrics log, if
    any, its history (check_history), else one line saying which is missing and how to go on.
    `default_of`: the net whose default directory `run_dir` is (no --run-dir given), named, since the user
    did not name the directory."""
    if not os.path.isdir(run_dir):
        which = (f" (the default for net {default_of!r} and these options; give the net and options the run "
                 "was started with, or its --run-dir)" if default_of else "")
        runs = os.path.dirname(run_dir)
        held = sorted(d for d in (os.listdir(runs) if default_of and os.path.isdir(runs) else ())
                      if os.path.isfile(os.path.join(runs, d, CHECKPOINT)))  # the runs --resume might have meant
        if held:
            which += f"; {runs}/ holds: {', '.join(held[:4])}" + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise DataError(f"nothing to resume: run directory {run_dir} does not exist{which}")
    if os.path.exists(os.path.join(run_dir, CHECKPOINT)):
        check_history(run_dir)
        return
    # a fresh start into a directory with no checkpoint is accepted (nothing is overwritten); its own
    # config.toml, where written, starts it with the options it had
    config = os.path.join(run_dir, CONFIG)
    again = (f"hloforge train --config {shlex.quote(config)} --run-dir {shlex.quote(run_dir)}"
             if os.path.exists(config) else f"hloforge train NET [OPTIONS] --run-dir {shlex.quote(run_dir)}")
    raise DataError(f"run directory {run_dir} has no checkpoint yet: it stopped before its first epoch ended, so "
                    f"there is nothing to resume; start it again with `{again}`")


def check_same_data(path: str, meta: dict[str, Any], data: str, now: str) -> None:
    """Refuse to resume checkpoint `path` on data whose test split is not the one the run was scored on
    (its data directory or file replaced, or moved and given anew as another): the run would go on
    training and scoring on other data, its metrics mixing the two. Before check_steps, which another
    training split's size fails with a misleading reason."""
    scored_on = meta.get("eval_set")  # `now`: the split's eval_set_id as it reads now
    if scored_on is not None and not same_eval_set(scored_on, now):
        raise DataError(f"checkpoint {path}: the test split of dataset {data!r} is not the one the run was scored "
                        f"on ({describe_eval_set(now)} now, {describe_eval_set(scored_on)} then); resume it on its "
                        "own data, or start a new run from its weights with --init")


def variant_changed(path: str, stored: dict[str, Any], made: dict[str, Any]) -> str:
    """The refusal of checkpoint `path` trained as variant `stored`, not `made` (both as JSON holds them): the
    fields that differ alone, not two dicts of every field to compare by eye."""
    keys = [k for k in (*made, *(k for k in stored if k not in made)) if stored.get(k) != made.get(k)]

    def said(v: dict[str, Any], k: str) -> str:
        return f"{k}={v[k]!r}" if k in v else f"{k} absent"

    return (f"checkpoint {path} was trained with {', '.join(said(stored, k) for k in keys)}, not "
            f"{', '.join(said(made, k) for k in keys)}; expected its own variant (another is a new run)")


def check_steps(path: str, meta: dict[str, Any], per_epoch: int, cfg: TrainConfig, n: int) -> None:
    """Refuse to resume checkpoint `path` where its step is not its epoch's end in this run's epochs of
    `per_epoch` steps (one trained at another batch, copied from another run): the loop and the schedule
    count this run's steps from (0, 0), so it would train on with a plausible but wrong schedule."""
    epoch, step = int(meta["epoch"]), int(meta["step"])
    if step == epoch * per_epoch:
        return
    was, workers = meta.get("config", {}).get("batch"), meta.get("config", {}).get("workers", 0)
    if was == cfg.batch and workers != cfg.workers:  # each worker drops its own shard's ragged batch
        raise DataError(f"checkpoint {path} is at step {step} after epoch {epoch}: its run streamed from "
                        f"{workers or 'no'} workers, {step // max(epoch, 1)} steps an epoch, and --workers "
                        f"{cfg.workers} makes {per_epoch}; expected --workers {workers} to continue it")
    why = (f"it trained at batch {was}, this run at batch {cfg.batch}" if was != cfg.batch else
           f"this run's epochs are {per_epoch} steps of batch {cfg.batch} over {n} training examples"
           + (f" in {cfg.workers} workers" if cfg.workers else ""))
    raise DataError(f"checkpoint {path} is at step {step} after epoch {epoch}, not this run's step {epoch * per_epoch} "
                    f"({why}); it is not this run's to continue (copied from another run?): resume with the run's "
                    "own checkpoint, or start a new run from its weights with --init")


def own_spec(net: str, stored: NetSpec) -> NetSpec | None:
    """For a net a config names by a spec file's path, the checkpoint's own copy of it (`stored`): the
    file may have moved, been edited or be named relative to another folder since. None for a zoo net
    (rebuilt by name, and refused if it changed)."""
    return stored if net.endswith(SPEC_SUFFIXES) else None


def resumed_spec(cfg: TrainConfig, resume: bool) -> NetSpec | None:
    """What `--resume` continues for a net named by a spec file: its checkpoint's own copy (own_spec), as
    eval reads it; None where the net is rebuilt by name (a zoo net, no run directory named, no checkpoint
    yet: the trainer says which)."""
    path = os.path.join(cfg.run_dir, CHECKPOINT)
    if not (resume and cfg.run_dir and cfg.net.endswith(SPEC_SUFFIXES) and os.path.exists(path)):
        return None
    return own_spec(cfg.net, NetSpec.from_dict(load_meta(path)["spec"], source=path))


def config_spec(config: str, cfg: TrainConfig) -> NetSpec | None:
    """For `train --config RUN/config.toml` (a new run as that run was) whose net is a spec file's path: where
    that file is gone (the run directory moved to another machine), the run's checkpoint's own copy, as eval and
    --resume read it; where it now holds another net than the run trained, one line (the run would not be
    reproduced). None where the config has no checkpoint beside it or names a zoo net: the net as cfg names it."""
    from hloforge.zoo import get_net

    path = os.path.join(os.path.dirname(os.path.abspath(config)), CHECKPOINT)
    if not (cfg.net.endswith(SPEC_SUFFIXES) and os.path.isfile(path)):
        return None
    meta = load_meta(path)
    stored = NetSpec.from_dict(meta["spec"], source=path)
    if not os.path.exists(cfg.net):
        return stored
    now = get_net(cfg.net, cfg.classes, cfg.input)
    made = json.loads(json.dumps(cfg.variant(now).apply_to(now).to_dict()))
    if made != meta["spec"]:
        raise DataError(f"config {config}: its net {cfg.net} now holds another net than its run trained "
                        f"({first_difference(meta['spec'], made)}: the run's, not the file's); expected the run's "
                        f"own spec file (its copy is in {path}), or the net given to train as it is now: "
                        f"hloforge train {shlex.quote(cfg.net)} --config {shlex.quote(config)}")
    return None


def check_matches(path: str, meta: dict[str, Any], spec: NetSpec, variant: Variant, backend: str,
                  allow_cross_backend: bool = False) -> None:
    """Refuse a checkpoint of another variant, net or backend with one clear line (the variant first: its dropout
    or BN ε changes the spec too). Specs compare as JSON (a stored nested tuple came back as a list)."""
    made = json.loads(json.dumps(attrs.asdict(variant)))  # as stored: tuples as lists
    # a field newer than the checkpoint reads as its default
    stored = {**json.loads(json.dumps(attrs.asdict(Variant()))), **meta.get("variant", {})}
    if stored != made:
        raise DataError(variant_changed(path, stored, made))
    if meta.get("spec") != json.loads(json.dumps(spec.to_dict())):
        raise DataError(f"checkpoint {path} is of net {meta.get('spec', {}).get('name')!r}, not {spec.name!r} "
                        f"(its spec differs: {first_difference(meta.get('spec'), spec.to_dict())})")
    if meta.get("backend") != backend and not allow_cross_backend:
        raise DataError(f"checkpoint {path} was trained on backend {meta.get('backend')!r}, not {backend!r}; "
                        "pass --cross-backend to load it anyway")
