"""Producer throughput against train-step throughput: is the loader the bottleneck?

    python benchmarks/producers.py [--images 10000] [--batch 128] [--steps 30] [--json out.json]

Writes a synthetic CIFAR-10 in its real binary format (random pixels), then measures, in images/s:

- producers: one epoch of cifar10 training batches (random crop with padding 4, flip,
  normalisation) read through `hloforge.datasets.stream.Feed` with 0 (in process), 1 and 2
  producer workers, spawn included — nothing else running;
- train step: the median Adam step of mnist-cnn (1×28×28) and resnet-mini (at 3×32×32) on
  the XLA backend, on a batch already in memory;
- end to end: resnet-mini trained from the feed with 0, 1 and 2 workers, so the producers and
  the step share the machine's cores as they do in a real run.

The loader is not the bottleneck when the producer rate is well above the step rate and the
end-to-end rate stays near the step-only rate. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from hloforge.datasets import cifar10
from hloforge.datasets.stream import DataRef, Feed


def write_synthetic_cifar(d: str, images: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    per_file = max(1, images // 5)
    for name in [*cifar10.FILES["train"], *cifar10.FILES["test"]]:
        rec = rng.integers(0, 256, (per_file, cifar10.RECORD), dtype=np.uint8)
        rec[:, 0] %= 10
        rec.tofile(os.path.join(d, name))


def feed_rate(ds: cifar10.Cifar10, ref: DataRef, batch: int, workers: int) -> tuple[float, float, int]:
    """(img/s over the epoch with the spawn, img/s after the first batch arrived, images)."""
    feed = Feed(ds, ref, batch=batch, seed=0, workers=workers, augment=True, input_shape=(3, 32, 32))
    t0 = time.perf_counter()
    n, t1 = 0, 0.0
    for _, y in feed.epoch(1):
        if n == 0:
            t1 = time.perf_counter()
        n += len(y)
    t2 = time.perf_counter()
    return n / (t2 - t0), (n - batch) / (t2 - t1), n


def step_rate(net: str, input_shape: tuple[int, ...] | None, batch: int, steps: int) -> float:
    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession, make_backend
    from hloforge.zoo import get_net

    spec = get_net(net, None, input_shape)
    session = TrainSession(spec, Variant("adam"), batch, make_backend("xla"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, spec.num_classes, batch).astype(np.int32)
    for _ in range(3):
        session.train_step(x, y, 1e-3)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        session.train_step(x, y, 1e-3)
        times.append(time.perf_counter() - t)
    return batch / statistics.median(times)


def end_to_end_rate(ds: cifar10.Cifar10, ref: DataRef, batch: int, workers: int, steps: int) -> float:
    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession, make_backend
    from hloforge.zoo import get_net

    spec = get_net("resnet-mini", None, (3, 32, 32))
    session = TrainSession(spec, Variant("adam"), batch, make_backend("xla"))
    feed = Feed(ds, ref, batch=batch, seed=0, workers=workers, augment=True, input_shape=spec.input_shape)
    it = feed.epoch(1)
    x, y = next(it)
    session.train_step(x, y, 1e-3)  # warm: the first step and the producers' start-up are not timed
    t = time.perf_counter()
    done = 0
    for x, y in it:
        session.train_step(x, y, 1e-3)
        done += 1
        if done == steps:
            break
    secs = time.perf_counter() - t
    it.close()
    return done * batch / secs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=10000, help="training images in the synthetic CIFAR-10")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30, help="timed train steps per measurement")
    p.add_argument("--json", help="also write the numbers here")
    a = p.parse_args(argv)
    res: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        write_synthetic_cifar(d, a.images)
        ds, ref = cifar10.Cifar10(d), DataRef("cifar10", {"data_dir": d})
        print(f"cifar10-style batches of {a.batch} (crop+pad 4, flip, normalise), {len(ds.records('train')[1])} "
              f"train images; {os.cpu_count()} CPUs (shared, noisy)")
        for w in (0, 1, 2):
            rate, steady, n = feed_rate(ds, ref, a.batch, w)
            res[f"producer_w{w}"], res[f"producer_w{w}_steady"] = rate, steady
            print(f"  producers  workers={w}: {rate:9.0f} img/s over {n} images with the spawn, "
                  f"{steady:9.0f} img/s after the first batch")
        for net, shape in (("mnist-cnn", None), ("resnet-mini", (3, 32, 32))):
            rate = step_rate(net, shape, a.batch, a.steps)
            res[f"step_{net}"] = rate
            print(f"  train step {net} {'x'.join(map(str, shape or (1, 28, 28)))}: {rate:9.0f} img/s")
        for w in (0, 1, 2):
            rate = end_to_end_rate(ds, ref, a.batch, w, a.steps)
            res[f"end_to_end_resnet-mini_w{w}"] = rate
            print(f"  end to end resnet-mini workers={w}: {rate:9.0f} img/s")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
