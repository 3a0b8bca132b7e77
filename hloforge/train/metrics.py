"""Evaluation statistics: top-k, the Wilson interval, McNemar's exact test (seed 003)."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from hloforge.core.errors import DataError

Z95 = 1.959963984540054


def label_rank(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-example: the label's place among the logits sorted high to low, ties going to the lower class
    index (as np.argmax breaks them, so rank 0 is the predicted class); top-k is rank < k. A label that
    is no class of the logits (another net's, a wrong dtype) is refused: it would score as a plausible miss."""
    check_ids(labels, logits.shape[1], "eval labels")
    check_finite(logits, "eval logits")
    mine = logits[np.arange(len(labels)), labels][:, None]
    lower = np.arange(logits.shape[1])[None, :] < labels[:, None]
    return np.sum((logits > mine) | ((logits == mine) & lower), axis=1)


def check_finite(logits: np.ndarray, what: str) -> None:
    """Refuse NaN or inf logits: a NaN ranks last and an inf first, scoring a plausible miss or hit."""
    bad = ~np.isfinite(logits)
    if bad.any():
        nan = int(np.isnan(logits).sum())
        raise DataError(f"{what} hold {nan} NaN and {int(bad.sum()) - nan} infinite values, expected finite "
                        "numbers; a net that diverged or overflows is not scored")


def check_ids(labels: np.ndarray, classes: int, what: str, lowest: int = 0) -> None:
    """Integer labels in lowest..classes−1 (lowest −1: padding allowed), else one line naming them."""
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise DataError(f"{what} have dtype {labels.dtype}, expected integer ids")
    if labels.size and (labels.min() < lowest or labels.max() >= classes):
        raise DataError(f"{what} span {int(labels.min())}..{int(labels.max())}, expected ids {lowest}..{classes - 1}")


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The 95% Wilson score interval on an accuracy, as (lo, hi) fractions.

    Wilson, not p ± z·√(p(1−p)/n): the normal form collapses to ±0 at 0 or n correct,
    which would print a certain 0% for a run that scored nothing. It is measurement
    error only — to compare two models on the same set use McNemar on their bitmaps.
    """
    if n <= 0:
        raise ValueError("Wilson interval of an empty eval set")
    p = correct / n
    den = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z / den * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(a_correct: np.ndarray, b_correct: np.ndarray) -> tuple[int, int, float]:
    """Exact two-sided McNemar test on paired correctness: (b, c, p) with b = A right & B wrong,
    c = A wrong & B right, p = min(1, 2·P[Binom(b+c, ½) ≤ min(b, c)])."""
    a, b_ = np.asarray(a_correct, bool), np.asarray(b_correct, bool)
    b = int(np.sum(a & ~b_))
    c = int(np.sum(~a & b_))
    n = b + c
    if n == 0:
        return b, c, 1.0
    return b, c, min(1.0, 2.0 * binom_half_cdf(min(b, c), n))


def binom_half_cdf(k: int, n: int) -> float:
    """P[Binom(n, ½) ≤ k], for n in the millions: the terms C(n, i) relative to the largest one
    C(n, k) (k ≤ n/2, so they fall going down), summed, then scaled in log space — 2^n and C(n, k)
    overflow a float past n ≈ 1023."""
    if k >= n:
        return 1.0
    if 2 * k > n:  # P[X ≤ k] = 1 − P[X ≤ n − k − 1] by symmetry
        return 1.0 - binom_half_cdf(n - k - 1, n)
    i = np.arange(k, 0, -1, dtype=np.float64)  # C(n, i−1) = C(n, i)·i/(n − i + 1)
    rel = 1.0 + float(np.sum(np.cumprod(i / (n - i + 1.0))))
    log_top = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0)
    return min(1.0, math.exp(log_top + math.log(rel)))


# How many of an eval set's input values its id hashes at most: evenly spaced, so that another set of images
# under the same labels differs in them, and a set of gigabytes hashes in milliseconds.
INPUT_SAMPLES = 1 << 20


class EvalSetId(str):
    """An eval set's id; `legacy`: the id as it was written before the inputs' layout was left out of it (their
    whole shape hashed, so an MLP's flat rows and a CNN's images of one split were two sets), still the same set
    to a checkpoint or bitmap of then."""

    legacy: str = ""


def eval_set_id(dataset: str, split: str, labels: np.ndarray, inputs: np.ndarray | None) -> str:
    """Names an eval set (DATASET:SPLIT:N:LABELS-HASH:INPUTS-HASH), so that a run is never scored, resumed or
    compared on another: its labels, and up to INPUT_SAMPLES of its input values, as float32, with the count
    of values per example (not their layout: nets of flat rows and of images score one set). `inputs` None
    (a run that streams its eval never holds them): DATASET:SPLIT:N:LABELS-HASH, which matches any id of
    those labels (same_eval_set)."""
    h = hashlib.sha256(np.ascontiguousarray(labels, np.int64).tobytes()).hexdigest()[:16]
    if inputs is None:
        return f"{dataset}:{split}:{len(labels)}:{h}"
    flat = np.asarray(inputs).reshape(-1)
    sample = np.ascontiguousarray(flat[::max(1, flat.size // INPUT_SAMPLES)][:INPUT_SAMPLES], np.float32).tobytes()
    shape = np.shape(inputs)
    rows = (shape[0], math.prod(shape[1:])) if shape else shape

    def named(s: tuple[int, ...]) -> str:
        return f"{dataset}:{split}:{len(labels)}:{h}:{hashlib.sha256(repr(s).encode() + sample).hexdigest()[:16]}"

    out = EvalSetId(named(rows))
    out.legacy = named(shape)
    return out


def same_eval_set(a: str, b: str) -> bool:
    """Whether two eval set ids name one set. An id without its inputs' hash (written before they were hashed,
    or by a run that streams its eval) names every set of those labels, so it matches on them. An EvalSetId
    also matches by its legacy form."""
    return any(x == y or any(new.startswith(old + ":") and new.count(":") == old.count(":") + 1
                             for old, new in ((x, y), (y, x)))
               for x in _forms(a) for y in _forms(b))


def _forms(set_id: str) -> list[str]:
    legacy = getattr(set_id, "legacy", "")
    return [str(set_id), legacy] if legacy else [str(set_id)]


def check_eval_set(scored_on: str | None, now: str, data: str, where: str) -> None:
    """Refuse a test split other than the one a run was scored on (`scored_on`; None: not known): a corpus or data
    file edited or replaced since would score (and a text run decode) plausibly and wrongly."""
    if scored_on is not None and not same_eval_set(scored_on, now):
        raise DataError(f"{where}: the test split of dataset {data!r} is not the one the run was scored on "
                        f"({describe_eval_set(now)} now, {describe_eval_set(scored_on)} then); its data changed since")


def describe_eval_set(set_id: str) -> str:
    """An `eval_set_id` as a message says it: "360 examples, labels hash 1a2b…, inputs hash 3c4d…" (an
    older id: "360 labels, hash 1a2b…")."""
    parts = set_id.split(":")
    if len(parts) >= 5:
        return f"{parts[-3]} examples, labels hash {parts[-2]}, inputs hash {parts[-1]}"
    return f"{parts[-2]} labels, hash {parts[-1]}" if len(parts) == 4 else set_id
