"""Evaluation statistics: top-k, the Wilson interval, McNemar's exact test (seed 003)."""

from __future__ import annotations

import hashlib
import math

import numpy as np

Z95 = 1.959963984540054


def topk_correct(logits: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Per-example: is the label among the k highest logits."""
    k = min(k, logits.shape[1])
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    return np.any(top == labels[:, None], axis=1)


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
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0**n
    return b, c, min(1.0, 2.0 * tail)


def eval_set_id(dataset: str, split: str, labels: np.ndarray) -> str:
    """Names an eval set, so bitmaps of different sets are never compared."""
    h = hashlib.sha256(np.ascontiguousarray(labels, np.int64).tobytes()).hexdigest()[:16]
    return f"{dataset}:{split}:{len(labels)}:{h}"
