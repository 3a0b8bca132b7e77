"""Host calls (backends/xla/pjrt/host_calls.py) and the process sum built on them (Builder.process_sum):
the custom call a multi-process step's sync BN makes, here in one process with host functions standing in
for the other processes (test_mpi.py runs the real MPI one)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hloforge.core import autodiff
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.hlo import PROCESS_SUM, Builder
from hloforge.core.modules import gradient_step_module, host_stored
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.plugins.layers.dense import Dense, Flatten
from hloforge.plugins.layers.norm import ConvBn
from hloforge.train import mpi
from hloforge.train.session import make_backend

BATCH = 8


def bn_net() -> NetSpec:
    return NetSpec("host-call-bn", (2, 6, 6), [ConvBn(3), ConvBn(4, stride=2), Flatten(), Dense(5)], 5)


def as_if(processes: int):
    """A process sum as P processes holding this same batch would make it: every sum × P."""
    calls: list[list[tuple[int, ...]]] = []

    def host(inputs, outputs):
        calls.append([a.shape for a in inputs])
        outputs[0][...] = inputs[0]
        for i, o in zip(inputs[1:], outputs[1:], strict=True):
            o[...] = i * processes

    return host, calls


@pytest.fixture(scope="module")
def backend():
    return make_backend("xla")


def run(be, text: str, arrays) -> list[np.ndarray]:
    return [be.to_host(o) for o in be.execute(be.compile(text), [be.to_device(np.asarray(a)) for a in arrays])]


def test_a_host_call_reads_its_operands_and_fills_its_results(backend):
    b = Builder()
    x = b.arg((4,))
    (s,) = b.process_sum([x])
    (t,) = b.process_sum([s + x])
    host, calls = as_if(3)
    backend.register_host_call(PROCESS_SUM, host)
    (out,) = run(backend, b.module([t]), [np.arange(4, dtype=np.float32)])
    assert out.tolist() == [(3 * v + v) * 3 for v in range(4)]
    assert calls == [[(), (4,)], [(), (4,)]]


def test_process_sums_are_chained_in_emission_order():
    """Each call's first operand is the previous call's first result: one order on every process."""
    b = Builder()
    x = b.arg((2,))
    y = b.process_sum([x])[0]
    b.process_sum([x, y])
    calls = re.findall(r"(%\w+):\d+ = stablehlo.custom_call @" + PROCESS_SUM + r"\((%[\w#]+)", b.module([y]))
    assert len(calls) == 2 and calls[1][1] == f"{calls[0][0]}#0"


def test_the_vjp_of_a_process_sum_is_a_process_sum(backend):
    b = Builder()
    x, w = b.arg((3,)), b.arg((3,))
    (s,) = b.process_sum([x * w])
    loss = b.sum(s * s, [0])
    (g,) = autodiff.grad(b, [loss], [b.full(1.0)], [x])
    host, calls = as_if(2)
    backend.register_host_call(PROCESS_SUM, host)
    xv, wv = np.array([1.0, -2.0, 0.5], np.float32), np.array([0.3, 0.7, -1.1], np.float32)
    (got,) = run(backend, b.module([g]), [xv, wv])
    # d/dx Σ_p (P·Σ_q x_q w)² seen from one of P identical processes: P · 2·(P·x·w)·w
    np.testing.assert_allclose(got, 2 * 2 * (2 * xv * wv) * wv, rtol=1e-6)
    assert len(calls) == 2


def test_the_sync_bn_gradient_half_over_processes_pools_their_statistics(backend):
    """P processes with the same batch pool to that batch's own statistics, so the P-process sync-BN gradient
    half (every sum through the host call) is the one-process gradient half, bit for bit."""
    spec, variant = bn_net(), Variant("sgd")
    rng = np.random.default_rng(0)
    params = spec.init_params(1)
    x = rng.standard_normal((BATCH, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, 5, BATCH).astype(np.int32)
    plain, _ = gradient_step_module(spec, variant, BATCH, target="xla")
    synced, lay = gradient_step_module(spec, variant, BATCH, sync_bn=True, processes=2, target="xla")
    assert PROCESS_SUM not in plain and synced.count(f"custom_call @{PROCESS_SUM}") == 2 * 3  # 2 BN × (2 fwd + 1 bwd)
    host, calls = as_if(2)
    backend.register_host_call(PROCESS_SUM, host)
    stored = host_stored(params, lay.storage)
    want = run(backend, plain, [*stored, x, y])
    got = run(backend, synced, [*stored, x, y])
    assert len(calls) == 6 and len(got) == len(want) == lay.n_params + 1 + len(lay.stats)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


def test_a_host_call_that_raises_fails_the_run_with_its_own_error(backend):
    b = Builder()
    x = b.arg((2,))
    (s,) = b.process_sum([x])

    def refuse(inputs, outputs):
        raise DataError("rank 1 of 2 died at the sync-BN statistics (step 3); the other ranks stopped")

    backend.register_host_call(PROCESS_SUM, refuse)
    exe = backend.compile(b.module([s]))
    with pytest.raises(DataError, match=r"^rank 1 of 2 died at the sync-BN statistics \(step 3\)"):
        backend.execute(exe, [backend.to_device(np.zeros(2, np.float32))])


def test_sync_bn_across_processes_on_a_backend_without_host_calls_is_one_line():
    pytest.importorskip("iree.runtime")
    with pytest.raises(UnsupportedSpec, match="--sync-bn across MPI processes sums the BN statistics in a host "
                                              "call inside the step, which the iree backend cannot make"):
        mpi.MpiTrainSession(bn_net(), Variant("sgd"), BATCH, make_backend("iree"), world=mpi.World(0, 2),
                            replicas=2, sync_bn=True)


def test_sync_bn_module_needs_more_than_one_replica_or_process():
    with pytest.raises(UnsupportedSpec, match="it needs replicas > 1 or processes > 1"):
        gradient_step_module(bn_net(), Variant("sgd"), BATCH, sync_bn=True)
