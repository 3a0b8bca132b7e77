"""The oracle gate: every registered plugin passes it, and it goes red for a wrong backward."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from plugin_site import env_with, fake_dist

from hloforge.core.autodiff import inject_fault
from hloforge.core.hlo import Builder, Value
from hloforge.core.modules import label_type
from hloforge.core.spec import Ctx, walk_layers
from hloforge.losses.ce import CrossEntropy
from hloforge.plugins.layers.compose import BlockLayer
from hloforge.plugins.layers.fpn import FpnDetect
from hloforge.plugins.optimizers.adam import Adam
from hloforge.testing import HEADER, GateCase, GateResult, gate_cases, gate_loss, gate_optimizer
from hloforge.testing.gate import TOL_JAX_F32, TOL_JAX_F64

CASES = gate_cases()
# Ops whose VJP rule is structural (no cotangent to break) or which carry no gradient.
NOT_FAULTED = {"constant", "iota", "compare"}
# Blocks (compositions of gated layers) are swept only for the rules their parts do not already
# exercise on their own gate cases — every closed-form backward ("custom") and the convolution
# rule — and only on their first gate case, to keep the sweep to minutes.
BLOCK_FAULTS = {"custom", "convolution"}


def _is_block(case: GateCase) -> bool:
    # fpnDetect composes residual stages, 1×1/3×3 convs and its closed-form neck: a block too.
    return isinstance(case.obj, (BlockLayer, FpnDetect))


def _fault_cases() -> list[GateCase]:
    seen: set[str] = set()
    out = []
    for c in CASES:
        if c.kind not in ("layer", "loss"):
            continue
        if c.mode == "eval" and c.name != "batchNorm":
            continue  # eval mode is plain ops; batchNorm's eval case stands for them
        if c.strategy:
            continue  # the lowering-strategy variants: tests/test_strategies.py breaks their backwards
        if _is_block(c):
            if c.name in seen:
                continue
            seen.add(c.name)
        out.append(c)
    return out


DIFFERENTIATED = _fault_cases()


def _row_message(result: GateResult) -> str:
    return f"\n{HEADER}\n{result.row()}"


def test_registry_has_gate_cases_for_every_kind() -> None:
    kinds = {c.kind for c in CASES}
    assert kinds == {"layer", "loss", "optimizer"}
    names = {c.name for c in CASES}
    for must in ("conv2d", "dense", "maxPool", "crossEntropy", "mse", "adam", "adamw", "sgd", "momentum"):
        assert must in names
    assert len({c.id for c in CASES}) == len(CASES), "gate case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gate_case_passes(case: GateCase) -> None:
    result = case.run()
    assert result.passed, _row_message(result)
    assert result.kind == case.kind and result.name == case.name


# ------------------------------------------------------------------ the gate can fail
def forward_ops(case: GateCase) -> list[str]:
    """The op names on the tape of the case's forward (f64, gate batch sizes), minus the gradient-free ones."""
    b = Builder("f64")
    if case.kind == "layer":
        walk = walk_layers([case.obj], case.shape)
        params = {s.name: b.arg(s.shape) for s in walk[0].slots}
        train = case.mode == "train"
        running = {} if train else {s.name: b.arg(s.shape) for s in walk[0].stats}
        case.obj.forward(b, b.arg((2, *case.shape)), params, Ctx(train=train, running=running))
    else:
        y_shape, y_dtype = label_type(case.obj, case.shape, "f64")
        case.obj.forward(b, b.arg((3, *case.shape)), b.arg((3, *y_shape), y_dtype))
    ops = {op.op for op in b.tape} - NOT_FAULTED
    return sorted(ops & BLOCK_FAULTS if _is_block(case) else ops)


@pytest.mark.parametrize("case", DIFFERENTIATED, ids=[c.id for c in DIFFERENTIATED])
def test_gate_fails_for_each_broken_vjp_rule(case: GateCase) -> None:
    ops = forward_ops(case)
    ran = []
    for op in ops:
        with inject_fault(op) as calls:
            result = case.run()
        if calls[0]:
            ran.append(op)
            assert not result.passed, f"gate stayed green with the VJP of {op!r} scaled by 1.001:" + \
                _row_message(result)
    # The sweep must exercise something whenever the forward has differentiable ops; the built-ins only
    # ever stop a gradient inside closed-form custom ops, so every listed op's rule runs.
    assert bool(ran) == bool(ops), f"no broken rule ran for ops {ops}"


