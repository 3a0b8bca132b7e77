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

import json
import os
import sys
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch parity tests need torch (the test extra: torch==2.13.0)")

from hloforge.core.errors import DataError, UnsupportedSpec  # noqa: E402
from hloforge.core.modules import forward_module, vjp_module  # noqa: E402
from hloforge.interop import import_weights, map_state_dict, read_state_dict, torch_state_dict  # noqa: E402
from hloforge.interop.torch_names import SOURCES  # noqa: E402

CLASSES = 4  # a small head keeps the parity tests fast
BATCH = 2


def _stub_meta_registrations() -> None:
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def torch_model(source: str, size: int, seed: int = 0, classes: int = CLASSES) -> Any:
    """The PyTorch model of `source` at random init (`seed`), `classes` classes, dropout and stochastic depth off,
    every BatchNorm's statistics and affine parameters (and ConvNeXt's layer scale) randomised."""
    _stub_meta_registrations()
    kind, name = source.split(":")
    kw = dict(SOURCES[source].build)
    if kind == "torchvision":
        tvm = pytest.importorskip("torchvision.models", reason="torchvision is not installed")
        torch.manual_seed(seed)
        model = getattr(tvm, name)(num_classes=classes, **kw)
    else:
        timm = pytest.importorskip("timm", reason="timm is not installed")
        extra = {"img_size": size} if "vit" in name else {}
        torch.manual_seed(seed)
        model = timm.create_model(name, pretrained=False, num_classes=classes, **extra, **kw)
    # the zoo's GELU is the tanh form (hloforge/plugins/layers/activation.py); torchvision's ConvNeXt and timm's
    # ViT use erf, whose logits differ by ~1e-4 / 2e-5 relative: the parity test swaps in the tanh form
    for mod in list(model.modules()):
        for child, sub in list(mod.named_children()):
            if isinstance(sub, torch.nn.GELU):
                setattr(mod, child, torch.nn.GELU(approximate="tanh"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, t in model.state_dict().items():
            if n.endswith("running_mean") or n.endswith(".bias") and t.ndim == 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
            elif n.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)
            elif n.endswith("layer_scale") or (n.endswith(".weight") and t.ndim == 1):
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.75)
    return model


def one_channel(model: Any) -> Any:
    """A torchvision ResNet on one input channel (the digits): its stem conv replaced, names kept."""
    w = model.conv1.weight
    model.conv1 = torch.nn.Conv2d(1, w.shape[0], 7, 2, 3, bias=False)
    with torch.no_grad():
        model.conv1.weight.copy_(w.sum(1, keepdim=True))
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
    return loss, g / len(y)


def parity(source: str, fmt: str, tmp_path: Any, size: int | None = None) -> dict[str, float]:
    size = size or SIZES[source]
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
    # (c) the export round trip: the imported tensors back as a state dict a fresh model loads strictly
    fresh = torch_model(source, size, seed=1)  # other weights, all replaced by the load
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in torch_state_dict(source, spec, imp.params,
                                                                                 imp.stats).items()}, strict=True)
    with torch.no_grad():
        errs["export"] = rel(fresh.eval()(torch.from_numpy(x)).numpy(), want)
    # (b) one train-mode step: the loss and every parameter gradient
    # in float64 on both sides: a random-init net in train mode with batch statistics over a few values is
    # ill-conditioned (PyTorch's own float32 gradients differ from its float64 ones by up to 0.3 relative
    # on mobilenet_v2), so float32 would compare rounding noise; float64 compares the computation
    model.train()
    model.double().zero_grad()
    out = model(torch.from_numpy(x).double())
    loss_t = torch.nn.functional.cross_entropy(out, torch.from_numpy(y))
    loss_t.backward()
    p64 = [p.astype(np.float64) for p in imp.params]
    x64 = x.astype(np.float64)
    logits, *_ = _run(forward_module(spec, BATCH, dtype="f64"), [x64, *p64])
    loss, gbar = softmax_ce(logits, y)
    res = _run(vjp_module(spec.layers, spec.input_shape, BATCH, dtype="f64"), [*p64, x64, gbar])
    grads = res[1:1 + len(imp.params)]
    # PyTorch's gradients mapped as the weights are (same names, same layouts)
    tsd = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    tsd.update({n: b for n, b in model.named_buffers()})
    want_g = map_state_dict(source, {k: v.detach().numpy() for k, v in tsd.items()}, input=(3, size, size)).params
    errs["loss"] = abs(loss - loss_t.item()) / abs(loss_t.item())
    errs["train_logits"] = rel(logits, out.detach().numpy())
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
    assert errs["export"] == 0.0, errs


