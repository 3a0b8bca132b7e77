"""Shared by the fuzz properties: the one outcome rule every fuzzed input must meet, and a tally.

The rule: the input is accepted (and the caller checks it works), or it is refused with an
HloforgeError whose message is one line naming the input; any other exception fails the property
(hypothesis then shrinks it), and no file that existed before the call changes.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hloforge.core.errors import HloforgeError

# surface -> Counter(tried, refused, accepted); printed at exit when HLOFORGE_FUZZ_TALLY is set
TALLY: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
MESSAGES: list[str] = []  # every refusal's message, written next to the tally for a person to read
REFUSED = object()
HANG_S = 20  # far past any real reading of these tiny inputs: past it, the input hangs the reader


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"still running after {HANG_S} s")


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def files_under(paths: Iterable[str]) -> dict[str, str]:
    """sha256 of every file at or under `paths`."""
    out = {}
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                for n in names:
                    out[os.path.join(root, n)] = _digest(os.path.join(root, n))
        elif os.path.exists(p):
            out[p] = _digest(p)
    return out


def outcome(surface: str, call: Callable[[], Any], names: Sequence[str], watched: Sequence[str]) -> Any:
    """`call()`'s result, or REFUSED when it raised a clean HloforgeError naming one of `names`."""
    before = files_under(watched)
    TALLY[surface]["tried"] += 1
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        result = call()
    except HloforgeError as e:
        msg = str(e)
        assert msg.strip() and "\n" not in msg, f"not one line: {msg!r}"
        assert any(n in msg for n in names), f"names none of {list(names)}: {msg!r}"
        TALLY[surface]["refused"] += 1
        MESSAGES.append(f"{surface}\t{msg}")
        result = REFUSED
    else:
        TALLY[surface]["accepted"] += 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    after = files_under(watched)
    changed = sorted(p for p in before if after.get(p) != before[p])
    assert not changed, f"changed files that existed before: {changed}"
    return result


@atexit.register
def _print_tally() -> None:
    if os.environ.get("HLOFORGE_FUZZ_TALLY") and TALLY:
        with open(os.environ["HLOFORGE_FUZZ_TALLY"], "a", encoding="utf-8") as f:
            for s, c in sorted(TALLY.items()):
                f.write(f"{s} | {c['tried']} | {c['refused']} | {c['accepted']}\n")
        with open(os.environ["HLOFORGE_FUZZ_TALLY"] + ".messages", "a", encoding="utf-8") as f:
            f.writelines(m + "\n" for m in MESSAGES)


def corrupt(data: bytes, ops: Sequence[tuple[str, int, int]]) -> bytes:
    """Apply ("truncate", n, _), ("flip", pos, xor), ("append", n, byte) or ("u32", pos, value) in order."""
    b = bytearray(data)
    for op, a, v in ops:
        if op == "truncate":
            del b[min(a, len(b)):]
        elif op == "flip" and b:
            b[a % len(b)] ^= v or 1
        elif op == "append":
            b += bytes([v % 256]) * a
        elif op == "u32" and len(b) >= 4:
            pos = a % (len(b) - 3)
            b[pos:pos + 4] = (v % 2**32).to_bytes(4, "little" if a % 2 == 0 else "big")
    return bytes(b)
