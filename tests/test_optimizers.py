"""Optimizers and their wrappers: each wrapper alone against optax (the registry-wide gate runs them
composed with every optimizer), gates that go red on a wrong update, the seed's particulars
(RMSProp's v = 1, LAMB's zero-norm trust ratio), and the wrappers inside the real train step:
accumulation over k equals one step at k× the batch, the EMA shadow is the EMA of θ."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import pytest

from hloforge.core.modules import optimizer_step_module
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec, ParamSlot
from hloforge.core.variant import Variant, Wrappers
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.optimizers.adam import Adam, AdamW
from hloforge.plugins.optimizers.lamb import Lamb
from hloforge.plugins.optimizers.rmsprop import RMSProp
from hloforge.plugins.optimizers.sgd import SGD, Momentum, Nesterov
from hloforge.testing.gate import OPT_STEPS, TOL_OPT_F32, TOL_OPT_F64, gate_optimizer
from hloforge.train.session import TrainSession, make_backend

pytest.importorskip("optax")

REG = default_registry()


@pytest.mark.parametrize("wrappers", [Wrappers(ema=0.9), Wrappers(accum=4), Wrappers(clip=1.5)],
                         ids=["ema", "accum4", "clip"])
@pytest.mark.parametrize("opt", [Adam(), Nesterov()], ids=["adam", "nesterov"])
def test_each_wrapper_alone_matches_optax(opt, wrappers) -> None:
    r = gate_optimizer(opt, wrappers=wrappers)
    assert r.passed, r.row()
    assert r.err_jax_f64 <= TOL_OPT_F64 and r.err_jax_f32 <= TOL_OPT_F32


def test_the_gate_covers_every_new_optimizer_in_the_seed_forms() -> None:
    from hloforge.testing.gate import gate_cases

    cases = gate_cases(names=["nesterov", "rmsprop", "lamb", "adamw"])
    assert {c.name for c in cases} == {"nesterov", "rmsprop", "lamb", "adamw"}
    assert any(c.wrappers == Wrappers(ema=0.99, accum=2, clip=1.5) for c in cases if c.name == "lamb")
    assert RMSProp().rho == 0.9 and RMSProp().momentum == 0.9 and RMSProp().initial_scale == 1.0
    assert Lamb().eps == 1e-6 and Nesterov().nesterov and not Momentum().nesterov and AdamW().weight_decay == 0.01
    assert OPT_STEPS == 5


# ------------------------------------------------------------------ the gate goes red
@attrs.frozen
class OffWrappers(Wrappers):
    """Emits the wrappers as given but hands the oracle slightly different ones."""

    oracle: Wrappers = Wrappers()

    def optax_reference(self, opt: Any, lr: float, decay_mask: Any) -> Any:
        return self.oracle.optax_reference(opt, lr, decay_mask)


@pytest.mark.parametrize("emitted, oracle", [
    (Wrappers(clip=1.5), Wrappers(clip=1.52)),
    (Wrappers(accum=3), Wrappers(accum=2)),
    (Wrappers(accum=1), Wrappers(clip=1e9, accum=1)),  # sanity: an inert clip stays green
], ids=["clip", "accum", "inert"])
def test_the_wrapper_gate_fails_on_a_wrong_wrapper(emitted, oracle) -> None:
    w = OffWrappers(emitted.ema, emitted.accum, emitted.clip, oracle=oracle)
    r = gate_optimizer(Adam(), wrappers=w)
    assert r.passed is (emitted.clip == 0 and emitted.accum == oracle.accum), r.row()


@attrs.frozen
class WrongNesterov(Momentum):
    """Heavy-ball emitted, Nesterov promised to the oracle."""

    name = "wrongNesterov"

    def optax_direction(self) -> Any:
        import optax

        return optax.trace(decay=self.momentum, nesterov=True)


@attrs.frozen
class ZeroInitRMSProp(RMSProp):
    """v starting at 0 (the common default) against the seed's v = 1 oracle."""

    def init_state(self, slot: ParamSlot) -> dict[str, np.ndarray]:
        return {"m": np.zeros(slot.shape, np.float32), "v": np.zeros(slot.shape, np.float32)}


@attrs.frozen
class UnclippedLamb(Lamb):
    """Adam with decay but no trust ratio, against the LAMB oracle."""

    def update(self, b, p, g, state, scalars, slot):
        return Adam.update(self, b, p, g, state, scalars, slot)


@pytest.mark.parametrize("opt", [WrongNesterov(), ZeroInitRMSProp(), UnclippedLamb(weight_decay=0.02)],
                         ids=["nesterov", "rmsprop-v0", "lamb-no-trust"])
def test_the_optimizer_gate_fails_on_a_wrong_update(opt) -> None:
    r = gate_optimizer(opt)
    assert not r.passed and r.err_jax_f64 > 1e-6, r.row()


def test_ema_shadow_gate_fails_when_the_shadow_is_off() -> None:
    @attrs.frozen
    class LateShadow(Wrappers):
        def emit_update(self, b, opt, slots, params, grads, state, scalars):
            new_p, new_s = super().emit_update(b, opt, slots, params, grads, state, scalars)
            new_s["E"] = [e * 1.001 for e in new_s["E"]]
            return new_p, new_s

    assert not gate_optimizer(SGD(), wrappers=LateShadow(ema=0.9)).passed


# ------------------------------------------------------------------ seed particulars
def run_module(opt, params, grads, lr=0.1):
    from hloforge.backends.xla import default_client

    slots = [ParamSlot(f"p{i}", p.shape, "glorot", True) for i, p in enumerate(params)]
    lay = Wrappers().layout(opt)
    exe = default_client().compile(optimizer_step_module(slots, opt, dtype="f64"))
    try:
        st = lay.initial(opt, slots, params, np.float64)
        outs = exe.run([*params, *st, *grads, lay.host_schedule(opt, 1, lr, np.float64)])
    finally:
        exe.close()
    return [np.asarray(o) for o in outs[:len(params)]]


