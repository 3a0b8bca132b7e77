"""Composition sessions (hloforge/train/composition.py): the MuZero-style unroll against jax autodiff
of the same composition and optax's Adam, the DQN example, device-side summing, refusals, and the
documented example code being the examples' own."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from test_train_step import x64  # tests/ is on sys.path (rootdir-relative, no package)

from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.train.composition import OptimizerStepSession, VjpSession
from hloforge.train.session import make_backend

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "composition"
BACKENDS = ["xla", pytest.param("iree", marks=pytest.mark.skipif(
    importlib.util.find_spec("iree") is None, reason="iree packages not installed"))]
if os.environ.get("HLOFORGE_BACKEND"):  # a per-backend run: that backend only
    BACKENDS = [os.environ["HLOFORGE_BACKEND"]]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path))


def example(name):
    spec = importlib.util.spec_from_file_location(f"composition_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod




def rel(got, want):
    """‖got − want‖ / ‖want‖."""
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


# ------------------------------------------------------------------ MuZero
def muzero_reference(mz):
    """The same unroll written in jax.numpy, differentiated by jax (jitted; f64 under x64):
    (θ_h, θ_g, θ_f, obs, one-hot actions, policy, value) -> (loss, (∂θ_h, ∂θ_g, ∂θ_f))."""
    import jax
    import jax.numpy as jnp

    def mlp(p, x):  # Dense(HIDDEN, swish) then Dense(out)
        w0, b0, w1, b1 = p
        hid = x @ w0 + b0
        return (hid * jax.nn.sigmoid(hid)) @ w1 + b1

    def loss(ph, pg, pf, obs, onehots, policy, value):
        s, total = mlp(ph, obs), 0.0
        for k in range(len(onehots) + 1):
            out = mlp(pf, s)
            logp = jax.nn.log_softmax(out[:, :mz.ACTIONS])
            total = total + (-(policy[k] * logp).sum() + ((out[:, mz.ACTIONS] - value[k]) ** 2).sum()) / len(obs)
            if k < len(onehots):
                s = mlp(pg, jnp.concatenate([s, onehots[k]], axis=1))
        return total

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def muzero_batch(mz, batch, steps, seed):
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((batch, mz.OBS)).astype(np.float32)
    actions = rng.integers(0, mz.ACTIONS, (steps, batch))
    policy = rng.dirichlet(np.ones(mz.ACTIONS), (steps + 1, batch)).astype(np.float32)
    value = rng.standard_normal((steps + 1, batch)).astype(np.float32)
    return obs, actions, policy, value


@pytest.mark.parametrize("backend", BACKENDS)
def test_muzero_unroll_gradients_match_jax_and_adam_steps_match_optax(backend):
    """Representation → 3 × dynamics → prediction: every net's gradient (g's the device sum of its
    3 VJP gradients, f's of its 4) matches jax autodiff of the same composition ≤ 1e-5, and θ'
    after each net's Adam step matches optax's adam on those gradients, for two steps."""
    import optax

    mz, be = example("muzero"), make_backend(backend)
    batch, steps, lr = 4, 3, 1e-2
    model = mz.MuZero(batch, be, seed=3)
    import jax

    tx = optax.adam(lr)
    reference, update = muzero_reference(mz), jax.jit(tx.update)
    opt_state = None
    worst = {n: 0.0 for n in "hgf"}
    for step in range(2):
        obs, actions, policy, value = muzero_batch(mz, batch, steps, seed=step)
        theta = {n: s.read_params() for n, s in model.vjp.items()}
        with x64():
            f64 = {n: [np.float64(a) for a in theta[n]] for n in "hgf"}
            want_loss, grads64 = reference(f64["h"], f64["g"], f64["f"], np.float64(obs),
                                           np.eye(mz.ACTIONS)[actions], np.float64(policy), np.float64(value))
            want = {n: [np.asarray(t) for t in g] for n, g in zip("hgf", grads64, strict=True)}
            want_loss = float(want_loss)
            if opt_state is None:
                opt_state = {n: tx.init(f64[n]) for n in "hgf"}
            want_theta = {}
            for n in "hgf":
                upd, opt_state[n] = update(want[n], opt_state[n])
                want_theta[n] = [np.asarray(t) for t in optax.apply_updates(f64[n], upd)]
        loss, grads = model.gradients(obs, actions, policy, value)
        assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
        for n in "hgf":
            for got, ref in zip(grads[n].read(), want[n], strict=True):
                assert got.shape == ref.shape
                worst[n] = max(worst[n], rel(got, ref))
        for n, opt in model.opt.items():
            opt.step(grads[n], lr)
            for got, ref in zip(model.vjp[n].read_params(), want_theta[n], strict=True):
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    print(f"\nMuZero gradients vs jax on {backend}, worst relative error per net: "
          + ", ".join(f"{n} {worst[n]:.1e}" for n in "hgf"))
    assert max(worst.values()) <= 1e-5, worst


def test_muzero_loss_falls():
    mz = example("muzero")
    model = mz.MuZero(4, make_backend("xla"), seed=0)
    data = muzero_batch(mz, 4, 3, seed=7)
    losses = [model.train_step(*data, lr=3e-2) for _ in range(30)]
    assert losses[-1] < 0.7 * losses[0]


# ------------------------------------------------------------------ DQN
def test_dqn_example_learns_the_chains_optimal_values():
    dqn = example("dqn")
    q, losses = dqn.train(make_backend("xla"))
    np.testing.assert_allclose(q, dqn.q_star(), atol=0.01)
    assert (q.argmax(axis=1) == dqn.RIGHT).all()
    assert losses[-1] < 1e-3 * losses[0]


# ------------------------------------------------------------------ the sessions themselves
def _conv_net():
    from hloforge.plugins.layers.conv import Conv2d
    from hloforge.plugins.layers.dense import Dense
    from hloforge.plugins.layers.pool import GlobalAvgPool

    return NetSpec("compose-conv", (2, 5, 5), (Conv2d(3, k=3, act="relu"), GlobalAvgPool(), Dense(2)), 2)


def test_stored_kernels_give_declared_gradients_and_steps():
    """On XLA conv kernels are stored HWIO: the VJP's ∂θ, read back, and the optimizer step's θ' are in
    the declared OIHW layout and equal paramLayout=public's."""
    from hloforge.core import strategy
    from hloforge.core.modules import HWIO

    be, spec = make_backend("xla"), _conv_net()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, *spec.input_shape)).astype(np.float32)
    gbar = rng.standard_normal((2, 2)).astype(np.float32)
    runs = {}
    for form in ("hwio", "public"):
        with strategy.forced({"paramLayout": form}):
            v = VjpSession(spec, 2, be, seed=1)
            assert v.storage[0] == (HWIO if form == "hwio" else None)
            opt = OptimizerStepSession(spec, Variant("adam"), be, params=v.theta)
            y, g, dx = v.vjp(x, gbar)
            grads = g.read()
            opt.step(g, 1e-2)
            runs[form] = (y, grads, dx, opt.read_params(), opt.read_state())
    hwio, public = (np.concatenate([np.ravel(t) for t in [r[0], *r[1], r[2], *r[3], *r[4]]]) for r in runs.values())
    np.testing.assert_allclose(hwio, public, rtol=1e-5, atol=1e-6)
    assert runs["hwio"][1][0].shape == spec.params()[0][1].shape


