"""The exception hierarchy: every error is one clear line naming what is wrong."""

from __future__ import annotations


class HloforgeError(Exception):
    """Base of every error hloforge raises on purpose."""


class HloforgeWarning(UserWarning):
    """Base of hloforge's warnings: the work goes on, and the command line prints each as one line."""


class UnsupportedSpec(HloforgeError):
    """A spec (or an option in it) that no plugin can render faithfully."""


class PluginError(HloforgeError):
    """A plugin lookup failed, or two plugins claim one name."""


class BackendError(HloforgeError):
    """A backend could not load, compile or run; carries the backend's own message."""


class DataError(HloforgeError):
    """A data file or array that is malformed, truncated or of the wrong shape."""
