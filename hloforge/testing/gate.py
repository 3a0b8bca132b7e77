"""The oracle gate: every plugin's emitted backward against independent references.

For a layer or loss: build its VJP module, run it on XLA, and compare
  1. in f64, (y, ∂θ, ∂x) with `jax.vjp` of the plugin's plain jax.numpy
     `reference` (≤ 1e-9 norm-relative), and each gradient tensor with central
     finite differences of the *emitted* forward along a random direction
     (≤ 1e-6 relative);
  2. in f32, the same gradients with the f64 jax reference (≤ 1e-4).
A layer with stat slots (batch norm) is gated twice: in training, where its reported batch
statistics are compared too, and in eval mode, with running statistics fed in (and
differentiated, so the eval path's every rule is checked).
For an optimizer: OPT_STEPS steps of its optimizer-step module against optax (≤ 1e-12 in f64,
≤ 1e-6 in f32), alone and inside the wrappers (EMA shadow, MultiSteps accumulation,
clip_by_global_norm); the module emits the update exactly as the train step does. A `layout_free`
optimizer is gated again with its conv-kernel slot stored as paramLayout=hwio carries it (axes
permuted), as XLA and IREE hand it over: an update that reads a tensor's axes goes red there.

A gate must be able to fail: `hloforge.core.autodiff.inject_fault` breaks one
VJP rule and the tests see every gate go red.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core import contracts, modules, strategy
from hloforge.core.errors import HloforgeError, PluginError
from hloforge.core.registry import component_label, plugin_label
from hloforge.core.spec import Ctx, Layer, Loss, ParamSlot, Shape, qualified_params, walk_layers
from hloforge.core.variant import Optimizer, Wrappers, ema_decay_at

TOL_JAX_F64 = 1e-9
TOL_FD_F64 = 1e-6
TOL_JAX_F32 = 1e-4
# Optimizers (and their wrappers) against optax over OPT_STEPS updates: the update is elementwise
# arithmetic, so it is held to the precision of the type itself.
TOL_OPT_F64 = 1e-12
TOL_OPT_F32 = 1e-6
OPT_STEPS = 5
FD_STEP = 1e-6
# A loss is differentiated with this cotangent, not the train step's 1: a custom backward that drops its ḡ
# (which a weighted or composed loss, or a loss inside another's forward, feeds it) is then off by 1/0.75.
LOSS_COTANGENT = 0.75
ZERO_GRAD = 1e-12  # a reference gradient this small relative to the case's largest is structurally zero


@attrs.frozen
class GateResult:
    kind: str
    name: str
    case: str
    err_jax_f64: float
    err_fd_f64: float
    err_jax_f32: float

    @property
    def passed(self) -> bool:
        f64, f32 = tolerances(self.kind)
        return self.err_jax_f64 <= f64 and self.err_fd_f64 <= TOL_FD_F64 and self.err_jax_f32 <= f32

    def row(self) -> str:
        mark = "pass" if self.passed else "FAIL"
        return (f"{self.kind:9} {self.name:16} {self.case:44} {self.err_jax_f64:9.1e} {self.err_fd_f64:9.1e} "
                f"{self.err_jax_f32:9.1e}  {mark}")


def tolerances(kind: str) -> tuple[float, float]:
    """The (f64, f32) bound on the error against the oracle (jax, or optax for an optimizer)."""
    return (TOL_OPT_F64, TOL_OPT_F32) if kind == "optimizer" else (TOL_JAX_F64, TOL_JAX_F32)


HEADER = f"{'kind':9} {'name':16} {'case':44} {'jax f64':>9} {'fd f64':>9} {'jax f32':>9}"


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    den = float(np.linalg.norm(b))
    num = float(np.linalg.norm(a - b))
    if not math.isfinite(num):
        return math.inf
    return num / den if den > 1e-30 else num


def zero_err(a: np.ndarray, scale: float) -> float:
    """The error of a gradient that should be exactly zero, relative to the case's gradient scale."""
    num = float(np.linalg.norm(np.asarray(a, np.float64)))
    if not math.isfinite(num):
        return math.inf
    return num / scale if scale > 1e-30 else num


def _client() -> Any:
    from hloforge.backends.xla import default_client

    return default_client()


