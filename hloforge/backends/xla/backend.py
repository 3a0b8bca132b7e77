"""The `xla` backend plugin: StableHLO text through XLA's PJRT C API (hloforge's own cffi binding).

Executables are cached on disk (:mod:`hloforge.backends.xla.cache`; $HLOFORGE_XLA_CACHE=0: off)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hloforge.backends.base import InputSlot
from hloforge.backends.host_memory import host_memory_description, trim_heap
from hloforge.backends.xla.cache import ExecutableCache
from hloforge.backends.xla.pjrt import (
    Client,
    DeviceBuffer,
    Executable,
    client_with_devices,
    default_client,
    forced_scheduler,
    host_calls,
    xla_scheduler,
)
from hloforge.core.hookspecs import hookimpl


def auto_scheduler(mlir_text: str) -> str:
    """The XLA CPU scheduler for a module nobody chose one for. XLA's concurrent schedule runs
    independent ops side by side: convolutions gain (mnist-cnn 99 vs 109 ms/step, resnet-mini 87
    vs 90), but a program of dots, each already using every core, only contends (mnist-mlp 1.81
    vs 2.01 ms, bimodal; 5.15 vs 5.50 at batch 512; vit-cifar, whose patch embedding is its only
    convolution, 174–177 vs 180–187). So a module is scheduled concurrently where its convolutions
    are more than half as many as its dot_generals, sequentially otherwise: a Winograd conv is nine
    dot_generals (mnist-cnn's 9 convolutions and 15 dots: concurrent 189–209 ms against sequential
    186–226; fpn-mini's 28 and 37: 28.6–34.3 against 31.8–38.8)."""
    convolutions, dots = mlir_text.count("stablehlo.convolution"), mlir_text.count("stablehlo.dot_general")
    return "concurrent" if 2 * convolutions > dots else "sequential"


class XlaBackend:
    """Implements :class:`hloforge.backends.base.Backend` on the process-wide PJRT client."""

    name = "xla"
    # The lowering forms XLA's modules are rendered in (core/strategy.py; why: benchmarks/NOTES.md).
    strategy_defaults = {"layout": "nhwc", "update": "in_backward", "paramLayout": "hwio", "sums": "blocked",
                         "conv2d": "nchw", "convGrad": "winograd", "pointwise": "dot", "depthwise": "shifted",
                         "maxPool": "select", "bnReduce": "blocked", "sdpaGrad": "untransposed",
                         "maskedSum": "broadcast", "lnSums": "dot", "tokenProduct": "rows"}

    def __init__(self, client: Client | None = None, devices: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None):
        """`devices`: a client with that many devices (on the CPU plugin, exactly that many).
        `cache_dir`: where executables are cached (default $HLOFORGE_CACHE_DIR/xla)."""
        self.client = client or (default_client() if devices is None else client_with_devices(devices))
        self.cache = ExecutableCache(cache_dir)
        #: compiles and cache hits made through this backend (tests read these)
        self.stats = self.cache.stats

    def backend_name(self) -> str:
        """What is really loaded: the platform and the plugin file (and a scheduler forced for all)."""
        forced = forced_scheduler()
        return f"xla ({self.client.platform_name}, {self.client.plugin_path}" + (
            f", {forced} scheduler)" if forced else ")")

    def fingerprint(self) -> str:
        """What a program's speed depends on besides its text: the plugin file (an upgrade in place
        changes its size or time), its platform version, the device count."""
        c = self.client
        try:
            st = os.stat(c.plugin_path)
            build = f"{st.st_size} bytes {st.st_mtime_ns}"
        except OSError:
            build = "?"
        return (f"xla {c.platform_name} {c.platform_version} {c.plugin_path} ({build}) devices {len(c.devices)} "
                f"scheduler {forced_scheduler() or 'auto'} {host_memory_description()}")

    def compile(self, mlir_text: str, num_replicas: int = 1) -> Executable:
        """More replicas than the client has devices is a BackendError (from the binding)."""
        exe = self.cache.compile(self.client, mlir_text, num_replicas,
                                 scheduler=xla_scheduler() or auto_scheduler(mlir_text))
        trim_heap()
        return exe

    def to_device(self, array: np.ndarray, borrow: bool = False, device: int = 0) -> DeviceBuffer:
        return self.client.to_device(array, device, borrow=borrow)

    def input_slot(self, shape: tuple[int, ...], dtype: np.dtype) -> InputSlot | None:
        """A fixed input buffer the host rewrites per call (see InputSlot): on the CPU, where a
        PJRT buffer made from a host array is that array's layout in host memory; else None."""
        if self.client.platform_name != "cpu":
            return None
        buffer = self.client.to_device(np.zeros(shape, dtype))
        return InputSlot(buffer, buffer._host_memory())

    def device_count(self) -> int:
        return len(self.client.devices)

    def to_host(self, buffer: DeviceBuffer) -> np.ndarray:
        return buffer.to_numpy()

    def execute(self, exe: Executable, args: Sequence[DeviceBuffer], keep: Sequence[int] = ()) -> list[DeviceBuffer]:
        with host_calls.reraised():
            return exe.execute(args, keep=keep)

    def execute_replicated(self, exe: Executable, per_replica: Sequence[Sequence[DeviceBuffer]],
                           keep: Sequence[int] = ()) -> list[list[DeviceBuffer]]:
        with host_calls.reraised():
            return exe.execute_replicated(per_replica, keep=keep)

    def register_host_call(self, name: str, fn: host_calls.HostFunction) -> None:
        """Make the custom call `name` of the modules this process compiles call `fn(inputs, outputs)`
        (numpy views of the call's buffers) on the host; see backends/xla/pjrt/host_calls.py."""
        self.client.register_host_call(name, fn)


@hookimpl
def hloforge_backends() -> list[type]:
    return [XlaBackend]