def test_net_vjp_module_is_the_layer_lists_vjp_module_where_nothing_is_stored():
    """The NetSpec form renders the layer-list form's text (but its name) where θ is stored as
    declared (paramLayout=public), and differs where conv kernels are stored HWIO."""
    from hloforge.core import strategy
    from hloforge.core.modules import net_vjp_module, param_storage, vjp_module

    spec = _conv_net()
    for form in ("public", "hwio"):
        with strategy.forced({"paramLayout": form}):
            for target in (None, "xla", "iree"):
                same = net_vjp_module(spec, 2, target=target) == vjp_module(
                    spec.layers, spec.input_shape, 2, name="compose_conv_vjp", target=target)
                assert same == (param_storage(spec.params(), target)[0] is None) == (form == "public")


def test_gradients_summed_on_the_device_equal_the_sum_of_each():
    be = make_backend("xla")
    spec = NetSpec("compose-mlp", (3,), (_dense(4, "relu"), _dense(2)), 2)
    v = VjpSession(spec, 2, be, seed=0)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((3, 2, 3)).astype(np.float32)
    gs = rng.standard_normal((3, 2, 2)).astype(np.float32)
    each = [v.vjp(x, g)[1].read() for x, g in zip(xs, gs, strict=True)]
    total = None
    for x, g in zip(xs, gs, strict=True):
        _, total, _ = v.vjp(x, g, into=total)
    for got, *parts in zip(total.read(), *each, strict=True):
        np.testing.assert_allclose(got, sum(parts), rtol=1e-6, atol=1e-7)


