"""The user's own arrays as the dataset a Run reads (what `Model.fit(x, y)` and `Model.evaluate(x, y)`
train and score on), and the name a run directory's config gives them: no registered dataset. A run
saved from them opens without data (`hloforge export`: its net and weights alone) on `no_rows`.

Also the checks of a Model's x (`input_rows`) and the kind of input a model was fit on (`InputKind`:
integers such as uint8 pixels, or real numbers, and their span), kept with the model and saved with it,
so x of the other kind (uint8 pixels 0…255 to a net trained on standardised floats: a plausible, wrong
score) is refused by evaluate and predict rather than scored."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, HloforgeError, HloforgeWarning, UnsupportedSpec
from hloforge.core.modules import label_type
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.datasets.stream import class_names
from hloforge.train.checkpoint import host_array
from hloforge.train.inputs import net_inputs, token_vocab, value_span
from hloforge.train.session import positive_batch

ARRAYS = "arrays"  # what a fit on arrays names its data in the run's config (no registered dataset)
# x of the trained kind reaching past the training x's span by more than this many of its widths is taken
# to be on another scale (unscaled pixels): refused, not scored; a test set's outliers stay well inside it
SPAN_SLACK = 4.0


class ArrayData:
    """A fit's arrays as a dataset the trainer's Run reads: `train` (x, y) and `test` (the validation
    data, or none), rows already net input; `num_classes` and `label_kind` the net's own."""

    name = ARRAYS
    # integer x (8-bit pixels) is the user's, as given: fit warned of it unscaled and keeps its kind with the model
    # (`InputKind`); each batch is cast as it is read, so x is never copied whole
    integer_x_taken = True

    def __init__(self, spec: NetSpec, label_kind: str, train: tuple[np.ndarray, np.ndarray] | None,
                 test: tuple[np.ndarray, np.ndarray] | None):
        out = spec.out_shape
        self.label_kind = label_kind
        self.num_classes = out[0] if label_kind == "mask" else spec.num_classes
        self.image_shape = tuple(out)  # a DDPM's images (hloforge.train.tasks.DiffusionTask)
        ref = train or test
        assert ref is not None
        empty = (np.zeros((0, *ref[0].shape[1:]), ref[0].dtype), np.zeros((0, *ref[1].shape[1:]), ref[1].dtype))
        self._splits = {"train": train or empty, "test": test or empty}
        self.n = len(self._splits["train"][0])

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        return self._splits[split]

    def renew_train(self, pair: tuple[np.ndarray, np.ndarray] | None) -> None:
        """A later pass of a fit's re-iterable batches in place of the train rows (`n` of them, as the first pass
        had); None drops the last pass's before the next is read."""
        assert pair is None or len(pair[0]) == self.n
        self._splits["train"] = pair  # type: ignore[assignment]  # None only between two passes


def label_kind(spec: NetSpec, variant: Variant) -> str:
    """The labels `spec` trains on under `variant`'s loss: a language model's tokens, else the loss's kind."""
    from hloforge.train.tasks import loss_label_kind

    out = spec.out_shape
    return "tokens" if len(out) == 2 else loss_label_kind(variant.make_loss(default_registry()), out)


def no_rows(spec: NetSpec, variant: Variant) -> ArrayData:
    """The data of a run trained on arrays when only its net and weights are wanted (export): the net's
    own input and label shapes, no rows; nothing is scored on it."""
    y_shape, y_dtype = label_type(variant.label_loss(default_registry()), tuple(spec.out_shape), "f32")
    x = np.zeros((0, *spec.input_shape), np.float32)
    y = np.zeros((0, *y_shape), np.int32 if y_dtype == "i32" else np.float32)
    return ArrayData(spec, label_kind(spec, variant), None, (x, y))


def plain(v: Any) -> Any:
    """A numpy scalar (np.float32(0.1), np.int64(3)) as the Python number it holds; anything else as it is."""
    return v.item() if isinstance(v, np.generic) else v


