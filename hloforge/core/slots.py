"""What a layer declares besides its math: its parameter, statistic and mask slots, and the
context its forward runs in (`Ctx`). Shapes exclude the batch axis.

`ParamSlot` is the one definition the train-step signature, initialisation, the parameter count,
optimizer state and checkpoints all read. These live below both `hloforge.core.contracts` (whose
Layer returns them) and `hloforge.core.spec` (which re-exports them), so neither imports the other
back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, UnsupportedSpec

if TYPE_CHECKING:
    from hloforge.core.hlo import Value

Shape = tuple[int, ...]

# Initialisation rules (seed 003). Weights are uniform with the stated variance.
INITS = ("he_fan_out", "glorot", "ones", "zeros", "layer_scale")


@attrs.frozen
class ParamSlot:
    name: str
    shape: Shape = attrs.field(converter=tuple)
    init: str = attrs.field(validator=attrs.validators.in_(INITS))
    decay: bool

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def initial(self, rng: np.random.Generator) -> np.ndarray:
        if self.init == "ones":
            return np.ones(self.shape, np.float32)
        if self.init == "zeros":
            return np.zeros(self.shape, np.float32)
        if self.init == "layer_scale":
            return np.full(self.shape, 1e-6, np.float32)
        if self.init == "he_fan_out":  # conv kernel [oc, ic/groups, kh, kw]: variance 2 / (oc·kh·kw)
            fan = self.shape[0] * math.prod(self.shape[2:])
            bound = math.sqrt(6.0 / fan)
        else:  # glorot, dense [in, out]: variance 2 / (in + out)
            bound = math.sqrt(6.0 / (self.shape[0] + self.shape[-1]))
        return rng.uniform(-bound, bound, self.shape).astype(np.float32)


@attrs.frozen
class StatSlot:
    """A per-layer statistic that is not trained (BN running mean and variance): the train step
    returns its batch value, the host keeps the running average, the eval module takes it in."""

    name: str
    shape: Shape = attrs.field(converter=tuple)
    init: float = 0.0
    # a variance: below 0 it is no statistic, and the eval's rsqrt of it is NaN, which the next ReLU turns
    # into zeros, so a net scores plausibly wrong instead of failing
    nonnegative: bool = False

    def initial(self) -> np.ndarray:
        return np.full(self.shape, self.init, np.float32)


def check_stats(stats: Sequence[tuple[str, StatSlot]], values: Sequence[Any], what: str) -> None:
    """Refuse running statistics (`values`, in `stats`' order; `what` names where they came from) that no
    run could have made: a negative variance."""
    for (name, slot), value in zip(stats, values, strict=True):
        if slot.nonnegative and (np.asarray(value) < 0).any():
            raise DataError(f"{what}: statistic {name} holds {int((np.asarray(value) < 0).sum())} negative "
                            "value(s); expected a variance, ≥ 0")


@attrs.frozen
class MaskSlot:
    """A per-example random input of the train step (a dropout or stochastic-depth mask), drawn
    on the host every step — so the graph is deterministic and a resumed run redraws the same
    masks — and absent elsewhere, where the layer is the identity. `shape` excludes the batch;
    () is one scalar per example (drop path)."""

    name: str
    shape: Shape = attrs.field(converter=tuple)
    rate: float = attrs.field(default=0.0)

    @rate.validator
    def _rate(self, attribute: Any, value: float) -> None:
        if not 0.0 <= value < 1.0:
            raise UnsupportedSpec(f"mask {self.name!r}: rate must be in [0, 1), got {value}")

    def sample(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        """Inverted dropout: keep with probability 1 − rate, kept entries scaled by 1/(1 − rate)."""
        keep = rng.random((batch, *self.shape)) >= self.rate
        return (keep / (1.0 - self.rate)).astype(np.float32)


@attrs.define
class Ctx:
    """What a layer's forward may depend on besides its input and parameters.

    In training (`train=True`) a layer with stat slots puts each slot's batch value in
    `batch_stats`; in eval it reads the running value from `running`.
    """

    train: bool = False
    running: Mapping[str, Value] = attrs.Factory(dict)
    batch_stats: dict[str, Value] = attrs.Factory(dict)
    masks: Mapping[str, Value] = attrs.Factory(dict)  # the train step's per-example masks, by slot name
    # One walk's skip stack (see Layer.skip_out), shared by every layer's Ctx of that walk.
    skips: list[Value] = attrs.Factory(list)
    # The walk's own input, for a layer that reads it deep in the net (timeCondAdd's time channel);
    # None where a layer runs alone, whose input is then the net's.
    net_input: Value | None = None
    # > 1 in a data-parallel train step with sync BN: batch statistics pool this many replicas' batches
    sync_replicas: int = 1
    # > 1 in a multi-process step with sync BN: each process's replicas' pooled again over this many
    # processes (Builder.process_sum)
    sync_processes: int = 1
    # How the image activation handed to the layer is laid out: "NCHW" (the public layout) or
    # "NHWC" (inside a net rendered with strategy layout=nhwc, for a layer whose
    # `supports_nhwc` says so; the layer then returns NHWC too). Shapes in specs stay [C, H, W].
    layout: str = "NCHW"
