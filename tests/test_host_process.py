"""hloforge inside a user's own program: a forked child of a process that ran a model, and the state of
the process a fit leaves (what the user had set stays as it was)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
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


# What a user's program had before hloforge was imported, and has after a fit, predict, evaluate, save and load.
STATE = textwrap.dedent("""
    import faulthandler, json, logging, os, signal, sys, tempfile, threading, time, warnings
    import numpy as np

    def state():
        umask = os.umask(0o22)
        os.umask(umask)
        return {"signals": {s.name: str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                                                         signal.SIGUSR1, signal.SIGCHLD)},
                "numpy_rng": str(np.random.get_state()[1:3]), "warnings": str(warnings.filters),
                "logging": str((logging.root.handlers, logging.root.level)), "cwd": os.getcwd(), "umask": umask,
                "recursion": sys.getrecursionlimit(), "faulthandler": faulthandler.is_enabled(),
                "threads": sorted(t.name for t in threading.enumerate()), "environ": dict(os.environ)}

    np.random.seed(7)
    before = state()
    import hloforge as hf

    x = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)
    y = np.arange(64) % 2
    model = hf.Model(hf.NetSpec("tiny", (3,), [hf.layers.Dense(2)], 2), seed=0)
    model.fit(x, y, epochs=2, batch_size=16, verbose=True)
    model.predict(x), model.evaluate(x, y)
    with tempfile.TemporaryDirectory() as d:
        model.save(d + "/m")
        hf.load(d + "/m").predict(x)
    from hloforge.backends.host_memory import RELEASE_AFTER_S
    time.sleep(RELEASE_AFTER_S + 1)  # the heap goes back RELEASE_AFTER_S after the last call, by a thread that ends
    after = state()
    print(json.dumps({k: [before[k], after[k]] for k in before}))
""")


@pytest.fixture(scope="module")
def host_state() -> dict[str, list[object]]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # unset, as a user's mostly is
    done = subprocess.run([sys.executable, "-c", STATE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_process_state_a_user_set_is_left_as_it_was(host_state):
    changed = {k: v for k, v in host_state.items() if k not in ("threads", "environ") and v[0] != v[1]}
    assert changed == {}


def test_a_fit_leaves_no_thread_running(host_state):
    """tqdm starts a monitor thread for a bar, even one that is off (stderr not a terminal), and never stops it."""
    before, after = host_state["threads"]
    assert after == before


def test_a_fit_leaves_the_environment_as_it_was(host_state):
    """XLA's INFO lines are kept off by TF_CPP_MIN_LOG_LEVEL, which was left set in the user's environment (their
    TensorFlow's level, their child processes' environment)."""
    before, after = host_state["environ"]
    assert {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys()
            if before.get(k) != after.get(k)} == {}


def test_plot_leaves_the_matplotlib_backend_the_user_chose(tmp_path):
    """Model.plot switched the process to Agg: a notebook's inline plots, or a script's windows, then stopped
    showing (an svg backend stands in for theirs here)."""
    import matplotlib

    import hloforge as hf

    model = hf.Model(hf.NetSpec("tiny", (3,), [hf.layers.Dense(2)], 2), seed=0)
    model.fit(np.zeros((32, 3), np.float32), np.arange(32) % 2, batch_size=16, verbose=False)
    chosen = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        model.plot(str(tmp_path / "curves.png"))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(chosen)
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# The fork taken while another thread scores (a server's): that thread held the forward's lock (and IREE's execute
# lock), which the child found held for good, so its call waited forever before the runtime's one-line refusal.
FORKED_WHILE_SCORING = textwrap.dedent("""
    import contextlib, os, sys, threading, time
    import numpy as np
    import hloforge as hf

    x = np.zeros((4, 3), np.float32)
    model = hf.Model(hf.NetSpec("tiny", (3,), [hf.layers.Dense(2)], 2), seed=0, backend=sys.argv[1])
    model.predict(x)
    held, done = threading.Event(), threading.Event()

    def scoring():  # as a predict is in the middle of its chunks
        with contextlib.ExitStack() as stack:
            stack.enter_context(model._forwards[32]._lock)
            if hasattr(model.backend, "_executing"):
                stack.enter_context(model.backend._executing)
            held.set()
            done.wait(60)

    t = threading.Thread(target=scoring)
    t.start()
    held.wait(60)
    pid = os.fork()
    if pid == 0:
        try:
            model.predict(x)
        except hf.HloforgeError as e:
            print("child:", type(e).__name__, e, flush=True)
        os._exit(0)
    deadline = time.monotonic() + 30
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            print("child hung", flush=True)
            break
        time.sleep(0.05)
    done.set()
    t.join()
""")


@pytest.mark.parametrize("backend", ["xla", pytest.param("iree", marks=pytest.mark.skipif(
    importlib.util.find_spec("iree") is None, reason="iree packages not installed"))])
def test_a_child_forked_while_another_thread_scores_is_refused_in_one_line(backend):
    done = subprocess.run([sys.executable, "-c", FORKED_WHILE_SCORING, backend], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("child: ForkedError this process is a fork of process "), done.stdout


# The fork taken while another thread fits: the child, which has no such thread, refused the same model's fit as
# "called while another thread's fit of this model runs; ... wait for it to return", a wait that never ends there.
FORKED_WHILE_FITTING = textwrap.dedent("""
    import os, threading
    import numpy as np
    import hloforge as hf

    x, y = np.zeros((32, 3), np.float32), np.arange(32) % 2
    model = hf.Model(hf.NetSpec("tiny", (3,), [hf.layers.Dense(2)], 2), seed=0)
    held, done = threading.Event(), threading.Event()

    class Hold(hf.Callback):
        def on_epoch_end(self, epoch, logs):
            held.set()
            done.wait(60)

    t = threading.Thread(target=lambda: model.fit(x, y, batch_size=16, callbacks=[Hold()], verbose=False))
    t.start()
    held.wait(60)
    pid = os.fork()
    if pid == 0:
        try:
            model.fit(x, y, batch_size=16, verbose=False)
        except hf.HloforgeError as e:
            print("child:", type(e).__name__, e, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    done.set()
    t.join()
""")


def test_a_child_forked_while_another_thread_fits_is_told_it_is_a_fork():
    done = subprocess.run([sys.executable, "-c", FORKED_WHILE_FITTING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("child: ForkedError this process is a fork of process "), done.stdout


# The fork taken while another thread holds a model's host state (an epoch's end being kept, a copy being taken):
# the child's first read of that state waited forever on the lock its parent's thread held at the fork.
FORKED_WHILE_KEEPING = textwrap.dedent("""
    import os, threading
    import numpy as np
    import hloforge as hf
    import hloforge.api

    model = hf.Model(hf.NetSpec("tiny", (3,), [hf.layers.Dense(2)], 2), seed=0)
    model.predict(np.zeros((4, 3), np.float32))
    held, done = threading.Event(), threading.Event()

    def hold():
        with hloforge.api._HOST_STATE:
            held.set()
            done.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(60)
    pid = os.fork()
    if pid == 0:
        try:
            model.predict(np.zeros((4, 3), np.float32))
        except hf.HloforgeError as e:
            print("child:", type(e).__name__, e, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    done.set()
    t.join()
""")


def test_a_child_forked_while_another_thread_holds_the_host_state_is_refused_in_one_line():
    try:
        done = subprocess.run([sys.executable, "-c", FORKED_WHILE_KEEPING], capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung on the host state's lock")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("child: ForkedError this process is a fork of process "), done.stdout
