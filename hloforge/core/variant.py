"""The typed training variant and the optimizer base class.

A Variant names everything that changes the train step's graph besides the
net (optimizer, its options, the loss and its options). Its slug names the
artifact, so two arms of an ablation never share a file (seed 002).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np

from hloforge.core.spec import Loss, ParamSlot, sanitize

if TYPE_CHECKING:
    from hloforge.core.hlo import Builder, Value
    from hloforge.core.registry import Registry


@attrs.frozen
class Optimizer:
    """Base of optimizer plugins: attrs frozen subclasses whose fields are the options.

    `state` names the per-parameter state tensors (in train-step order),
    `scalars` the rank-0 runtime inputs (lr first), so one compiled step
    serves a whole schedule. Weight decay is decoupled (w ← w − lr·wd·w) and
    applies only to slots with `decay=True`.
    """

    name: ClassVar[str]
    state: ClassVar[tuple[str, ...]] = ()
    scalars: ClassVar[tuple[str, ...]] = ("lr",)

    weight_decay: float = 0.0

    def init_state(self, slot: ParamSlot) -> dict[str, np.ndarray]:
        return {s: np.zeros(slot.shape, np.float32) for s in self.state}

    def host_scalars(self, step: int, lr: float) -> dict[str, float]:
        """The scalar inputs for 1-based optimizer step `step` at learning rate `lr`."""
        return {"lr": lr}

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        """The step direction d (θ' = θ − lr·d before decay) and the new state."""
        raise NotImplementedError  # abstract

    def update(self, b: Builder, p: Value, g: Value, state: Mapping[str, Value], scalars: Mapping[str, Value],
               slot: ParamSlot) -> tuple[Value, dict[str, Value]]:
        d, new_state = self.direction(b, g, state, scalars)
        lr = b.broadcast_to(scalars["lr"], p.shape)
        if self.weight_decay and slot.decay:
            d = d + p * self.weight_decay
        return p - lr * d, new_state

    def optax_direction(self) -> Any:
        """The direction d as an optax transform (the gate's oracle), written with optax's own parts."""
        raise NotImplementedError  # abstract

    def optax_reference(self, lr: float, decay_mask: Any) -> Any:
        """The whole update in optax: direction, decoupled decay on the masked slots, then −lr."""
        import optax

        return optax.chain(self.optax_direction(), optax.add_decayed_weights(self.weight_decay, decay_mask),
                           optax.scale(-lr))

    @classmethod
    def gate_cases(cls) -> list[Optimizer]:
        return [cls(), cls(weight_decay=0.1)]


@attrs.frozen
class Variant:
    optimizer: str = "adam"
    weight_decay: float | None = None  # None: the optimizer's own default
    loss: str = "crossEntropy"
    label_smoothing: float = 0.0

    @property
    def slug(self) -> str:
        parts = [self.optimizer]
        if self.weight_decay is not None:
            parts.append(f"wd{self.weight_decay:g}")
        if self.loss != "crossEntropy":
            parts.append(self.loss)
        if self.label_smoothing:
            parts.append(f"ls{self.label_smoothing:g}")
        return sanitize("_".join(parts))

    def make_optimizer(self, registry: Registry) -> Optimizer:
        opts = {} if self.weight_decay is None else {"weight_decay": self.weight_decay}
        opt: Optimizer = registry.make("optimizer", self.optimizer, **opts)
        return opt

    def make_loss(self, registry: Registry) -> Loss:
        opts = {"label_smoothing": self.label_smoothing} if self.label_smoothing else {}
        loss: Loss = registry.make("loss", self.loss, **opts)
        return loss