def _compile(text: str) -> Any:
    """Compile on the process-wide client, through the on-disk executable cache (as the backend does)."""
    from hloforge.backends.xla.cache import ExecutableCache

    return ExecutableCache().compile(_client(), text)


# The packages each kind's oracles import: layers and losses jax.vjp of their references, optimizers optax too.
ORACLES = {"layer": ("jax", "jaxlib"), "loss": ("jax", "jaxlib"), "optimizer": ("jax", "jaxlib", "optax")}
ORACLES_INSTALL = "pip install 'hloforge[gate]' (jax, jaxlib and optax)"


def require_oracles(cases: Sequence[GateCase]) -> None:
    """Refuse in one line when the oracles `cases` need cannot be imported: otherwise every case would fail
    on the missing import, each said to be its plugin's fault."""
    import importlib

    missing = []
    for name in sorted({m for c in cases for m in ORACLES[c.kind]}):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise HloforgeError(f"the gate compares each plugin against its oracles, which need {', '.join(missing)} "
                            f"(not importable here); {ORACLES_INSTALL}")


def _jax() -> Any:
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def _run(text: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    exe = _compile(text)
    try:
        return [np.asarray(o) for o in exe.run(list(inputs))]
    finally:
        exe.close()


def _fd_errors(forward: Callable[[list[np.ndarray]], np.ndarray], weight: np.ndarray, inputs: list[np.ndarray],
               grads: Sequence[np.ndarray], rng: np.random.Generator, which: Sequence[int]) -> float:
    """Worst relative gap between ⟨∂_i, d⟩ and the central difference of ⟨f, ḡ⟩ along d, per input i."""
    worst = 0.0
    for i in which:
        d = rng.standard_normal(inputs[i].shape)
        plus, minus = list(inputs), list(inputs)
        plus[i] = inputs[i] + FD_STEP * d
        minus[i] = inputs[i] - FD_STEP * d
        fd = float(np.sum((forward(plus) - forward(minus)) * weight)) / (2 * FD_STEP)
        an = float(np.sum(grads[i] * d))
        worst = max(worst, abs(fd - an) / max(abs(an), abs(fd), 1e-8))
    return worst


def _case_label(obj: Any, shape: Shape) -> str:
    fields = ",".join(f"{k}={v}" for k, v in obj.to_dict().items() if k != "kind") if hasattr(obj, "to_dict") else \
        ",".join(f"{f.name}={getattr(obj, f.name)}" for f in attrs.fields(type(obj)))
    return f"{fields} @{list(shape)}"[:44]


# ------------------------------------------------------------------ layers
def _stat_layer_modules(layer: Layer, in_shape: Shape, batch: int, dtype: str, eval_mode: bool) -> tuple[str, str]:
    """For a layer with stat slots: `@main(θ…, running…, x, ḡ) -> (y, ∂θ…, ∂running…, ∂x, batch stats…)`
    and the forward `@main(θ…, running…, x) -> y`; running… (and its cotangents) only in eval mode,
    batch stats only in training."""
    from hloforge.core import autodiff
    from hloforge.core.hlo import Builder

    walk = walk_layers([layer], in_shape)
    texts = []
    for with_vjp in (True, False):
        b = Builder(dtype, "gate_" + ("eval" if eval_mode else "train") + ("_vjp" if with_vjp else "_fwd"))
        params = [b.arg(s.shape) for _, s in qualified_params(walk)]
        running = [b.arg(s.shape) for s in walk[0].stats] if eval_mode else []
        x = b.arg((batch, *in_shape))
        gbar = b.arg((batch, *walk[-1].out_shape)) if with_vjp else None
        masks = [] if eval_mode else [b.arg((batch, *s.shape)) for s in walk[0].masks]
        y, stats = modules.emit_layers(b, walk, x, params, train=not eval_mode, running=running, masks=masks)
        if gbar is None:
            texts.append(b.module([y]))
        else:
            texts.append(b.module([y, *autodiff.grad(b, [y], [gbar], [*params, *running, x]), *stats]))
    return texts[0], texts[1]


def gate_layer(layer: Layer, in_shape: Shape, *, batch: int = 2, seed: int = 0, mode: str = "train") -> GateResult:
    """Gate one layer. A layer with stat slots (batch norm) is gated in both modes: "train" (batch
    statistics; the reported batch stats are compared with the reference's too) and "eval" (the
    same random running statistics fed to the module and to the reference, and differentiated
    like the parameters, so every rule on the eval path is checked)."""
    jax = _jax()
    walk = walk_layers([layer], in_shape)
    slots = [s for _, s in qualified_params(walk)]
    stats = list(walk[0].stats)
    eval_mode = mode == "eval"
    out_shape = walk[-1].out_shape
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s.shape) * 0.5 for s in slots]
    x = rng.standard_normal((batch, *in_shape))
    gbar = rng.standard_normal((batch, *out_shape))
    # Running means in [-0.5, 0.5], running variances in [0.5, 1.5] (StatSlot.init is 0 or 1).
    running = [s.init + rng.uniform(-0.5, 0.5, s.shape) for s in stats] if eval_mode else []
    inputs = [*params, *running, x]  # the differentiated inputs, in module order
    n_in = len(inputs)
    # Dropout / drop-path masks: drawn once, fed to module and reference alike (training only).
    masks = [] if eval_mode else [s.sample(rng, batch).astype(np.float64) for s in walk[0].masks]
    by_name = {s.name: m for s, m in zip(walk[0].masks, masks, strict=False)}

    def reference(ps: list[Any], rs: list[Any], xv: Any, ctx: Ctx | None = None) -> Any:
        if ctx is None:
            ctx = Ctx(train=True, masks=by_name) if not eval_mode else \
                Ctx(train=False, running={s.name: r for s, r in zip(stats, rs, strict=True)})
        return layer.reference({s.name: p for s, p in zip(slots, ps, strict=True)}, xv, ctx)

    y_ref, pullback = jax.vjp(reference, params, running, x)
    if tuple(np.shape(y_ref)) != (batch, *out_shape):  # else jax's pullback fails on ḡ, naming neither
        raise PluginError(f"{component_label('layer', layer)}: reference returned {list(np.shape(y_ref))}, "
                          f"but out_shape declares {[batch, *out_shape]} (batch first)")
    dps_ref, drs_ref, dx_ref = pullback(gbar)
    refs = [np.asarray(y_ref), *map(np.asarray, dps_ref), *map(np.asarray, drs_ref), np.asarray(dx_ref)]
    if stats and not eval_mode:
        c = Ctx(train=True, masks=by_name)
        reference(params, running, x, c)
        refs += [np.asarray(c.batch_stats[s.name]) for s in stats]

    # A structurally zero gradient (a bias or β straight before a batch norm) has a reference made of
    # rounding noise, so a norm-relative error would be noise over noise: such a tensor is judged
    # against the case's largest gradient instead (and left out of the finite differences).
    scale = max(float(np.linalg.norm(r)) for r in refs[1:1 + n_in])
    zero = {i for i in range(1, n_in) if float(np.linalg.norm(refs[i])) <= ZERO_GRAD * scale}
    errs = {}
    for dtype in ("f64", "f32"):
        npt = np.float64 if dtype == "f64" else np.float32
        if stats:
            vjp_text, fwd_text = _stat_layer_modules(layer, in_shape, batch, dtype, eval_mode)
        else:
            vjp_text = modules.vjp_module([layer], in_shape, batch, dtype=dtype)
            fwd_text = modules.layers_forward_module([layer], in_shape, batch, dtype=dtype)
        got = _run(vjp_text, [a.astype(npt) for a in [*inputs, gbar, *masks]])
        errs[dtype] = max(zero_err(g, scale) if i in zero else rel_err(g, r)
                          for i, (g, r) in enumerate(zip(got, refs, strict=True)))
        if dtype == "f64":
            fwd = _compile(fwd_text)

            def run_fwd(ins: list[np.ndarray], exe: Any = fwd) -> np.ndarray:
                return np.asarray(exe.run([*ins, *masks])[0])

            try:
                which = [i for i in range(n_in) if 1 + i not in zero]
                fd = _fd_errors(run_fwd, gbar, inputs, got[1:1 + n_in], rng, which)
            finally:
                fwd.close()
    label = ("[eval] " if eval_mode else "") + _case_label(layer, in_shape)
    return GateResult("layer", layer.kind, label[:44], errs["f64"], fd, errs["f32"])


