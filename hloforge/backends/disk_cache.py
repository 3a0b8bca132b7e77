"""What the on-disk compile caches share (IREE's .vmfb, XLA's serialized executables).

One directory per cache under :func:`hloforge.backends.base.cache_root`. An entry is written to a
temp file beside it and renamed into place, so processes can share a cache and a reader never sees
a half-written entry; a hit touches the entry's mtime, and once a write takes the directory over
$HLOFORGE_CACHE_MAX_MB it is pruned oldest-first (by mtime: least recently used) to 90% of it.

Knowing the directory's size takes a stat of every entry: a fraction of a second per write once a cache
holds tens of thousands (benchmarks/NOTES.md). So a process scans a directory once, then adds what it
writes to that total, and scans again only when the total would pass the limit or the last scan is
RESCAN_S old (other processes write there too); pruning to 90% leaves room for many writes between
scans of a full cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from hloforge.core.errors import BackendSettingError
from hloforge.core.switches import whole_number

MAX_MB_ENV_VAR = "HLOFORGE_CACHE_MAX_MB"
#: the size one cache directory is pruned to, in MiB, when $HLOFORGE_CACHE_MAX_MB is not set
DEFAULT_MAX_MB = 2048
# A temp file this old is a writer that died before its rename: pruned like an entry.
_STALE_TEMP_S = 24 * 3600
#: how old this process's last count of a directory's bytes may be before a write counts them again
RESCAN_S = 60.0
#: what a prune leaves of the limit: room for the next writes before the next scan
LOW_WATER = 0.9
# (directory, suffix) → (when this process last counted its entries' bytes, that count plus its writes since)
_TALLIES: dict[tuple[str, str], tuple[float, int]] = {}


def sha256_key(material: dict[str, Any]) -> str:
    """The hex sha256 of `material` as canonical JSON (every cache key is one)."""
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


@functools.cache
def host_cpu() -> str:
    """The host CPU a CPU compiler targets (XLA's CPU plugin; IREE's llvm-cpu at target-cpu=host): an
    entry from another CPU could hold instructions this one lacks, so it is part of those caches' keys.
    Its model and feature flags where /proc/cpuinfo says, else the machine type."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        info = ""
    fields: dict[str, str] = {}
    for line in info.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "flags", "Features", "CPU part") and name not in fields:
            fields[name] = " ".join(sorted(value.split())) if name in ("flags", "Features") else value.strip()
    return json.dumps({"machine": platform.machine(), **fields}, sort_keys=True)


_UNWRITABLE: set[tuple[Path, str]] = set()  # (cache directory, why) already said


def first_unwritable(directory: Path, e: OSError) -> str | None:
    """Why `directory` could not be written, the first time this process meets that (directory, cause); None
    after: every later entry would fail alike, so a cache says it once."""
    why = e.strerror or str(e)
    if (directory, why) in _UNWRITABLE:
        return None
    _UNWRITABLE.add((directory, why))
    return why


def _file_mode() -> int:
    """The mode open() gives a new file under this process's umask now (the user may have set another since the
    last write). Read from /proc (Linux 4.7+), where no call reads it without setting it: set and put back, it
    would be another for the user's threads meanwhile; that is only the fallback."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temp file in `path`'s directory, then rename it onto `path`. The entry gets the
    mode of a file the user makes (mkstemp's is 0600), so a cache shared between users is read by each:
    under 0600 another user's run took every entry for damaged and compiled it again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def touch(path: Path) -> None:
    """Mark an entry as just used (pruning keeps the most recently used)."""
    try:
        os.utime(path)
    except OSError:  # pruned by another process meanwhile, or a read-only cache: still a hit
        pass


def max_bytes() -> int:
    """$HLOFORGE_CACHE_MAX_MB (a whole number of MiB; 0 keeps only the entry just written) in bytes."""
    text = os.environ.get(MAX_MB_ENV_VAR, str(DEFAULT_MAX_MB)).strip()
    mib = whole_number(text)
    if mib is None:
        raise BackendSettingError(f"{MAX_MB_ENV_VAR}={text!r}: expected a whole number of MiB "
                                  f"(default {DEFAULT_MAX_MB})")
    return mib * 2**20


def prune(directory: Path, suffix: str, keep: Path | None = None, limit: int | None = None) -> list[Path]:
    """After `keep` (the entry just written) was written: where the directory's `*suffix` entries may
    pass `limit` bytes (default :func:`max_bytes`; see the module docstring for when they are counted),
    delete the least recently used but `keep` until the rest fit in LOW_WATER of it; returns what was
    deleted. Another process's entry that vanishes meanwhile is skipped; an entry a reader has open
    stays readable to it (POSIX)."""
    limit = max_bytes() if limit is None else limit
    now = time.time()
    tally_key = (os.path.abspath(directory), suffix)
    added = _size(keep)
    scanned_at, total = _TALLIES.get(tally_key, (float("-inf"), 0))
    if now - scanned_at < RESCAN_S and total + added <= limit:
        _TALLIES[tally_key] = (scanned_at, total + added)
        return []
    entries = []
    try:
        listing = list(os.scandir(directory))
    except OSError:
        return []
    for item in listing:
        stale_temp = item.name.startswith(".") and item.name.endswith(".tmp")
        if not (item.name.endswith(suffix) and not item.name.startswith(".")) and not stale_temp:
            continue
        try:
            st = item.stat(follow_symlinks=False)
        except OSError:
            continue
        if stale_temp and now - st.st_mtime < _STALE_TEMP_S:
            continue  # another writer's, still being written
        entries.append((st.st_mtime, st.st_size, Path(item.path)))
    total = sum(size for _, size, _ in entries)
    removed = []
    if total > limit:
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= limit * LOW_WATER:
                break
            if path == keep:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            total -= size
            removed.append(path)
    _TALLIES[tally_key] = (now, total)
    return removed


def _size(path: Path | None) -> int:
    try:
        return 0 if path is None else path.stat().st_size
    except OSError:
        return 0
