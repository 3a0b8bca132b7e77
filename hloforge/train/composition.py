"""Composition sessions: a net's VJP and an optimizer step as their own compiled modules, on device buffers.

A net composed with others (MuZero's representation, dynamics and prediction nets; a DQN's online
net and its target) is not trained by one fused train step: the caller runs each net forward, forms
the losses, and walks back through the nets, each taking its output cotangent ḡ from the next one
and handing ∂x back (seed 001). Three pieces, all on one backend:

- `DeviceParams`: one net's θ on the device, stored as its modules carry them (conv kernels HWIO on
  XLA: `hloforge.core.modules.param_storage`), declared layouts at the host edge. Shared by the
  sessions below, so an optimizer step's θ' is what the next VJP reads, with no host round-trip.
- `VjpSession(spec, batch, backend)`: `forward(x) -> y` and `vjp(x, ḡ) -> (y, ∂θ, ∂x)`, ∂θ summed
  over the batch (no 1/B, no loss). `vjp(..., into=grads)` adds this application's ∂θ to `grads` on
  the device (a net applied K times in one unroll takes the sum of its K gradients).
- `OptimizerStepSession(spec, optimizer, backend, params=vjp.theta)`: `step(grads, lr)` runs
  `(θ, state, ∂θ, schedule) -> (θ', state')` with θ and the state donated (updated in place).

See docs/composition.md for a worked MuZero-style unroll and a DQN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.modules import (
    Storage,
    forward_module,
    host_declared,
    host_stored,
    net_vjp_module,
    optimizer_step_module,
    param_storage,
)
from hloforge.core.registry import Registry, default_registry
from hloforge.core.spec import NetSpec, ParamSlot, qualified_masks
from hloforge.core.strategy import target_of
from hloforge.core.variant import Optimizer, Variant, Wrappers, checked_lr
from hloforge.train.session import _is_host, memory_said, positive_batch, stage

__all__ = ["DeviceParams", "Gradients", "OptimizerStepSession", "VjpSession"]

Slots = Sequence[tuple[str, ParamSlot]]


def _check_shapes(what: str, slots: Slots, arrays: Sequence[Any]) -> None:
    if len(arrays) != len(slots):
        raise DataError(f"{what}: got {len(arrays)} tensors, expected {len(slots)} (one per parameter)")
    for (name, slot), a in zip(slots, arrays, strict=True):
        if tuple(np.shape(a)) != slot.shape:
            raise DataError(f"{what}: parameter {name} has shape {list(np.shape(a))}, expected {list(slot.shape)}")


class DeviceParams:
    """θ of one net on the device, each tensor stored as `storage` says. `buffers` is the current
    θ: an optimizer step replaces them (its inputs are donated), so hold this object, not the list."""

    def __init__(self, slots: Slots, backend: Any, params: Sequence[np.ndarray], storage: Storage):
        _check_shapes("params", slots, params)
        self.slots, self.backend, self.storage = tuple(slots), backend, tuple(storage)
        self.buffers: list[Any] = []
        self.replace(params)

    def replace(self, params: Sequence[np.ndarray]) -> None:
        """Overwrite θ with host arrays in their declared layouts."""
        _check_shapes("replace", self.slots, params)
        stored = host_stored([np.asarray(p, np.float32) for p in params], self.storage)
        self.buffers = [self.backend.to_device(a) for a in stored]

    def read_params(self) -> list[np.ndarray]:
        """θ, copied to the host (declared layouts)."""
        return self.read_params_prefix()

    def read_params_prefix(self, count: int | None = None) -> list[np.ndarray]:
        """The leading `count` θ tensors (default all), copied to the host: a target net's θ every step."""
        n = len(self.buffers) if count is None else count
        if not 0 <= n <= len(self.buffers):
            raise DataError(f"read_params_prefix({count}): θ has {len(self.buffers)} tensors")
        return host_declared([self.backend.to_host(b) for b in self.buffers[:n]], self.storage)


class Gradients:
    """∂θ of one net as device buffers (stored as its θ), from `VjpSession.vjp`. Passing it as
    `vjp(..., into=)` adds to it on the device and consumes it (use the returned one)."""

    def __init__(self, slots: Slots, backend: Any, buffers: Sequence[Any], storage: Storage):
        self.slots, self.backend, self.storage = tuple(slots), backend, tuple(storage)
        self._buffers: list[Any] | None = list(buffers)

    @property
    def buffers(self) -> list[Any]:
        if self._buffers is None:
            raise DataError("these gradients were summed into newer ones (vjp(..., into=)); use the gradients "
                            "that call returned")
        return self._buffers

    def _consume(self) -> list[Any]:
        out, self._buffers = self.buffers, None
        return out

    def read(self) -> list[np.ndarray]:
        """∂θ copied to the host, in declared layouts."""
        return host_declared([self.backend.to_host(b) for b in self.buffers], self.storage)


