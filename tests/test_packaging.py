"""What `pip install .` and a packager get: the sdist is the source whole enough to build the wheel and run
the tests (conftest, helpers and data, and the docs, example plugin and scripts they read), with no build or
cache leftovers of the working tree in it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ("hloforge", "tests", "docs", "examples", "scripts")  # what the wheel and the tests need
TOP = ("pyproject.toml", "README.md", "MANIFEST.in", "tox.ini")
LEFTOVERS = ("examples/hloforge-groupnorm/build/lib/hloforge_groupnorm/layers.py",
             "examples/hloforge-groupnorm/hloforge_groupnorm.egg-info/PKG-INFO", "tests/__pycache__/conftest.pyc")


def test_the_sdist_holds_the_tests_whole_and_no_leftovers(tmp_path: Path) -> None:
    """Before: setuptools shipped tests/test_*.py alone (no conftest.py, plugin_site.py, tests/data), whose
    import of the helpers fails, and none of the docs or the example plugin the tests read."""
    src = tmp_path / "src"
    for d in SOURCE:
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    for f in TOP:
        if (ROOT / f).exists():
            shutil.copy(ROOT / f, src / f)
    wanted = {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()}
    for junk in LEFTOVERS:  # what a working tree holds after a build, an editable install or a test run
        (src / junk).parent.mkdir(parents=True, exist_ok=True)
        (src / junk).write_text("")
    out = tmp_path / "dist"
    build = f"from setuptools.build_meta import build_sdist; print(build_sdist({str(out)!r}))"
    proc = subprocess.run([sys.executable, "-c", build], cwd=src, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with tarfile.open(out / proc.stdout.split()[-1]) as sdist:
        shipped = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert sorted(wanted - shipped) == []
    assert sorted(set(LEFTOVERS) & shipped) == []


@pytest.mark.parametrize("project", [ROOT, ROOT / "examples" / "hloforge-groupnorm"], ids=["hloforge", "example"])
def test_the_build_requirement_reads_the_license_expression(project: Path) -> None:
    """`license = "Apache-2.0"` (PEP 639) is refused by setuptools before 77 ("project.license must be valid
    exactly by one definition"): a build without isolation on the setuptools 68-76 the build-system once
    allowed failed before reading anything else."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert isinstance(meta["project"]["license"], str)  # the SPDX expression form
    [setuptools] = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = tuple(int(x) for x in setuptools.partition(">=")[2].split("."))
    assert minimum >= (77,), setuptools
