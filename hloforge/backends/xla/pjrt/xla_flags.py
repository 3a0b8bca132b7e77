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
_BOOL, _INT32, _INT64 = 8, 5, 3
_OPTIONAL = 1
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
    name in the file that is no DebugOptions field is asked of XLA itself, in a child process (see
    `_flag_xla_stops_at`). What the file does not tell otherwise (a float's spelling) is left to XLA,
    so no setting XLA takes is refused."""
    raw = os.environ.get("XLA_FLAGS", "")
    where = "XLA_FLAGS"
    text = raw
    if raw.lstrip(" \t") and not raw.lstrip(" \t").startswith("-"):
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
    if types and any(_field(name) not in types for name, _ in named):
        stopped_at = _flag_xla_stops_at(plugin_path)
        if stopped_at:
            raise BackendSettingError(f"{where}: --{stopped_at} is not a flag of the XLA plugin {plugin_path} "
                                      "(XLA would stop at it); expected one of its DebugOptions names, as "
                                      "--xla_NAME=VALUE")


def _field(name: str) -> str:
    """The DebugOptions field a flag name sets (tsl's `--noNAME` is NAME's boolean false)."""
    return name[2:] if name.startswith("no") else name


# What XLA's flag parsing prints as it ends the process at a name it does not register.
_UNKNOWN_FLAG = re.compile(r"Unknown flag in XLA_FLAGS: --((?:no)?xla_[A-Za-z0-9_]+)")


def _flag_xla_stops_at(plugin_path: str) -> str | None:
    """The name in $XLA_FLAGS that XLA's own parsing stops at, asked of a child process that loads the
    plugin and makes a client (~0.2 s); None where XLA takes them all, or the child cannot say. For a
    name the plugin's file holds that is no DebugOptions field: a flag XLA still registers (a retired
    one it warns about, such as xla_cpu_use_thunk_runtime) or a string of another kind (an MLIR option,
    a log message: xla_cpu_use_multi_output_fusion), which the file alone cannot tell apart."""
    if not runs_python():
        return None
    code = "from hloforge.backends.xla.pjrt.api import Api; Api(sys.argv[2]).call('Client_Create', 'creating a client')"
    try:
        proc = subprocess.run(python_child_argv(code, plugin_path), capture_output=True, text=True, errors="replace",
                              timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    found = _UNKNOWN_FLAG.search(proc.stderr) if proc.returncode != 0 else None
    return found.group(1) if found else None
