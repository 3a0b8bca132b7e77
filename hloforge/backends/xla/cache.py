"""XLA's persistent compilation cache: executables serialized through the PJRT C API, on disk.

An entry is keyed by a sha256 of everything the compiled code depends on (:func:`key_material`):
the module text, the serialized compile options (replicas, device assignment, scheduler), the
plugin (its file's path, size and mtime, platform version, PJRT API version, attributes), the
devices' kind and count, the host CPU and $XLA_FLAGS. It lives in ``cache_root()/"xla"`` and is
written and pruned as :mod:`hloforge.backends.disk_cache` says (atomic, shared by processes, LRU
by size). The entry starts with a header holding its key material and a sha256 of the payload:
one that is truncated, damaged or another key's is never handed to the plugin (whose loader is no
checksum); it is compiled again, with one warning, and replaced. $HLOFORGE_XLA_CACHE=0 turns the
cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import warnings
from pathlib import Path
from typing import Any

from hloforge.backends.base import CACHE_ENV_VAR as CACHE_ROOT_ENV_VAR
from hloforge.backends.base import ForkedError, cache_root
from hloforge.backends.disk_cache import first_unwritable, host_cpu, max_bytes, prune, sha256_key, touch, write_atomic
from hloforge.backends.xla import compile_worker
from hloforge.backends.xla.pjrt import Client, Executable
from hloforge.core.errors import BackendError, HloforgeWarning
from hloforge.core.switches import env_switch

CACHE_ENV_VAR = "HLOFORGE_XLA_CACHE"
SUFFIX = ".xlaexe"
# An entry: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: key and key
# material), the payload's sha256 (32 bytes), the payload (the plugin's serialized executable).
MAGIC = b"hloforge xla executable 1\n"
_LENGTH = struct.Struct("<Q")
_UNSERIALIZABLE: set[str] = set()  # plugins that said so (warned once per process)


class XlaCacheWarning(HloforgeWarning):
    """A cache entry that could not be used or written (the run goes on, compiling)."""


def cache_enabled() -> bool:
    """$HLOFORGE_XLA_CACHE, an on/off switch: on (the default) caches executables on disk, off compiles
    every time."""
    return env_switch(CACHE_ENV_VAR, default=True, on="cache compiled XLA executables on disk",
                      off="compile every time", error=BackendError)


def default_cache_dir() -> Path:
    return cache_root() / "xla"


def plugin_identity(client: Client) -> dict[str, Any]:
    """Which plugin build compiles: an upgrade in place changes its file's size or mtime."""
    path = os.path.realpath(client.plugin_path)
    try:
        st = os.stat(path)
        build: list[int] = [st.st_size, st.st_mtime_ns]
    except OSError:
        build = []
    return {"path": path, "build": build, "platform": client.platform_name, "version": client.platform_version,
            "api": list(client.api_version), "attributes": client._api.attributes}