def own_dataset_run(make: Callable[[dict[str, Any]], Any], data: str, options: Sequence[str],
                    scored_on: str | None) -> Any:
    """evaluate(NAME) on the dataset a model trained on: the Run `make(data_options)` builds, read with the options
    the model trained with (`options`: its size, its corpus file), the split `hloforge eval` scores; refused, as eval
    refuses it, if that split is not the one scored then (`scored_on`: an edited corpus would score plausibly),
    and where a path they record is gone, saying the data_options that give where it is now."""
    from hloforge.train.config import parse_data_options
    from hloforge.train.metrics import check_eval_set

    given = parse_data_options(options)
    try:
        run = make(given)
    except DataError as e:
        gone = [k for k in ("data_dir", "data_file") if k in given and not os.path.exists(str(given[k]))]
        if not gone:
            raise
        said = ", ".join(f"{k!r}: {'PATH' if k == gone[0] else repr(v)}" for k, v in given.items())
        raise type(e)(f"{e}; if the model's data moved, pass where it is now: data_options={{{said}}}") from None
    check_eval_set(scored_on, run.eval_set, data, "evaluate")
    return run


def checked_batch_size(batch_size: Any, default: int) -> int:
    """A Model's `batch_size` argument (None: `default`), refused unless an integer ≥ 1."""
    return positive_batch(default if batch_size is None else plain(batch_size), "batch_size")


def checked_flag(name: str, on: Any) -> bool:
    """A Model method's True/False argument (1 or 0 taken), refused otherwise: "no" would count as yes."""
    if not isinstance(on, (bool, np.bool_, int)) or on not in (0, 1):
        # Keras's verbose=2 (a line per epoch, no bar) or "auto": True prints its progress and each epoch's line
        keras = " (Keras's verbose levels are not hloforge's: True prints the progress and each epoch's line)" if \
            name == "verbose" and (on == "auto" or (isinstance(on, int) and on > 1)) else ""
        raise UnsupportedSpec(f"{name} must be True or False (or 1 or 0), got {on!r}{keras}")
    return bool(on)


def dataset_named(x: Any, data: str | None, data_options: Any, what: str) -> tuple[Any, str | None]:
    """(x, the dataset) as fit and evaluate take them: `fit("digits")` or `fit(data="digits")`. Both is two
    datasets; data_options without a dataset would be dropped unread, so they are refused too."""
    if isinstance(x, str):
        # fit("x.npy", "y.npy"): once read as a dataset's name, said as "pass no x, y" (a dataset's name comes first)
        if os.path.exists(x) and x not in default_registry().names("dataset"):
            raise DataError(f"{what} x is the path {x!r}, a file's name, not its arrays; expected arrays "
                            "(np.load(path) reads a .npy) or a registered dataset's name")
        if data is not None:
            raise UnsupportedSpec(f"two datasets given: {x!r} and data={data!r}")
        x, data = None, x
    if data is None and data_options is not None:
        raise UnsupportedSpec(f"data_options are a dataset's options ({what}(data=NAME, data_options=...)); "
                              f"{what} on arrays takes none")
    return x, data


def check_next_tokens(kind: str, x: np.ndarray, y: np.ndarray, what: str) -> None:
    """Refuse a language model's labels that are x itself (Hugging Face's `labels=input_ids`, where the model
    shifts them): hloforge's nets take each position's next token as its label and shift nothing, so y == x
    trains copying the input, with a plausible low loss and bits_per_char; so do labels shifted the other way
    (x and y swapped: each label the token before, which the net sees)."""
    if kind != "tokens" or x.shape != y.shape:
        return
    if np.array_equal(x, y):
        said = "equal x token for token"
    elif np.array_equal(y[:, 1:], x[:, :-1]) and not np.array_equal(x[:, 1:], y[:, :-1]):
        said = "are each position's previous token (x and y swapped?)"
    else:
        return
    raise DataError(f"{what} labels {said}; expected each position's next token (the net shifts nothing): from "
                    "windows w one token longer, x = w[:, :-1] and y = w[:, 1:]")


def _first_difference(here: Sequence[str], trained: Sequence[str]) -> tuple[int, list[str]]:
    """The first id at which two lists of names differ, and each one's name there ("none" past its end)."""
    i = next((k for k, (a, b) in enumerate(zip(trained, here, strict=False)) if a != b), min(len(here), len(trained)))
    return i, [repr(n[i]) if i < len(n) else "none" for n in (here, trained)]


