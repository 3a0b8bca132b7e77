"""The training loop: schedule, fused train steps on the device, per-epoch evaluation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, HloforgeError
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.train.session import ForwardSession, TrainSession, make_backend
from hloforge.zoo import get_net


@attrs.frozen
class TrainConfig:
    net: str = "mnist-mlp"
    data: str = "digits"
    backend: str = "xla"
    epochs: int = 5
    batch: int = 64
    optimizer: str = "adam"
    lr: float = 1e-3
    warmup_epochs: float = 0.0
    weight_decay: float | None = None
    label_smoothing: float = 0.0
    seed: int = 0


def lr_at(cfg: TrainConfig, step: int, steps_per_epoch: int) -> float:
    """Linear warmup, then cosine decay to zero over the run (step is 0-based)."""
    total = cfg.epochs * steps_per_epoch
    warm = int(cfg.warmup_epochs * steps_per_epoch)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    t = (step - warm) / max(total - warm, 1)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * t))


def fit_input(x: np.ndarray, spec: NetSpec, data_name: str) -> np.ndarray:
    """Reshape dataset rows to the net's input shape when only the layout differs (28×28 → 784)."""
    if tuple(x.shape[1:]) == spec.input_shape:
        return x
    if math.prod(x.shape[1:]) == math.prod(spec.input_shape):
        return x.reshape(len(x), *spec.input_shape)
    raise DataError(f"dataset {data_name!r} gives inputs of shape {list(x.shape[1:])}, but net {spec.name!r} "
                    f"expects {list(spec.input_shape)}")


def train(cfg: TrainConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    reg = default_registry()
    spec = get_net(cfg.net)
    data = reg.get("dataset", cfg.data)()
    if data.num_classes != spec.num_classes:
        raise DataError(f"dataset {cfg.data!r} has {data.num_classes} classes, net {spec.name!r} "
                        f"has {spec.num_classes}")
    x_tr, y_tr = data.arrays("train")
    x_te, y_te = data.arrays("test")
    x_tr, x_te = fit_input(x_tr, spec, cfg.data), fit_input(x_te, spec, cfg.data)
    steps_per_epoch = len(x_tr) // cfg.batch
    if steps_per_epoch == 0:
        raise DataError(f"batch {cfg.batch} is larger than the {len(x_tr)}-image training split")
    backend = make_backend(cfg.backend, reg)
    variant = Variant(cfg.optimizer, cfg.weight_decay, "crossEntropy", cfg.label_smoothing)
    t0 = time.perf_counter()
    session = TrainSession(spec, variant, cfg.batch, backend, seed=cfg.seed, registry=reg)
    evaluator = ForwardSession(spec, cfg.batch, backend)
    log(f"hloforge: {spec.name} ({spec.param_count():,} params) on {cfg.data} "
        f"({len(x_tr)} train / {len(x_te)} test) | backend {backend.backend_name()}")
    log(f"  {variant.slug}: lr {cfg.lr:g} cosine, batch {cfg.batch}, {cfg.epochs} epochs "
        f"| compiled in {time.perf_counter() - t0:.1f}s")
    rng = np.random.default_rng(cfg.seed)
    metrics: dict[str, Any] = {}
    for epoch in range(1, cfg.epochs + 1):
        order = rng.permutation(len(x_tr))
        t = time.perf_counter()
        losses = []
        for s in range(steps_per_epoch):
            idx = order[s * cfg.batch:(s + 1) * cfg.batch]
            step = (epoch - 1) * steps_per_epoch + s
            loss = session.train_step(x_tr[idx], y_tr[idx], lr_at(cfg, step, steps_per_epoch))
            if not math.isfinite(loss):
                raise HloforgeError(f"loss is {loss} at epoch {epoch}, step {s + 1} (lr "
                                    f"{lr_at(cfg, step, steps_per_epoch):g}); stopping rather than training on")
            losses.append(loss)
        secs = time.perf_counter() - t
        logits = evaluator.logits(x_te, session.params)
        correct = int(np.sum(np.argmax(logits, 1) == y_te))
        metrics = {"epoch": epoch, "loss": float(np.mean(losses)), "top1": correct / len(y_te),
                   "correct": correct, "n": len(y_te), "images_per_s": steps_per_epoch * cfg.batch / secs}
        log(f"epoch {epoch}/{cfg.epochs}  loss {metrics['loss']:.4f}  test top-1 {100 * metrics['top1']:.2f}% "
            f"({correct}/{len(y_te)})  {metrics['images_per_s']:.0f} img/s")
    return metrics
