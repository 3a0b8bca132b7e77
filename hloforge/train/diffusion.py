"""DDPM (Ho et al. 2020): the linear β schedule, noising on the host, ancestral sampling.

The net predicts the noise ε from x_t and the time channel: its input is [C+1, H, W], the
image and a plane filled with t/T (seed 001; the net's timeCondAdd layers read it), its output
[C, H, W]. Training draws per image t ~ U{0 … T−1} and ε ~ N(0, I) from (seed, step) and
feeds x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε with the target ε (loss: per-pixel MSE).

The schedule (T, β_1, β_T) is the run's config (`diffusion_steps`, `beta_start`, `beta_end`),
stored in every checkpoint, so sampling always uses the schedule the run trained with; a run
from before those keys existed reads the defaults, which are the schedule it trained with
(Ho et al.'s 1e-4 … 0.02 over 1000 steps). Fewer steps want a wider range (T = 250:
β up to 0.08) so x_T stays (nearly) pure noise; `LinearSchedule` refuses a schedule that
leaves more than 5% of the signal at T.

Sampling runs the eval forward module T times, from x_T ~ N(0, I), through the posterior
q(x_{t−1} | x_t, x̂0) with x̂0 = (x_t − √(1−ᾱ_t)·ε̂)/√ᾱ_t:

    x_{t−1} = √ᾱ_{t−1}·β_t/(1−ᾱ_t)·x̂0 + √α_t·(1−ᾱ_{t−1})/(1−ᾱ_t)·x_t + σ_t·z,   σ_t = √β_t,

no noise at t = 0 (ᾱ_{−1} = 1). Unclipped this is exactly Ho et al.'s
(x_t − β_t/√(1−ᾱ_t)·ε̂)/√α_t + σ_t·z; `hloforge sample` clips x̂0 to the training images'
per-channel range first (as Ho et al.'s sampler clips to [−1, 1]; `--no-clip` turns it off).

`hloforge sample RUN -n 16 --out grid.png` writes the samples as a PNG grid, each channel
mapped to [0, 1] through the training images' range of that channel, from the EMA shadow when
the run kept one (`--region`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import NetSpec

TRAIN_STREAM = 0x64647071  # the (seed, TRAIN_STREAM, step) generator of the training t and ε
EVAL_SEED = 0x65766C  # the fixed t and ε of the test-split noise MSE


def is_time_conditioned(spec: NetSpec) -> bool:
    """A net with a layer that reads the time channel (one whose class declares `time_conditioned`:
    timeCondAdd, timeResBlock) is a DDPM's noise predictor."""
    return len(spec.out_shape) == 3 and any(getattr(layer, "time_conditioned", False)
                                                        for layer in spec.layers)