def test_device_buffers_chain_without_the_host():
    """y and ∂x as device buffers (host=False) feed the next call as they are."""
    be = make_backend("xla")
    spec = NetSpec("compose-mlp", (3,), (_dense(3, "swish"), _dense(3)), 3)
    v = VjpSession(spec, 2, be, seed=0)
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    y_dev = v.forward(x, host=False)
    np.testing.assert_array_equal(v.forward(y_dev), v.forward(v.forward(x)))
    _, _, dx_dev = v.vjp(x, np.ones((2, 3), np.float32), host=False)
    np.testing.assert_array_equal(v.vjp(x, dx_dev)[2], v.vjp(x, be.to_host(dx_dev))[2])


def _dense(units, act="identity"):
    from hloforge.plugins.layers.dense import Dense

    return Dense(units, act=act)


def test_refusals_are_one_clear_line():
    be = make_backend("xla")
    spec = NetSpec("compose-mlp", (3,), (_dense(4, "relu"), _dense(2)), 2)
    other = NetSpec("compose-other", (3,), (_dense(5, "relu"), _dense(2)), 2)
    v, w = VjpSession(spec, 2, be), VjpSession(other, 2, be)
    with pytest.raises(DataError, match=r"input x has shape \[2, 4\], expected \[2, 3\]"):
        v.vjp(np.zeros((2, 4), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(DataError, match=r"cotangent ḡ has shape \[2, 3\], expected \[2, 2\]"):
        v.vjp(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))
    _, g, _ = v.vjp(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(DataError, match="another net"):
        w.vjp(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32), into=g)
    with pytest.raises(DataError, match="another net"):
        OptimizerStepSession(other, "adam", be).step(g, 1e-3)
    with pytest.raises(DataError, match="another net"):
        OptimizerStepSession(other, "adam", be, params=v.theta)
    _, g2, _ = v.vjp(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32), into=g)
    with pytest.raises(DataError, match="summed into newer ones"):
        g.read()
    with pytest.raises(DataError, match=r"parameter 0.w has shape \[3, 3\], expected \[3, 4\]"):
        OptimizerStepSession(spec, "adam", be).step([np.zeros((3, 3))] + [np.zeros(s.shape) for _, s in
                                                                           spec.params()[1:]], 1e-3)
    with pytest.raises(UnsupportedSpec, match="label_smoothing belong to the net or its loss"):
        OptimizerStepSession(spec, Variant("adam", label_smoothing=0.1), be)
    with pytest.raises(DataError, match=r"read_params_prefix\(9\): θ has 4 tensors"):
        v.read_params_prefix(9)
    from hloforge.plugins.layers.dropout import Dropout

    with pytest.raises(UnsupportedSpec, match="dropout / drop-path masks"):
        VjpSession(NetSpec("compose-do", (3,), (_dense(4), Dropout(0.5), _dense(2)), 2), 2, be)
    assert g2.read()[0].shape == (3, 4)


