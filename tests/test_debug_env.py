"""$HLOFORGE_DEBUG takes 1/true/yes/on or 0/false/no/off (any case; empty or unset is off); any other
value is one error line and exit 3 before the command does anything (hloforge.commands.exits)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hloforge.cli import main
from hloforge.commands import options
from hloforge.commands.exits import debug_enabled
from hloforge.core.errors import HloforgeError

EXPECTED = "expected 1/true/yes/on (print tracebacks) or 0/false/no/off (the default, as is empty or unset)"


@pytest.mark.parametrize(("value", "on"), [
    ("", False), ("0", False), ("false", False), ("No", False), ("OFF", False), (" 0 ", False),
    ("1", True), ("true", True), ("YES", True), ("on", True), (" 1\n", True)])
def test_accepted_spellings(value, on):
    assert debug_enabled({"HLOFORGE_DEBUG": value}) is on


def test_unset_is_off():
    assert debug_enabled({}) is False


@pytest.mark.parametrize("value", ["maybe", "2", "-1", "yess", "1 1", "a\nb", "\udcff", "tru"])
def test_an_unknown_value_is_one_line_naming_the_accepted_ones(value):
    with pytest.raises(HloforgeError) as e:
        debug_enabled({"HLOFORGE_DEBUG": value})
    assert str(e.value) == f"HLOFORGE_DEBUG={value!r}: {EXPECTED}"
    assert len(str(e.value).splitlines()) == 1


def _boom(args):
    raise RuntimeError("an invariant broke")


@pytest.fixture
def ran(monkeypatch):
    """The `plugins` command replaced by one that records it ran."""
    calls: list[object] = []
    monkeypatch.setattr(options, "_plugins", lambda args: calls.append(args))
    return calls


@pytest.mark.parametrize("value", ["maybe", "a\nb", "\udcff"])
def test_the_command_refuses_before_any_work(value, monkeypatch, capsys, ran):
    monkeypatch.setenv("HLOFORGE_DEBUG", value)
    assert main(["plugins"]) == 3
    assert capsys.readouterr().err == f"hloforge: error: HLOFORGE_DEBUG={value!r}: {EXPECTED}\n"
    assert ran == []


def test_false_is_off(tmp_path, monkeypatch, capsys):
    """`false` was once on (anything but empty and 0 was): an internal error then names its file."""
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HLOFORGE_DEBUG", "false")
    monkeypatch.setattr(options, "_plugins", _boom)
    assert main(["plugins"]) == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "the full traceback is in" in err, err


def test_yes_is_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HLOFORGE_DEBUG", "yes")
    monkeypatch.setattr(options, "_plugins", _boom)
    assert main(["plugins"]) == 4
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_the_installed_command_refuses_in_one_line(tmp_path):
    env = {**os.environ, "HLOFORGE_DEBUG": "maybe", "HLOFORGE_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "hloforge.cli", "render", "mnist-linear", "--out",
                        str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 3
    assert p.stderr == f"hloforge: error: HLOFORGE_DEBUG='maybe': {EXPECTED}\n"
    assert not Path(tmp_path / "out").exists()  # refused before it rendered anything
