"""The SSA values the builder hands out (core/hlo.py): element types, `TensorType`, `Value` (with its
arithmetic sugar), the tape's `TapeOp` that core/autodiff.py differentiates, and how literals and
attributes print.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.f32 import F32_RANGE

FLOAT_DTYPES = ("f32", "f64")
NUMPY_DTYPE = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "i1": np.bool_}


@attrs.frozen
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(NUMPY_DTYPE[self.dtype]).itemsize


class Ops(Protocol):
    """What a Value's arithmetic sugar calls on the builder that made it (hloforge.core.hlo.Builder)."""

    def lift(self, x: Value | float, like: Value) -> Value: ...
    def add(self, a: Value, b: Value) -> Value: ...
    def subtract(self, a: Value, b: Value) -> Value: ...
    def multiply(self, a: Value, b: Value) -> Value: ...
    def divide(self, a: Value, b: Value) -> Value: ...
    def negate(self, a: Value) -> Value: ...


class Value:
    """An SSA value. Identity (not name) is what autodiff keys on."""

    __slots__ = ("name", "type", "b")

    def __init__(self, name: str, type_: TensorType, builder: Ops):
        self.name = name
        self.type = type_
        self.b = builder

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"{self.name}: {self.type}"

    # Arithmetic sugar; a Python number is splatted to this value's type.
    def __add__(self, o: Value | float) -> Value:
        return self.b.add(self, self.b.lift(o, self))

    __radd__ = __add__

    def __sub__(self, o: Value | float) -> Value:
        return self.b.subtract(self, self.b.lift(o, self))

    def __rsub__(self, o: float) -> Value:
        return self.b.subtract(self.b.lift(o, self), self)

    def __mul__(self, o: Value | float) -> Value:
        return self.b.multiply(self, self.b.lift(o, self))

    __rmul__ = __mul__

    def __truediv__(self, o: Value | float) -> Value:
        return self.b.divide(self, self.b.lift(o, self))

    def __rtruediv__(self, o: float) -> Value:
        return self.b.divide(self.b.lift(o, self), self)

    def __neg__(self) -> Value:
        return self.b.negate(self)


@attrs.define
class TapeOp:
    """One differentiable op: `autodiff.VJP[op]` maps output cotangents to input ones."""

    op: str
    ins: tuple[Value, ...]
    outs: tuple[Value, ...]
    attrs: dict[str, Any]
    # For op == "custom": bwd(builder, out_cotangents) -> in_cotangents (None = zero).
    bwd: Callable[..., Sequence[Value | None]] | None = None


def float_literal(v: float, dtype: str) -> str:
    """Exact hex literal, so f64 gate constants are bit-exact and inf/nan print."""
    if dtype == "f64":
        return "0x" + struct.pack(">d", float(v)).hex().upper()
    if dtype == "f32":
        try:
            return "0x" + struct.pack(">f", float(v)).hex().upper()
        except OverflowError:  # a finite number past f32's max: a spec's option, say (its checks let it by)
            raise UnsupportedSpec(f"the constant {v!r} is beyond float32's range ({F32_RANGE}); the programs "
                                  "take it as f32") from None
    if dtype == "i1":
        return "true" if v else "false"
    return str(int(v))


def _ints(xs: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


ConvSpec = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
NCHW_OIHW: ConvSpec = ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3))


def _conv_labels(spec: tuple[int, ...], first: str, second: str) -> str:
    labels = [""] * len(spec)
    labels[spec[0]], labels[spec[1]] = first, second
    for i, d in enumerate(spec[2:]):
        labels[d] = str(i)
    return "[" + ", ".join(labels) + "]"
