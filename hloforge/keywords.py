"""The keywords the framework API's methods take: one it does not take is said in one line, naming what it
takes instead (`Model`'s own options and its variant's; a fit option given to the constructor: fit)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from hloforge.core.errors import UnsupportedSpec


def check_model_options(given: Iterable[str], variant: Iterable[str], init: Callable[..., Any],
                        fit: Callable[..., Any]) -> None:
    """Refuse the keywords of `given` that are none of Model's variant fields (`variant`): they name its own
    options (`init`'s) and the variant's, and say which are fit's."""
    known = set(variant)
    unknown = sorted(set(given) - known)
    if unknown:
        own = [p for p in inspect.signature(init).parameters if p not in ("self", "variant_fields")]
        fits = [u for u in unknown if u in inspect.signature(fit).parameters]  # epochs=, batch_size=
        to_fit = f" ({', '.join(fits)}: give {'it' if len(fits) == 1 else 'them'} to fit)" if fits else ""
        raise UnsupportedSpec(f"Model takes no option(s) {unknown}{to_fit}; expected its own {own} or the "
                              f"variant's {sorted(known)}")
