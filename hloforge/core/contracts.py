"""The contracts: what a Layer, Loss, Optimizer, Backend and Dataset plugin provides, side by side.

Each attribute and method anyone reads — the core, the trainer, the gate, the CLI — is declared
here with what it means, its default and who reads it, as pytest's `hookspec.py` documents each
hook; `docs/hookspecs.md` is generated from this module and `hookspecs.py`
(`python docs/gen_hookspecs.py`). A plugin's hook (`hloforge_layers()`, ...) returns classes
that satisfy these contracts. Layers, losses and optimizers subclass their base here; a backend
satisfies the `Backend` protocol; a dataset may subclass `Dataset` (its readers fall back to the
defaults declared here for a class that does not, so a plain class with `name`, `num_classes`
and `arrays` is a dataset).

The old homes re-export them: `hloforge.core.spec` (Layer, Loss), `hloforge.core.variant`
(Optimizer) and `hloforge.backends.base` (Backend). The values a layer returns (`ParamSlot`,
`StatSlot`, `MaskSlot`) and its forward's `Ctx` live in `hloforge.core.slots`. This module imports
no plugin and no backend.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import attrs
import numpy as np

from hloforge.core.errors import PluginError, UnsupportedSpec

if TYPE_CHECKING:
    from hloforge.core.hlo import Builder, Value
    from hloforge.core.slots import Ctx, MaskSlot, ParamSlot, Shape, StatSlot

__all__ = ["Backend", "BackendExtras", "BoxSource", "Dataset", "Executable", "Layer", "Loss", "Optimizer",
           "RecordSource", "TextSource", "layer_fields"]


def constructor_options(cls: Any) -> tuple[list[str], list[str]]:
    """The options a component's class `cls` takes, and those of them it requires."""
    if attrs.has(cls):
        fields = attrs.fields(cls)
        return [f.name for f in fields], [f.name for f in fields if f.init and f.default is attrs.NOTHING]
    params = inspect.signature(cls).parameters.values()
    known = [p.name for p in params if p.name not in ("self", "args", "kwargs")]
    return known, [p.name for p in params if p.default is p.empty and p.name in known
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_constructor_options(kind: str, name: str, cls: Any, options: Collection[str]) -> None:
    """A component's options given to its class `cls`: one it does not take, or a required one left out,
    is one UnsupportedSpec naming the component and the options it takes, not Python's TypeError.
    Read by `Registry.make` (a spec file's layer, a config's callback) and a layer class's call."""
    known, required = constructor_options(cls)
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"its options are {known}" if known else "it takes none"  # not "its options are []"
        raise UnsupportedSpec(f"{kind} {name!r} does not take option(s) {unknown}; {takes}")
    missing = [n for n in required if n not in options]
    if missing:
        raise UnsupportedSpec(f"{kind} {name!r} needs option(s) {missing}; its options are {known}")


class _Component(abc.ABCMeta):
    """The metaclass of Layer, Loss and Optimizer: a class called without a required option, or with one it
    does not take (`hf.layers.Dense()`), is refused as a spec file's or a config's is
    (`check_constructor_options`), not with Python's TypeError. An ABCMeta, so a plugin's class may also
    derive from `abc.ABC` (two unrelated metaclasses would clash)."""

    _component: tuple[str, str]  # (what the messages call it, the class attribute holding its registered name)

    def __call__(cls, /, *args: Any, **kwargs: Any) -> Any:  # `/`: a component may have an option named cls
        try:
            return super().__call__(*args, **kwargs)
        except TypeError as e:
            signature = inspect.signature(cls)
            try:
                signature.bind(*args, **kwargs)
            except TypeError:  # the call did not fit the constructor (else the TypeError is the component's own)
                kind, attr = cls._component
                name = getattr(cls, attr, cls.__name__)
                check_constructor_options(kind, name, cls, [*list(signature.parameters)[:len(args)], *kwargs])
                raise UnsupportedSpec(f"{kind} {name!r}: {e}") from None  # e.g. too many positional arguments
            raise

    @property
    def __signature__(cls) -> inspect.Signature:
        """The constructor's own (help(), editors, `check_constructor_options`), not that of `__call__` above."""
        init = inspect.signature(cls.__init__)  # type: ignore[misc]
        return init.replace(parameters=list(init.parameters.values())[1:])


# ------------------------------------------------------------------------------------------ Layer
class Layer(metaclass=_Component):
    """Base of layer plugins: attrs frozen subclasses whose fields are the layer's options.

    A subclass sets `kind` (its registered name) and implements `out_shape`,
    `forward` and `reference`; `param_slots` when it has parameters.
    `forward` raises `UnsupportedSpec(reason)`-free code: every refusal belongs in
    `out_shape`, which the shape walk calls first.
    """

    _component = ("layer", "kind")
    kind: ClassVar[str]
    """The layer's registered name, what a spec's `kind` key says. Required. Read by the registry,
    `NetSpec.from_dict`/`to_dict`, error messages and the gate's case ids."""

    strategy_kinds: ClassVar[tuple[str, ...]] = ()
    """The lowering-strategy kinds (`hloforge.core.strategy`) its forward may consult. Default `()`.
    Read by `strategies_for` (its default), hence by the renderer and the gate, which runs each case
    once per choice of each kind."""

    head_classes: int | None = None
    """A detection head (yolov1Head, fpnDetect) lays its output out itself and says its class count
    here (often a property of its options). Default None: not a head, the net's last shape must be
    `[classes]`, `[T, classes]` or `[classes, H, W]`. Read by `NetSpec.walk` on the last layer."""

    head_kind: ClassVar[str | None] = None
    """A detection head's output layout, one of `hloforge.train.detection.HEAD_KINDS` ("yolov1", "fpn"), which
    picks the loss that encodes its targets and how its output decodes (a "yolov1" head also has `boxes`, its
    boxes per cell, checked against the loss's). Default None: not a detection head. Read by
    `hloforge.train.detection.DetectionHead.of` on the net's last layer."""

    time_conditioned: ClassVar[bool] = False
    """It reads a DDPM's time channel (timeCondAdd, timeResBlock): a net with such a layer is a noise predictor,
    trained on noised images (mse by default). Default False. Read by `hloforge.train.diffusion.is_time_conditioned`."""

    def out_shape(self, in_shape: Shape) -> Shape:
        """The output shape (no batch) on input `in_shape`; raises `UnsupportedSpec(reason)` for an
        input it cannot render faithfully. Required. Read first by the shape walk
        (`hloforge.core.spec.walk_layers`), so every refusal belongs here."""
        raise NotImplementedError  # abstract

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        """Its trained parameters. Default none. Read by the shape walk: the train-step signature,
        initialisation, parameter counts, optimizer state and checkpoints all come from them."""
        return ()

    def stat_slots(self, in_shape: Shape) -> tuple[StatSlot, ...]:
        """Its untrained statistics (BN running mean/variance). Default none. Read by the walk: the
        train step returns their batch values, the eval module takes the running ones. A variance's slot
        says `nonnegative=True`: a value below 0 is then refused wherever statistics come in."""
        return ()

    def mask_slots(self, in_shape: Shape) -> tuple[MaskSlot, ...]:
        """Its per-example random inputs (dropout masks), drawn on the host each step. Default none.
        Read by the walk and the train-step module."""
        return ()

    def skip_out(self, in_shape: Shape) -> Shape | None:
        """The shape of the tensor this layer's forward pushes on `ctx.skips` (a U-Net encoder
        level leaves its pre-pool features there), or None. The walk checks every pushed skip
        is taken by exactly one later layer."""
        return None

    def skip_in(self, in_shape: Shape) -> Shape | None:
        """The shape of the skip this layer's forward pops off `ctx.skips` (the most recent one
        pushed), or None."""
        return None

    def strategies_for(self, in_shape: Shape) -> tuple[str, ...]:
        """The strategy kinds the forward consults on this input (default: all of `strategy_kinds`)."""
        return self.strategy_kinds

    def supports_nhwc(self, in_shape: Shape) -> bool:
        """Whether `forward` takes (and returns) an NHWC image when `ctx.layout` is "NHWC", so a
        net rendered with layout=nhwc keeps NHWC through it instead of transposing around it. The
        gate then runs each case in both layouts, whether or not `strategy_kinds` lists "layout"."""
        return False

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        """Builder ops from input `x` [B, *in_shape] and its parameters to the output. Required. The
        backward is derived from these ops (`hloforge.core.autodiff`), or given with
        `Builder.custom_vjp`. Read by every module generator (`hloforge.core.modules`)."""
        raise NotImplementedError  # abstract

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx) -> Any:
        """The same map in plain jax.numpy, written independently of the builder (the gate's oracle)."""
        raise NotImplementedError  # abstract

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        """Instances and input shapes (no batch) on which the gate checks this layer."""
        return []

    def to_dict(self) -> dict[str, Any]:
        """The layer as a spec's dict entry: `kind` and its options. Read by `NetSpec.to_dict` and
        `to_toml`, the gate's case names and error messages."""
        d: dict[str, Any] = {"kind": self.kind}
        for f in layer_fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        return d


