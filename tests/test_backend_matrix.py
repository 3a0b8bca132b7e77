"""The backend matrix (tests/conftest.py): a test follows $HLOFORGE_BACKEND only through the
`backend` fixture, which marks it `backend` (what .ci/run and tox -e py311-iree run on IREE)."""

from __future__ import annotations

import os

import pytest

from hloforge.backends.base import BACKEND_ENV_VAR
from hloforge.train.session import make_backend


def test_a_test_without_the_fixture_runs_on_the_default_backend(request: pytest.FixtureRequest) -> None:
    # under HLOFORGE_BACKEND=iree too: a test written for XLA (its devices, its numbers) stays on XLA
    assert BACKEND_ENV_VAR not in os.environ and make_backend().name == "xla"
    assert request.node.get_closest_marker("backend") is None


def test_the_fixture_is_the_environment_s_backend(backend: str, request: pytest.FixtureRequest) -> None:
    assert backend == (os.environ.get(BACKEND_ENV_VAR) or "xla")
    assert make_backend().name == backend  # the environment reaches the code under test unchanged
    assert request.node.get_closest_marker("backend") is not None


@pytest.mark.parametrize("backend", ["xla"])
def test_a_test_naming_its_backends_is_not_marked(backend: str, request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("backend") is None
