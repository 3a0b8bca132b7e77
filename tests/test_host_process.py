"""hloforge inside a user's own program: a forked child of a process that ran a model, and the state of
the process a fit leaves (what the user had set stays as it was)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

# A model runs, then the process forks: the backend's threads stay in the parent, so the child's call is refused
# in one line (it waited forever), and the child still exits (freeing the parent's client or device waited forever).
FORKED_CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import hloforge as hf

    x = np.zeros((4, 3), np.float32)
    model = hf.Model(hf.NetSpec("tiny", (3,), [hf.layers.Dense(2)], 2), seed=0, backend=sys.argv[1])
    before = model.predict(x)
    pid = os.fork()
    if pid == 0:
        try:
            model.predict(x)
        except hf.HloforgeError as e:
            print("child:", type(e).__name__, e, flush=True)
        sys.exit(0)  # a normal exit: atexit's handlers run
    deadline = time.monotonic() + 30
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            sys.exit("child hung")
        time.sleep(0.05)
    print("parent:", np.array_equal(model.predict(x), before))
""")


@pytest.mark.parametrize("backend", ["xla", pytest.param("iree", marks=pytest.mark.skipif(
    importlib.util.find_spec("iree") is None, reason="iree packages not installed"))])
def test_a_forked_child_is_refused_in_one_line_and_exits(backend):
    done = subprocess.run([sys.executable, "-c", FORKED_CHILD, backend], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child, parent = done.stdout.splitlines()
    assert child.startswith("child: ForkedError this process is a fork of process "), child
    assert "multiprocessing's 'spawn'" in child
    assert parent == "parent: True"
    assert done.stderr == "", done.stderr
