"""`hloforge sample`: draw images from a DDPM run's checkpoint through its eval forward module."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from hloforge.commands.argtypes import image_out
from hloforge.commands.opening import open_checkpoint
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.regions import DEFAULT_REGION
from hloforge.train.checkpoint import write_image
from hloforge.train.diffusion import ancestral_sample, image_grid, to_unit
from hloforge.train.session import ForwardSession
from hloforge.train.tasks import DiffusionTask


def sample_run(run_path: str, n: int = 16, out: str = "grid.png", seed: int = 0, backend: str | None = None,
               region: str = DEFAULT_REGION, clip: bool = True, log: Callable[[str], None] = print,
               data_dir: str | None = None, data_file: str | None = None) -> np.ndarray:
    """Draw n samples from a DDPM run's checkpoint through its eval forward module; write the grid
    image to `out` and return the samples [n, C, H, W] (the data's standardised scale). `region`:
    the live weights, the EMA shadow, or auto (the shadow when the run kept one). `data_dir`, `data_file`:
    where the run's data is now, when it moved (`open_checkpoint`'s)."""
    if n < 1:
        raise UnsupportedSpec(f"-n must be positive, got {n}")
    image_out(out)  # before the T forward passes, not after them
    oc = open_checkpoint(run_path, backend, log, data_dir=data_dir, data_file=data_file)
    run, spec = oc.run, oc.spec
    if not isinstance(run.task, DiffusionTask):
        raise DataError(f"{oc.file} is a {spec.name!r} run trained with loss {run.variant.loss!r}, not a DDPM "
                        "(a net with time-conditioned layers, timeCondAdd or timeResBlock, trained on noise targets)")
    region, params, running = oc.region_weights(region)  # θ or the EMA shadow, each with its own BN statistics
    evaluator = ForwardSession(spec, n, run.backend)
    weights = [*params, *running]
    shape = tuple(spec.out_shape)
    ref = np.asarray(run.data.arrays("train")[0], np.float64)  # the scale the net was trained on
    lo, hi = ref.min(axis=(0, 2, 3)), ref.max(axis=(0, 2, 3))
    schedule = run.task.schedule
    x = ancestral_sample(lambda xin: evaluator.logits(xin, weights, gen=0), n, shape, schedule,
                         np.random.default_rng(seed), (lo, hi) if clip else None)
    save_grid(image_grid(to_unit(x, lo, hi), cols=math.ceil(math.sqrt(n))), out)
    log(f"{spec.name} epoch {oc.meta['epoch']} ({region}): {n} samples ({schedule.steps} ancestral steps, "
        f"{schedule.describe()}, x̂0 {'clipped to the data range' if clip else 'unclipped'}) -> {out}"
        + ("" if shape[0] in (1, 3) else f", each sample's {shape[0]} channels side by side in grey"))
    return x


def save_grid(grid: np.ndarray, out: str) -> None:
    """Write an image grid ([H, W, 3] in [0, 1]) to `out` (its format from its suffix: image_out's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_image(out, lambda f, suffix: plt.imsave(f, grid, format=suffix))
