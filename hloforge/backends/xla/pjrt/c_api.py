"""The PJRT C API as the binding sees it: its one cffi FFI, CDEF (:mod:`.declarations`) as cffi
parsed it ahead of time, and the facts the calls read off it.

No C compiler is involved: the plugin is opened with ``ffi.dlopen`` (see :mod:`.api`). The FFI is not
parsed from CDEF at import. pycparser's parse, and its parse of each type a call first names, cost
every process that loads a plugin a fifth of a second or more, a compile worker on its way to its
first compile among them (benchmarks/NOTES.md). It is loaded from :mod:`.parsed_declarations`, which
cffi's out-of-line ABI mode wrote from CDEF: ``python scripts/parse_pjrt_declarations.py`` writes it
again after CDEF changes, and tests/test_pjrt_declarations.py holds the two to each other, type by type.
"""

from __future__ import annotations

import functools
from typing import Any

from hloforge.backends.xla.pjrt.declarations import TYPED
from hloforge.backends.xla.pjrt.parsed_declarations import ffi

_BUFFER_TYPE_CODES: dict[str, int] = ffi.typeof("PJRT_Buffer_Type").relements
_ERROR_CODE_NAMES: dict[int, str] = {
    code: name.removeprefix("PJRT_Error_Code_")
    for name, code in ffi.typeof("PJRT_Error_Code").relements.items()
}


@functools.cache
def _struct_size(ctype: Any) -> int:
    """The header's PJRT_STRUCT_SIZE: offset of the last field plus that field's size. `ctype`: the
    struct's name or its cffi type."""
    _, last = (ffi.typeof(ctype) if isinstance(ctype, str) else ctype).fields[-1]
    return last.offset + ffi.sizeof(last.type)


def _slot_end(name: str) -> int:
    return ffi.offsetof("PJRT_Api", f"PJRT_{name}") + ffi.sizeof("void*")


# The plugin's PJRT_Api must reach at least as far as the last slot hloforge always calls.
_API_SIZE_NEEDED = max(_slot_end(name) for name in TYPED)
