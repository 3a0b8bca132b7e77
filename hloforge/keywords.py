"""The keywords the framework API's methods take: one it does not take is said in one line, naming what it
takes instead (`Model`'s own options and its variant's; a fit option given to the constructor: fit), the
hloforge way of a Keras keyword (validation_split, class_weight, ...), or the close match of a typo. And a
Keras or PyTorch model's method asked of a Model (`model(x)`, `compile`, `state_dict`): the way here."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hloforge.core.errors import DataError, UnsupportedSpec

F = TypeVar("F", bound=Callable[..., Any])

_WHOLE_VAL = "validation_data is scored whole at each epoch's end"
_IN_PROCESS = "fit reads arrays, or an iterable of (x, y) batches, in this process"
_SAME_WEIGHT = "the loss weighs every row alike"
# Keras's keywords of fit, evaluate, predict and Model that hloforge takes nowhere, each with the way here
KERAS = {
    "validation_split": "hloforge holds no rows out itself: split x and y yourself and pass "
                        "validation_data=(x_val, y_val)",
    "validation_steps": _WHOLE_VAL, "validation_batch_size": _WHOLE_VAL, "validation_freq": _WHOLE_VAL,
    "class_weight": f"{_SAME_WEIGHT}: repeat a rarer class's rows (np.repeat) or train with "
                    "loss='focalCrossEntropy' for imbalanced classes",
    "sample_weight": f"{_SAME_WEIGHT}: repeat the rows to weigh more (np.repeat(x, k, axis=0), and y alike)",
    "steps_per_epoch": "an epoch is len(x) // batch_size steps over every row: pass fewer rows for fewer steps",
    "initial_epoch": "a fit goes on from the model's own epoch and weights (model.history holds the epochs so far)",
    "steps": "every row of x is scored: pass x[:k] for fewer",
    "max_queue_size": _IN_PROCESS, "workers": _IN_PROCESS, "use_multiprocessing": _IN_PROCESS,
    "return_dict": "evaluate returns a dict of its scores already",
    "verbose": "evaluate and predict print nothing; fit's verbose=True prints its progress",
    "callbacks": "callbacks run during fit alone: fit(..., callbacks=[...])",
    "metrics": "evaluate returns the task's own scores (a classifier's top1, top5 and loss)",
    "inputs": "hf.Model takes a net (a zoo name, a NetSpec or a .toml/.json spec file), not Keras tensors",
    "outputs": "hf.Model takes a net (a zoo name, a NetSpec or a .toml/.json spec file), not Keras tensors",
}

_NOT_CALLED = "model.predict(x) gives the eval-mode logits, model.evaluate(x, y) the scores, model.fit(x, y) trains"
_BY_NAME = "model.params and model.state are θ and the rest by name, dicts of arrays (assign one to set it)"
_NO_MODE = "predict and evaluate run the eval forward, fit the train step: there is no mode to set"
_NO_DEVICE = "the backend runs it (hf.Model(net, backend=...) or $HLOFORGE_BACKEND): there is no device to move it to"
# Keras's and PyTorch's methods of a model that hf.Model has not, each with the way here
METHODS = {
    "__call__": _NOT_CALLED,
    "forward": _NOT_CALLED,
    "compile": "hf.Model takes the optimizer, lr and loss itself: hf.Model(net, optimizer='adam', lr=1e-3, "
               "loss='crossEntropy')",
    "train_on_batch": "model.fit(x, y) on the batch's rows (epochs=1, batch_size=len(x))",
    "test_on_batch": "model.evaluate(x, y) on the batch's rows", "predict_on_batch": "model.predict(x)",
    "fit_generator": "model.fit takes an iterable of (x, y) batches itself",
    "get_weights": _BY_NAME, "set_weights": _BY_NAME, "state_dict": _BY_NAME, "load_state_dict": _BY_NAME,
    "parameters": _BY_NAME, "named_parameters": _BY_NAME,
    "save_weights": "model.save(DIR) writes the run directory hf.load(DIR) reads back",
    "load_weights": "hf.load(DIR) reads a saved run back; a weights file's tensors are assigned to model.params",
    "eval": _NO_MODE, "train": _NO_MODE, "to": _NO_DEVICE, "cuda": _NO_DEVICE,
    "zero_grad": "fit runs the whole step (forward, backward, update) as one compiled program",
}


class Elsewhere(UnsupportedSpec, AttributeError):
    """Another framework's method asked of a Model, said in one line; an AttributeError still, so hasattr() and
    getattr(model, name, default) answer as for any missing attribute."""


def no_method(model: Any, name: str) -> AttributeError:
    """What `model.name` raises where Model has no such attribute: another framework's method with the way here,
    else Python's own AttributeError (with its close-match suggestion)."""
    if name in METHODS:
        what = "is not called as a Keras or PyTorch model is" if name == "__call__" else \
            f"has no {name}() (Keras's or PyTorch's)"
        return Elsewhere(f"hf.Model {what}: {METHODS[name]}")
    return AttributeError(f"{type(model).__name__!r} object has no attribute {name!r}", name=name, obj=model)