def _device(backend: Any, a: Any) -> Any:
    """A host array staged for one execute (f32, contiguous); a device buffer as it is."""
    return stage(backend, np.ascontiguousarray(a, np.float32)) if _is_host(a) else a


class VjpSession:
    """A net's forward and VJP at a fixed batch, θ held on the device (`theta`).

    `params`: host arrays (declared layouts), a `DeviceParams` to share, or None for
    `spec.init_params(seed)`. Nets with dropout or drop-path masks are refused (the forward and
    the VJP would see different nets); BatchNorm normalises with batch statistics in both."""

    def __init__(self, spec: NetSpec, batch: int, backend: Any, *, params: Sequence[np.ndarray] | DeviceParams | None
                 = None, seed: int = 0):
        batch = positive_batch(batch)
        walk = spec.walk()
        if qualified_masks(walk):
            raise UnsupportedSpec(f"net {spec.name!r} has dropout / drop-path masks; a VjpSession takes nets without "
                                  "them")
        self.spec, self.batch, self.backend = spec, batch, backend
        self.target = target_of(backend)
        self.slots = tuple(spec.params())
        self.storage = param_storage(self.slots, self.target)
        if isinstance(params, DeviceParams):
            if params.slots != self.slots or params.storage != self.storage or params.backend is not backend:
                raise DataError(f"params: a DeviceParams of another net or backend, not {spec.name!r}'s")
            self.theta = params
        else:
            host = list(params) if params is not None else spec.init_params(seed)
            self.theta = DeviceParams(self.slots, backend, host, self.storage)
        self.x_shape = (batch, *spec.input_shape)
        self.y_shape = (batch, *walk[-1].out_shape)
        self._exes: dict[str, Any] = {}

    def _memory_said(self, which: str) -> AbstractContextManager[None]:
        """Out of memory in the block said with this session's batch (IREE allocates as it compiles)."""
        what = "forward" if which == "forward" else "VJP"
        return memory_said(f"the {what} of net {self.spec.name!r}", self.batch, "use a smaller VjpSession batch")

    def _exe(self, which: str) -> Any:
        if which not in self._exes:  # compiled on first use: a net applied once never builds the accumulating form
            text = (forward_module(self.spec, self.batch, target=self.target) if which == "forward" else
                    net_vjp_module(self.spec, self.batch, target=self.target, accumulate=which == "acc"))
            with self._memory_said(which):
                self._exes[which] = self.backend.compile(text)
        return self._exes[which]

    def _checked(self, what: str, a: Any, shape: tuple[int, ...]) -> Any:
        if _is_host(a) and tuple(np.shape(a)) != shape:
            raise DataError(f"{self.spec.name} {what} has shape {list(np.shape(a))}, expected {list(shape)}")
        return _device(self.backend, a)

    def _out(self, buf: Any, host: bool) -> Any:
        return self.backend.to_host(buf) if host else buf

    def forward(self, x: Any, *, host: bool = True) -> Any:
        """y = net(x) (host arrays, or device buffers with `host=False`)."""
        xd = self._checked("input x", x, self.x_shape)
        exe = self._exe("forward")
        with self._memory_said("forward"):
            (y,) = self.backend.execute(exe, [xd, *self.theta.buffers],
                                        keep=range(1, 1 + len(self.slots)))  # θ outlives the call
        return self._out(y, host)

    def vjp(self, x: Any, gbar: Any, *, into: Gradients | None = None,
            host: bool = True) -> tuple[Any, Gradients, Any]:
        """(y, ∂θ, ∂x) of the net at x with output cotangent ḡ: ∂θ = (∂y/∂θ)ᵀḡ summed over the batch,
        ∂x = (∂y/∂x)ᵀḡ. `into`: gradients of an earlier application of this net, summed with this
        one's on the device (and consumed). x and ḡ: host arrays or device buffers; y and ∂x come
        back as host arrays (device buffers with `host=False`)."""
        args = [*self.theta.buffers, self._checked("input x", x, self.x_shape),
                self._checked("cotangent ḡ", gbar, self.y_shape)]
        if into is not None:
            if into.slots != self.slots or into.backend is not self.backend:
                raise DataError(f"vjp(into=): gradients of another net or backend, not {self.spec.name!r}'s")
            args += into._consume()
        exe = self._exe("vjp" if into is None else "acc")
        with self._memory_said("vjp"):
            outs = self.backend.execute(exe, args, keep=range(len(self.slots)))  # θ outlives it; `into` is consumed
        n = len(self.slots)
        grads = Gradients(self.slots, self.backend, outs[1:1 + n], self.storage)
        return self._out(outs[0], host), grads, self._out(outs[1 + n], host)

    def read_params(self) -> list[np.ndarray]:
        return self.theta.read_params()

    def read_params_prefix(self, count: int | None = None) -> list[np.ndarray]:
        return self.theta.read_params_prefix(count)


