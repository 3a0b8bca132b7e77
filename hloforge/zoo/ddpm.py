"""`ddpm-mini`: a small U-Net noise predictor of timeResBlocks (no normalisation).

Input [C+1, H, W] (the noised image and the t/T plane, hloforge.train.diffusion), output the
predicted noise [C, H, W]; `classes` is C, the image channels (3 for shapes, 1 for digits with
`--input 2,28,28`), read off the input when not given. H and W must divide by 4 (two levels):

    conv3×3 → [res(w1) ×2, skip] → pool → [res(w2) ×2, skip] → pool → res(w2) ×2
            → up, concat → res(w2) → up, concat → res(w1) → noiseHead (swish, conv3×3 to C, from zero)

Every timeResBlock adds the timestep embedding inside its residual branch. On 2 CPU cores,
`--input 4,16,16` on shapes with `--data-opt size=16 --data-opt noise=0 --data-opt max_shapes=1
--data-opt n_train=8192`, 40 epochs at batch 64, lr 2e-3, warmup 1, `--ema 0.999` trains in ~16 min to
samples of one flat-coloured square, circle or triangle-like shape each.
"""

from __future__ import annotations

from collections.abc import Sequence

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import Layer, NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.ddpm import NoiseHead, TimeResBlock
from hloforge.plugins.layers.pool import MaxPool
from hloforge.plugins.layers.unet import BilinearUpsample, Concat, PushSkip

NFREQ = 6
WIDTHS = (32, 64)


def ddpm_mini(classes: int | None = None, input: Sequence[int] = (4, 32, 32)) -> NetSpec:
    if input[0] < 2:
        raise UnsupportedSpec(f"ddpm-mini takes the images and the time plane: at least 2 input channels, got input "
                              f"{list(input)}")
    if classes is None:  # the images' channels: the input's less the time plane (--input 2,28,28 alone: digits')
        classes = input[0] - 1
    if input[0] != classes + 1:
        # either may be the one meant: --classes 1 alone (digits) meets the default 4-channel input
        side = ",".join(str(d) for d in input[1:])
        raise UnsupportedSpec(f"ddpm-mini of {classes} image channels (classes {classes}) takes {classes + 1} input "
                              f"channels (the images and the time plane), got input {list(input)}; expected classes "
                              f"{input[0] - 1} (--classes {input[0] - 1}), or none, for this input, or --input "
                              f"{classes + 1},{side} for {classes}-channel images")
    w1, w2 = WIDTHS

    def res(w: int) -> TimeResBlock:
        return TimeResBlock(w, NFREQ)

    layers: list[Layer] = [
        Conv2d(w1, k=3),
        res(w1), res(w1), PushSkip(), MaxPool(2),
        res(w2), res(w2), PushSkip(), MaxPool(2),
        res(w2), res(w2),
        BilinearUpsample(2), Concat(w2), res(w2),
        BilinearUpsample(2), Concat(w1), res(w1),
        NoiseHead(classes),
    ]
    return NetSpec("ddpm-mini", input, layers, classes)
