"""The streaming producers: real worker processes over the wire protocol of seed 003."""

from __future__ import annotations

import os
import struct
import sys
import textwrap

import numpy as np
import pytest

from hloforge.core.errors import DataError
from hloforge.datasets import cifar10
from hloforge.datasets.stream import (
    FAULT_ENV,
    MAGIC,
    PREAMBLE,
    VERSION,
    DataRef,
    Feed,
    Layout,
    StreamError,
    StreamReader,
    layout_of,
    open_stream,
    shard_batches,
    train_steps,
)

BATCH = 4
CIFAR_LAYOUT = Layout(3 * 32 * 32, (), 10)


def write_cifar(d, n_train=(5, 5, 5, 5, 6), n_test=14, seed=0):
    """CIFAR-10 binary batches whose test images carry a 'prediction' in pixel (0, 0, 0): right for the
    images of even eval batches (of BATCH), wrong for odd ones, so the bitmap depends on the order."""
    rng = np.random.default_rng(seed)
    files = dict(zip(cifar10.FILES["train"], n_train, strict=True)) | {"test_batch.bin": n_test}
    for name, n in files.items():
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 256, (n, 3, 32, 32)).astype(np.uint8)
        if name == "test_batch.bin":
            right = (np.arange(n) // BATCH) % 2 == 0
            images[:, 0, 0, 0] = np.where(right, labels, (labels + 1) % 10)
        (d / name).write_bytes(b"".join(bytes([lab]) + im.tobytes() for lab, im in zip(labels, images, strict=True)))


def predicted(x):
    """The 'model' of the gate: read the class back out of pixel (0, 0, 0)."""
    raw = (x.reshape(len(x), 3, 32, 32)[:, 0, 0, 0] * cifar10.STD[0] + cifar10.MEAN[0]) * 255.0
    return np.rint(raw).astype(int)


def eval_gate(ds, ref, workers):
    """Streamed eval against the in-memory eval: (n, per-image bitmap) must be identical."""
    x, y = ds.arrays("test")
    want = predicted(x) == y
    feed = Feed(ds, ref, batch=BATCH, seed=0, workers=workers, augment=False, input_shape=(3, 32, 32))
    got = np.concatenate([predicted(xb) == yb for xb, yb in feed.eval_batches()])
    return len(got) == len(want) and bool(np.array_equal(got, want)), got, want


@pytest.fixture
def cifar(tmp_path):
    write_cifar(tmp_path)
    ds = cifar10.Cifar10(str(tmp_path))
    return ds, DataRef("cifar10", {"data_dir": str(tmp_path)})


def reaped(pids):
    """No child left behind: each pid is gone (waited for), not a <defunct> zombie."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state == "Z":
            return False
    return True


# ------------------------------------------------------------------ the eval split
def test_streamed_eval_reproduces_the_split_in_order_with_the_short_tail(cifar):
    ds, ref = cifar
    x, y = ds.arrays("test")
    for workers in (1, 2, 3):
        reader = open_stream(ref, "test", batch=BATCH, workers=workers, seed=0, epoch=0, train=False, augment=False,
                             layout=layout_of(ds, "test"))
        batches = list(reader)
        assert [len(b[1]) for b in batches] == [4, 4, 4, 2], "every image once, the short batch last"
        assert np.array_equal(np.concatenate([b[0] for b in batches]), x.reshape(14, -1))
        assert np.array_equal(np.concatenate([b[1] for b in batches]), y)
        assert reader.closed and reaped(reader.pids)


def test_eval_gate_is_green_and_the_fault_knobs_turn_it_red(cifar, monkeypatch):
    ds, ref = cifar
    ok, got, want = eval_gate(ds, ref, 2)
    assert ok and 0 < want.sum() < len(want)
    monkeypatch.setenv(FAULT_ENV, "order")
    ok, got, want = eval_gate(ds, ref, 2)
    assert not ok and len(got) == len(want) and got.sum() == want.sum(), "order: same count, different bitmap"
    monkeypatch.setenv(FAULT_ENV, "tail")
    ok, got, want = eval_gate(ds, ref, 2)
    assert not ok and len(got) == len(want) - 2, "tail: the short final batch is dropped"
    monkeypatch.setenv(FAULT_ENV, "sideways")
    with pytest.raises(DataError, match="HLOFORGE_VAL_FAULT='sideways'; expected one of"):
        eval_gate(ds, ref, 2)


# ------------------------------------------------------------------ the train split
def test_train_stream_shards_seeds_and_determinism(cifar):
    ds, ref = cifar
    n = len(ds.records("train")[1])
    assert n == 26 and train_steps(n, BATCH, 2) == 6 and train_steps(n, BATCH, 0) == 6
    assert train_steps(26, 4, 3) == 6 and train_steps(9, 4, 2) == 2  # 5|4 examples: 1 batch each
    # shard i of n is examples i, i+n, ...: disjoint, and each worker shuffles with its own seed
    a = [np.sort(np.concatenate([i for _, i in shard_batches(26, 1, s, 2, 7 + s, 1, True)])) for s in range(2)]
    assert np.array_equal(a[0], np.arange(0, 26, 2)) and np.array_equal(a[1], np.arange(1, 26, 2))

    def run(seed, epoch):
        feed = Feed(ds, ref, batch=BATCH, seed=seed, workers=2, augment=True, input_shape=(3, 32, 32))
        return list(feed.epoch(epoch))

    first = run(3, 1)
    assert len(first) == 6 and all(xb.shape == (4, 3, 32, 32) and yb.shape == (4,) for xb, yb in first)
    again = run(3, 1)
    assert all(np.array_equal(p[0], q[0]) and np.array_equal(p[1], q[1]) for p, q in zip(first, again, strict=True))
    other = run(3, 2)
    assert not all(np.array_equal(p[0], q[0]) for p, q in zip(first, other, strict=True))
    # batch k came from worker k mod 2: its labels are those of that worker's shard
    _, labels = ds.records("train")
    for k, (_, yb) in enumerate(first):
        assert set(yb.tolist()) <= set(labels[k % 2::2].tolist())


def test_in_process_feed_is_a_pure_function_of_seed_epoch_and_step(cifar):
    """A resumed run (a fresh feed that starts at epoch 2) sees the batches an uninterrupted one saw."""
    ds, ref = cifar
    shape = (3, 32, 32)
    straight = Feed(ds, ref, batch=BATCH, seed=5, workers=0, augment=True, input_shape=shape)
    list(straight.epoch(1))
    a = list(straight.epoch(2))
    b = list(Feed(ds, ref, batch=BATCH, seed=5, workers=0, augment=True, input_shape=shape).epoch(2))
    assert len(a) == 6 and all(np.array_equal(p[0], q[0]) and np.array_equal(p[1], q[1])
                               for p, q in zip(a, b, strict=True))
    plain = list(Feed(ds, ref, batch=BATCH, seed=5, workers=0, augment=False, input_shape=shape).epoch(2))
    x, _ = ds.arrays("train")
    order = np.random.default_rng([5, 2]).permutation(26)  # the trainer's pre-feed permutation, unchanged
    assert np.array_equal(plain[0][0], x[order[:BATCH]]) and not np.array_equal(a[0][0], plain[0][0])


def test_no_zombie_after_a_pass_or_an_abandoned_one(cifar):
    ds, ref = cifar
    reader = open_stream(ref, "train", batch=BATCH, workers=2, seed=0, epoch=0, train=True, augment=True,
                         layout=CIFAR_LAYOUT)
    pids = reader.pids
    it = iter(reader)
    next(it)
    it.close()  # a consumer that stops mid-pass (an error in the training step)
    assert reader.closed and reaped(pids)
    reader = open_stream(ref, "train", batch=BATCH, workers=2, seed=0, epoch=0, train=True, augment=True,
                         layout=CIFAR_LAYOUT, expected_batches=6)
    assert len(list(reader)) == 6 and reaped(reader.pids)


# ------------------------------------------------------------------ bad streams
def fake_producer(body: str) -> list[str]:
    """A producer that writes by hand: `w(bytes)` writes and flushes."""
    prelude = textwrap.dedent("""
        import struct, sys, time
        out = sys.stdout.buffer
        def w(b):
            out.write(b); out.flush()
    """)
    return [sys.executable, "-c", prelude + textwrap.dedent(body)]


def preamble(batch=2, flat=3, classes=10, label_width=1, magic=MAGIC, version=VERSION):
    return PREAMBLE.pack(magic, version, batch, flat, classes, label_width)


def batch_bytes(rows, flat=3, label=1):
    return (struct.pack("<I", rows) + np.full(rows, label, "<i4").tobytes()
            + np.arange(rows * flat, dtype="<f4").tobytes())


def read_all(cmds, eval_split=True, expected=None):
    reader = StreamReader(cmds, batch=2, layout=Layout(3, (), 10), eval_split=eval_split, expected_batches=expected)
    return list(reader), reader


def test_short_pipe_reads_are_assembled(tmp_path):
    body = f"""
        data = {preamble()!r} + {batch_bytes(2)!r} + {batch_bytes(1)!r}
        for i in range(len(data)):  # one byte per write, so every read is short
            w(data[i:i + 1])
    """
    got, _ = read_all([fake_producer(body)])
    assert [len(y) for _, y in got] == [2, 1]
    assert np.array_equal(got[0][0], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_torn_record_raises_naming_the_worker_and_the_size():
    body = f"w({preamble()!r} + {batch_bytes(2)!r} + {batch_bytes(2)[:-5]!r})"
    with pytest.raises(StreamError, match=r"producer 0 .*torn record in its batch 1: 2 images of 3 floats needs 24 "
                                          r"bytes, got 19 before the stream ended \(exit code 0\)"):
        read_all([fake_producer(body)])
    with pytest.raises(StreamError, match=r"torn record in its batch 0: the row count needs 4 bytes, got 2"):
        read_all([fake_producer(f"w({preamble()!r} + b'\\x02\\x00')")])


def test_wrong_preamble_is_refused_field_by_field():
    with pytest.raises(StreamError, match=r"producer 0 .*: preamble flat is 4, expected 3"):
        read_all([fake_producer(f"w({preamble(flat=4)!r})")])
    with pytest.raises(StreamError, match=r"preamble magic is b'LMSH', expected b'HFST'"):
        read_all([fake_producer(f"w({preamble(magic=b'LMSH')!r})")])
    with pytest.raises(StreamError, match=r"preamble batch is 8, expected 2"):
        read_all([fake_producer(f"w({preamble(batch=8)!r})")])


def test_short_batch_is_refused_on_the_train_split_and_mid_stream_on_eval():
    body = f"w({preamble()!r} + {batch_bytes(1)!r})"
    with pytest.raises(StreamError, match=r"batch 0 has 1 rows; expected exactly 2 \(training batches are full\)"):
        read_all([fake_producer(body)], eval_split=False)
    two = [fake_producer(f"w({preamble()!r} + {batch_bytes(1)!r})"),
           fake_producer(f"w({preamble()!r} + {batch_bytes(2)!r})")]
    with pytest.raises(StreamError, match="sent a short batch that was not the last of the pass"):
        read_all(two)


def test_a_producer_that_dies_is_an_error_naming_it_even_between_batches(cifar, tmp_path):
    body = f"""
        w({preamble()!r} + {batch_bytes(2)!r})
        sys.stderr.write('out of memory\\n')
        sys.exit(3)
    """
    with pytest.raises(StreamError, match=r"producer 0 .*ended its stream after 1 batches and failed \(exit code 3; "
                                          r"its stderr: out of memory\)"):
        read_all([fake_producer(body)])
    # a real producer whose data is missing: the error quotes its one-line reason
    ref = DataRef("cifar10", {"data_dir": str(tmp_path / "nowhere")})
    with pytest.raises(StreamError, match=r"producer 0 \(cifar10 test shard 0/2.*0 of the 24 preamble bytes"
                                          r".*test_batch\.bin not found"):
        list(open_stream(ref, "test", batch=BATCH, workers=2, seed=0, epoch=0, train=False, augment=False,
                         layout=CIFAR_LAYOUT))
    # killed mid-pass
    ds, ref = cifar
    reader = open_stream(ref, "train", batch=BATCH, workers=2, seed=0, epoch=0, train=True, augment=True,
                         layout=CIFAR_LAYOUT, expected_batches=6)
    it = iter(reader)
    next(it)
    reader.workers[1].proc.kill()
    # said as the kill it was: before, 'exit code -9', which named neither the signal nor who sends it
    with pytest.raises(StreamError, match=r"producer 1 .*(torn record|failed) .*killed by SIGKILL, which the kernel's "
                                          r"out-of-memory killer sends when memory runs out, as kill -9 does\)"):
        list(it)
    assert reaped(reader.pids)


def test_a_stream_that_ends_early_is_an_error_on_the_train_split():
    body = f"w({preamble()!r} + {batch_bytes(2)!r})"
    with pytest.raises(StreamError, match="ended after 1 batches, expected 3"):
        read_all([fake_producer(body)], eval_split=False, expected=3)


def test_producer_refuses_a_bad_shard():
    import subprocess

    r = subprocess.run([sys.executable, "-m", "hloforge.datasets.stream", "--data", "cifar10", "--split", "test",
                        "--batch", "4", "--shard", "2/2", "--mode", "eval"], capture_output=True, text=True,
                       env={**os.environ})
    assert r.returncode == 2 and "bad --shard '2/2'" in r.stderr


def test_float_labels_are_refused_rather_than_truncated_to_int32():
    class FloatLabels:
        name, num_classes = "floaty", 2

        def arrays(self, split):
            return np.zeros((3, 1, 2, 2), np.float32), np.full((3, 4), 0.5, np.float32)

    with pytest.raises(DataError, match="float32 labels; the producer stream carries integer labels only"):
        layout_of(FloatLabels(), "train")


# ------------------------------------------------------------------ the trainer
def test_train_with_workers_streams_train_and_eval(cifar, tmp_path, monkeypatch):
    import json

    from hloforge.train.trainer import TrainConfig, train

    net = tmp_path / "cifar-linear.json"
    net.write_text(json.dumps({"name": "cifar-linear", "input_shape": [3072], "num_classes": 10,
                               "layers": [{"kind": "dense", "units": 10}]}))
    cfg = dict(net=str(net), data="cifar10", data_dir=str(tmp_path), epochs=1, batch=BATCH, lr=1e-3)
    m = train(TrainConfig(**cfg, workers=2, run_dir=str(tmp_path / "streamed")), progress=False, log=lambda s: None)
    assert m["n"] == 14 and m["images_per_s"] > 0
    m0 = train(TrainConfig(**cfg, workers=0, run_dir=str(tmp_path / "in_process")), progress=False,
               log=lambda s: None)
    assert m0["n"] == 14
    monkeypatch.setenv(FAULT_ENV, "tail")
    with pytest.raises(DataError, match="the streamed eval pass scored 12 images; the eval split has 14"):
        train(TrainConfig(**cfg, workers=2, run_dir=str(tmp_path / "faulty")), progress=False, log=lambda s: None)


def test_a_streamed_run_never_loads_the_eval_split_whole(cifar, tmp_path, monkeypatch):
    import json

    from hloforge.commands.opening import evaluate_checkpoint, open_checkpoint
    from hloforge.train.trainer import TrainConfig, train

    def whole_split(self, split):  # producers read records; only a random-access consumer may ask for this
        raise AssertionError(f"arrays({split!r}) loaded the whole split")

    net = tmp_path / "cifar-linear.json"
    net.write_text(json.dumps({"name": "cifar-linear", "input_shape": [3072], "num_classes": 10,
                               "layers": [{"kind": "dense", "units": 10}]}))
    with monkeypatch.context() as patch:
        patch.setattr(cifar10.Cifar10, "arrays", whole_split)
        m = train(TrainConfig(net=str(net), data="cifar10", data_dir=str(tmp_path), epochs=1, batch=BATCH, workers=1,
                              run_dir=str(tmp_path / "r")), progress=False, log=lambda s: None)
        assert m["n"] == 14
        # the scorer streams the eval split as the training run did: the same number, still never loaded whole
        assert evaluate_checkpoint(str(tmp_path / "r"), log=lambda s: None).top1 == m["correct"]
        run = open_checkpoint(str(tmp_path / "r"), log=lambda s: None).run
        with pytest.raises(AssertionError, match="loaded the whole split"):
            run.x_te  # noqa: B018 — a consumer that needs random access (cam) is the one that loads it
    x, y = cifar[0].arrays("test")
    assert run.x_te.shape == (14, 3072) and np.array_equal(run.x_te, x.reshape(14, -1))
    assert np.array_equal(run.y_te, y)


def test_split_labels_are_the_transformed_labels_a_chunk_at_a_time(tmp_path, monkeypatch):
    from hloforge.datasets import brats, stream

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 4, 8, 8)).astype(np.uint8)
    masks = rng.integers(0, 4, (5, 8, 8)).astype(np.uint8)
    for name in ("train.bin", "val.bin"):
        (tmp_path / name).write_bytes(struct.pack("<I", 5) + b"".join(
            im.tobytes() + m.tobytes() for im, m in zip(images, masks, strict=True)))
    ds = brats.Brats(str(tmp_path), size=8)
    monkeypatch.setattr(stream, "LABEL_CHUNK", 2)  # 2 + 2 + 1: the short last chunk too
    y = stream.split_labels(ds, "test")
    assert y.dtype == np.int32 and np.array_equal(y, ds.arrays("test")[1]) and np.array_equal(y, masks)


# ------------------------------------------------------------------ the producer's start-up
def test_a_producer_imports_only_the_dataset_plugins(cifar, tmp_path):
    """A producer rebuilds its dataset through the dataset plugins alone: no layer, loss or backend
    module is imported, while the answers (and the errors) stay the full registry's."""
    import subprocess

    code = textwrap.dedent(f"""
        import sys
        from hloforge.core.errors import PluginError
        from hloforge.datasets.stream import DataRef
        ds = DataRef("cifar10", {{"data_dir": {str(tmp_path)!r}}}).make()
        assert type(ds).__name__ == "Cifar10", ds
        heavy = sorted(m for m in sys.modules if m.startswith(("hloforge.backends", "hloforge.plugins",
                                                               "hloforge.losses", "hloforge.core.hlo", "jax")))
        print(heavy)
        try:
            DataRef("imagenet").make()
        except PluginError as e:
            print(e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy, error = r.stdout.splitlines()
    assert heavy == "[]", heavy
    assert error.startswith("unknown dataset 'imagenet'; registered: ") and "cifar10 (hloforge)" in error


def test_a_dataset_registered_under_another_group_still_reaches_the_producer(tmp_path):
    """The dataset-only registry misses a dataset whose module is listed under another entry-point
    group (the full registry sees its hook); the producer then asks the full registry."""
    import subprocess

    site = tmp_path / "site"
    info = site / "oddplugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: oddplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hloforge.losses]\nodd = odd_plugin\n")
    (site / "odd_plugin.py").write_text(textwrap.dedent("""
        import numpy as np
        from hloforge.core.hookspecs import hookimpl

        class Odd:
            name = "oddData"
            num_classes = 2

            def arrays(self, split):
                return np.arange(12, dtype=np.float32).reshape(6, 2), np.array([0, 1] * 3, np.int32)

        @hookimpl
        def hloforge_datasets():
            return [Odd]
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "hloforge.datasets.stream", "--data", "oddData", "--split", "test",
                        "--batch", "4", "--mode", "eval"], capture_output=True, env=env)
    assert r.returncode == 0, r.stderr.decode()
    # the preamble, a batch of 4 rows and the short one of 2: row count, int32 labels, 2 float32 each
    assert len(r.stdout) == PREAMBLE.size + (4 + 4 * 4 + 4 * 8) + (4 + 2 * 4 + 2 * 8)
    magic, version, batch, flat, classes, width = PREAMBLE.unpack(r.stdout[:PREAMBLE.size])
    assert (magic, batch, flat, classes, width) == (MAGIC, 4, 2, 2, 1)
