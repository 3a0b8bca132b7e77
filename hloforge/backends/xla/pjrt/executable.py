"""A compiled, loaded StableHLO module (:class:`Executable`): argument checks, donation, execution."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hloforge.backends import host_memory
from hloforge.backends.signature import ArgSpec
from hloforge.backends.xla.pjrt.buffers import _DONATED, DeviceBuffer, Owner
from hloforge.backends.xla.pjrt.c_api import _struct_size, ffi
from hloforge.core.errors import BackendError


class Executable:
    """A compiled, loaded StableHLO module."""

    def __init__(self, client: Owner, handle, signature: list[ArgSpec] | None, num_replicas: int):
        self._client = client
        self._handle = handle
        self._closed = False
        self.num_replicas = num_replicas
        self._output_types: list[tuple[tuple[int, ...], np.dtype]] | None = None
        self._output_sizes: list[int] = []  # bytes of each output on one device
        self._fresh_output_bytes: dict[tuple[int, ...], int] = {}  # keep-set -> what one device's outputs allocate
        # one device's scratch: the temp size XLA reports, or (None) the most the heap has been seen to
        # grow beyond the outputs at a launch, in _seen_scratch_bytes
        self._temp_bytes: int | None = None
        self._seen_scratch_bytes = 0
        self._passed: list[tuple[object, ...]] | None = None  # what the last accepted arguments were
        self._options: dict[tuple[int, ...], tuple[object, object]] = {}  # keep-set -> (options, its array)
        #: the parameters of @main as read from the text (None: not recognized)
        self.input_specs = signature
        #: the XLA scheduler it was compiled with (None: XLA's default; "XLA_FLAGS": the user's)
        self.scheduler: str | None = None
        #: whether it was loaded from the on-disk cache (None: not compiled through one)
        self.cache_hit: bool | None = None
        #: indices of inputs the module donates (`tf.aliasing_output`)
        self.donated_inputs: tuple[int, ...] = tuple(
            i for i, spec in enumerate(signature or ()) if spec.aliasing_output is not None
        )
        api = client._api
        unloaded = api.call(
            "LoadedExecutable_GetExecutable", "reading the executable", loaded_executable=handle
        ).executable
        try:
            outputs = api.call("Executable_NumOutputs", "counting outputs", executable=unloaded)
            self.num_outputs: int = outputs.num_outputs
            self._temp_bytes = _compiled_temp_bytes(api, unloaded)
        finally:
            api.call("Executable_Destroy", "destroying an executable view", executable=unloaded)
        client._own(self)

    def serialize(self) -> bytes:
        """The plugin's serialization of this executable (:meth:`Client.deserialize` loads it back on
        the same plugin build)."""
        api = self._client._api
        unloaded = api.call(
            "LoadedExecutable_GetExecutable", "reading the executable", loaded_executable=self._live()
        ).executable
        try:
            out = api.call("Executable_Serialize", "serializing an executable", executable=unloaded)
            try:
                return bytes(ffi.buffer(out.serialized_bytes, out.serialized_bytes_size))
            finally:
                out.serialized_executable_deleter(out.serialized_executable)
        finally:
            api.call("Executable_Destroy", "destroying an executable view", executable=unloaded)

    def execute(self, args: Sequence[DeviceBuffer], keep: Sequence[int] = ()) -> list[DeviceBuffer]:
        """Run on one device. Inputs the module donates are consumed unless listed in ``keep``."""
        if self.num_replicas != 1:
            raise BackendError(
                f"execute() runs one device, but this executable has {self.num_replicas} replicas"
            )
        return self._execute_per_device([list(args)], keep)[0]

    def execute_replicated(self, per_replica: Sequence[Sequence[DeviceBuffer]],
                           keep: Sequence[int] = ()) -> list[list[DeviceBuffer]]:
        """Run every replica at once: ``per_replica[r]`` are replica r's arguments, on
        ``client.devices[r]`` (where :meth:`Client.compile` placed replica r); returns each
        replica's outputs. Donation and ``keep`` apply to every replica alike."""
        if len(per_replica) != self.num_replicas:
            raise BackendError(f"this executable has {self.num_replicas} replica(s), got argument lists "
                               f"for {len(per_replica)}")
        return self._execute_per_device([list(args) for args in per_replica], keep)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Convenience: copy ``arrays`` in, execute, copy the results out."""
        inputs = [self._client.to_device(np.asarray(a)) for a in arrays]
        try:
            outputs = self.execute(inputs)
            try:
                return [out.to_numpy() for out in outputs]
            finally:
                for out in outputs:
                    out.delete()
        finally:
            for buf in inputs:
                buf.delete()

    def _options_keeping(self, keep: Sequence[int]):
        """PJRT_ExecuteOptions with ``keep`` not donated (PJRT only reads them: made once per keep set)."""
        key = tuple(sorted(set(keep)))
        made = self._options.get(key)
        if made is None:
            non_donatable = ffi.new("int64_t[]", list(key) or 1)
            options = ffi.new("PJRT_ExecuteOptions*")
            options.struct_size = _struct_size("PJRT_ExecuteOptions")
            options.non_donatable_input_indices = non_donatable
            options.num_non_donatable_input_indices = len(key)
            made = self._options[key] = (options, non_donatable)  # the options point into the array
        return made[0]

    def _scratch_bytes(self, num_devices: int) -> int:
        """What an execute over `num_devices` devices allocates beyond its outputs."""
        return self._seen_scratch_bytes if self._temp_bytes is None else num_devices * self._temp_bytes

    def _output_bytes_allocated(self, keep: Sequence[int]) -> int:
        """What one device's outputs allocate at a launch: an output that takes over a donated input
        (one not in ``keep``) allocates nothing."""
        key = tuple(sorted(set(keep)))
        allocated = self._fresh_output_bytes.get(key)
        if allocated is None:
            specs = self.input_specs or []
            taken_over = {specs[i].aliasing_output for i in self.donated_inputs if i not in key}
            allocated = self._fresh_output_bytes[key] = sum(
                size for j, size in enumerate(self._output_sizes) if j not in taken_over)
        return allocated

    def _check_args(self, args: Sequence[DeviceBuffer]) -> None:
        try:  # the steady state: the same kinds of live buffers as the last call that passed
            if [(b.__class__, b._client, b.shape, b.dtype, b._gone) for b in args] == self._passed:
                return
        except AttributeError:  # not a DeviceBuffer: the full check below names it
            pass
        self._check_args_fully(args)
        self._passed = [(b.__class__, b._client, b.shape, b.dtype, None) for b in args]

    def _check_args_fully(self, args: Sequence[DeviceBuffer]) -> None:
        specs = self.input_specs
        if specs is not None and len(args) != len(specs):
            raise BackendError(f"the executable takes {len(specs)} arguments, got {len(args)}")
        for i, buf in enumerate(args):
            if not isinstance(buf, DeviceBuffer):
                raise BackendError(
                    f"argument {i} is a {type(buf).__name__}, not a DeviceBuffer (use Client.to_device)"
                )
            if buf._client is not self._client:
                raise BackendError(f"argument {i} belongs to another Client")
            buf._live(f"pass it as argument {i}")
            spec = specs[i] if specs is not None else None
            if spec is None or spec.shape is None:
                continue
            shape_ok = len(spec.shape) == len(buf.shape) and all(
                want is None or want == got for want, got in zip(spec.shape, buf.shape, strict=False)
            )
            if not shape_ok or (spec.dtype is not None and spec.dtype != buf.dtype):
                raise BackendError(
                    f"argument {i} is {buf._describe()}, but the executable was compiled for "
                    f"{spec.describe()}"
                )

    def _execute_per_device(
        self, per_device: Sequence[Sequence[DeviceBuffer]], keep: Sequence[int] = ()
    ) -> list[list[DeviceBuffer]]:
        """Execute with one argument list per device; returns one output list per device."""
        api = self._client._api
        handle = self._live()
        num_args = len(per_device[0])
        for args in per_device:
            if len(args) != num_args:
                raise BackendError("every device needs the same number of arguments")
            self._check_args(args)
        bad = [k for k in keep if not 0 <= k < num_args]
        if bad:
            raise BackendError(f"keep={list(keep)} names inputs outside 0..{num_args - 1}")

        arg_arrays = [ffi.new("PJRT_Buffer*[]", [b._handle for b in args] or 1) for args in per_device]
        out_arrays = [ffi.new("PJRT_Buffer*[]", max(self.num_outputs, 1)) for _ in per_device]
        events = ffi.new("PJRT_Event*[]", len(per_device))
        options = self._options_keeping(keep)
        doing = "executing"
        ok = False
        scratch = self._scratch_bytes(len(per_device))
        # the heap is read only where its scratch is waited for, or is not known yet
        heap_before = (host_memory.heap_in_use() if self._temp_bytes is None or scratch >= host_memory.SCRATCH_MIN_BYTES
                       else None)
        try:
            api.call(
                "LoadedExecutable_Execute",
                doing,
                executable=handle,
                options=options,
                argument_lists=ffi.new("PJRT_Buffer*const*[]", arg_arrays),
                num_devices=len(per_device),
                num_args=num_args,
                output_lists=ffi.new("PJRT_Buffer**const[]", out_arrays),
                device_complete_events=events,
            )
            ok = True
        finally:
            self._mark_donated(per_device, keep, ask_pjrt=not ok)
            if not ok:
                self._release_borrowed(per_device)
        if self._output_types is None:  # fixed for a compiled executable: read once
            first = [DeviceBuffer(self._client, out_arrays[0][j]) for j in range(self.num_outputs)]
            self._output_types = [(b.shape, b.dtype) for b in first]
            self._output_sizes = [int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in self._output_types]
            outputs = [first] + [
                [DeviceBuffer(self._client, out[j], *t) for j, t in enumerate(self._output_types)]
                for out in out_arrays[1:]
            ]
        else:
            outputs = [
                [DeviceBuffer(self._client, out[j], *t) for j, t in enumerate(self._output_types)]
                for out in out_arrays
            ]
        output_bytes = len(per_device) * self._output_bytes_allocated(keep)
        if self._temp_bytes is None:
            self._seen_scratch_bytes = scratch = max(scratch, host_memory.scratch_grown(heap_before, output_bytes))
        try:
            # A borrowed input serves one execute: release it while the computation runs (PJRT frees
            # lazily once the computation is done with it), not on the step's critical path after it.
            self._release_borrowed(per_device)
            for i in range(len(per_device)):
                api.await_event(events[i], doing)
            reading = host_memory.wait_for_scratch(heap_before, output_bytes, scratch)
            host_memory.hold_stranded_scratch(scratch, reading)
            for outs in outputs:
                for buf in outs:
                    buf._computed = True
        except BackendError:
            for outs in outputs:
                for buf in outs:
                    buf.delete()
            raise
        return outputs

    @staticmethod
    def _release_borrowed(per_device: Sequence[Sequence[DeviceBuffer]]) -> None:
        for args in per_device:
            for buf in args:
                if buf._one_execute:
                    buf._release("was borrowed for one execute and was consumed by it")

    def _mark_donated(self, per_device: Sequence[Sequence[DeviceBuffer]], keep: Sequence[int],
                      ask_pjrt: bool) -> None:
        """After a successful run the module's donated inputs (less `keep`) are consumed: release
        them. After a failed run, or when the signature was not recognised, ask PJRT which
        inputs it really deleted, so a failure never throws away live parameters."""
        api = self._client._api
        kept = set(keep)
        for args in per_device:
            if self.input_specs is not None and not ask_pjrt:
                candidates = [i for i in self.donated_inputs if i not in kept]
            else:
                candidates = [i for i, buf in enumerate(args) if buf._gone is None and
                              api.call("Buffer_IsDeleted", "checking donation", buffer=buf._handle).is_deleted]
            for i in candidates:
                args[i]._release(_DONATED, i)

    def _live(self):
        if self._closed:
            raise BackendError("this Executable is closed")
        return self._handle

    def close(self) -> None:
        """Free the executable; idempotent."""
        self._release()

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        handle, self._handle = self._handle, None
        self._client._api.call(
            "LoadedExecutable_Destroy", "destroying an executable", executable=handle
        )

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # never raise from a finalizer
            pass

    def __enter__(self) -> Executable:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _compiled_temp_bytes(api, unloaded) -> int | None:
    """The temp buffer XLA assigned the executable, bytes per device, or None where the plugin does
    not say (its PJRT_Executable_GetCompiledMemoryStats is missing or wants another struct size)."""
    if not api.has("Executable_GetCompiledMemoryStats"):
        return None
    try:
        stats = api.call("Executable_GetCompiledMemoryStats", "reading compiled memory stats", executable=unloaded)
    except BackendError:
        return None
    return int(stats.temp_size_in_bytes)

