"""This interpreter started again as a child process, on this process's import path: how the XLA
backend runs code of its own away from this process (the compile worker, the XLA_FLAGS probe)."""

from __future__ import annotations

import json
import os
import sys

# What a child's code starts with: the import path this process has (an editable install, PYTHONPATH).
TAKE_IMPORT_PATH = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "


def runs_python() -> bool:
    """Whether sys.executable is a Python interpreter: an application embedding Python (a server, a
    3-D tool) names its own binary there, which must not be started with a child's arguments."""
    return os.path.basename(sys.executable or "").lower().startswith("python")


def python_child_argv(code: str, *args: str) -> list[str]:
    """The command line that runs `code` (TAKE_IMPORT_PATH first) with `args` as sys.argv[2:]. -P: nothing
    put before the path the child is given."""
    return [sys.executable, "-P", "-c", TAKE_IMPORT_PATH + code, json.dumps(sys.path), *args]
