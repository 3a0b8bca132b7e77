"""Python API mistakes refused in one line before any work: an endless iterable of batches, a shuffle that is
no bool, an unknown loss at construction; and an interrupted atomic write leaves no temp file behind."""

from __future__ import annotations

import itertools
import os
import re

import numpy as np
import pytest

import hloforge as hf
import hloforge.api as api
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.train import checkpoint as ckpt


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))


def test_an_endless_iterable_of_batches_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(api, "FIT_BATCHES_MAX_BYTES", 1 << 20)
    x, y = np.zeros((20, 784), np.float32), np.zeros(20, np.int32)
    m = hf.Model("mnist-linear")
    with pytest.raises(DataError, match=r"fit read \d+ batches \(0\.0 GiB\) from its iterable without reaching its "
                                        r"end; .*itertools\.islice"):
        m.fit(itertools.cycle([(x, y)]), epochs=1, verbose=False)
    assert m._step == 0


@pytest.mark.parametrize("flag", ["shuffle", "drop_last", "verbose"])
def test_fits_flags_must_be_bools(flag: str) -> None:
    flags = {"shuffle": True, "drop_last": True, "verbose": False, flag: "no"}  # "no" is truthy
    with pytest.raises(UnsupportedSpec, match=re.escape(f"{flag} must be True or False (or 1 or 0), got 'no'")):
        hf.Model("mnist-linear").fit(np.zeros((32, 784), np.float32), np.zeros(32, np.int32), **flags)
    with pytest.raises(UnsupportedSpec, match=f"{flag} must be .* got 2"):
        hf.Model("mnist-linear").fit(np.zeros((32, 784), np.float32), np.zeros(32, np.int32), **{**flags, flag: 2})


def test_an_unknown_loss_is_refused_when_the_model_is_made() -> None:
    with pytest.raises(HloforgeError, match="crossentropy"):
        hf.Model("mnist-mlp", loss="crossentropy")


def test_an_interrupted_write_leaves_no_temp_file(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "checkpoint.safetensors")
    ckpt.write_atomic(path, b"old", "checkpoint")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ckpt.write_atomic(path, b"new", "checkpoint")
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"] and open(path, "rb").read() == b"old"


def test_a_verbose_fit_in_a_process_without_sys_stderr_trains(monkeypatch) -> None:
    """sys.stderr is None in a script started without file descriptor 2 (`python fit.py 2>&-`, a daemon's).
    Before, fit's progress bar failed writing to it (AttributeError: 'NoneType' object has no attribute
    'write'); now there is no bar, and the epoch is trained."""
    x, y = np.zeros((64, 784), np.float32), np.zeros(64, np.int32)
    m = hf.Model("mnist-linear")
    monkeypatch.setattr("sys.stderr", None)
    m.fit(x, y, epochs=1, batch_size=32, verbose=True)
    assert [h["epoch"] for h in m.history] == [1]


def test_a_save_that_meets_a_full_disk_advises_saving_again(tmp_path, monkeypatch) -> None:
    """Model.save on a full disk advised 'free space and --resume', a training run's advice; a save's is to save
    again. The checkpoint there before is whole."""
    import errno

    m = hf.Model("mnist-linear")
    m.save(str(tmp_path / "run"))
    before = (tmp_path / "run" / "checkpoint.safetensors").read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(HloforgeError) as e:
        m.save(str(tmp_path / "run"), overwrite=True)
    assert str(e.value).endswith("No space left on device (the previous checkpoint is whole, the temp file removed); "
                                 "free space and save again"), e.value
    assert (tmp_path / "run" / "checkpoint.safetensors").read_bytes() == before


def test_a_save_over_another_that_fails_leaves_the_one_before_whole(tmp_path, monkeypatch) -> None:
    """A save (overwrite=True) of another model that met a full disk at its checkpoint had already written its
    config.toml: the directory held the old checkpoint with the new config, and hf.load / eval refused it ('its
    config.toml and checkpoint disagree'). The config is staged and renamed over only after the checkpoint."""
    import errno

    path = str(tmp_path / "run")
    hf.Model("mnist-linear", optimizer="adam").save(path)
    before = {p: open(os.path.join(path, p), "rb").read() for p in os.listdir(path) if p != ".lock"}

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(HloforgeError, match="No space left on device"):
        hf.Model("mnist-linear", optimizer="sgd").save(path, overwrite=True)
    monkeypatch.undo()
    assert {p: open(os.path.join(path, p), "rb").read() for p in os.listdir(path) if p != ".lock"} == before
    assert hf.load(path).variant.optimizer == "adam"