# Keras's metric names in a fit's history (its compile's metrics=["accuracy"]), and hloforge's for them
KERAS_METRICS = {"accuracy": "top1", "acc": "top1", "sparse_categorical_accuracy": "top1",
                 "categorical_accuracy": "top1", "sparse_top_k_categorical_accuracy": "top5",
                 "top_k_categorical_accuracy": "top5"}


class NoMetric(DataError, KeyError):
    """A metric a fit's history lacks, said in one line (not KeyError's quoted form); a KeyError still."""

    __str__ = BaseException.__str__


def no_metric(key: str, records: list[dict[str, Any]]) -> NoMetric:
    """The refusal of history[key] where an epoch's record lacks `key`: Keras's name with hloforge's, else the
    close match, and the metrics it holds; or, in some epochs alone (a fit with validation_data after one
    without), how to read it with None for the others."""
    held = list(dict.fromkeys(k for r in records for k in r))
    if (some := sum(key in r for r in records)):
        return NoMetric(f"history holds {key!r} in {some} of its {len(records)} epochs (those of a fit that scored "
                        f"it); history.history[{key!r}] reads it with None for the others")
    base = key.removeprefix("val_")
    ours = f"{key[:len(key) - len(base)]}{KERAS_METRICS[base]}" if base in KERAS_METRICS else ""
    near = difflib.get_close_matches(key, held, n=1)
    hint = f" (Keras's {key} is {ours!r} here)" if ours else f" (did you mean {near[0]!r}?)" if near else ""
    return NoMetric(f"history has no metric {key!r}{hint}; it holds {held}")


def not_taken(where: str, keyword: str, takes: Iterable[str]) -> str:
    """One line: `where` takes no `keyword`; Keras's with the hloforge way, else the close match and what it takes."""
    if keyword in KERAS:
        return f"{where} takes no keyword {keyword!r} (Keras's): {KERAS[keyword]}"
    takes = sorted(takes)
    near = difflib.get_close_matches(keyword, takes, n=1)
    return (f"{where} takes no keyword {keyword!r}{f'; did you mean {near[0]!r}?' if near else ';'} expected one of "
            f"{takes}")


def checked_keywords(method: F) -> F:
    """A method decorator: a keyword the method does not take, or more arguments by position than it takes so,
    is refused in one line before the call (Python's TypeError names neither the way here nor a close match)."""
    params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    where = method.__name__

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        odd = next((k for k in kwargs if k not in named), None)
        if odd is not None:
            raise UnsupportedSpec(not_taken(where, odd, named))
        if len(args) > len(positional):
            rest = ", ".join(f"{n}=" for n in named if n not in positional)
            raise UnsupportedSpec(f"{where} takes at most {len(positional)} arguments by position "
                                  f"({', '.join(positional)}), got {len(args)}; pass the others by keyword ({rest})")
        return method(self, *args, **kwargs)

    return checked  # type: ignore[return-value]


def check_model_options(given: Iterable[str], variant: Iterable[str], init: Callable[..., Any],
                        fit: Callable[..., Any]) -> None:
    """Refuse the keywords of `given` that are none of Model's variant fields (`variant`): a Keras one with its
    hloforge way, else they name its own options (`init`'s) and the variant's, and say which are fit's."""
    known = set(variant)
    unknown = sorted(set(given) - known)
    fits = [u for u in unknown if u in inspect.signature(fit).parameters]  # epochs=, batch_size=
    if keras := [u for u in unknown if u in KERAS and u not in fits]:
        raise UnsupportedSpec(not_taken("Model", keras[0], ()))
    if unknown:
        own = [p for p in inspect.signature(init).parameters if p not in ("self", "variant_fields")]
        to_fit = f" ({', '.join(fits)}: give {'it' if len(fits) == 1 else 'them'} to fit)" if fits else ""
        near = difflib.get_close_matches(unknown[0], [*own, *known], n=1) if not fits else []
        raise UnsupportedSpec(f"Model takes no option(s) {unknown}{to_fit}; expected its own {own} or the "
                              f"variant's {sorted(known)}{f'; did you mean {near[0]!r}?' if near else ''}")