# ------------------------------------------------------------------ losses
def gate_loss(loss: Loss, out_shape: Shape, *, batch: int = 3, seed: int = 0) -> GateResult:
    jax = _jax()
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((batch, *out_shape)) * 2.0
    y = _sampled_labels(loss, rng, batch, out_shape)
    y_ref = y.astype(np.float64) if y.dtype.kind == "f" else y
    val, g = jax.value_and_grad(lambda z: loss.reference(z, y_ref))(logits)
    refs = [np.asarray(val), np.asarray(g) * LOSS_COTANGENT]
    errs = {}
    for dtype in ("f64", "f32"):
        npt = np.float64 if dtype == "f64" else np.float32
        text = modules.loss_module(loss, out_shape, batch, dtype=dtype, cotangent=LOSS_COTANGENT)
        y_in = y.astype(npt) if y.dtype.kind == "f" else y
        got = _run(text, [logits.astype(npt), y_in])
        errs[dtype] = max(rel_err(a, r) for a, r in zip(got, refs, strict=True))
        if dtype == "f64":
            exe = _compile(text)
            try:
                fd = _fd_errors(lambda ins, exe=exe, y_in=y_in: np.asarray(exe.run([ins[0], y_in])[0]),
                                np.full((), LOSS_COTANGENT), [logits], [got[1]], rng, [0])
            finally:
                exe.close()
    return GateResult("loss", loss.name, _case_label(loss, out_shape), errs["f64"], fd, errs["f32"])


