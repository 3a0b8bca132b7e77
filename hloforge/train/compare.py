"""`hloforge compare`: paired comparison of two runs on the same eval set (McNemar, exact).

Each run is compared on the weights `hloforge eval`, `export` and `train --init` read by default: with
`region` auto, the EMA shadow where the run kept one, else its live weights (`live` / `ema` pick one, as
eval's --region). A run's eval_correct.npz holds its live weights' results; the shadow's are scored from
its checkpoint (the same eval pass `hloforge eval --region ema` runs), and so are both of a directory holding a
checkpoint but no bitmap (Model.save, import-weights and ModelCheckpoint write none). Each line says which region."""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from hloforge.core.errors import DataError, HloforgeError
from hloforge.core.regions import DEFAULT_REGION, check_region
from hloforge.train.config import BITMAP, CHECKPOINT
from hloforge.train.metrics import mcnemar_exact, same_eval_set


def load_bitmap(run: str) -> tuple[np.ndarray, str, int]:
    path = os.path.join(run, BITMAP) if os.path.isdir(run) else run
    if not os.path.exists(path):
        raise DataError(_no_classifier(run) or f"{path} does not exist; expected a run directory holding {BITMAP}")
    if os.path.isfile(path) and not _magic(path):  # np.load would take it for a pickle, advising to load it unsafely
        raise DataError(f"{path} is not an eval bitmap (neither an .npz archive nor a .npy array); expected the "
                        f"{BITMAP} a run writes, whole")
    # A truncated or corrupt .npz fails in zipfile or zlib, a non-.npz file (np.load gives a bare array,
    # no context manager) or a field of the wrong shape as TypeError.
    try:
        with np.load(path) as z:
            correct, set_id, epoch = z["correct"], str(z["set_id"]), int(z["epoch"])
    except (OSError, EOFError, KeyError, ValueError, TypeError, NotImplementedError, zipfile.BadZipFile,
            zlib.error) as e:
        why = (e.strerror.lower() if isinstance(e, OSError) and e.strerror  # the OS's reason, not its errno
               else f"{type(e).__name__}: {next(iter(str(e).strip().splitlines()), '')}")
        raise DataError(f"{path} is not an eval bitmap ({why}); expected the {BITMAP} "
                        "a run writes, whole") from None
    if correct.dtype != bool:  # as bool, any string or number but 0 would read as right: a plausible wrong count
        raise DataError(f"{path}: 'correct' holds {correct.dtype}, expected bool (one right/wrong per example)")
    return correct, set_id, epoch


def _magic(path: str) -> bool:
    """Whether the file starts as an .npz (a zip archive) or .npy file does; an unreadable one is np.load's to say."""
    try:
        with open(path, "rb") as f:
            return f.read(6).startswith((b"PK", b"\x93NUMPY"))
    except OSError:
        return True


def _no_classifier(run: str) -> str:
    """Why a run directory holds no bitmap when its net is no classifier (a language model, DDPM, detector,
    segmentation net): its eval scores no example right or wrong, so it never writes one; "" otherwise."""
    from hloforge.core.spec import NetSpec
    from hloforge.train import checkpoint as ckpt

    file = os.path.join(run, CHECKPOINT)
    if not os.path.isfile(file):
        return ""
    try:
        spec = NetSpec.from_dict(ckpt.load_meta(file)["spec"], source=file)
    except HloforgeError:  # an unreadable checkpoint, a net of a plugin not installed: the missing bitmap alone
        return ""
    if len(spec.out_shape) == 1:
        return ""
    return (f"run {run} trained {spec.name!r} (output {list(spec.out_shape)}), no classifier: its eval scores no "
            f"example right or wrong, so it keeps no {BITMAP}; compare takes two classifier runs")


