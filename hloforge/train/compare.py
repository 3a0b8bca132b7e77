"""`hloforge compare`: paired comparison of two runs on the same eval set (McNemar, exact)."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from hloforge.core.errors import DataError
from hloforge.train.config import BITMAP
from hloforge.train.metrics import mcnemar_exact


def load_bitmap(run: str) -> tuple[np.ndarray, str, int]:
    path = os.path.join(run, BITMAP) if os.path.isdir(run) else run
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist; expected a run directory holding {BITMAP}")
    try:
        with np.load(path) as z:
            return z["correct"].astype(bool), str(z["set_id"]), int(z["epoch"])
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{path} is not an eval bitmap ({e})") from None


def compare_runs(run_a: str, run_b: str, log: Callable[[str], None] = print) -> tuple[int, int, float]:
    a, set_a, ep_a = load_bitmap(run_a)
    b, set_b, ep_b = load_bitmap(run_b)
    if set_a != set_b:
        raise DataError(f"the runs were scored on different eval sets ({set_a} vs {set_b}); McNemar needs one set")
    if a.shape != b.shape or a.ndim != 1:  # the set id names the length: a bitmap that disagrees was altered
        raise DataError(f"the bitmaps hold {list(a.shape)} and {list(b.shape)} results for eval set {set_a}; "
                        "expected one per example of that set in each")
    nb, nc, p = mcnemar_exact(a, b)
    n = len(a)
    log(f"A {run_a} (epoch {ep_a}): {a.sum()}/{n}   B {run_b} (epoch {ep_b}): {b.sum()}/{n}")
    log(f"A right, B wrong: {nb}   A wrong, B right: {nc}   McNemar exact p = {p:.4g}")
    return nb, nc, p
