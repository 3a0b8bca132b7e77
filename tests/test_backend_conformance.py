"""The backend conformance suite (hloforge.testing.backend_conformance) over every registered backend,
on a third party's by name, and against broken backends it must fail."""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Any, ClassVar

import numpy as np
import pytest

from hloforge.core.errors import BackendError
from hloforge.core.hookspecs import hookimpl
from hloforge.core.registry import Registry, default_registry
from hloforge.testing.backend_conformance import CHECKS, make, run_conformance

NAMES = default_registry().names("backend")


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    """One instance per registered backend (None where its packages are missing), compiling into a
    fresh cache so every check really compiles."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HLOFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        made: dict[str, Any] = {}

        def get(name: str) -> Any:
            if name not in made:
                try:
                    made[name] = make(name)
                except BackendError as e:  # e.g. iree without its packages: a BackendError naming them
                    made[name] = e
            if isinstance(made[name], BackendError):
                pytest.skip(f"backend {name!r} is not usable here: {made[name]}")
            return made[name]

        yield get


def test_every_builtin_backend_is_checked():
    assert {"xla", "iree"} <= set(NAMES)


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", NAMES)
def test_conformance(backends, name, check):
    (result,) = run_conformance(backends(name), [check])
    assert result.passed, result.line()


class Wrapped:
    """A third party's backend: XLA's, under another name."""

    name: ClassVar[str] = "toyXla"
    inner: ClassVar[Any] = None

    def __init__(self) -> None:
        self.be = type(self).inner

    def backend_name(self) -> str:
        return f"toy over {self.be.backend_name()}"

    def compile(self, mlir_text: str, num_replicas: int = 1) -> Any:
        return self.be.compile(mlir_text, num_replicas)

    def to_device(self, array: np.ndarray, borrow: bool = False, device: int = 0) -> Any:
        return self.be.to_device(array, borrow, device)

    def device_count(self) -> int:
        return int(self.be.device_count())

    def to_host(self, buffer: Any) -> np.ndarray:
        return np.asarray(self.be.to_host(buffer))

    def execute(self, exe: Any, args: Any, keep: Any = ()) -> list[Any]:
        return list(self.be.execute(exe, args, keep=keep))

    def execute_replicated(self, exe: Any, per_replica: Any, keep: Any = ()) -> list[list[Any]]:
        return list(self.be.execute_replicated(exe, per_replica, keep=keep))


@pytest.fixture
def xla(backends):
    Wrapped.inner = backends("xla")
    yield Wrapped.inner
    Wrapped.inner = None


def test_a_third_party_backend_is_checked_by_name(xla):
    plugin = types.ModuleType("toy_backend_plugin")
    plugin.hloforge_backends = hookimpl(lambda: [Wrapped])
    reg = Registry(extra_plugins=((plugin, "hloforge-toy"),))
    results = run_conformance("toyXla", registry=reg)
    assert [r.check for r in results] == list(CHECKS)
    assert all(r.passed for r in results), [r.line() for r in results if not r.passed]


class OneDeviceOnly:
    """A backend with only the required members (docs/plugins.md's example): one device, no replicas."""

    name: ClassVar[str] = "oneDevice"

    def __init__(self) -> None:
        self.be = Wrapped.inner

    def backend_name(self) -> str:
        return "one device"

    def compile(self, mlir_text: str, num_replicas: int = 1) -> Any:
        if num_replicas != 1:
            raise BackendError(f"num_replicas={num_replicas}: this backend runs one device")
        return self.be.compile(mlir_text)

    def to_device(self, array: np.ndarray, borrow: bool = False) -> Any:
        return self.be.to_device(array, borrow)

    def to_host(self, buffer: Any) -> np.ndarray:
        return np.asarray(self.be.to_host(buffer))

    def execute(self, exe: Any, args: Any, keep: Any = ()) -> list[Any]:
        return list(self.be.execute(exe, args, keep=keep))


def test_the_replica_members_are_optional(xla):
    assert [r.line() for r in run_conformance(OneDeviceOnly()) if not r.passed] == []


class ViewToHost(Wrapped):
    """to_host hands out one cached array per buffer: a write to it shows on the next read."""

    def to_host(self, buffer: Any) -> np.ndarray:
        cache = self.__dict__.setdefault("cache", {})
        return cache.setdefault(id(buffer), super().to_host(buffer))


class CastsToF32(Wrapped):
    """Quietly converts every float argument to float32, so a wrong dtype is never refused."""

    def to_device(self, array: np.ndarray, borrow: bool = False, device: int = 0) -> Any:
        a = np.asarray(array)
        return super().to_device(a.astype(np.float32) if a.dtype.kind == "f" else a, borrow, device)


class NeverDonates(Wrapped):
    """Keeps every input: a donated one survives, so a driver that reuses it is never told."""

    def execute(self, exe: Any, args: Any, keep: Any = ()) -> list[Any]:
        return super().execute(exe, args, keep=range(len(args)))


class OneDeviceQuietly(Wrapped):
    """Compiles any replica count for one device, and runs replica 0's arguments alone."""

    def compile(self, mlir_text: str, num_replicas: int = 1) -> Any:
        return super().compile(mlir_text)

    def execute_replicated(self, exe: Any, per_replica: Any, keep: Any = ()) -> list[list[Any]]:
        return [self.execute(exe, per_replica[0], keep)]


class ReadsDonatedAfterWrite(Wrapped):
    """Returns the reduce of the updated w: what a backend that honours donation too eagerly computes."""

    def execute(self, exe: Any, args: Any, keep: Any = ()) -> list[Any]:
        new_w, _ = super().execute(exe, args, keep)
        return [new_w, self.to_device(np.asarray(self.to_host(new_w).sum(), np.float32))]


@pytest.mark.parametrize("broken, check", [
    (ViewToHost, "to_host_is_a_copy"),
    (CastsToF32, "wrong_arguments_refused"),
    (CastsToF32, "round_trip"),
    (NeverDonates, "donation"),
    (OneDeviceQuietly, "replicas_refused"),
    (ReadsDonatedAfterWrite, "compile_and_execute"),
])
def test_a_broken_backend_fails_its_check(xla, broken, check):
    (result,) = run_conformance(broken(), [check])
    assert not result.passed and result.error
    assert all(r.passed for r in run_conformance(Wrapped(), [check]))  # the wrapper alone passes it


def test_the_command_runs_a_backend_by_name_and_refuses_an_unknown_one():
    ok = subprocess.run([sys.executable, "-m", "hloforge.testing.backend_conformance", "xla"], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines() == [f"PASS xla {c}" for c in CHECKS]
    bad = subprocess.run([sys.executable, "-m", "hloforge.testing.backend_conformance", "nosuch"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown backend 'nosuch'" in bad.stderr
