"""The built-in losses; also `hf.losses`, the lookup of every registered loss (hloforge.core.lookup)."""

import sys

from hloforge.core.lookup import LookupModule

sys.modules[__name__].__class__ = LookupModule
sys.modules[__name__]._lookup_kind = "loss"  # type: ignore[attr-defined]