def layer_fields(layer: Layer) -> tuple[attrs.Attribute[Any], ...]:
    """A layer's options: the fields of its class (every Layer subclass is an attrs class; the base is not)."""
    cls = type(layer)
    if not attrs.has(cls):  # the plugin author's mistake, not attrs' error from deep inside hloforge
        raise PluginError(f"layer {getattr(cls, 'kind', cls.__name__)!r} ({cls.__module__}.{cls.__qualname__}) "
                          "is not an attrs class: decorate it with @attrs.frozen (its fields are its options)")
    return tuple(attrs.fields(cls))


# ------------------------------------------------------------------------------------------- Loss
class Loss(metaclass=_Component):
    """Base of loss plugins: attrs frozen subclasses whose fields are the loss's options.

    `forward` maps logits [B, *out] and labels to a scalar (mean over the batch).
    """

    _component = ("loss", "name")
    name: ClassVar[str]
    """The loss's registered name (`--loss`, a variant's `loss`). Required. Read by the registry,
    the variant's slug and error messages."""

    label_kind: ClassVar[str | None] = None
    """The labels it trains on, which pick the task (`hloforge.train.tasks.TASKS`): "class",
    "mask", "noise" or "boxes". Default None: read off `label_spec` (a scalar i32 is a class id,
    an i32 [H, W] on outputs [C, H, W] a mask, a float target the output's shape noise). Read by
    `hloforge.train.tasks.loss_label_kind`."""

    strategy_kinds: ClassVar[tuple[str, ...]] = ()
    """The lowering-strategy kinds (core/strategy.py) `forward` may consult. Default none. Read by
    the gate, which runs each of the loss's cases once per choice of each."""

    also_known_as: ClassVar[tuple[str, ...]] = ()
    """Other frameworks' names of this loss (Keras's `sparse_categorical_crossentropy`, PyTorch's
    `CrossEntropyLoss`), matched without case or underscores. Default none. Read by the registry's refusal of an unknown
    name, which names this loss instead of the closest spelling (a different loss)."""

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        """Per-example label shape (no batch) and element type ('i32' class ids, 'f32' targets)."""
        raise NotImplementedError  # abstract

    def check(self, out_shape: Shape) -> None:
        """Raise UnsupportedSpec if this loss cannot apply to outputs of this shape."""

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        """Builder ops from logits [B, *out] and labels to the scalar loss (mean over the batch).
        Required. Read by the train-step and probe modules."""
        raise NotImplementedError  # abstract

    def reference(self, logits: Any, y: Any) -> Any:
        """The same loss in plain jax.numpy (the gate's oracle). Required for the gate."""
        raise NotImplementedError  # abstract

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        """Labels the gate feeds this loss."""
        raise NotImplementedError  # abstract

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        """Instances and output shapes (no batch) on which the gate checks this loss. Default none."""
        return []


