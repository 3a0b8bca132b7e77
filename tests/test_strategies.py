"""Lowering strategies (core/strategy.py): the choice per target and its overrides, the NHWC
stretch of a net, and every choice's backward.

Each layer case is gated once per choice of each strategy kind the layer consults (f64 against
jax.vjp, finite differences, f32: tests/test_gate.py runs them all). Here: those strategy gates go
red for a broken written-out backward, whole train steps agree across forms, and the forms IREE
gets by default compute on IREE what the gated forms compute on XLA.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from iree_forms import layer_vjp_on_iree_and_xla

from hloforge.core import strategy
from hloforge.core.autodiff import inject_fault
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.modules import Storage, forward_module, host_declared, host_stored, train_step_module, vjp_module
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec, Shape
from hloforge.core.variant import Variant
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.dense import Dense, Flatten
from hloforge.plugins.layers.mobile import InvertedResidual
from hloforge.plugins.layers.norm import BatchNorm, ConvBn, DepthwiseConvBn
from hloforge.plugins.layers.pool import GlobalAvgPool, MaxPool
from hloforge.plugins.layers.residual import ResidualStage
from hloforge.testing.gate import HEADER, GateCase, gate_cases, gate_layer
from hloforge.train.session import make_backend
from hloforge.zoo import get_net

# conv (bias, relu) → max-pool → conv+BN → a strided residual stage with a projection → pool → dense:
# one NHWC stretch from the first conv to the global pool.
# (its residual stage's 2² conv, kernel 3× x at batch 4, is an im2col GEMM in XLA's winograd form)
SMALL = NetSpec("strategy-small", (2, 8, 8), [
    Conv2d(4, act="relu"), MaxPool(2), ConvBn(4), ResidualStage(6, n=1, stride=2), GlobalAvgPool(), Dense(3),
], 3)
# ... one that leaves the stretch through a flatten, in the public NCHW order
FLAT = NetSpec("strategy-flat", (1, 6, 6), [Conv2d(3, act="relu"), BatchNorm(), MaxPool(2), Flatten(), Dense(4)], 4)
# ... and one with depthwise convs (plain and in an inverted-residual block), strided and not
MOBILE = NetSpec("strategy-mobile", (2, 8, 8), [
    ConvBn(4, act="relu6"), DepthwiseConvBn(k=3, stride=2), Conv2d(4, groups=4, act="relu"),
    InvertedResidual(4, n=1, expand=2), GlobalAvgPool(), Dense(3),
], 3)
BOTH_NHWC = {"layout": "nhwc", "conv2d": "nhwc"}
WIDE = NetSpec("strategy-wide", (1, 3, 40), [Conv2d(4, act="relu"), BatchNorm(), Flatten(), Dense(3)], 3)
# ... and a small ViT (dense attention), for the attention backward's forms
ATTN = get_net("vit-mini", classes=3, input=(1, 8, 8))


def test_defaults_per_target() -> None:
    assert strategy.chosen("layout", "xla") == "nhwc" and strategy.chosen("convGrad", "xla") == "winograd"
    assert strategy.chosen("conv2d", "iree") == "nhwc" and strategy.chosen("layout", "iree") == "nhwc"
    assert strategy.chosen("convGrad", "iree") == "written"
    assert strategy.chosen("conv2d", None) == "nchw"  # no target: the portable form, every kind's first choice
    assert strategy.target_of(make_backend("xla")) == "xla"


def test_forced_and_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    with strategy.forced({"conv2d": "nhwc"}):
        assert strategy.chosen("conv2d", "xla") == "nhwc"
        with strategy.forced({"layout": "nhwc"}):  # nested: both
            assert strategy.chosen("layout", None) == "nhwc" and strategy.chosen("conv2d", None) == "nhwc"
    assert strategy.chosen("conv2d", "xla") == "nchw"
    monkeypatch.setenv(strategy.ENV_VAR, "conv2d=nhwc, layout=nhwc")
    assert strategy.chosen("conv2d", "xla") == "nhwc" and strategy.chosen("layout", "xla") == "nhwc"
    with strategy.forced({"conv2d": "nchw"}):  # a context override wins over the environment
        assert strategy.chosen("conv2d", "iree") == "nchw"


@pytest.mark.parametrize(("choices", "message"), [
    ({"conv2d": "winograd"}, "expected one of ['nchw', 'nhwc']"),
    ({"convolution": "nhwc"}, "unknown strategy kind 'convolution'"),
])
def test_bad_choice_is_one_clear_error(choices: dict[str, str], message: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnsupportedSpec, match=re.escape(message)):
        with strategy.forced(choices):
            pass
    monkeypatch.setenv(strategy.ENV_VAR, ",".join(f"{k}={v}" for k, v in choices.items()))
    with pytest.raises(UnsupportedSpec, match=re.escape(message)):
        strategy.chosen("conv2d", "xla")
    with pytest.raises(UnsupportedSpec) as e:  # the variable named, as for a choice of a known kind
        strategy.chosen("conv2d", "xla")
    assert str(e.value).startswith(f"{strategy.ENV_VAR}: ") and message in str(e.value)
    monkeypatch.setenv(strategy.ENV_VAR, "conv2d")
    with pytest.raises(UnsupportedSpec, match="expected kind=choice"):
        strategy.chosen("conv2d", "xla")


def _step_text(spec: NetSpec, target: str | None, choices: dict[str, str] | None = None) -> str:
    with strategy.forced(choices or {}):
        return train_step_module(spec, Variant("adam"), 4, target=target)[0]


def test_xla_renders_what_it_always_rendered() -> None:
    """The target reaches a render only through the strategy kinds: with every kind whose XLA
    default is not its portable form forced to that form (max pools among them, pool.py; the
    update in the backward sweep), a net renders for XLA exactly what it renders for no target."""
    portable = {k.name: k.choices[0] for k in strategy.kinds().values() if k.default("xla") != k.choices[0]}
    assert "maxPool" in portable
    assert _step_text(SMALL, "xla", portable) == _step_text(SMALL, None)
    assert _step_text(SMALL, "xla") != _step_text(SMALL, None)
    # XLA's barriers are the in-backward update's (one per parameter) and the blocked sums' (between their
    # stages); IREE's conv transposes take none there
    assert "stablehlo.optimization_barrier" in _step_text(SMALL, "xla", {"update": "after_backward"})
    unstaged = {"update": "after_backward", "sums": "plain", "bnReduce": "twoPass"}
    assert "stablehlo.optimization_barrier" not in _step_text(SMALL, "xla", unstaged)


@pytest.mark.parametrize("target", ["xla", "iree"])
def test_a_plan_of_the_defaults_renders_what_no_plan_renders(target: str) -> None:
    """The per-layer hook (strategy.tuned, emit_layers' in_layer) changes nothing unless a plan
    chooses otherwise: every layer given its target's default choice of every per-layer kind it
    may consult renders byte for byte what the untuned render gives."""
    for spec in (SMALL, MOBILE):
        plain, plain_eval = _step_text(spec, target), forward_module(spec, 4, eval_mode=True, target=target)
        kinds = [k for k in strategy.kinds().values() if k.per_layer]
        plan = {(ls.layer, ls.in_shape): {k.name: k.default(target) for k in kinds} for ls in spec.walk()}
        with strategy.tuned(plan):
            assert _step_text(spec, target) == plain
            assert forward_module(spec, 4, eval_mode=True, target=target) == plain_eval
        with strategy.tuned({}):
            assert _step_text(spec, target) == plain


def test_iree_render_transposes_once_at_each_edge() -> None:
    assert "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]" in _step_text(SMALL, "iree")  # NHWC / HWIO convolutions
    # the image enters NHWC once and stays NHWC through every layer (the global pool ends the stretch)
    text = forward_module(SMALL, 4, target="iree")
    assert text.count("dims = [0, 2, 3, 1]") == 1 and text.count("dims = [0, 3, 1, 2]") == 0
    # ... or leaves it once, before the flatten, so the dense layer sees the public NCHW order
    flat = forward_module(FLAT, 4, target="iree")
    assert flat.count("dims = [0, 2, 3, 1]") == 1 and flat.count("dims = [0, 3, 1, 2]") == 1


def _one_step(backend: object, text: str, spec: NetSpec, seed: int = 0, storage: Storage = ()) -> list[np.ndarray]:
    """θ', state', loss and batch statistics of one Adam step from spec's init on a fixed batch
    (θ and state carried as `storage` says: a target's render, `TrainStepLayout.storage`)."""
    lay = train_step_module(spec, Variant("adam"), 4)[1]
    opt = Variant("adam").make_optimizer(default_registry())
    rng = np.random.default_rng(seed)
    init = spec.init_params(seed)
    state = [opt.init_state(s)[k] for k in lay.state for _, s in lay.params]
    x = rng.standard_normal(lay.x_shape).astype(np.float32)
    y = rng.integers(0, spec.num_classes, lay.y_shape).astype(np.int32)
    host = [*host_stored([*init, *state], storage), Variant("adam").state_layout(opt).host_schedule(opt, 1, 1e-2), x, y]
    be = backend
    outs = be.execute(be.compile(text), [be.to_device(np.asarray(a)) for a in host])  # type: ignore[attr-defined]
    got = [np.asarray(be.to_host(o), np.float64) for o in outs]  # type: ignore[attr-defined]
    return [*host_declared(got[:lay.n_carried], storage), *got[lay.n_carried:]]


def _rel(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.linalg.norm(p - q) / max(np.linalg.norm(q), 1e-30)) for p, q in zip(a, b, strict=True))


def _rel_step(got: list[np.ndarray], want: list[np.ndarray], spec: NetSpec) -> float:
    """The worst relative gap of one train step's θ', each optimizer state group, the loss and the
    batch statistics, each group taken as one vector: a γ whose gradient is structurally ~0 (a BN
    after a per-channel linear map) has Adam moments of pure rounding noise on its own."""
    lay = train_step_module(spec, Variant("adam"), 4)[1]
    n = lay.n_params
    bounds = [*range(0, lay.n_carried + 1, n), lay.loss_index + 1, len(want)]
    groups = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]

    def flat(xs: list[np.ndarray], a: int, b: int) -> np.ndarray:
        return np.concatenate([x.ravel() for x in xs[a:b]])

    return _rel([flat(got, a, b) for a, b in groups], [flat(want, a, b) for a, b in groups])


