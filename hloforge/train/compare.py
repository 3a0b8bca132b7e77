"""`hloforge compare`: paired comparison of two runs on the same eval set (McNemar, exact)."""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable

import numpy as np

from hloforge.core.errors import DataError
from hloforge.train.config import BITMAP
from hloforge.train.metrics import mcnemar_exact


def load_bitmap(run: str) -> tuple[np.ndarray, str, int]:
    path = os.path.join(run, BITMAP) if os.path.isdir(run) else run
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist; expected a run directory holding {BITMAP}")
    # A truncated or corrupt .npz fails in zipfile or zlib, a non-.npz file (np.load gives a bare array,
    # no context manager) or a field of the wrong shape as TypeError.
    try:
        with np.load(path) as z:
            correct, set_id, epoch = z["correct"], str(z["set_id"]), int(z["epoch"])
    except (OSError, EOFError, KeyError, ValueError, TypeError, NotImplementedError, zipfile.BadZipFile,
            zlib.error) as e:
        why = next(iter(str(e).strip().splitlines()), "")
        raise DataError(f"{path} is not an eval bitmap ({type(e).__name__}: {why}); expected the {BITMAP} "
                        "a run writes, whole") from None
    if correct.dtype != bool:  # as bool, any string or number but 0 would read as right: a plausible wrong count
        raise DataError(f"{path}: 'correct' holds {correct.dtype}, expected bool (one right/wrong per example)")
    return correct, set_id, epoch


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