def test_fault_injection_counts_only_the_named_rule() -> None:
    case = next(c for c in CASES if c.kind == "layer" and c.name == "dense")
    with inject_fault("convolution") as calls:
        result = case.run()
    assert calls[0] == 0
    assert result.passed, _row_message(result)


@attrs.frozen
class ScaledCrossEntropy(CrossEntropy):
    """CrossEntropy whose closed-form backward is off by `factor` (1.0: a faithful copy, the control)."""

    factor: float = 1.0

    def backward(self, b: Builder, logits: Value, y: Value, g: Value) -> Value:
        return super().backward(b, logits, y, g) * self.factor


@pytest.mark.parametrize("factor, passes", [(1.0, True), (1.0005, False), (0.99, False)])
def test_gate_judges_a_custom_backward(factor: float, passes: bool) -> None:
    result = gate_loss(ScaledCrossEntropy(factor=factor), (5,))
    assert result.passed is passes, _row_message(result)
    if not passes:
        assert result.err_jax_f64 > TOL_JAX_F64 and result.err_fd_f64 > 1e-4


@attrs.frozen
class CotangentBlindCrossEntropy(CrossEntropy):
    """CrossEntropy whose closed-form backward takes ḡ as 1, as the train step seeds it: right there, but
    off by ḡ wherever the loss is weighted or composed into another (anchorYolo feeds diou λ·ḡ)."""

    def backward(self, b: Builder, logits: Value, y: Value, g: Value) -> Value:
        return super().backward(b, logits, y, b.full(1.0, g.shape, g.dtype))


def test_gate_catches_a_loss_backward_that_drops_its_cotangent() -> None:
    result = gate_loss(CotangentBlindCrossEntropy(label_smoothing=0.1), (7,))
    assert not result.passed and result.err_jax_f64 > 0.1, _row_message(result)


def test_custom_fault_breaks_cross_entropy() -> None:
    with inject_fault("custom") as calls:
        result = gate_loss(CrossEntropy(label_smoothing=0.1), (7,))
    assert calls[0] > 0
    assert not result.passed, _row_message(result)


@attrs.frozen
class DriftingAdam(Adam):
    """Adam whose emitted first moment uses b1 + drift while its optax oracle keeps b1."""

    drift: float = 0.0

    def direction(self, b: Builder, g: Value, state: Any, scalars: Any) -> tuple[Value, dict[str, Value]]:
        b1 = self.b1 + self.drift
        m = state["m"] * b1 + g * (1.0 - b1)
        v = state["v"] * self.b2 + g * g * (1.0 - self.b2)
        m_hat = m / b.broadcast_to(scalars["bc1"], g.shape)
        v_hat = v / b.broadcast_to(scalars["bc2"], g.shape)
        return m_hat / (b.sqrt(v_hat) + self.eps), {"m": m, "v": v}


@pytest.mark.parametrize("drift, passes", [(0.0, True), (1e-3, False)])
def test_optimizer_gate_catches_a_wrong_update(drift: float, passes: bool) -> None:
    result = gate_optimizer(DriftingAdam(drift=drift))
    assert result.passed is passes, _row_message(result)
    if not passes:
        assert result.err_jax_f64 > TOL_JAX_F64 and result.err_jax_f32 > TOL_JAX_F32


def test_rel_err_shape_mismatch_and_nan_are_failures() -> None:
    from hloforge.testing.gate import rel_err

    assert rel_err(np.ones(3), np.ones(4)) == float("inf")
    assert rel_err(np.array([np.nan]), np.ones(1)) == float("inf")
    assert rel_err(np.ones(3), np.ones(3)) == 0.0


