"""$XLA_FLAGS checked before the plugin loads: XLA ends the process (a fatal log line, exit 1, a usage
dump) at a flag it cannot parse, so each mistake it would stop at is refused here in one line."""

from __future__ import annotations

import mmap
import os
import re
import subprocess
from collections.abc import Iterator

from hloforge.backends.python_child import python_child_argv, runs_python
from hloforge.core.errors import BackendSettingError

_WS = " \t\r\n"
# DebugOptions field types (google.protobuf FieldDescriptorProto.Type) and labels.
_BOOL, _INT32, _INT64, _STRING = 8, 5, 3, 9
_OPTIONAL = 1
# The DebugOptions fields whose flag values are checked here (a bool, an int32, an int64) or that take any
# value (a string). XLA's own parsing is asked of any other (an enum's name, a float, a repeated or map
# field), and of a name in the plugin's file that is no field: see _xla_stops_at.
_CHECKED_HERE = {(_BOOL, _OPTIONAL), (_INT32, _OPTIONAL), (_INT64, _OPTIONAL), (_STRING, _OPTIONAL)}
_INT_RANGE = {_INT32: 1 << 31, _INT64: 1 << 63}
_BOOLS = ("true", "false", "1", "0")  # tsl's bool flag: these, in any case; "yes", "on", "" stop XLA


def _tokens(text: str) -> Iterator[tuple[str, str | None]]:
    """(name part, value or None) per flag, split as XLA's ParseArgvFromString does: whitespace
    between flags, a value after '=' that may be quoted with ' or "."""
    i = 0
    while True:
        while i < len(text) and text[i] in _WS:
            i += 1
        if i == len(text):
            return
        start = i
        while i < len(text) and text[i] not in _WS + "=":
            i += 1
        name = text[start:i]
        if i == len(text) or text[i] != "=":
            yield name, None
            continue
        i += 1
        if i < len(text) and text[i] in "'\"":
            end = text.find(text[i], i + 1)
            end = len(text) if end < 0 else end
            yield name, text[i + 1:end]
            i = end + 1
        else:
            start = i
            while i < len(text) and text[i] not in _WS:
                i += 1
            yield name, text[start:i]