# -------------------------------------------------------------------------------------- Optimizer
@attrs.frozen
class Optimizer(metaclass=_Component):
    """Base of optimizer plugins: attrs frozen subclasses whose fields are the options.

    `state` names the per-parameter state tensors (in train-step order),
    `scalars` the runtime scalars (lr first; the step takes them packed into one
    schedule vector), so one compiled step serves a whole schedule. Weight decay is decoupled (w ← w − lr·wd·w) and
    applies only to slots with `decay=True`.
    """

    _component = ("optimizer", "name")
    name: ClassVar[str]
    """The optimizer's registered name (`--optimizer`, a variant's `optimizer`). Required. Read by
    the registry and the variant's slug."""

    state: ClassVar[tuple[str, ...]] = ()
    """Names of its per-parameter state tensors (m, v, ...), in train-step order. Default none.
    Read by `hloforge.core.variant.StateLayout` (the train step, session, checkpoint and scorer)."""

    scalars: ClassVar[tuple[str, ...]] = ("lr",)
    """Names of its runtime scalars, lr first, packed into the step's schedule vector. Default
    ("lr",). Read by `StateLayout` and `Variant.host_scalars`."""

    layout_free: ClassVar[bool] = False
    """Its update treats each tensor as a bag of elements (elementwise, or whole-tensor norms), so
    a train step may hand it tensors in their stored axis order. Default False: it gets them in
    their declared layout, transposed there and back every step. Read by `hloforge.core.modules`."""

    weight_decay: float = 0.0
    """Decoupled weight decay (w ← w − lr·wd·w) on the slots with `decay=True`. Default 0. An attrs
    field: every subclass has it as an option."""

    def init_state(self, slot: ParamSlot) -> dict[str, np.ndarray]:
        """Each `state` tensor's initial value for one parameter slot. Default zeros."""
        return {s: np.zeros(slot.shape, np.float32) for s in self.state}

    def host_scalars(self, step: int, lr: float) -> dict[str, float]:
        """The scalar inputs for 1-based optimizer step `step` at learning rate `lr`."""
        return {"lr": lr}

    def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                  scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
        """The step direction d (θ' = θ − lr·d before decay) and the new state."""
        raise NotImplementedError  # abstract

    def decayed(self, p: Value, d: Value, slot: ParamSlot) -> Value:
        """d plus the decoupled weight decay term, on the slots that take decay."""
        return d + p * self.weight_decay if self.weight_decay and slot.decay else d

    def update(self, b: Builder, p: Value, g: Value, state: Mapping[str, Value], scalars: Mapping[str, Value],
               slot: ParamSlot) -> tuple[Value, dict[str, Value]]:
        """θ' and the new state from θ, its gradient, state and scalars: `direction`, `decayed`, then
        −lr. Read by `hloforge.core.variant.Wrappers.emit_update`."""
        d, new_state = self.direction(b, g, state, scalars)
        if getattr(d, "type", None) != g.type:  # else the refusal is of the multiply below, naming no direction
            raise UnsupportedSpec(f"direction returned {getattr(d, 'type', repr(d))} for a gradient of {g.type}; "
                                  "expected a direction of the gradient's own shape and dtype")
        d = self.decayed(p, d, slot)
        return p - b.broadcast_to(scalars["lr"], p.shape) * d, new_state

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
        """Instances the gate checks against optax. Default: the defaults, and weight decay 0.1."""
        return [cls(), cls(weight_decay=0.1)]


