"""Sessions on the backend under test (tests/conftest.py): residency, the copying path, read-back,
and eval hold mode."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from hloforge.core.errors import BackendError, DataError, PluginError
from hloforge.core.variant import Variant
from hloforge.train.session import ForwardSession, TrainSession, make_backend
from hloforge.zoo import get_net


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path))


def batches(spec, batch, n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, *spec.input_shape)).astype(np.float32),
             rng.integers(0, spec.num_classes, batch)) for _ in range(n)]


def test_resident_and_copying_paths_are_bit_identical(backend):
    spec, be = get_net("mnist-mlp"), make_backend(backend)
    data = batches(spec, 8, 10)
    runs = []
    for resident in (True, False):
        s = TrainSession(spec, Variant("adam"), 8, be, seed=1, resident=resident)
        losses = [s.train_step(x, y, 1e-3) for x, y in data]
        runs.append((losses, s.read_params(), s.read_state()))
    (l1, p1, s1), (l2, p2, s2) = runs
    assert l1 == l2
    for a, b in zip(p1 + s1, p2 + s2, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(p1[0], spec.init_params(1)[0])


def test_hloforge_resident_env_turns_residency_off(monkeypatch, tmp_path, capsys):
    """Seed 000: residency is the default and $HLOFORGE_RESIDENT=0 turns it off (the copying path,
    the same bits); an explicit `resident=` still wins; any other value is one line, nothing written."""
    from hloforge.cli import main

    spec, be = get_net("mnist-mlp"), make_backend("xla")
    (x, y), = batches(spec, 8, 1)
    monkeypatch.delenv("HLOFORGE_RESIDENT", raising=False)
    on = TrainSession(spec, Variant("adam"), 8, be, seed=1)
    monkeypatch.setenv("HLOFORGE_RESIDENT", "0")
    off = TrainSession(spec, Variant("adam"), 8, be, seed=1)
    assert on.resident and not off.resident
    assert TrainSession(spec, Variant("adam"), 8, be, seed=1, resident=True).resident
    assert on.train_step(x, y, 1e-3) == off.train_step(x, y, 1e-3)
    for a, b in zip(on.read_params(), off.read_params(), strict=True):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setenv("HLOFORGE_RESIDENT", "maybe")
    with pytest.raises(BackendError, match="HLOFORGE_RESIDENT='maybe': expected 1/true/yes/on .* or 0/false/no/off"):
        TrainSession(spec, Variant("adam"), 8, be, seed=1)
    run = tmp_path / "run"
    assert main(["train", "mnist-mlp", "--epochs", "1", "--run-dir", str(run),
                 "--no-progress"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "HLOFORGE_RESIDENT='maybe'" in err
    assert not run.exists()


def test_step_inputs_in_slots_borrowed_or_copied_train_alike():
    """On the XLA CPU client a session writes its per-step inputs into input slots (no new buffer
    per step); a backend without slots borrows them (zero-copy where aligned), or copies when its
    to_device predates the `borrow` keyword. Every way trains to the same bits."""

    class Borrowing:  # a backend without input slots
        input_slot = None

        def __init__(self) -> None:
            self.inner, self.pushed = make_backend("xla"), 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def to_device(self, array, borrow=False):
            self.pushed += 1
            return self.inner.to_device(array, borrow=borrow)

    class Copying(Borrowing):
        def to_device(self, array):
            self.pushed += 1
            return self.inner.to_device(array)

    class Slotted(Borrowing):
        def input_slot(self, shape, dtype):
            return self.inner.input_slot(shape, dtype)

    spec = get_net("mnist-mlp")
    data = batches(spec, 8, 3)
    results = []
    for be in (Slotted(), Borrowing(), Copying()):
        s = TrainSession(spec, Variant("adam"), 8, be, seed=1)
        placed = be.pushed  # θ and the optimizer state
        results.append(([s.train_step(x, y, 1e-3) for x, y in data], s.read_params()))
        per_step = (be.pushed - placed) / len(data)
        assert per_step == (0 if isinstance(be, Slotted) else 3)  # schedule vector, x, labels
    for losses, params in results[1:]:
        assert losses == results[0][0]
        for a, b in zip(params, results[0][1], strict=True):
            np.testing.assert_array_equal(a, b)


def test_read_back_and_load(backend):
    spec, be = get_net("mnist-linear"), make_backend(backend)
    s = TrainSession(spec, Variant("adam"), 4, be, seed=0)
    assert len(s.read_state()) == 2 * len(s.read_params())  # m…, v…
    for x, y in batches(spec, 4, 3):
        s.train_step(x, y, 1e-2)
    theta, state = s.read_all()
    assert [p.shape for p in theta] == [(784, 10), (10,)]
    np.testing.assert_array_equal(s.read_params_prefix(1)[0], theta[0])
    assert len(s.read_params_prefix()) == 2
    with pytest.raises(DataError, match="θ has 2 tensors"):
        s.read_params_prefix(3)
    # a copy, not a view: the next (in-place) step does not change what was read
    before = [p.copy() for p in theta]
    s.train_step(*batches(spec, 4, 1, seed=9)[0], 1e-2)
    for a, b in zip(theta, before, strict=True):
        np.testing.assert_array_equal(a, b)
    # load (a checkpoint) into a fresh session and step both: the same result
    s2 = TrainSession(spec, Variant("adam"), 4, be, seed=7)
    s2.load(s.read_params(), s.read_state(), s.step)
    x, y = batches(spec, 4, 1, seed=10)[0]
    assert s.train_step(x, y, 1e-2) == s2.train_step(x, y, 1e-2)
    for a, b in zip(s.read_params(), s2.read_params(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(DataError, match="parameter 0.w has shape"):
        s2.load([np.zeros((10, 784), np.float32), theta[1]], state, 0)


def test_bad_batch_is_refused():
    spec = get_net("mnist-linear")
    s = TrainSession(spec, Variant("sgd"), 4, make_backend("xla"))
    with pytest.raises(DataError, match=r"x has shape \[3, 784\]"):
        s.train_step(np.zeros((3, 784), np.float32), np.zeros(3, np.int32), 0.1)
    with pytest.raises(DataError, match=r"labels have shape \[5\]"):
        s.train_step(np.zeros((4, 784), np.float32), np.zeros(5, np.int32), 0.1)


class CountingBackend:
    """Wraps a backend and counts host→device copies (into a new buffer or an input slot)."""

    def __init__(self, inner):
        self.inner, self.pushed = inner, 0
        self.name = inner.name

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def to_device(self, a):
        self.pushed += 1
        return self.inner.to_device(a)

    def input_slot(self, shape, dtype):
        slot = getattr(self.inner, "input_slot", lambda *_: None)(shape, dtype)
        return None if slot is None else CountingSlot(self, slot)


class CountingSlot:
    def __init__(self, counter, slot):
        self.counter, self.slot = counter, slot

    def write(self, a):
        self.counter.pushed += 1
        return self.slot.write(a)


def test_forward_hold_mode_reseeds_exactly_when_the_token_changes(backend):
    spec = get_net("mnist-linear")
    be = CountingBackend(make_backend(backend))
    fwd = ForwardSession(spec, 4, be)
    x = np.random.default_rng(0).standard_normal((10, 784)).astype(np.float32)  # 3 batches, ragged tail
    p0 = spec.init_params(0)
    p1 = [p + 0.5 for p in p0]
    want0 = x @ p0[0] + p0[1]
    want1 = x @ p1[0] + p1[1]

    be.pushed = 0
    np.testing.assert_allclose(fwd.logits(x, p0, gen=0), want0, rtol=1e-5, atol=1e-5)
    assert (fwd.seeds, be.pushed) == (1, 2 + 3)  # θ once, x per batch
    np.testing.assert_allclose(fwd.logits(x, p0, gen=0), want0, rtol=1e-5, atol=1e-5)
    assert (fwd.seeds, be.pushed) == (1, 2 + 6)  # unchanged token: no re-seed
    np.testing.assert_allclose(fwd.logits(x, p1, gen=1), want1, rtol=1e-5, atol=1e-5)
    assert fwd.seeds == 2  # changed token: re-seeded, and the new θ is what scores
    # new parameters under the old token are an error, never a score of the stale ones
    with pytest.raises(DataError, match="same generation token 1"):
        fwd.logits(x, [p.copy() for p in p0], gen=1)
    # without a token: the copying path, θ pushed every call
    fwd.logits(x, p0)
    fwd.logits(x, p0)
    assert fwd.seeds == 4


def test_forward_on_session_buffers_keeps_them(backend):
    spec, be = get_net("mnist-mlp"), make_backend(backend)
    s = TrainSession(spec, Variant("adam"), 8, be, seed=2)
    fwd = ForwardSession(spec, 8, be)
    x, y = batches(spec, 8, 1)[0]
    s.train_step(x, y, 1e-3)
    a = fwd.logits(x, s.params)
    b = fwd.logits(x, s.read_params(), gen=1)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    s.train_step(x, y, 1e-3)  # the buffers the forward used are still the session's, still valid


def test_make_backend_selection(monkeypatch):
    monkeypatch.delenv("HLOFORGE_BACKEND", raising=False)
    assert make_backend().name == "xla"
    monkeypatch.setenv("HLOFORGE_BACKEND", "nope")
    with pytest.raises(PluginError, match="HLOFORGE_BACKEND='nope': no backend of that name is registered; "
                                          "expected one of .*xla"):
        make_backend()
    assert make_backend("xla").name == "xla"  # an explicit name wins over the environment


@pytest.mark.skipif(importlib.util.find_spec("iree") is None, reason="iree packages not installed")
def test_ten_steps_agree_across_backends():
    """Ten steps of mnist-mlp on XLA and on IREE from one init and data: close, not identical."""
    spec = get_net("mnist-mlp")
    data = batches(spec, 8, 10, seed=4)
    got = {}
    for name in ("xla", "iree"):
        s = TrainSession(spec, Variant("adam"), 8, make_backend(name), seed=4)
        for x, y in data:
            s.train_step(x, y, 1e-3)
        got[name] = np.concatenate([p.ravel() for p in s.read_params()])
    assert np.linalg.norm(got["xla"] - got["iree"]) / np.linalg.norm(got["xla"]) < 1e-4


# ------------------------------------------------------------------ parameter storage (paramLayout)
def _tiny_convnet():
    from hloforge.core.spec import NetSpec
    from hloforge.plugins.layers.conv import Conv2d
    from hloforge.plugins.layers.dense import Dense
    from hloforge.plugins.layers.norm import ConvBn
    from hloforge.plugins.layers.pool import GlobalAvgPool

    return NetSpec("storage-net", (2, 6, 6), (ConvBn(4, k=3), Conv2d(5, k=1, act="relu"), Conv2d(3, k=3, stride=2),
                                               GlobalAvgPool(), Dense(3)), 3)


@pytest.mark.parametrize("optimizer", ["adam", "layoutbound"])
def test_stored_hwio_kernels_train_as_declared_ones_and_read_back_declared(optimizer, monkeypatch):
    """XLA's steps carry conv kernels HWIO (paramLayout=hwio): the module's θ and state inputs are
    HWIO, yet the host sees OIHW everywhere (init, read_params/read_state, load, the forward), and
    the steps match paramLayout=public's. An optimizer that is not `layout_free` gets its tensors
    in their declared layout (here one whose step reverses ḡ along the declared last axis, so it
    moves another weight if handed a stored kernel): the same numbers again."""
    from hloforge.core import strategy
    from hloforge.core.modules import HWIO
    from hloforge.core.registry import default_registry
    from hloforge.core.variant import Optimizer

    reg = default_registry()
    if optimizer == "layoutbound":
        import attrs

        @attrs.frozen
        class LayoutBound(Optimizer):
            name = "layoutbound"

            def direction(self, b, g, state, scalars):
                return (b.reverse(g, [g.type.rank - 1]) if g.type.rank else g), {}
        monkeypatch.setattr(reg, "get", lambda kind, name, _get=reg.get: LayoutBound if name == optimizer else
                            _get(kind, name))
    spec, be = _tiny_convnet(), make_backend("xla")
    assert strategy.kind("paramLayout").default("xla") == "hwio"
    data = batches(spec, 4, 3)
    runs = {}
    for form in ("hwio", "public"):
        with strategy.forced({"paramLayout": form}):
            s = TrainSession(spec, Variant(optimizer), 4, be, seed=2, registry=reg)
            kernels = [i for i, (_, slot) in enumerate(s.layout.params) if len(slot.shape) == 4]
            assert [s.layout.storage[i] for i in kernels] == [HWIO if form == "hwio" else None] * 3
            np.testing.assert_array_equal(s.read_params()[kernels[1]], spec.init_params(2)[kernels[1]])
            losses = [s.train_step(x, y, 1e-2) for x, y in data]
            fwd = ForwardSession(spec, 4, be)
            stats = [st.initial() for _, st in spec.stats()]
            logits = fwd.logits(data[0][0], [*s.params, *(be.to_device(a) for a in stats)])
            np.testing.assert_allclose(fwd.logits(data[0][0], [*s.read_params(), *stats]), logits, rtol=1e-6)
            runs[form] = (losses, s.read_params(), s.read_state(), logits, s)
    (l1, p1, st1, z1, hw), (l2, p2, st2, z2, _) = runs["hwio"], runs["public"]
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    for a, b in zip([*p1, *st1], [*p2, *st2], strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(z1, z2, rtol=1e-4, atol=1e-6)
    hw.load(p2, st2, 3)  # declared arrays in, declared arrays out
    for a, b in zip([*hw.read_params(), *hw.read_state()], [*p2, *st2], strict=True):
        np.testing.assert_array_equal(a, b)


def test_placing_the_state_frees_each_host_copy_once_it_is_on_the_device():
    """A resident session copies θ and the optimizer state to the device one tensor at a time and
    keeps no host copy of any it has copied: at most the one being copied is alive (before, the
    declared arrays, their stored copies and the device's were all alive at once: resnet18-cifar's
    session peaked ~190 MB higher)."""
    import weakref

    spec = get_net("mnist-cnn")  # conv kernels stored HWIO: relaid copies
    be = make_backend("xla")
    seen: list[weakref.ref] = []
    alive_at_copy: list[int] = []
    real = be.to_device

    def to_device(array, *args, **kwargs):
        alive_at_copy.append(sum(r() is not None for r in seen))
        seen.append(weakref.ref(array))
        return real(array, *args, **kwargs)

    be.to_device = to_device
    s = TrainSession(spec, Variant("adam"), 2, be, seed=0)
    n = len(s.layout.params)
    assert len(seen) >= 3 * n and max(alive_at_copy[:3 * n]) == 0, alive_at_copy
    s.train_step(*batches(spec, 2, 1)[0], 1e-3)


def test_a_sessions_bad_lr_batch_step_or_rows_is_one_line_before_anything_counts():
    """Used directly (docs/composition.md), a session took lr NaN / inf / "0.1" / -1 (θ turned NaN, or trained
    at a rate nobody chose, silently), batch 0 (a NaN loss) or -1 (an XLA parse error), load() of NaN θ or a
    step "x" (a bare ValueError), and scored 0 rows with numpy's "need at least one array to concatenate"."""
    from hloforge.core.errors import UnsupportedSpec
    from hloforge.train.composition import OptimizerStepSession

    spec, be = get_net("mnist-linear"), make_backend("xla")
    s = TrainSession(spec, Variant("sgd"), 8, be)
    (x, y), = batches(spec, 8, 1)
    for lr in (float("nan"), float("inf"), "0.1", -1.0, None, 1e39):
        with pytest.raises(DataError, match="learning rate .*: expected a finite number ≥ 0"):
            s.train_step(x, y, lr)
    assert s.step == 0 and np.isfinite(s.read_params()[0]).all()
    s.train_step(x, y, np.float32(0.1))
    opt = OptimizerStepSession(spec, "sgd", be)
    with pytest.raises(DataError, match="learning rate nan"):
        opt.step([np.zeros_like(p) for p in opt.read_params()], float("nan"))
    assert opt.step_count == 0
    for batch in (0, -1, 2.5, True):
        with pytest.raises(UnsupportedSpec, match=r"batch must be an integer ≥ 1, got "):
            TrainSession(spec, Variant("sgd"), batch, be)
        with pytest.raises(UnsupportedSpec, match=r"batch must be an integer ≥ 1, got "):
            ForwardSession(spec, batch, be)
    params = s.read_params()
    with pytest.raises(DataError, match="load: step 'x'; expected"):
        s.load(params, s.read_state(), "x")
    with pytest.raises(DataError, match="load: 0.w holds NaN or inf"):
        s.load([np.full_like(params[0], np.nan), *params[1:]], s.read_state(), 1)
    with pytest.raises(DataError, match="eval x has no rows"):
        ForwardSession(spec, 4, be).logits(x[:0], params)
