"""Directories made for a write, with one line where a file stands in the way, and all or nothing: the
directories a failed write made on the way go with it. Here, below every part that writes (the run
directory, the preparers, import-weights and export), so each makes its directories one way."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

from hloforge.core.errors import HloforgeError


def make_dir(path: str, what: str) -> None:
    """os.makedirs(path, exist_ok=True), but a file where a directory is expected (the path itself, or a
    folder on the way to it) is one line saying so, not [Errno 17] File exists or [Errno 20]."""
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        walked = os.path.abspath(path)
        ancestors = [walked]
        while os.path.dirname(walked) != walked:
            walked = os.path.dirname(walked)
            ancestors.append(walked)
        blocker = next((a for a in reversed(ancestors) if os.path.exists(a) and not os.path.isdir(a)), path)
        at = "" if os.path.abspath(path) == blocker else f": {blocker} is a file"
        raise HloforgeError(f"{what} {path}{at if at else ' is a file'}, where a directory was expected; "
                            "pass a directory, or a path where one can be made") from None


@contextmanager
def new_dirs(path: str, what: str) -> Iterator[None]:
    """make_dir(path, what) for the block, all or nothing: where the block fails (a full disk), the directories
    it made on the way to `path` go with it, so the failed write leaves no trace and the same path takes it again."""
    first_made, walked = None, os.path.abspath(path)
    while not os.path.exists(walked) and os.path.dirname(walked) != walked:
        first_made, walked = walked, os.path.dirname(walked)
    make_dir(path, what)
    try:
        yield
    except BaseException:
        walked = os.path.abspath(path)
        while first_made is not None and walked.startswith(first_made):
            with contextlib.suppress(OSError):  # one the block left a file in, or removed itself
                os.rmdir(walked)
            walked = os.path.dirname(walked)
        raise
