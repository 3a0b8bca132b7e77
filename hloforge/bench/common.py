"""What every part of the benchmark shares: the backends' names, the suite, the nets, the data, a
result, and whether a backend can run here."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hloforge.core.errors import UnsupportedSpec

BACKENDS = ("hloforge-xla", "hloforge-iree", "jax.jit", "torch", "torch-compile")
DISPATCH_BACKENDS = ("hloforge-xla", "hloforge-iree", "jax.jit")
# A few-ms step needs hundreds of samples for a stable median on a shared machine; a 100-ms one, ten.
DEFAULT_STEPS = {"mnist-mlp": 300, "mnist-linear": 300, "mnist-cnn": 10}
OTHER_STEPS = 10  # a net DEFAULT_STEPS does not name
LOSS_RTOL = 1e-4
# The issue-#11 suite: (net, per-step batch). A net is a zoo name, optionally with its input shape
# ("vit-mini:3x32x32"); the suite's ViT is vit-cifar (0.81M parameters, 3×32×32, patch 4).
SUITE = (("mnist-mlp", 128), ("mnist-cnn", 128), ("resnet18-cifar", 32), ("mobilenetv2-mini", 128),
         ("vit-cifar", 64))
SGEMM_N = 2048


def load_net(ref: str) -> Any:
    """A zoo net by name (or a spec file), or `name:CxHxW` for the same net on another input shape. Refused
    unless it is a classifier: every peer times softmax cross-entropy on class labels (`batches`)."""
    from hloforge.zoo import get_net

    name, _, shape = ref.partition(":")
    if not shape:
        spec = get_net(name)
    else:
        try:
            dims = tuple(int(d) for d in shape.split("x"))
        except ValueError:
            raise UnsupportedSpec(f"net {ref!r}: the input shape after ':' must be CxHxW integers") from None
        spec = get_net(name, input=dims)
    if len(spec.out_shape) != 1:  # a language model, DDPM, detector or segmentation net: each peer failed apart
        raise UnsupportedSpec(f"net {ref!r} outputs {list(spec.out_shape)}; bench times a classifier's Adam step "
                              "(cross-entropy on [classes] logits), so expected a net whose output is its class "
                              "scores, such as mnist-cnn")
    return spec


@dataclass
class Result:
    """One (net, backend) measurement; ``ms`` empty and ``note`` set when skipped."""

    net: str
    backend: str
    batch: int
    ms: list[float] = field(default_factory=list)
    compile_s: float | None = None  # the (first round's) setup, s
    first_loss: float | None = None
    note: str = ""
    peak_rss_mb: float | None = None  # the measuring child's peak resident set; None when measured in-process
    # every round's setup, s, apart by whether it compiled or loaded its program from an on-disk cache
    cold_setups: list[float] = field(default_factory=list)
    cached_setups: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.ms) if self.ms else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["median_ms"] = self.median_ms
        d["min_ms"] = min(self.ms) if self.ms else None
        return d


def failed_note(e: BaseException) -> str:
    """A measurement's failure as its row says it: the exception's type and its message's first line (a
    traceback's last line is no message: JAX ends its own with a note on the frames it left out)."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"failed: {type(e).__name__}: {first}"[:300]


# ---------------------------------------------------------------- availability ---


def hloforge_backend_names() -> list[str]:
    from hloforge.core.registry import default_registry

    return list(default_registry().names("backend"))


def unavailable(backend: str) -> str | None:
    """Why `backend` cannot run here, or None."""
    if backend.startswith("hloforge-"):
        name = backend.removeprefix("hloforge-")
        have = hloforge_backend_names()
        return None if name in have else f"backend {name!r} not registered (registered: {', '.join(have)})"
    mod = {"jax.jit": "optax", "torch": "torch", "torch-compile": "torch"}[backend]
    try:
        if backend == "jax.jit":
            import jax  # noqa: F401
        __import__(mod)
    except ImportError as e:
        return f"not importable ({e}); pip install 'hloforge[bench]'" + (" torch==2.13.0" if mod == "torch" else "")
    return None


# ------------------------------------------------------------------- the data ---


def batches(spec: Any, batch: int, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """n fixed (x, y) batches shared by every backend; steps cycle through them."""
    rng = np.random.default_rng(seed + 1)
    classes = spec.out_shape[0]
    return [(rng.standard_normal((batch, *spec.input_shape)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int32)) for _ in range(n)]


# ------------------------------------------------------------ the step makers ---
# Each returns (compile seconds, step, note) where step(x, y) -> float loss does one full
# training step as a user pays it: numpy in, Python float out.

StepFn = Callable[[np.ndarray, np.ndarray], float]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
