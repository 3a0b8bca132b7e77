"""The spellings of an on/off environment variable (HLOFORGE_DEBUG, HLOFORGE_AUTOTUNE): one rule, so
each says the same values the same way."""

from __future__ import annotations

ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switch(text: str) -> bool | None:
    """An on/off value, any case, spaces around ignored: True, False (empty too), or None for neither
    (the caller refuses it in its own words, naming `ON` and `OFF`)."""
    text = text.strip().lower()
    return False if text in ("", *OFF) else True if text in ON else None
