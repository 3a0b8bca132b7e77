"""Transformers: FlashAttention vs dense SDPA, RoPE, the gather embedding, the new builder ops,
the ViT / tinygpt zoo, the text dataset, and a language model that learns (issue #6).

The layers and the per-token loss are also gated through tests/test_gate.py (their gate_cases)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from hloforge.core import autodiff
from hloforge.core.errors import DataError, HloforgeWarning, UnsupportedSpec
from hloforge.core.hlo import Builder
from hloforge.core.spec import NetSpec, walk_layers
from hloforge.lowering.attention import flash_attention, flash_block, sdpa_dense
from hloforge.plugins.layers.attention import MultiHeadSelfAttention, apply_rope, ref_attention, ref_rope
from hloforge.plugins.layers.tokens import embed_rows
from hloforge.plugins.layers.transformer import PatchEmbed, TransformerBlock
from hloforge.zoo import get_net


def _jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def _run(text, inputs):
    from hloforge.backends.xla import default_client

    exe = default_client().compile(text)
    try:
        return [np.asarray(o) for o in exe.run(list(inputs))]
    finally:
        exe.close()


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


SHAPE = (2, 2, 8, 4)  # [B, H, N, dh]


def _qkv(dtype, shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


# ------------------------------------------------------------------ FlashAttention
@pytest.mark.parametrize("dtype, tol", [("f64", 1e-12), ("f32", 1e-6)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [2, 8])
def test_flash_forward_equals_dense_sdpa(dtype, tol, causal, block):
    npt = np.float64 if dtype == "f64" else np.float32
    b = Builder(dtype)
    q, k, v = (b.arg(SHAPE) for _ in range(3))
    text = b.module([flash_attention(b, q, k, v, causal, block), sdpa_dense(b, q, k, v, causal)])
    assert "stablehlo.while" in text and "stablehlo.dynamic_slice" in text
    flash, dense = _run(text, _qkv(npt))
    assert rel(flash, dense.astype(np.float64)) <= tol
    jax = _jax()
    ref = np.asarray(ref_attention(*(jax.numpy.asarray(a, np.float64) for a in _qkv(npt)), causal))
    assert rel(dense, ref) <= (1e-13 if dtype == "f64" else 1e-6)


@pytest.mark.parametrize("dtype, tol", [("f64", 1e-12), ("f32", 1e-5)])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_backward_matches_jax_vjp_of_dense_attention(dtype, tol, causal):
    jax = _jax()
    npt = np.float64 if dtype == "f64" else np.float32
    b = Builder(dtype)
    q, k, v = (b.arg(SHAPE) for _ in range(3))
    do = b.arg(SHAPE)
    o = flash_attention(b, q, k, v, causal, 4)
    cts = autodiff.grad(b, [o], [do], [q, k, v])
    text = b.module(cts)
    assert text.count("stablehlo.while") == 2  # the forward's loop and the recompute backward's
    assert "stablehlo.dynamic_update_slice" in text
    ins = _qkv(np.float64, seed=1)
    g = np.random.default_rng(2).standard_normal(SHAPE)
    got = _run(text, [a.astype(npt) for a in [*ins, g]])
    _, pull = jax.vjp(lambda q, k, v: ref_attention(q, k, v, causal), *ins)
    for a, r in zip(got, pull(g), strict=True):
        assert rel(a, np.asarray(r)) <= tol


def test_flash_backward_is_the_custom_rule():
    b = Builder("f64")
    q, k, v = (b.arg(SHAPE) for _ in range(3))
    flash_attention(b, q, k, v, False)
    assert [op.op for op in b.tape] == ["custom"]  # the loop itself is never differentiated


def test_flash_block_choice_and_refusals():
    assert flash_block(512) == 128 and flash_block(96) == 96 and flash_block(200) == 100 and flash_block(7) == 7
    assert flash_block(64, 16) == 16
    for n, blk in [(64, 48), (512, 256), (10, 3)]:
        with pytest.raises(UnsupportedSpec, match="divisor"):
            flash_block(n, blk)
    with pytest.raises(UnsupportedSpec, match="layer 0 .*divisor"):
        walk_layers([MultiHeadSelfAttention(2, attention="flash", block=3)], (8, 4))
    with pytest.raises(UnsupportedSpec, match="heads=3 must divide"):
        walk_layers([MultiHeadSelfAttention(3)], (8, 4))
    with pytest.raises(UnsupportedSpec, match="attention must be one of"):
        walk_layers([TransformerBlock(2, 8, attention="sparse")], (8, 4))


def test_while_has_no_vjp_rule():
    b = Builder("f64")
    x = b.arg((3,))
    _, y = b.while_([b.full(0, (), "i32"), x], lambda c, a: c.compare(a[0], c.full(2, (), "i32"), "LT"),
                    lambda c, a: [a[0] + c.full(1, (), "i32"), a[1] * 2.0])
    with pytest.raises(UnsupportedSpec, match="custom_vjp"):
        autodiff.grad(b, [y], [b.full(1.0, (3,))], [x])
    assert np.allclose(_run(b.module([y]), [np.ones(3)])[0], 4.0)


# ------------------------------------------------------------------ RoPE
def test_rope_and_its_vjp_rotation_by_minus_theta():
    jax = _jax()
    shape = (2, 3, 6, 8)
    b = Builder("f64")
    x = b.arg(shape)
    g = b.arg(shape)
    y = apply_rope(b, x, 100.0)
    (dx,) = autodiff.grad(b, [y], [g], [x])
    text = b.module([y, dx])
    assert "stablehlo.cosine" in text and "stablehlo.sine" in text  # tables built in-graph
    rng = np.random.default_rng(0)
    xv, gv = rng.standard_normal(shape), rng.standard_normal(shape)
    yv, dxv = _run(text, [xv, gv])
    ref, pull = jax.vjp(lambda a: ref_rope(a, 100.0), xv)
    assert rel(yv, np.asarray(ref)) <= 1e-13
    assert rel(dxv, np.asarray(pull(gv)[0])) <= 1e-13
    # a rotation: norms are kept, and the VJP undoes the forward
    assert np.allclose(np.linalg.norm(yv, axis=-1), np.linalg.norm(xv, axis=-1))
    back = _run(text, [xv, yv])[1]
    assert rel(back, xv) <= 1e-13
    # position 0 is not rotated
    assert np.allclose(yv[:, :, 0], xv[:, :, 0])


# ------------------------------------------------------------------ the gather embedding
def test_gather_embedding_backward_is_a_scatter_add():
    v, d, bsz, t = 5, 3, 2, 6
    b = Builder("f64")
    w = b.arg((v, d))
    ids = b.arg((bsz, t), "i32")
    g = b.arg((bsz, t, d))
    e = embed_rows(b, w, ids)
    (dw,) = autodiff.grad(b, [e], [g], [w])
    text = b.module([e, dw])
    assert '"stablehlo.gather"' in text and '"stablehlo.scatter"' in text
    assert f"tensor<{bsz}x{t}x{v}x" not in text  # no one-hot
    rng = np.random.default_rng(0)
    wv, gv = rng.standard_normal((v, d)), rng.standard_normal((bsz, t, d))
    iv = np.array([[0, 1, 1, 4, 4, 4], [2, 2, 0, 1, 4, 3]], np.int32)
    ev, dwv = _run(text, [wv, iv, gv])
    assert np.array_equal(ev, wv[iv])
    want = np.zeros((v, d))
    np.add.at(want, iv, gv)
    assert rel(dwv, want) <= 1e-15


def test_scatter_add_vjp_is_a_gather():
    b = Builder("f64")
    base = b.arg((4, 2))
    ids = b.arg((3, 1), "i32")
    upd = b.arg((3, 2))
    g = b.arg((4, 2))
    y = b.scatter_add(base, ids, upd, update_window_dims=[1], inserted_window_dims=[0],
                      scatter_dims_to_operand_dims=[0], index_vector_dim=1)
    dbase, dupd = autodiff.grad(b, [y], [g], [base, upd])
    rng = np.random.default_rng(0)
    bv, uv, gv = rng.standard_normal((4, 2)), rng.standard_normal((3, 2)), rng.standard_normal((4, 2))
    iv = np.array([[3], [0], [3]], np.int32)
    yv, dbv, duv = _run(b.module([y, dbase, dupd]), [bv, iv, uv, gv])
    want = bv.copy()
    np.add.at(want, iv[:, 0], uv)
    assert np.allclose(yv, want) and np.array_equal(dbv, gv) and np.array_equal(duv, gv[iv[:, 0]])


# ------------------------------------------------------------------ zoo
def test_vit_tiny_has_timms_parameter_count():
    spec = get_net("vit_tiny")
    assert spec.param_count() == 5_717_416
    assert spec.walk()[0].out_shape == (197, 192)


def test_tinygpt_nano_shape_and_count():
    spec = get_net("tinygpt-nano")
    assert spec.param_count() == 212_545
    assert spec.input_shape == (64,) and spec.walk()[-1].out_shape == (64, 65)
    flash = get_net("tinygpt-nano-flash")
    assert flash.param_count() == spec.param_count()
    assert get_net("tinygpt-tiny").walk()[-1].out_shape == (128, 65)


def test_vit_mini_fits_digits():
    spec = get_net("vit-mini")
    assert spec.input_shape == (1, 28, 28) and spec.walk()[0].out_shape == (17, 32)
    assert get_net("vit-mini", input=(3, 32, 32)).walk()[0].out_shape == (65, 32)


def test_patch_embed_refuses_a_patch_that_does_not_divide():
    with pytest.raises(UnsupportedSpec, match="patch 5 does not divide"):
        NetSpec("v", (1, 28, 28), [PatchEmbed(8, 5)], 8).walk()


def test_flash_and_dense_nets_compute_the_same_logits():
    from hloforge.core.modules import forward_module

    dense, flash = get_net("tinygpt-nano", input=(16,)), get_net("tinygpt-nano-flash", input=(16,))
    params = dense.init_params(0)
    x = np.random.default_rng(0).integers(0, 65, (2, 16)).astype(np.float32)
    a = _run(forward_module(dense, 2), [x, *params])[0]
    f = _run(forward_module(flash, 2), [x, *params])[0]
    assert rel(f, a) <= 1e-5


# ------------------------------------------------------------------ the text dataset
def test_text_dataset_vocab_windows_and_baseline(tmp_path):
    from hloforge.datasets.text import IGNORE, OTHER, VAL_FRACTION, Text, default_corpus

    d = Text()
    assert d.num_classes == 65 and len(d.chars) == 65 and d.chars[-1] == OTHER
    # the corpus is this interpreter's pydoc topics: 465,126 characters on 3.11.7, 466,175 on 3.11.2
    corpus = len(default_corpus())
    assert corpus > 400_000
    assert len(d.train_ids) == int(corpus * (1 - VAL_FRACTION)) and len(d.train_ids) + len(d.val_ids) == corpus
    x, y = d.arrays("train")
    assert x.shape[1] == 64 and x.dtype == np.float32 and y.dtype == np.int32
    assert np.array_equal(x[0, 1:], y[0, :-1]) and y[0, -1] == x[1, 0]
    xv, yv = d.arrays("test")
    scored = yv[yv != IGNORE]
    assert len(scored) == len(d.val_ids) - 1 and np.array_equal(scored, d.val_ids[1:])
    assert 2.5 < d.bigram_bits() < math.log2(65)
    f = tmp_path / "tiny.txt"
    f.write_text("héllo wörld " * 200, encoding="utf-8")
    small = Text(str(f), seq_len=8)
    assert small.decode(small.encode("héllo")) == "héllo"
    assert small.num_classes == 65
    with pytest.raises(DataError, match="too few"):
        Text(str(f), seq_len=5000)


def test_a_corpus_too_short_says_how_many_characters_it_needs(tmp_path):
    """It said 'too few for seq_len 64' and no more: the user had to guess the length that trains."""
    from hloforge.datasets.text import Text

    f = tmp_path / "c.txt"
    f.write_text("a" * 72, encoding="utf-8")
    with pytest.raises(DataError, match=r"has 72 characters, too few for seq_len 64: expected at least 73 "):
        Text(str(f), seq_len=64)
    f.write_text("a" * 73, encoding="utf-8")
    assert Text(str(f), seq_len=64).arrays("train")[0].shape == (1, 64)


def test_language_model_needs_a_token_dataset():
    from hloforge.train.trainer import Run, TrainConfig

    with pytest.raises(DataError, match="language model"):
        Run(TrainConfig(net="tinygpt-nano", data="digits"), log=lambda s: None, progress=False)


def test_a_seq_len_data_option_other_than_the_context_is_refused_not_overridden(tmp_path):
    """The windows are the net's context: a seq_len data option of another length was silently replaced."""
    from hloforge.train.trainer import Run, TrainConfig

    f = tmp_path / "c.txt"
    f.write_text("abcdefgh " * 40, encoding="utf-8")
    cfg = TrainConfig(net="tinygpt-nano", data="text", data_file=str(f), data_options=("seq_len=10",), batch=1)
    with pytest.raises(DataError, match=r"seq_len=10: .* its context, 64 tokens .* --input 10"):
        Run(cfg, log=lambda s: None, progress=False, directory=False)
    same = TrainConfig(net="tinygpt-nano", data="text", data_file=str(f), data_options=("seq_len=64",), batch=1)
    assert Run(same, log=lambda s: None, progress=False, directory=False).data.seq_len == 64