def region_bitmap(run: str, region: str = DEFAULT_REGION,
                  score: Callable[[str, str], np.ndarray] | None = None) -> tuple[np.ndarray, str, int, str]:
    """(per-example right/wrong, the eval set's id, the epoch, the region resolved) of `run` (a run directory
    or its eval_correct.npz) for `region`: the bitmap the run wrote for its live weights, or `score(run
    directory, region)`: its checkpoint scored as `hloforge eval --region` scores it (the caller's, which opens
    checkpoints), for its EMA shadow, or for a directory holding a checkpoint but no bitmap."""
    from hloforge.train import checkpoint as ckpt

    folder = run if os.path.isdir(run) else os.path.dirname(run) or "."
    file = os.path.join(folder, CHECKPOINT)
    unscored = (os.path.isdir(run) and not os.path.exists(os.path.join(run, BITMAP)) and os.path.isfile(file)
                and not _no_classifier(run))
    if unscored and score is not None:  # a saved model (Model.save, import-weights): scored as `hloforge eval` does
        meta = ckpt.load_meta(file)
        resolved = "ema" if _keeps_shadow(meta) and region != "live" else "live"  # eval refuses ema without one
        correct = np.asarray(score(folder, region), bool)
        return correct, str(meta.get("eval_set", "")), int(meta["epoch"]), resolved
    correct, set_id, epoch = load_bitmap(run)
    if not os.path.exists(file):  # a bitmap alone: its live weights' results, all there is
        if region == "ema":
            raise DataError(f"{run}: no {CHECKPOINT} beside its {BITMAP} to score an EMA shadow from; expected a "
                            "run directory, or --region live")
        return correct, set_id, epoch, "live"
    _, meta = ckpt.load_checkpoint(file)
    shadows = _keeps_shadow(meta)
    kept = int(meta.get("epoch", epoch))
    if kept != epoch:  # a run stopped between an epoch's bitmap and its checkpoint: the bitmap's weights were not kept
        if score is None:
            raise DataError(f"{run}: its {BITMAP} is of epoch {epoch}, its {CHECKPOINT} of epoch {kept} (the run "
                            "stopped between them); resume it, or score its checkpoint")
        resolved = "ema" if shadows and region != "live" else "live"
        return np.asarray(score(folder, resolved), bool), str(meta.get("eval_set", set_id)), kept, resolved
    if region == "ema" and not shadows:
        raise DataError(f"checkpoint {file} has no EMA shadow (its run was trained without --ema); use --region live")
    if region == "live" or not shadows:
        return correct, set_id, epoch, "live"
    assert score is not None, "comparing an EMA shadow needs score"
    return np.asarray(score(folder, "ema"), bool), set_id, int(meta.get("epoch", epoch)), "ema"


def _keeps_shadow(meta: dict[str, Any]) -> bool:
    """Whether a checkpoint's run kept an EMA shadow (its variant's ema)."""
    variant = meta.get("variant", {})
    return isinstance(variant, dict) and float(variant.get("ema", 0.0) or 0.0) > 0.0


def compare_runs(run_a: str, run_b: str, log: Callable[[str], None] = print, region: str = DEFAULT_REGION,
                 score: Callable[[str, str], np.ndarray] | None = None) -> tuple[int, int, float]:
    """McNemar's exact test on two runs' per-example results, each on `region`'s weights (region_bitmap)."""
    check_region(region)  # a bad name is refused before anything is opened
    a, set_a, ep_a, reg_a = region_bitmap(run_a, region, score)
    b, set_b, ep_b, reg_b = region_bitmap(run_b, region, score)
    if not same_eval_set(set_a, set_b):
        raise DataError(f"the runs were scored on different eval sets ({set_a} vs {set_b}); McNemar needs one set")
    if a.shape != b.shape or a.ndim != 1:  # the set id names the length: a bitmap that disagrees was altered
        raise DataError(f"the bitmaps hold {list(a.shape)} and {list(b.shape)} results for eval set {set_a}; "
                        "expected one per example of that set in each")
    nb, nc, p = mcnemar_exact(a, b)
    n = len(a)
    log(f"A {run_a} (epoch {ep_a}, {reg_a} weights): {a.sum()}/{n}   B {run_b} (epoch {ep_b}, {reg_b} weights): "
        f"{b.sum()}/{n}")
    log(f"A right, B wrong: {nb}   A wrong, B right: {nc}   McNemar exact p = {p:.4g}")
    return nb, nc, p
