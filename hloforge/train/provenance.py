"""The third-party plugins a checkpoint's net is made of, and the classes its training program registered itself:
recorded as it is written, checked as it is read.

A net with a plugin's layer (`groupNorm` from hloforge-groupnorm) saved, then opened where that plugin is not
installed, would otherwise be refused as an unknown layer among every registered one, with nothing saying it was a
plugin's or which distribution to install; one of a layer, loss or optimizer its program registered (`hf.register`),
opened by a program that has not, with nothing saying which class to register."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

from hloforge.core.errors import DataError
from hloforge.core.registry import default_registry

PLUGINS = "plugin_layers"  # the metadata key: {layer kind: {"distribution": ..., "version": ...}}
IN_PROCESS = "registered_in_process"  # the metadata key: {component kind: {name: "module.QualifiedName"}}


def plugin_layers(spec: Any) -> dict[str, dict[str, str]]:
    """The layers of `spec` (a spec's dict, as a checkpoint holds it) that an installed third-party plugin
    provides, each with its distribution and version; {} for a net of hloforge's own layers."""
    registry, out = default_registry(), {}
    for layer in spec.get("layers", ()) if isinstance(spec, Mapping) else ():
        kind = layer.get("kind") if isinstance(layer, Mapping) else None
        if not isinstance(kind, str) or kind not in registry.names("layer"):
            continue
        entry = registry.entry("layer", kind)
        if not entry.builtin and not entry.in_process:
            try:
                version = importlib.metadata.version(entry.distribution)
            except importlib.metadata.PackageNotFoundError:  # an entry point of a distribution without metadata
                version = ""
            out[kind] = {"distribution": entry.distribution, "version": version}
    return out


def in_process_components(meta: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The layers, loss and optimizer of a checkpoint's `spec` and `variant` (as its metadata holds them) that this
    program registered itself (`hf.register`), each by its class; {} for none."""
    spec, variant = meta.get("spec"), meta.get("variant")
    spec, variant = (spec if isinstance(spec, Mapping) else {}), (variant if isinstance(variant, Mapping) else {})
    used = {"layer": [layer.get("kind") for layer in spec.get("layers", ()) if isinstance(layer, Mapping)],
            "loss": [variant.get("loss")], "optimizer": [variant.get("optimizer")]}
    registry, out = default_registry(), {}
    for kind, names in used.items():
        for name in names:
            entry = registry.find(kind, name) if isinstance(name, str) else None
            if entry is not None and entry.in_process:
                out.setdefault(kind, {})[name] = entry.plugin
    return out


def check_in_process(path: str, meta: Mapping[str, Any]) -> None:
    """Refuse, in one line naming each class, a checkpoint of components its training program registered itself
    that this program has not registered (a command never has: it runs no program of the user's)."""
    recorded = meta.get(IN_PROCESS)
    if not isinstance(recorded, Mapping):
        return
    registry = default_registry()
    said = [f"{kind} {name!r} (class {where})" for kind, names in sorted(recorded.items()) if isinstance(names, Mapping)
            for name, where in sorted(names.items()) if registry.find(kind, name) is None]
    if said:
        raise DataError(f"checkpoint {path}: it was trained with {', '.join(said)}, which the program that trained it "
                        "registered itself (hf.register), and which is not registered here; expected that class "
                        "registered again first (hf.register in your program; for a hloforge command, packaged as a "
                        "plugin: docs/plugins.md)")


def check_plugin_layers(path: str, meta: Mapping[str, Any]) -> None:
    """Refuse, in one line naming the distribution to install, a checkpoint whose net uses a plugin's layer that
    is not registered here (not installed, or installed but failed to load)."""
    recorded = meta.get(PLUGINS)
    if not isinstance(recorded, Mapping):
        return
    registry = default_registry()
    known = set(registry.names("layer"))
    said, missing, broken = [], set(), set()
    for kind, where in sorted(recorded.items()):
        if kind in known or not isinstance(where, Mapping):
            continue
        dist = str(where.get("distribution", "?"))
        release = f"{dist} {where.get('version')}".strip() if where.get("version") else dist
        failed = [b.error for b in registry.broken if b.plugin.split(":")[0] == dist]
        (broken if failed else missing).add(dist)
        said.append(f"layer {kind!r} of plugin {release}, " + (f"installed but not loaded ({failed[0]})" if failed
                                                               else "not installed here"))
    if said:
        # an installed plugin that fails to load is mended where it fails, not by installing it once more
        fix = ([f"pip install {' '.join(sorted(missing))}"] if missing else []) + \
            ([f"{', '.join(sorted(broken))} loading without that error"] if broken else [])
        raise DataError(f"checkpoint {path}: its net uses {'; '.join(said)}; expected the plugin the run was "
                        f"trained with ({'; '.join(fix)})")