@pytest.mark.parametrize(("spec", "choices"), [
    *((net, c) for net in (SMALL, FLAT) for c in ({"conv2d": "nhwc"}, {"layout": "nhwc"}, BOTH_NHWC)),
    (MOBILE, {"depthwise": "shifted"}), (MOBILE, {"depthwise": "shifted", "layout": "nhwc"}), (MOBILE, BOTH_NHWC),
    *((net, {**c, "convGrad": "autodiff"}) for net in (SMALL, FLAT, MOBILE) for c in ({"layout": "nhwc"}, BOTH_NHWC)),
    (MOBILE, {"layout": "nhwc", "pointwise": "dot"}),
    *((net, {"maxPool": p, "bnReduce": "fused", **nhwc}) for net in (SMALL, FLAT) for p in ("select", "window")
      for nhwc in ({}, BOTH_NHWC)),
], ids=str)
def test_train_step_agrees_across_forms(spec: NetSpec, choices: dict[str, str]) -> None:
    xla = make_backend("xla")
    want = _one_step(xla, _step_text(spec, None), spec)
    got = _one_step(xla, _step_text(spec, None, choices), spec)
    assert _rel_step(got, want, spec) < 1e-5


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_blocked_broadcast_sums_give_the_same_step(layout: str) -> None:
    """sums=blocked (XLA's default): the sums autodiff takes for a broadcast's gradient (here the
    conv's bias, over an image 40 wide) go in blocks of 20 first; the train step (BN blocked too)
    is the one-sum step's to rounding."""
    plain = _step_text(WIDE, None, {"layout": layout})
    blocked = _step_text(WIDE, None, {"layout": layout, "sums": "blocked"})
    barriers = plain.count("optimization_barrier")  # (none but the written NHWC conv's kernel transpose)
    assert blocked.count("optimization_barrier") == barriers + 1
    both = _step_text(WIDE, None, {"layout": layout, "sums": "blocked", "bnReduce": "blocked"})
    assert both.count("optimization_barrier") == barriers + 5  # and BN's Σx, Σ(x − μ)², Σḡ, Σḡ·x̂
    xla = make_backend("xla")
    want = _one_step(xla, plain, WIDE)
    for text in (blocked, both):
        assert _rel_step(_one_step(xla, text, WIDE), want, WIDE) < 1e-5