# Sizes no power of two divides, where a stride-2 conv floors as PyTorch's does (7 → 4): resnet18 at 28×28 is
# 14 → 7 → 4 → 2 → 1, at 45×45 23 → 12 → 6 → 3 → 2; mobilenet_v2's depthwise stride-2 convs likewise.
@pytest.mark.parametrize("source, size", [("torchvision:resnet18", 28), ("torchvision:resnet18", 45),
                                          ("torchvision:mobilenet_v2", 45), ("torchvision:efficientnet_b0", 37)])
def test_sizes_a_stride_does_not_divide_equal_pytorch(source: str, size: int, tmp_path: Any) -> None:
    errs = parity(source, ".safetensors", tmp_path, size)
    assert errs["logits"] <= 1e-5, errs
    assert errs["loss"] <= 1e-4 and errs["grads"] <= 1e-4, errs
    assert errs["export"] == 0.0, errs


# ------------------------------------------------------------------ the run directory and the refusals
def test_import_writes_a_run_that_eval_and_the_cli_accept(tmp_path: Any, capsys: Any) -> None:
    from hloforge.cli import EXIT_OK, main
    from hloforge.train.checkpoint import load_checkpoint
    from hloforge.train.trainer import CHECKPOINT, TrainConfig, load_config

    # a 10-class resnet18 on one channel, so the run evaluates on the digits (at 32×32)
    model = one_channel(torch_model("torchvision:resnet18", 32, classes=10))
    path = str(tmp_path / "r18.pth")
    _save(model.state_dict(), path)
    out = str(tmp_path / "run")
    assert main(["import-weights", "torchvision:resnet18", path, "--out", out, "--input", "1,32,32",
                 "--data", "digits", "--data-opt", "size=32"]) == EXIT_OK
    tensors, meta = load_checkpoint(os.path.join(out, CHECKPOINT))
    assert meta["epoch"] == 0 and meta["imported"] == {"source": "torchvision:resnet18"}
    np.testing.assert_array_equal(tensors["param/7.w"], model.fc.weight.detach().numpy().T)
    np.testing.assert_array_equal(tensors["stat/0.var"], model.bn1.running_var.numpy())
    cfg = load_config(os.path.join(out, "config.toml"))
    assert isinstance(cfg, TrainConfig) and cfg.net == "resnet18" and cfg.classes == 10
    assert main(["eval", out]) == EXIT_OK
    assert "resnet18 epoch 0" in capsys.readouterr().out
    # export: the serving form, and the state dict torchvision's model loads strictly
    exp = str(tmp_path / "exp")
    assert main(["export", out, "--out", exp]) == EXIT_OK
    with open(os.path.join(exp, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["classes"] == 10 and manifest["input_shape"] == [1, 32, 32]
    assert manifest["arguments"][:2] == ["x", "param/0.w"]
    assert open(os.path.join(exp, "forward.mlir"), encoding="utf-8").read().lstrip().startswith("module")
    assert main(["export", out, "--out", exp, "--format", "torchvision"]) == EXIT_OK
    from safetensors.torch import load_file

    fresh = one_channel(torch_model("torchvision:resnet18", 32, seed=1, classes=10))
    fresh.load_state_dict(load_file(os.path.join(exp, "model.safetensors")), strict=True)
    for k, v in model.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(fresh.state_dict()[k], v), k
    # a second import onto the same run directory is refused, and leaves it as it was
    before = os.path.getmtime(os.path.join(out, CHECKPOINT))
    with pytest.raises(Exception, match="already holds a checkpoint"):
        import_weights("torchvision:resnet18", path, out, input=(1, 32, 32), data="digits",
                       data_options=("size=32",))
    assert os.path.getmtime(os.path.join(out, CHECKPOINT)) == before


def test_wrong_shape_missing_and_extra_tensors_are_three_lines_and_nothing_is_written(tmp_path: Any) -> None:
    sd = {k: v.clone() for k, v in torch_model("torchvision:resnet18", 32).state_dict().items()}
    sd["layer1.0.conv1.weight"] = torch.zeros(64, 64, 1, 1)
    del sd["bn1.running_var"]
    sd["extra.weight"] = torch.zeros(3)
    path = str(tmp_path / "bad.safetensors")
    _save(sd, path)
    out = tmp_path / "run"
    with pytest.raises(DataError) as e:
        import_weights("torchvision:resnet18", path, str(out), input=(3, 32, 32))
    lines = str(e.value).splitlines()
    assert "3 problem(s); nothing written" in lines[0]
    assert lines[1:] == [
        "  shape: layer1.0.conv1.weight has shape [64, 64, 1, 1], but param/2.b0.conv1.w needs [64, 64, 3, 3] "
        "(stored as [64, 64, 3, 3])",
        "  missing: bn1.running_var (for stat/0.var [64])",
        "  unused: extra.weight [3]"]
    assert not out.exists()


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))  # unpickling would create the marker file


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Any) -> None:
    marker = tmp_path / "ran"
    path = str(tmp_path / "evil.pth")
    torch.save({"conv1.weight": torch.zeros(1), "payload": _RunsCode(str(marker))}, path)
    with pytest.raises(DataError, match="refused, its pickle would run code") as e:
        read_state_dict(path)
    assert len(str(e.value).splitlines()) == 1
    assert not marker.exists()