# ---------------------------------------------------------------------------------------- Backend
# The core's own lowering-strategy kinds, name -> choices (the first the portable form): what a backend's
# `strategy_defaults` may name besides the layer plugins' kinds, and names no plugin's kind may take. Here,
# below the registry, so it refuses such a plugin as it loads it; `hloforge.core.strategy` documents them.
CORE_STRATEGY_CHOICES: Mapping[str, tuple[str, ...]] = {
    "layout": ("nchw", "nhwc"), "update": ("after_backward", "in_backward"), "paramLayout": ("public", "hwio"),
    "sums": ("plain", "blocked")}


@runtime_checkable
class Backend(Protocol):
    """What a backend class provides (instances are made with no arguments by `make_backend`).

    Buffers are opaque to callers: only the backend that made one can read or run it. A donated
    input is consumed by `execute` unless its index is in `keep`, on every backend alike.
    `hloforge.testing.backend_conformance` checks a backend against this contract.
    """

    name: ClassVar[str]
    """The name `--backend` / $HLOFORGE_BACKEND select and the registry files it under. Required.
    Read by the registry, `hloforge.train.session.make_backend`, checkpoints' paths and metadata,
    and `hloforge.core.strategy.target_of` (its render target)."""

    def backend_name(self) -> str:
        """What is really loaded, e.g. "iree (llvm-cpu, compiler 3.13.0)" or "xla (cpu, /path/libpjrt_cpu.so)"."""
        ...

    def compile(self, mlir_text: str, num_replicas: int = 1) -> Any:
        """Compile StableHLO text; a BackendError with the compiler's message when it is rejected,
        and when `num_replicas` is more than the backend can run (never a quiet single-device run).
        A session places its initial state with `to_device` from another thread meanwhile."""
        ...

    def to_device(self, array: np.ndarray, borrow: bool = False, device: int = 0) -> Any:
        """Copy a host array to device `device` (replica `device` of a replicated executable).
        `borrow=True` marks a one-execute input the caller neither writes nor keeps: a backend
        may alias its memory instead of copying."""
        ...

    def to_host(self, buffer: Any) -> np.ndarray:
        """A host copy of a device buffer (a copy: later in-place updates do not show through)."""
        ...

    def execute(self, exe: Any, args: Sequence[Any], keep: Sequence[int] = ()) -> list[Any]:
        """Run on one device. Arguments of the wrong count, dtype or shape are refused before
        execution, naming the argument. Donated inputs are consumed unless listed in `keep`."""
        ...



