"""hloforge: declarative nets to StableHLO forward, eval and fused train-step programs.

The framework API (docs/api.md): `import hloforge as hf`, then `hf.Model(net).fit(x, y)`. Every
name below resolves on first use, so `import hloforge` stays cheap (no backend, no plugin loads).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from hloforge.core.hookspecs import PLUGIN_API_VERSION as PLUGIN_API_VERSION  # defined with the hooks

if TYPE_CHECKING:
    from hloforge import callbacks
    from hloforge.api import Model
    from hloforge.callbacks import Callback, CSVLogger, EarlyStopping, ModelCheckpoint, TensorBoard
    from hloforge.core.lookup import Lookup
    from hloforge.core.spec import NetSpec
    from hloforge.core.variant import Variant
    from hloforge.imagefiles import image_inputs
    from hloforge.loading import load
    from hloforge.registering import register

    layers: Lookup
    from hloforge import losses
    from hloforge.core.errors import HloforgeError
    optimizers: Lookup
    __version__: str

# public name -> (module, attribute)
_LAZY = {
    "NetSpec": ("hloforge.core.spec", "NetSpec"),
    "Variant": ("hloforge.core.variant", "Variant"),
    "Model": ("hloforge.api", "Model"),
    "load": ("hloforge.loading", "load"),
    "image_inputs": ("hloforge.imagefiles", "image_inputs"),
    "register": ("hloforge.registering", "register"),
    "Callback": ("hloforge.callbacks", "Callback"),
    "EarlyStopping": ("hloforge.callbacks", "EarlyStopping"),
    "ModelCheckpoint": ("hloforge.callbacks", "ModelCheckpoint"),
    "CSVLogger": ("hloforge.callbacks", "CSVLogger"),
    "TensorBoard": ("hloforge.callbacks", "TensorBoard"),
    "HloforgeError": ("hloforge.core.errors", "HloforgeError"),
    "layers": ("hloforge.core.lookup", "layers"),
    "losses": ("hloforge.losses", ""),  # the package, a lookup too (LookupModule)
    "callbacks": ("hloforge.callbacks", ""),  # the module, a lookup too
    "optimizers": ("hloforge.core.lookup", "optimizers"),
}

__all__ = ["PLUGIN_API_VERSION", "__version__", "NetSpec", "Variant", "Model", "load", "image_inputs", "register",
           "Callback",
           "EarlyStopping", "ModelCheckpoint", "CSVLogger", "TensorBoard", "HloforgeError", "layers", "losses",
           "optimizers", "callbacks"]
assert set(__all__) == {"PLUGIN_API_VERSION", "__version__", *_LAZY}  # one list, checked against the table


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's (pyproject.toml's); `hloforge --version` prints it
        from hloforge.core.registry import hloforge_version

        value: Any = hloforge_version()
    elif name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(import_module(module), attr) if attr else import_module(module)
    else:
        raise AttributeError(f"module 'hloforge' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