# ------------------------------------------------------------------ pytest --hloforge-gate
FAKE_MODULE = textwrap.dedent('''
    """A third-party layer plugin: a correct closed-form layer and one whose backward is wrong."""
    import attrs
    from hloforge.core.hookspecs import hookimpl
    from hloforge.core.spec import Layer


    @attrs.frozen
    class FakeScale(Layer):
        kind = "fakeScale"
        wrong = 1.0

        def out_shape(self, in_shape):
            return in_shape

        def forward(self, b, x, params, ctx):
            return b.custom_vjp(lambda v: [v * 3.0], lambda b, g: [g * (3.0 * self.wrong)], x)[0]

        def reference(self, params, x, ctx):
            return 3.0 * x

        @classmethod
        def gate_cases(cls):
            return [(cls(), (4,))]


    @attrs.frozen
    class FakeScaleBad(FakeScale):
        kind = "fakeScaleBad"
        wrong = 1.01


    @hookimpl
    def hloforge_layers():
        return [FakeScale, FakeScaleBad]
''')


@pytest.fixture(scope="module")
def third_party(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A 'pip-installed' third-party plugin (a dist-info on PYTHONPATH) and an unrelated project tree."""
    root = tmp_path_factory.mktemp("thirdparty")
    site = root / "site"
    fake_dist(site, "hloforge-fake", {"hloforge_fake": FAKE_MODULE}, {"hloforge.layers": {"fake": "hloforge_fake"}})
    project = root / "project"
    project.mkdir()
    (project / "test_own.py").write_text("def test_own():\n    assert 1 + 1 == 2\n")
    return project, env_with(site)


def _pytest(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


def test_hloforge_gate_collects_every_registered_case(third_party: tuple[Path, dict[str, str]]) -> None:
    project, env = third_party
    proc = _pytest(project, env, "--hloforge-gate", "--collect-only", "-q")
    ids = [ln for ln in proc.stdout.splitlines() if ln.startswith("hloforge-gate::gate[")]
    expected = {f"hloforge-gate::gate[{c.id}]" for c in CASES}
    expected |= {"hloforge-gate::gate[layer:fakeScale:@4]", "hloforge-gate::gate[layer:fakeScaleBad:@4]"}
    assert set(ids) == expected, proc.stdout + proc.stderr
    assert len(ids) == len(CASES) + 2
    assert "test_own.py::test_own" in proc.stdout  # the project's own tests are still collected
    # Without the option the plugin adds nothing.
    plain = _pytest(project, env, "--collect-only", "-q")
    assert "hloforge-gate" not in plain.stdout and "test_own.py::test_own" in plain.stdout


def test_hloforge_gate_without_jax_names_the_missing_package_not_the_plugin(
        third_party: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """Before: each gate item failed as its plugin's fault (`layer 'fakeScale' (dist 'hloforge-fake') failed
    ...: ModuleNotFoundError`); now as the install's: the package and the extra that brings it."""
    project, env = third_party
    (tmp_path / "jax").mkdir()  # ahead on the path: `import jax` fails as where it is not installed
    (tmp_path / "jax" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'jax'\", name='jax')\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])}
    proc = _pytest(project, env, "--hloforge-gate", "-q", "-k", "fakeScale and not Bad")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "1 failed" in out, out
    assert "need jax (not importable here); pip install 'hloforge[gate]'" in out, out
    assert "failed on" not in out and "Traceback" not in out, out


def test_hloforge_gate_runs_and_reports_third_party_failures(third_party: tuple[Path, dict[str, str]]) -> None:
    project, env = third_party
    proc = _pytest(project, env, "--hloforge-gate", "-q", "-k", "hloforge-fake or sgd or test_own")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    n_sgd = sum(1 for c in CASES if c.name == "sgd")
    assert f"1 failed, {n_sgd + 2} passed" in out  # fakeScaleBad fails; fakeScale, sgd cases, test_own pass
    assert "FAILED hloforge-gate::gate[layer:fakeScaleBad:@4]" in out
    assert "gate failed for layer 'fakeScaleBad' from distribution 'hloforge-fake'" in out
    assert HEADER in out
    fail_rows = [ln for ln in out.splitlines() if ln.startswith("layer") and ln.rstrip().endswith("FAIL")]
    # One failing case; under CI=true pytest prints the summary untruncated, so its row may repeat.
    assert len(set(fail_rows)) == 1 and "fakeScaleBad" in fail_rows[0], out