# ------------------------------------------------------------------ the gate covers every choice
def _cases(name: str) -> list[GateCase]:
    return gate_cases(names=[name])


def test_gate_runs_each_case_under_each_choice() -> None:
    conv = _cases("conv2d")
    base = [c for c in conv if not c.strategy]
    for forced in (("conv2d", "nhwc"), ("layout", "nhwc")):
        assert len([c for c in conv if c.strategy == (forced,)]) == len(base)
    # ... and as each target renders it: XLA's NHWC convs with the chunked ∂w, IREE's written out
    xla_default = {("convGrad", "winograd"), ("layout", "nhwc")}
    assert len([c for c in conv if xla_default <= set(c.strategy) and len(c.strategy) > 1]) == len(base)
    iree = (("conv2d", "nhwc"), ("layout", "nhwc"))  # (+ depthwise=shiftedSmall or pointwise=dot where it applies)
    iree_forms = (iree, (*iree, ("depthwise", "shiftedSmall")), (*iree, ("pointwise", "dot")))
    assert len([c for c in conv if c.strategy in iree_forms]) == len(base)
    # depthwise=shifted only where the conv is depthwise (three cases of conv2d's, every depthwiseConvBn's)
    assert [c.obj.stride for c in conv if c.strategy == (("depthwise", "shifted"),)] == [1, 2, 3]
    dw = _cases("depthwiseConvBn")
    assert len([c for c in dw if c.strategy == (("depthwise", "shifted"),)]) == len([c for c in dw if not c.strategy])
    bn = _cases("batchNorm")
    # layout=nhwc only where the case is an image (BN on [C] renders the same module either way)
    laid_out = [c for c in bn if c.strategy == (("layout", "nhwc"),)]
    images = {(3, 4, 5), (2, 3, 40)}
    assert {c.shape for c in laid_out} == images
    assert all(c.id.endswith(("~layout=nhwc", "~layout=nhwc#eval")) for c in laid_out)
    assert {c.shape for c in bn if c.strategy == (("layout", "nhwc"), ("bnReduce", "fused"))} == images  # IREE's
    assert {c.shape for c in bn if c.strategy == (("layout", "nhwc"), ("bnReduce", "blocked"))} == images  # XLA's
    # ... every other choice of every kind on every case (bnReduce, maxPool: pool.py, norm.py)
    for form in ("fused", "blocked"):
        assert {c.shape for c in bn if c.strategy == (("bnReduce", form),)} == {*images, (6,)}
    pools = _cases("maxPool")
    plain = len([c for c in pools if not c.strategy])
    assert all(len([c for c in pools if c.strategy == (("maxPool", f),)]) == plain for f in ("select", "window"))


def _pick(name: str, forced: tuple[tuple[str, str], ...], shape: Shape) -> GateCase:
    return next(c for c in _cases(name) if c.strategy == forced and c.shape == shape and c.mode == "train")


@pytest.mark.parametrize(("name", "forced", "shape"), [
    ("conv2d", (("conv2d", "nhwc"),), (2, 7, 7)),
    ("conv2d", (("layout", "nhwc"),), (2, 6, 5)),
    ("depthwiseConvBn", (("layout", "nhwc"),), (2, 4, 4)),
])
def test_broken_written_out_backward_turns_the_gate_red(name: str, forced: tuple[tuple[str, str], ...],
                                                        shape: Shape) -> None:
    case = _pick(name, forced, shape)
    assert case.run().passed
    with inject_fault("custom") as calls:
        result = case.run()
    assert calls[0] > 0
    assert not result.passed, f"\n{HEADER}\n{result.row()}"
    with inject_fault("convolution") as calls:  # the NHWC form has no autodiff convolution to break
        case.run()
    assert calls[0] == 0


XLA_FORMS = (("layout", "nhwc"), ("convGrad", "winograd"))  # XLA's default combination


@pytest.fixture
def chunk_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """convGrad=chunked splits ∂w only on images of ≥ 14² pixels, into chunks sized to the cache;
    the gate's cases (batch 2, a few pixels) take the chunked path only with the thresholds
    lowered: chunks of one."""
    from hloforge.lowering import conv

    monkeypatch.setattr(conv, "DW_CHUNK_BYTES", 1)
    monkeypatch.setattr(conv, "DW_CHUNK_MIN_PIXELS", 1)


@pytest.mark.parametrize("name", ["conv2d", "convBn"])
def test_chunked_kernel_gradient_is_gated_and_a_broken_one_turns_it_red(chunk_everything: None, name: str) -> None:
    cases = [c for c in _cases(name) if set(XLA_FORMS) <= set(c.strategy)]  # (a depthwise one: shifted too)
    assert cases and len(cases) == len([c for c in _cases(name) if not c.strategy])
    for case in cases:  # f64 against jax.vjp of the reference and finite differences, then f32
        result = case.run()
        assert result.passed, f"\n{HEADER}\n{result.row()}"
    with inject_fault("custom") as calls:  # the chunked backward is a custom VJP: break it, the gate sees it
        result = cases[0].run()
    assert calls[0] > 0 and not result.passed


