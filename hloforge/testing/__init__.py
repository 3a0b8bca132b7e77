"""The oracle gate, shipped for plugin authors: `gate_layer`, `gate_loss`, `gate_optimizer`, `gate_all`
(`collect_cases` lists every case, and a `CaseError` for each plugin whose cases cannot be built).

`pytest --hloforge-gate` (the `hloforge` pytest plugin) runs every registered
plugin's gate cases as test items. `hloforge.testing.backend_conformance` checks a backend
against its contract (`python -m hloforge.testing.backend_conformance NAME`). Names resolve lazily, so the pytest plugin
(loaded by every pytest run in the environment) costs nothing until used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hloforge.testing.gate import (
        HEADER,
        CaseError,
        GateCase,
        GateResult,
        collect_cases,
        gate_all,
        gate_cases,
        gate_layer,
        gate_loss,
        gate_optimizer,
    )

__all__ = ["HEADER", "CaseError", "GateCase", "GateResult", "collect_cases", "gate_all", "gate_cases", "gate_layer",
           "gate_loss", "gate_optimizer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("hloforge.testing.gate"), name)
    raise AttributeError(f"module 'hloforge.testing' has no attribute {name!r}")