@pytest.mark.parametrize("make, said", [
    (lambda t: torch.quantize_per_tensor(t, 0.1, 0, torch.qint8), "has dtype torch.qint8"),
    (lambda t: t.to(torch.float8_e4m3fn), "has dtype torch.float8_e4m3fn"),
    (lambda t: t.to_sparse(), "is a torch.sparse_coo tensor"),
], ids=["qint8", "float8", "sparse"])
def test_a_tensor_numpy_cannot_hold_is_one_line(make: Any, said: str, tmp_path: Any) -> None:
    """A quantized model's, a float8 or a sparse tensor in a .pth: named, not torch's TypeError as a crash."""
    import warnings

    path = str(tmp_path / "w.pth")
    with warnings.catch_warnings():  # torch's deprecation of quantize_per_tensor
        warnings.simplefilter("ignore")
        torch.save({"conv1.weight": torch.zeros(2), "fc.weight": make(torch.ones(2, 2))}, path)
    with pytest.raises(DataError, match=rf"w\.pth: entry 'fc\.weight' {said}, which numpy cannot hold; expected "
                       "dense float16, bfloat16, float32 or float64 tensors$"):
        read_state_dict(path)


def test_numpy_arrays_saved_in_place_of_tensors_are_named(tmp_path: Any) -> None:
    """A .pth of numpy arrays (weights converted from another framework): refused, as torch's safe loader builds
    no array, but named as arrays and how to save them, not as a bare 'it calls numpy…_reconstruct'."""
    path = str(tmp_path / "w.pth")
    torch.save({"conv1.weight": np.zeros((2, 2), np.float32)}, path)
    with pytest.raises(DataError, match=r"it builds numpy arrays \(numpy\.\S+\), not tensors: save "
                       r"torch\.from_numpy\(a\) for each, or write the arrays with safetensors\.numpy\.save_file"):
        read_state_dict(path)


def test_unknown_source_and_missing_file_are_one_line(tmp_path: Any) -> None:
    with pytest.raises(UnsupportedSpec, match="unknown weights source 'torchvision:vgg11'"):
        import_weights("torchvision:vgg11", str(tmp_path / "w.safetensors"), str(tmp_path / "run"))
    with pytest.raises(DataError, match="does not exist"):
        import_weights("torchvision:resnet18", str(tmp_path / "w.safetensors"), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_pth_and_safetensors_import_the_same_tensors(tmp_path: Any) -> None:
    sd = torch_model("torchvision:mobilenet_v2", 32).state_dict()
    _save(sd, str(tmp_path / "w.pth"))
    _save(sd, str(tmp_path / "w.safetensors"))
    a, b = (map_state_dict("torchvision:mobilenet_v2", read_state_dict(str(tmp_path / f)), input=(3, 32, 32))
            for f in ("w.pth", "w.safetensors"))
    for x, y in zip([*a.params, *a.stats], [*b.params, *b.stats], strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_pth_without_torch_is_one_line(tmp_path: Any, monkeypatch: Any) -> None:
    path = tmp_path / "w.pth"
    torch.save({"fc.bias": torch.zeros(2)}, str(path))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as where it is absent
    with pytest.raises(DataError, match="reading one needs torch .not installed.; save it as .safetensors"):
        read_state_dict(str(path))
