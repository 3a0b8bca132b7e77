"""The signature of a StableHLO module's ``@main``, read from its text: what every backend checks
arguments against (no runtime, no cffi: the IREE backend uses it as the XLA one does)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

# numpy dtype <-> PJRT_Buffer_Type <-> MLIR element type: the one table of that fact.
DTYPES: list[tuple[np.dtype, str, str]] = [
    (np.dtype(np.bool_), "PRED", "i1"),
    (np.dtype(np.int8), "S8", "i8"),
    (np.dtype(np.int16), "S16", "i16"),
    (np.dtype(np.int32), "S32", "i32"),
    (np.dtype(np.int64), "S64", "i64"),
    (np.dtype(np.uint8), "U8", "ui8"),
    (np.dtype(np.uint16), "U16", "ui16"),
    (np.dtype(np.uint32), "U32", "ui32"),
    (np.dtype(np.uint64), "U64", "ui64"),
    (np.dtype(np.float16), "F16", "f16"),
    (np.dtype(np.float32), "F32", "f32"),
    (np.dtype(np.float64), "F64", "f64"),
    (np.dtype(np.complex64), "C64", "complex<f32>"),
    (np.dtype(np.complex128), "C128", "complex<f64>"),
]


@functools.cache
def extension_dtypes() -> tuple[tuple[np.dtype, str, str], ...]:
    """DTYPES' rows for what numpy lacks: bfloat16, from ml_dtypes (a jax dependency) where installed.
    Looked up only where DTYPES has no match: importing ml_dtypes registers its ufunc loops one by
    one, 0.6-0.8 s with numpy 2.4, which every process's start paid while it was imported here."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - depends on the environment
        return ()
    return ((np.dtype(ml_dtypes.bfloat16), "BF16", "bf16"),)


_DTYPE_OF_MLIR = {mlir: dt for dt, _, mlir in DTYPES}


def dtype_of_mlir(element_type: str) -> np.dtype | None:
    """The numpy dtype of an MLIR element type ("f32", "bf16", ...); None where hloforge has none."""
    found = _DTYPE_OF_MLIR.get(element_type)
    if found is None:
        found = next((dt for dt, _, mlir in extension_dtypes() if mlir == element_type), None)
    return found


def mlir_of_dtype(dtype: np.dtype | None) -> str | None:
    """The MLIR element type of a numpy dtype ("f32", "i32", "bf16", ...); None where hloforge has none."""
    return next((mlir for dt, _, mlir in (*DTYPES, *extension_dtypes()) if dt == dtype), None)


@dataclass(frozen=True)
class ArgSpec:
    """One parameter of the module's ``@main``, as read from the StableHLO text."""

    shape: tuple[int | None, ...] | None  # None: not a ranked tensor; a None dim is dynamic
    dtype: np.dtype | None  # None: an element type hloforge has no dtype for
    aliasing_output: int | None  # `tf.aliasing_output`: the output this input is donated to

    def describe(self) -> str:
        if self.shape is None:
            return "a non-tensor value"
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{dims or 'scalar'} {self.dtype}"


_MAIN = re.compile(r"func\.func\s+(?:public\s+)?@main\s*\(")
_OPEN, _CLOSE = "(<[{", ")>]}"


def _split_top_level(text: str, start: int, stop_char: str) -> tuple[list[str], int]:
    """Split text[start:] at top-level commas up to the unmatched ``stop_char``."""
    parts, depth, begin, i = [], 0, start, start
    while i < len(text):
        ch = text[i]
        if ch == '"':  # skip string attribute values
            i = text.index('"', i + 1)
            while text[i - 1] == "\\":
                i = text.index('"', i + 1)
        elif text.startswith("->", i):
            i += 1
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0 and ch == stop_char:
                parts.append(text[begin:i])
                return [p for p in parts if p.strip()], i
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
        i += 1
    raise ValueError("unbalanced brackets")


def _tensor_spec(type_text: str) -> tuple[tuple[int | None, ...] | None, np.dtype | None]:
    type_text = type_text.strip()
    if not (type_text.startswith("tensor<") and type_text.endswith(">")):
        return None, None
    inner, _ = _split_top_level(type_text, len("tensor<"), ">")
    match = re.fullmatch(r"((?:(?:\d+|\?)x)*)(.+)", inner[0].strip())  # inner[1:] = encoding
    if match is None:
        return None, None
    dims = tuple(None if d == "?" else int(d) for d in match.group(1).split("x")[:-1])
    return dims, dtype_of_mlir(match.group(2).strip())


def _main_params(mlir_text: str) -> tuple[list[str], int]:
    """The parameter texts of ``@main`` and the index of their closing ")"; ValueError when the text has
    no recognizable ``@main``."""
    match = _MAIN.search(mlir_text)
    if match is None:
        raise ValueError("no @main")
    return _split_top_level(mlir_text, match.end(), ")")


def parse_main_results(mlir_text: str) -> list[tuple[tuple[int | None, ...] | None, np.dtype | None]] | None:
    """The (shape, dtype) of each result of ``@main``, in order; None when the text has no recognizable
    ``@main`` or result list."""
    try:
        _, end = _main_params(mlir_text)
        rest = mlir_text[end + 1:].lstrip()
        if not rest.startswith("->"):
            return []
        rest = rest[2:].lstrip()
        if rest.startswith("("):
            results, _ = _split_top_level(rest, 1, ")")
        else:  # one result, up to its attributes' or the body's "{"
            results = [rest.split("{", 1)[0]]
        return [_tensor_spec(r.strip().partition(" {")[0]) for r in results]
    except ValueError:
        return None


def parse_main_signature(mlir_text: str) -> list[ArgSpec] | None:
    """The parameters of ``@main``; None when the text has no recognizable ``@main``."""
    try:
        params, _ = _main_params(mlir_text)
        specs = []
        for param in params:
            # "%arg0: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}"
            _, _, rest = param.partition(":")
            type_text, _, attrs = rest.strip().partition(" {")
            if not attrs and "{" in type_text:
                type_text, _, attrs = type_text.partition("{")
            shape, dtype = _tensor_spec(type_text)
            alias = re.search(r"tf\.aliasing_output\s*=\s*(\d+)", attrs)
            specs.append(ArgSpec(shape, dtype, int(alias.group(1)) if alias else None))
        return specs
    except ValueError:
        return None
