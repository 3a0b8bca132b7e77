"""Streaming producers: batches made in worker processes and read over pipes (seed 003).

`--workers N` runs N producer processes (`python -m hloforge.datasets.stream …`), each over a
disjoint shard of one split, and the trainer reads their batches round robin: batch k from
worker k mod N. The transform (crop, flip, normalisation) is the dataset's own, run in the
worker; nothing about it is restated here.

The wire, all little-endian:

    preamble  magic "HFST" | u32 version | u32 batch | u32 flat | u32 classes | u32 label_width
    batch     u32 rows | int32[rows·label_width] labels | float32[rows·flat] images
    end       the pipe closes after a whole batch

The preamble is checked field by field rather than skipped: a batch or resolution mismatch
would otherwise read as garbage pixels and look like a broken net. The row count is read, not
inferred (a pipe keeps no write boundaries), and labels come first so a partial record shows at
the smaller read. Every block is read to its exact length, looping over short pipe reads (the
normal case at large batches); a block that ends early is a torn record and raises, naming the
worker and the size expected — never a silently short or misaligned batch. A worker that exits
non-zero raises with the tail of its stderr, even when it died between batches.

Shards. Training: worker i takes examples i, i+N, i+2N, … and shuffles its slice each epoch
with its own seed (seed + i, so the workers' crops are not correlated), emitting only full
batches. Round robin over such workers is a valid shuffled stream, but not byte-comparable
with the one-process stream. Evaluation: worker i emits the whole eval batches i, i+N, … in
order, so round robin reproduces the split's order exactly, and the last batch may be short:
every image is scored once. The first end of stream in round-robin order is the end of the
pass (worker b mod N has emitted exactly ⌊b/N⌋ batches when b is the first batch past the
end); then every worker is killed and reaped, as on any error, so no child outlives a pass.

Gate-only faults, `HLOFORGE_VAL_FAULT` (eval streams only) — controls that must turn the eval
gate red: `order` starts the round robin on worker 1 (the same count of images, each scored
at another's position), `tail` drops the short final batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

import attrs
import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DataError, PluginError
from hloforge.core.registry import component_label
from hloforge.core.spec import NetSpec
from hloforge.datasets.augment import Compose, Transform, step_rng

MAGIC = b"HFST"
VERSION = 1
PREAMBLE = struct.Struct("<4sIIIII")  # magic, version, batch, flat, classes, label_width
PREAMBLE_FIELDS = ("magic", "version", "batch", "flat", "classes", "label_width")
ROWS = struct.Struct("<I")
FAULT_ENV = "HLOFORGE_VAL_FAULT"
FAULTS = ("order", "tail")
STDERR_TAIL = 600  # bytes of a failed worker's stderr quoted in the error


class StreamError(DataError):
    """A producer stream that is torn, misframed, or whose worker failed."""


# ---------------------------------------------------------------------------------------- the dataset side
def split_pair(data: Any, split: str, stored: bool = False) -> tuple[Any, Any]:
    """`data.arrays(split)` (`stored`: `data.records(split)`) checked as every consumer reads it: a pair
    (x, y) of arrays, one label per row. A dataset plugin's other return is one line naming it, not an
    unpacking or index error deep in the loop."""
    call = f"{'records' if stored else 'arrays'}({split!r})"
    got = data.records(split) if stored else data.arrays(split)
    if isinstance(got, (tuple, list)) and len(got) == 2:
        try:  # nested lists as the arrays they hold (every consumer reads .shape); an array or memmap as it is
            got = [np.asarray(a) if isinstance(a, (list, tuple)) else a for a in got]
        except ValueError:  # numpy's, on rows of different lengths
            raise PluginError(f"{component_label('dataset', data)}: {call} returned ragged nested lists, expected a "
                              "pair (x, y) of arrays, one label per row of x") from None
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(np.ndim(a) >= 1 for a in got)):
        said = f"{len(got)} items" if isinstance(got, (tuple, list)) else type(got).__name__
        raise PluginError(f"{component_label('dataset', data)}: {call} returned {said}, expected a pair (x, y) "
                          "of arrays, one label per row of x")
    x, y = got
    if len(x) != len(y):
        raise PluginError(f"{component_label('dataset', data)}: {call} gave {len(x)} rows of x but {len(y)} "
                          "labels, expected one label per row")
    if not stored:
        check_float_x(data, call, x)
    return x, y


def check_float_x(data: Any, call: str, x: Any) -> None:
    """Refuse x of an integer dtype from `arrays` (net input, float32 by the Dataset contract; stored uint8
    pixels are a record dataset's, which transforms them): cast as it is, 0…255 trains and scores a plausible,
    wrong number. A token dataset's ids are ids whatever their dtype (an embedding reads them whole); a fit's own
    arrays (`integer_x_taken`) are the user's as given, warned of and kept as the model's kind of input."""
    dtype = getattr(x, "dtype", None)  # an array's or a memmap's (nested lists are arrays by now)
    if dtype is None or np.dtype(dtype).kind not in "iu" or getattr(data, "integer_x_taken", False) \
            or getattr(data, "label_kind", Dataset.label_kind) == "tokens":
        return
    span = f" in {np.min(x)} … {np.max(x)}" if len(x) else ""
    raise PluginError(f"{component_label('dataset', data)}: {call} gave x of {dtype}{span}, expected float32 net "
                      "input (the Dataset contract); scale it in the dataset, e.g. x.astype(np.float32) / 255 for "
                      "8-bit pixels, standardised as its net is trained on")


def dataset_classes(data: Any) -> int:
    """A dataset's `num_classes`, refused unless the int ≥ 1 the Dataset contract requires, where a task or the
    stream reads it: a plugin's missing one is no AttributeError, its "10" no mismatch with a net of 10."""
    n = getattr(data, "num_classes", None)
    if isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_)) and n >= 1:
        return int(n)
    said = "no num_classes" if not hasattr(data, "num_classes") else f"num_classes {n!r} (a {type(n).__name__})"
    raise PluginError(f"{component_label('dataset', data)} has {said}; expected an int ≥ 1, the classes of its "
                      "labels (a class attribute or set in __init__)")