# ------------------------------------------------------------------ a language model learns
def test_tinygpt_trains_bits_per_char_drop_and_generates(tmp_path, backend):
    import json

    from hloforge.commands.generate import generate
    from hloforge.datasets.text import default_corpus
    from hloforge.train.trainer import TrainConfig, train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(default_corpus()[:24_000], encoding="utf-8")
    logs: list[str] = []
    cfg = TrainConfig(net="tinygpt-nano", data="text", data_file=str(corpus), epochs=3, batch=32, lr=3e-3,
                      backend=backend, run_dir=str(tmp_path / "run"))
    train(cfg, log=logs.append, progress=False)
    assert any("bigram baseline" in ln for ln in logs)
    rows = [json.loads(ln) for ln in open(tmp_path / "run" / "metrics.jsonl")]
    bpc = [r["val_bits_per_char"] for r in rows if r.get("kind") == "epoch"]
    assert len(bpc) == 3 and bpc[-1] < bpc[0] < math.log2(65)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a prompt of the vocabulary's characters: no word
        text = generate(str(tmp_path / "run"), prompt="def ", tokens=20, temperature=1.0)
    assert text.startswith("def ") and len(text) == 24
    # characters the corpus lacks were read as its other-character token without a word
    with pytest.warns(HloforgeWarning, match=r"^the prompt's '€', '✓' are not in the run's vocabulary of 64 "
                                             "characters: each is read as its other-character token$"):
        generate(str(tmp_path / "run"), prompt="✓ def €", tokens=2)


