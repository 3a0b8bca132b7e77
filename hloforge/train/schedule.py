"""Learning-rate schedules: linear warmup, then cosine to zero or exponential decay.

The lr is a runtime scalar of the train step, so one compiled step serves the
whole run.
"""

from __future__ import annotations

import math

from hloforge.core.errors import UnsupportedSpec

# a product such as 0.29 × 100 = 28.999999999999996 counts its whole updates, not one fewer
WHOLE_UPDATE_SLACK = 1e-9

SCHEDULES = ("cosine", "exp", "constant")


def lr_at(step: int, *, base: float, total_steps: int, warmup_steps: int = 0, schedule: str = "cosine",
          decay_rate: float = 0.97, steps_per_epoch: int = 1, decay_epochs: float = 1.0) -> float:
    """The learning rate for 0-based optimizer step `step`.

    exp: base · decay_rate^(epochs elapsed since warmup / decay_epochs) (seed 003): ×decay_rate every
    decay_epochs epochs — MobileNetV2's ×0.98 per epoch, EfficientNet's ×0.97 every 2.4.
    """
    if schedule not in SCHEDULES:
        raise UnsupportedSpec(f"unknown schedule {schedule!r}; expected one of {list(SCHEDULES)}")
    if step < warmup_steps:  # every warm-up step below base (as PyTorch's and timm's ramps), base at step warmup_steps
        return base * (step + 1) / (warmup_steps + 1)
    t = step - warmup_steps
    if schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * t / max(total_steps - warmup_steps, 1)))
    if schedule == "exp":
        return base * decay_rate ** (t / (steps_per_epoch * decay_epochs))
    return base


def warmup_updates(warmup_epochs: float, per_epoch: int) -> int:
    """The optimizer updates a warm-up of `warmup_epochs` spans at `per_epoch` updates an epoch (whole ones).
    One worth less than a whole update is refused: it would warm up nothing, and be taken unsaid."""
    updates = warmup_epochs * per_epoch
    if warmup_epochs and updates + WHOLE_UPDATE_SLACK < 1:
        least = math.ceil(1e4 / per_epoch) / 1e4  # rounded up: a value that does make one update
        raise UnsupportedSpec(f"warmup_epochs {warmup_epochs:g} is less than one optimizer update ({warmup_epochs:g} "
                              f"of an epoch of {per_epoch}), so it would warm up nothing; expected at least {least:g} "
                              "(one update), or 0 for no warm-up")
    return int(updates + WHOLE_UPDATE_SLACK)
