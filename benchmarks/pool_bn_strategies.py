"""Time the maxPool and bnReduce lowering strategies against each other, interleaved in one process.

    python benchmarks/pool_bn_strategies.py --backend xla --what layers --rounds 30
    python benchmarks/pool_bn_strategies.py --backend iree --what steps --nets mnist-cnn --rounds 8

"layers": the forward + backward module of one layer (vjp_module, target = the backend) at the
shapes the nets use, once per choice; "steps": a whole Adam train step (TrainSession) of a zoo
net, once per choice. Each round runs every choice once, in a rotating order, so a noisy
neighbour slows all choices alike; it prints the median ms per choice with its quartiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hloforge.core import strategy
from hloforge.core.modules import vjp_module
from hloforge.core.spec import Layer, Shape
from hloforge.plugins.layers.norm import BatchNorm
from hloforge.plugins.layers.pool import MaxPool
from hloforge.train.session import make_backend

# (label, layer, input shape, batch, strategy kind): the maxPools of mnist-cnn at batch 128, the
# batch norms of resnet-mini (batch 128) and resnet18-cifar's first stage (batch 32).
LAYERS: list[tuple[str, Layer, Shape, int, str]] = [
    ("maxPool 32x28x28 b128", MaxPool(2), (32, 28, 28), 128, "maxPool"),
    ("maxPool 64x14x14 b128", MaxPool(2), (64, 14, 14), 128, "maxPool"),
    ("batchNorm 16x28x28 b128", BatchNorm(act="relu"), (16, 28, 28), 128, "bnReduce"),
    ("batchNorm 64x7x7 b128", BatchNorm(act="relu"), (64, 7, 7), 128, "bnReduce"),
    ("batchNorm 64x32x32 b32", BatchNorm(act="relu"), (64, 32, 32), 32, "bnReduce"),
]
NET_KINDS = {"mnist-cnn": "maxPool", "resnet-mini": "bnReduce", "resnet18-cifar": "bnReduce"}
NET_BATCH = {"mnist-cnn": 128, "resnet-mini": 128, "resnet18-cifar": 32}


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2) -> dict[str, list[float]]:
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    ms: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            fns[n]()
            ms[n].append((time.perf_counter() - t) * 1e3)
    return ms


def report(label: str, ms: dict[str, list[float]]) -> None:
    for name, xs in ms.items():
        q = statistics.quantiles(xs, n=4)
        print(f"{label:28} {name:10} median {statistics.median(xs):9.2f} ms  (q1 {q[0]:.2f}, q3 {q[2]:.2f}, "
              f"n={len(xs)})", flush=True)


def layer_runner(backend: Any, layer: Layer, shape: Shape, batch: int, choice: dict[str, str],
                 target: str) -> Callable[[], Any]:
    import re

    with strategy.forced(choice):
        text = vjp_module([layer], shape, batch, target=target)
    sig = re.search(r"@main\((.*?)\) ->", text)
    assert sig is not None
    shapes = [tuple(int(d) for d in t.split("x")[:-1]) for t in re.findall(r"tensor<([0-9x]*)f32>", sig.group(1))]
    rng = np.random.default_rng(0)
    ins = [backend.to_device(np.maximum(rng.standard_normal(s), 0).astype(np.float32)) for s in shapes]
    exe = backend.compile(text)

    def run() -> Any:  # read back the smallest output only: the step is done when any output is
        outs = backend.execute(exe, ins)
        return backend.to_host(min(outs, key=lambda o: int(np.prod(o.shape))))

    return run


def step_runner(backend: Any, net: str, choice: dict[str, str]) -> Callable[[], Any]:
    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession
    from hloforge.zoo import get_net

    spec = get_net(net)
    batch = NET_BATCH[net]
    with strategy.forced(choice):
        session = TrainSession(spec, Variant("adam"), batch, backend, seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, spec.num_classes, batch).astype(np.int32)

    def run() -> float:
        return session.train_step(x, y, 1e-3)

    return run


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="xla", choices=list(strategy.targets()))
    p.add_argument("--what", default="layers", choices=("layers", "steps"))
    p.add_argument("--nets", default="mnist-cnn,resnet-mini")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    be = make_backend(args.backend)
    if args.what == "layers":
        for label, layer, shape, batch, kind in LAYERS:
            fns = {c: layer_runner(be, layer, shape, batch, {kind: c}, args.backend)
                   for c in strategy.kind(kind).choices}
            report(f"{args.backend} {label}", interleaved(fns, args.rounds))
    else:
        for net in args.nets.split(","):
            kind = NET_KINDS[net]
            fns = {c: step_runner(be, net, {kind: c}) for c in strategy.kind(kind).choices}
            report(f"{args.backend} {net} step", interleaved(fns, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
