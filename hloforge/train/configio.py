"""A run config's values: checked against the config's annotations, and written as TOML.

`TrainConfig` is flat (numbers, strings, booleans, lists of them), so a writer of our own covers
it; json.dumps is no TOML writer (it writes `Infinity`, and escapes TOML cannot read).
"""

from __future__ import annotations

import functools
import math
import types
import typing
from typing import Any

import attrs

from hloforge.core.errors import HloforgeError, UnsupportedSpec
from hloforge.core.f32 import F32_RANGE, f32_holds
from hloforge.core.spec import toml_string


def as_tuple(v: Any, what: str) -> tuple[Any, ...]:
    if not isinstance(v, (list, tuple)):
        raise refused(what, v, "a list")
    return tuple(v)


def refused(name: str, v: Any, expected: str) -> UnsupportedSpec:
    """A config value refused, said as a config file's key; (name, value, expected) kept on it as `field`, for a
    caller that took the value as another name (Model's keyword: config.checked_config) to say it as written."""
    e = UnsupportedSpec(f"config value {name} = {v!r}: expected {expected}")
    e.field = (name, v, expected)  # type: ignore[attr-defined]
    return e


def check_fields(cfg: Any, numbers: bool = False) -> None:
    """Every field of a config (an attrs instance) of its annotated type (a bool is no number here);
    with `numbers`, every number finite and ≥ 0, and a float one f32 holds (f32_holds): a config from
    TOML or the Python API is refused before anything runs or is written."""
    hints = _field_hints(type(cfg))
    for f in attrs.fields(type(cfg)):
        v, t = getattr(cfg, f.name), hints[f.name]
        if v is None and t.nullable:
            continue
        items = v if t.item else (v,)
        want = t.item or t.base
        if (t.item and not isinstance(v, tuple)) or not all(_is_a(x, want) for x in items):
            raise refused(f.name, v, t.describe())
        if numbers and want in (int, float) and not all(math.isfinite(x) and x >= 0 for x in items):
            raise refused(f.name, v, "finite numbers ≥ 0" if t.item else "a finite number ≥ 0")
        if numbers and want is float and not all(f32_holds(x) for x in items):
            raise refused(f.name, v, ("numbers" if t.item else "a number") + f" that f32 holds "
                          f"({_zero_or(cfg, f.name, len(items) if t.item else None)}{F32_RANGE}): the programs take "
                          "it as f32")


def _zero_or(cfg: Any, name: str, items: int | None) -> str:
    """"0, or " where the field takes 0, else "": whether it does is the config's own checks' to say (lr refuses
    it), so a refusal never offers a value that is refused too. `items`: a list field's length."""
    try:
        attrs.evolve(cfg, **{name: 0.0 if items is None else (0.0,) * items})
    except HloforgeError:
        return ""
    return "0, or "


@attrs.frozen
class _Hint:
    base: type
    nullable: bool
    item: type | None  # a tuple's element type

    def describe(self) -> str:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        what = f"a list of {names[self.item].split(' ', 1)[1]}s" if self.item else names[self.base]
        return what + (" (or nothing)" if self.nullable else "")


def _is_a(x: Any, t: type) -> bool:
    if t is bool:
        return isinstance(x, bool)
    if t in (int, float):
        return isinstance(x, (int, float) if t is float else int) and not isinstance(x, bool)
    return isinstance(x, t)


@functools.cache
def _field_hints(cls: type) -> dict[str, _Hint]:
    """An attrs class's annotations, read once: `int | None` → (int, nullable), `tuple[str, ...]` → its items."""
    out = {}
    for name, t in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(t) if a is not type(None)] if isinstance(t, types.UnionType) else [t]
        base = args[0]
        item = typing.get_args(base)[0] if typing.get_origin(base) is tuple else None
        out[name] = _Hint(tuple if item else base, isinstance(t, types.UnionType), item)
    return out


def toml_value(v: Any) -> str:
    """One TOML value: a bool, an integer, a float (repr: the shortest that reads back the same), a
    basic string, or an array of those."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise UnsupportedSpec(f"cannot write {v!r} ({type(v).__name__}) as a TOML value")
