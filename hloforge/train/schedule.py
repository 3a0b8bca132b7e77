"""Learning-rate schedules: linear warmup, then cosine to zero or exponential decay.

The lr is a runtime scalar of the train step, so one compiled step serves the
whole run.
"""

from __future__ import annotations

import math

from hloforge.core.errors import UnsupportedSpec

SCHEDULES = ("cosine", "exp", "constant")


def lr_at(step: int, *, base: float, total_steps: int, warmup_steps: int = 0, schedule: str = "cosine",
          decay_rate: float = 0.97, steps_per_epoch: int = 1, decay_epochs: float = 1.0) -> float:
    """The learning rate for 0-based optimizer step `step`.

    exp: base · decay_rate^(epochs elapsed since warmup / decay_epochs) (seed 003): ×decay_rate every
    decay_epochs epochs — MobileNetV2's ×0.98 per epoch, EfficientNet's ×0.97 every 2.4.
    """
    if schedule not in SCHEDULES:
        raise UnsupportedSpec(f"unknown schedule {schedule!r}; expected one of {list(SCHEDULES)}")
    if step < warmup_steps:
        return base * (step + 1) / warmup_steps
    t = step - warmup_steps
    if schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * t / max(total_steps - warmup_steps, 1)))
    if schedule == "exp":
        return base * decay_rate ** (t / (steps_per_epoch * decay_epochs))
    return base