def check_names(run: Any, recorded: Mapping[str, Sequence[str]], trained: Callable[[], Any], what: str) -> None:
    """Refuse scores or training on a run's dataset whose ids stand for other things than the model's did, each a
    plausible wrong number: a corpus whose vocabulary numbers its characters otherwise, or class folders renamed or
    prepared again so that their names differ. What the model's ids stood for is what its checkpoint `recorded`
    (its `class_names`, a corpus's `vocabulary`: every id's character), else, for a vocabulary, the training corpus's
    own (`trained()`: that dataset, None when it was another; gone, nothing to compare)."""
    data, names, before = run.data, class_names(run.data, run.spec), recorded.get("class_names")
    if names and before and list(names) != list(before):
        i, said = _first_difference(names, before)
        raise DataError(f"{what}: dataset {getattr(data, 'name', '?')!r} names its classes otherwise than the data the "
                        f"model was fit on (id {i}: {said[0]} here, {said[1]} in training), so each id would be scored "
                        "as another class; expected the classes it was trained on (arrays of your own: evaluate(x, y))")
    chars = getattr(data, "chars", None)
    if chars is None:
        return
    if recorded.get("vocabulary") is not None:
        chars, own = getattr(data, "vocabulary", chars), recorded["vocabulary"]
    else:
        try:
            own = getattr(trained(), "chars", None)
        except HloforgeError:
            return
    if own is None or list(own) == list(chars):
        return
    i, said = _first_difference(chars, own)
    raise DataError(f"{what}: corpus {getattr(data, 'source', '')!r} numbers its characters otherwise than the one the "
                    f"model was fit on (id {i}: {said[0]} here, {said[1]} in training), so each id would be read as "
                    "another character; expected a corpus of the model's vocabulary")


def refuse_ddpm_arrays(spec: NetSpec, what: str) -> None:
    """A DDPM is fit and scored on a registered dataset's images (its feed makes the noisy images and their
    noise, and adds the time channel): arrays for it were refused with contradictory shapes."""
    from hloforge.train.diffusion import is_time_conditioned

    if is_time_conditioned(spec):
        raise UnsupportedSpec(f"net {spec.name!r} is a DDPM: {what} takes its clean images from a registered "
                              f"dataset ({what}(data=NAME), or hloforge train / eval), not from arrays")


def check_pair(v: Any, what: str) -> None:
    """Refuse `v` unless a pair (x, y), saying what it is instead: Keras's (x, y, sample_weight), or an iterable
    of batches (a DataLoader), which fit alone reads as batches."""
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return
    if isinstance(v, (tuple, list)):
        keras = " (Keras's (x, y, sample_weight)? the loss weighs every row alike)" if len(v) == 3 else ""
        got = f"{len(v)} item{'' if len(v) == 1 else 's'}{keras}"
    else:
        got = f"a {type(v).__name__}" + (" (batches? np.concatenate their x and their y)"
                                         if isinstance(v, Iterable) and not isinstance(v, (str, bytes)) else "")
    raise DataError(f"{what} is {got}; expected a pair (x, y) of arrays")


def refuse_misfit(spec: NetSpec, variant: Variant, y: Any) -> None:
    """The loss's misfit with the net (mse on a net that is no DDPM: the user's regression) said of arrays y
    before their shape, which the loss's targets would give (a classifier's logits' [N, 10]) and no shape fixes;
    the labels a class loss takes are checked_labels' (real numbers said as regression targets there)."""
    from hloforge.train.tasks import check_loss_fits, misfit

    check_loss_fits(spec, variant.make_loss(default_registry()))  # crossEntropy on a segmenter: what fits
    if (kind := label_kind(spec, variant)) == "noise":  # (a language model's tokens: no loss's own label kind)
        ya = np.asarray(host_array(y))
        loss = variant.make_loss(default_registry())
        if why := misfit(spec, loss, kind, ARRAYS, "noise" if ya.dtype.kind == "f" else "class", ya):
            raise DataError(why)


def batched(shape: Sequence[int]) -> str:
    """A batch of rows of `shape`, as messages say it: [N, 784]."""
    return "[" + ", ".join(["N", *map(str, shape)]) + "]"


class RaggedRows(DataError, ValueError):
    """Rows of different lengths: a DataError, and the ValueError numpy raises for them, which input_rows
    answers with what such an x most likely is (a pair (x, y), a list of batches)."""