def test_chunked_kernel_gradient_of_a_batch_the_chunks_do_not_divide_is_gated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The looped ∂w sums the whole chunks in its while loop and the rest after it. The gate's batch of 2
    in chunks of one (chunk_everything) leaves no rest: chunks of two at batch 3 leave one example
    after the loop, whose ∂w must be in the sum."""
    from hloforge.lowering import conv

    monkeypatch.setattr(conv, "dw_chunk", lambda x_shape, g_shape, dtype: 2)
    cases = [c for c in _cases("conv2d") if set(XLA_FORMS) <= set(c.strategy) and c.shape in ((3, 6, 6), (2, 7, 7))
             and c.obj.groups == 1]
    assert len(cases) == 2
    for case in cases:
        with strategy.forced(dict(case.strategy)):
            assert "stablehlo.while" in vjp_module([case.obj], case.shape, 3)  # the looped ∂w
            result = gate_layer(case.obj, case.shape, batch=3)
        assert result.passed, f"\n{HEADER}\n{result.row()}"


def test_flipped_data_input_gradient_is_gated_and_a_broken_one_turns_it_red(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a stride-1 conv's kernel outweighs its activations, the chunked and winograd forms (XLA's) take ∂x
    on flipped ḡ with an unflipped kernel. Its gate case (asymmetric padding) passes as XLA renders
    it, and leaving out the final flip turns it red."""
    from hloforge.lowering import conv

    assert conv.flips_data_for_dx((32, 4, 4, 512), (3, 3, 512, 512), 1, 1)  # resnet18-cifar's last stage (Winograd's)
    assert not conv.flips_data_for_dx((32, 32, 32, 64), (3, 3, 64, 64), 1, 1)  # ... and its first
    assert not conv.flips_data_for_dx((32, 4, 4, 512), (3, 3, 512, 512), 2, 1)
    assert not conv.flips_data_for_dx((32, 4, 4, 512), (3, 3, 256, 512), 1, 2)
    case = next(c for c in _cases("conv2d") if c.shape == (8, 3, 4) and c.strategy == XLA_FORMS
                and c.mode == "train")
    assert case.run().passed
    real = conv._conv_dx_flipping_data

    def unflipped(b, g, w, pads):  # type: ignore[no-untyped-def]
        dx = real(b, g, w, pads)
        return b.reverse(dx, [1, 2])  # undoes the last flip

    monkeypatch.setattr(conv, "_conv_dx_flipping_data", unflipped)
    result = case.run()
    assert not result.passed, f"\n{HEADER}\n{result.row()}"


