"""The builder's structured ops, which core/hlo.py's `Builder` inherits: the ops whose text carries
dimension numbers or a window (gather, scatter-add, dot_general, convolution, reduce_window). They
emit through the builder's plumbing like every other op; each one's VJP rule is in core/autodiff.py
under the same name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.ssa import NCHW_OIHW, ConvSpec, TensorType, Value, _conv_labels, _ints


class StructuredOps:
    """Builder methods (a mixin: only `Builder` inherits it)."""

    if TYPE_CHECKING:  # the Builder's plumbing these ops emit through (core/hlo.py)
        _REDUCERS: dict[str, tuple[str, float]]

        def _next_id(self) -> str: ...
        def _fresh(self, t: TensorType) -> Value: ...
        def _fresh_arg(self, t: TensorType) -> Value: ...
        def _emit(self, op: str, ins: Sequence[Value], t: TensorType, text: str, **attrs_: Any) -> Value: ...
        def full(self, value: float, shape: Sequence[int] = (), dtype: str | None = None) -> Value: ...
        def stop_gradient(self, x: Value) -> Value: ...

    # ----------------------------------------------------------------- shape
    def gather(self, a: Value, indices: Value, *, offset_dims: Sequence[int], collapsed_slice_dims: Sequence[int],
               start_index_map: Sequence[int], index_vector_dim: int, slice_sizes: Sequence[int]) -> Value:
        """stablehlo.gather (no operand batching dims): e.g. rows of a table, W[ids], with
        offset_dims=[r], collapsed_slice_dims=[0], start_index_map=[0], index_vector_dim=r, ids [.., 1]."""
        batch = [n for d, n in enumerate(indices.shape) if d != index_vector_dim]
        offsets = [n for d, n in enumerate(slice_sizes) if d not in collapsed_slice_dims]
        rank = len(batch) + len(offsets)
        shape, bi, oi = [], iter(batch), iter(offsets)
        for d in range(rank):
            shape.append(next(oi) if d in offset_dims else next(bi))
        t = TensorType(tuple(shape), a.dtype)
        dn = (f"#stablehlo.gather<offset_dims = {_ints(offset_dims)}, collapsed_slice_dims = "
              f"{_ints(collapsed_slice_dims)}, start_index_map = {_ints(start_index_map)}, "
              f"index_vector_dim = {index_vector_dim}>")
        text = (f'"stablehlo.gather"({a.name}, {indices.name}) <{{dimension_numbers = {dn}, '
                f"indices_are_sorted = false, slice_sizes = array<i64: {', '.join(map(str, slice_sizes))}>}}> : "
                f"({a.type}, {indices.type}) -> {t}")
        return self._emit("gather", (a, indices), t, text, offset_dims=tuple(offset_dims),
                          collapsed_slice_dims=tuple(collapsed_slice_dims), start_index_map=tuple(start_index_map),
                          index_vector_dim=index_vector_dim, slice_sizes=tuple(slice_sizes))

    def scatter_add(self, a: Value, indices: Value, updates: Value, *, update_window_dims: Sequence[int],
                    inserted_window_dims: Sequence[int], scatter_dims_to_operand_dims: Sequence[int],
                    index_vector_dim: int) -> Value:
        """stablehlo.scatter with an add combiner: `a` plus every update at its index (duplicates summed)."""
        x, y = self._fresh_arg(TensorType((), a.dtype)), self._fresh_arg(TensorType((), a.dtype))
        s = self._fresh(TensorType((), a.dtype))
        dn = (f"#stablehlo.scatter<update_window_dims = {_ints(update_window_dims)}, inserted_window_dims = "
              f"{_ints(inserted_window_dims)}, scatter_dims_to_operand_dims = {_ints(scatter_dims_to_operand_dims)}, "
              f"index_vector_dim = {index_vector_dim}>")
        st = TensorType((), a.dtype)
        text = (f'"stablehlo.scatter"({a.name}, {indices.name}, {updates.name}) <{{indices_are_sorted = false, '
                f"scatter_dimension_numbers = {dn}, unique_indices = false}}> ({{\n"
                f"      ^bb0({x.name}: {st}, {y.name}: {st}):\n"
                f"        {s.name} = stablehlo.add {x.name}, {y.name} : {st}\n"
                f"        stablehlo.return {s.name} : {st}\n"
                f"    }}) : ({a.type}, {indices.type}, {updates.type}) -> {a.type}")
        return self._emit("scatter_add", (a, indices, updates), a.type, text,
                          update_window_dims=tuple(update_window_dims),
                          inserted_window_dims=tuple(inserted_window_dims),
                          scatter_dims_to_operand_dims=tuple(scatter_dims_to_operand_dims),
                          index_vector_dim=index_vector_dim)

    # ----------------------------------------------------------------- contraction
    def dot_general(self, a: Value, b: Value, contract: tuple[Sequence[int], Sequence[int]],
                    batch: tuple[Sequence[int], Sequence[int]] = ((), ())) -> Value:
        (ac, bc), (ab, bb) = contract, batch
        a_free = [d for d in range(a.type.rank) if d not in ac and d not in ab]
        b_free = [d for d in range(b.type.rank) if d not in bc and d not in bb]
        shape = tuple([a.shape[d] for d in ab] + [a.shape[d] for d in a_free] + [b.shape[d] for d in b_free])
        for x, y in zip(list(ac) + list(ab), list(bc) + list(bb), strict=True):
            if a.shape[x] != b.shape[y]:
                raise UnsupportedSpec(f"dot_general {a.type} · {b.type}: dim {x} ≠ dim {y}")
        t = TensorType(shape, a.dtype)
        bt = f"batching_dims = {_ints(ab)} x {_ints(bb)}, " if ab else ""
        text = (f"stablehlo.dot_general {a.name}, {b.name}, {bt}contracting_dims = {_ints(ac)} x {_ints(bc)} : "
                f"({a.type}, {b.type}) -> {t}")
        return self._emit("dot_general", (a, b), t, text,
                          contract=(tuple(ac), tuple(bc)), batch=(tuple(ab), tuple(bb)))

    def convolution(self, x: Value, w: Value, *, strides: Sequence[int], padding: Sequence[tuple[int, int]],
                    lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                    feature_groups: int = 1, batch_groups: int = 1, spec: ConvSpec = NCHW_OIHW) -> Value:
        nsp = x.type.rank - 2
        lhs_dilation = tuple(lhs_dilation or (1,) * nsp)
        rhs_dilation = tuple(rhs_dilation or (1,) * nsp)
        ls, rs, os_ = spec
        out = [0] * x.type.rank
        out[os_[0]] = x.shape[ls[0]] // batch_groups
        out[os_[1]] = w.shape[rs[0]]
        for i in range(nsp):
            n = (x.shape[ls[2 + i]] - 1) * lhs_dilation[i] + 1
            k = (w.shape[rs[2 + i]] - 1) * rhs_dilation[i] + 1
            size = (n + padding[i][0] + padding[i][1] - k) // strides[i] + 1
            if size <= 0:
                raise UnsupportedSpec(f"convolution {x.type} with kernel {w.type}: output spatial dim {i} is empty")
            out[os_[2 + i]] = size
        if x.shape[ls[1]] != w.shape[rs[1]] * feature_groups:
            raise UnsupportedSpec(
                f"convolution input has {x.shape[ls[1]]} channels, kernel expects "
                f"{w.shape[rs[1]]}×{feature_groups} groups")
        t = TensorType(tuple(out), x.dtype)
        dn = f"{_conv_labels(ls, 'b', 'f')}x{_conv_labels(rs, 'o', 'i')}->{_conv_labels(os_, 'b', 'f')}"
        pad = "[" + ", ".join(f"[{lo}, {hi}]" for lo, hi in padding) + "]"
        text = (f"stablehlo.convolution({x.name}, {w.name}) dim_numbers = {dn}, window = {{stride = {_ints(strides)}, "
                f"pad = {pad}, lhs_dilate = {_ints(lhs_dilation)}, rhs_dilate = {_ints(rhs_dilation)}}} "
                f"{{batch_group_count = {batch_groups} : i64, feature_group_count = {feature_groups} : i64}} : "
                f"({x.type}, {w.type}) -> {t}")
        return self._emit("convolution", (x, w), t, text, strides=tuple(strides),
                          padding=tuple(tuple(p) for p in padding), lhs_dilation=lhs_dilation,
                          rhs_dilation=rhs_dilation, feature_groups=feature_groups, batch_groups=batch_groups,
                          spec=spec)

    # ----------------------------------------------------------------- reduction
    def reduce_window(self, a: Value, window: Sequence[int], strides: Sequence[int],
                      padding: Sequence[tuple[int, int]], kind: str = "max") -> Value:
        """stablehlo.reduce_window: `kind` ("sum", "max", "min") over every window of sizes `window`
        moved by `strides` over `a` padded with the reducer's identity (−inf for max)."""
        op, init = self._REDUCERS[kind]
        rank = a.type.rank
        if not len(window) == len(strides) == len(padding) == rank:
            raise UnsupportedSpec(f"reduce_window on {a.type} needs {rank} window sizes, strides and pads, got "
                                  f"{list(window)}, {list(strides)}, {list(padding)}")
        if min(window) < 1 or min(strides) < 1 or min(p for pair in padding for p in pair) < 0:
            raise UnsupportedSpec(f"reduce_window: window {list(window)} and strides {list(strides)} must be "
                                  f"positive, padding {[list(p) for p in padding]} non-negative")
        shape = tuple((n + lo + hi - w) // s + 1
                      for n, w, s, (lo, hi) in zip(a.shape, window, strides, padding, strict=True))
        if min(shape) <= 0:
            raise UnsupportedSpec(f"reduce_window {a.type}: window {list(window)} does not fit")
        iv = self.stop_gradient(self.full(init, (), a.dtype))
        st, t = iv.type, TensorType(shape, a.dtype)
        lhs, rhs = self._fresh_arg(st), self._fresh_arg(st)
        res = f"%{self._next_id()}"
        pads = ", ".join(f"[{lo}, {hi}]" for lo, hi in padding)
        text = (f'"stablehlo.reduce_window"({a.name}, {iv.name}) <{{padding = dense<[{pads}]> : tensor<{rank}x2xi64>, '
                f"window_dimensions = array<i64: {', '.join(map(str, window))}>, "
                f"window_strides = array<i64: {', '.join(map(str, strides))}>}}> ({{\n"
                f"      ^bb0({lhs.name}: {st}, {rhs.name}: {st}):\n"
                f"        {res} = stablehlo.{op} {lhs.name}, {rhs.name} : {st}\n"
                f"        stablehlo.return {res} : {st}\n"
                f"    }}) : ({a.type}, {st}) -> {t}")
        return self._emit(f"reduce_window_{kind}", (a,), t, text, window=tuple(window), strides=tuple(strides),
                          padding=tuple((int(lo), int(hi)) for lo, hi in padding))