class BackendExtras(Protocol):
    """What a backend may add to `Backend`. Each is optional: its readers look it up with `getattr`
    or `hasattr` and fall back as said (so these are not members of the runtime-checkable `Backend`)."""

    def device_count(self) -> int:
        """How many devices this backend instance can run replicas on. Default 1 (a backend without it
        is one device, and data-parallel runs on it are refused). Read by `hloforge.train.parallel`."""
        ...

    def execute_replicated(self, exe: Any, per_replica: Sequence[Sequence[Any]],
                           keep: Sequence[int] = ()) -> list[list[Any]]:
        """Run an executable compiled for N replicas: `per_replica[r]` are replica r's arguments,
        on device r (placed there by `to_device(array, device=r)`); returns each replica's outputs.
        A backend that cannot raises BackendError (never a quiet run on one device). Read by the
        data-parallel session (`hloforge.train.parallel`)."""
        ...

    def fingerprint(self) -> str:
        """What a compiled program's speed depends on besides its text (compiler and plugin
        versions, flags). Default: `backend_name()`. Read by `hloforge.backends.base.backend_fingerprint`
        (the autotune cache's key)."""
        ...

    def input_slot(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A `hloforge.backends.base.InputSlot` the host rewrites in place each step, or None where
        it cannot. Default: none (a new buffer per call). Read by `hloforge.train.session`."""
        ...

    def register_host_call(self, name: str, fn: Callable[[Sequence[Any], Sequence[Any]], None]) -> None:
        """Make the custom call `name` (`Builder.process_sum`'s) in the programs this process compiles
        call `fn(inputs, outputs)` on the host mid-run, numpy views of the call's buffers; an exception
        `fn` raises fails the run and is re-raised by `execute`. Default: none (a step that needs it
        is refused with one line). Read by the MPI session's sync BN (`hloforge.train.mpi`)."""
        ...


class Executable(Protocol):
    """What `Backend.compile` returns, as others read it (only its backend runs it)."""

    input_specs: Sequence[Any] | None
    """The `@main` parameters (`hloforge.backends.base.ArgSpec`), read from the text by
    `parse_main_signature`; None when the text has no recognizable `@main`. Read by the backend's
    argument check (`check_args`) and the tests."""

    donated_inputs: Sequence[int]
    """Indices of the inputs marked `tf.aliasing_output`: consumed by `execute` unless kept."""

    cache_hit: bool
    """Optional: whether it came from the backend's on-disk compile cache (default False). Read by
    the benchmarks' report."""


# ---------------------------------------------------------------------------------------- Dataset
class Dataset:
    """What a dataset plugin provides: (x, y) numpy arrays per split, with the shapes and the label
    kind that pick the task, the loss and the metrics.

    Subclassing is optional: the readers (`hloforge.train.tasks`, `hloforge.train.trainer`,
    `hloforge.datasets.stream`) look an attribute up with `getattr(data, name, Dataset.<name>)`, so
    a plain class gets the defaults declared here. The registry makes an instance with the options
    the user gave (`--data-opt`, `--data-dir`, `--data-file`), by its `__init__`'s parameters.
    A dataset may add the optional capabilities of `RecordSource`, `BoxSource` and `TextSource`;
    their readers test for them with `hasattr`, so the base declares none of them.
    """

    name: ClassVar[str]
    """Its registered name (`--data`). Required. Read by the registry, messages and the run's config."""

    num_classes: int
    """Classes of its labels: class ids, mask classes (background included), a detector's box
    classes, or the vocabulary of a token dataset. Required (a class attribute or set in
    `__init__`). Read by the tasks' checks against the net's `num_classes`, the producer stream's
    row layout and the segmentation metrics."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    """The split names `arrays` takes. Default ("train", "test"); the trainer reads "train" and
    "test". Read by the datasets' own split checks."""

    label_kind: ClassVar[str] = "class"
    """What its labels are: "class" (an i32 id per example), "mask" (i32 [H, W] per pixel),
    "boxes" (it has `boxes(split)`; a detector's head encodes the targets) or "tokens" (next-token
    ids [T], a language model). Default "class". Read by `SegmentationTask` (default loss
    perPixelCE, and its check) and the trainer (a language model needs "tokens")."""

    image_shape: tuple[int, ...] | None = None
    """Its images' shape [C, H, W] when it knows it (a class attribute or set in `__init__`).
    Default None. Read by `DiffusionTask.check` (the DDPM's images must be the net's output),
    `DetectionTask.check` (None: taken to be the net's input) and `DetectionLabels`."""

    pixels: Any = None
    """Optional: the per-channel affine that makes its stored pixels x the net's input, (x·scale − mean) / std
    (a `hloforge.datasets.augment.Normalize`, the one it applies). Default None (a record dataset's is
    found in its test transform). Read by `hloforge export`'s manifest, for a runtime fed raw pixels."""

    class_names: Sequence[str] | None = None
    """Optional: the name of each class id, id i the i-th (imagenette's, the classes.json `hloforge prepare`
    writes from the class folders); a head wider than the names leaves the ids past them unnamed. Default None:
    not known (none is made up). Read when a run starts, kept in its checkpoints for `hloforge export`'s
    manifest."""

    regions: ClassVar[Mapping[str, frozenset[int]] | None] = None
    """Named unions of mask classes that segmentation Dice is reported on (BraTS's WT/TC/ET).
    Default None: each foreground class alone (`hloforge.train.segmentation.default_regions`).
    Read by `SegmentationTask`."""

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The split's (x, y): x float32 net input [N, *image], y labels as `label_kind` says (for
        a record dataset, after its deterministic transform). A split it does not have is a
        `DataError` naming its splits. Required. Read by the trainer, the feed and the tasks."""
        raise NotImplementedError  # abstract


class RecordSource(Protocol):
    """A dataset that stores uint8 records and transforms them on the host (cifar10, imagenette,
    brats: `hloforge.datasets.records.RecordDataset`). Readers test `hasattr(data, "records")`
    (`hloforge.datasets.stream.split_view`, `split_labels`); without it `arrays` is the net input."""

    def records(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The split's stored rows and labels, before the transform."""
        ...

    def transform(self, split: str, augment: bool = False) -> Any:
        """The host transform from stored rows to net input (random only when `augment`)."""
        ...

    def image_file(self, path: str) -> np.ndarray:
        """Optional: the image file at `path` as this dataset stores an image of its eval split (uint8 [C, H, W]),
        which `transform(split)` then makes net input. Read by `hloforge classify` (`getattr(data, "image_file",
        None)`; without it classify refuses the run's dataset)."""
        ...


class BoxSource(Protocol):
    """A dataset with boxes (yolo, shapes). `DetectionTask.check` tests `hasattr(data, "boxes")`."""

    def boxes(self, split: str) -> list[np.ndarray]:
        """Per image, rows (class, x0, y0, x1, y1) in pixels. Read by the detection task, which
        encodes them through the net's head once per split."""
        ...

    def normalize(self, image01: np.ndarray) -> np.ndarray:
        """Optional: an image file's [3, H, W] pixels in [0, 1] as net input. Read by `hloforge detect`
        on an image file (`getattr(data, "normalize", None)`; without it only `--index` works)."""
        ...

    box_names: Sequence[str] | None
    """Optional: the box classes' names for drawn detections (default None: numbers). Read by
    `hloforge detect`."""


class TextSource(Protocol):
    """A token dataset (text; `label_kind` "tokens"). Read by the trainer's language-model path and
    `hloforge generate` (`hasattr(data, "encode")`)."""

    source: str
    """Optional: where its text came from, for the log line (default: the dataset's name)."""

    def encode(self, s: str) -> np.ndarray:
        """Token ids of a string."""
        ...

    def decode(self, ids: np.ndarray) -> str:
        """The string of token ids."""
        ...

    def bigram_bits(self, alpha: float = 0.1) -> float:
        """Optional: a character-bigram baseline in bits per character on the validation split,
        logged beside the model's (`hasattr(data, "bigram_bits")`)."""
        ...
