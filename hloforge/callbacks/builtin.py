"""The built-in callbacks' registration (the `hloforge.callbacks` entry-point group, as a third party's).
A plain module: the package above is also the lookup of every registered callback, and the plugin
manager must not scan a lookup while the registry it reads is being built."""

from __future__ import annotations

from hloforge.callbacks import CSVLogger, EarlyStopping, ModelCheckpoint, TensorBoard
from hloforge.core.hookspecs import hookimpl


@hookimpl
def hloforge_callbacks() -> list[type]:
    return [EarlyStopping, ModelCheckpoint, CSVLogger, TensorBoard]
