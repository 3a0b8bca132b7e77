"""Which PJRT plugin to load: $HLOFORGE_PJRT_PLUGIN, else the first installed package that has one."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from hloforge.core.errors import BackendError, BackendSettingError
from hloforge.core.switches import env_path

PLUGIN_ENV_VAR = "HLOFORGE_PJRT_PLUGIN"


def _package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _fastatomstruct_cpu() -> str | None:
    if importlib.util.find_spec("fastatomstruct_xla_cpu") is None:
        return None
    import fastatomstruct_xla_cpu

    try:
        return fastatomstruct_xla_cpu.library_path()
    except FileNotFoundError:
        return None


def _file_in_package(module: str, *names: str) -> Callable[[], str | None]:
    """A finder for the first of ``names`` (glob patterns) inside ``module``'s directory."""

    def find() -> str | None:
        root = _package_dir(module)
        if root is None:
            return None
        for name in names:
            hits = sorted(root.rglob(name))
            if hits:
                return str(hits[0])
        return None

    return find


# In order of preference: CPU first (always works), then GPU packages.
_PLUGIN_FINDERS: list[tuple[str, Callable[[], str | None]]] = [
    ("fastatomstruct_xla_cpu", _fastatomstruct_cpu),
    ("lammps_jax_pjrt_cpu", _file_in_package("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so")),
    ("jax_plugins.xla_cuda12", _file_in_package("jax_plugins.xla_cuda12", "xla_cuda_plugin.so", "*.so")),
    ("jax_plugins.xla_cuda13", _file_in_package("jax_plugins.xla_cuda13", "xla_cuda_plugin.so", "*.so")),
    ("jax_plugins.xla_rocm7", _file_in_package("jax_plugins.xla_rocm7", "xla_rocm_plugin.so", "*.so")),
]


def find_plugin() -> str:
    """Path of the PJRT plugin to load: $HLOFORGE_PJRT_PLUGIN (`~` expanded), else an installed package."""
    explicit = env_path(PLUGIN_ENV_VAR)
    if explicit:
        if not os.path.isfile(explicit):
            raise BackendSettingError(f"{PLUGIN_ENV_VAR}={explicit}: no such plugin file")
        return explicit
    for _, finder in _PLUGIN_FINDERS:
        path = finder()
        if path is not None:
            return path
    tried = ", ".join(name for name, _ in _PLUGIN_FINDERS)
    raise BackendError(
        f"no PJRT plugin found: {PLUGIN_ENV_VAR} is unset and none of these packages is "
        f"installed with its plugin: {tried}. Install the CPU one with "
        f"`pip install fastatomstruct-xla-cpu`, or set {PLUGIN_ENV_VAR} to a PJRT plugin .so"
    )
