"""A finalizer of the XLA binding never realizes a C type: it runs inside a garbage collection, which
may come while cffi realizes another type (a compile's first call of some PJRT function). When the FFI
was parsed in-line, a release that parsed its own type waited on cffi's parse lock for ever. Run in a
fresh process, where nothing but loading the plugin and one compile has asked cffi for a type."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("hloforge.backends.xla.pjrt.api")

SCRIPT = textwrap.dedent('''
    import numpy as np
    from hloforge.backends.xla.pjrt import api, buffers, c_api, client as client_module, executable
    from hloforge.backends.xla.pjrt.client import Client

    client = Client(None, {"cpu_device_count": 1})
    exe = client.compile("""
    func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
      %y = stablehlo.add %x, %x : tensor<3xf32>
      return %y : tensor<3xf32>
    }""")
    buf = client.to_device(np.ones(3, np.float32))
    asked = []

    class Watched:  # the binding's FFI, noting every C type named to it as text
        def __init__(self, ffi):
            self._ffi = ffi

        def __getattr__(self, name):
            attr = getattr(self._ffi, name)
            if name not in ("typeof", "new", "cast", "sizeof", "alignof", "offsetof"):
                return attr

            def noted(cdecl, *args):
                if isinstance(cdecl, str):
                    asked.append((name, cdecl))
                return attr(cdecl, *args)
            return noted

    for module in (api, buffers, c_api, client_module, executable):
        module.ffi = Watched(module.ffi)
    # what the finalizers do: Executable.__del__, DeviceBuffer.__del__, Client.__del__
    exe.__del__()
    buf.__del__()
    client.__del__()
    print(asked)
''')


def test_releasing_an_executable_a_buffer_and_a_client_realizes_no_c_type():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