def _probability(instance: Any, attribute: Any, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise UnsupportedSpec(f"{attribute.name} is a noise variance per step, in (0, 1); got {value}")


MAX_SIGNAL_AT_T = 0.05  # √ᾱ_T above this: x_T is not noise, and sampling from N(0, I) is off the model


@attrs.frozen
class LinearSchedule:
    """β linear from beta_start to beta_end over `steps` (Ho et al.: 1e-4 … 0.02 over 1000)."""

    steps: int = 1000
    beta_start: float = attrs.field(default=1e-4, validator=_probability)
    beta_end: float = attrs.field(default=0.02, validator=_probability)

    def __attrs_post_init__(self) -> None:
        if self.steps < 2:
            raise UnsupportedSpec(f"diffusion_steps must be at least 2, got {self.steps}")
        if self.beta_end < self.beta_start:
            raise UnsupportedSpec(f"beta_end {self.beta_end} is below beta_start {self.beta_start}; the linear "
                                  "schedule adds noise at a rising rate")
        signal = math.sqrt(float(self.alpha_bar[-1]))
        if signal > MAX_SIGNAL_AT_T:
            raise UnsupportedSpec(f"schedule {self.describe()} leaves √ᾱ_T = {signal:.3g} of the image at t = T "
                                  f"(at most {MAX_SIGNAL_AT_T}); raise beta_end or diffusion_steps")

    @classmethod
    def of(cls, cfg: Any) -> LinearSchedule:
        """A run's schedule, from its config (hloforge.train.config.TrainConfig)."""
        return cls(cfg.diffusion_steps, cfg.beta_start, cfg.beta_end)

    def describe(self) -> str:
        return f"T {self.steps}, β {self.beta_start:g} … {self.beta_end:g}"

    @property
    def betas(self) -> np.ndarray:
        return np.linspace(self.beta_start, self.beta_end, self.steps, dtype=np.float64)

    @property
    def alphas(self) -> np.ndarray:
        return 1.0 - self.betas

    @property
    def alpha_bar(self) -> np.ndarray:
        return np.cumprod(self.alphas)


def with_time_channel(x: np.ndarray, t: np.ndarray, steps: int) -> np.ndarray:
    """[B, C, H, W] images and [B] timesteps → [B, C+1, H, W] f32, the last plane t/T."""
    plane = np.broadcast_to((np.asarray(t, np.float64) / steps)[:, None, None, None], (len(x), 1, *x.shape[2:]))
    return np.concatenate([x, plane], axis=1).astype(np.float32)


def noised(x0: np.ndarray, t: np.ndarray, eps: np.ndarray, schedule: LinearSchedule) -> np.ndarray:
    """The net's input for x0 noised to timesteps t with noise eps."""
    ab = schedule.alpha_bar[t][:, None, None, None]
    xt = np.sqrt(ab) * x0.astype(np.float64) + np.sqrt(1.0 - ab) * eps
    return with_time_channel(xt, t, schedule.steps)


def training_pair(x0: np.ndarray, rng: np.random.Generator, schedule: LinearSchedule) -> tuple[np.ndarray, np.ndarray]:
    """(net input, target ε) for one batch of clean images."""
    t = rng.integers(0, schedule.steps, len(x0))
    eps = rng.standard_normal(x0.shape)
    return noised(x0, t, eps, schedule), eps.astype(np.float32)


def eval_pair(x0: np.ndarray, schedule: LinearSchedule) -> tuple[np.ndarray, np.ndarray]:
    """The test split's fixed (net input, ε): the same t and ε every epoch and every run."""
    return training_pair(x0, np.random.default_rng(EVAL_SEED), schedule)


def ancestral_sample(predict: Callable[[np.ndarray], np.ndarray], n: int, shape: tuple[int, ...],
                     schedule: LinearSchedule, rng: np.random.Generator,
                     clip: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """n images [n, *shape] drawn by ancestral sampling; `predict` maps net inputs to ε̂. `clip`,
    per-channel (lo, hi), bounds each step's x̂0 (None: unclipped, Ho et al.'s update exactly)."""
    betas, alphas, ab = schedule.betas, schedule.alphas, schedule.alpha_bar
    x = rng.standard_normal((n, *shape))
    for t in range(schedule.steps - 1, -1, -1):
        eps = predict(with_time_channel(x, np.full(n, t), schedule.steps)).astype(np.float64)
        x0 = (x - math.sqrt(1.0 - ab[t]) * eps) / math.sqrt(ab[t])
        if clip is not None:
            x0 = np.clip(x0, clip[0][:, None, None], clip[1][:, None, None])
        ab_prev = ab[t - 1] if t > 0 else 1.0
        x = (math.sqrt(ab_prev) * betas[t] * x0 + math.sqrt(alphas[t]) * (1.0 - ab_prev) * x) / (1.0 - ab[t])
        if t > 0:
            x = x + math.sqrt(betas[t]) * rng.standard_normal(x.shape)
    return x


def to_unit(images: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per channel, [lo, hi] → [0, 1], clipped."""
    scale = np.where(hi > lo, hi - lo, 1.0)
    return np.clip((images - lo[None, :, None, None]) / scale[None, :, None, None], 0.0, 1.0)


def image_grid(images: np.ndarray, cols: int, zoom: int = 4, pad: int = 1) -> np.ndarray:
    """[n, C, H, W] in [0, 1] → one RGB image [rows·(H·zoom+pad)+pad, cols·(W'·zoom+pad)+pad, 3]: an image of
    C 1 or 3 as itself (W' = W), one of other C (BraTS' 4 modalities) as its C channels side by side in grey
    (W' = C·W)."""
    n, c, h, w = images.shape
    if c not in (1, 3):  # refused after the sampling, it lost every sample drawn
        images, c, w = images.transpose(0, 2, 1, 3).reshape(n, 1, h, c * w), 1, c * w
    rgb = np.repeat(images, 3, axis=1) if c == 1 else images
    big = rgb.repeat(zoom, axis=2).repeat(zoom, axis=3).transpose(0, 2, 3, 1)
    rows = -(-n // cols)
    hh, ww = h * zoom, w * zoom
    grid = np.ones((rows * (hh + pad) + pad, cols * (ww + pad) + pad, 3))
    for i in range(n):
        r, q = divmod(i, cols)
        grid[pad + r * (hh + pad):pad + r * (hh + pad) + hh, pad + q * (ww + pad):pad + q * (ww + pad) + ww] = big[i]
    return grid
