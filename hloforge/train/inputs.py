"""The checks of a user's rows and labels as a module takes them: the net's input (float32 rows, finite; token ids
in the vocabulary) and the labels its loss takes (int32 class ids in range, float32 targets, finite), each refused
in one line naming what is wrong and what was expected. Used wherever rows reach a module: a train step's batch,
an eval's rows, fit's and predict's x, cam's image."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.spec import NetSpec
from hloforge.train.checkpoint import host_array

SPAN_CHUNK = 1 << 24  # values of a large array read at a time for its min and max


def label_classes(y_dtype: str, label_shape: Sequence[int], out_shape: Sequence[int]) -> int | None:
    """The number of classes integer labels index: the size of the logits' axis the labels lack
    (class ids: [C] → []; masks: [C, H, W] → [H, W]; tokens: [T, V] → [T]). None: float targets, or
    integer labels that index no axis of the output (a plugin loss's own kind)."""
    if y_dtype != "i32":
        return None
    out, lab = tuple(out_shape), tuple(label_shape)
    hit = [out[i] for i in range(len(out)) if out[:i] + out[i + 1:] == lab]
    return hit[0] if hit else None


def token_vocab(spec: NetSpec) -> int | None:
    """The vocabulary of a net whose input is token ids: its first layer's integer `vocab`
    (tokenPositionEmbed's, or a plugin's layer that names its table so); None for any other net."""
    vocab = getattr(spec.layers[0], "vocab", None) if spec.layers else None
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else None


def net_inputs(x: Any, spec: NetSpec, rows: int, what: str, note: str = "", integers_as_given: bool = False
               ) -> np.ndarray:
    """`x` ([rows, *input]) checked as `spec`'s input: `finite_inputs`, with the token-id check for a
    net that takes ids (`token_vocab`)."""
    return finite_inputs(x, (rows, *spec.input_shape), what, note, token_vocab(spec), integers_as_given)


def finite_inputs(x: Any, shape: Sequence[int], what: str, note: str = "", vocab: int | None = None,
                  integers_as_given: bool = False) -> np.ndarray:
    """`x` as the float32 array a module takes, refused with one line unless it is real numbers of
    `shape`, all finite (after the float32 cast: 1e300 is inf there): its min and max, one pass on the host.
    `vocab`: x is token ids, refused unless whole numbers in 0..vocab−1 (the embedding clamps the
    others, so id 1000 would silently read row vocab−1): one more pass, for a float x alone.
    `integers_as_given`: integer x (8-bit pixels, token ids) is checked and returned as it is, for a consumer
    that casts a batch at a time: a float32 copy is 4× 8-bit pixels' memory, and a file opened with
    np.load(path, mmap_mode="r") then stays on disk."""
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        flags = " (x.astype(np.float32) reads False, True as 0, 1)" if x.dtype.kind == "b" else ""
        raise DataError(f"{what} x has dtype {x.dtype}, expected real numbers (float32){flags}")
    if tuple(x.shape) != tuple(shape):
        raise DataError(f"{what} x has shape {list(x.shape)}, expected {list(shape)}{note}")
    if integers_as_given and x.dtype.kind in "iu":  # finite, and within float32's range, whatever they hold
        if vocab is not None:
            check_token_ids(x, *value_span(x), vocab, what)
        return x
    given = x
    with np.errstate(over="ignore"):  # a float64 past float32's range: inf, refused just below
        x = np.ascontiguousarray(x, np.float32)
    lo, hi = value_span(x)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        if given.dtype.itemsize > 4 and np.isfinite(given).all():  # finite as given: float32 cannot hold it
            glo, ghi = value_span(given)
            raise DataError(f"{what} x spans {glo:g} … {ghi:g}, beyond float32's range (±3.4e38) the net "
                            "computes in; expected numbers float32 holds")
        raise DataError(f"{what} x holds NaN or inf (it spans {lo} … {hi}); expected finite numbers")
    if vocab is not None:
        check_token_ids(given, lo, hi, vocab, what)
    return x


def check_token_ids(x: np.ndarray, lo: float, hi: float, vocab: int, what: str) -> None:
    """Token ids `x` (as given: a float64 3.0000001 rounds to a whole float32) in 0..vocab−1 and whole,
    else one line naming them. `lo`/`hi`: x's span, already taken; whole-ness costs one pass over a float x."""
    outside = lo < 0 or hi > vocab - 1
    fractional = x.dtype.kind == "f" and not outside and not np.array_equal(x, np.rint(x))
    if not outside and not fractional:
        return
    with np.errstate(invalid="ignore"):
        bad = np.unique(x[(x < 0) | (x > vocab - 1) | (x != np.rint(x))])
    # each as given, in its dtype's shortest form (a float64 64.99999999 is no 65)
    shown = ", ".join(str(v).removesuffix(".0") for v in bad[:5]) + (", …" if len(bad) > 5 else "")
    found = (("out-of-range", bool((bad < 0).any() or (bad > vocab - 1).any())),
             ("non-integer", bool((bad != np.rint(bad)).any())))
    kinds = " and ".join(k for k, hit in found if hit)
    raise DataError(f"{what} x holds {kinds} token ids ({shown}); expected integer ids 0..{vocab - 1} "
                    f"(the net's vocabulary of {vocab})")


def value_span(a: np.ndarray) -> tuple[float, float]:
    """(min, max): a NaN anywhere makes both NaN, an inf shows in one. A large array is read once for both, a chunk
    of rows at a time: one opened from disk with np.load(path, mmap_mode="r") was read from the file twice."""
    if a.ndim == 0 or a.size <= SPAN_CHUNK:
        return (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    step = max(1, SPAN_CHUNK * len(a) // a.size)
    spans = np.array([(c.min(), c.max()) for c in (a[i:i + step] for i in range(0, len(a), step))], np.float64)
    return float(spans[:, 0].min()), float(spans[:, 1].max())


def checked_labels(y: Any, shape: Sequence[int], y_dtype: str, classes: int | None, what: str,
                   lowest: int = 0) -> np.ndarray:
    """Labels as the module takes them (int32 ids, float32 targets), refused with one line when of
    another shape or kind, out of lowest..classes−1 (an id past the last class one-hots to nothing and
    trains on a plausible wrong loss; `lowest` −1: a language model's scored padding), or not finite."""
    y = np.asarray(host_array(y))
    # real numbers where class ids are taken: regression targets, said before their shape (the shape of the ids
    # would be no fix); one-hot or probability rows are said below, with how to get their ids
    regression = (f"{what} labels are real numbers ({y.dtype}, not whole): regression targets? the loss trains on "
                  f"classes, not on real values; expected integer class ids of shape {list(shape)} (int32)")
    real = y_dtype == "i32" and y.dtype.kind == "f" and y.size > 0 and not np.array_equal(y, np.rint(y))
    if tuple(y.shape) != tuple(shape):
        # the axis y has beyond the labels' shape (masks [N, 1, H, W] or one-hot [N, C, H, W] for [N, H, W]), if one:
        # never the batch's, the last where several fit (one-hot [4, 4] rows of 4 classes: axis 1)
        extra = next((i for i in reversed(range(1, y.ndim)) if y.shape[:i] + y.shape[i + 1:] == tuple(shape)), None)
        hint = ""
        # one-hot (or probability) rows where class ids are taken, on any axis: say how to get the ids
        if (extra is not None and y_dtype == "i32" and classes is not None and y.shape[extra] == classes
                and y.dtype.kind in "fiub"):
            hint = f" (one-hot rows of the {classes} classes? y.argmax({extra}) gives the ids)"
        elif real:
            raise DataError(regression)
        if tuple(y.shape) == (*shape, 1):  # a column vector, as sklearn and pandas often hand labels
            hint = " (a trailing axis of 1: y[..., 0] drops it)"
        elif extra is not None and y.shape[extra] == 1:  # masks with a channel axis, as torch's loaders give them
            hint = f" (an axis of 1 at {extra}: y.squeeze({extra}) drops it)"
        raise DataError(f"{what} labels have shape {list(y.shape)}, expected {list(shape)}{hint}")
    if y_dtype == "i32":
        if real:
            raise DataError(regression)
        if y.dtype.kind not in "iu":
            raise DataError(f"{what} labels have dtype {y.dtype}, expected integer ids (int32){_ids_hint(y)}")
        if classes is not None and y.size and (y.min() < lowest or y.max() >= classes):
            lo, hi = int(y.min()), int(y.max())
            fix = ""
            if classes == 1 and lo >= 0 and hi == 1:  # Keras' Dense(1, sigmoid): here each class is a logit
                fix = "; a yes/no head of one output? ids 0 and 1 take a head of 2 outputs"
            elif (lo, hi) == (1, classes):
                fix = f"; counted from 1? y - 1 gives ids 0..{classes - 1}"
            elif (lo, hi) == (0, 255) and classes >= 2 and not np.isin(y, (0, 255), invert=True).any():
                fix = "; a mask image of 0 and 255? (y > 0) gives ids 0 and 1"  # as a binary mask PNG holds it
            raise DataError(f"{what} labels span {lo}..{hi}, expected ids {lowest}..{classes - 1} "
                            f"(the net's {classes} class{'es' if classes > 1 else ''}{fix})")
        return np.ascontiguousarray(y, np.int32)
    if y.dtype.kind not in "fiu":
        raise DataError(f"{what} labels have dtype {y.dtype}, expected real-valued targets (float32)")
    y = np.ascontiguousarray(y, np.float32)
    lo, hi = value_span(y)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise DataError(f"{what} labels hold NaN or inf (they span {lo} … {hi}); expected finite targets")
    return y


def _ids_hint(y: np.ndarray) -> str:
    """How labels of a dtype that holds no ids become ids, as the labels' checks say it ("" where none does): floats
    of whole numbers (ids stored as 0.0, 1.0), bools, class names."""
    if y.dtype.kind == "b":
        return " (y.astype(np.int64) gives ids 0 and 1)"
    if y.dtype.kind == "f" and np.isfinite(y).all() and np.array_equal(y, np.rint(y)):
        return " (whole numbers: y.astype(np.int64) gives the ids)"
    if y.dtype.kind in "US" or (y.dtype.kind == "O" and y.size and all(isinstance(v, (str, bytes)) for v in y.flat)):
        return " (class names? names, y = np.unique(y, return_inverse=True) numbers them in sorted order)"
    return ""
