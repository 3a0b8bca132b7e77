"""The backend conformance suite: what `hloforge.core.contracts.Backend` promises, checked on a live backend.

Shipped so a backend author (ours or a third party's) can run it on theirs, by its registered name:

    python -m hloforge.testing.backend_conformance NAME [NAME ...]

or from a test: `run_conformance("NAME")` returns one `CheckResult` per check, and `CHECKS` maps
each check's name to a function of a backend instance that raises AssertionError saying what is
wrong. tests/test_backend_conformance.py runs it over every registered backend.

The checks: the interface and `backend_name()`; a host→device→host round trip of every dtype the
builder emits (`hloforge.core.hlo.NUMPY_DTYPE`); `to_host` returns a copy; compiling and running a
tiny train step, and placing buffers on another thread while it compiles; donation (a donated input
is consumed, the others are not) and `keep`; arguments of the wrong dtype, shape or count refused
with BackendError before anything runs; a rejected module is a BackendError; more replicas than
devices refused (never a quiet run on one device).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import numpy as np

from hloforge.core.contracts import Backend
from hloforge.core.errors import BackendError, HloforgeError
from hloforge.core.hlo import NUMPY_DTYPE

# A train step as jax emits it for donate_argnums=0: w (input 0) is donated to output 0.
STEP = """module @step {
  func.func public @main(%w: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}, %g: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<f32>) {
    %lr = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
    %1 = stablehlo.multiply %0, %g : tensor<2x3xf32>
    %2 = stablehlo.subtract %w, %1 : tensor<2x3xf32>
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %3 = stablehlo.reduce(%w init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
    return %2, %3 : tensor<2x3xf32>, tensor<f32>
  }
}
"""  # noqa: E501

W = np.arange(6, dtype=np.float32).reshape(2, 3)
G = np.ones((2, 3), np.float32)
STEP_W = W - np.float32(0.1) * G  # what the step returns for (W, G)

CHECKS: dict[str, Callable[[Any], None]] = {}


def _check(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def _refused(what: str, call: Callable[[], object], naming: str = "") -> None:
    """`call` must raise BackendError (whose message contains `naming`)."""
    try:
        call()
    except BackendError as e:
        if naming not in str(e):
            raise AssertionError(f"{what}: BackendError {str(e)!r} does not name {naming!r}") from None
        return
    except Exception as e:
        raise AssertionError(f"{what}: raised {type(e).__name__} ({e}), expected BackendError") from None
    raise AssertionError(f"{what}: accepted, expected a BackendError")


def _run_step(be: Any, exe: Any, keep: Sequence[int] = ()) -> tuple[Any, Any, list[Any]]:
    w, g = be.to_device(W), be.to_device(G)
    return w, g, be.execute(exe, [w, g], keep=keep)


@_check
def check_interface(be: Any) -> None:
    """It satisfies the Backend protocol, has a string `name`, says what is loaded, counts its devices."""
    assert isinstance(be, Backend), f"{type(be).__name__} lacks a member of hloforge.core.contracts.Backend"
    name = getattr(type(be), "name", None)
    assert isinstance(name, str) and name, f"{type(be).__name__}.name is {name!r}, expected its registered name"
    loaded = be.backend_name()
    assert isinstance(loaded, str) and loaded.strip(), f"backend_name() returned {loaded!r}, expected what is loaded"
    if hasattr(be, "device_count"):  # optional (hloforge.core.contracts.BackendExtras): one device without it
        count = be.device_count()
        assert isinstance(count, int) and count >= 1, f"device_count() returned {count!r}, expected an int ≥ 1"


@_check
def check_round_trip(be: Any) -> None:
    """to_device then to_host gives back every dtype the builder emits, shape, dtype and values."""
    for mlir, dtype in NUMPY_DTYPE.items():
        for host in (np.arange(6).reshape(2, 3).astype(dtype), np.asarray(3, dtype)):
            back = be.to_host(be.to_device(host))
            assert isinstance(back, np.ndarray), f"{mlir}: to_host returned {type(back).__name__}, not an ndarray"
            assert back.dtype == host.dtype and back.shape == host.shape, \
                f"{mlir}: sent {host.dtype} {list(host.shape)}, got back {back.dtype} {list(back.shape)}"
            assert np.array_equal(back, host), f"{mlir}: sent {host.tolist()}, got back {back.tolist()}"


@_check
def check_to_host_is_a_copy(be: Any) -> None:
    """A host copy: writing to it does not change the device buffer (IREE's CPU driver maps device
    memory, where a view would write through)."""
    buf = be.to_device(W)
    host = be.to_host(buf)
    host += 1
    assert np.array_equal(be.to_host(buf), W), "writing to_host's array changed the device buffer (a view)"


@_check
def check_compile_and_execute(be: Any) -> None:
    """A tiny train step compiles, names its donated input, and computes the right outputs."""
    exe = be.compile(STEP)
    assert tuple(exe.donated_inputs) == (0,), f"donated_inputs is {exe.donated_inputs!r}, the text donates (0,)"
    _, _, out = _run_step(be, exe)
    assert len(out) == 2, f"the step returns 2 results, execute gave {len(out)}"
    np.testing.assert_allclose(be.to_host(out[0]), STEP_W, rtol=1e-6)
    assert float(be.to_host(out[1])) == float(W.sum()), "the reduce read the donated input after it was overwritten"


@_check
def check_donation(be: Any) -> None:
    """A donated input is consumed (reusing it is a BackendError); an input not donated is not."""
    exe = be.compile(STEP)
    w, g, (new_w, _) = _run_step(be, exe)
    _refused("executing with an input an earlier execute consumed", lambda: be.execute(exe, [w, g]), "donated")
    out, _ = be.execute(exe, [new_w, g])  # g was not donated: still usable
    np.testing.assert_allclose(be.to_host(out), STEP_W - np.float32(0.1) * G, rtol=1e-6)


@_check
def check_keep(be: Any) -> None:
    """`keep` lists donated inputs that must survive: untouched, reusable, same result."""
    exe = be.compile(STEP)
    w, g, (out, _) = _run_step(be, exe, keep=[0])
    assert np.array_equal(be.to_host(w), W), "a kept input changed"
    np.testing.assert_allclose(be.to_host(out), STEP_W, rtol=1e-6)
    again, _ = be.execute(exe, [w, g], keep=[0])
    np.testing.assert_allclose(be.to_host(again), STEP_W, rtol=1e-6)


@_check
def check_place_while_compiling(be: Any) -> None:
    """`to_device` on another thread while `compile` runs (a session places its initial state so): the
    buffers placed meanwhile hold what was sent and run the step compiled meanwhile."""
    placed: list[tuple[Any, Any]] = []
    compiled = threading.Event()

    def place() -> None:
        while not compiled.is_set() or not placed:
            placed.append((be.to_device(W), be.to_device(G)))

    with ThreadPoolExecutor(1) as pool:
        placing = pool.submit(place)
        try:
            exe = be.compile(STEP)
        finally:
            compiled.set()
        placing.result()
    for w, g in placed[:: max(1, len(placed) // 4)]:
        assert np.array_equal(be.to_host(g), G), "a buffer placed during a compile holds other values"
        new_w, _ = be.execute(exe, [w, g])
        np.testing.assert_allclose(be.to_host(new_w), STEP_W, rtol=1e-6)


@_check
def check_wrong_arguments_refused(be: Any) -> None:
    """Arguments of the wrong dtype, shape or count are refused before running, naming the argument."""
    exe = be.compile(STEP)
    w = be.to_device(W)
    _refused("a float64 argument for a float32 parameter",
             lambda: be.execute(exe, [w, be.to_device(G.astype(np.float64))]), "argument 1")
    _refused("a 3x2 argument for a 2x3 parameter", lambda: be.execute(exe, [w, be.to_device(G.reshape(3, 2))]),
             "argument 1")
    _refused("one argument for two parameters", lambda: be.execute(exe, [w]))
    assert np.array_equal(be.to_host(w), W), "a refused execute consumed or changed the donated input"


@_check
def check_rejected_module(be: Any) -> None:
    """Text the compiler rejects is a BackendError, not a crash or a half-made executable."""
    bad = STEP.replace("stablehlo.add ", "stablehlo.addd ")
    _refused("compiling a module with an unknown op", lambda: be.compile(bad))


@_check
def check_replicas_refused(be: Any) -> None:
    """More replicas than devices is a BackendError, at compile and at execute (never one device quietly)."""
    count = be.device_count() if hasattr(be, "device_count") else 1
    _refused(f"compiling for {count + 1} replicas on {count} device(s)",
             lambda: be.compile(STEP, num_replicas=count + 1))
    if not hasattr(be, "execute_replicated"):  # optional: without it, data-parallel runs are refused above it
        return
    exe = be.compile(STEP)
    per_replica = [[be.to_device(W), be.to_device(G)] for _ in range(count + 1)]
    _refused(f"executing {count + 1} replicas' arguments", lambda: be.execute_replicated(exe, per_replica))


@attrs.frozen
class CheckResult:
    backend: str
    check: str
    error: str | None  # None: passed

    @property
    def passed(self) -> bool:
        return self.error is None

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.backend} {self.check}" + \
            ("" if self.passed else f": {self.error}")


def make(name: str, registry: Any = None) -> Any:
    """An instance of the registered backend `name`, made with no arguments as the contract says."""
    from hloforge.core.registry import default_registry

    return (registry or default_registry()).get("backend", name)()


def run_conformance(backend: Any, checks: Sequence[str] | None = None, registry: Any = None) -> list[CheckResult]:
    """Run the checks (default all) on a backend instance or a registered name (looked up in `registry`,
    default the installed plugins); one result per check."""
    be = make(backend, registry) if isinstance(backend, str) else backend
    label = getattr(type(be), "name", type(be).__name__)
    results = []
    for name in checks or list(CHECKS):
        try:
            CHECKS[name](be)
        except AssertionError as e:
            results.append(CheckResult(label, name, " ".join(str(e).split()) or "assertion failed"))
        except Exception as e:  # a check that crashes the backend fails it, naming the crash
            results.append(CheckResult(label, name, f"raised {type(e).__name__}: {' '.join(str(e).split())}"))
        else:
            results.append(CheckResult(label, name, None))
    return results


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m hloforge.testing.backend_conformance NAME [NAME ...]  (registered backend names)")
        return 0 if argv else 2
    failed = 0
    for name in argv:
        try:
            results = run_conformance(name)
        except HloforgeError as e:  # unknown name, or a backend whose packages are missing
            print(f"hloforge: backend {name!r}: {e}", file=sys.stderr)
            return 2
        for r in results:
            print(r.line())
        failed += sum(not r.passed for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
