"""A small typed SSA builder for StableHLO text.

Every method emits one op (printed in the pretty form XLA's and IREE's parsers
both accept), returns a `Value` of known type, and appends a `TapeOp` that
`core/autodiff.py` differentiates. Methods are grouped elementwise → shape →
contraction → reduction so that each op's VJP rule, kept under the same name
in autodiff.py, is easy to find. The structured ops (gather, scatter_add, dot_general,
convolution, reduce_window) are core/structured.py's, a mixin Builder inherits. The values,
their types and the literal printing are core/ssa.py's (re-exported here: `from
hloforge.core.hlo import Value` works).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.ssa import FLOAT_DTYPES as FLOAT_DTYPES
from hloforge.core.ssa import NCHW_OIHW as NCHW_OIHW
from hloforge.core.ssa import NUMPY_DTYPE as NUMPY_DTYPE
from hloforge.core.ssa import ConvSpec as ConvSpec
from hloforge.core.ssa import TapeOp as TapeOp
from hloforge.core.ssa import TensorType as TensorType
from hloforge.core.ssa import Value as Value
from hloforge.core.ssa import _ints
from hloforge.core.ssa import float_literal as float_literal
from hloforge.core.structured import StructuredOps

# Builder.blocked_sum's blocks: XLA's CPU TreeReductionRewriter rewrites a reduced axis longer than
# SUM_BLOCK; a block shorter than MIN_SUM_BLOCK would leave the long stage to the second sum.
SUM_BLOCK = 32
MIN_SUM_BLOCK = 8
# The host call a multi-process step's cross-process sums go through (Builder.process_sum)
PROCESS_SUM = "hloforge_process_sum"


class Builder(StructuredOps):
    """Builds one `func.func @main` of a module, in one dtype (f32 to train, f64 to gate). Its
    structured ops (gather, scatter_add, dot_general, convolution, reduce_window) are StructuredOps'
    (core/structured.py)."""

    def __init__(self, dtype: str = "f32", module_name: str = "hloforge", target: str | None = None):
        if dtype not in FLOAT_DTYPES:
            raise UnsupportedSpec(f"builder dtype {dtype!r}; expected one of {FLOAT_DTYPES}")
        self.dtype = dtype
        self.module_name = module_name
        # The backend this module is rendered for ("xla", "iree"; None: no backend in mind). Layers
        # read it to choose their lowering strategy (core/strategy.py); the math never depends on it.
        self.target = target
        self.args: list[tuple[Value, str]] = []
        self.lines: list[str] = []
        self.tape: list[TapeOp] = []
        self._n = 0
        self._scope: str | None = None  # see name_scope
        self._scope_n: dict[str, int] = {}
        self._process_token: Value | None = None  # the last process_sum's order token (see there)

    # ----------------------------------------------------------------- plumbing
    def _next_id(self) -> str:
        """The next SSA id: the module's counter, or inside `name_scope` the scope's own."""
        if self._scope is None:
            self._n += 1
            return str(self._n - 1)
        k = self._scope_n.get(self._scope, 0)
        self._scope_n[self._scope] = k + 1
        return f"{self._scope}{k}"

    @contextlib.contextmanager
    def name_scope(self, prefix: str) -> Iterator[None]:
        """Values made inside are named %<prefix>0, %<prefix>1, … from the scope's own counter, so
        the module's numbering is what it would be without the block: cut the block out (and
        map its results back to its operands) and the rest of the text is unchanged."""
        outer, self._scope = self._scope, prefix
        try:
            yield
        finally:
            self._scope = outer

    def _fresh(self, t: TensorType) -> Value:
        return Value(f"%{self._next_id()}", t, self)

    def comment(self, text: str) -> None:
        """A `// text` line in the body: a marker a reader (or a test) can find the next block by."""
        if "\n" in text:
            raise UnsupportedSpec("a comment is one line")
        self.lines.append(f"// {text}")

    def _emit(self, op: str, ins: Sequence[Value], t: TensorType, text: str, **attrs_: Any) -> Value:
        out = self._fresh(t)
        self.lines.append(f"{out.name} = {text}")
        self.tape.append(TapeOp(op, tuple(ins), (out,), attrs_))
        return out

    def arg(self, shape: Sequence[int], dtype: str | None = None, alias_output: int | None = None) -> Value:
        v = Value(f"%arg{len(self.args)}", TensorType(tuple(shape), dtype or self.dtype), self)
        attr = f" {{tf.aliasing_output = {alias_output} : i32}}" if alias_output is not None else ""
        self.args.append((v, attr))
        return v

    def lift(self, x: Value | float, like: Value) -> Value:
        return x if isinstance(x, Value) else self.full(x, like.shape, like.dtype)

    def stop_gradient(self, x: Value) -> Value:
        """The same SSA name under a new identity, so no cotangent flows through it."""
        return Value(x.name, x.type, self)

    def custom_vjp(
        self,
        fwd: Callable[..., Sequence[Value]],
        bwd: Callable[..., Sequence[Value | None]],
        *ins: Value,
    ) -> list[Value]:
        """Emit `fwd(*ins)`, but differentiate it with the closed-form `bwd(b, *out_cts)`. `bwd` runs
        in the context variables of this call (the lowering strategies in force for the layer that
        emitted the forward: core/strategy.py), not in those of the later `autodiff.grad`."""
        start = len(self.tape)
        got = fwd(*ins)
        del self.tape[start:]
        if not isinstance(got, (list, tuple)) or not got or not all(isinstance(o, Value) for o in got):
            shown = got.type if isinstance(got, Value) else repr(got)
            raise UnsupportedSpec(f"custom_vjp's fwd returned {shown}, expected a list of the builder values of "
                                  "its outputs")
        outs = list(got)
        at_forward = contextvars.copy_context()

        def bwd_at_forward(*args: Any) -> Sequence[Value | None]:
            return at_forward.run(bwd, *args)

        self.tape.append(TapeOp("custom", tuple(ins), tuple(outs), {}, bwd_at_forward))
        return outs

    def module(self, outputs: Sequence[Value], *, num_replicas: int = 1) -> str:
        args = ", ".join(f"{v.name}: {v.type}{a}" for v, a in self.args)
        res = ", ".join(str(o.type) for o in outputs)
        body = "\n".join("    " + ln for ln in self.lines)
        ret = ", ".join(o.name for o in outputs)
        return (
            f"module @{self.module_name} attributes {{mhlo.num_partitions = 1 : i32, "
            f"mhlo.num_replicas = {num_replicas} : i32}} {{\n"
            f"  func.func public @main({args}) -> ({res}) {{\n{body}\n"
            f"    return {ret} : {res}\n  }}\n}}\n"
        )

    # ----------------------------------------------------------------- leaves
    def full(self, value: float, shape: Sequence[int] = (), dtype: str | None = None) -> Value:
        t = TensorType(tuple(shape), dtype or self.dtype)
        return self._emit("constant", (), t, f"stablehlo.constant dense<{float_literal(value, t.dtype)}> : {t}")

    def constant(self, array: np.ndarray, dtype: str | None = None) -> Value:
        dt = dtype or self.dtype
        a: np.ndarray = np.ascontiguousarray(np.asarray(array, dtype=NUMPY_DTYPE[dt]))
        t = TensorType(a.shape, dt)
        return self._emit("constant", (), t, f'stablehlo.constant dense<"0x{a.tobytes().hex().upper()}"> : {t}')

    def iota(self, shape: Sequence[int], dim: int, dtype: str = "i32") -> Value:
        t = TensorType(tuple(shape), dtype)
        return self._emit("iota", (), t, f"stablehlo.iota dim = {dim} : {t}")

    # ----------------------------------------------------------------- elementwise
    def _binary(self, op: str, a: Value, b: Value) -> Value:
        if a.type != b.type:
            raise UnsupportedSpec(f"stablehlo.{op} operands differ: {a.type} vs {b.type}")
        return self._emit(op, (a, b), a.type, f"stablehlo.{op} {a.name}, {b.name} : {a.type}")

    def _unary(self, op: str, a: Value) -> Value:
        return self._emit(op, (a,), a.type, f"stablehlo.{op} {a.name} : {a.type}")

    def add(self, a: Value, b: Value) -> Value:
        return self._binary("add", a, b)

    def subtract(self, a: Value, b: Value) -> Value:
        return self._binary("subtract", a, b)

    def multiply(self, a: Value, b: Value) -> Value:
        return self._binary("multiply", a, b)

    def divide(self, a: Value, b: Value) -> Value:
        return self._binary("divide", a, b)

    def maximum(self, a: Value, b: Value) -> Value:
        return self._binary("maximum", a, b)

    def minimum(self, a: Value, b: Value) -> Value:
        return self._binary("minimum", a, b)

    def negate(self, a: Value) -> Value:
        return self._unary("negate", a)

    def exp(self, a: Value) -> Value:
        return self._unary("exponential", a)

    def log(self, a: Value) -> Value:
        return self._unary("log", a)

    def tanh(self, a: Value) -> Value:
        return self._unary("tanh", a)

    def logistic(self, a: Value) -> Value:
        return self._unary("logistic", a)

    def sqrt(self, a: Value) -> Value:
        return self._unary("sqrt", a)

    def rsqrt(self, a: Value) -> Value:
        return self._unary("rsqrt", a)

    def abs(self, a: Value) -> Value:
        return self._unary("abs", a)

    def sine(self, a: Value) -> Value:
        return self._unary("sine", a)

    def cosine(self, a: Value) -> Value:
        return self._unary("cosine", a)

    def compare(self, a: Value, b: Value, direction: str) -> Value:
        kind = "FLOAT" if a.dtype in FLOAT_DTYPES else "SIGNED"
        t = TensorType(a.shape, "i1")
        text = f"stablehlo.compare {direction}, {a.name}, {b.name}, {kind} : ({a.type}, {b.type}) -> {t}"
        return self._emit("compare", (a, b), t, text, direction=direction)

    def select(self, pred: Value, on_true: Value, on_false: Value) -> Value:
        text = f"stablehlo.select {pred.name}, {on_true.name}, {on_false.name} : {pred.type}, {on_true.type}"
        return self._emit("select", (pred, on_true, on_false), on_true.type, text)

    def convert(self, a: Value, dtype: str) -> Value:
        t = TensorType(a.shape, dtype)
        return self._emit("convert", (a,), t, f"stablehlo.convert {a.name} : ({a.type}) -> {t}")

    def optimization_barrier(self, a: Value) -> Value:
        """`a` itself, but materialised: the compiler may not fuse its producer into its consumers.
        (IREE fuses a transposed kernel into the convolution that reads it and then runs that
        convolution ~10× slower; behind a barrier the transpose is one small copy.)"""
        return self._emit("optimization_barrier", (a,), a.type,
                          f"stablehlo.optimization_barrier {a.name} : {a.type}")

    def optimization_barriers(self, xs: Sequence[Value]) -> list[Value]:
        """`xs` themselves, as ONE barrier: nothing that reads an output starts before every input is
        computed (how a train step sequences each parameter's update before the rest of the backward).
        On the tape each operand is its own identity op."""
        if len(xs) < 2:
            return [self.optimization_barrier(x) for x in xs]
        base = f"%{self._next_id()}"
        outs = [Value(f"{base}#{i}", x.type, self) for i, x in enumerate(xs)]
        names, types = ", ".join(x.name for x in xs), ", ".join(str(x.type) for x in xs)
        self.lines.append(f"{base}:{len(xs)} = stablehlo.optimization_barrier {names} : {types}")
        for x, o in zip(xs, outs, strict=True):
            self.tape.append(TapeOp("optimization_barrier", (x,), (o,), {}))
        return outs

    # ----------------------------------------------------------------- shape
    def broadcast_in_dim(self, a: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
        t = TensorType(tuple(shape), a.dtype)
        for i, d in enumerate(dims):
            if a.shape[i] not in (1, t.shape[d]):
                raise UnsupportedSpec(f"broadcast_in_dim {a.type} -> {t} along {list(dims)}: dim {i} does not fit")
        text = f"stablehlo.broadcast_in_dim {a.name}, dims = {_ints(dims)} : ({a.type}) -> {t}"
        return self._emit("broadcast_in_dim", (a,), t, text, dims=tuple(dims))

    def reshape(self, a: Value, shape: Sequence[int]) -> Value:
        t = TensorType(tuple(shape), a.dtype)
        if t.size != a.type.size:
            raise UnsupportedSpec(f"reshape {a.type} -> {t}: element counts differ")
        if t == a.type:
            return a
        return self._emit("reshape", (a,), t, f"stablehlo.reshape {a.name} : ({a.type}) -> {t}")

    def transpose(self, a: Value, perm: Sequence[int]) -> Value:
        if list(perm) == list(range(a.type.rank)):
            return a
        t = TensorType(tuple(a.shape[p] for p in perm), a.dtype)
        text = f"stablehlo.transpose {a.name}, dims = {_ints(perm)} : ({a.type}) -> {t}"
        return self._emit("transpose", (a,), t, text, perm=tuple(perm))

    def reverse(self, a: Value, dims: Sequence[int]) -> Value:
        if not dims:
            return a
        text = f"stablehlo.reverse {a.name}, dims = {_ints(dims)} : {a.type}"
        return self._emit("reverse", (a,), a.type, text, dims=tuple(dims))

    def pad(self, a: Value, low: Sequence[int], high: Sequence[int], interior: Sequence[int] | None = None,
            value: float = 0.0) -> Value:
        interior = list(interior) if interior is not None else [0] * a.type.rank
        shape = tuple(
            lo + hi + n + max(n - 1, 0) * it for n, lo, hi, it in zip(a.shape, low, high, interior, strict=True)
        )
        pv = self.stop_gradient(self.full(value, (), a.dtype))
        t = TensorType(shape, a.dtype)
        text = (f"stablehlo.pad {a.name}, {pv.name}, low = {_ints(low)}, high = {_ints(high)}, "
                f"interior = {_ints(interior)} : ({a.type}, {pv.type}) -> {t}")
        return self._emit("pad", (a,), t, text, low=tuple(low), high=tuple(high), interior=tuple(interior))

    def slice(self, a: Value, start: Sequence[int], limit: Sequence[int],
              strides: Sequence[int] | None = None) -> Value:
        strides = list(strides) if strides is not None else [1] * a.type.rank
        shape = tuple(-(-(hi - lo) // s) for lo, hi, s in zip(start, limit, strides, strict=True))
        t = TensorType(shape, a.dtype)
        ranges = ", ".join(
            f"{lo}:{hi}" + (f":{s}" if s != 1 else "") for lo, hi, s in zip(start, limit, strides, strict=True)
        )
        return self._emit("slice", (a,), t, f"stablehlo.slice {a.name} [{ranges}] : ({a.type}) -> {t}",
                          start=tuple(start), limit=tuple(limit), strides=tuple(strides))

    def concatenate(self, xs: Sequence[Value], dim: int) -> Value:
        if len(xs) == 1:
            return xs[0]
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        t = TensorType(tuple(shape), xs[0].dtype)
        names = ", ".join(x.name for x in xs)
        types = ", ".join(str(x.type) for x in xs)
        return self._emit("concatenate", tuple(xs), t, f"stablehlo.concatenate {names}, dim = {dim} : ({types}) -> {t}",
                          dim=dim)

    def dynamic_slice(self, a: Value, starts: Sequence[Value], sizes: Sequence[int]) -> Value:
        """`a[starts : starts + sizes]` with rank-0 integer start indices (clamped into range by StableHLO)."""
        if len(starts) != a.type.rank or len(sizes) != a.type.rank:
            raise UnsupportedSpec(f"dynamic_slice of {a.type} needs {a.type.rank} starts and sizes")
        t = TensorType(tuple(sizes), a.dtype)
        names = ", ".join(s.name for s in starts)
        types = ", ".join(str(s.type) for s in starts)
        text = f"stablehlo.dynamic_slice {a.name}, {names}, sizes = {_ints(sizes)} : ({a.type}, {types}) -> {t}"
        return self._emit("dynamic_slice", (a, *starts), t, text, sizes=tuple(sizes))

    def dynamic_update_slice(self, a: Value, update: Value, starts: Sequence[Value]) -> Value:
        """`a` with `update` written at `starts` (rank-0 integer indices)."""
        if len(starts) != a.type.rank or update.type.rank != a.type.rank:
            raise UnsupportedSpec(f"dynamic_update_slice of {update.type} into {a.type}: ranks or starts differ")
        names = ", ".join(s.name for s in starts)
        types = ", ".join(str(s.type) for s in starts)
        text = (f"stablehlo.dynamic_update_slice {a.name}, {update.name}, {names} : "
                f"({a.type}, {update.type}, {types}) -> {a.type}")
        return self._emit("dynamic_update_slice", (a, update, *starts), a.type, text)

    # ----------------------------------------------------------------- reduction
    _REDUCERS = {"sum": ("add", 0.0), "max": ("maximum", -np.inf), "min": ("minimum", np.inf)}

    def reduce(self, a: Value, dims: Sequence[int], kind: str = "sum") -> Value:
        op, init = self._REDUCERS[kind]
        iv = self.stop_gradient(self.full(init, (), a.dtype))
        t = TensorType(tuple(n for i, n in enumerate(a.shape) if i not in dims), a.dtype)
        text = (f"stablehlo.reduce({a.name} init: {iv.name}) applies stablehlo.{op} across dimensions = "
                f"{_ints(sorted(dims))} : ({a.type}, {iv.type}) -> {t}")
        return self._emit(f"reduce_{kind}", (a,), t, text, dims=tuple(sorted(dims)))

    def reduce_sums(self, xs: Sequence[Value], dims: Sequence[int]) -> list[Value]:
        """The sums of every `xs` (one shape) over `dims` as ONE variadic stablehlo.reduce: a
        single pass over the data however many sums. On the tape each operand is its own
        reduce_sum (its VJP rule is a broadcast)."""
        if len(xs) < 2:
            return [self.sum(x, dims) for x in xs]
        if len({x.type for x in xs}) != 1:
            raise UnsupportedSpec(f"reduce_sums operands must share one type, got {[str(x.type) for x in xs]}")
        dims = sorted(dims)
        n, st = len(xs), TensorType((), xs[0].dtype)
        inits = [self.stop_gradient(self.full(0.0, (), st.dtype)) for _ in xs]
        accs, vals = [self._fresh_arg(st) for _ in xs], [self._fresh_arg(st) for _ in xs]
        sums = [f"%{self._next_id()}" for _ in xs]
        base = f"%{self._next_id()}"
        t = TensorType(tuple(m for i, m in enumerate(xs[0].shape) if i not in dims), st.dtype)
        outs = [Value(f"{base}#{i}", t, self) for i in range(n)]
        adds = "".join(f"        {s} = stablehlo.add {a.name}, {v.name} : {st}\n"
                       for s, a, v in zip(sums, accs, vals, strict=True))
        self.lines.append(
            f'{base}:{n} = "stablehlo.reduce"({", ".join(v.name for v in [*xs, *inits])}) '
            f"<{{dimensions = array<i64{': ' if dims else ''}{', '.join(map(str, dims))}>}}> ({{\n"
            f"      ^bb0({', '.join(f'{a.name}: {st}' for a in [*accs, *vals])}):\n{adds}"
            f"        stablehlo.return {', '.join(sums)} : {', '.join([str(st)] * n)}\n"
            f"    }}) : ({', '.join([str(xs[0].type)] * n + [str(st)] * n)}) -> ({', '.join([str(t)] * n)})")
        for x, o in zip(xs, outs, strict=True):
            self.tape.append(TapeOp("reduce_sum", (x,), (o,), {"dims": tuple(dims)}))
        return outs

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, xs: Sequence[Value], replica_groups: Sequence[Sequence[int]]) -> list[Value]:
        """One stablehlo.all_reduce (add) of every `xs` across each group of replicas: each replica
        gets the group's elementwise sum. One variadic op, so XLA runs one collective for all of
        them; on the tape each operand is its own op (its VJP rule is one all_reduce)."""
        if not xs:
            return []
        dtypes = {x.dtype for x in xs}
        if len(dtypes) != 1:
            raise UnsupportedSpec(f"all_reduce operands must share one element type, got {sorted(dtypes)}")
        groups = tuple(tuple(int(r) for r in g) for g in replica_groups)
        if not groups or len({len(g) for g in groups}) != 1:
            raise UnsupportedSpec(f"all_reduce replica groups must be non-empty and of one size, got {groups}")
        st = TensorType((), xs[0].dtype)
        lhs, rhs = self._fresh_arg(st), self._fresh_arg(st)
        total = f"%{self._next_id()}"
        base = f"%{self._next_id()}"
        outs = [Value(base if len(xs) == 1 else f"{base}#{i}", x.type, self) for i, x in enumerate(xs)]
        rows = ", ".join(_ints(g) for g in groups)
        types = ", ".join(str(x.type) for x in xs)
        self.lines.append(
            f'{base}{"" if len(xs) == 1 else f":{len(xs)}"} = "stablehlo.all_reduce"({", ".join(x.name for x in xs)}) '
            f"<{{replica_groups = dense<[{rows}]> : tensor<{len(groups)}x{len(groups[0])}xi64>}}> ({{\n"
            f"      ^bb0({lhs.name}: {st}, {rhs.name}: {st}):\n"
            f"        {total} = stablehlo.add {lhs.name}, {rhs.name} : {st}\n"
            f"        stablehlo.return {total} : {st}\n"
            f"    }}) : ({types}) -> ({types})")
        for x, o in zip(xs, outs, strict=True):
            self.tape.append(TapeOp("all_reduce", (x,), (o,), {"replica_groups": groups}))
        return outs

    def process_sum(self, xs: Sequence[Value]) -> list[Value]:
        """Every `xs` summed over the processes of a multi-process run, each process getting the sums:
        the host call PROCESS_SUM (a runtime that runs such a step registers it; train/mpi.py's is MPI's
        all-reduce), where XLA's collectives stop at one process's devices. The calls of one module are
        chained through a scalar token, first operand and first result, so every process makes them in
        the same order. On the tape each operand is its own op (its VJP rule is one process_sum)."""
        if not xs:
            return []
        token = self._process_token if self._process_token is not None else self.full(0.0, (), "f32")
        base = f"%{self._next_id()}"
        ins = [token, *xs]
        outs = [Value(f"{base}#{i}", v.type, self) for i, v in enumerate(ins)]
        types = ", ".join(str(v.type) for v in ins)
        self.lines.append(f"{base}:{len(ins)} = stablehlo.custom_call @{PROCESS_SUM}({', '.join(v.name for v in ins)}) "
                          f"{{api_version = 4 : i32, has_side_effect = true}} : ({types}) -> ({types})")
        self._process_token = outs[0]
        for x, o in zip(xs, outs[1:], strict=True):
            self.tape.append(TapeOp("process_sum", (x,), (o,), {}))
        return outs[1:]

    # ----------------------------------------------------------------- control flow
    def _fresh_arg(self, t: TensorType) -> Value:
        """A region (block) argument: a fresh name that no other value of the module uses."""
        return Value(f"%r{self._next_id()}", t, self)

    def _region(self, types: Sequence[TensorType], fn: Callable[[Builder, list[Value]], Sequence[Value]],
                names: Sequence[str] | None = None) -> tuple[list[Value], list[Value], list[str]]:
        """Build a region with a child builder that shares this one's name counter (SSA names stay
        unique module-wide); the child's tape is dropped: ops inside a region are not differentiated
        by the walk (a loop lives inside a custom VJP). `names`: reuse these block-argument names."""
        child = Builder(self.dtype, self.module_name, self.target)
        child._n = self._n
        args = [child._fresh_arg(t) for t in types] if names is None else \
            [Value(nm, t, child) for nm, t in zip(names, types, strict=True)]
        outs = list(fn(child, args))
        self._n = child._n
        return args, outs, child.lines

    def while_(self, init: Sequence[Value], cond: Callable[[Builder, list[Value]], Value],
               body: Callable[[Builder, list[Value]], Sequence[Value]]) -> list[Value]:
        """stablehlo.while: `cond(b, carried) -> i1` and `body(b, carried) -> carried'`, each built with a
        child builder `b` on the region's arguments. Everything the body reads must be carried (no
        implicit captures). No VJP rule: differentiate a loop through `custom_vjp`."""
        types = [v.type for v in init]
        cargs, (pred,), clines = self._region(types, lambda cb, a: [cond(cb, a)])
        bargs, bouts, blines = self._region(types, body, [a.name for a in cargs])
        if pred.type != TensorType((), "i1"):
            raise UnsupportedSpec(f"while cond must return tensor<i1>, got {pred.type}")
        if [o.type for o in bouts] != types:
            raise UnsupportedSpec("while body must return its carried types "
                                  f"{[str(t) for t in types]}, got {[str(o.type) for o in bouts]}")
        base = f"%{self._n}"
        self._n += 1
        n = len(init)
        outs = [Value(base if n == 1 else f"{base}#{i}", t, self) for i, t in enumerate(types)]
        tys = ", ".join(str(t) for t in types)
        head = ", ".join(f"{a.name} = {v.name}" for a, v in zip(bargs, init, strict=True))
        ind = "\n      "
        text = (f"{base}{'' if n == 1 else f':{n}'} = stablehlo.while({head}) : {tys}\n    cond {{"
                + ind + ind.join(clines) + f"{ind}stablehlo.return {pred.name} : {pred.type}\n    }} do {{"
                + ind + ind.join(blines) + f"{ind}stablehlo.return {', '.join(o.name for o in bouts)} : {tys}"
                + "\n    }")
        self.lines.append(text)
        self.tape.append(TapeOp("while", tuple(init), tuple(outs), {}))
        return outs

    # ----------------------------------------------------------------- conveniences (compositions of the above)
    def sum(self, a: Value, dims: Sequence[int] | None = None) -> Value:
        return self.reduce(a, range(a.type.rank) if dims is None else dims, "sum")

    def blocked_sum(self, a: Value, dims: Sequence[int]) -> Value:
        """Σ a over `dims` in stages, each behind an optimization barrier (XLA's simplifier would
        merge consecutive reduces back into one). While more than one axis is reduced and the
        minor-most of them is at most SUM_BLOCK long, that axis alone first. Then within blocks along
        each reduced axis longer than SUM_BLOCK (split as (n/q, q), q the largest divisor of n in
        MIN_SUM_BLOCK..SUM_BLOCK), then across the blocks; one plain sum where no axis is that long,
        or one has no such divisor.
        (XLA's CPU compiler rewrites a reduction with an axis longer than 32 into a reduce-window its
        own loop emitter runs; one whose axes are all short it hands to YNNPACK's, 2–4× faster, unless
        it fuses an elementwise producer into it, as it does BN's Σ(x − μ)². Then its own emitter sums
        each output element over every reduced row, a row apart in memory; the minor axis first keeps
        an output's rows within a few cache lines.)"""
        dims = sorted(dims)
        if len(dims) > 1 and a.shape[dims[-1]] <= SUM_BLOCK:
            return self.blocked_sum(self.optimization_barrier(self.sum(a, dims[-1:])), dims[:-1])
        shape: list[int] = []
        inner: list[int] = []  # the first stage's axes (of the split shape)
        outer: list[int] = []  # the block axes, which the second stage sums
        for d, n in enumerate(a.shape):
            if d in dims and n > SUM_BLOCK:
                q = next((q for q in range(SUM_BLOCK, MIN_SUM_BLOCK - 1, -1) if n % q == 0), None)
                if q is None:
                    return self.sum(a, dims)
                outer.append(len(shape))
                shape.append(n // q)
                n = q
            if d in dims:
                inner.append(len(shape))
            shape.append(n)
        if not outer:
            return self.sum(a, dims)
        partial = self.sum(self.reshape(a, shape), inner)
        left = [i for i in range(len(shape)) if i not in inner]  # the partial sums' axes
        return self.sum(self.optimization_barrier(partial), [left.index(i) for i in outer])

    def broadcast_to(self, a: Value, shape: Sequence[int], dims: Sequence[int] | None = None) -> Value:
        """Broadcast `a` to `shape`; by default its axes align with the trailing axes (numpy rule)."""
        if dims is None:
            dims = range(len(shape) - a.type.rank, len(shape))
        if a.shape == tuple(shape) and list(dims) == list(range(len(shape))):
            return a
        return self.broadcast_in_dim(a, shape, list(dims))

    def relu(self, a: Value) -> Value:
        zero = self.full(0.0, a.shape, a.dtype)
        return self.select(self.compare(a, zero, "GT"), a, zero)

    def clip(self, a: Value, lo: float, hi: float) -> Value:
        """min(max(a, lo), hi) written with selects, so the derivative on the flat parts is exactly zero."""
        low = self.full(lo, a.shape, a.dtype)
        high = self.full(hi, a.shape, a.dtype)
        a = self.select(self.compare(a, low, "GT"), a, low)
        return self.select(self.compare(a, high, "LT"), a, high)