def class_names(data: Any, spec: NetSpec) -> list[str] | None:
    """The names of the net's class ids, id i the i-th, as the run's dataset names them (Dataset.class_names: a
    prepared folder's classes.json); None where it names none, or more than the net has classes (its files
    are no longer the ones trained on), so nothing is said that is not known."""
    names = getattr(data, "class_names", Dataset.class_names)
    return None if not names or len(names) > spec.num_classes else [str(n) for n in names]


def recorded_names(data: Any, spec: NetSpec) -> dict[str, list[str]]:
    """What a checkpoint records of the names the run's ids stand for: its dataset's `class_names`, and a corpus's
    `vocabulary` (each id's character), which a later corpus must share (its ids are read as these characters) even
    once the training corpus is gone."""
    vocabulary = getattr(data, "vocabulary", None) if hasattr(data, "chars") else None
    return {**({"class_names": names} if (names := class_names(data, spec)) else {}),
            **({"vocabulary": [str(c) for c in vocabulary]} if vocabulary else {})}


def check_channels_first(name: str, got: Sequence[int], want: Sequence[int]) -> None:
    """Refuse a dataset's images with their channels last ([H, W, C], as PIL and most image files have them)
    for a net taking them first ([C, H, W]) where rows are reshaped to the net's input: of the same size, the
    reshape would scramble each image into a plausible input that trains to a plausible wrong number."""
    if len(want) == 3 and want[0] != want[2] and tuple(got) == (*want[1:], want[0]):
        raise DataError(f"dataset {name!r} gives images {list(got)}, channels last, but the net takes "
                        f"{list(want)}, channels first; expected x.transpose(0, 3, 1, 2) of them from its arrays")


def check_rows(data: Any, split: str, n: int) -> None:
    """Refuse a registered dataset's split of no examples where a run reads it: on it a run would train
    nothing, or print no score and end as if all went well. Named with where it was read from."""
    if n:
        return
    where = getattr(data, "data_file", "") or getattr(data, "data_dir", "")
    read = f" (read from {where})" if isinstance(where, str) and where else ""
    raise DataError(f"dataset {getattr(data, 'name', type(data).__name__)!r}{read}: its {split} split holds no "
                    "examples; expected at least one in each of its train and test splits")