#: the Variant fields an optimizer step reads; any other set to a non-default value is refused
_STEP_FIELDS = ("optimizer", "weight_decay", "ema", "accum", "clip")


class OptimizerStepSession:
    """One optimizer update per `step(grads, lr)` on a gradient the caller assembled:
    `(θ, state, ∂θ, schedule) -> (θ', state')`, θ and the state donated (updated in place).

    `net`: a NetSpec or its `(name, ParamSlot)` list. `optimizer`: a Variant (its optimizer and
    wrappers: weight_decay, ema, accum, clip), an Optimizer, or an optimizer name. `params`: a
    `DeviceParams` (e.g. `vjp_session.theta`, so the step updates the θ the VJP reads), host arrays,
    or None for the spec's `init_params(seed)`."""

    def __init__(self, net: NetSpec | Slots, optimizer: Variant | Optimizer | str, backend: Any, *,
                 params: DeviceParams | Sequence[np.ndarray] | None = None, seed: int = 0,
                 registry: Registry | None = None):
        reg = registry or default_registry()
        self.backend = backend
        self.slots = tuple(net.params() if isinstance(net, NetSpec) else net)
        target = target_of(backend)
        self.storage = param_storage(self.slots, target)
        if isinstance(optimizer, str):
            optimizer = Variant(optimizer)
        if isinstance(optimizer, Variant):
            ignored = [f.name for f in attrs.fields(Variant)
                       if f.name not in _STEP_FIELDS and getattr(optimizer, f.name) != f.default]
            if ignored:
                raise UnsupportedSpec(f"an optimizer step reads only the variant's {', '.join(_STEP_FIELDS)}; "
                                      f"{', '.join(ignored)} belong to the net or its loss")
            self.optimizer, self.wrappers = optimizer.make_optimizer(reg), optimizer.wrappers
        else:
            self.optimizer, self.wrappers = optimizer, Wrappers()
        self.state_layout = self.wrappers.layout(self.optimizer)
        if isinstance(params, DeviceParams):
            if params.slots != self.slots or params.storage != self.storage or params.backend is not backend:
                raise DataError("params: a DeviceParams of another net or backend")
            self.theta = params
        else:
            if params is None:
                if not isinstance(net, NetSpec):
                    raise DataError("params: give θ (host arrays or a DeviceParams) when the net is a slot list")
                params = net.init_params(seed)
            self.theta = DeviceParams(self.slots, backend, list(params), self.storage)
        host = self.theta.read_params()
        bare = [s for _, s in self.slots]
        initial = self.state_layout.initial(self.optimizer, bare, host)
        self._state = [backend.to_device(a) for a in host_stored(initial, self.storage)]
        with self._memory_said():
            self.exe = backend.compile(optimizer_step_module(bare, self.optimizer, wrappers=self.wrappers,
                                                             storage=self.storage, target=target,
                                                             name="composition_optimizer_step"))
        self.step_count = 0

    def step(self, grads: Gradients | Sequence[np.ndarray], lr: float) -> None:
        """θ ← the optimizer's update from `grads` (a `Gradients` of this net, or host arrays in
        declared layouts) at learning rate `lr`; the gradients stay valid (they are not donated)."""
        if isinstance(grads, Gradients):
            if grads.slots != self.slots or grads.backend is not self.backend:
                raise DataError("step: gradients of another net or backend")
            g = grads.buffers
        else:
            _check_shapes("step gradients", self.slots, grads)
            g = [stage(self.backend, a) for a in host_stored([np.asarray(a, np.float32) for a in grads],
                                                             self.storage)]
        checked_lr(lr)  # before the step counts
        self.step_count += 1
        sched = self.state_layout.host_schedule(self.optimizer, self.step_count, lr)
        n = len(self.slots)
        with self._memory_said():
            outs = self.backend.execute(self.exe, [*self.theta.buffers, *self._state, *g,
                                                   stage(self.backend, sched)])
        self.theta.buffers, self._state = list(outs[:n]), list(outs[n:])

    def read_params(self) -> list[np.ndarray]:
        return self.theta.read_params()

    def read_params_prefix(self, count: int | None = None) -> list[np.ndarray]:
        return self.theta.read_params_prefix(count)

    def _memory_said(self) -> AbstractContextManager[None]:
        """Out of memory in the block said in one line: the step takes no batch, so what fills memory is θ,
        its optimizer state and ∂θ, held together."""
        mib = sum(4 * math.prod(s.shape) for _, s in self.slots) / 2**20
        return memory_said(f"the optimizer step of {len(self.slots)} parameter tensors ({mib:.1f} MiB of θ)", None,
                           "θ, its optimizer state and ∂θ must fit on the device together")

    def read_state(self) -> list[np.ndarray]:
        """The optimizer state, copied to the host: each group of `state_layout.slots` in turn, one per θ."""
        return host_declared([self.backend.to_host(b) for b in self._state], self.storage, len(self.slots))
