"""Every rendered module byte-identical to the renders saved before a refactor
(tests/data/render_digests.json, written by scripts/render_digest.py on the base commit): the
suite nets and one net per zoo family for each target and none, and every layer gate case under
each strategy forcing the gate runs. A lowering change that is meant to change a render
regenerates the file in the same commit and says so."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("render_digest", ROOT / "scripts" / "render_digest.py")
assert _spec is not None and _spec.loader is not None
render_digest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_digest)
SAVED: dict[str, str] = json.loads(render_digest.OUT.read_text())


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HLOFORGE_STRATEGY", raising=False)


def _differ(got: dict[str, str], keys: set[str]) -> list[str]:
    return sorted(k for k in keys if got.get(k) != SAVED.get(k))


def test_nets_render_as_saved() -> None:
    got = dict(render_digest.net_digests())
    keys = {k for k in SAVED if not k.startswith("gate/")}
    assert set(got) == keys
    assert _differ(got, keys) == []


def test_gate_cases_render_as_saved() -> None:
    got = dict(render_digest.gate_digests())
    keys = {k for k in SAVED if k.startswith("gate/")}
    assert set(got) == keys, f"gate cases added {sorted(set(got) - keys)[:5]}, lost {sorted(keys - set(got))[:5]}"
    assert _differ(got, keys) == []


def test_the_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced non-default form changes a saved render: the digests see a change of form."""
    from hloforge.core import strategy

    with strategy.forced({"sums": "plain"}):
        got = dict(render_digest.net_digests(("mnist-cnn",)))
    assert "mnist-cnn/xla/train_step" in _differ(got, set(got))
