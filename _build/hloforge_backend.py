"""hloforge's build backend: setuptools' (pyproject.toml's build-system), with each wheel built from a fresh
build/lib. setuptools stages a wheel's files in build/lib, which it fills and never empties, so a module deleted
or moved in the tree since an earlier `pip install .` shipped again in the next wheel (pypa/setuptools#1871)."""

from __future__ import annotations

import shutil

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  every other PEP 517 hook, setuptools' own


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    shutil.rmtree("build/lib", ignore_errors=True)  # a hook runs in the project's root (PEP 517)
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
