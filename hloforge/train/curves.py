"""A run's curves (curves.png): train loss and the task's metric over the epochs, drawn from its
metrics (metrics.jsonl's epoch records, or a Model's history). Drawn once at the end of a run and
on demand (`hloforge plot RUN`, `Model.plot()`), never per epoch: matplotlib costs more than an
epoch of a small net."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec

PNG = "curves.png"
METRICS = "metrics.jsonl"
PLOT_SUFFIXES = (".png",)  # what Model.plot writes: draw renders PNG


def history(run_dir: str) -> list[dict[str, Any]]:
    """The epoch records of a run directory's metrics.jsonl ([] when it has none)."""
    path = os.path.join(run_dir, METRICS)
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):  # the last line, torn by a kill or being written: as rewind_metrics
                    break
                raise DataError(f"{path} line {i} is not JSON ({e.msg}); expected one JSON object a line") from None
            if not isinstance(r, dict):
                raise DataError(f"{path} line {i} is a {type(r).__name__}, expected a JSON object")
            if r.get("kind", "epoch") != "epoch":
                continue
            lacks = [k for k in ("epoch", "loss") if k not in r]
            if lacks:
                raise DataError(f"{path} line {i} (epoch record) lacks {', '.join(map(repr, lacks))}")
            bad = _bad_value(r)
            if bad:
                raise DataError(f"{path} line {i} (epoch record): {bad}")
            out.append(r)
    return out


def _bad_value(record: dict[str, Any]) -> str:
    """What is wrong with the values `draw` reads from an epoch record ("" when nothing): a null or a
    string would crash the drawing or turn an axis into categories."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def shown(key: str) -> str:
        text = json.dumps(record[key])
        return f"{key!r} is {text if len(text) <= 40 else text[:37] + '...'}"

    e = record["epoch"]
    if not number(e) or not float(e).is_integer() or e < 1:
        return f"{shown('epoch')}, expected an integer ≥ 1"
    # The trainer stops on a non-finite train loss, so one here was not written by a run.
    if not number(record["loss"]) or not math.isfinite(record["loss"]):
        return f"{shown('loss')}, expected a finite number"
    for key, _ in _panels():
        # A diverged net's eval score may be NaN or infinite as scored: drawn as a gap, so allowed.
        if key in record and not number(record[key]):
            return f"{shown(key)}, expected a number"
        for band in (f"{key}_lo", f"{key}_hi"):  # the Wilson interval: always finite
            if band in record and not (number(record[band]) and math.isfinite(record[band])):
                return f"{shown(band)}, expected a finite number"
    return ""


def _panels() -> Iterator[tuple[str, str]]:
    """Every (metrics key, axis label) the right panel may draw, in order of preference: a language
    model's, then each task's own (its `plot`), a Model's validation scores under val_."""
    from hloforge.train.tasks import TASKS

    for key, label in (("val_bits_per_char", "validation bits/char"), *(t.plot for t in TASKS.values())):
        yield key, label
        yield f"val_{key}", label.replace("test", "validation")


def panel(history: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """(metrics key, axis label) of the right panel, the first the history's last epoch holds."""
    keys = set(history[-1]) if history else set()
    return next(((k, lab) for k, lab in _panels() if k in keys), None)


def draw(history: Sequence[dict[str, Any]], title: str) -> bytes:
    """The two panels as PNG bytes. A Figure of its own, not pyplot's: the user's program keeps its matplotlib
    backend (a notebook's inline one) and pyplot's figures as they were."""
    from matplotlib.figure import Figure

    ep = [h["epoch"] for h in history]
    fig = Figure(figsize=(9, 3.5))
    a, b = fig.subplots(1, 2)
    a.plot(ep, [h["loss"] for h in history], marker="o")
    a.set(xlabel="epoch", ylabel="train loss", title=title)
    right = panel(history)
    # The right panel draws the epochs that hold its key: a Model's earlier fits without validation
    # data hold none.
    if right is not None and right[0].endswith("top1"):
        key = right[0]
        held = [h for h in history if key in h]
        b.plot([h["epoch"] for h in held], [100 * h[key] for h in held], marker="o", label="top-1")
        banded = [h for h in held if f"{key}_lo" in h and f"{key}_hi" in h]
        if banded:
            b.fill_between([h["epoch"] for h in banded], [100 * h[f"{key}_lo"] for h in banded],
                           [100 * h[f"{key}_hi"] for h in banded], alpha=0.2, label="95% Wilson")
        b.set(xlabel="epoch", ylabel=f"{right[1]} (%)")
        b.legend()
    elif right is not None:
        held = [h for h in history if right[0] in h]
        b.plot([h["epoch"] for h in held], [h[right[0]] for h in held], marker="o")
        b.set(xlabel="epoch", ylabel=right[1])
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=90)
    return png.getvalue()


def plot_run(run_dir: str) -> str:
    """Draw a run directory's curves.png from its metrics.jsonl; returns the file's path."""
    from hloforge.train.checkpoint import write_atomic
    from hloforge.train.config import CONFIG, load_config

    if not os.path.isdir(run_dir):  # a file (the run's checkpoint, say) is there, but is no directory
        what = "is a file" if os.path.exists(run_dir) else "does not exist"
        raise DataError(f"run directory {run_dir} {what}; expected a run directory that trained an epoch")
    hist = history(run_dir)
    if not hist:
        raise DataError(f"{run_dir} has no epoch in {METRICS}; expected a run directory that trained an epoch")
    cfg_path = os.path.join(run_dir, CONFIG)
    title = os.path.basename(load_config(cfg_path).net) if os.path.exists(cfg_path) else os.path.basename(run_dir)
    out = os.path.join(run_dir, PNG)
    if not os.access(run_dir, os.W_OK):  # a read-only mount or another user's run: said as such, not as a full disk
        raise DataError(f"run directory {run_dir} is not writable, and plot writes its {PNG} there; copy the run "
                        "to a writable place and plot the copy")
    write_atomic(out, draw(hist, title), "plot", then="free space and plot again")
    return out


def write_plot(path: str, records: Sequence[dict[str, Any]], title: str) -> str:
    """`Model.plot`: the curves of `records` (a Model's history) drawn and written to `path` (checked), a .png."""
    suffix = os.path.splitext(path)[1]
    if suffix.lower() not in PLOT_SUFFIXES:  # draw renders PNG bytes alone
        got = f"suffix {suffix!r}" if suffix else "no suffix"
        raise UnsupportedSpec(f"plot cannot write {path}: it has {got}; expected a path ending in one of "
                              f"{list(PLOT_SUFFIXES)} (the format curves are drawn in)")
    if not records:
        raise HloforgeError("no history to plot yet; fit first")
    png = draw(records, title)
    try:
        with open(path, "wb") as f:
            f.write(png)
    except OSError as e:
        raise HloforgeError(f"cannot write the plot to {path}: {e.strerror or e}; expected a writable file "
                            "in an existing directory") from None
    return path
