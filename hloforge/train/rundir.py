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
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.train.checkpoint import TMP_SUFFIX, load_meta, write_atomic
from hloforge.train.config import BITMAP, CHECKPOINT, CONFIG, TrainConfig
from hloforge.train.curves import PNG
from hloforge.zoo import SPEC_SUFFIXES

LOCK = ".lock"
METRICS = "metrics.jsonl"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def checked_path(path: Any, what: str) -> str:
    """A str or os.PathLike path as a str, refused otherwise."""
    p = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(p, str) or not p:
        raise UnsupportedSpec(f"{what} takes a path (a non-empty str or os.PathLike), got {path!r}")
    return p


@contextmanager
def locked(run_dir: str, last_good: str) -> Iterator[None]:
    """Hold `run_dir`'s lock for the block (made, with the directory, if missing). Refused with one
    line while another process holds it. A block that fails before writing anything leaves no trace
    of a directory it made. A full disk anywhere in the block is one line naming `last_good`, the
    checkpoint that is still whole."""
    made = not os.path.isdir(run_dir)
    path = os.path.join(run_dir, LOCK)
    try:
        os.makedirs(run_dir, exist_ok=True)
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
        for name in (CHECKPOINT, CONFIG, BITMAP, METRICS, PNG):  # a writer's killed mid-write: the lock says
            with contextlib.suppress(FileNotFoundError):          # no one else writes them
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


def rewind_metrics(run_dir: str, step: int) -> None:
    """Cut metrics.jsonl back to the lines of steps ≤ `step` (the checkpoint's), whole lines only: a run
    killed after logging an epoch but before its checkpoint would otherwise log that epoch twice on
    resume, and a kill mid-line would leave a line json cannot read."""
    path = os.path.join(run_dir, METRICS)
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        raw = f.read()
    kept = []
    for line in raw.split(b"\n"):
        try:
            row = json.loads(line)
        except ValueError:  # a torn last line (or an empty one)
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line + b"\n")
    out = b"".join(kept)
    if out != raw:
        write_atomic(path, out, "metrics log")


def save_npz(path: str, **arrays: Any) -> None:
    """np.savez, replaced whole (a kill mid-write leaves the previous file, never a torn zip)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(path, buf.getvalue(), "eval bitmap")


def check_resumable(run_dir: str, default_of: str = "") -> None:
    """A run directory `--resume` can continue: it exists and holds a checkpoint, else one line saying
    which is missing and how to go on. `default_of`: the net whose default directory `run_dir` is (no
    --run-dir given), named, since the user did not name the directory."""
    if not os.path.isdir(run_dir):
        which = (f" (the default for net {default_of!r} and these options; give the net and options the run "
                 "was started with, or its --run-dir)" if default_of else "")
        raise DataError(f"nothing to resume: run directory {run_dir} does not exist{which}")
    if os.path.exists(os.path.join(run_dir, CHECKPOINT)):
        return
    # a fresh start into a directory with no checkpoint is accepted (nothing is overwritten); its own
    # config.toml, where written, starts it with the options it had
    config = os.path.join(run_dir, CONFIG)
    again = (f"hloforge train --config {shlex.quote(config)} --run-dir {shlex.quote(run_dir)}"
             if os.path.exists(config) else f"hloforge train NET [OPTIONS] --run-dir {shlex.quote(run_dir)}")
    raise DataError(f"run directory {run_dir} has no checkpoint yet: it stopped before its first epoch ended, so "
                    f"there is nothing to resume; start it again with `{again}`")


def check_steps(path: str, meta: dict[str, Any], per_epoch: int, cfg: TrainConfig, n: int) -> None:
    """Refuse to resume checkpoint `path` where its step is not its epoch's end in this run's epochs of
    `per_epoch` steps (one trained at another batch, copied from another run): the loop and the schedule
    count this run's steps from (0, 0), so it would train on with a plausible but wrong schedule."""
    epoch, step = int(meta["epoch"]), int(meta["step"])
    if step == epoch * per_epoch:
        return
    was = meta.get("config", {}).get("batch")
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
