"""`hloforge cam`: Grad-CAM of one image through a run's checkpoint, as a PNG overlay.

`gradcam` runs the core's `cam_module` on a backend and forms the heatmap relu(Σ_c α_c·A_c)
with α_c the spatial mean of the gradient (Selvaraju et al.), normalised to [0, 1] and resized
bilinearly to the input; `save_overlay` draws it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hloforge.commands.argtypes import image_out
from hloforge.commands.opening import open_checkpoint
from hloforge.core.cam import cam_module, feature_layer
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.regions import DEFAULT_REGION
from hloforge.core.resample import bilinear_matrix
from hloforge.core.spec import NetSpec
from hloforge.train import checkpoint as ckpt
from hloforge.train.inputs import finite_inputs
from hloforge.train.trainer import Run


def heatmap(fmap: np.ndarray, grad: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """Grad-CAM from one example's A [C, h, w] and ∂score/∂A [C, h, w]: [H, W] in [0, 1]."""
    alpha = grad.mean(axis=(1, 2))
    cam = np.maximum(np.einsum("c,chw->hw", alpha, fmap), 0.0)
    top = cam.max()
    cam = cam / top if top > 0 else cam
    h, w = size
    out: np.ndarray = np.einsum("ih,hw,jw->ij", bilinear_matrix(cam.shape[0], h), cam, bilinear_matrix(cam.shape[1], w))
    return out


def check_camable(spec: NetSpec) -> None:
    """Refuse, with one line, a net Grad-CAM cannot explain: it takes the gradient of one class score
    (the module's `sel` is [B, classes]) at an image feature map, so the net must be a classifier (output
    [classes]) with a [C, H, W] layer before it leaves image space."""
    nc = spec.num_classes
    if tuple(spec.out_shape) != (nc,):
        raise UnsupportedSpec(f"net {spec.name!r} outputs {list(spec.out_shape)}; cam explains a classifier, a conv "
                              f"net whose output is its {nc} class scores ([{nc}]), not a detector, segmentation "
                              "net, DDPM or language model")
    feature_layer(spec)  # refuses a net with no image feature map (an MLP)


def check_image(image: Any, spec: NetSpec, what: str = "image") -> np.ndarray:
    """`image` as the float32 array the cam module takes: real numbers of the net's input shape (no batch
    axis), all finite (a NaN would draw a plausible-looking heatmap of nothing)."""
    return finite_inputs(image, spec.input_shape, what, f" (the input of net {spec.name!r}, no batch axis)")


def gradcam(spec: NetSpec, params: Sequence[np.ndarray], running: Sequence[np.ndarray], image: np.ndarray,
            backend: Any, class_index: int | None = None) -> np.ndarray:
    """The Grad-CAM heatmap [H, W] (values in [0, 1]) of `image` (the net's input shape, no batch
    axis) for `class_index` (default: the predicted class). `params` and `running` are in
    spec.params() / spec.stats() order, as a checkpoint stores them."""
    check_camable(spec)
    image = check_image(image, spec)
    if class_index is not None and not 0 <= class_index < spec.num_classes:  # before compiling anything
        raise UnsupportedSpec(f"class {class_index} is not one of the net's {spec.num_classes} classes; expected 0 to "
                              f"{spec.num_classes - 1}")
    exe = backend.compile(cam_module(spec, 1))
    args = [image[None], *(np.asarray(p, np.float32) for p in params), *(np.asarray(r, np.float32) for r in running)]
    dev = [backend.to_device(a) for a in args]

    def run(sel: np.ndarray) -> list[np.ndarray]:
        out = backend.execute(exe, [*dev, backend.to_device(sel)], keep=range(len(dev) + 1))
        return [backend.to_host(o) for o in out]

    sel = np.zeros((1, spec.num_classes), np.float32)
    if class_index is None:
        class_index = int(np.argmax(run(sel)[0][0]))
    sel[0, class_index] = 1.0
    _, fmap, grad = run(sel)
    return heatmap(fmap[0], grad[0], spec.input_shape[1:])


def save_overlay(image: np.ndarray, heat: np.ndarray, path: str, alpha: float = 0.45) -> None:
    """The image ([C, H, W], [H, W] or [H, W, C]; RGB drawn as colour, other channel counts as their mean)
    with the heatmap over it, as an image of the format `path`'s suffix names."""
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
    ckpt.write_image(path, lambda f, suffix: fig.savefig(f, format=suffix, dpi=100))
    plt.close(fig)


def _npy_refusal(e: Exception) -> str:
    """Why np.load refused a file, in a user's words: the OS's reason without its errno, and never numpy's advice
    to load the file with allow_pickle (which would run the code a pickle holds)."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    if isinstance(e, EOFError):
        return "it is empty or cut short"
    if "contains pickled" in str(e):  # no .npy header: numpy took it for a pickle
        return "it is not a .npy file"
    if "Object arrays" in str(e):
        return "it holds Python objects, not numbers"
    return str(e)


def load_image(ref: str, run: Run) -> np.ndarray:
    """`test:N` (the N-th image of the run's eval split) or a .npy file, as stored: check_image checks it."""
    if ref.startswith("test:"):
        n = len(run.x_te)
        try:
            i = int(ref[5:])
        except ValueError:
            i = -1
        if not 0 <= i < n:  # a negative N would index from the end
            raise DataError(f"image {ref!r}: expected test:N with 0 ≤ N < {n}")
        return run.x_te[i]
    if ref.endswith(".npy") and os.path.exists(ref):
        try:
            got = np.load(ref)
        except (OSError, ValueError, EOFError) as e:  # EOFError: an empty file
            raise DataError(f"{ref}: not a readable .npy array ({_npy_refusal(e)}); expected one array of shape "
                            f"{list(run.spec.input_shape)} (np.save)") from None
        if not isinstance(got, np.ndarray):  # np.load opens an .npz archive whatever its name
            got.close()
            raise DataError(f"{ref}: an .npz archive, not a .npy array; expected one array of shape "
                            f"{list(run.spec.input_shape)} (np.save)")
        return got
    raise DataError(f"image {ref!r}: expected test:N or an existing .npy file of shape {list(run.spec.input_shape)}")


def cam_run(path: str, image_ref: str, out: str, class_index: int | None = None,
            log: Callable[[str], None] = print, data_dir: str | None = None,
            data_file: str | None = None, backend: str | None = None, region: str = DEFAULT_REGION) -> np.ndarray:
    """`hloforge cam`: the Grad-CAM of one image through the weights `region` picks (eval's: by default the EMA
    shadow where the run kept one, so the class explained is the one eval and predict give), drawn to `out`."""
    image_out(out)
    oc = open_checkpoint(path, backend, log=log, data_dir=data_dir, data_file=data_file)
    spec = oc.spec
    check_camable(spec)  # before the image: a DDPM's test images are not its input (that adds a time plane)
    given = load_image(image_ref, oc.run)
    image = check_image(given, spec, f"image {image_ref}:")
    oc.check_input(given, image, f"image {image_ref}:", otherwise="pass one of the run's test images as test:N")
    region, params, running = oc.region_weights(region)  # θ or the EMA shadow, each with its own BN statistics
    heat = gradcam(spec, params, running, image, oc.run.backend, class_index)
    save_overlay(image, heat, out)
    log(f"wrote {out} (Grad-CAM of {image_ref} through {spec.name}, epoch {oc.meta['epoch']}, {region} weights)")
    return heat