def split_view(data: Any, split: str, augment: bool) -> tuple[Any, np.ndarray, Transform]:
    """(stored rows, labels, the transform to net input) of a split, for any dataset plugin.

    A record dataset (uint8 stored pixels) gives its own transform; an array dataset's rows are
    already net input, so its transform is the identity."""
    if hasattr(data, "records"):
        x, y = split_pair(data, split, stored=True)
        return x, y, data.transform(split, augment=augment and split == "train")
    x, y = split_pair(data, split)
    return x, y, Compose(())


LABEL_CHUNK = 256  # stored images transformed at a time while only the labels are kept


def split_labels(data: Any, split: str) -> np.ndarray:
    """A split's labels as its deterministic transform gives them (a mask may change dtype or size),
    without the float split ever being whole in memory: a record dataset's stored rows go through the
    transform a chunk at a time and only the labels are kept. An array dataset's split is already
    in memory, so its labels are read off it."""
    if not hasattr(data, "records"):
        return np.asarray(split_pair(data, split)[1])
    x, y, t = split_view(data, split, augment=False)
    parts = [t(np.asarray(x[i:i + LABEL_CHUNK]), np.asarray(y[i:i + LABEL_CHUNK]), step_rng(0))[1]
             for i in range(0, len(x), LABEL_CHUNK)]
    return np.concatenate(parts) if parts else np.asarray(y)


@attrs.frozen
class Layout:
    """What one row looks like on the wire and to the net."""

    flat: int  # float32 per image
    label_shape: tuple[int, ...]  # per row: () for a class index, (H, W) for a mask
    classes: int
    image_shape: tuple[int, ...] = ()  # one row as the dataset gives it, before it is flattened for the wire

    @property
    def label_width(self) -> int:
        return math.prod(self.label_shape)


def layout_of(data: Any, split: str) -> Layout:
    """The row layout, read off the split's first example through its deterministic transform."""
    x, y, t = split_view(data, split, augment=False)
    check_rows(data, split, len(x))
    xb, yb = t(np.asarray(x[:1]), np.asarray(y[:1]), step_rng(0))
    if not np.issubdtype(np.asarray(yb).dtype, np.integer):  # the wire carries labels as int32
        raise DataError(f"dataset {data.name!r} split {split!r} has {np.asarray(yb).dtype} labels; the producer "
                        "stream carries integer labels only (train it without --workers)")
    return Layout(math.prod(xb.shape[1:]), tuple(yb.shape[1:]), dataset_classes(data), tuple(xb.shape[1:]))


