"""Which of a run's weights a command reads: its live θ, the EMA shadow its variant keeps, or `auto`
(the shadow where the run kept one). Kept free of heavy imports: the command's parser reads it."""

from __future__ import annotations

from typing import Any

from hloforge.core.errors import UnsupportedSpec

REGIONS = ("live", "ema", "auto")
DEFAULT_REGION = "auto"


def check_region(region: Any, what: str = "region") -> None:
    """A region name refused unless one of REGIONS (before anything is opened); `what` names it."""
    if region not in REGIONS:
        raise UnsupportedSpec(f"{what} {region!r}; expected one of {list(REGIONS)}")
