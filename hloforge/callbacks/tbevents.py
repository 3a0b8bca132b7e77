"""The TensorBoard callback's event files cut back to a resumed run's checkpoint, as rundir.rewind_metrics
cuts metrics.jsonl: what a killed run logged after its last checkpoint is trained again on resume, so left
in place it would show twice. Cut from the files themselves, not hidden by a purge marker
(SummaryWriter's purge_step): a marker hides every tag at or after one step, but the callback's tags
run on two axes (EPOCH by epoch, STEP by global step), and readers of the raw files ignore it."""

from __future__ import annotations

import itertools
import os
import struct
import time
from collections.abc import Iterator

EPOCH, STEP = "epoch/", "step/"  # the callback's tag prefixes: x-axis the epoch, x-axis the global step
_HEAD = 12  # a TFRecord: data length (u64), its masked CRC (u32), the data, the data's masked CRC (u32)
_writers_made = itertools.count()
RUN_MARK = ".run-"  # then the run's identity (rundir.run_id; a fit's own), at the end of every writer's file name


def own_suffix(run_id: str | None = None) -> str:
    """The end of a new writer's file name (SummaryWriter's filename_suffix) that no other writer's has:
    tensorboardX names a file by its second and host alone, so a writer made within the second of another
    (a second fit into the logdir, a resume right after the kill) opened that one's file over it, its events
    gone. After the second: the nanosecond, so files of one second sort (TensorBoard reads them in name
    order) as they were made, then the process and its count of writers, so no two names are the same; last
    the run's identity, by which its resume knows its own files (rewind)."""
    mark = f"{RUN_MARK}{run_id}" if run_id else ""
    return f".{time.time_ns() % 10**9:09d}.{os.getpid()}.{next(_writers_made)}{mark}"


def records(raw: bytes) -> Iterator[tuple[bytes, bytes]]:
    """An event file's records as (whole record, its data), up to the first torn or corrupt one (a kill
    mid-write leaves a torn last record; TensorBoard's readers stop there too)."""
    from tensorboardX.record_writer import masked_crc32c

    at = 0
    while at + _HEAD <= len(raw):
        (n,), (head_crc,) = struct.unpack("<Q", raw[at:at + 8]), struct.unpack("<I", raw[at + 8:at + _HEAD])
        end = at + _HEAD + n + 4
        if head_crc != masked_crc32c(raw[at:at + 8]) or end > len(raw):
            return
        data = raw[at + _HEAD:end - 4]
        if struct.unpack("<I", raw[end - 4:end])[0] != masked_crc32c(data):
            return
        yield raw[at:end], data
        at = end


def rewind(logdir: str, epoch: int, step: int, run_id: str | None) -> set[tuple[str, int]]:
    """Cut the event files in `logdir` of the run `run_id` (own_suffix) back to a checkpoint at `epoch` and
    global `step`: an EPOCH scalar of a later epoch, a STEP scalar of a later step and a torn last record
    dropped, the rest (other writers' tags too) kept in order. Other runs' files in a shared logdir are
    theirs, left be; `run_id` None (a run from before runs had one): the files of no run's. Returns the
    (tag, epoch) of the EPOCH scalars kept."""
    from tensorboardX.proto.event_pb2 import Event

    kept_epochs: set[tuple[str, int]] = set()
    for name in sorted(os.listdir(logdir)):
        path = os.path.join(logdir, name)
        if "tfevents" not in name or not os.path.isfile(path):  # TensorBoard's own test of an event file
            continue
        if not (name.endswith(f"{RUN_MARK}{run_id}") if run_id else RUN_MARK not in name):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        kept = []
        for record, data in records(raw):
            ev = Event.FromString(data)
            tags = [v.tag for v in ev.summary.value]
            if any(t.startswith(EPOCH) and ev.step > epoch or t.startswith(STEP) and ev.step > step for t in tags):
                continue
            kept_epochs.update((t, ev.step) for t in tags if t.startswith(EPOCH))
            kept.append(record)
        if (out := b"".join(kept)) != raw:
            _replace(path, out)
    return kept_epochs


def _replace(path: str, data: bytes) -> None:
    """`data` over `path`, whole or not at all: through a temp file whose name TensorBoard does not read
    as an event file (one holding "tfevents", as checkpoint.write_atomic's `path`.tmp would)."""
    tmp = os.path.join(os.path.dirname(path), ".hloforge-rewind.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