def train_steps(n: int, batch: int, workers: int) -> int:
    """Batches in one streamed training epoch: the round robin ends at the first worker that runs out.

    Worker j holds ⌈(n − j)/workers⌉ examples, so ⌊that/batch⌋ full batches c_j; reading worker k mod
    workers, the first end is met after min_j (c_j·workers + j) batches."""
    if workers <= 0:
        return n // batch
    return min(((n - j + workers - 1) // workers) // batch * workers + j for j in range(workers))


def shard_batches(n: int, batch: int, shard: int, shards: int, seed: int, epoch: int,
                  train: bool) -> Iterator[tuple[int, np.ndarray]]:
    """(batch key, example indices) of one worker's batches, in emission order."""
    if train:
        mine = np.arange(shard, n, shards)
        mine = mine[step_rng(seed, epoch).permutation(len(mine))]
        for k in range(len(mine) // batch):
            yield k, mine[k * batch:(k + 1) * batch]
    else:
        for b in range(shard, (n + batch - 1) // batch, shards):
            yield b, np.arange(b * batch, min(n, (b + 1) * batch))


def produce(out: IO[bytes], data: Any, split: str, batch: int, shard: int, shards: int, seed: int, epoch: int,
            train: bool, augment: bool) -> int:
    """Write one worker's stream to `out`: the preamble, then its batches. Returns the batches written."""
    lay = layout_of(data, split)
    x, y, t = split_view(data, split, augment and train)
    out.write(PREAMBLE.pack(MAGIC, VERSION, batch, lay.flat, lay.classes, lay.label_width))
    written = 0
    for key, idx in shard_batches(len(x), batch, shard, shards, seed, epoch, train):
        xb, yb = t(np.asarray(x[idx]), np.asarray(y[idx]), step_rng(seed, epoch, key))
        out.write(ROWS.pack(len(idx)))
        out.write(np.ascontiguousarray(yb, "<i4").tobytes())
        out.write(np.ascontiguousarray(xb, "<f4").tobytes())
        written += 1
    out.flush()
    return written


@attrs.frozen
class DataRef:
    """How a worker process rebuilds the dataset: its plugin name and constructor options (JSON)."""

    name: str
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)

    def make(self) -> Any:
        """The dataset, found through the dataset plugins alone (a producer's start-up then imports no
        layer, loss or backend); a name they lack goes to the full registry, which gives the same
        answer or error a training process gets."""
        from hloforge.core.errors import PluginError
        from hloforge.core.registry import dataset_registry, default_registry

        registry = dataset_registry()
        try:
            registry.entry("dataset", self.name)
        except PluginError:
            registry = default_registry()
        return registry.make("dataset", self.name, **self.options)


def producer_command(ref: DataRef, split: str, batch: int, shard: int, shards: int, seed: int, epoch: int,
                     train: bool, augment: bool) -> list[str]:
    return [sys.executable, "-m", "hloforge.datasets.stream", "--data", ref.name,
            "--options", json.dumps(dict(ref.options)), "--split", split, "--batch", str(batch),
            "--shard", f"{shard}/{shards}", "--seed", str(seed), "--epoch", str(epoch),
            "--mode", "train" if train else "eval", "--augment", "1" if augment else "0"]


# ---------------------------------------------------------------------------------------- the reader
def _ended(rc: int) -> str:
    """How a producer ended, said: a signal by name (SIGKILL with its usual sender), else its exit code."""
    if rc >= 0:
        return f"exit code {rc}"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    oom = ", which the kernel's out-of-memory killer sends when memory runs out, as kill -9 does" \
        if -rc == signal.SIGKILL else ""
    return f"killed by {name}{oom}"


class _Worker:
    def __init__(self, index: int, name: str, argv: Sequence[str], env: Mapping[str, str] | None):
        self.index, self.name = index, name
        self.stderr = tempfile.TemporaryFile()  # a file, not a pipe: a chatty worker cannot block on it
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.stderr, bufsize=0, env=None if env is None else dict(env))
        self.batches = 0

    def describe(self) -> str:
        return f"producer {self.index} ({self.name}, pid {self.proc.pid})"

    def read_into(self, buf: memoryview) -> int:
        """Fill buf from the pipe, looping over short reads; returns the bytes that arrived (< len at EOF)."""
        assert self.proc.stdout is not None
        got = 0
        while got < len(buf):
            n = self.proc.stdout.readinto(buf[got:])  # type: ignore[attr-defined]
            if not n:
                break
            got += n
        return got

    def exit_note(self, wait_s: float = 5.0) -> str:
        try:
            rc = self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return "still running"
        self.stderr.seek(0)
        err = self.stderr.read().decode("utf-8", "replace").strip()
        if len(err) > STDERR_TAIL:
            err = "…" + err[-STDERR_TAIL:]
        return _ended(rc) + (f"; its stderr: {err}" if err else "")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


class StreamReader:
    """Round-robin reader over producer processes; iterate for (x [rows, flat] f32, y [rows, *label] i32).

    `eval_split` accepts one short final batch (and applies `HLOFORGE_VAL_FAULT`); otherwise every
    batch must be full and, when `expected_batches` is given, the pass must yield exactly that many.
    Closing (the end of the pass, an error, `with`, or garbage collection) kills and reaps every worker."""

    def __init__(self, commands: Sequence[Sequence[str]], *, batch: int, layout: Layout, eval_split: bool,
                 names: Sequence[str] | None = None, expected_batches: int | None = None,
                 env: Mapping[str, str] | None = None):
        if not commands:
            raise DataError("a producer stream needs at least one worker")
        fault = os.environ.get(FAULT_ENV, "") if eval_split else ""
        if fault and fault not in FAULTS:
            raise DataError(f"{FAULT_ENV}={fault!r}; expected one of {list(FAULTS)} or unset")
        self.batch, self.layout, self.eval_split = batch, layout, eval_split
        self.expected_batches, self.fault = expected_batches, fault
        self.workers: list[_Worker] = []
        self.closed = False
        try:
            for i, argv in enumerate(commands):
                self.workers.append(_Worker(i, names[i] if names else f"worker {i} of {len(commands)}", argv, env))
            for w in self.workers:
                self._check_preamble(w)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def _torn(self, w: _Worker, what: str, need: int, got: int) -> StreamError:
        return StreamError(f"{w.describe()}: torn record in its batch {w.batches}: {what} needs {need:,} bytes, "
                           f"got {got:,} before the stream ended ({w.exit_note()})")

    def _check_preamble(self, w: _Worker) -> None:
        buf = bytearray(PREAMBLE.size)
        got = w.read_into(memoryview(buf))
        if got != PREAMBLE.size:
            raise StreamError(f"{w.describe()}: stream ended after {got} of the {PREAMBLE.size} preamble bytes "
                              f"({w.exit_note()})")
        fields = PREAMBLE.unpack(bytes(buf))
        want = (MAGIC, VERSION, self.batch, self.layout.flat, self.layout.classes, self.layout.label_width)
        for field, g, e in zip(PREAMBLE_FIELDS, fields, want, strict=True):
            if g != e:
                raise StreamError(f"{w.describe()}: preamble {field} is {g!r}, expected {e!r} "
                                  f"(batch {self.batch}, flat {self.layout.flat}, classes {self.layout.classes}, "
                                  f"label width {self.layout.label_width})")

    def _read_batch(self, w: _Worker) -> tuple[np.ndarray, np.ndarray] | None:
        """One batch from w, or None at a clean end of its stream (after checking it exited cleanly)."""
        head = bytearray(ROWS.size)
        got = w.read_into(memoryview(head))
        if got == 0:
            note = w.exit_note()
            if w.proc.returncode != 0:
                raise StreamError(f"{w.describe()} ended its stream after {w.batches} batches and failed ({note})")
            return None
        if got < ROWS.size:
            raise self._torn(w, "the row count", ROWS.size, got)
        (rows,) = ROWS.unpack(bytes(head))
        if rows == 0 or rows > self.batch or (rows < self.batch and not self.eval_split):
            raise StreamError(f"{w.describe()}: batch {w.batches} has {rows} rows; expected "
                              + (f"1..{self.batch}" if self.eval_split else f"exactly {self.batch} (training batches "
                                 "are full)"))
        y = np.empty((rows, *self.layout.label_shape), "<i4")
        x = np.empty((rows, self.layout.flat), "<f4")
        for arr, what in ((y, f"{rows} labels"), (x, f"{rows} images of {self.layout.flat} floats")):
            view = arr.data.cast("B")
            got = w.read_into(view)
            if got != len(view):
                raise self._torn(w, what, len(view), got)
        w.batches += 1
        return x, y

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        n = len(self.workers)
        start = 1 if self.fault == "order" and n > 1 else 0
        k = 0
        short_from: _Worker | None = None
        try:
            while True:
                w = self.workers[(k + start) % n]
                got = self._read_batch(w)
                if got is None:
                    break
                if short_from is not None and self.fault != "order":  # under `order` the short one comes early
                    raise StreamError(f"{short_from.describe()} sent a short batch that was not the last of the "
                                      f"pass: {w.describe()} sent another after it")
                if len(got[0]) < self.batch:
                    short_from = w
                    if self.fault == "tail":
                        break
                k += 1
                yield got
            if self.expected_batches is not None and k != self.expected_batches:
                raise StreamError(f"the producer stream ended after {k} batches, expected {self.expected_batches} "
                                  f"(a worker stopped early)")
        finally:
            self.close()

    def close(self) -> None:
        """Kill then wait for every worker, so no <defunct> child is left; idempotent."""
        if self.closed:
            return
        self.closed = True
        for w in self.workers:
            w.close()

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "workers", None) is not None:
            self.close()


def open_stream(ref: DataRef, split: str, *, batch: int, workers: int, seed: int, epoch: int, train: bool,
                augment: bool, layout: Layout, expected_batches: int | None = None) -> StreamReader:
    """Spawn `workers` producers of one pass over `split` (worker i over shard i, seed seed + i)."""
    commands = [producer_command(ref, split, batch, i, workers, seed + i, epoch, train, augment)
                for i in range(workers)]
    names = [f"{ref.name} {split} shard {i}/{workers}" for i in range(workers)]
    return StreamReader(commands, batch=batch, layout=layout, eval_split=not train, names=names,
                        expected_batches=expected_batches)


# ---------------------------------------------------------------------------------------- the trainer's feed
class Feed:
    """Training batches of one epoch and eval batches of one pass, shaped for the net.

    workers = 0 draws in process: the epoch's permutation is `step_rng(seed, epoch)` over the whole
    split and step s's transform draws from `step_rng(seed, epoch, s)`, so a resumed run sees the
    same stream. workers > 0 streams from producer processes (see the module docstring); eval
    then streams too, a fresh set of producers per pass."""

    def __init__(self, data: Any, ref: DataRef, *, batch: int, seed: int, workers: int, augment: bool,
                 input_shape: Sequence[int], train_split: str = "train", eval_split: str = "test",
                 train: bool = True, shuffle: bool = True):
        if workers < 0:
            raise DataError(f"workers must be 0 (in process) or more, got {workers}")
        self.data, self.ref, self.batch, self.seed = data, ref, batch, seed
        self.workers, self.augment, self.input_shape = workers, augment, tuple(input_shape)
        self.train_split, self.eval_split, self.shuffle = train_split, eval_split, shuffle
        # train=False: an eval-only feed, which never opens the train split (nor needs its file)
        self.x, self.y, self.transform = split_view(data, train_split, augment) if train else ([], [], Compose(()))
        self.n = len(self.x)
        self.steps_per_epoch = train_steps(self.n, batch, workers)
        if workers and train:
            self.layout = layout_of(data, train_split)
            check_channels_first(ref.name, self.layout.image_shape, self.input_shape)
            if self.layout.flat != math.prod(self.input_shape):
                raise DataError(f"dataset {ref.name!r} gives rows of {self.layout.flat} values, the net takes "
                                f"{list(self.input_shape)}")

    @property
    def streams(self) -> bool:
        return self.workers > 0

    def _shaped(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if tuple(x.shape[1:]) != self.input_shape:
            check_channels_first(self.ref.name, x.shape[1:], self.input_shape)
            if math.prod(x.shape[1:]) != math.prod(self.input_shape):
                raise DataError(f"dataset {self.ref.name!r} gives inputs of shape {list(x.shape[1:])}, the net "
                                f"expects {list(self.input_shape)}")
            x = x.reshape(len(x), *self.input_shape)
        return x, y

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if not self.streams:
            order = step_rng(self.seed, epoch).permutation(self.n) if self.shuffle else np.arange(self.n)
            for s in range(self.steps_per_epoch):
                idx = order[s * self.batch:(s + 1) * self.batch]
                yield self._shaped(*self.transform(np.asarray(self.x[idx]), np.asarray(self.y[idx]),
                                                   step_rng(self.seed, epoch, s)))
            return
        reader = open_stream(self.ref, self.train_split, batch=self.batch, workers=self.workers, seed=self.seed,
                             epoch=epoch, train=True, augment=self.augment, layout=self.layout,
                             expected_batches=self.steps_per_epoch)
        with reader:
            for x, y in reader:
                yield self._shaped(x, y)

    def eval_batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """One streamed pass over the eval split, in its order, the short final batch included."""
        lay = layout_of(self.data, self.eval_split)
        with open_stream(self.ref, self.eval_split, batch=self.batch, workers=self.workers, seed=self.seed, epoch=0,
                         train=False, augment=False, layout=lay) as reader:
            for x, y in reader:
                yield self._shaped(x, y)


# ---------------------------------------------------------------------------------------- the worker process
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hloforge.datasets.stream", description="one producer of a stream")
    p.add_argument("--data", required=True)
    p.add_argument("--options", default="{}")
    p.add_argument("--split", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--shard", default="0/1", help="i/n: this worker's shard")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--mode", choices=("train", "eval"), required=True)
    p.add_argument("--augment", type=int, default=1)
    a = p.parse_args(argv)
    try:
        shard, shards = (int(v) for v in a.shard.split("/"))
        if not 0 <= shard < shards or a.batch < 1:
            raise ValueError
    except ValueError:
        print(f"producer: bad --shard {a.shard!r} or --batch {a.batch}; expected i/n with 0 <= i < n", file=sys.stderr)
        return 2
    out = sys.stdout.buffer
    try:
        data = DataRef(a.data, json.loads(a.options)).make()
        produce(out, data, a.split, a.batch, shard, shards, a.seed, a.epoch, a.mode == "train", bool(a.augment))
    except BrokenPipeError:  # the reader ended the pass (or died); nothing left to say
        os._exit(0)
    except Exception as e:  # one line on stderr, which the reader quotes in its error
        print(f"producer {a.data} {a.split} shard {a.shard}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
