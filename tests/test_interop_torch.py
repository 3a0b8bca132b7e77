"""torchvision / timm weights in (hloforge.interop): every mapped net built in PyTorch at random init
(BatchNorm statistics and affine parameters randomised too), its state dict saved, imported, and
compared — eval logits, and one train-mode step's loss and every parameter gradient against PyTorch
autograd (the whole backward of each net against an independent framework). Plus the refusals:
tensors that do not fit, a pickle that would run code.

torchvision 0.28's compiled ops do not load against the CPU torch here; its model definitions are
pure Python, so `torchvision._meta_registrations` (which registers the missing ops) is kept from
importing by a stub module, in this test process only.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch parity tests need torch (the test extra: torch==2.13.0)")

from hloforge.core.errors import DataError, UnsupportedSpec  # noqa: E402
from hloforge.core.modules import forward_module, vjp_module  # noqa: E402
from hloforge.interop import import_weights, map_state_dict, read_state_dict  # noqa: E402
from hloforge.interop.torch_names import SOURCES  # noqa: E402

CLASSES = 4  # the shapes dataset's, so the imported run evaluates on it
BATCH = 2


def _stub_meta_registrations() -> None:
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def torch_model(source: str, size: int) -> Any:
    """The PyTorch model of `source` at random init, CLASSES classes, dropout and stochastic depth off,
    every BatchNorm's statistics and affine parameters (and ConvNeXt's layer scale) randomised."""
    _stub_meta_registrations()
    kind, name = source.split(":")
    kw = dict(SOURCES[source].build)
    if kind == "torchvision":
        tvm = pytest.importorskip("torchvision.models", reason="torchvision is not installed")
        model = getattr(tvm, name)(num_classes=CLASSES, **kw)
    else:
        timm = pytest.importorskip("timm", reason="timm is not installed")
        extra = {"img_size": size} if "vit" in name else {}
        model = timm.create_model(name, pretrained=False, num_classes=CLASSES, **extra, **kw)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, t in model.state_dict().items():
            if n.endswith("running_mean") or n.endswith(".bias") and t.ndim == 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
            elif n.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)
            elif n.endswith("layer_scale") or (n.endswith(".weight") and t.ndim == 1):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)
    return model


# net → the smallest input it allows (ImageNet nets at 3×64×64 keep the test fast; a stride-32 net needs 32)
SIZES = {s: 64 for s in SOURCES}
SIZES["timm:vit_tiny_patch16_224"] = 32
SLOW = {"torchvision:resnet50", "torchvision:efficientnet_v2_s", "torchvision:convnext_tiny"}


def _client() -> Any:
    from hloforge.backends.xla import default_client

    return default_client()


def _run(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    exe = _client().compile(text)
    try:
        return [np.asarray(o) for o in exe.run(list(inputs))]
    finally:
        exe.close()


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _save(sd: dict[str, Any], path: str) -> None:
    if path.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, path)
    else:
        torch.save(sd, path)


def softmax_ce(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy in float64 and its gradient with respect to the logits."""
    z = logits.astype(np.float64)
    z = z - z.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y]).mean())
    g = p.copy()
    g[np.arange(len(y)), y] -= 1.0
    return loss, (g / len(y)).astype(np.float32)


def parity(source: str, fmt: str, tmp_path: Any) -> dict[str, float]:
    size = SIZES[source]
    model = torch_model(source, size)
    path = str(tmp_path / f"weights{fmt}")
    _save(model.state_dict(), path)
    imp = map_state_dict(source, read_state_dict(path), input=(3, size, size))
    spec = imp.spec
    assert spec.num_classes == CLASSES
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, 3, size, size)).astype(np.float32)
    y = np.array([1, 3])
    # (a) eval logits
    model.eval()
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = _run(forward_module(spec, BATCH, eval_mode=True), [x, *imp.params, *imp.stats])[0]
    errs = {"logits": rel(got, want)}
    # (b) one train-mode step: the loss and every parameter gradient
    model.train()
    model.zero_grad()
    out = model(torch.from_numpy(x))
    loss_t = torch.nn.functional.cross_entropy(out, torch.from_numpy(y))
    loss_t.backward()
    logits, *_ = _run(forward_module(spec, BATCH), [x, *imp.params])
    loss, gbar = softmax_ce(logits, y)
    res = _run(vjp_module(spec.layers, spec.input_shape, BATCH), [*imp.params, x, gbar])
    grads = res[1:1 + len(imp.params)]
    # PyTorch's gradients mapped as the weights are (same names, same layouts)
    tsd = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    tsd.update({n: b for n, b in model.named_buffers()})
    want_g = map_state_dict(source, {k: v.detach().numpy() for k, v in tsd.items()}, input=(3, size, size)).params
    errs["loss"] = abs(loss - float(loss_t)) / abs(float(loss_t))
    scale = max(float(np.max(np.abs(w))) for w in want_g)
    errs["grads"] = max(float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), 1e-3 * scale)
                        for g, w in zip(grads, want_g, strict=True))
    return errs


PARAMS = [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in SOURCES]


@pytest.mark.parametrize("source", PARAMS)
def test_logits_loss_and_gradients_equal_pytorch(source: str, tmp_path: Any) -> None:
    errs = parity(source, ".safetensors", tmp_path)
    print(f"PARITY {source} " + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    assert errs["logits"] <= 1e-5, errs
    assert errs["loss"] <= 1e-4 and errs["grads"] <= 1e-4, errs
