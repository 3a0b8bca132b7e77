"""How an hloforge environment variable is read, one rule per sort so each says its values the same way:
an on/off switch (HLOFORGE_DEBUG, HLOFORGE_AUTOTUNE, HLOFORGE_RESIDENT, HLOFORGE_XLA_CACHE,
HLOFORGE_TRACE_PLUGINS, HLOFORGE_MPI), a path (HLOFORGE_CACHE_DIR, HLOFORGE_PJRT_PLUGIN) and a whole
number (HLOFORGE_CACHE_MAX_MB, HLOFORGE_IREE_WORKER_NICE, a launcher's process count)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from hloforge.core.errors import HloforgeError, setting_error

ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switch(text: str, default: bool = False) -> bool | None:
    """An on/off value, any case, spaces around ignored: True, False, `default` when empty, or None
    for neither (`env_switch` refuses it)."""
    text = text.strip().lower()
    return default if not text else True if text in ON else False if text in OFF else None


def env_switch(var: str, *, default: bool = False, on: str = "", off: str = "",
               error: type[HloforgeError] = HloforgeError, environ: Mapping[str, str] | None = None) -> bool:
    """$`var` as a switch: unset or empty is `default`. Any other value than ON/OFF is one `error` line
    naming the variable, its value and the accepted spellings with what each does (`on`, `off`;
    the default's side says it is the default)."""
    raw = (os.environ if environ is None else environ).get(var, "")
    value = switch(raw, default)
    if value is None:
        said = {True: on, False: off}
        said[default] = ", ".join(filter(None, (said[default], "the default, as is empty or unset")))
        on_text, off_text = (f" ({said[side]})" if said[side] else "" for side in (True, False))
        # !r: a newline or undecodable byte in the value stays on the one line, escaped
        raise setting_error(error, f"{var}={raw!r}: expected {'/'.join(ON)}{on_text} or {'/'.join(OFF)}{off_text}")
    return value


def env_path(var: str, environ: Mapping[str, str] | None = None) -> str | None:
    """$`var` as a path with `~` expanded (a quoted `~`, or one from an env file, arrives unexpanded and
    would name a directory called `~`); None when unset or empty."""
    raw = (os.environ if environ is None else environ).get(var, "")
    return os.path.expanduser(raw) if raw else None


def whole_number(text: str) -> int | None:
    """`text` as a whole number written in ASCII digits alone, else None. Not str.isdigit() alone, which
    passes '²' (int() then raises) and '٣' (int() reads it as 3)."""
    return int(text) if text.isascii() and text.isdigit() else None