def _refuse_misread(a: Any, what: str) -> None:
    """Refuse what numpy reads as another array: a scipy sparse matrix (len() is ambiguous for it, np.asarray a
    0-d object), a masked array with values masked (np.asarray reads the values under the mask as data)."""
    if type(a).__module__.startswith("scipy.sparse"):
        raise DataError(f"{what} is a scipy sparse {type(a).__name__}; expected a dense array (its .toarray())")
    if isinstance(a, np.ma.MaskedArray) and (masked := int(np.ma.count_masked(a))):
        raise DataError(f"{what} is a masked array with {masked} of its {a.size} values masked, which would be read "
                        "as the values under the mask; expected every value real: fill them (.filled(value)) or drop "
                        "their rows")


def row_count(a: Any, what: str) -> int:
    """The rows of `a`, refused unless an array of at least one."""
    _refuse_misread(a, what)
    try:
        scalar = not hasattr(a, "__len__") or np.ndim(a) == 0
    except ValueError:  # numpy's, on rows of different lengths
        raise RaggedRows(f"{what} is ragged (its rows differ in length); expected an array with one row per "
                         "example") from None
    if scalar:
        # a DataLoader, a generator, a tf.data.Dataset: read as batches by fit alone, not by evaluate or predict
        batches = (" (an iterable, of batches? fit alone reads batches: np.concatenate their rows here)"
                   if isinstance(a, Iterable) and not isinstance(a, (str, bytes)) else "")
        raise DataError(f"{what} is a {type(a).__name__}, expected an array with one row per example{batches}")
    n = len(a)
    if n == 0:
        raise DataError(f"{what} is empty (0 rows), expected at least one example")
    return n