def test_a_csv_that_cannot_be_written_any_more_is_one_line(tmp_path) -> None:
    log = hf.CSVLogger(str(tmp_path / "logs" / "log.csv"))
    (tmp_path / "logs").write_text("a file where its folder was")  # made after the check, as a full disk is
    with pytest.raises(HloforgeError, match=r"CSVLogger cannot write .*log\.csv: ") as e:
        log.on_epoch_end(1, {"epoch": 1, "loss": 0.5})
    assert "\n" not in str(e.value)


def test_a_fit_without_validation_data_lists_no_val_metric() -> None:
    x, y = np.zeros((32, 784), np.float32), np.zeros(32, np.int32)
    with pytest.raises(HloforgeError, match=r"monitors 'acc', but the epoch's metrics are \['epoch', 'images_per_s', "
                                            r"'loss', 'lr', 'seconds', 'step'\]$"):
        hf.Model("mnist-linear").fit(x, y, verbose=False, callbacks=[hf.EarlyStopping("acc")])


def _rows(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n)


def test_a_callback_reads_the_running_fits_weights_and_its_assignments_are_trained_on() -> None:
    """In a callback, `self.model.params` is the step's θ (not the last epoch's), and an assignment there is
    what the fit trains on from then: they read the initial weights and were silently not trained on."""
    x, y = _rows()

    class Probe(hf.Callback):
        def __init__(self) -> None:
            self.seen: list[np.ndarray] = []

        def on_step_end(self, step, logs) -> None:
            self.seen.append(self.model.params["0.b"])

        def on_epoch_end(self, epoch, logs) -> None:
            if epoch == 1:  # back to the start: plain SGD at a constant lr, in order, retraces epoch 1 exactly
                self.model.params = start

    m = hf.Model("mnist-linear", optimizer="sgd", lr=0.1, schedule="constant")
    start, probe = m.params, Probe()
    history = m.fit(x, y, epochs=2, batch_size=16, shuffle=False, callbacks=[probe], verbose=False)
    assert not np.array_equal(probe.seen[0], start["0.b"])  # step 1's θ
    assert np.array_equal(probe.seen[3], probe.seen[7]) and np.array_equal(probe.seen[-1], m.params["0.b"])
    assert history["loss"][0] == history["loss"][1]


def test_fit_from_a_callback_of_a_running_fit_is_one_line() -> None:
    x, y = _rows()

    class Refit(hf.Callback):
        def on_epoch_end(self, epoch, logs) -> None:
            self.model.fit(x, y, batch_size=16, verbose=False)

    m = hf.Model("mnist-linear")
    with pytest.raises(UnsupportedSpec, match="fit called from a callback of this model's running fit"):
        m.fit(x, y, epochs=2, batch_size=16, callbacks=[Refit()], verbose=False)
    assert m._epoch == 1 and len(m.history) == 1  # the first epoch kept, nothing trained twice


def test_a_model_pickles_and_deep_copies_in_and_out_of_a_fit() -> None:
    """pickle.dumps / copy.deepcopy (keeping the best model from a callback) met a raw cffi TypeError."""
    import copy
    import pickle

    x, y = _rows()

    class KeepFirst(hf.Callback):
        def on_epoch_end(self, epoch, logs) -> None:
            if epoch == 1:
                self.kept = copy.deepcopy(self.model)

    m, keep = hf.Model("mnist-linear", ema=0.9), KeepFirst()
    m.fit(x, y, epochs=2, batch_size=16, callbacks=[keep], verbose=False)
    assert keep.kept._epoch == 1 and keep.kept._step == 4
    again = pickle.loads(pickle.dumps(m))
    assert again.backend.name == m.backend.name and np.array_equal(again.predict(x), m.predict(x))
    assert again.fit(x, y, batch_size=16, verbose=False)["loss"] == m.fit(x, y, batch_size=16, verbose=False)["loss"]


