"""Grad-CAM: the class-score gradient at the last feature map, and the heatmap made from it.

`cam_module(spec, batch)` is one eval-mode module (running BN statistics, as at inference):

    @main(x, θ…, running…, sel) -> (logits, A, ∂⟨sel, logits⟩/∂A)

where A is the output of the last layer that still yields an image [C, H, W] (the walk
stops there, before the global pool or flatten) and `sel` [B, classes] weights the class
scores (a one-hot row picks one class). The gradient is emitted by `autodiff.grad`, so
it is the same reverse mode the train step uses. `gradcam` runs it on a backend and forms
the heatmap relu(Σ_c α_c·A_c) with α_c the spatial mean of the gradient (Selvaraju et al.),
normalised to [0, 1] and resized bilinearly to the input; `save_overlay` draws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hloforge.core import autodiff
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hlo import Builder
from hloforge.core.modules import emit_layers
from hloforge.core.spec import NetSpec, qualified_params, qualified_stats


def feature_layer(spec: NetSpec) -> int:
    """Index of the layer whose output is the Grad-CAM feature map: the last one with an image
    output before the first layer that leaves image space (global pool, flatten)."""
    walk = spec.walk()
    last = None
    for ls in walk:
        if len(ls.out_shape) != 3:
            break
        last = ls.index
    if last is None:
        raise UnsupportedSpec(f"net {spec.name!r} has no image feature map (no layer with a [C, H, W] output "
                              "before it leaves image space); Grad-CAM needs a conv net")
    return last


def cam_module(spec: NetSpec, batch: int = 1, *, dtype: str = "f32") -> str:
    walk = spec.walk()
    k = feature_layer(spec)
    b = Builder(dtype, f"{spec.ident}_cam")
    x = b.arg((batch, *spec.input_shape))
    params = [b.arg(s.shape) for _, s in qualified_params(walk)]
    running = [b.arg(s.shape) for _, s in qualified_stats(walk)]
    sel = b.arg((batch, spec.num_classes))
    head, tail = walk[:k + 1], walk[k + 1:]
    n_p = sum(len(ls.slots) for ls in head)
    n_r = sum(len(ls.stats) for ls in head)
    fmap, _ = emit_layers(b, head, x, params[:n_p], train=False, running=running[:n_r])
    logits, _ = emit_layers(b, tail, fmap, params[n_p:], train=False, running=running[n_r:]) if tail else (fmap, [])
    (g,) = autodiff.grad(b, [logits], [sel], [fmap])
    return b.module([logits, fmap, g])


def heatmap(fmap: np.ndarray, grad: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """Grad-CAM from one example's A [C, h, w] and ∂score/∂A [C, h, w]: [H, W] in [0, 1]."""
    from hloforge.datasets.digits import bilinear_matrix

    alpha = grad.mean(axis=(1, 2))
    cam = np.maximum(np.einsum("c,chw->hw", alpha, fmap), 0.0)
    top = cam.max()
    cam = cam / top if top > 0 else cam
    h, w = size
    out: np.ndarray = np.einsum("ih,hw,jw->ij", bilinear_matrix(cam.shape[0], h), cam, bilinear_matrix(cam.shape[1], w))
    return out


def gradcam(spec: NetSpec, params: Sequence[np.ndarray], running: Sequence[np.ndarray], image: np.ndarray,
            backend: Any, class_index: int | None = None) -> np.ndarray:
    """The Grad-CAM heatmap [H, W] (values in [0, 1]) of `image` (the net's input shape, no batch
    axis) for `class_index` (default: the predicted class). `params` and `running` are in
    spec.params() / spec.stats() order, as a checkpoint stores them."""
    image = np.asarray(image, np.float32)
    if image.shape != spec.input_shape:
        raise UnsupportedSpec(f"image of shape {list(image.shape)}; net {spec.name!r} takes {list(spec.input_shape)}")
    exe = backend.compile(cam_module(spec, 1))
    args = [image[None], *(np.asarray(p, np.float32) for p in params), *(np.asarray(r, np.float32) for r in running)]
    dev = [backend.to_device(a) for a in args]

    def run(sel: np.ndarray) -> list[np.ndarray]:
        out = backend.execute(exe, [*dev, backend.to_device(sel)], keep=range(len(dev) + 1))
        return [backend.to_host(o) for o in out]

    sel = np.zeros((1, spec.num_classes), np.float32)
    if class_index is None:
        class_index = int(np.argmax(run(sel)[0][0]))
    if not 0 <= class_index < spec.num_classes:
        raise UnsupportedSpec(f"class {class_index} is not one of the net's {spec.num_classes} classes")
    sel[0, class_index] = 1.0
    _, fmap, grad = run(sel)
    return heatmap(fmap[0], grad[0], spec.input_shape[1:])


def save_overlay(image: np.ndarray, heat: np.ndarray, path: str, alpha: float = 0.45) -> None:
    """The image ([C, H, W], [H, W] or [H, W, C]; RGB drawn as colour, other channel counts as their mean)
    with the heatmap over it, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = np.asarray(image, np.float64)
    if img.ndim == 3 and img.shape[-1] not in (1, 3):  # [C, H, W]: RGB as is, other channel counts averaged
        img = np.transpose(img, (1, 2, 0)) if img.shape[0] == 3 else img.mean(axis=0)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    lo, hi = float(img.min()), float(img.max())
    img = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None)
    ax.imshow(heat, cmap="jet", alpha=alpha, vmin=0.0, vmax=1.0)
    ax.axis("off")
    fig.tight_layout(pad=0)
    fig.savefig(path, dpi=100)
    plt.close(fig)
