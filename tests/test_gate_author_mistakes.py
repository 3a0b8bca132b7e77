"""Plugin authors' declarations the gate must check, not trust: a wrong one used to pass `hloforge
verify` and then train to a plausible wrong number on XLA.

- An optimizer declaring `layout_free` (copied from the Lion example) whose update reads a tensor's
  axes (a per-row norm): XLA hands it conv kernels stored HWIO (paramLayout=hwio), so it normalises
  the wrong rows. The gate now runs every case of a layout_free optimizer with a conv-kernel slot
  stored that way too; one that is not layout_free gets its tensors declared, and passes.
- A loss whose `sample_labels` gives labels of another shape than its `label_spec`: the gate's oracle
  failed on them with jax's broadcasting error, naming neither the loss nor the method. The gate now
  refuses them in one line naming both; integer ids of another width or as a list are taken as the
  train step takes them (int32).
- A layer whose `supports_nhwc` is true but which did not list "layout" in `strategy_kinds`: an
  NHWC render keeps NHWC through it, yet its NHWC form was never gated. The gate now gates it in
  both layouts whenever `supports_nhwc` holds for a case's shape.

The plugins are in-process distributions (`Registry(extra_plugins=...)`), as in
tests/test_gate_broken_plugin.py.
"""

from __future__ import annotations

import textwrap
import types

import numpy as np
import pytest

from hloforge.core import strategy
from hloforge.core.errors import PluginError
from hloforge.core.registry import Registry
from hloforge.losses.ce import CrossEntropy, MeanSquaredError
from hloforge.testing.gate import collect_cases, gate_loss, gate_optimizer
from hloforge.testing.verify import verify

DIST = "hloforge-mistakes"

MODULE = textwrap.dedent('''
    from typing import ClassVar

    import attrs
    from hloforge.core.hookspecs import hookimpl
    from hloforge.core.spec import Layer
    from hloforge.core.variant import Optimizer


    @attrs.frozen
    class RowNorm(Optimizer):
        """d = g / ‖g[o]‖ per output row (axis 0): it reads the tensor's axes, so it is not layout_free."""
        name: ClassVar[str] = "rowNorm"
        eps: float = 1e-8

        def direction(self, b, g, state, scalars):
            if len(g.shape) < 2:
                return g / b.broadcast_to(b.sqrt(b.sum(g * g)) + self.eps, g.shape), {}
            n = b.sqrt(b.sum(g * g, list(range(1, len(g.shape))))) + self.eps
            return g / b.broadcast_in_dim(n, g.shape, [0]), {}

        def optax_direction(self):
            import jax
            import jax.numpy as jnp
            import optax

            def f(u):
                axes = tuple(range(1, u.ndim)) if u.ndim > 1 else None
                return u / (jnp.sqrt(jnp.sum(u * u, axis=axes, keepdims=u.ndim > 1)) + self.eps)
            return optax.stateless(lambda updates, params=None: jax.tree.map(f, updates))

        @classmethod
        def gate_cases(cls):
            return [cls()]


    @attrs.frozen
    class RowNormFree(RowNorm):
        """The same update, wrongly declared layout_free."""
        name: ClassVar[str] = "rowNormFree"
        layout_free: ClassVar[bool] = True


    @attrs.frozen
    class ChanRms(Layer):
        """y = x / sqrt(mean_c x² + eps) per pixel. Says it takes NHWC, lists no "layout" kind, and
        always reduces axis 1 (its NHWC bug)."""
        kind = "chanRms"
        eps: float = 1e-5

        def out_shape(self, in_shape):
            return in_shape

        def supports_nhwc(self, in_shape):
            return True

        def channel_axis(self, ctx):
            return 1

        def forward(self, b, x, params, ctx):
            ax = self.channel_axis(ctx)
            ms = b.sum(x * x, [ax]) / float(x.shape[ax])
            return x * b.broadcast_in_dim(b.rsqrt(ms + self.eps), x.shape, [d for d in range(4) if d != ax])

        def reference(self, params, x, ctx):
            import jax.numpy as jnp
            return x / jnp.sqrt(jnp.mean(x * x, axis=1, keepdims=True) + self.eps)

        @classmethod
        def gate_cases(cls):
            return [(cls(), (4, 3, 2))]


    @attrs.frozen
    class ChanRmsOk(ChanRms):
        kind = "chanRmsOk"

        def channel_axis(self, ctx):
            return 3 if ctx.layout == "NHWC" else 1


    @hookimpl
    def hloforge_optimizers():
        return [RowNorm, RowNormFree]


    @hookimpl
    def hloforge_layers():
        return [ChanRms, ChanRmsOk]
''')


