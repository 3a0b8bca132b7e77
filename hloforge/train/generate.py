"""`hloforge generate RUN`: sample text from a trained character-level language model.

The run's checkpoint and config rebuild the net and the text dataset's vocabulary (the same
file, the same split, so the same ids). A forward module at batch 1 runs over a sliding window
of the last T tokens: a shorter context is padded at its end, which a causal model ignores, and
the next token is drawn from softmax(logits at the last real position / temperature)
(temperature 0: the arg max).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs
import numpy as np

from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.train import checkpoint as ckpt
from hloforge.train.session import ForwardSession


def generate(path: str, prompt: str = "\n", tokens: int = 200, temperature: float = 0.8, seed: int = 0,
             backend: str | None = None, out: Callable[[str], None] | None = None) -> str:
    """The prompt followed by `tokens` sampled characters; `out`, if given, receives each piece as it comes."""
    from hloforge.train.trainer import CHECKPOINT, Run, TrainConfig

    if tokens < 0 or temperature < 0:
        raise UnsupportedSpec(f"tokens and temperature must be non-negative, got {tokens} and {temperature}")
    file = os.path.join(path, CHECKPOINT) if os.path.isdir(path) else path
    tensors, meta = ckpt.load_checkpoint(file)
    cfg = TrainConfig(**meta["config"])
    if backend and backend != cfg.backend:
        cfg = attrs.evolve(cfg, backend=backend)
    run = Run(cfg, log=lambda s: None, progress=False)
    if not run.lm or not hasattr(run.data, "encode"):
        raise DataError(f"{file} is not a character language model run (net {run.spec.name!r} on {cfg.data!r})")
    spec = NetSpec.from_dict(meta["spec"], source=file)
    try:
        params = [tensors[f"param/{n}"] for n, _ in spec.params()]
    except KeyError as e:
        raise DataError(f"checkpoint {file} lacks tensor {e.args[0]}") from None
    fwd = ForwardSession(spec, 1, run.backend)
    dev = [run.backend.to_device(p) for p in params]
    t = spec.input_shape[0]
    ids = list(run.data.encode(prompt or "\n"))
    rng = np.random.default_rng(seed)
    emit = out or (lambda s: None)
    emit(prompt)
    pieces = [prompt]
    for _ in range(tokens):
        ctx = ids[-t:]
        x = np.zeros((1, t), np.float32)
        x[0, :len(ctx)] = ctx
        z = fwd.logits(x, dev)[0, len(ctx) - 1].astype(np.float64)
        if temperature == 0:
            nxt = int(np.argmax(z))
        else:
            p = np.exp((z - z.max()) / temperature)
            nxt = int(rng.choice(len(p), p=p / p.sum()))
        ids.append(nxt)
        ch = run.data.decode([nxt])
        emit(ch)
        pieces.append(ch)
    return "".join(pieces)
