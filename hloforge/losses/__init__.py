"""The built-in losses; also `hf.losses`, the lookup of every registered loss (hloforge.lookup)."""

import sys

from hloforge.lookup import LookupModule

sys.modules[__name__].__class__ = LookupModule
sys.modules[__name__]._lookup_kind = "loss"  # type: ignore[attr-defined]
