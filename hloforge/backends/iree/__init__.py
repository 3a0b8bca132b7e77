"""IREE backend: StableHLO through ``iree.compiler`` and ``iree.runtime``, with an on-disk compile cache."""

from hloforge.backends.iree.backend import IreeBackend, IreeBuffer, IreeExecutable, cache_key, default_cache_dir

__all__ = ["IreeBackend", "IreeBuffer", "IreeExecutable", "cache_key", "default_cache_dir"]
