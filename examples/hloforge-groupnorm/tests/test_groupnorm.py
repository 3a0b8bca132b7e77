"""The example plugin's own tests (tiny); `pytest --hloforge-gate` adds the gate of every registered plugin."""

from __future__ import annotations

import numpy as np
import pytest
from hloforge_groupnorm import SPEC, layers, losses
from hloforge_groupnorm.layers import GroupNorm
from hloforge_groupnorm.losses import Huber

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.modules import layers_forward_module
from hloforge.core.registry import Registry
from hloforge.core.spec import Ctx, NetSpec
from hloforge.testing import gate_layer, gate_loss


@pytest.fixture(scope="module")
def reg() -> Registry:
    # Installed: found through its entry points. Run from a source tree: registered by hand, as a test would.
    r = Registry()
    if "groupNorm" not in r.names("layer"):
        r = Registry(extra_plugins=((layers, "hloforge-groupnorm"), (losses, "hloforge-groupnorm")))
    return r


def test_registered_under_its_distribution(reg: Registry) -> None:
    assert reg.get("layer", "groupNorm") is GroupNorm
    assert reg.get("loss", "huber") is Huber
    assert reg.entry("layer", "groupNorm").distribution == "hloforge-groupnorm"
    assert reg.entry("loss", "huber").distribution == "hloforge-groupnorm"


def test_spec_file_loads_and_walks(reg: Registry) -> None:
    spec = NetSpec.from_file(SPEC, reg)
    shapes = [ls.out_shape for ls in spec.walk()]
    assert shapes[0] == (8, 14, 14) and shapes[-1] == (10,)
    assert sum(isinstance(layer, GroupNorm) for layer in spec.layers) == 2


def test_forward_runs_and_normalises() -> None:
    from hloforge.backends.xla import default_client

    layer = GroupNorm(groups=2)
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 3)) * 3 + 1
    exe = default_client().compile(layers_forward_module([layer], (4, 3, 3), 2, dtype="f64"))
    try:
        (y,) = exe.run([np.ones(4), np.zeros(4), x])
    finally:
        exe.close()
    y = np.asarray(y).reshape(2, 2, -1)  # γ=1, β=0: each (example, group) has mean 0 and variance ~1
    np.testing.assert_allclose(y.mean(axis=2), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=2), 1, rtol=1e-3)
    ref = np.asarray(layer.reference({"gamma": np.ones(4), "beta": np.zeros(4)}, x, Ctx()))
    np.testing.assert_allclose(y.reshape(x.shape), ref, atol=1e-5)  # jax computes in f32 here


def test_refusals() -> None:
    with pytest.raises(UnsupportedSpec, match="must be positive and divide the 6 channels"):
        GroupNorm(groups=4).out_shape((6, 2, 2))
    with pytest.raises(UnsupportedSpec, match=r"takes an image \[C, H, W\]"):
        GroupNorm(groups=1).out_shape((6,))
    with pytest.raises(UnsupportedSpec, match="delta must be positive"):
        Huber(delta=0.0)


def test_gate_passes_each_case() -> None:
    for layer, shape in GroupNorm.gate_cases():
        r = gate_layer(layer, shape)
        assert r.passed, r.row()
    for loss, shape in Huber.gate_cases():
        r = gate_loss(loss, shape)
        assert r.passed, r.row()
