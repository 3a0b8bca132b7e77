"""Sessions: a compiled module and its device-resident state.

A TrainSession owns the train step and θ / optimizer state on the device;
each step feeds them back as donated inputs, so updates are in place.
`read_params` is the one copy back to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hloforge.core.errors import DataError
from hloforge.core.modules import forward_module, train_step_module
from hloforge.core.registry import Registry, default_registry
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant


def make_backend(name: str, registry: Registry | None = None) -> Any:
    return (registry or default_registry()).get("backend", name)()


class TrainSession:
    def __init__(self, spec: NetSpec, variant: Variant, batch: int, backend: Any, *, seed: int = 0,
                 params: Sequence[np.ndarray] | None = None, registry: Registry | None = None):
        reg = registry or default_registry()
        self.spec, self.variant, self.batch, self.backend = spec, variant, batch, backend
        self.optimizer = variant.make_optimizer(reg)
        text, self.layout = train_step_module(spec, variant, batch, registry=reg)
        self.exe = backend.compile(text)
        host = list(params) if params is not None else spec.init_params(seed)
        slots = [s for _, s in self.layout.params]
        for (name, slot), p in zip(self.layout.params, host, strict=True):
            if tuple(p.shape) != slot.shape:
                raise DataError(f"parameter {name}: got shape {list(p.shape)}, expected {list(slot.shape)}")
        self.params = [backend.to_device(np.asarray(p, np.float32)) for p in host]
        self.state = [backend.to_device(self.optimizer.init_state(s)[k]) for k in self.layout.state for s in slots]
        self.step = 0

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One fused step (forward, loss, backward, update); returns the batch loss."""
        lay = self.layout
        if x.shape != lay.x_shape:
            raise DataError(f"train batch x has shape {list(x.shape)}, expected {list(lay.x_shape)}")
        self.step += 1
        scalars = self.optimizer.host_scalars(self.step, lr)
        args = [*self.params, *self.state,
                *(self.backend.to_device(np.asarray(scalars[k], np.float32)) for k in lay.scalars),
                self.backend.to_device(np.ascontiguousarray(x, np.float32)),
                self.backend.to_device(np.ascontiguousarray(y).astype(np.int32 if lay.y_dtype == "i32" else np.float32))]
        outs = self.backend.execute(self.exe, args)
        self.params = outs[:lay.n_params]
        self.state = outs[lay.n_params:lay.n_carried]
        return float(self.backend.to_host(outs[lay.loss_index]))

    def read_params(self) -> list[np.ndarray]:
        return [self.backend.to_host(p) for p in self.params]


class ForwardSession:
    """The (eval) forward at a fixed batch; a ragged final batch is padded and its padding dropped."""

    def __init__(self, spec: NetSpec, batch: int, backend: Any):
        self.spec, self.batch, self.backend = spec, batch, backend
        self.exe = backend.compile(forward_module(spec, batch, eval_mode=True))

    def logits(self, x: np.ndarray, params: Sequence[Any]) -> np.ndarray:
        """Logits for all rows of x; `params` are device buffers (kept, never donated)."""
        out = []
        for i in range(0, len(x), self.batch):
            chunk = np.asarray(x[i:i + self.batch], np.float32)
            n = len(chunk)
            if n < self.batch:
                chunk = np.concatenate([chunk, np.zeros((self.batch - n, *chunk.shape[1:]), np.float32)])
            res = self.backend.execute(self.exe, [self.backend.to_device(chunk), *params])
            out.append(self.backend.to_host(res[0])[:n])
        return np.concatenate(out)
