"""What `pip install .` and a packager get: the sdist is the source whole enough to build the wheel and run
the tests (conftest, helpers and data, and the docs, example plugin and scripts they read), with no build or
cache leftovers of the working tree in it."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ("hloforge", "tests", "docs", "examples", "scripts", "_build")  # what the wheel, its build and the tests need
TOP = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "tox.ini")
LEFTOVERS = ("examples/hloforge-groupnorm/build/lib/hloforge_groupnorm/layers.py",
             "examples/hloforge-groupnorm/hloforge_groupnorm.egg-info/PKG-INFO", "tests/__pycache__/conftest.pyc",
             "build/lib/hloforge/gone.py")  # a module an earlier `pip install .` staged, since deleted from the tree


def build(hook: str, project: Path, out: Path) -> Path:
    """What `pip` does: `project`'s pyproject.toml's build backend (its backend-path first) runs `hook` into `out`."""
    system = tomllib.loads((project / "pyproject.toml").read_text())["build-system"]
    code = (f"import importlib, sys; sys.path[:0] = {system.get('backend-path', [])!r}; "
            f"print(importlib.import_module({system['build-backend']!r}).{hook}({str(out)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / proc.stdout.split()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """The sdist of a copy of the source with a working tree's leftovers added, and the files it must ship."""
    src = tmp_path_factory.mktemp("sdist") / "src"
    for d in SOURCE:
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    for f in TOP:
        if (ROOT / f).exists():
            shutil.copy(ROOT / f, src / f)
    wanted = {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()}
    for junk in LEFTOVERS:  # what a working tree holds after a build, an editable install or a test run
        (src / junk).parent.mkdir(parents=True, exist_ok=True)
        (src / junk).write_text("")
    return build("build_sdist", src, src.parent / "dist"), wanted


def test_the_sdist_holds_the_tests_whole_and_no_leftovers(sdist: tuple[Path, set[str]]) -> None:
    """Before: setuptools shipped tests/test_*.py alone (no conftest.py, plugin_site.py, tests/data), whose
    import of the helpers fails, and none of the docs or the example plugin the tests read."""
    path, wanted = sdist
    with tarfile.open(path) as archive:
        shipped = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert sorted(wanted - shipped) == []
    assert sorted(set(LEFTOVERS) & shipped) == []


def test_the_license_text_ships_in_the_sdist_and_in_the_wheel_built_from_it(sdist: tuple[Path, set[str]]) -> None:
    """Before: pyproject.toml declared Apache-2.0 but the tree held no LICENSE, so neither the sdist nor the
    wheel carried the license text the Apache License asks every redistribution to include."""
    path, _ = sdist
    with tarfile.open(path) as archive:
        archive.extractall(path.parent, filter="data")
        [top] = {n.split("/", 1)[0] for n in archive.getnames()}
    unpacked = path.parent / top
    assert (unpacked / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    with zipfile.ZipFile(build("build_wheel", unpacked, path.parent)) as wheel:
        dist_info = next(n.split("/")[0] for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        assert wheel.read(f"{dist_info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert "License-File: LICENSE" in wheel.read(f"{dist_info}/METADATA").decode().splitlines()


def test_a_module_deleted_since_an_earlier_build_stays_out_of_the_wheel(sdist: tuple[Path, set[str]],
                                                                       tmp_path: Path) -> None:
    """Before: setuptools staged the wheel in build/lib, which it never empties, so `pip install .` after a module
    was deleted or moved in the tree installed the old module beside the new code (pypa/setuptools#1871)."""
    src = sdist[0].parents[1] / "src"  # the tree the sdist was built from, build/lib/hloforge/gone.py in it
    with zipfile.ZipFile(build("build_wheel", src, tmp_path)) as wheel:
        names = set(wheel.namelist())
    assert "hloforge/__init__.py" in names and "hloforge/gone.py" not in names


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


def test_the_test_extra_brings_the_setuptools_these_tests_build_with() -> None:
    """Before: `pip install 'hloforge[test]'` left a fresh venv's own setuptools (65 on Python 3.11), and the
    sdist and wheel tests here, which run the build backend in the test environment, failed with setuptools'
    "project.license must be valid exactly by one definition" for a packager running the tests the sdist ships."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [built_with] = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    assert built_with in meta["project"]["optional-dependencies"]["test"]


def test_the_tox_envs_test_hloforge_as_installed_not_the_working_tree() -> None:
    """Before: tox.ini's suite and plugin envs installed hloforge editable, so they imported the working tree and
    a file the sdist or the wheel left out (package data, a module) passed in every env and failed for users."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    for env in (e.strip() for e in tox["tox"]["env_list"].split(",")):
        section = f"testenv:{env}" if tox.has_section(f"testenv:{env}") else "testenv"
        package = tox[section].get("package", tox["testenv"].get("package", "sdist"))  # tox's default: sdist
        assert not package.startswith("editable"), (env, package)


def test_the_example_plugins_wheel_and_sdist_carry_its_license_text(tmp_path: Path) -> None:
    """Before: examples/hloforge-groupnorm declared Apache-2.0 with no LICENSE file: a wheel or sdist built from it
    (the template a plugin author copies) carried no license text."""
    project = tmp_path / "hloforge-groupnorm"
    shutil.copytree(ROOT / "examples" / "hloforge-groupnorm", project,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    with zipfile.ZipFile(build("build_wheel", project, tmp_path)) as wheel:
        dist_info = next(n.split("/")[0] for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        assert wheel.read(f"{dist_info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert "License-File: LICENSE" in wheel.read(f"{dist_info}/METADATA").decode().splitlines()
    with tarfile.open(build("build_sdist", project, tmp_path)) as archive:
        assert any(n.split("/", 1)[-1] == "LICENSE" for n in archive.getnames())
