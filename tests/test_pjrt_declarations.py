"""The binding's FFI is CDEF as cffi parsed it ahead of time (hloforge/backends/xla/pjrt/c_api.py): every
type it names must be the one parsing CDEF now gives, layout and all, or the binding would hand the
plugin structs of the wrong size. After editing CDEF, `python scripts/parse_pjrt_declarations.py`."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hloforge.backends.xla.pjrt.c_api import ffi
from hloforge.backends.xla.pjrt.declarations import CDEF, parse

ROOT = Path(__file__).resolve().parent.parent


def spelled(cname: str) -> str:
    """A C type's name without struct tags: a parse ahead of time names `struct PJRT_Error *` what a
    parse now names `PJRT_Error *`, the typedef of that same struct."""
    return re.sub(r"\bstruct ", "", cname)


def opaque(lib, t) -> bool:
    """Whether a struct is declared without its fields (asking a parse ahead of time for an opaque
    struct's fields fails an assertion in cffi's C code, so its size is asked instead)."""
    try:
        lib.sizeof(t)
    except (ValueError, ffi.error):  # what a parse now raises, and what one ahead of time does
        return True
    return False


def layout(lib, name: str) -> tuple:
    """What a type is to the C side: its kind and name, size and alignment (where it has them: not an
    opaque struct's), each field's name, offset, type and bit size, each enumerator's value."""
    t = lib.typeof(name)
    shape: tuple = (t.kind, spelled(t.cname))
    if t.kind in ("struct", "union") and not opaque(lib, t):
        shape += (lib.sizeof(t), lib.alignof(t),
                  tuple((f, c.offset, spelled(c.type.cname), c.bitsize) for f, c in t.fields))
    elif t.kind == "enum":
        shape += (tuple(sorted(t.elements.items())),)
    elif t.kind in ("primitive", "pointer", "array"):
        shape += (lib.sizeof(t),)
    return shape


def names(lib) -> list[str]:
    typedefs, structs, unions = lib.list_types()
    return [*typedefs, *(f"struct {s}" for s in structs), *(f"union {u}" for u in unions)]


def test_the_parsed_ffi_is_cdef_type_by_type():
    fresh = parse()
    assert names(ffi) == names(fresh)
    assert [layout(ffi, n) for n in names(ffi)] == [layout(fresh, n) for n in names(fresh)]
    assert len(names(ffi)) > 80  # the PJRT argument structs and XLA FFI's call frame, not an empty list


def test_a_cdef_edit_the_parsed_ffi_has_not_seen_is_told_apart():
    """The comparison above can fail: one field more in one struct changes that struct's layout."""
    edited = CDEF.replace("} PJRT_Buffer_Device_Args;", "  int64_t added;\n} PJRT_Buffer_Device_Args;")
    assert edited != CDEF
    fresh = parse(edited)
    assert layout(fresh, "PJRT_Buffer_Device_Args") != layout(ffi, "PJRT_Buffer_Device_Args")
    assert layout(fresh, "PJRT_Api") == layout(ffi, "PJRT_Api")


def test_the_script_writes_a_module_that_loads_as_cdef(tmp_path):
    out = tmp_path / "parsed.py"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "parse_pjrt_declarations.py"), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    spec = importlib.util.spec_from_file_location("parsed", out)
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    fresh = parse()
    assert [layout(written.ffi, n) for n in names(written.ffi)] == [layout(fresh, n) for n in names(fresh)]


@pytest.mark.parametrize("module", ["hloforge.backends.xla.pjrt", "hloforge.backends.xla.compile_worker"])
def test_loading_the_binding_imports_no_c_parser(module):
    """pycparser's parse was a fifth of a second of every process that loads a plugin (a compile
    worker's start among them): loading the binding and a plugin imports neither it nor cffi's parser."""
    script = (f"import sys, {module}\nfrom hloforge.backends.xla.pjrt import default_client\ndefault_client()\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pycparser', 'cffi')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
