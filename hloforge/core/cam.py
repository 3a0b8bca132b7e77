"""Grad-CAM's module: the class-score gradient at the last feature map.

`cam_module(spec, batch)` is one eval-mode module (running BN statistics, as at inference):

    @main(x, θ…, running…, sel) -> (logits, A, ∂⟨sel, logits⟩/∂A)

where A is the output of the last layer that still yields an image [C, H, W] (the walk
stops there, before the global pool or flatten) and `sel` [B, classes] weights the class
scores (a one-hot row picks one class). The gradient is emitted by `autodiff.grad`, so
it is the same reverse mode the train step uses. Running it on a backend, the heatmap and
its drawing are hloforge/commands/cam.py (`gradcam`, `heatmap`, `save_overlay`).
"""

from __future__ import annotations

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