@pytest.fixture(scope="module")
def mistakes() -> tuple[Registry, types.ModuleType]:
    mod = types.ModuleType("hf_mistakes")
    exec(compile(MODULE, "<hf_mistakes>", "exec"), mod.__dict__)
    return Registry(extra_plugins=((mod, DIST),)), mod


def _verify(reg: Registry, *names: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    return verify(names, registry=reg, out=lines.append), lines


def _rows(lines: list[str], name: str) -> list[str]:
    return [ln for ln in lines if ln.split()[1:2] == [name]]


def test_layout_free_optimizer_that_reads_axes_fails_verify_on_stored_kernels(
        mistakes: tuple[Registry, types.ModuleType]) -> None:
    reg, _ = mistakes
    failures, lines = _verify(reg, "rowNorm", "rowNormFree")
    free = _rows(lines, "rowNormFree")
    failed = [ln for ln in free if ln.endswith("FAIL")]
    # Red exactly where its kernel is stored HWIO; in the declared layout its update is right.
    assert failures == 1 and len(failed) == 1 and "[paramLayout=hwio]" in failed[0], lines
    assert len(free) == 3 and all(ln.endswith("pass") for ln in free if ln not in failed), free
    # The honest declaration (layout_free False) passes, and is not gated on a layout it never sees.
    honest = _rows(lines, "rowNorm")
    assert len(honest) == 2 and all(ln.endswith("pass") for ln in honest), honest


def test_optimizer_not_layout_free_passes_with_kernels_stored_hwio(mistakes: tuple[Registry, types.ModuleType]) -> None:
    _, mod = mistakes
    # the train step hands it its declared layout, transposed there and back
    with strategy.forced({"paramLayout": "hwio"}):
        assert gate_optimizer(mod.RowNorm()).passed
        assert not gate_optimizer(mod.RowNormFree()).passed


def test_builtin_layout_free_optimizers_are_gated_on_stored_kernels() -> None:
    cases, errors = collect_cases(names=["adam", "sgd"])
    assert not errors
    hwio = [c for c in cases if c.strategy == (("paramLayout", "hwio"),)]
    # one per declared case (adam's three, sgd's two), none inside the wrappers
    assert len(hwio) == 5 and all(c.wrappers is None for c in hwio), [c.id for c in cases]
    assert all(c.id.endswith("~paramLayout=hwio") for c in hwio)
    r = hwio[0].run()
    assert r.passed and r.case.startswith("[paramLayout=hwio] "), r


def test_layer_supporting_nhwc_is_gated_in_both_layouts_without_listing_layout(
        mistakes: tuple[Registry, types.ModuleType]) -> None:
    reg, _ = mistakes
    cases, errors = collect_cases(reg, ["chanRms", "chanRmsOk"])
    assert not errors
    assert sorted((c.name, c.strategy) for c in cases) == [
        ("chanRms", ()), ("chanRms", (("layout", "nhwc"),)), ("chanRmsOk", ()), ("chanRmsOk", (("layout", "nhwc"),))]
    failures, lines = _verify(reg, "chanRms", "chanRmsOk")
    bad, ok = _rows(lines, "chanRms"), _rows(lines, "chanRmsOk")
    # the NHWC bug is red; the same layer reducing the right axis is green in both layouts
    assert failures == 1 and [ln.endswith("FAIL") for ln in bad] == [False, True], lines
    assert "[layout=nhwc]" in bad[1]
    assert len(ok) == 2 and all(ln.endswith("pass") for ln in ok), ok


class PerExampleTargets(MeanSquaredError):
    """Its labels one target per example, where its label_spec (mse's) says one per output."""

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: tuple[int, ...]) -> np.ndarray:
        return rng.standard_normal((batch,)).astype(np.float32)


class WideIds(CrossEntropy):
    """Its class ids int64, as a list: the ids themselves are right."""

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: tuple[int, ...]) -> list[int]:
        return super().sample_labels(rng, batch, out_shape).astype(np.int64).tolist()


def test_sample_labels_not_of_the_label_spec_is_refused_naming_the_loss() -> None:
    with pytest.raises(PluginError) as ei:
        gate_loss(PerExampleTargets(), (4,))
    assert str(ei.value) == ("loss 'mse': sample_labels(rng, 3, (4,)) returned float32 [3], expected float targets "
                             "[3, 4] (the batch, then the label shape its label_spec gives)")
    assert gate_loss(WideIds(), (5,)).passed
