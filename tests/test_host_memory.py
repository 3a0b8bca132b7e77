"""The host allocator policy the runtimes run under (hloforge.backends.host_memory): a step's freed
buffers are reused, not faulted in from the kernel again, and the policy is the user's to change."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from hloforge.backends.host_memory import ENV_VAR, host_memory_policy
from hloforge.core.errors import BackendError

# Page faults per call of a program whose every call allocates a large buffer, in a child process
# under a policy. XLA allocates each call's output (32 MiB here); IREE serves that from elsewhere but
# allocates each call's transients (the 96 MiB between the two dots). Under glibc's own policy the
# buffer is mapped afresh every call, 4 KiB page by page; retained, the last call's pages serve again.
_FAULTS_PER_CALL = r'''
import resource, sys
import numpy as np
from hloforge.train.session import make_backend
be = make_backend(sys.argv[1])
if be.name == "xla":
    n, pages = 8 * 1024 * 1024, 8192
    text = """func.func @main(%x: tensor<Nxf32>) -> tensor<Nxf32> {
  %y = stablehlo.exponential %x : tensor<Nxf32>
  return %y : tensor<Nxf32>
}""".replace("N", str(n))
    args, expected = [np.zeros(n, np.float32)], 1.0
else:
    m, pages = 131072, 131072 * 192 * 4 // 4096
    text = """func.func @main(%x: tensor<Mx16xf32>, %w: tensor<16x192xf32>, %v: tensor<192x8xf32>) -> tensor<Mx8xf32> {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
    : (tensor<Mx16xf32>, tensor<16x192xf32>) -> tensor<Mx192xf32>
  %z = stablehlo.dot_general %y, %v, contracting_dims = [1] x [0]
    : (tensor<Mx192xf32>, tensor<192x8xf32>) -> tensor<Mx8xf32>
  return %z : tensor<Mx8xf32>
}""".replace("M", str(m))
    args = [np.ones((m, 16), np.float32), np.ones((16, 192), np.float32), np.ones((192, 8), np.float32)]
    expected = 16.0 * 192
exe = be.compile(text)
buffers = [be.to_device(a) for a in args]
def call():
    (y,) = be.execute(exe, buffers)
    assert float(be.to_host(y).flat[0]) == expected
for _ in range(3):
    call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(16):  # enough calls for the heap's placements to settle
    call()
print(pages, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 16)
'''


def _faults_per_call(backend: str, policy: str) -> tuple[int, float]:
    """(the buffer's pages, page faults per call)"""
    env = {**os.environ, ENV_VAR: policy}
    done = subprocess.run([sys.executable, "-c", _FAULTS_PER_CALL, backend], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    pages, faults = done.stdout.split()[-2:]
    return int(pages), float(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's malloc settings")
@pytest.mark.parametrize("backend", ["xla", "iree"])
def test_freed_buffers_are_reused_not_faulted_in_again(backend):
    if backend == "iree":
        pytest.importorskip("iree.runtime")
    (pages, released), (_, retained) = _faults_per_call(backend, "release"), _faults_per_call(backend, "retain")
    assert released > pages, f"glibc's own policy should fault the buffer's {pages} pages in every call: {released}"
    # not 0: the heap's placements take some calls to settle (XLA here: 0-1024 per call; released 8210-8721)
    assert retained < released / 4, f"retained: {retained} page faults per call (released: {released})"


def test_a_bad_policy_is_one_line_naming_the_choices(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "forever")
    with pytest.raises(BackendError, match=r"^HLOFORGE_HOST_MEMORY='forever': expected one of retain, release$"):
        host_memory_policy()
    monkeypatch.setenv(ENV_VAR, " Release ")
    assert host_memory_policy() == "release"
    monkeypatch.delenv(ENV_VAR)
    assert host_memory_policy() == "retain"