def _sampled_labels(loss: Loss, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
    """`loss.sample_labels`, as the module takes them (int32 ids, float targets), refused in one line naming the
    loss unless of `label_spec`'s shape and kind: else the oracle or the module fails on them, naming neither."""
    y = np.asarray(loss.sample_labels(rng, batch, out_shape))
    shape, dtype = modules.checked_label_spec(loss, out_shape)
    ids = dtype == "i32"
    if y.shape != (batch, *shape) or y.dtype.kind not in ("iu" if ids else "f"):
        raise PluginError(f"{component_label('loss', loss)}: sample_labels(rng, {batch}, {tuple(out_shape)}) returned "
                          f"{y.dtype} {list(y.shape)}, expected {'integer ids' if ids else 'float targets'} "
                          f"{[batch, *shape]} (the batch, then the label shape its label_spec gives)")
    return y.astype(np.int32) if ids else y


# ------------------------------------------------------------------ optimizers
# A matrix, a conv kernel (OIHW, all four axes of distinct length: stored HWIO under paramLayout=hwio)
# and a vector.
OPT_SLOTS = (ParamSlot("w", (3, 4), "glorot", True), ParamSlot("k", (4, 3, 5, 2), "he_fan_out", True),
             ParamSlot("b", (4,), "zeros", False))


def gate_optimizer(opt: Optimizer, *, steps: int = OPT_STEPS, lr: float = 0.05, seed: int = 0,
                   wrappers: Wrappers | None = None) -> GateResult:
    """`steps` updates of the optimizer-step module (the train step's update emitter) against optax on
    the same gradients (jax, f64): θ, and the EMA shadow when `wrappers` keep one (optax.ema fed θ
    after every update, at the host's warm-up decay). Under accumulation k, steps·k micro-batches.
    Every third update's micro-batch gradients are scaled down 20×, so a clip norm sees both of its
    branches on applied updates, and under accumulation a partial sum above the norm meets the
    accumulator. θ, ∂θ and the state are carried as `modules.param_storage` says for no target (a
    `strategy.forced` paramLayout choice applies), and read back in their declared layouts for the
    comparison."""
    jax = _jax()
    import jax.numpy as jnp
    import optax

    wr = wrappers or Wrappers()
    lay = wr.layout(opt)
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s.shape) for s in OPT_SLOTS]
    micro = steps * wr.accum
    # every third update's micro-batches scaled down: under accumulation too, one update below the clip norm applies
    grads = [[rng.standard_normal(s.shape) * (0.05 if t // wr.accum % 3 == 1 else 1.0) for s in OPT_SLOTS]
             for t in range(micro)]
    tx = wr.optax_reference(opt, lr, [s.decay for s in OPT_SLOTS])
    ref = [jnp.asarray(p) for p in params]
    state = tx.init(ref)
    update = jax.jit(tx.update)  # once: MultiSteps' lax.cond is slow to dispatch op by op
    shadow = optax.ema(wr.ema or 0.5, debias=False).init(ref)._replace(ema=list(ref))  # E starts at θ
    for t, gs in enumerate(grads, start=1):
        upd, state = update([jnp.asarray(g) for g in gs], state, ref)
        ref = [p + u for p, u in zip(ref, upd, strict=True)]
        if lay.shadows and lay.applies(t):
            decay = ema_decay_at(wr.ema, lay.update_index(t))
            _, shadow = optax.ema(decay, debias=False).update(ref, shadow)
    refs = [*ref, *(shadow.ema if lay.shadows else [])]
    errs = {}
    n = len(OPT_SLOTS)
    storage = modules.param_storage([(s.name, s) for s in OPT_SLOTS], None)
    for dtype in ("f64", "f32"):
        npt = np.float64 if dtype == "f64" else np.float32
        exe = _compile(modules.optimizer_step_module(list(OPT_SLOTS), opt, dtype=dtype, wrappers=wr, storage=storage))
        try:
            ps = modules.host_stored([p.astype(npt) for p in params], storage)
            st = modules.host_stored(lay.initial(opt, OPT_SLOTS, params, npt), storage)
            for t, gs in enumerate(grads, start=1):
                outs = exe.run([*ps, *st, *modules.host_stored([g.astype(npt) for g in gs], storage),
                                lay.host_schedule(opt, t, lr, npt)])
                ps, st = outs[:n], outs[n:]
        finally:
            exe.close()
        ps, st = modules.host_declared(ps, storage), modules.host_declared(st, storage)
        got = [*ps, *(st[(lay.region("E") - 1) * n:lay.region("E") * n] if lay.shadows else [])]
        errs[dtype] = max(rel_err(p, np.asarray(r)) for p, r in zip(got, refs, strict=True))
    case = _case_label(opt, ()) if wrappers is None else f"{wr.label()} {_case_label(opt, ())}"
    return GateResult("optimizer", opt.name, case[:44], errs["f64"], 0.0, errs["f32"])


# ------------------------------------------------------------------ everything registered
@attrs.frozen
class GateCase:
    """One gate case of one registered plugin: what `gate_all` runs and `pytest --hloforge-gate` collects."""

    kind: str  # layer | loss | optimizer
    name: str
    obj: Any  # the layer / loss / optimizer instance
    shape: Shape  # input shape (layer), output shape (loss), () (optimizer)
    distribution: str
    mode: str = "train"  # a layer with stat slots also gets an "eval" case (running statistics in)
    wrappers: Wrappers | None = None  # an optimizer case run inside these wrappers (EMA, accumulation, clip)
    # a layer or loss case rendered with these lowering strategies forced (core/strategy.py), ((kind, choice), …)
    strategy: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """A readable, unique-per-case id without spaces, e.g. `layer:conv2d:out=4,k=3,...@3x6x6`."""
        d = self.obj.to_dict() if hasattr(self.obj, "to_dict") else attrs.asdict(self.obj)
        fields = ",".join(f"{k}={_compact(v)}" for k, v in d.items() if k != "kind")
        at = "@" + "x".join(str(n) for n in self.shape) if self.kind != "optimizer" else ""
        wrapped = f"+{self.wrappers.label()}" if self.wrappers is not None else ""
        forced = "".join(f"~{k}={c}" for k, c in self.strategy)
        return f"{self.kind}:{self.name}:{fields}{at}{wrapped}{forced}" + ("#eval" if self.mode == "eval" else "")

    def run(self) -> GateResult:
        with strategy.forced(dict(self.strategy)):
            if self.kind == "layer":
                res = gate_layer(self.obj, self.shape, mode=self.mode)
            elif self.kind == "loss":
                res = gate_loss(self.obj, self.shape)
            else:
                res = gate_optimizer(self.obj, wrappers=self.wrappers)
        if not self.strategy:
            return res
        tag = " ".join(f"{k}={c}" for k, c in self.strategy)
        return attrs.evolve(res, case=f"[{tag}] {res.case}"[:44])


def _compact(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "x".join(_compact(x) for x in v)
    return str(v).replace(" ", "")


def fault(e: BaseException, doing: str = "", who: str = "") -> str:
    """What a plugin's exception says about it, as a phrase after its name `who`: "does not implement
    forward" for an abstract contract method it left out (the base's body in core/contracts.py
    raises NotImplementedError), else "failed <doing>: <Type>: <message>" on one line (a PluginError
    that already begins with `who` without it, so the row names the plugin once)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if isinstance(e, NotImplementedError) and tb is not None:
        code = tb.tb_frame.f_code
        if os.path.abspath(code.co_filename) == os.path.abspath(contracts.__file__):
            return f"does not implement {code.co_name}"
    if isinstance(e, HloforgeError):
        what = str(e).removeprefix(f"{who}: ") if who else str(e)
    else:
        # an attrs validator's ValueError carries (message, attribute, allowed, value): the message says it
        msg = e.args[0] if isinstance(e, ValueError) and len(e.args) > 1 and isinstance(e.args[0], str) else str(e)
        if not msg and tb is not None:
            msg = f"(raised in {tb.tb_frame.f_code.co_name})"
        what = f"{type(e).__name__}: {msg}"
    return " ".join(f"failed{' ' + doing if doing else ''}: {what}".split())


@attrs.frozen
class CaseError:
    """A plugin whose gate cases cannot even be listed or built (its `gate_cases()` raises or returns
    none, a case's shape walk fails, its class is no attrs class): a FAIL row in `hloforge verify`
    and a failing item under `pytest --hloforge-gate`, never an error that stops the others."""

    kind: str
    name: str
    distribution: str
    reason: str  # a phrase after the plugin's name: "declares no gate cases", "failed ...: ..."

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.name}:gate_cases"

    @property
    def message(self) -> str:
        return f"{plugin_label(self.kind, self.name, self.distribution)} {self.reason}"


def _pairs(declared: Sequence[Any], what: str, base: type) -> list[tuple[Any, Shape]]:
    # the class for its instance, `(Huber, (4,))`, would fail only naming its case: an attrs error
    bad = [c for c in declared if not (isinstance(c, (tuple, list)) and len(c) == 2 and isinstance(c[0], base))]
    if bad:
        raise PluginError(f"gate_cases() must return ({what}) pairs, not {bad[0]!r}"[:200])
    return [(obj, tuple(shape)) for obj, shape in declared]


def _layer_cases(e: Any, declared: Sequence[Any]) -> list[GateCase]:
    # each case as rendered for no target (every strategy kind's first choice), then once
    # per other choice of each strategy kind the layer consults (layout=nhwc only where the
    # case takes NHWC at all: otherwise it renders the same module), then as each target
    # renders it by default where that combines several (convGrad=autodiff acts only
    # inside an NHWC conv: XLA's layout=nhwc + convGrad=autodiff)
    out: list[GateCase] = []
    for obj, shape in _pairs(declared, "layer instance, input shape", Layer):
        stats = bool(walk_layers([obj], shape)[0].stats)
        nhwc = len(shape) == 3 and obj.supports_nhwc(shape)
        kinds = [k for k in obj.strategies_for(shape) if k != "layout" or nhwc]
        # supports_nhwc alone makes an NHWC render keep NHWC through the layer: its NHWC form is
        # gated whether or not the author listed "layout" (one who forgot would ship it ungated)
        if nhwc and strategy.LAYOUT.name not in kinds:
            kinds.append(strategy.LAYOUT.name)
        forcings: list[tuple[tuple[str, str], ...]] = [()]
        forcings += [((k, c),) for k in kinds for c in strategy.kind(k).choices[1:]]
        for target in strategy.targets():
            defaults = tuple((k, d) for k in kinds
                             if (d := strategy.kind(k).default(target)) != strategy.kind(k).choices[0])
            if len(defaults) > 1 and defaults not in forcings:
                forcings.append(defaults)
        for forced in forcings:
            out.append(GateCase(e.kind, e.name, obj, shape, e.distribution, strategy=forced))
            if stats:
                out.append(GateCase(e.kind, e.name, obj, shape, e.distribution, "eval", strategy=forced))
    return out


def _loss_cases(e: Any, declared: Sequence[Any]) -> list[GateCase]:
    # each case in the portable form, then once per other choice of each kind the loss consults
    out: list[GateCase] = []
    for obj, shape in _pairs(declared, "loss instance, output shape", Loss):
        forcings = [()] + [((k, c),) for k in obj.strategy_kinds for c in strategy.kind(k).choices[1:]]
        out += [GateCase(e.kind, e.name, obj, shape, e.distribution, strategy=f) for f in forcings]
    return out


def _optimizer_cases(e: Any, declared: Sequence[Any]) -> list[GateCase]:
    # a layer's (instance, shape) pair, or the class itself, would fail only in naming its case: an attrs error
    bad = [opt for opt in declared if not isinstance(opt, Optimizer)]
    if bad:
        raise PluginError(f"gate_cases() must return optimizer instances, not {bad[0]!r}"[:200])
    out = [GateCase(e.kind, e.name, opt, (), e.distribution) for opt in declared]
    # layout_free hands the update its tensors as stored, so each case runs again under every other
    # paramLayout (a kernel's axes permuted); one that is not gets the declared layout whatever it is.
    if e.obj.layout_free:
        forced = [((strategy.PARAM_LAYOUT.name, c),) for c in strategy.PARAM_LAYOUT.choices[1:]]
        out += [GateCase(e.kind, e.name, opt, (), e.distribution, strategy=f) for opt in declared for f in forced]
    # The wrappers compose with any optimizer: gated composed, on its first case.
    return out + [GateCase(e.kind, e.name, declared[0], (), e.distribution, wrappers=w) for w in Wrappers.gate_cases()]


BUILDERS: dict[str, Callable[[Any, Sequence[Any]], list[GateCase]]] = {
    "layer": _layer_cases, "loss": _loss_cases, "optimizer": _optimizer_cases}


def collect_cases(registry: Any = None, names: Sequence[str] | None = None) -> tuple[list[GateCase], list[CaseError]]:
    """The gate cases of every registered (or each named: a component or a distribution) layer, loss
    and optimizer, in registry order, and a `CaseError` for each whose cases cannot be built. The
    names are applied first, so a named plugin's gate never runs another plugin's `gate_cases()`."""
    from hloforge.core.registry import default_registry

    reg = registry or default_registry()
    wanted = set(names or ())
    out: list[GateCase] = []
    errors: list[CaseError] = []
    for e in reg.entries():
        if e.kind not in BUILDERS or (wanted and not wanted & {e.name, e.distribution}):
            continue
        # A third party's mistake is its own FAIL, never the end of everyone's gate.
        try:
            declared = list(e.obj.gate_cases())
        except Exception as ex:
            errors.append(CaseError(e.kind, e.name, e.distribution, fault(ex, "in gate_cases()")))
            continue
        if not declared:
            checked = "update" if e.kind == "optimizer" else "backward"
            errors.append(CaseError(e.kind, e.name, e.distribution,
                                    f"declares no gate cases: its {checked} is not verified"))
            continue
        try:
            built = BUILDERS[e.kind](e, declared)
            for case in built:
                case.id  # noqa: B018  a case must name itself: a class that is not attrs cannot
        except Exception as ex:
            errors.append(CaseError(e.kind, e.name, e.distribution, fault(ex, "building its gate cases")))
            continue
        out += built
    return out, errors


def gate_cases(registry: Any = None, names: Sequence[str] | None = None) -> list[GateCase]:
    """Every gate case of every registered (or named) layer, loss and optimizer, in registry order.
    A plugin whose cases cannot be built is a PluginError naming each such plugin: `collect_cases`
    returns them beside the others instead."""
    cases, errors = collect_cases(registry, names)
    if errors:
        raise PluginError("; ".join(err.message for err in errors))
    return cases


def gate_all(registry: Any = None, names: Sequence[str] | None = None) -> list[GateResult]:
    return [c.run() for c in gate_cases(registry, names)]
