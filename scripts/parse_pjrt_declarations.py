"""Write hloforge/backends/xla/pjrt/parsed_declarations.py: the binding's C declarations (CDEF,
hloforge/backends/xla/pjrt/declarations.py) as cffi parses them, for its out-of-line ABI mode to load
without parsing. Run it after changing CDEF; tests/test_pjrt_declarations.py fails until the two agree.
`python scripts/parse_pjrt_declarations.py PATH` writes PATH instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PJRT = Path(__file__).resolve().parent.parent / "hloforge" / "backends" / "xla" / "pjrt"
OUT = PJRT / "parsed_declarations.py"
MODULE = "hloforge.backends.xla.pjrt.parsed_declarations"
HEADER = ('"""CDEF of declarations.py as cffi parsed it: written by scripts/parse_pjrt_declarations.py, '
          'never by hand."""\n\n')


def main(out: Path = OUT) -> int:
    # loaded by path: importing the package would load the module this writes
    spec = importlib.util.spec_from_file_location("declarations", PJRT / "declarations.py")
    assert spec is not None and spec.loader is not None
    declarations = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(declarations)
    builder = declarations.parse()
    builder.set_source(MODULE, None)
    builder.emit_python_code(str(out))
    out.write_text(HEADER + out.read_text())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*map(Path, sys.argv[1:2])))