def test_flash_lm_train_step_runs_the_same_on_iree(tmp_path, monkeypatch):
    """while / gather / scatter / dynamic slices print as text IREE accepts too, with the same numbers."""
    pytest.importorskip("iree.compiler")
    pytest.importorskip("iree.runtime")
    from hloforge.core.variant import Variant
    from hloforge.train.session import TrainSession, make_backend

    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path))
    spec = get_net("tinygpt-nano-flash", input=(8,))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 65, (2, 8)).astype(np.float32)
    y = rng.integers(0, 65, (2, 8)).astype(np.int32)
    losses = {}
    for be in ("xla", "iree"):
        s = TrainSession(spec, Variant("adam", None, "tokenCrossEntropy"), 2, make_backend(be))
        losses[be] = [s.train_step(x, y, 1e-3) for _ in range(2)]
    assert np.allclose(losses["xla"], losses["iree"], rtol=1e-5)
    assert losses["xla"][1] < losses["xla"][0]


def _dots(text):
    """(lhs contracting axes, lhs type, rhs type) of every dot_general in a module's text."""
    import re

    pat = re.compile(r"dot_general .*contracting_dims = \[([\d, ]*)\] x \[[\d, ]*\] "
                     r": \((tensor<[^>]*>), (tensor<[^>]*>)\)")
    return [([int(a) for a in m[1].split(",")], m[2], m[3]) for m in map(pat.search, text.splitlines()) if m]


