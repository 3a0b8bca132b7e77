"""The builtin datasets' option checks, one wording for all: `--data-opt` parses each value as an int, else
a float, else true/false, else the string as written, so a dataset's option can arrive as any of them
(`n_train=100.0`, `noise=abc`). Each is refused in one line naming the dataset, the option, what it
expects and what it got, before any value reaches arithmetic whose own error would say nothing of it (or
a float would be truncated, or a bool read as 0/1)."""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

from hloforge.core.errors import DataError


def integer(dataset: str, name: str, value: Any, lo: int) -> int:
    """`value` (an int, NumPy's too) as an int ≥ `lo`; a bool, a float (even 100.0), a string or a smaller int
    is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise DataError(f"{dataset} {name} must be an integer ≥ {lo}, got {value!r}")
    return int(value)


def number(dataset: str, name: str, value: Any, lo: float) -> float:
    """`value` (an int or a float) as a finite float ≥ `lo`; a bool, a string, a NaN or an infinity is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (lo <= value and math.isfinite(value)):
        raise DataError(f"{dataset} {name} must be a finite number ≥ {lo:g}, got {value!r}")
    return float(value)


def path(dataset: str, name: str, value: Any) -> str:
    """`value` (a string or a path object) as a path string; a number (`data_file=0` would open file
    descriptor 0, or read as no file) is refused."""
    if not isinstance(value, (str, os.PathLike)):
        raise DataError(f"{dataset} {name} must be a path, got {value!r}")
    return os.fspath(value) if isinstance(value, str) else str(os.fspath(value))
