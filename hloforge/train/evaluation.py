"""Scoring a forward module over an eval split: top-1/top-5 (top-5 of a net of more than 5 classes) with the
per-example bitmap, and a language model's bits per character. Below the loop: the run, the tasks and the
commands all score through it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.datasets.stream import check_channels_first
from hloforge.train.metrics import check_finite, check_ids, label_rank, wilson
from hloforge.train.session import ForwardSession


def fit_input(x: np.ndarray, spec: NetSpec, data_name: str, net: str = "") -> np.ndarray:
    """Reshape dataset rows to the net's input shape when only the layout differs (28×28 → 784). `net`: the
    name the config gives the net, for the flag that reshapes a zoo net's input, as a class count's refusal says."""
    if tuple(x.shape[1:]) == spec.input_shape:
        return x
    check_channels_first(data_name, x.shape[1:], spec.input_shape)
    if math.prod(x.shape[1:]) == math.prod(spec.input_shape):
        return x.reshape(len(x), *spec.input_shape)
    from hloforge.zoo import takes_classes  # a zoo net not fixed at one size takes --input as it takes --classes

    given = ",".join(map(str, x.shape[1:]))
    keyword = f"hf.Model's input={tuple(x.shape[1:])}"  # what a Model fit on the dataset takes
    said = f"dataset {data_name!r} gives inputs of shape {list(x.shape[1:])}, but net {spec.name!r} expects " \
           f"{list(spec.input_shape)}"
    if not takes_classes(net):
        raise DataError(said)
    why = input_misfit(net, x.shape[1:])
    raise DataError(f"{said}; pass --input {given} ({keyword}) to give the net that input" if not why else
                    f"{said}, and --input {given} would not build it ({why}); expected data of a shape it takes")


def input_misfit(net: str, shape: Sequence[int]) -> str:
    """Why zoo net `net` cannot be built at input `shape` ('' where it can), so a refusal offers `--input` only
    for a shape the net takes (a ViT's patch or a ConvNeXt's 2×2 downsample refuses some)."""
    from hloforge.zoo import get_net

    try:
        get_net(net, input=tuple(shape))
    except UnsupportedSpec as e:
        return str(e)
    return ""


TOP_K = 5  # top-5 accuracy: the label among the 5 highest logits


def scores_top5(classes: int) -> bool:
    """Whether a top-5 accuracy says anything: of 5 classes or fewer every label is in the top 5 (always 100%)."""
    return classes > TOP_K


@attrs.frozen
class EvalResult:
    top1: int
    top5: int | None  # None: a net of 5 classes or fewer (scores_top5)
    n: int
    correct: np.ndarray
    nll: float = math.nan  # the mean cross-entropy of the softmax over the logits

    def line(self) -> str:
        lo, hi = wilson(self.top1, self.n)
        return (f"top-1 {100 * self.top1 / self.n:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}] ({self.top1}/{self.n})"
                + ("" if self.top5 is None else f"  top-5 {100 * self.top5 / self.n:.2f}%"))


@attrs.frozen
class LMEvalResult:
    bits_per_char: float
    n: int  # targets scored

    def line(self) -> str:
        return f"{self.bits_per_char:.4f} bits/char ({self.n} chars)"


def evaluate_lm(evaluator: ForwardSession, buffers: list[Any], x: np.ndarray, y: np.ndarray) -> LMEvalResult:
    """Bits per character over every validation target (labels −1 are padding, not scored)."""
    from hloforge.datasets.text import IGNORE, bits_per_char

    if not (np.asarray(y) != IGNORE).any():  # bits per character of no character: NaN, not a score
        raise DataError(f"eval token labels are all the padding id {IGNORE}, so no token is scored; expected at "
                        "least one id of the vocabulary")
    logits = evaluator.logits(x, buffers)
    check_ids(y, logits.shape[-1], "eval token labels", lowest=IGNORE)
    check_finite(logits, "eval logits")
    return LMEvalResult(*bits_per_char(logits, y))


def evaluate(evaluator: ForwardSession, buffers: list[Any], x: np.ndarray, y: np.ndarray) -> EvalResult:
    """Every eval image scored exactly once, the short last batch included."""
    logits = evaluator.logits(x, buffers)
    rank = label_rank(logits, y)
    c1 = rank < 1
    top5 = int((rank < TOP_K).sum()) if scores_top5(logits.shape[1]) else None
    return EvalResult(int(c1.sum()), top5, len(y), c1, float(nll_sum(logits, y) / max(len(y), 1)))


def nll_sum(logits: np.ndarray, y: np.ndarray, chunk: int = 4096) -> float:
    """The summed cross-entropy −log softmax(logits)[y], in float64 a chunk of rows at a time."""
    total = 0.0
    for i in range(0, len(y), chunk):
        z = logits[i:i + chunk].astype(np.float64)
        z = z - z.max(axis=1, keepdims=True)
        total += float((np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(z)), y[i:i + chunk]]).sum())
    return total


def evaluate_stream(evaluator: ForwardSession, buffers: list[Any], batches: Iterable[tuple[np.ndarray, np.ndarray]],
                    n_eval: int) -> EvalResult:
    """The eval pass over streamed batches, in stream order. A pass that does not score the whole
    split (a dropped tail) is an error, never a plausible accuracy over fewer images."""
    c1, c5 = [np.zeros(0, bool)], [np.zeros(0, bool)]
    nll, top5 = 0.0, False
    for x, y in batches:
        logits = evaluator.logits(x, buffers)
        rank = label_rank(logits, y)
        c1.append(rank < 1)
        c5.append(rank < TOP_K)
        nll += nll_sum(logits, y)
        top5 = scores_top5(logits.shape[1])
    top1 = np.concatenate(c1)
    if len(top1) != n_eval:
        raise DataError(f"the streamed eval pass scored {len(top1)} images; the eval split has {n_eval}")
    return EvalResult(int(top1.sum()), int(np.concatenate(c5).sum()) if top5 else None, n_eval, top1,
                      nll / max(n_eval, 1))

