"""Suite-wide fixtures, hooks and settings."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

from hloforge.backends.base import BACKEND_ENV_VAR, DEFAULT_BACKEND

# ------------------------------------------------------------------ the backend under test
# A test that takes the `backend` fixture runs on $HLOFORGE_BACKEND (default xla) and is marked
# `backend`: the default run tests it on XLA, `HLOFORGE_BACKEND=iree pytest -m backend` (.ci/run,
# tox -e py311-iree) on IREE. Every other test runs with $HLOFORGE_BACKEND unset, so one that does
# not ask for a backend gets the default one whatever the environment says (a test written for
# XLA's devices never meets IREE by accident). A test parametrised over backends itself
# (`@pytest.mark.parametrize("backend", [...])`) names its own and is not marked.
BACKEND_MARK = "backend"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{BACKEND_MARK}: runs on $HLOFORGE_BACKEND (default xla) through the "
                                       "`backend` fixture; `HLOFORGE_BACKEND=iree pytest -m backend` runs them on IREE")


@pytest.fixture
def backend() -> str:
    """The backend under test: $HLOFORGE_BACKEND, default xla."""
    name = os.environ.get(BACKEND_ENV_VAR) or DEFAULT_BACKEND
    if name == "iree" and importlib.util.find_spec("iree") is None:
        pytest.skip("iree packages not installed")
    return name


def _follows_env_backend(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return BACKEND_MARK in getattr(item, "fixturenames", ()) and BACKEND_MARK not in getattr(callspec, "params", {})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _follows_env_backend(item):
            item.add_marker(BACKEND_MARK)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    if item.get_closest_marker(BACKEND_MARK) or BACKEND_ENV_VAR not in os.environ:
        return (yield)
    saved = os.environ.pop(BACKEND_ENV_VAR)  # setup, call and teardown: module fixtures made here too
    try:
        return (yield)
    finally:
        os.environ[BACKEND_ENV_VAR] = saved


# ------------------------------------------------------------------ hypothesis profiles
# The default is seeded and modest so CI is deterministic and fast; `pytest --hypothesis-profile=long`
# walks the same properties much further.
settings.register_profile("default", max_examples=30, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")
