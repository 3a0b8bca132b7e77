"""The argparse types of the `hloforge` command's options."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

from hloforge.core.errors import DataError, HloforgeError
from hloforge.core.f32 import F32_MAX as F32_MAX
from hloforge.core.f32 import F32_RANGE, f32_holds
from hloforge.train.config import MAX_PROCESSES as MAX_PROCESSES  # a config's bound too

# Every numeric option is parsed by one of these, so a value of the wrong kind or range is refused at
# parse time (exit 2, one line naming the flag and what it expects), before anything is read or
# written. Ints stop at I64_MAX and floats must be finite: a run's config.toml holds its options, and
# TOML has no integer beyond 64 bits (nor may a config hold nan/inf and be read back as given); the
# programs take their scalars (lr, clip norm, decays) as f32, so a float must also be one f32 can hold:
# 0 or a normal f32 (configio.f32_holds, the config's rule too): 1e-50 would be 0 there, 1e39 inf.
I64_MAX = 2**63 - 1
# A DDPM's T: its schedule is T floats and sampling runs T forward passes.
MAX_DIFFUSION_STEPS = 1_000_000


def integer(lo: int = -I64_MAX - 1, hi: int = I64_MAX) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi]."""
    what = ("an integer ≥ 1" if lo == 1 else "an integer ≥ 0" if lo == 0 else "an integer") if hi == I64_MAX \
        else f"an integer from {lo} to {hi}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v

    return parse


def number(lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
           hi_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in the interval from lo to hi (each end closed unless *_open)."""
    admits_zero = (lo < 0 or (lo == 0 and not lo_open)) and (hi > 0 or (hi == 0 and not hi_open))
    holds = f"that f32 holds ({'0, or ' if admits_zero else ''}{F32_RANGE})"
    if lo == -math.inf and hi == math.inf:
        what = f"a finite number {holds}"
    elif hi == math.inf:
        what = f"a finite number {'>' if lo_open else '≥'} {lo:g} {holds}"
    else:  # the interval says it; that f32 must hold it is said to a value it would make 0
        what = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    tiny = what if "f32" in what else f"{what} {holds}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        ok = abs(v) <= F32_MAX and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if not f32_holds(v):
            raise argparse.ArgumentTypeError(f"expected {tiny}, got {text!r}, below f32's smallest normal")
        return v

    return parse


positive_int = integer(1)
nonneg_int = integer(0)  # a seed, an index, a count where 0 means none
finite_float = number()
positive_float = number(0.0, lo_open=True)
nonneg_float = number(0.0)
probability = number(0.0, 1.0)
unit_open = number(0.0, 1.0, lo_open=True, hi_open=True)  # a DDPM's β: a noise variance per step


def variant_value(name: str, parse: Callable[[str], Any], variant: type | None = None) -> Callable[[str], Any]:
    """An argparse type for a field of `variant` (default: hloforge.core.variant.Variant): `parse`, then the
    Variant's own rule for that field (one definition of each range), refused at parse time."""

    def check(text: str) -> Any:
        from hloforge.core.variant import Variant

        v = parse(text)
        try:
            (variant or Variant)(**{name: v})
        except HloforgeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return v

    return check


def plugin_name(text: str) -> str:
    """An argparse type: a registered plugin's name (--backend), which is never empty: `--backend ""` (an
    unset shell variable) was taken as no flag and ran on $HLOFORGE_BACKEND or xla, unsaid."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a name, got {text!r}")
    return text


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 3,32,32, got {text!r}") from None
    if not dims or min(dims) <= 0 or max(dims) > I64_MAX:
        raise argparse.ArgumentTypeError(f"expected positive dimensions, got {text!r}")
    return dims


def path(text: str) -> str:
    """A file or directory argument, a leading `~` the home folder: the shell expands it in `--out ~/d` but not in
    `--out=~/d` (which made a folder named `~` here), and hf.load and Model.save take their paths so."""
    return os.path.expanduser(text)


# The images cam (matplotlib's savefig), detect (PIL) and sample (matplotlib's imsave) write: the suffixes
# all three writers take (imsave refuses .tif, savefig .bmp, PIL .svg) and write to exactly the name given.
IMAGE_OUT_SUFFIXES = (".png", ".jpg", ".jpeg")


def image_out(path: str) -> str:
    """`path` as the --out of a command that writes an image, checked before anything is opened or computed:
    a name ending in one of IMAGE_OUT_SUFFIXES (any case), not an existing directory, in a directory that
    exists. Refused with one line (exit 3: a file that cannot be written). Not an argparse type: it looks
    at the filesystem, so it is checked when the command starts, not while its flags are parsed."""
    want = ", ".join(IMAGE_OUT_SUFFIXES)
    if os.path.isdir(path):
        raise DataError(f"--out {path!r} is a directory; expected an image file name ending in {want}")
    suffix = os.path.splitext(path)[1]
    if suffix.lower() not in IMAGE_OUT_SUFFIXES:
        got = f"suffix {suffix!r}" if suffix else "no suffix"
        raise DataError(f"--out {path!r} has {got}; expected an image file name ending in {want}")
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        raise DataError(f"--out {path!r}: directory {parent!r} does not exist")
    return path