def input_rows(x: Any, spec: NetSpec, what: str, integers_as_given: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(x as given, as an array; x as the float32 rows the net takes), checked whole: rows of `spec`'s
    input shape, real and finite (token ids for a net that takes them). `integers_as_given`: integer rows
    are returned as they are (`finite_inputs`), for a consumer that casts a batch at a time."""
    want = tuple(spec.input_shape)
    x = host_array(x)
    try:
        n = row_count(x, f"{what} x")
        x = np.asarray(x)
    except ValueError:  # numpy's, on rows of different lengths
        raise DataError(f"{what} x {_ragged(x, want)}; expected an array of shape {batched(want)}") from None
    if tuple(x.shape[1:]) != want:  # said as [N, ...]: a lone row's length is no batch size
        hint = _shape_hint(x.shape, want)
        raise DataError(f"{what} x has shape {list(x.shape)}, expected {batched(want)}" + (hint and f" ({hint})"))
    return x, net_inputs(x, spec, n, what, integers_as_given=integers_as_given)


def _ragged(x: Any, want: tuple[int, ...]) -> str:
    """What a sequence x numpy cannot make one array of is: fit's (x, y) pair or its batches, handed where
    x alone is taken, or rows of different lengths."""
    def batch_of_rows(a: Any) -> bool:
        try:
            return np.ndim(a) == len(want) + 1
        except ValueError:  # ragged itself
            return False
    pairs = isinstance(x, (tuple, list))
    if pairs and len(x) == 2 and batch_of_rows(x[0]) and not batch_of_rows(x[1]):
        return "is a pair (x, y), not x alone"
    if pairs and all(isinstance(i, (tuple, list)) and len(i) == 2 and batch_of_rows(i[0]) for i in x):
        return "is a sequence of (x, y) batches, not x alone (np.concatenate each side's batches)"
    return "is ragged (its rows differ in length)"


def passes_again(batches: Iterable[Any]) -> bool:
    """Whether fit reads `batches` afresh each epoch: an iterable that makes a new iterator for each pass (a
    DataLoader, a class with __iter__, a tf.data.Dataset), as PyTorch and Keras read one. A list or tuple holds
    the same batches every pass, and a generator or other iterator passes once: both are read once."""
    return not isinstance(batches, (list, tuple, Iterator))


def read_batches(batches: Iterable[Any], max_bytes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(x, y, the first batch's rows): an iterable of (x, y) batches (`Model.fit(batches)`) read once, each
    pair checked (one label per row, the shapes of batch 0's), refused as endless past `max_bytes`."""
    if isinstance(batches, Mapping):  # iterated, its keys: refused as "fit batch 0 is a str"
        keys = ", ".join(map(repr, list(batches)[:4]))
        raise DataError(f"fit x is a {type(batches).__name__} (keys {keys}), not batches; expected arrays x and y "
                        "(fit(d['x'], d['y']) of a dict d holding them) or an iterable of (x, y) batches")
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    held = 0
    # a generator may refill one buffer for every batch (bx[:] = ...; yield bx, by): each is copied as yielded, or
    # every batch held would read as its last; a list's or tuple's batches are there together, read in place
    refilled = not isinstance(batches, (list, tuple))
    for item in batches:
        if held > max_bytes:  # an endless generator (itertools.cycle) would never return
            raise DataError(f"fit read {len(xs)} batches ({held / 2**30:.1f} GiB) from its iterable without "
                            "reaching its end; it is read whole into memory, so pass a finite one "
                            "(itertools.islice(it, n)) or arrays x, y")
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise DataError(f"fit batch {len(xs)} is a {type(item).__name__}, expected a pair (x, y)")
        pair = []
        for what, a in (("x", item[0]), ("y", item[1])):
            _refuse_misread(a, f"fit batch {len(xs)}'s {what}")
            try:
                got = np.asarray(host_array(a))  # (np.array of a torch tensor: numpy 2's warning of its __array__)
                got = got.copy() if refilled else got
            except ValueError:  # numpy's, on rows of different lengths
                raise DataError(f"fit batch {len(xs)} has a ragged {what} (its rows differ in length); expected "
                                "an array with one row per example") from None
            if got.ndim < 1 or len(got) == 0:
                raise DataError(f"fit batch {len(xs)} has {what} of shape {list(got.shape)}, expected an array "
                                "with one row per example, at least one")
            pair.append(got)
        bx, by = pair
        if len(bx) != len(by):
            raise DataError(f"fit batch {len(xs)} has {len(bx)} rows of x but {len(by)} labels; expected one "
                            "label per row")
        if xs and (bx.shape[1:] != xs[0].shape[1:] or by.shape[1:] != ys[0].shape[1:]):
            what, got, want = (("x", bx, xs[0]) if bx.shape[1:] != xs[0].shape[1:] else ("y", by, ys[0]))
            raise DataError(f"fit batch {len(xs)} has {what} of shape {list(got.shape)}, expected "
                            f"{batched(want.shape[1:])} as batch 0's")
        if xs and _number_kind(bx) != _number_kind(xs[0]):  # uint8 pixels after scaled floats: two scales
            raise DataError(f"fit batch {len(xs)} has x of {bx.dtype} ({_number_kind(bx)}), but batch 0's is "
                            f"{xs[0].dtype} ({_number_kind(xs[0])}); expected every batch's x of one kind, "
                            "scaled alike")
        xs.append(bx)
        ys.append(by)
        held += bx.nbytes + by.nbytes
    if not xs:
        raise DataError("fit batches: the iterable gave no batch, expected at least one (x, y)")
    return np.concatenate(xs), np.concatenate(ys), len(xs[0])


def _number_kind(a: np.ndarray) -> str:
    return "integers" if a.dtype.kind in "iu" else "real numbers" if a.dtype.kind == "f" else a.dtype.name


def _shape_hint(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """What x of shape `got` may be, for a net taking rows of `want`, and what fixes it ("" where nothing
    says): images with their channels last (NHWC, as PIL, TensorFlow and most image files have them) for a
    net taking them first (NCHW), a lone row, rows without their leading axis, rows in another shape."""
    if len(want) == 3 and want[0] != want[2]:
        last = (*want[1:], want[0])
        if tuple(got[1:]) == last:
            return "images with their channels last; x.transpose(0, 3, 1, 2) puts them first, as the net takes them"
        if tuple(got) == last:
            return "one image with its channels last; x.transpose(2, 0, 1)[None] is a batch of it as the net takes it"
    if tuple(got) == want:
        return "a batch of rows; one row is x[None]"
    if len(got) == len(want) > 1 and tuple(got[1:]) == want[1:]:  # greyscale [N, 28, 28] for [1, 28, 28]
        fix = "x[:, None] adds it" if want[0] == 1 else f"the net takes {want[0]} there"
        return f"rows without the net's leading axis of {want[0]}; {fix}"
    # flat rows for an image net, or images for a net of flat rows: [N, 28, 28] for [784], [N, 784] for [1, 28, 28]
    if len(got) > 1 and (len(want) == 1 or len(got) == 2) and math.prod(got[1:]) == math.prod(want):
        fix = f"x.reshape(len(x), {', '.join(map(str, want))})"
        if len(got) == 2 and len(want) == 3 and want[0] > 1:  # the reshape alone would scramble HWC rows' pixels
            hwc = f"x.reshape(len(x), {want[1]}, {want[2]}, {want[0]}).transpose(0, 3, 1, 2)"
            return (f"flat images; {fix} gives the net's if each row holds its channels one after another (CHW), "
                    f"{hwc} if each pixel's channels side by side (HWC: PIL, TensorFlow)")
        return f"rows of the same size in another shape; {fix} gives the net's"
    if len(want) == 3 and len(got) == 4:
        if got[1] != want[0] and tuple(got[2:]) == want[1:]:
            return f"images with {got[1]} channels; the net takes {want[0]}"
        if got[1] == want[0]:
            return f"images of {got[2]}×{got[3]}; the net takes {want[1]}×{want[2]}: resize them as it was trained"
    return ""


@attrs.frozen
class InputKind:
    """The inputs a model was fit on: of an integer dtype (pixels 0…255), all whole numbers (an integer
    dtype's, or floats that hold whole numbers), their dtype and span; `dataset`: a registered dataset's
    (its images scaled and standardised; no span kept), "" for arrays."""

    integer: bool
    whole: bool
    dtype: str
    lo: float | None = None
    hi: float | None = None
    dataset: str = ""

    def said(self) -> str:
        if self.dataset:
            return f"real numbers (dataset {self.dataset!r}, which scales and standardises its images)"
        return f"{'integers' if self.integer else 'real numbers'} ({self.dtype} in {_span(self.lo, self.hi)})"

    @classmethod
    def from_meta(cls, path: str, stored: Any) -> InputKind:
        """The kind a checkpoint's metadata `inputs` records (Model.save writes it), one line if tampered."""
        span = (int, float, type(None))
        types: dict[str, type | tuple[type, ...]] = {"integer": bool, "whole": bool, "dtype": str, "lo": span,
                                                     "hi": span, "dataset": str}
        if not (isinstance(stored, dict) and set(stored) == set(types)
                and all(isinstance(stored[k], t) for k, t in types.items())):
            raise DataError(f"checkpoint {path}: its metadata 'inputs' is {stored!r:.60}, expected the kind of input "
                            f"the model was fit on (keys {sorted(types)}); tampered, or not written by hloforge")
        return cls(**stored)


def _span(lo: float | None, hi: float | None) -> str:
    """A span as messages say it: 0 … 255, -2.12 … 2.82 ("?" for a bound not known)."""
    def said(v: float | None) -> str:
        if v is None:
            return "?"
        return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:.3g}"
    return f"{said(lo)} … {said(hi)}"


def _all_whole(x: np.ndarray) -> bool:
    """Every value of the float32 `x` a whole number; a chunk at a time, so real data stops at its first."""
    flat = x.reshape(-1)
    step = 1 << 20
    return all(np.array_equal(c, np.rint(c)) for c in (flat[i:i + step] for i in range(0, len(flat), step)))


def input_kind(given: np.ndarray, x: np.ndarray, spec: NetSpec) -> InputKind | None:
    """The kind of `given` (x as given; `x` its float32 rows); None for a net taking token ids (ids are ids,
    whatever their dtype)."""
    if token_vocab(spec) is not None:
        return None
    integer = given.dtype.kind in "iu"
    return InputKind(integer, integer or _all_whole(x), given.dtype.name, *value_span(x))


def _callers_level() -> int:
    """warnings.warn's stacklevel of the user's call, counted from the function that warns: the first frame outside
    hloforge past fit's decorators and helpers, however many (a fixed count broke with each decorator added), and
    contextlib's frames of the decorators made with it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(2), 2  # the caller of the function that warns is level 2
    while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(package)
                                 or frame.f_code.co_filename == contextlib.__file__):
        frame, level = frame.f_back, level + 1
    return level


def warn_unscaled(given: InputKind | None, trained: InputKind | None) -> None:
    """Say that a first fit's x (`given`; `trained` None: the model has no kind yet) of whole numbers past ±1,
    pixels 0…255 or counts, trains as it is: arrays are not scaled, as hloforge's datasets scale their images,
    and a net is initialised for x of about unit scale (mnist-mlp on digits as uint8: 95.8% top-1, 98.6%
    standardised). A warning, not a refusal: a net may scale its input itself."""
    if trained is None and given is not None and given.whole and given.hi is not None and given.lo is not None \
            and max(-given.lo, given.hi) > 1:  # ±1 codes and 0/1 flags are on a net's scale
        warnings.warn(HloforgeWarning(f"fit x is {given.said()}, trained on unscaled: arrays are taken as they are "
                                      "(hloforge's datasets scale and standardise their images); a net trains best "
                                      "on x of about unit scale, e.g. pixels as x.astype(np.float32) / 255, then "
                                      "standardised"), stacklevel=_callers_level())


def dataset_inputs(name: str, spec: NetSpec) -> InputKind | None:
    """The kind of input a model fit on dataset `name` was trained on: hloforge's own datasets scale and
    standardise their images (real numbers); None (not known, nothing checked) for arrays without a
    record, a plugin's dataset or token ids."""
    if name == ARRAYS or token_vocab(spec) is not None:
        return None
    try:
        builtin = default_registry().entry("dataset", name).builtin
    except HloforgeError:  # a dataset no longer installed
        return None
    return InputKind(False, False, "float32", dataset=name) if builtin else None


def check_dataset_kind(trained: InputKind | None, data: str, spec: NetSpec, what: str, otherwise: str) -> None:
    """Refuse dataset `data` (trained on, its test split scored, or named for `hloforge eval`) for a model fit
    on integers (uint8 pixels): hloforge's datasets scale and standardise their images. `what`: the
    message's start ("fit on"), `otherwise` its way out."""
    theirs = dataset_inputs(data, spec)
    if trained is not None and trained.integer and theirs is not None:
        raise DataError(f"{what} dataset {data!r}: its x is {theirs.said()}, but the model was trained on "
                        f"{trained.said()}; {otherwise}")


def saved_inputs(path: str, meta: dict[str, Any], data: str, spec: NetSpec) -> InputKind | None:
    """The kind of input a checkpoint's model was fit on: its record (Model.save), else its dataset's
    (`hloforge train`), else None: a model saved on arrays before the record was kept is not checked."""
    return InputKind.from_meta(path, meta["inputs"]) if "inputs" in meta else dataset_inputs(data, spec)


def check_input_kind(trained: InputKind | None, given: np.ndarray, x: np.ndarray, what: str,
                     otherwise: str = "fit the model on x of this kind") -> None:
    """Refuse x (`given`; `x` its float32 rows) of another kind than the model was `trained` on: integers
    for a model fit on real numbers, or real numbers (not whole) for one fit on integers. `otherwise`: the
    message's last way out."""
    if trained is None:
        return
    integer = given.dtype.kind in "iu"
    if (integer and trained.whole) or (not integer and (not trained.integer or _all_whole(x))):
        _check_span(trained, x, what, otherwise)
        return
    got = f"{given.dtype} in {_span(*value_span(x))}" + ("" if integer else ", not whole numbers")
    if not integer:
        todo = f"pass x in the training data's scale, as {trained.dtype}"
    elif trained.dataset:
        todo = f"scale and standardise x as dataset {trained.dataset!r} does its images"
    else:
        todo = "scale x as the training data was (e.g. x.astype(np.float32) / 255, then the same standardisation)"
    raise DataError(f"{what} x is {got}, but the model was trained on {trained.said()}; {todo}, or {otherwise}")


def _check_span(trained: InputKind, x: np.ndarray, what: str, otherwise: str) -> None:
    """Refuse x (float32 rows) of the trained kind but reaching past the span the model was fit on by more
    than SPAN_SLACK of its widths: another scale (0…255 to a model fit on x / 255 or on standardised x)."""
    if trained.lo is None or trained.hi is None:  # a dataset's model: no span kept, but its x never whole numbers
        lo, hi = value_span(x)
        if trained.dataset and hi - lo > 1 and _all_whole(x):
            raise DataError(f"{what} x holds whole numbers {_span(lo, hi)}, but the model was trained on "
                            f"{trained.said()}; scale and standardise x as it does, or {otherwise}")
        return
    width = max(trained.hi - trained.lo, abs(trained.lo), abs(trained.hi))
    lo, hi = value_span(x)
    if width > 0 and (hi > trained.hi + SPAN_SLACK * width or lo < trained.lo - SPAN_SLACK * width):
        raise DataError(f"{what} x spans {_span(lo, hi)}, far past the {_span(trained.lo, trained.hi)} of the "
                        f"{trained.dtype} the model was trained on; pass x in the training data's scale (scaled and "
                        f"standardised as it was), or {otherwise}")