def test_strided_input_gradient_by_phases_is_gated_and_a_broken_one_turns_it_red(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunked and winograd forms (XLA's) take a strided conv's ∂x as one GEMM summed by output phase, never
    as a convolution over ḡ dilated by zeros. Its gate cases (stride 2, "valid" on 7×7 and "same"
    on 6×5: a short last phase) pass as XLA renders them; a tap read from its neighbour's block of
    the GEMM turns them red."""
    from hloforge.lowering import conv

    cases = [c for c in _cases("conv2d") if c.shape in ((2, 7, 7), (2, 6, 5)) and c.strategy == XLA_FORMS
             and c.mode == "train"]
    assert len(cases) == 2
    for case in cases:
        with strategy.forced(dict(XLA_FORMS)):
            text = vjp_module([case.obj], case.shape, 2)
        assert set(re.findall(r"lhs_dilate = \[([\d, ]*)\]", text)) == {"1, 1"}  # no ḡ dilated by zeros
        assert case.run().passed
    real = conv._dx_by_phases

    def shifted_blocks(b, g, hw, k, stride, pads, layout, channels, term):  # type: ignore[no-untyped-def]
        return real(b, g, hw, k, stride, pads, layout, channels,
                    lambda gp, i, j, start, limit: term(gp, (i + 1) % k, j, start, limit))

    monkeypatch.setattr(conv, "_dx_by_phases", shifted_blocks)
    for case in cases:
        result = case.run()
        assert not result.passed, f"\n{HEADER}\n{result.row()}"


def test_strided_pointwise_conv_is_one_gemm_gated_and_a_broken_one_turns_it_red(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1×1, unpadded conv of stride 2 (a ResNet's shortcut) is, in the chunked and winograd forms, the GEMM of
    every second pixel: no convolution is rendered, the gate passes, and the GEMM over the wrong
    pixels turns it red."""
    from hloforge.lowering import conv

    assert conv.is_strided_pointwise(1, 2, 1, [(0, 0), (0, 0)])
    assert not conv.is_strided_pointwise(1, 1, 1, [(0, 0), (0, 0)])  # stride 1: the pointwise kind's
    assert not conv.is_strided_pointwise(1, 2, 1, [(1, 1), (1, 1)])
    assert not conv.is_strided_pointwise(3, 2, 1, [(0, 0), (0, 0)])
    case = next(c for c in _cases("conv2d") if c.shape == (3, 5, 6) and c.strategy == XLA_FORMS
                and c.mode == "train")
    with strategy.forced(dict(XLA_FORMS)):
        text = vjp_module([case.obj], case.shape, 2)
    assert "stablehlo.convolution" not in text and "stablehlo.dot_general" in text
    assert case.run().passed
    real = conv.pointwise_dot

    def odd_pixels(b, x, w):  # type: ignore[no-untyped-def]
        n, h, wd, c = x.shape
        shifted = b.pad(b.slice(x, [0, 1, 1, 0], [n, h, wd, c]), [0, 0, 0, 0], [0, 1, 1, 0])
        return real(b, shifted, w)

    monkeypatch.setattr(conv, "pointwise_dot", odd_pixels)
    result = case.run()
    assert not result.passed, f"\n{HEADER}\n{result.row()}"


def test_im2col_gemm_conv_is_gated_and_a_broken_one_turns_it_red(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a conv's kernel is at least twice its input, the chunked and winograd forms (XLA's) run it as one
    im2col GEMM with autodiff's backward. Its gate case (stride 2, padding (0, 1)) renders no
    convolution and passes as XLA renders it; taps laid out against the kernel's order turn it red."""
    from hloforge.lowering import conv

    assert conv.gemm_outruns_conv((32, 4, 4, 512), (3, 3, 512, 512), 1)  # resnet18-cifar's last stage (Winograd's)
    assert conv.gemm_outruns_conv((32, 8, 8, 256), (3, 3, 256, 512), 1)  # ... and the stride-2 conv into it
    assert not conv.gemm_outruns_conv((32, 8, 8, 256), (3, 3, 256, 256), 1)  # the stage before: the conv's
    assert not conv.gemm_outruns_conv((32, 4, 4, 512), (1, 1, 512, 512), 1)  # pointwise: its own kind
    assert not conv.gemm_outruns_conv((32, 4, 4, 512), (3, 3, 256, 512), 2)
    case = next(c for c in _cases("conv2d") if c.shape == (4, 4, 4) and c.strategy == XLA_FORMS)
    with strategy.forced(dict(XLA_FORMS)):
        text = vjp_module([case.obj], case.shape, 2)
    assert "stablehlo.convolution" not in text and "stablehlo.dot_general" in text
    assert case.run().passed
    real = conv._shifted_taps

    def reversed_taps(*args):  # type: ignore[no-untyped-def]
        return dict(reversed(real(*args).items()))

    monkeypatch.setattr(conv, "_shifted_taps", reversed_taps)
    result = case.run()
    assert not result.passed, f"\n{HEADER}\n{result.row()}"


def _winograd_shaped_cases() -> list:
    """The train-mode gate cases of conv2d and convBn in XLA's forms with an ungrouped 3×3 stride-1
    conv: Winograd's, whatever their width, once the width rule is lowered to 1."""
    return [c for name in ("conv2d", "convBn") for c in _cases(name)
            if set(XLA_FORMS) <= set(c.strategy) and c.mode == "train" and getattr(c.obj, "k", 0) == 3
            and getattr(c.obj, "stride", 0) == 1 and getattr(c.obj, "groups", 1) == 1]


def test_winograd_conv_is_gated_and_a_broken_one_turns_it_red(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3×3 stride-1 conv of 64 channels or more a side is, in the winograd form (XLA's), Winograd's
    F(2×2, 3×3): three transform products and one batched GEMM forward, no convolution. Its gate case
    (odd sizes: the 2×2 tiles cropped) passes, and so does every 3×3 stride-1 conv case of conv2d and
    convBn in the Winograd form (the width rule lowered to 1: "same" and "valid" padding, with and
    without BN). A wrong entry in the input or the output transform, or the transforms' written
    adjoints off by 0.1%, turn them red."""
    from hloforge.lowering import conv, winograd

    assert conv.takes_winograd((3, 3, 64, 64), 1, 1)  # resnet18-cifar's stages, mnist-cnn's last conv
    assert not conv.takes_winograd((3, 3, 32, 64), 1, 1)  # ... not mnist-cnn's third
    assert not conv.takes_winograd((3, 3, 128, 256), 2, 1)
    assert not conv.takes_winograd((3, 3, 128, 128), 1, 2)
    assert not conv.takes_winograd((5, 5, 128, 128), 1, 1)
    wide = next(c for c in _cases("conv2d") if c.shape == (64, 3, 5) and c.strategy == XLA_FORMS)
    with strategy.forced(dict(XLA_FORMS)):
        text = vjp_module([wide.obj], wide.shape, 2)
    # forward 4, backward 5: the output transform's, ∂V and ∂U, the input and kernel transforms'
    assert "stablehlo.convolution" not in text and text.count("stablehlo.dot_general") == 4 + 5
    assert wide.run().passed
    monkeypatch.setattr(conv, "WINOGRAD_MIN_CHANNELS", 1)
    small = [c for c in _winograd_shaped_cases() if c.shape != wide.shape]
    assert len(small) >= 3
    for case in small:  # (the wide case renders the same under the lowered rule: run above)
        result = case.run()
        assert result.passed, f"\n{HEADER}\n{result.row()}"
    for name in ("B_T", "A_T"):
        with monkeypatch.context() as m:
            matrix = [list(row) for row in getattr(winograd, name)]
            matrix[1][2] = -matrix[1][2]
            m.setattr(winograd, name, matrix)
            for case in [wide, small[0]]:
                result = case.run()
                assert not result.passed, f"{name} broken\n{HEADER}\n{result.row()}"
    for case in [wide, small[0]]:
        with inject_fault("custom") as calls:
            result = case.run()
        assert calls[0] > 0 and not result.passed, f"adjoints broken\n{HEADER}\n{result.row()}"


def test_winograd_recomputing_its_transformed_image_is_gated_and_a_broken_one_turns_it_red(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A transformed image V of RECOMPUTED_MIN_BYTES or more is computed again in the backward, from
    2x (XLA's CSE would fold a plain recomputation back into the forward's V), its ∂U halved: one
    input transform product and two multiplies more than the form that holds V. Every Winograd gate
    case passes in that form (the size rule lowered to 0); ∂U left doubled, or the recomputed V
    left unscaled, turns them red."""
    from hloforge.lowering import conv, winograd

    monkeypatch.setattr(conv, "WINOGRAD_MIN_CHANNELS", 1)
    cases = _winograd_shaped_cases()
    assert len(cases) >= 4
    with strategy.forced(dict(XLA_FORMS)):
        held = vjp_module([cases[0].obj], cases[0].shape, 2)
        monkeypatch.setattr(winograd, "RECOMPUTED_MIN_BYTES", 0)
        again = vjp_module([cases[0].obj], cases[0].shape, 2)
    # the input transform's product twice (forward, backward), 2x and ∂U's halving the two multiplies more
    assert again.count("stablehlo.dot_general") == held.count("stablehlo.dot_general") + 1
    assert again.count("stablehlo.multiply") == held.count("stablehlo.multiply") + 2
    for case in cases:
        result = case.run()
        assert result.passed, f"\n{HEADER}\n{result.row()}"
    real = winograd._products_recomputing_v

    def doubled(b, v, u, scaled_v, unscale):  # type: ignore[no-untyped-def]
        return real(b, v, u, scaled_v, 1.0)

    def unscaled(b, v, u, scaled_v, unscale):  # type: ignore[no-untyped-def]
        return real(b, v, u, lambda: scaled_v() * 0.5, unscale)

    for broken in (doubled, unscaled):
        with monkeypatch.context() as m:
            m.setattr(winograd, "_products_recomputing_v", broken)
            result = cases[0].run()
        assert not result.passed, f"{broken.__name__}\n{HEADER}\n{result.row()}"


def test_shifted_depthwise_backward_is_gated_and_a_broken_one_turns_it_red() -> None:
    """depthwise=shifted (XLA's default) differentiates in closed form: its ∂x, ∂w face the gate in
    both layouts, at stride 1 and 2 (depthwiseConvBn's cases), and breaking it turns the gate red."""
    cases = [c for name in ("conv2d", "depthwiseConvBn") for c in _cases(name)
             if ("depthwise", "shifted") in c.strategy]
    assert {dict(c.strategy).get("layout", "nchw") for c in cases} == {"nchw", "nhwc"}
    assert {c.obj.stride for c in cases if c.name == "depthwiseConvBn"} == {1, 2}
    _pass_then_break_the_plain_conv(cases)


def _pass_then_break_the_plain_conv(cases: list[GateCase]) -> GateCase:
    """Every case passes the gate (f64 against jax.vjp of the reference and finite differences,
    then f32); with the custom VJPs broken, the plain conv2d train case (no BN: its only custom
    VJP is the form under test) fails it. Returns that case."""
    for case in cases:
        result = case.run()
        assert result.passed, f"\n{HEADER}\n{result.row()}"
    plain = next(c for c in cases if c.name == "conv2d" and c.mode == "train")
    with inject_fault("custom") as calls:
        result = plain.run()
    assert calls[0] > 0 and not result.passed
    return plain


def test_pointwise_dot_backward_is_gated_and_a_broken_one_turns_it_red() -> None:
    """pointwise=dot (XLA's default): a 1×1 stride-1 ungrouped unpadded NHWC conv as a GEMM with a
    closed-form backward. Only such convs consult it; their cases face the gate as XLA renders them,
    and breaking the closed form turns the gate red."""
    from hloforge.plugins.layers.conv import Conv2d
    from hloforge.plugins.layers.norm import ConvBn

    assert "pointwise" in Conv2d(4, k=1).strategies_for((3, 5, 5))
    for other in (Conv2d(4, k=1, stride=2), Conv2d(4, k=1, pad=1), Conv2d(4, k=1, groups=2), Conv2d(4, k=3)):
        assert "pointwise" not in other.strategies_for((4, 5, 5))
    assert "pointwise" in ConvBn(4, k=1).strategies_for((3, 5, 5))
    assert "pointwise" not in ConvBn(4, k=3).strategies_for((3, 5, 5))
    cases = [c for name in ("conv2d", "convBn") for c in _cases(name)
             if ("pointwise", "dot") in c.strategy and ("layout", "nhwc") in c.strategy]
    assert {c.name for c in cases} == {"conv2d", "convBn"}
    plain = _pass_then_break_the_plain_conv(cases)
    with inject_fault("convolution") as calls:  # no convolution left in it
        plain.run()
    assert calls[0] == 0


@pytest.mark.parametrize("form", ["closed", "untransposed"])
def test_closed_form_attention_backward_is_gated_and_a_broken_one_turns_it_red(form: str) -> None:
    """sdpaGrad=closed (IREE's default) and =untransposed (XLA's): dense attention differentiated by
    FlashAttention's closed form over one key block. The registry's dense case faces the gate under
    each; so do plain ones (no RoPE, whose own custom VJP would hide which one broke), and breaking it
    turns them red."""
    from hloforge.plugins.layers.attention import MultiHeadSelfAttention

    chosen = (("sdpaGrad", form),)
    forced = [c for c in _cases("mhsa") if c.strategy]
    registered = [c for c in forced if c.strategy == chosen]
    assert registered and all(c.obj.attention == "dense" for c in forced if ("sdpaGrad", form) in c.strategy)
    assert all(c.strategy == (("tokenProduct", "rows"),) for c in forced  # flash consults only its projections'
               if c.obj.attention == "flash")
    plain = [GateCase("layer", "mhsa", MultiHeadSelfAttention(2, causal=causal), (5, 4), "hloforge", strategy=chosen)
             for causal in (False, True)]
    for case in [*registered, *plain]:  # f64 against jax.vjp of the reference and finite differences, then f32
        result = case.run()
        assert result.passed, f"\n{HEADER}\n{result.row()}"
    # a train step in it has autodiff's gradients: Adam's first moment is (1 − β1)·∂θ (θ' would not
    # do: the key bias's gradient is 0 in exact arithmetic, and Adam scales its rounding to ±lr)
    xla = make_backend("xla")
    lay = train_step_module(ATTN, Variant("adam"), 4)[1]
    first_moment = slice(lay.n_params, 2 * lay.n_params)
    autodiff = {"sdpaGrad": "autodiff"}
    text = _step_text(ATTN, None, dict(chosen))
    assert text != _step_text(ATTN, None, autodiff)  # it is another form
    got, want = _one_step(xla, text, ATTN), _one_step(xla, _step_text(ATTN, None, autodiff), ATTN)
    assert _rel(got[first_moment], want[first_moment]) < 1e-5
    assert _rel([got[lay.loss_index]], [want[lay.loss_index]]) < 1e-6
    for case in plain:
        with inject_fault("custom") as calls:
            result = case.run()
        assert calls[0] > 0 and not result.passed


def test_untransposed_attention_runs_every_product_untransposed() -> None:
    """sdpaGrad=untransposed: each batched product of the train step contracts its left operand's
    last axis with its right operand's first (after the batch axes): the form XLA's CPU gives YNNPACK."""
    text = _step_text(ATTN, None, {"sdpaGrad": "untransposed"})
    batched = [line for line in text.splitlines() if "dot_general" in line and "batching_dims = [0, 1]" in line]
    assert len(batched) == 4 * 7  # four blocks: Q·Kᵀ and P·V forward; S again, dP, dQ, dKᵀ, dVᵀ backward
    assert all("contracting_dims = [3] x [2]" in line for line in batched), batched
    closed = _step_text(ATTN, None, {"sdpaGrad": "closed"})
    assert sum("contracting_dims = [2] x [2]" in line for line in closed.splitlines()) == 4 * 2  # Pᵀ·dO, dSᵀ·Q


def test_chunked_kernel_gradient_sizes_its_chunks_to_the_cache() -> None:
    from hloforge.lowering.conv import DW_CHUNK_BYTES, dw_chunk

    # (x, ḡ) NHWC -> examples per chunk: the largest power of two whose x and ḡ fit in 1 MiB
    assert dw_chunk((32, 32, 32, 64), (32, 32, 32, 64), "f32") == 2  # resnet18-cifar's first stage
    assert dw_chunk((128, 28, 28, 32), (128, 28, 28, 32), "f32") == 4  # mnist-cnn's second conv
    assert dw_chunk((128, 28, 28, 1), (128, 28, 28, 32), "f32") == 8
    assert dw_chunk((32, 32, 32, 64), (32, 16, 16, 128), "f32") == 2  # strided: x's image counts
    assert dw_chunk((128, 28, 28, 32), (128, 28, 28, 32), "f64") == 2  # twice the bytes, half the chunk
    assert dw_chunk((1024, 224, 224, 64), (1024, 224, 224, 64), "f32") == 1  # one example over the budget
    for x, g in [((32, 8, 8, 256), (32, 8, 8, 256)),  # an image under 14²: the batch whole
                 ((4, 28, 28, 32), (4, 28, 28, 32))]:  # one chunk would be the whole batch
        assert dw_chunk(x, g, "f32") is None
    chunk = dw_chunk((128, 28, 28, 32), (128, 28, 28, 32), "f32")
    assert chunk is not None and 2 * chunk * 2 * 28 * 28 * 32 * 4 > DW_CHUNK_BYTES >= chunk * 2 * 28 * 28 * 32 * 4


@pytest.mark.parametrize("spec", [SMALL, FLAT], ids=lambda s: s.name)
def test_chunked_train_step_matches_autodiff(chunk_everything: None, spec: NetSpec) -> None:
    xla = make_backend("xla")
    chunked = _step_text(spec, None, dict(XLA_FORMS))
    assert chunked != _step_text(spec, None, {"layout": "nhwc", "convGrad": "autodiff"})  # it did split
    want = _one_step(xla, _step_text(spec, None), spec)
    assert _rel_step(_one_step(xla, chunked, spec), want, spec) < 1e-5


def test_nhwc_max_pool_backward_is_gated() -> None:
    case = _pick("maxPool", (("layout", "nhwc"),), (2, 7, 7))
    with inject_fault("maximum") as calls:
        result = case.run()
    assert calls[0] > 0 and not result.passed


# ------------------------------------------------------------------ IREE computes the gated forms
IREE_LAYERS = [
    (Conv2d(4, k=3, stride=2, pad="same", act="relu"), (3, 7, 6)),
    (ConvBn(4, k=3, groups=2, act="hSwish"), (2, 5, 5)),
    (DepthwiseConvBn(k=5, stride=2), (3, 6, 6)),
    (MaxPool(3, 2, pad=1), (2, 7, 7)),
    (ResidualStage(4, n=1, stride=2), (2, 6, 6)),
    (InvertedResidual(4, n=1, stride=2, expand=2), (3, 6, 6)),
]


@pytest.mark.parametrize(("layer", "shape"), IREE_LAYERS, ids=lambda v: getattr(v, "kind", str(v)))
def test_iree_default_forms_match_the_gated_xla_forms(layer: object, shape: Shape) -> None:
    """IREE runs f32 only (no f64 gate there): its default forms must reproduce, on IREE, the
    (y, ∂θ, ∂x) of the XLA-gated portable form — so every gated strategy is checked on both."""
    pytest.importorskip("iree.runtime")
    got_text, want_text, got, want = layer_vjp_on_iree_and_xla(layer, shape)
    assert got_text != want_text
    assert _rel(got, want) < 1e-5


@pytest.mark.parametrize(("layer", "shape", "choice", "form"), [
    (Conv2d(8, k=2, act="relu"), (8, 3, 4), "chunked", "stablehlo.reverse"),  # ∂x on flipped ḡ (and the result)
    (Conv2d(8, k=3, stride=2, act="relu"), (4, 4, 4), "chunked", "stablehlo.dot_general"),  # the im2col GEMM
    (Conv2d(4, k=3), (3, 5, 5), "winograd", "stablehlo.dot_general"),  # Winograd's transforms and GEMMs
], ids=["flipped-dx", "im2col", "winograd"])
def test_xla_s_chunked_forms_compute_the_gated_form_on_iree(layer: object, shape: Shape, choice: str, form: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunked and winograd forms' shape rules (XLA's) rendered for IREE at the gate's batch (the
    Winograd width rule lowered to these channels): the same (y, ∂θ, ∂x) there as the portable form on
    XLA, so these forms are checked on both backends."""
    from hloforge.lowering import conv

    pytest.importorskip("iree.runtime")
    monkeypatch.setattr(conv, "WINOGRAD_MIN_CHANNELS", 1)
    got_text, want_text, got, want = layer_vjp_on_iree_and_xla(layer, shape, {"convGrad": choice}, batch=2)
    assert got_text.count(form) > want_text.count(form)  # the rule applied
    assert _rel(got, want) < 1e-5


def test_iree_train_step_matches_xla() -> None:
    """Each backend's default render (conv kernels carried HWIO), and IREE's with them carried as
    declared: one step's θ', state, loss and statistics agree, read back in the declared layout."""
    pytest.importorskip("iree.runtime")

    def rendered(target: str, choices: dict[str, str]) -> tuple[str, Storage]:
        with strategy.forced(choices):
            text, lay = train_step_module(SMALL, Variant("adam"), 4, target=target)
        return text, lay.storage

    xla_text, xla_storage = rendered("xla", {})
    want = _one_step(make_backend("xla"), xla_text, SMALL, storage=xla_storage)
    iree = make_backend("iree")
    for choices in ({}, {"paramLayout": "public"}):
        text, storage = rendered("iree", choices)
        assert (storage == xla_storage) == (not choices)
        got = _one_step(iree, text, SMALL, storage=storage)
        assert _rel_step(got, want, SMALL) < 1e-5


# ------------------------------------------------------------------ the YOLO losses' masked class sum
YOLO_LOSSES = ["yolov1", "anchorYolo", "fpnYolo"]


@pytest.mark.parametrize("name", YOLO_LOSSES)
def test_masked_sum_form_is_gated_and_a_broken_one_turns_it_red(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    from hloforge.losses import detection

    cases = _cases(name)
    plain = [c for c in cases if not c.strategy]
    forced = [c for c in cases if c.strategy == (("maskedSum", "channelsFirst"),)]
    assert plain and len(forced) == len(plain) and all(c.id.endswith("~maskedSum=channelsFirst") for c in forced)
    assert forced[0].run().passed
    right = detection.masked_sum

    def broken(b, v, mask):  # the channels-first form 0.1% off; the portable one untouched
        out = right(b, v, mask)
        return out * 1.001 if strategy.chosen("maskedSum", b.target) == "channelsFirst" else out

    monkeypatch.setattr(detection, "masked_sum", broken)
    assert not forced[0].run().passed
    assert plain[0].run().passed


@pytest.mark.parametrize("name", YOLO_LOSSES)
def test_iree_masked_sum_form_matches_the_gated_xla_form(name: str) -> None:
    """iree-compile rejects the portable form's one-sum (losses/detection.py, MASKED_SUM): IREE's
    render of the loss compiles there and gives the (loss, ∂logits) the gated form gives on XLA."""
    pytest.importorskip("iree.runtime")
    from hloforge.core.modules import loss_module

    loss, shape = default_registry().get("loss", name).gate_cases()[0]
    want_text, got_text = loss_module(loss, shape, 3), loss_module(loss, shape, 3, target="iree")
    assert got_text != want_text and loss_module(loss, shape, 3, target="xla") == want_text
    rng = np.random.default_rng(0)
    ins = [(rng.standard_normal((3, *shape)) * 2).astype(np.float32), loss.sample_labels(rng, 3, shape)]

    def run(be: object, text: str) -> list[np.ndarray]:
        outs = be.execute(be.compile(text), [be.to_device(a) for a in ins])  # type: ignore[attr-defined]
        return [np.asarray(be.to_host(o), np.float64) for o in outs]  # type: ignore[attr-defined]

    assert _rel(run(make_backend("iree"), got_text), run(make_backend("xla"), want_text)) < 1e-5


def test_shifted_small_takes_the_convolution_above_its_largest_kernel() -> None:
    """IREE's depthwise choice: the shifted form up to 5×5, a convolution for ConvNeXt's 7×7 (whose ∂w
    sums IREE 3.13 fuses into one dispatch of more buffers than its runtime binds); its step on IREE is
    tests/test_zoo.py's convnext-mini."""
    from hloforge.lowering.conv import SHIFTED_MAX_K, shifts

    assert shifts("shiftedSmall", SHIFTED_MAX_K) and not shifts("shiftedSmall", SHIFTED_MAX_K + 2)
    assert shifts("shifted", 7) and not shifts("conv", 3)


@pytest.mark.parametrize("batch,chunk,stride,pads", [(5, 2, 1, ((1, 1), (1, 1))), (4, 1, 2, ((0, 1), (1, 0))),
                                                     (6, 4, 2, ((1, 1), (1, 1)))])
def test_looped_kernel_gradient_matches_the_whole_batch_one(batch: int, chunk: int, stride: int,
                                                            pads: tuple[tuple[int, int], ...]) -> None:
    """The chunked form's ∂w is one while loop over whole chunks (in the convolution form XLA's CPU
    runs through Eigen) and the remainder after it: on XLA it is autodiff's ∂w over the whole
    batch, strided, asymmetrically padded, with and without a remainder."""
    from hloforge.core import autodiff
    from hloforge.core.hlo import Builder
    from hloforge.lowering import conv

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((batch, 7, 6, 3)).astype(np.float32)
    wshape = (3, 3, 3, 5)
    b = Builder("f32", "dw")
    x, w = b.arg(xs.shape), b.arg(wshape)
    y = b.convolution(x, w, strides=(stride, stride), padding=pads, spec=conv.NHWC_HWIO)
    attrs = b.tape[-1].attrs
    gs = rng.standard_normal(y.shape).astype(np.float32)
    g = b.arg(gs.shape)
    looped = conv._looped_kernel_grad(b, x, g, wshape, stride, pads, chunk)
    whole = autodiff.conv_kernel_grad(b, x, g, wshape, attrs)
    assert "stablehlo.while" in (text := b.module([looped, whole]))
    xla = make_backend("xla")
    got, want = (xla.to_host(o) for o in xla.execute(xla.compile(text), [xla.to_device(a) for a in
                                                                          (xs, np.zeros(wshape, np.float32), gs)]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