def test_a_batch_size_beyond_the_rows_scored_compiles_no_larger_forward() -> None:
    """predict(5 rows, batch_size=10**7) compiled and padded a forward of 10**7 rows (31 GB for mnist-linear)."""
    x, y = _rows(5)
    m = hf.Model("mnist-linear")
    want = m.predict(x)
    np.testing.assert_allclose(m.predict(x, batch_size=4096), want, rtol=1e-5, atol=1e-6)
    assert max(m._forwards) == 32
    assert m.evaluate(x, y, batch_size=4096)["n"] == 5 and max(m._forwards) == 32
    for n in (6, 7, 8):  # varying row counts share the forward of the power of two that holds them
        np.testing.assert_allclose(m.predict(x[:1].repeat(n, 0), batch_size=4096), want[:1].repeat(n, 0), rtol=1e-5,
                                   atol=1e-6)
    assert sorted(m._forwards) == [8, 32]


def test_threads_sharing_a_model_each_get_their_own_rows_scores() -> None:
    """predict from several threads at once (a threaded server's) wrote each other's rows into the forward's
    one input slot and returned another thread's logits (off by up to 8), silently."""
    import threading

    rng = np.random.default_rng(0)
    m = hf.Model("mnist-mlp")
    xs = [rng.standard_normal((256, 784)).astype(np.float32) for _ in range(4)]
    want = [m.predict(x) for x in xs]
    wrong: list[int] = []

    def score(i: int) -> None:
        wrong.extend(i for _ in range(8) if not np.array_equal(m.predict(xs[i]), want[i]))

    threads = [threading.Thread(target=score, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_a_second_threads_fit_of_a_model_while_one_runs_is_one_line(monkeypatch) -> None:
    """fit marked its run only once its session was compiled: a second thread's fit meanwhile passed the check
    and trained the same model's state beside it."""
    import threading

    x, y = _rows()
    m = hf.Model("mnist-linear")
    inside, go_on = threading.Event(), threading.Event()
    session = api.Model._session

    def held(self, *args, **kwargs):  # the first fit waits inside its setup until the second has tried
        if threading.current_thread() is not threading.main_thread():
            inside.set()
            go_on.wait(60)
        return session(self, *args, **kwargs)

    monkeypatch.setattr(api.Model, "_session", held)
    first: list = []
    t = threading.Thread(target=lambda: first.append(m.fit(x, y, epochs=1, batch_size=16, verbose=False)))
    t.start()
    assert inside.wait(60)
    try:
        with pytest.raises(UnsupportedSpec, match=r"^fit called while another thread's fit of this model runs; "):
            m.fit(x, y, epochs=1, batch_size=16, verbose=False)
    finally:
        go_on.set()
        t.join(120)
    assert len(first) == 1 and m._epoch == 1 and len(m.history) == 1  # the first fit alone trained
    m.fit(x, y, epochs=1, batch_size=16, verbose=False)  # and once it is done, the next fit runs
    assert m._epoch == 2


def test_another_thread_reads_a_fitting_model_as_its_last_epoch_left_it_and_may_not_assign() -> None:
    """predict and params from another thread during a fit read the fit's session, whose θ each step donates:
    a BackendError about a donated buffer, or θ of a step the loop had not finished."""
    import threading

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((1024, 784)).astype(np.float32), rng.integers(0, 10, 1024)
    m = hf.Model("mnist-mlp")
    kept = [m.params["0.w"]]  # what another thread may see: the weights before the fit, then each epoch's
    paused, resume = threading.Event(), threading.Event()

    class Snap(hf.Callback):
        def on_epoch_end(self, epoch, logs) -> None:
            kept.append(self.model.params["0.w"])
            if epoch == 1:  # the fit waits here while the other thread tries an assignment
                paused.set()
                resume.wait(60)

    t = threading.Thread(target=lambda: m.fit(x, y, epochs=3, batch_size=32, callbacks=[Snap()], verbose=False))
    t.start()
    seen = []
    try:
        while t.is_alive():
            m.predict(x[:64])
            seen.append(m.params["0.w"])
            if paused.is_set() and not resume.is_set():
                with pytest.raises(UnsupportedSpec, match="assigned from another thread while this model fits"):
                    m.params = m.params
                resume.set()
    finally:
        resume.set()
        t.join(300)
    assert len(seen) > 3 and m._epoch == 3
    assert all(any(np.array_equal(w, k) for k in kept) for w in seen)


def test_hf_load_of_a_missing_path_or_a_folder_of_runs_says_which(tmp_path) -> None:
    """Before: `hf.load("nope")` said `checkpoint nope/checkpoint.safetensors does not exist`, and a folder of runs
    the same, not what it holds."""
    with pytest.raises(hf.HloforgeError, match=r"^hf\.load: .*nope does not exist; expected a run directory"):
        hf.load(str(tmp_path / "nope"))
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "checkpoint.safetensors").write_bytes(b"")
    with pytest.raises(hf.HloforgeError, match=r"runs holds no checkpoint\.safetensors; expected a run directory "
                                              r"\(that hloforge train, import-weights or Model\.save wrote\); it "
                                              r"holds run directories: .*runs/a$"):
        hf.load(str(tmp_path / "runs"))


def test_a_shallow_copys_fit_leaves_the_originals_history_be() -> None:
    """copy.copy(model) shared the original's History: the copy's fit appended its epochs to the original's
    `history` (and the original's to the copy's), though its weights trained apart."""
    import copy

    x, y = _rows()
    m = hf.Model("mnist-linear")
    m.fit(x, y, epochs=1, batch_size=16, verbose=False)
    c = copy.copy(m)
    c.fit(x, y, epochs=2, batch_size=16, verbose=False)
    assert len(m.history) == 1 and len(c.history) == 3 and m._epoch == 1 and c._epoch == 3
    m.fit(x, y, epochs=1, batch_size=16, verbose=False)
    assert len(m.history) == 2 and len(c.history) == 3


def test_a_callback_in_a_running_fit_given_to_another_threads_fit_is_one_line() -> None:
    """One EarlyStopping given to two models' fits on two threads at once: the second fit set its `model` to its own,
    so the first fit, which it should have stopped after 2 epochs, ran all 8 (and the stop went to the other)."""
    import threading

    x, y = _rows()
    inside, go_on = threading.Event(), threading.Event()

    class Held(hf.Callback):
        def on_epoch_end(self, epoch, logs) -> None:
            inside.set()
            go_on.wait(60)

    stop, held, a = hf.EarlyStopping(monitor="loss", patience=1, min_delta=10), Held(), hf.Model("mnist-linear")
    t = threading.Thread(target=lambda: a.fit(x, y, epochs=8, batch_size=16, callbacks=[held, stop], verbose=False))
    t.start()
    assert inside.wait(60)
    try:
        with pytest.raises(UnsupportedSpec, match=r"^callback EarlyStopping is in another fit running on another "
                                                  r"thread; .* give each fit one of its own$"):
            hf.Model("mnist-linear").fit(x, y, epochs=8, batch_size=16, callbacks=(c for c in [stop]), verbose=False)
    finally:
        go_on.set()
        t.join(120)
    assert stop.model is a and a._epoch == 2  # stopped by its own EarlyStopping, after 2 epochs
    b = hf.Model("mnist-linear")
    b.fit(x, y, epochs=8, batch_size=16, callbacks=[stop], verbose=False)  # once that fit is done, another takes it
    assert stop.model is b and b._epoch == 2


def test_a_server_predicting_at_many_batch_sizes_keeps_a_few_forwards() -> None:
    """predict(x, batch_size=len(x)) of varying x compiled and kept a forward per row count (a server's 200 sizes:
    RSS 255 -> 374 MB); a model keeps the FORWARDS_KEPT last used, and every answer is still the same."""
    from hloforge.api import FORWARDS_KEPT

    rng = np.random.default_rng(0)
    model = hf.Model(hf.NetSpec("tiny", (5,), [hf.layers.Dense(3)], 3), seed=0)
    x = rng.standard_normal((40, 5)).astype(np.float32)
    whole = model.predict(x, batch_size=40)
    for n in range(1, 2 * FORWARDS_KEPT + 3):
        np.testing.assert_allclose(model.predict(x[:n], batch_size=n), whole[:n], rtol=1e-6, atol=1e-6)
        assert len(model._forwards) <= FORWARDS_KEPT
    assert list(model._forwards)[-1] == n  # the last used is kept
