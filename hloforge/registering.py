"""`hf.register`: a layer, loss or optimizer defined in the user's own code, gated, then known by its name.

A plugin package registers its components through entry points (docs/plugins.md); a class written in a script or
a notebook has none. Registered here it is gated first, as `hloforge verify` gates a plugin (the backward the
builder derives, or the one written with `custom_vjp`, against jax.vjp of the class's own `reference` in f64,
finite differences and f32; an optimizer against optax), then added to this process's registry: a NetSpec, a
spec file, `Model(loss=...)`, `Model(optimizer=...)`, `hf.layers[...]` and `hf.load` of a model made of it
find it by its name. A net holding a layer whose class is not the one registered under its kind is refused when
a Model is made of it (`check_layer_classes`): it would train ungated, and a saved model would reopen as
another class, or not at all.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import attrs

from hloforge.core import contracts
from hloforge.core.errors import PluginError
from hloforge.core.registry import KINDS, Entry, NameClash, default_registry

# the kinds a program's own class may be, by the contract it subclasses (each is gated)
_CONTRACTS = {"layer": contracts.Layer, "loss": contracts.Loss, "optimizer": contracts.Optimizer}

_DECORATES: Any = object()  # register's component when none is given: `@hf.register(gate=False)`
_REGISTERING = threading.RLock()  # reentrant: a class's gate_cases that registers another is no deadlock


def register(component: Any = _DECORATES, *more: type, gate: bool = True) -> Any:
    """Gate `component` and each of `more` (each a `Layer`, `Loss` or `Optimizer` subclass) and register it in this
    process under its `kind` (a layer) or `name`; returns `component`, so `@hf.register` decorates a class (and
    `@hf.register(gate=False)`: given no class, it returns the decorator).

    `gate`: False registers without gating (its backward then unverified, as an installed plugin's is until
    `hloforge verify` runs it). A class registered already is not gated again (one registered with gate=False
    is, registered now with the gate); the same class defined again (a notebook cell run twice) replaces it.
    A name another component holds, a class that is no component or a failed gate case is refused in one line,
    and nothing of that call is registered.
    A program that opens a saved model made of its own layer registers it again first: the checkpoint
    records the class, not its code. A `hloforge` command cannot: it runs no program of the user's (package
    the class as a plugin for that, docs/plugins.md)."""
    if component is _DECORATES:  # @hf.register(gate=False) was a TypeError: no component given
        return lambda cls: register(cls, gate=gate)
    with _REGISTERING:  # one call at a time: two threads' classes of one name would both find it free
        _register((component, *more), gate)
    return component


def _register(classes: Sequence[type], gate: bool) -> None:
    reg = default_registry()
    entries: list[Entry] = []
    for cls in classes:
        kind = _kind_of(cls)
        entry = reg.in_process_entry(kind, cls)
        # a name two classes of this one call claim: the registry holds neither yet, so it could not say so
        same = next((e for e in entries if (e.kind, e.name) == (kind, entry.name)), None)
        if same is not None and same.obj is not cls:
            raise NameClash(f"{kind} {entry.name!r} is claimed twice in this hf.register call, by {same.plugin} and "
                            f"by {entry.plugin}; give {cls.__name__} a {KINDS[kind][2]} of its own")
        if same is not None or reg.find(kind, entry.name) is entry and (entry.gated or not gate):
            continue  # registered already, and gated then where it is to be now (not where gate=False said not)
        if gate:
            _gate(entry)
            entry = attrs.evolve(entry, gated=True)
        entries.append(entry)
    for entry in entries:  # all or none: a later class's refusal leaves the earlier ones unregistered
        reg.add_in_process(entry)


def _kind_of(cls: Any) -> str:
    if not isinstance(cls, type):
        hint = f" (hf.register({type(cls).__name__}): hloforge makes the instances)" \
            if isinstance(cls, tuple(_CONTRACTS.values())) else ""
        raise PluginError(f"hf.register takes classes, got {cls!r}{hint}")
    kinds = [k for k, base in _CONTRACTS.items() if issubclass(cls, base)]
    if not kinds:
        callback = " (a callback is given to fit as an instance: fit(..., callbacks=[...]))" \
            if any(c.__name__ == "Callback" for c in cls.__mro__) else ""
        raise PluginError(f"hf.register takes a subclass of hloforge.core.contracts Layer, Loss or Optimizer; "
                          f"{cls.__name__} is none{callback}; a backend or dataset is a plugin package "
                          "(docs/plugins.md)")
    return kinds[0]


def _gate(entry: Entry) -> None:
    """Refuse, in one line naming the class and its first failing case, a class whose gate is not green."""
    from hloforge.testing import gate

    who = f"hf.register: {entry.kind} {entry.name!r} ({entry.plugin})"
    try:
        declared = list(entry.obj.gate_cases())
        cases = gate.BUILDERS[entry.kind](entry, declared) if declared else []
    except Exception as e:
        raise PluginError(f"{who} {gate.fault(e, 'building its gate cases')}") from None
    if not cases:
        checked = "update" if entry.kind == "optimizer" else "backward"
        raise PluginError(f"{who} declares no gate cases (its classmethod gate_cases()), so its {checked} cannot be "
                          "verified; declare some (docs/plugins.md), or register it with gate=False")
    if not any(isinstance(case.obj, entry.obj) for case in cases):  # another class's instances gate that class
        raise PluginError(f"{who}: its gate cases hold no {entry.obj.__name__} (they hold "
                          f"{sorted({type(c.obj).__name__ for c in cases})}), so its own code is not verified; "
                          f"expected cases of {entry.obj.__name__} instances")
    gate.require_oracles(cases)
    failed = []
    for case in cases:
        try:
            r = case.run()
        except Exception as e:
            failed.append(f"{case.id} {gate.fault(e, 'running')}")
            continue
        if not r.passed:
            f64, f32 = gate.tolerances(entry.kind)
            # an optimizer's oracle is optax (its optax_direction), with no finite differences
            oracle = "optax (its optax_direction)" if entry.kind == "optimizer" else "jax.vjp of its reference"
            fd = "" if entry.kind == "optimizer" else \
                f", {r.err_fd_f64:.1e} against finite differences ({gate.TOL_FD_F64:.0e})"
            failed.append(f"{r.case}: error {r.err_jax_f64:.1e} against {oracle} in f64 (tolerance {f64:.0e}){fd}, "
                          f"{r.err_jax_f32:.1e} in f32 ({f32:.0e})")
    if failed:
        raise PluginError(f"{who} failed its gate in {len(failed)} of {len(cases)} case(s), first {failed[0]}; "
                          "not registered")


def check_layer_classes(layers: Sequence[Any], net: str) -> None:
    """Refuse a layer whose class is not the one registered under its kind: a class of the program's own not
    registered (`hf.register`), or one whose kind names another class (a subclass of a built-in keeping its kind)."""
    reg = default_registry()
    for i, layer in enumerate(layers):
        cls = type(layer)
        kind = getattr(cls, KINDS["layer"][2], None)
        held = reg.find("layer", kind) if isinstance(kind, str) else None
        if held is not None and held.obj is cls:
            continue
        what = f"net {net!r}: layer {i} is {cls.__module__}.{cls.__qualname__}"
        if held is None:
            raise PluginError(f"{what}, which is not registered (its kind {kind!r} is no registered layer's); "
                              f"hf.register({cls.__name__}) gates it and makes it known")
        if held.in_process and held.plugin == f"{cls.__module__}.{cls.__qualname__}":  # a kind of its own would not do
            raise PluginError(f"{what} of an earlier definition: the class was defined again (a notebook cell run "
                              f"twice) and that one registered under kind {kind!r} since; expected the net's layers "
                              f"made again, of the class registered now")
        raise PluginError(f"{what}, but its kind {kind!r} is {held.obj.__module__}.{held.obj.__qualname__}'s "
                          f"({held.origin}); give {cls.__name__} a kind of its own, then "
                          f"hf.register it")
