"""`hf.layers`, `hf.losses`, `hf.optimizers`, `hf.callbacks`: the registered components of one kind, built-ins and
installed plugins alike (hloforge.core.registry), by class name as attributes (`hf.layers.Conv2d`)
or by their registered name as items (`hf.layers["conv2d"]`). The registry loads on first use."""

from __future__ import annotations

import types
from typing import Any

from hloforge.core.errors import PluginError


class Lookup:
    def __init__(self, kind: str):
        self.kind = kind

    def _entries(self) -> dict[str, Any]:
        from hloforge.core.registry import default_registry

        reg = default_registry()
        return {n: reg.get(self.kind, n) for n in reg.names(self.kind)}

    def __getitem__(self, name: str) -> Any:
        from hloforge.core.registry import default_registry

        return default_registry().get(self.kind, name)  # an unknown name: PluginError listing the registered

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        hits = [c for c in self._entries().values() if getattr(c, "__name__", None) == name]
        if len(hits) == 1:
            return hits[0]
        known = sorted(getattr(c, "__name__", repr(c)) for c in self._entries().values())
        if hits:
            raise PluginError(f"{self.kind} class name {name!r} is registered {len(hits)} times; look it up by its "
                              f"registered name instead (hf.{self.kind}s[...])")
        raise AttributeError(f"no {self.kind} class {name!r} is registered; registered: {', '.join(known)}")

    def __dir__(self) -> list[str]:
        return sorted({getattr(c, "__name__", "") for c in self._entries().values()} - {""})

    def __iter__(self) -> Any:
        return iter(self._entries())

    def __contains__(self, name: object) -> bool:
        return name in self._entries()

    def __repr__(self) -> str:
        return f"<hloforge {self.kind}s: {', '.join(self._entries())}>"


layers = Lookup("layer")
optimizers = Lookup("optimizer")


class LookupModule(types.ModuleType):
    """A package that is also a lookup: `hloforge.losses` holds the built-in loss modules, and
    `hf.losses.CrossEntropy` / `hf.losses["crossEntropy"]` find any registered loss (its
    `__init__` sets this class; names it defines itself come first); `hloforge.callbacks` likewise."""

    _lookup_kind = ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(Lookup(self._lookup_kind), name)

    def __getitem__(self, name: str) -> Any:
        return Lookup(self._lookup_kind)[name]

    def __iter__(self) -> Any:
        return iter(Lookup(self._lookup_kind))

    def __contains__(self, name: object) -> bool:
        return name in Lookup(self._lookup_kind)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(Lookup(self._lookup_kind))))