def test_token_projections_are_products_of_rows():
    """Dense and MHSA on tokens [B, N, D] multiply the B·N rows (on the 3-D form XLA's CPU compiler
    gathers ∂W's transposed operand element by element: dense.py)."""
    from hloforge.core.modules import vjp_module
    from hloforge.plugins.layers.dense import Dense

    for layers in ([Dense(6, act="gelu")], [MultiHeadSelfAttention(2)]):
        dots = _dots(vjp_module(layers, (5, 8), 3, target="xla"))
        projections = [d for d in dots if not d[1].startswith("tensor<3x2x")]  # not the heads' [B, H, ·, ·]
        assert len(projections) >= 3 and all(lhs.count("x") == rhs.count("x") == 2 for _, lhs, rhs in projections)


def test_layer_norm_dot_sums_equal_its_reduces_and_contract_the_left_operands_trailing_axes():
    from hloforge.core import strategy
    from hloforge.core.modules import vjp_module
    from hloforge.plugins.layers.transformer import LayerNormLast

    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((2, 3, 5, 8)).astype(np.float32) * 3 + 1
    gamma, beta = rng.standard_normal((2, 8)).astype(np.float32)
    outs = {}
    for sums in ("reduce", "dot"):
        with strategy.forced({"lnSums": sums}):
            text = vjp_module([LayerNormLast()], (5, 8), 3, target="xla")
        outs[sums] = _run(text, [gamma, beta, x, g])
        if sums == "dot":
            dots = _dots(text)
            assert len(dots) == 6  # Σx, Σ(x − μ)², then Σĝ, Σĝ·x̂ over D and Σḡ, Σḡ·x̂ over the rows
            for axes, lhs, _ in dots:  # the ones on the side that keeps XLA's product untransposed
                rank = lhs.count("x")
                assert axes == list(range(rank - len(axes), rank)), (axes, lhs)
    for a, b in zip(outs["reduce"], outs["dot"], strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
