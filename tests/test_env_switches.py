"""Every HLOFORGE_* on/off variable reads through one rule (hloforge.core.switches.env_switch): 1/true/yes/on
and 0/false/no/off in any case, empty or unset its default, anything else one line naming the variable,
its value and the accepted spellings. A path variable may start with `~`."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hloforge.backends.base import cache_root
from hloforge.backends.xla import cache as xla_cache
from hloforge.backends.xla import compile_worker
from hloforge.backends.xla.pjrt.discovery import find_plugin
from hloforge.commands.exits import debug_enabled
from hloforge.core.errors import BackendError, HloforgeError, PluginError, UnsupportedSpec
from hloforge.core.registry import Registry
from hloforge.train import autotune, checkpoint
from hloforge.train.session import resident_default


def _tracing() -> bool:
    """Whether a new registry prints its hook calls (HLOFORGE_TRACE_PLUGINS)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        Registry(kinds=("loss",))
    return "hloforge trace:" in err.getvalue()


# (variable, its reader, its default, the error it refuses a value with)
SWITCHES: list[tuple[str, Callable[[], bool], bool, type[HloforgeError]]] = [
    ("HLOFORGE_DEBUG", debug_enabled, False, HloforgeError),
    ("HLOFORGE_AUTOTUNE", autotune.enabled, False, UnsupportedSpec),
    ("HLOFORGE_RESIDENT", resident_default, True, BackendError),
    ("HLOFORGE_XLA_CACHE", xla_cache.cache_enabled, True, BackendError),
    ("HLOFORGE_XLA_COMPILE_WORKER", compile_worker.worker_enabled, True, BackendError),
    ("HLOFORGE_TRACE_PLUGINS", _tracing, False, PluginError),
]
IDS = [var for var, *_ in SWITCHES]


@pytest.mark.parametrize(("var", "read", "default", "error"), SWITCHES, ids=IDS)
@pytest.mark.parametrize(("value", "on"), [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("false", False), ("No", False), ("OFF\n", False)])
def test_every_switch_takes_the_same_spellings(monkeypatch, var, read, default, error, value, on):
    monkeypatch.setenv(var, value)
    assert read() is on


@pytest.mark.parametrize(("var", "read", "default", "error"), SWITCHES, ids=IDS)
@pytest.mark.parametrize("value", [None, "", "  "])
def test_unset_or_empty_is_the_default(monkeypatch, var, read, default, error, value):
    """HLOFORGE_RESIDENT='' was refused, where every other variable takes empty as unset."""
    if value is None:
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, value)
    assert read() is default


