"""`hloforge generate RUN`: sample text from a trained character-level language model.

The run's checkpoint and config rebuild the net and the text dataset's vocabulary (the same
file, the same split, so the same ids). A forward module at batch 1 runs over a sliding window
of the last T tokens: a shorter context is padded at its end, which a causal model ignores, and
the next token is drawn from softmax(logits at the last real position / temperature)
(temperature 0: the arg max).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from hloforge.core.errors import DataError, HloforgeWarning, UnsupportedSpec
from hloforge.core.regions import DEFAULT_REGION
from hloforge.train.session import ForwardSession


def generate(path: str, prompt: str = "\n", tokens: int = 200, temperature: float = 0.8, seed: int = 0,
             backend: str | None = None, out: Callable[[str], None] | None = None, data_dir: str | None = None,
             data_file: str | None = None, region: str = DEFAULT_REGION) -> str:
    """The prompt followed by `tokens` sampled characters; `out`, if given, receives each piece as it comes.
    `data_dir`, `data_file`: where the run's data is now, when it moved (`open_checkpoint`'s). `region`: the
    weights, as `hloforge eval` scores them (by default the EMA shadow where the run kept one)."""
    from hloforge.commands.opening import open_checkpoint

    if tokens < 0 or temperature < 0:
        raise UnsupportedSpec(f"tokens and temperature must be non-negative, got {tokens} and {temperature}")
    oc = open_checkpoint(path, backend, log=lambda s: None, data_dir=data_dir, data_file=data_file)
    run, spec = oc.run, oc.spec
    if not run.lm or not hasattr(run.data, "encode"):
        raise DataError(f"{oc.file} is not a character language model run (net {spec.name!r} on {run.cfg.data!r})")
    _, params, running = oc.region_weights(region)  # the weights eval scored: θ or the EMA shadow
    params = [*params, *running]
    fwd = ForwardSession(spec, 1, run.backend)
    t = spec.input_shape[0]
    unknown = run.data.unknown(prompt) if hasattr(run.data, "unknown") else []
    if unknown:  # the net reads them as one token, the one it learnt for the corpus' rare characters
        shown = ", ".join(repr(c) for c in unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        known = len(run.data.chars) - 1  # the corpus's characters (num_classes − 1 only where it fills the vocabulary)
        # a corpus of fewer characters has no rarer one in training: the net never saw that token
        unseen = "" if known == run.data.num_classes - 1 else \
            ", which training never showed the net (its corpus has none)"
        warnings.warn(HloforgeWarning(f"the prompt's {shown} are not in the run's vocabulary of {known} characters: "
                                      f"each is read as its other-character token{unseen}"), stacklevel=2)
    ids = list(run.data.encode(prompt or "\n"))
    rng = np.random.default_rng(seed)
    emit = out or (lambda s: None)
    emit(prompt)
    pieces = [prompt]
    for _ in range(tokens):
        ctx = ids[-t:]
        x = np.zeros((1, t), np.float32)
        x[0, :len(ctx)] = ctx
        z = fwd.logits(x, params, gen=0)[0, len(ctx) - 1].astype(np.float64)  # θ pushed once, held
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
