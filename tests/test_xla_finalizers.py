"""A finalizer of the XLA binding never parses a C type: cffi parses under a lock it does not re-enter,
and a garbage collection during a parse (a compile's first call of some PJRT function) that freed an
executable whose release parsed its own type hung the process for ever. Run in a fresh process, where
nothing but loading the plugin has parsed anything, with cffi's lock held as during a parse."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("hloforge.backends.xla.pjrt.api")

SCRIPT = textwrap.dedent('''
    import os, threading
    import numpy as np
    from hloforge.backends.xla.pjrt.api import ffi
    from hloforge.backends.xla.pjrt.client import Client
    from hloforge.backends.xla.pjrt.executable import Executable

    client = Client(None, {"cpu_device_count": 1})
    exe = client.compile("""
    func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
      %y = stablehlo.add %x, %x : tensor<3xf32>
      return %y : tensor<3xf32>
    }""")
    buf = client.to_device(np.ones(3, np.float32))
    done = threading.Event()

    def release():  # what the finalizers do: Executable.__del__, DeviceBuffer.__del__, Client.__del__
        exe.__del__()
        buf.__del__()
        client.__del__()
        done.set()

    with ffi._lock:  # held as while cffi parses a type
        threading.Thread(target=release, daemon=True).start()
        released = done.wait(20)
    print("released" if released else "hung", flush=True)
    os._exit(0)
''')


def test_releasing_an_executable_a_buffer_and_a_client_parses_no_c_type():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "released"