@pytest.mark.parametrize(("var", "read", "default", "error"), SWITCHES, ids=IDS)
@pytest.mark.parametrize("value", ["maybe", "2", "tru", "a\nb"])
def test_an_unknown_value_is_one_line_naming_the_variable_and_the_spellings(monkeypatch, var, read, default,
                                                                            error, value):
    """HLOFORGE_TRACE_PLUGINS=maybe was silently off (only "1" turned it on)."""
    monkeypatch.setenv(var, value)
    with pytest.raises(error) as e:
        read()
    message = str(e.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{var}={value!r}: expected 1/true/yes/on")
    assert " or 0/false/no/off" in message and "the default, as is empty or unset" in message


def test_mpi_off_spellings_start_no_mpi():
    """HLOFORGE_MPI=false asked for MPI (anything but empty and 0 did); now it is off, as 0 is, and
    no MPI is imported (a fresh process: MPI started in this one would stay)."""
    code = ("import sys; from hloforge.train.mpi import world; "
            "ws = [world({'HLOFORGE_MPI': v}) for v in ('false', 'no', 'OFF', '')]; "
            "print([w.comm is None and w.size == 1 for w in ws], 'mpi4py' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[True, True, True, True] False"


def test_mpi_unknown_value_is_one_line():
    from hloforge.train.mpi import world

    with pytest.raises(UnsupportedSpec) as e:
        world({"HLOFORGE_MPI": "maybe"})
    assert str(e.value).startswith("HLOFORGE_MPI='maybe': expected 1/true/yes/on (use MPI")
    assert len(str(e.value).splitlines()) == 1


def test_the_command_refuses_an_unknown_trace_value_in_one_line(tmp_path):
    env = {**os.environ, "HLOFORGE_TRACE_PLUGINS": "maybe", "HLOFORGE_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "hloforge.cli", "plugins"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 3, p.stderr
    assert p.stderr.startswith("hloforge: error: HLOFORGE_TRACE_PLUGINS='maybe': expected 1/true/yes/on")
    assert len(p.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------------ whole numbers
@pytest.mark.parametrize("value", ["²", "٣", "1.5", "-1", "x"])
def test_a_whole_number_variable_refuses_other_digits_in_one_line(monkeypatch, value):
    """'²' passes str.isdigit() and int() then raised (an internal error: exit 4 and a traceback file);
    '٣' int() read as 3. Each is one line naming the variable, as any other wrong value is."""
    from hloforge.backends import disk_cache
    from hloforge.backends.iree import runtime as iree_runtime

    monkeypatch.setenv(disk_cache.MAX_MB_ENV_VAR, value)
    with pytest.raises(BackendError, match=r"^HLOFORGE_CACHE_MAX_MB=.*: expected a whole number of MiB"):
        disk_cache.max_bytes()
    monkeypatch.setenv(iree_runtime.WORKER_NICE_ENV_VAR, value)
    with pytest.raises(BackendError, match=r"^HLOFORGE_IREE_WORKER_NICE=.*: expected a niceness step from 0 to 19"):
        iree_runtime.worker_nice()


def test_a_launcher_count_in_other_digits_is_a_plain_run():
    from hloforge.core.launcher import launched

    assert launched({"PMI_SIZE": "²", "PMI_RANK": "1"}) == (0, 1, "")
    assert launched({"PMI_SIZE": " 2 ", "PMI_RANK": "²"}) == (0, 2, "PMI_SIZE")


# ------------------------------------------------------------------------------------ paths
@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)  # where a `~` taken literally would be made
    return tmp_path


def test_the_cache_dir_expands_a_tilde(home, monkeypatch):
    """HLOFORGE_CACHE_DIR='~/x' made a directory named `~` in the working directory."""
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", "~/caches")
    assert cache_root() == home / "caches"
    assert autotune.default_cache_dir() == home / "caches" / "autotune"


def test_an_empty_cache_dir_is_the_default(home, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", "")
    assert cache_root() == home / ".cache" / "hloforge"


def test_the_cache_is_under_xdg_cache_home_where_it_is_set(home, monkeypatch):
    """Was: ~/.cache/hloforge whatever $XDG_CACHE_HOME said (a cluster's scratch, where a small home's
    quota would fill with compiled executables); $HLOFORGE_CACHE_DIR still wins, a relative value is ignored."""
    monkeypatch.delenv("HLOFORGE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "scratch"))
    assert cache_root() == home / "scratch" / "hloforge"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG spec: not absolute, so not used
    assert cache_root() == home / ".cache" / "hloforge"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "scratch"))
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(home / "mine"))
    assert cache_root() == home / "mine"


def test_no_home_folder_is_one_line_asking_for_the_cache_dir(tmp_path, monkeypatch, capsys):
    """$HOME unset under a user id with no passwd entry (a container run as an arbitrary uid): was
    Path.home()'s RuntimeError, `internal error` (exit 4)."""
    import pwd

    from hloforge.cli import main

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("HLOFORGE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BackendError, match=r"^no home folder for hloforge's cache .*expected \$HLOFORGE_CACHE_DIR "
                                           r"\(or \$XDG_CACHE_HOME\) naming a writable directory$"):
        cache_root()
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", "run", "--no-progress"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "HLOFORGE_CACHE_DIR" in err and not os.path.exists("run"), err
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache"


def test_the_pjrt_plugin_path_expands_a_tilde(home, monkeypatch):
    (home / "plugin.so").write_bytes(b"")
    monkeypatch.setenv("HLOFORGE_PJRT_PLUGIN", "~/plugin.so")
    assert find_plugin() == str(home / "plugin.so")
    monkeypatch.setenv("HLOFORGE_PJRT_PLUGIN", "~/missing.so")
    with pytest.raises(BackendError, match=f"HLOFORGE_PJRT_PLUGIN={home}/missing.so: no such plugin file"):
        find_plugin()


def test_the_drill_trace_path_expands_a_tilde(home, monkeypatch):
    monkeypatch.setenv(checkpoint.TRACE_ENV, "~/trace.txt")
    checkpoint.mark("checkpoint", 3)
    assert (home / "trace.txt").read_text() == "checkpoint 3\n"
    assert not (home / "~").exists()


# Variables the package reads that no user sets: the crash drills' and gates' faults, and what a process
# hands its own children (an MPI rank's worker, the XLA_FLAGS already checked).
INTERNAL_VARIABLES = {"HLOFORGE_VAL_FAULT", "HLOFORGE_FAULT_KILL_IN_CHECKPOINT", "HLOFORGE_FAULT_STOP_AT",
                      "HLOFORGE_DRILL_SLOW_WRITE", "HLOFORGE_DRILL_TRACE", "HLOFORGE_MPI_WORKER",
                      "HLOFORGE_XLA_FLAGS_TAKEN", "HLOFORGE_PLUGIN_API"}


def test_the_readme_environment_section_names_every_variable_a_user_sets():
    """Before: HLOFORGE_STRATEGY, HLOFORGE_XLA_SCHEDULER, HLOFORGE_MPI and HLOFORGE_MPI_TIMEOUT were read
    but had no entry in the README's Environment section: a newcomer looking there did not learn of them."""
    import re

    root = Path(__file__).resolve().parents[1]
    read = {v for p in (root / "hloforge").rglob("*.py") for v in re.findall(r"\bHLOFORGE_[A-Z0-9_]*[A-Z0-9]\b",
                                                                               p.read_text())}
    section = (root / "README.md").read_text().split("## Environment", 1)[1]
    listed = set(re.findall(r"`(HLOFORGE_[A-Z0-9_]+)(?:=[^`]*)?` —", section))  # an entry: `NAME[=value]` — what
    assert sorted(read - INTERNAL_VARIABLES - listed) == []
    assert sorted(listed - read) == []  # every entry is a variable the code reads


def test_the_readme_on_off_list_is_every_switch():
    """The README's "An on/off variable (...)" list names exactly the variables read through `env_switch`, so
    the spellings it promises hold for each one it names and for no other it leaves out."""
    import re

    root = Path(__file__).resolve().parents[1]
    switches = set()
    for path in (root / "hloforge").rglob("*.py"):
        text = path.read_text()
        for const in re.findall(r"env_switch\(([A-Z_]+)", text):
            found = re.search(rf'^{const}\s*(?::[^=\n]*)?=\s*"(HLOFORGE_\w+)"', text, re.M)
            assert found, f"{path.name}: env_switch({const}) names no HLOFORGE_ constant of its module"
            switches.add(found.group(1))
    sentence = (root / "README.md").read_text().split("An on/off variable (", 1)[1].split(")", 1)[0]
    assert set(re.findall(r"`(HLOFORGE_\w+)`", sentence)) == switches