def _varint(b: mmap.mmap, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = b[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80 or shift > 63:
            return value, i


def _fields(b: mmap.mmap, i: int, end: int) -> Iterator[tuple[int, int | tuple[int, int]]]:
    """(field number, varint or (start, end) of a length-delimited payload) of a protobuf message."""
    while i < end:
        key, i = _varint(b, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(b, i)
            yield key >> 3, value
        elif wire == 2:
            n, i = _varint(b, i)
            if i + n > end:
                return
            yield key >> 3, (i, i + n)
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:  # past the descriptor's end (or not a descriptor): stop
            return


def _debug_option_types(lib: mmap.mmap) -> dict[str, tuple[int, int]]:
    """{field name: (type, label)} of xla.DebugOptions, read off the plugin's embedded descriptor of
    xla/xla.proto (protobuf's generated code keeps it). Its flags are declared from these fields: a bool
    field's flag is a bool flag, an integer field's an integer flag, every other field's takes a string.
    Empty when the descriptor is not found: then only names are checked."""
    start = lib.find(b"\n\rxla/xla.proto")
    if start < 0:
        return {}
    try:
        for number, message in _fields(lib, start, len(lib)):
            if number > 20:  # FileDescriptorProto has no such field: the descriptor ended
                return {}
            if number != 4 or not isinstance(message, tuple):
                continue
            parts = list(_fields(lib, *message))
            names = [lib[v[0]:v[1]] for n, v in parts if n == 1 and isinstance(v, tuple)]
            if names[:1] != [b"DebugOptions"]:
                continue
            types: dict[str, tuple[int, int]] = {}
            for n, field in parts:
                if n == 2 and isinstance(field, tuple):
                    fd = dict(_fields(lib, *field))
                    name = fd.get(1)
                    if isinstance(name, tuple) and isinstance(fd.get(5), int) and isinstance(fd.get(4), int):
                        types[lib[name[0]:name[1]].decode(errors="replace")] = (fd[5], fd[4])  # type: ignore[assignment]
            return types
    except IndexError:
        return {}
    return {}


def _problem(name: str, value: str | None, kind: tuple[int, int] | None) -> str | None:
    """What XLA would stop at in one `--name[=value]`, as the line's middle; None: nothing known."""
    if kind is None:
        return None
    ftype, label = kind
    if label == _OPTIONAL and ftype == _BOOL:
        if value is not None and value.lower() not in _BOOLS:
            return (f"--{name}={value} is not a value XLA's boolean flags take (XLA would stop at it); "
                    f"expected --{name}, or --{name}=true/false/1/0")
        return None
    if value is None:
        return f"--{name} needs a value (XLA would stop at it); expected --{name}=VALUE"
    if label == _OPTIONAL and ftype in _INT_RANGE:
        bound = _INT_RANGE[ftype]
        if not re.fullmatch(r"[+-]?[0-9]+", value) or not -bound <= int(value) < bound:
            return (f"--{name}={value} is not an integer XLA takes (XLA would stop at it); "
                    f"expected --{name}=INTEGER")
    return None


def check_xla_flags(plugin_path: str) -> None:
    """Refuse what in $XLA_FLAGS XLA would end the process at, or silently ignore: a value that does not
    start with '-' and names no file (XLA reads such a value as a flag file's path: an existing file is
    checked as flags, since pointing XLA_FLAGS at a file of flags is XLA's documented use), a token
    not spelled --NAME[=VALUE], an `--xla_*` name the plugin does not know, a boolean flag's value
    that tsl does not parse, an integer flag's non-integer, a flag that takes a value given none.
    A flag XLA knows is a string in its library, so a name absent from the plugin's file is no flag
    of that build; a flag's type is its DebugOptions field's, from the descriptor in the same file. A
    name in the file that is no DebugOptions field, and a value of a kind not checked here (an enum's, a
    float's), are asked of XLA itself, in a child process (see `_xla_stops_at`), so no setting XLA takes
    is refused."""
    raw = os.environ.get("XLA_FLAGS", "")
    where = "XLA_FLAGS"
    text = raw
    if raw and not raw.lstrip(" \t\r\n").startswith("-"):  # XLA's test: a blank value is a file's name too
        if not os.path.isfile(raw):
            raise BackendSettingError(f"XLA_FLAGS={raw!r} does not start with '--', so XLA would read it as a "
                                      "flag file's path, and no such file exists; expected --NAME or --NAME=VALUE, "
                                      "separated by spaces")
        try:
            with open(raw, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:  # XLA's own open says why
            return
        where = f"XLA_FLAGS (flag file {raw})"
    flags = list(_tokens(text))
    for name, value in flags:
        if not name.startswith("--") or name == "--":
            token = name if value is None else f"{name}={value}"
            raise BackendSettingError(f"{where}: {token!r} is not a flag (XLA would "
                                      f"{'stop at it' if name.startswith('-') else 'ignore it'}); "
                                      "expected --NAME or --NAME=VALUE, separated by spaces")
    named = [(name[2:], value) for name, value in flags if name[2:].startswith(("xla_", "noxla_"))]
    if not named:
        return
    try:
        with open(plugin_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as lib:
            unknown = [n for n, _ in named
                       if lib.find(n.encode() + b"\0") < 0 and lib.find(n[2:].encode() + b"\0") < 0]
            if unknown:
                raise BackendSettingError(f"{where}: --{unknown[0]} is not a flag of the XLA plugin {plugin_path} "
                                          "(XLA would stop at it); expected one of its DebugOptions names, as "
                                          "--xla_NAME=VALUE")
            types = _debug_option_types(lib)
    except (OSError, ValueError):  # unreadable here: the plugin's own loading says why
        return
    for name, value in named:
        problem = _problem(name, value, types.get(name))
        if problem:
            raise BackendSettingError(f"{where}: {problem}")
    unchecked = [(n, v) for n, v in named if types.get(_field(n)) not in _CHECKED_HERE] if types else []
    if not unchecked or os.environ.get(_TAKEN_ENV) == text:  # asked of XLA by this process or its parent
        return
    if not _xla_stops_at(plugin_path, text):
        os.environ[_TAKEN_ENV] = text  # a compile worker started from here need not ask again
        return
    for name, value in unchecked:  # which one: a child each, on this path alone
        token = f"--{name}" + ("" if value is None else f"={value}")
        if (stopped := _xla_stops_at(plugin_path, token)) == _UNKNOWN:
            raise BackendSettingError(f"{where}: --{name} is not a flag of the XLA plugin {plugin_path} (XLA would "
                                      "stop at it); expected one of its DebugOptions names, as --xla_NAME=VALUE")
        if stopped:
            raise BackendSettingError(f"{where}: {token} is not a value XLA's flag parsing takes (XLA would stop at "
                                      "it); expected a value of the flag's DebugOptions field (an enum's value name, "
                                      "a number)")
    raise BackendSettingError(f"{where}: XLA's flag parsing stops at these flags together, though at none alone; "
                              "expected flags it takes (try them one at a time)")


def _field(name: str) -> str:
    """The DebugOptions field a flag name sets (tsl's `--noNAME` is NAME's boolean false)."""
    return name[2:] if name.startswith("no") else name


_UNKNOWN, _BAD_VALUE = "unknown", "bad value"
# The XLA_FLAGS text XLA's own parsing took when this process (or its parent) asked it (_xla_stops_at).
_TAKEN_ENV = "HLOFORGE_XLA_FLAGS_TAKEN"


def _xla_stops_at(plugin_path: str, flags: str) -> str | None:
    """Whether XLA's own parsing of `flags` as $XLA_FLAGS ends its process, asked of a child process that
    loads the plugin and makes a client (~0.2 s): _UNKNOWN (a name it registers no flag for), _BAD_VALUE
    (a value it cannot parse), or None where it takes them (or the child cannot say). For what the
    plugin's file cannot settle: a name it holds that is no DebugOptions field (a retired flag XLA still
    takes, such as xla_cpu_use_thunk_runtime, or a string of another kind, such as
    xla_cpu_use_multi_output_fusion), and a value of a field kind not checked here (_CHECKED_HERE)."""
    if not runs_python():
        return None
    code = "from hloforge.backends.xla.pjrt.api import Api; Api(sys.argv[2]).call('Client_Create', 'creating a client')"
    try:
        proc = subprocess.run(python_child_argv(code, plugin_path), capture_output=True, text=True, errors="replace",
                              timeout=120, env={**os.environ, "XLA_FLAGS": flags})
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode == 0:
        return None
    if "Unknown flag in XLA_FLAGS" in proc.stderr:
        return _UNKNOWN
    return _BAD_VALUE if "Flag parsing failed" in proc.stderr or "Couldn't interpret value" in proc.stderr else None