def test_out_of_memory_is_one_line_naming_what_to_reduce(monkeypatch):
    """A VJP or optimizer step the device has no room for said XLA's 'Out of memory allocating 21474836480 bytes.
    [RESOURCE_EXHAUSTED]' (IREE's 'could not allocate buffer'); now the sessions say it in GiB, as training does:
    a VjpSession with its batch, an optimizer step (no batch) with the θ it holds."""
    from hloforge.core.errors import DeviceMemoryError

    be = make_backend("xla")
    spec = NetSpec("compose-mlp", (3,), (_dense(4, "relu"), _dense(2)), 2)
    v, opt = VjpSession(spec, 2, be), OptimizerStepSession(spec, "adam", be)
    _, g, _ = v.vjp(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32))

    def refused(*args, **kwargs):
        raise DeviceMemoryError("XLA failed executing: Out of memory allocating 21474836480 bytes. "
                                "[RESOURCE_EXHAUSTED]", 21474836480)

    monkeypatch.setattr(be, "execute", refused)
    said = r"out of memory: the {} asked for 20\.0 GiB at once, more than the device has free; {}$"
    batch = "use a smaller VjpSession batch"
    with pytest.raises(DeviceMemoryError, match="^" + said.format("VJP of net 'compose-mlp' at batch 2", batch)):
        v.vjp(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(DeviceMemoryError, match="^" + said.format("forward of net 'compose-mlp' at batch 2", batch)):
        v.forward(np.zeros((2, 3), np.float32))
    with pytest.raises(DeviceMemoryError, match="^" + said.format(
            r"optimizer step of 4 parameter tensors \(0\.0 MiB of θ\)",
            "θ, its optimizer state and ∂θ must fit on the device together")):
        opt.step(g, 1e-3)
    monkeypatch.setattr(be, "compile", refused)  # IREE allocates a module's transient storage as it loads it
    with pytest.raises(DeviceMemoryError, match="^" + said.format("VJP of net 'compose-mlp' at batch 2", batch)):
        v.vjp(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32), into=g)


def test_host_gradients_step_like_device_ones():
    be = make_backend("xla")
    spec = NetSpec("compose-mlp", (3,), (_dense(4, "relu"), _dense(2)), 2)
    grads = [np.random.default_rng(i).standard_normal(s.shape).astype(np.float32) for i, (_, s) in
             enumerate(spec.params())]
    a, b = OptimizerStepSession(spec, "adam", be, seed=4), OptimizerStepSession(spec.params(), "adam", be,
                                                                                 params=spec.init_params(4))
    for _ in range(2):
        a.step(grads, 1e-2)
        b.step(grads, 1e-2)
    for p, q in zip(a.read_params() + a.read_state(), b.read_params() + b.read_state(), strict=True):
        np.testing.assert_array_equal(p, q)
    assert not np.array_equal(a.read_params()[0], spec.init_params(4)[0])


# ------------------------------------------------------------------ the document
@pytest.mark.parametrize("name", ["muzero", "dqn"])
def test_documented_example_is_the_examples_code(name):
    """docs/composition.md carries each example whole, between `<!-- example: NAME -->` markers."""
    doc = (ROOT / "docs" / "composition.md").read_text()
    found = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```\n<!-- end example -->", doc, re.S)
    assert found, f"docs/composition.md has no {name} example block"
    assert found.group(1) == (EXAMPLES / f"{name}.py").read_text()


def test_a_backend_name_for_the_instance_is_one_line() -> None:
    """Before: `VjpSession(spec, 5, "xla")` failed on its first call with AttributeError: 'str' ... 'to_device'."""
    from hloforge.plugins.layers.dense import Dense
    from hloforge.train.session import ForwardSession

    spec = NetSpec("q", (6,), (Dense(2),), 2)
    said = (r"backend 'xla' is a name, where a session takes a backend instance; expected "
            r"hloforge\.train\.session\.make_backend\('xla'\)")
    for make in (lambda: VjpSession(spec, 5, "xla"), lambda: OptimizerStepSession(spec, "adam", "xla"),
                 lambda: ForwardSession(spec, 5, "xla")):
        with pytest.raises(UnsupportedSpec, match=said):
            make()