def key_material(client: Client, mlir_text: str, options: bytes, num_replicas: int) -> dict[str, Any]:
    """What the executable compiled from these depends on (the key is its sha256; the entry's header
    holds it, the module as a sha256)."""
    return {
        "module": hashlib.sha256(mlir_text.encode()).hexdigest(),
        "options": options.hex(),
        "replicas": num_replicas,
        "plugin": plugin_identity(client),
        "devices": [d.kind for d in client.devices[:num_replicas]],
        "device_count": len(client.devices),
        "host": host_cpu(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def encode_entry(key: str, material: dict[str, Any], payload: bytes) -> bytes:
    header = json.dumps({"key": key, "material": material}, sort_keys=True).encode()
    return MAGIC + _LENGTH.pack(len(header)) + header + hashlib.sha256(payload).digest() + payload


def decode_entry(blob: bytes, key: str, material: dict[str, Any]) -> tuple[bytes | None, str]:
    """(the payload, "") if `blob` is a whole entry for exactly this key, else (None, what is wrong)."""
    if not blob.startswith(MAGIC):
        return None, "not a hloforge XLA cache entry"
    at = len(MAGIC)
    if len(blob) < at + _LENGTH.size:
        return None, "truncated"
    (size,) = _LENGTH.unpack_from(blob, at)
    at += _LENGTH.size
    if len(blob) < at + size + 32:
        return None, "truncated"
    try:
        header = json.loads(blob[at:at + size])
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError both are
        return None, "damaged (its header does not parse)"
    if not isinstance(header, dict) or header.get("key") != key:
        return None, "another key's entry"
    if header.get("material") != json.loads(json.dumps(material)):
        return None, "for another module, plugin or options (its header does not match its key)"
    at += size
    digest, payload = blob[at:at + 32], blob[at + 32:]
    if hashlib.sha256(payload).digest() != digest:
        return None, "damaged or truncated (its checksum does not match)"
    return payload, ""


class ExecutableCache:
    """Compiles through a Client, loading from and storing to one cache directory."""

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        # a bad setting fails here, before a net is rendered (and at compile)
        cache_enabled(), max_bytes(), compile_worker.worker_enabled()
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        #: compiles and cache hits made through this cache (tests read these)
        self.stats = {"compiles": 0, "worker_compiles": 0, "hits": 0, "compile_s": 0.0, "load_s": 0.0}

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def compile(self, client: Client, mlir_text: str, num_replicas: int = 1, scheduler: str | None = None,
                overrides: dict[str, bool | int | float | str] | None = None) -> Executable:
        """As :meth:`Client.compile`, from the cache where it holds this executable (and into it
        where not). ``exe.cache_hit`` says which."""
        options, scheduler = client.build_options(num_replicas, scheduler, overrides)
        if not cache_enabled():
            return self._compile(client, mlir_text, options, num_replicas, scheduler)[0]
        material = key_material(client, mlir_text, options, num_replicas)
        key = sha256_key(material)
        path = self.path(key)
        exe = self._load(client, path, key, material, mlir_text, options, num_replicas, scheduler)
        if exe is not None:
            return exe
        exe, payload = self._compile(client, mlir_text, options, num_replicas, scheduler)
        if payload is None:
            try:
                payload = exe.serialize()
            except BackendError as e:  # a plugin without serialization: nothing to store (said once)
                if client.plugin_path not in _UNSERIALIZABLE:
                    _UNSERIALIZABLE.add(client.plugin_path)
                    _warn(f"XLA cache: the {client.platform_name} plugin {client.plugin_path} cannot serialize "
                          f"an executable ({getattr(e, 'plugin_message', e)}); its executables are not cached")
                return exe
        try:
            write_atomic(path, encode_entry(key, material, payload))
            prune(self.directory, SUFFIX, keep=path)
        except OSError as e:
            why = first_unwritable(self.directory, e)
            if why is not None:
                _warn(f"XLA cache: cannot write to {self.directory} ({why}); executables are not cached "
                      f"(${CACHE_ROOT_ENV_VAR} names a writable directory, ${CACHE_ENV_VAR}=0 turns the cache off)")
        return exe

    def _compile(self, client: Client, mlir_text: str, options: bytes, num_replicas: int,
                 scheduler: str | None) -> tuple[Executable, bytes | None]:
        """The executable, compiled in a worker process where it takes the module
        (:mod:`~hloforge.backends.xla.compile_worker`), else here; and its serialization where the
        worker sent it."""
        t0 = time.perf_counter()
        exe, payload = None, None
        if compile_worker.takes(client.platform_name, mlir_text) and client.plugin_path not in _UNSERIALIZABLE:
            payload = compile_worker.worker_for(client.plugin_path, len(client.devices)).compile(
                mlir_text, options, num_replicas)
            if payload is not None:
                try:
                    exe = client.deserialize(payload, mlir_text, options, num_replicas, scheduler)
                    self.stats["worker_compiles"] += 1
                except BackendError:  # not this process's plugin build after all: compile here
                    payload = None
        if exe is None:
            exe = client.compile_with_options(mlir_text, options, num_replicas, scheduler)
        self.stats["compiles"] += 1
        self.stats["compile_s"] += time.perf_counter() - t0
        exe.cache_hit = False
        return exe, payload

    def _load(self, client: Client, path: Path, key: str, material: dict[str, Any], mlir_text: str,
              options: bytes, num_replicas: int, scheduler: str | None) -> Executable | None:
        """The entry's executable, or None (a miss; an entry that cannot be used warns once)."""
        t0 = time.perf_counter()
        try:
            blob = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # a miss (a cache root that is a file: the write says so)
            return None
        except OSError as e:
            _warn(f"XLA cache entry {path} cannot be read ({e.strerror or e}); compiling again")
            return None
        payload, wrong = decode_entry(blob, key, material)
        if payload is None:
            _warn(f"XLA cache entry {path} is {wrong}; compiling again and replacing it")
            return None
        try:
            exe = client.deserialize(payload, mlir_text, options, num_replicas, scheduler)
        except ForkedError:  # the process cannot run XLA at all: no fault of the entry's
            raise
        except BackendError as e:
            _warn(f"XLA cache entry {path} does not load ({getattr(e, 'plugin_message', e)}); "
                  f"compiling again and replacing it")
            return None
        touch(path)
        self.stats["hits"] += 1
        self.stats["load_s"] += time.perf_counter() - t0
        exe.cache_hit = True
        return exe


def _warn(message: str) -> None:
    warnings.warn(XlaCacheWarning(message), stacklevel=4)
