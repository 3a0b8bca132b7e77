"""A module's transient memory in one buffer the caller holds (IREE's external transients).

IREE 3.13 allocates a program's intermediate buffers from a queue-ordered pool on the device and frees
them back to it at the end of each call. Its local-task pool reuses a freed block only when it can prove
the next call's allocation comes after the free; across our calls it cannot, so it takes a fresh 64 MiB
slab instead, and a train step grows the process by what its transients take, every step, for as long
as the device lives (resnet18-cifar at batch 32: ~200 MB a step; `iree-benchmark-module` alone does the
same). Given a storage buffer of its own (`!hal.buffer {iree.abi.transients}` on @main, and each result
passed through `hal.tensor.transients`), IREE packs every transient into it instead, and reports the size
it needs (`iree.abi.transients.size.constant` in @main's reflection): the buffer is made once per
executable and passed to every call.

:func:`with_transient_storage` rewrites @main that way; a text whose @main it cannot read is compiled as
it is (IREE's own allocation, as before).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

STORAGE_ARG = "%hloforge_transients"
# @main's reflection: what the storage must hold, bytes (a program whose sizes are all static)
SIZE_KEY = "iree.abi.transients.size.constant"
# what marks a compiled @main as taking the storage
TAKES_STORAGE_KEY = "iree.abi.transients.size"

_MAIN = re.compile(r"func\.func\s+(?:public\s+)?@main\s*\(")
_RETURN = re.compile(r"^(\s*)(?:func\.)?return\s+(.+?)\s*:\s*(.+?)\s*$")
_PAIRS = {"(": ")", "[": "]", "{": "}", "<": ">"}
_STRING = re.compile(r'"(?:\\.|[^"\\])*"?')


@functools.cache
def _stops(openers: str, also: str) -> re.Pattern[str]:
    return re.compile("[" + re.escape('"' + openers + "".join(_PAIRS[o] for o in openers) + also) + "]")


def _brackets(text: str, i: int = 0, openers: str = "([{<",
              also: str = "") -> Iterator[tuple[int, str, list[str]]]:
    """From text[i] on, each bracket of the kinds `openers` opens or closes, and each character of
    `also`, outside string literals, with the brackets open after it (a `->` is no closer); stops where
    a closer does not match its opener. It jumps from one such character to the next: @main's body is
    most of a step's text."""
    stack: list[str] = []
    stops = _stops(openers, also)
    while (found := stops.search(text, i)) is not None:
        k, c = found.start(), found.group()
        i = k + 1
        if c == '"':  # a string literal, escapes and all
            literal = _STRING.match(text, k)
            i = literal.end() if literal is not None else len(text)
            continue
        if c in openers:
            stack.append(c)
        elif c in also:
            pass
        elif c == ">" and text[k - 1] == "-":
            continue
        elif not stack or _PAIRS[stack.pop()] != c:
            return
        yield k, c, stack


def _matching(text: str, i: int) -> int:
    """The index of the bracket closing the one at text[i], or -1 (only that kind of bracket is counted:
    the others between nest within it)."""
    return next((k for k, _, stack in _brackets(text, i, openers=text[i]) if not stack), -1)


def _top_level_split(text: str) -> list[str]:
    """`text` split at the commas outside any brackets."""
    cuts = [k for k, c, stack in _brackets(text, also=",") if c == "," and not stack]
    parts = [text[a + 1:b].strip() for a, b in zip([-1, *cuts], [*cuts, len(text)], strict=True)]
    return [p for p in parts if p]


def _body_start(text: str, i: int) -> int:
    """The index of the `{` opening a function's body, from just after its parameter list: past its
    results (`-> (...)`, `-> tensor<...>`) and `attributes {...}`; -1 where there is none."""
    while i < len(text):
        if text.startswith("->", i):
            i += 2
        elif text.startswith("attributes", i):
            i = text.find("{", i)
            if i < 0:
                return -1
            i = _matching(text, i) + 1
            if i == 0:
                return -1
        elif text[i] == "{":
            return i
        elif text[i] in "(<":
            i = _matching(text, i) + 1
            if i == 0:
                return -1
        else:
            i += 1
    return -1


def with_transient_storage(mlir_text: str) -> str | None:
    """`mlir_text` with @main taking a transient storage buffer as its last parameter and each of its
    results placed through it; None where @main's parameter list, body or return is not found."""
    head = _MAIN.search(mlir_text)
    if head is None:
        return None
    params_end = _matching(mlir_text, head.end() - 1)
    if params_end < 0:
        return None
    body_start = _body_start(mlir_text, params_end + 1)
    body_end = _matching(mlir_text, body_start) if body_start >= 0 else -1
    if body_end < 0:
        return None
    body = mlir_text[body_start + 1:body_end].rstrip()
    last_newline = body.rfind("\n")
    found = _RETURN.match(body[last_newline + 1:])
    if found is None:
        return None
    indent, values, types = found.group(1), _top_level_split(found.group(2)), _top_level_split(found.group(3))
    if len(values) != len(types) or not values:
        return None
    placed = [f"{indent}%hloforge_transient{k} = hal.tensor.transients {v} : {t} from {STORAGE_ARG} : !hal.buffer"
              for k, (v, t) in enumerate(zip(values, types, strict=True))]
    ret = f"{indent}return {', '.join(f'%hloforge_transient{k}' for k in range(len(values)))} : {', '.join(types)}"
    params = mlir_text[head.end():params_end].strip()
    storage = f"{STORAGE_ARG}: !hal.buffer {{iree.abi.transients}}"
    signature = mlir_text[:head.end()] + (f"{params}, {storage}" if params else storage)
    body_from = body_start + 1
    return (signature + mlir_text[params_end:body_from] + body[:last_newline + 1] + "\n".join(placed) + "\n" + ret
            + mlir_text[body_from + len(body):])


def with_reflection(mlir_text: str, entries: dict[str, str]) -> str | None:
    """`mlir_text` with `entries` (string values) in @main's `iree.reflection`, which the compiled function
    carries (its `reflection`); None where @main's parameters or body are not found, or it has attributes of
    its own already."""
    head = _MAIN.search(mlir_text)
    params_end = _matching(mlir_text, head.end() - 1) if head is not None else -1
    body_start = _body_start(mlir_text, params_end + 1) if params_end >= 0 else -1
    if body_start < 0 or "attributes" in mlir_text[params_end:body_start]:
        return None
    said = ", ".join(f'{k} = "{v}"' for k, v in entries.items())
    return f"{mlir_text[:body_start]}attributes {{iree.reflection = {{{said}}}}} {mlir_text[body_start:]}"