def test_lamb_trust_ratio_is_one_when_a_norm_is_zero() -> None:
    import jax
    import optax

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(1)
    params = [np.zeros((3, 4)), rng.standard_normal((4,)), rng.standard_normal((2, 2))]
    grads = [rng.standard_normal((3, 4)), rng.standard_normal((4,)), np.zeros((2, 2))]
    got = run_module(Lamb(), params, grads)
    tx = optax.lamb(0.1, eps=1e-6)
    upd, _ = tx.update(grads, tx.init(params), params)
    for g, p, u in zip(got, params, upd, strict=True):
        np.testing.assert_allclose(g, p + np.asarray(u), rtol=1e-12, atol=1e-15)
    # θ = 0 takes the plain Adam step (ratio 1): lr·sign(g) at step 1
    np.testing.assert_allclose(got[0], -0.1 * np.sign(grads[0]), rtol=1e-4)  # ≈: ε = 1e-6 beside |g|
    np.testing.assert_array_equal(got[2], params[2])  # r = 0: nothing moves, and no NaN from 0/0


def test_rmsprop_starts_its_mean_square_at_one() -> None:
    slot = ParamSlot("w", (2, 3), "glorot", True)
    st = RMSProp().init_state(slot)
    assert np.all(st["v"] == 1.0) and np.all(st["m"] == 0.0)


# ------------------------------------------------------------------ the wrappers in the train step
def bn_free_net() -> NetSpec:
    return NetSpec("tiny", (12,), [Dense(16, act="relu"), Dense(5)], 5)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "lamb"])
def test_accumulating_k4_equals_one_step_at_4x_batch(optimizer) -> None:
    spec, be = bn_free_net(), make_backend("xla")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 12)).astype(np.float32)
    y = rng.integers(0, 5, 32).astype(np.int32)
    init = spec.init_params(2)
    big = TrainSession(spec, Variant(optimizer, clip=0.5), 32, be, params=init)
    acc = TrainSession(spec, Variant(optimizer, clip=0.5, accum=4), 8, be, params=init)
    for t in range(2):  # two updates: the accumulator restarts at zero after each
        xs, ys = x if t == 0 else x[::-1].copy(), y if t == 0 else y[::-1].copy()
        big.train_step(xs, ys, 0.05)
        for i in range(4):
            acc.train_step(xs[8 * i:8 * i + 8], ys[8 * i:8 * i + 8], 0.05)
            if i < 3 and t == 0:  # nothing but G moves until the 4th micro-batch
                for a, b in zip(acc.read_params(), init, strict=True):
                    np.testing.assert_array_equal(a, b)
    for a, b in zip(acc.read_params(), big.read_params(), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    g = acc.read_state()[-len(init):]  # the G slot, back at zero after an applied update
    assert acc.state_layout.slots[-1] == "G" and all(np.all(t == 0) for t in g)


def test_the_shadow_is_the_ema_of_theta_with_warmup() -> None:
    spec, be = bn_free_net(), make_backend("xla")
    rng = np.random.default_rng(3)
    init = spec.init_params(1)
    s = TrainSession(spec, Variant("momentum", ema=0.95), 8, be, params=init, resident=False)
    shadow = [p.astype(np.float64) for p in init]
    for t in range(6):
        s.train_step(rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32), 0.1)
        d = min(0.95, (1 + t) / (10 + t))
        shadow = [e * d + p * (1 - d) for e, p in zip(shadow, s.read_params(), strict=True)]
    got = [np.asarray(b) for b in map(be.to_host, s.slot_buffers("E"))]
    for a, b in zip(got, shadow, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(Exception, match="no 'G' slot"):
        s.slot_buffers("G")


def test_the_gate_catches_an_accumulator_that_keeps_the_clipped_sum() -> None:
    """G must carry the running sum; clipping applies to what the optimizer sees, not to G."""
    from hloforge.core.variant import clip_by_global_norm

    @attrs.frozen
    class ClippedAccumulator(Wrappers):
        def emit_update(self, b, opt, slots, params, grads, state, scalars):
            new_p, new_s = super().emit_update(b, opt, slots, params, grads, state, scalars)
            summed = [a + g * (1.0 / self.accum) for a, g in zip(state["G"], grads, strict=True)]
            acc = clip_by_global_norm(b, summed, self.clip)
            apply = b.compare(scalars["accum_apply"], b.full(0.5), "GT")
            new_s["G"] = [b.select(b.broadcast_to(apply, a.shape), b.full(0.0, a.shape), a) for a in acc]
            return new_p, new_s

    assert not gate_optimizer(Adam(), wrappers=ClippedAccumulator(ema=0.99, accum=2, clip=1.5)).passed


def test_the_composed_wrapper_gate_applies_an_unclipped_accumulated_update() -> None:
    """Clipping hides a gradient's scale wherever it clips, so the registry's composed case must apply
    an accumulated update under the clip norm too: there an accumulator that sums g (no 1/k) is 2× off."""

    @attrs.frozen
    class SummingAccumulator(Wrappers):
        def emit_update(self, b, opt, slots, params, grads, state, scalars):
            return super().emit_update(b, opt, slots, params, [g * float(self.accum) for g in grads], state, scalars)

    (composed,) = Wrappers.gate_cases()
    assert not gate_optimizer(SGD(), wrappers=SummingAccumulator(**attrs.asdict(composed))).passed
