"""pairTile (seed 001): the pair map's layout, its gate (green, and red for every broken VJP rule),
its refusals, and a small contact-map net that learns through a TrainSession."""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.core import modules
from hloforge.core.autodiff import inject_fault
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder
from hloforge.core.spec import Ctx, NetSpec, walk_layers
from hloforge.core.variant import Variant
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.norm import ConvBn
from hloforge.plugins.layers.pairtile import PairTile
from hloforge.testing import HEADER, gate_layer
from hloforge.testing.gate import _run as run
from hloforge.train.session import TrainSession, make_backend

CASES = PairTile.gate_cases()
IDS = [f"L={c.L},D={c.D},C={c.C},p={c.p}" for c, _ in CASES]


@pytest.mark.parametrize(("layer", "shape"), CASES, ids=IDS)
def test_pair_map_is_block_i_times_w_plus_block_j_times_wj_then_the_tail_planes(layer, shape):
    """out[b, c, r, s] = (x_i[b, r]·W)[c] + (x_j[b, s]·Wj)[c] for c < C; the next p channels are the
    row's tail [p, L, L] as laid out on the host. Written as loops, apart from the layer's reference."""
    L, D, C, p = layer.L, layer.D, layer.C, layer.p
    rng = np.random.default_rng(3)
    w, wj = rng.standard_normal((D, C)), rng.standard_normal((D, C))
    x = rng.standard_normal((2, *shape))
    got = run(modules.layers_forward_module([layer], shape, 2, dtype="f64"), [w, wj, x])[0]
    assert got.shape == (2, C + p, L, L)
    want = np.zeros_like(got)
    for b in range(2):
        for r in range(L):
            for s in range(L):
                xi = x[b, r * D:(r + 1) * D]  # residue r of block i
                xj = x[b, (L + s) * D:(L + s + 1) * D]  # residue s of block j
                for c in range(C):
                    want[b, c, r, s] = xi @ w[:, c] + xj @ wj[:, c]
                for q in range(p):
                    want[b, C + q, r, s] = x[b, 2 * L * D + (q * L + r) * L + s]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("layer", "shape"), CASES, ids=IDS)
def test_pairtile_gate_is_green(layer, shape):
    result = gate_layer(layer, shape)
    assert result.passed, f"\n{HEADER}\n{result.row()}"


def _tape_ops(layer: PairTile, shape: tuple[int, ...]) -> list[str]:
    b = Builder("f64")
    params = {s.name: b.arg(s.shape) for s in walk_layers([layer], shape)[0].slots}
    layer.forward(b, b.arg((2, *shape)), params, Ctx(train=True))
    return sorted({op.op for op in b.tape})


@pytest.mark.parametrize(("layer", "shape"), CASES, ids=IDS)
def test_pairtile_gate_goes_red_for_each_broken_vjp_rule(layer, shape):
    ops = _tape_ops(layer, shape)
    for must in ("dot_general", "broadcast_in_dim", "transpose", "slice", "reshape"):
        assert must in ops
    assert ("concatenate" in ops) == (layer.p > 0)
    for op in ops:
        with inject_fault(op) as calls:
            result = gate_layer(layer, shape)
        assert calls[0], f"the VJP rule of {op!r} never ran"
        assert not result.passed, f"gate stayed green with the VJP of {op!r} scaled by 1.001:\n{HEADER}\n{result.row()}"


def test_pairtile_params_are_two_glorot_projections():
    slots = walk_layers([PairTile(5, 3, 4, p=2)], (2 * 5 * 3 + 2 * 25,))[0].slots
    assert [(s.name, s.shape, s.init, s.decay) for s in slots] == [("w", (3, 4), "glorot", True),
                                                                   ("wj", (3, 4), "glorot", True)]


@pytest.mark.parametrize(("layer", "shape", "message"), [
    (PairTile(4, 3, 2), (23,), r"takes a flat row of 2·L·D = 24 = 24 values, got \[23\]"),
    (PairTile(4, 3, 2, p=1), (24,), r"2·L·D = 24 \+ p·L·L = 16 = 40 values, got \[24\]"),
    (PairTile(4, 3, 2), (2, 4, 3), r"got \[2, 4, 3\]"),
    (PairTile(0, 3, 2), (6,), "L must be positive, got 0"),  # (a [0] input is the spec's own refusal)
    (PairTile(4, 3, 0), (24,), "C must be positive, got 0"),
    (PairTile(4, 3, 2, p=-1), (8,), "p \\(pair planes\\) must be ≥ 0, got -1"),
])
def test_pairtile_refuses_a_row_of_the_wrong_length_in_one_line(layer, shape, message):
    with pytest.raises(UnsupportedSpec, match=message) as e:
        NetSpec("pairs", shape, [layer, Conv2d(2, k=1)], 2).walk()
    assert "\n" not in str(e.value)


def test_pairtile_spec_round_trips_through_toml(tmp_path):
    spec = NetSpec("pairs", (2 * 6 * 3 + 36,), [PairTile(6, 3, 8, p=1), ConvBn(4), Conv2d(2, k=1)], 2)
    path = tmp_path / "pairs.toml"
    path.write_text(spec.to_toml())
    assert NetSpec.from_file(str(path)) == spec


# ------------------------------------------------------------------ a contact-map net that learns
L, D, P = 8, 3, 1


def contact_batch(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Residues in contact when their first features are close or they are sequence neighbours;
    the one pair plane carries the sequence separation |i − j| / L."""
    f = rng.standard_normal((n, L, D))
    sep = np.abs(np.arange(L)[:, None] - np.arange(L)[None, :])
    contact = (np.abs(f[:, :, None, 0] - f[:, None, :, 0]) < 0.4) | (sep <= 1)[None]
    plane = np.broadcast_to(sep / L, (n, P, L, L))
    # both blocks carry the same residues: block i is read along rows, block j along columns
    x = np.concatenate([f.reshape(n, -1), f.reshape(n, -1), plane.reshape(n, -1)], axis=1)
    return x.astype(np.float32), contact.astype(np.int32)


def test_a_pairtile_contact_net_learns_on_xla():
    spec = NetSpec("contacts", (2 * L * D + P * L * L,),
                   [PairTile(L, D, 8, p=P), ConvBn(8), ConvBn(8), Conv2d(2, k=1)], 2)
    assert spec.walk()[-1].out_shape == (2, L, L)
    session = TrainSession(spec, Variant("adam", loss="perPixelCE"), 16, make_backend("xla"), seed=0)
    rng = np.random.default_rng(0)
    losses = [session.train_step(*contact_batch(rng, 16), 1e-2) for _ in range(150)]
    first, last = np.mean(losses[:5]), np.mean(losses[-10:])
    assert np.isfinite(losses).all()
    # well under ln 2, what predicting the ~even class prior everywhere scores
    assert last < 0.7 * first and last < 0.5, f"loss {first:.3f} → {last:.3f}"
