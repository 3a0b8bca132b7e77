"""A net is data: NetSpec, the shape walk and initialisation (Layer, Loss: contracts; ParamSlot, Ctx: slots).

Shapes in a spec exclude the batch axis; the builder sees [B, *shape].
`ParamSlot` is the one definition the train-step signature, initialisation,
the parameter count, optimizer state and checkpoints all read.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

# the bases live with the other contracts; re-exported so `from hloforge.core.spec import Layer` keeps working
from hloforge.core.contracts import Layer as Layer
from hloforge.core.contracts import Loss as Loss
from hloforge.core.contracts import layer_fields as layer_fields
from hloforge.core.errors import PluginError, UnsupportedSpec
from hloforge.core.slots import INITS as INITS
from hloforge.core.slots import Ctx as Ctx
from hloforge.core.slots import MaskSlot as MaskSlot
from hloforge.core.slots import ParamSlot as ParamSlot
from hloforge.core.slots import Shape as Shape
from hloforge.core.slots import StatSlot as StatSlot

if TYPE_CHECKING:
    from hloforge.core.registry import Registry


def sanitize(name: str) -> str:
    """A string as an MLIR identifier: lower-case, every non-alphanumeric character replaced by _."""
    return re.sub(r"[^a-z0-9]", "_", name.lower())


@attrs.frozen
class LayerShapes:
    index: int
    layer: Layer
    in_shape: Shape
    out_shape: Shape
    slots: tuple[ParamSlot, ...]
    stats: tuple[StatSlot, ...] = ()
    masks: tuple[MaskSlot, ...] = ()


def _shape(v: Sequence[int]) -> Shape:
    return tuple(int(n) for n in v)


@attrs.frozen
class NetSpec:
    name: str
    input_shape: Shape = attrs.field(converter=_shape)
    layers: tuple[Layer, ...] = attrs.field(converter=tuple)
    num_classes: int

    @property
    def ident(self) -> str:
        return sanitize(self.name)

    # ------------------------------------------------------------- the shape walk
    def walk(self) -> list[LayerShapes]:
        """Every layer's in/out shapes and slots; refuses anything a plugin cannot render faithfully."""
        if not self.layers:
            raise UnsupportedSpec(f"net {self.name!r} has no layers")
        out = walk_layers(self.layers, self.input_shape)
        last = out[-1].out_shape
        # [classes], per-token logits [T, classes] (a language model), or a map [classes, H, W]
        # (per-pixel logits, a DDPM's predicted noise)
        nc = self.num_classes
        # A detection head (yolov1Head, fpnDetect) lays its output out itself and says its class count.
        head = out[-1].layer.head_classes
        if head is not None:
            if head != nc:
                raise UnsupportedSpec(f"net {self.name!r} ends in a {out[-1].layer.kind} head for {head} classes, "
                                      f"but num_classes is {nc}")
            return out
        if not (last == (nc,) or (len(last) == 2 and last[1] == nc) or (len(last) == 3 and last[0] == nc)):
            raise UnsupportedSpec(f"net {self.name!r} ends in shape {list(out[-1].out_shape)}, "
                                  f"expected [{self.num_classes}] (num_classes), [T, {self.num_classes}] "
                                  f"or [{self.num_classes}, H, W]")
        return out

    def params(self) -> list[tuple[str, ParamSlot]]:
        return qualified_params(self.walk())

    def stats(self) -> list[tuple[str, StatSlot]]:
        return qualified_stats(self.walk())

    def param_count(self) -> int:
        return sum(s.size for _, s in self.params())

    def init_params(self, seed: int) -> list[np.ndarray]:
        """Deterministic per seed and per slot position, so adding a layer moves no other layer's init."""
        return [s.initial(np.random.default_rng([seed, i])) for i, (_, s) in enumerate(self.params())]

    # ------------------------------------------------------------- dict / TOML / JSON
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "layers": [layer.to_dict() for layer in self.layers]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], registry: Registry | None = None, source: str = "spec") -> NetSpec:
        from hloforge.core.registry import default_registry

        reg = registry or default_registry()
        missing = {"name", "input_shape", "num_classes", "layers"} - set(d)
        if missing:
            raise UnsupportedSpec(f"{source}: missing key(s) {sorted(missing)}; expected name, input_shape, "
                                  "num_classes, layers")
        layers = []
        for i, ld in enumerate(d["layers"]):
            ld = dict(ld)
            kind = ld.pop("kind", None)
            if kind is None:
                raise UnsupportedSpec(f"{source}: layer {i} has no 'kind'")
            try:
                reg.entry("layer", kind)
            except PluginError as e:
                raise PluginError(f"{source}: layer {i}: {e}") from None
            opts = {k: tuple(v) if isinstance(v, list) else v for k, v in ld.items()}
            try:
                layers.append(reg.make("layer", kind, **opts))
            except UnsupportedSpec as e:
                raise UnsupportedSpec(f"{source}: layer {i}: {e}") from None
        return cls(str(d["name"]), d["input_shape"], layers, int(d["num_classes"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_toml(self) -> str:
        lines = [f"name = {json.dumps(self.name)}", f"input_shape = {list(self.input_shape)}",
                 f"num_classes = {self.num_classes}"]
        for i, layer in enumerate(self.layers):
            lines.append("\n[[layers]]")
            defaults = {f.name: f.default for f in layer_fields(layer)}
            for k, v in layer.to_dict().items():
                if v is None:  # TOML has no null: omit it, which reads back as the field's default
                    if k not in defaults or defaults[k] is not None:
                        raise UnsupportedSpec(f"layer {i} ({layer.kind}): option {k}=None has no TOML form "
                                              "(its default is not None)")
                    continue
                lines.append(f"{k} = {_toml_value(v)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_file(cls, path: str, registry: Registry | None = None) -> NetSpec:
        text = open(path, encoding="utf-8").read()
        try:
            d = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise UnsupportedSpec(f"{path}: not a valid spec file: {e}") from None
        return cls.from_dict(d, registry, source=path)


def walk_layers(layers: Sequence[Layer], in_shape: Shape) -> list[LayerShapes]:
    out: list[LayerShapes] = []
    shape = tuple(in_shape)
    skips: list[tuple[int, Shape]] = []  # (pushing layer, skip shape), the stack the forward will keep
    for i, layer in enumerate(layers):
        try:
            nxt = layer.out_shape(shape)
            slots = layer.param_slots(shape)
            stats = layer.stat_slots(shape)
            masks = layer.mask_slots(shape)
            want, push = layer.skip_in(shape), layer.skip_out(shape)
            if want is not None:
                if not skips:
                    raise UnsupportedSpec(f"takes a skip {list(want)} but no earlier layer left one")
                j, got = skips.pop()
                if got != want:
                    raise UnsupportedSpec(f"takes a skip {list(want)} but the one layer {j} left is {list(got)}")
        except UnsupportedSpec as e:
            raise UnsupportedSpec(f"layer {i} ({_brief(layer)}) on input {list(shape)}: {e}") from None
        if push is not None:
            skips.append((i, push))
        names = [s.name for s in slots]
        if len(set(names)) != len(names):
            raise UnsupportedSpec(f"layer {i} ({_brief(layer)}) declares a parameter name twice: {names}")
        out.append(LayerShapes(i, layer, shape, nxt, slots, stats, masks))
        shape = nxt
    if skips:
        j, got = skips[-1]
        raise UnsupportedSpec(f"layer {j} ({_brief(layers[j])}) leaves a skip {list(got)} that no later layer "
                              "takes")
    return out


def qualified_params(walk: Sequence[LayerShapes]) -> list[tuple[str, ParamSlot]]:
    """(qualified name, slot) in train-step order: layer by layer, slot by slot."""
    return [(f"{ls.index}.{s.name}", s) for ls in walk for s in ls.slots]


def qualified_masks(walk: Sequence[LayerShapes]) -> list[tuple[str, MaskSlot]]:
    """(qualified name, mask slot) in the order the train step takes them, after the labels."""
    return [(f"{ls.index}.{s.name}", s) for ls in walk for s in ls.masks]


def qualified_stats(walk: Sequence[LayerShapes]) -> list[tuple[str, StatSlot]]:
    """(qualified name, stat slot) in the order the train step returns and the eval module takes them."""
    return [(f"{ls.index}.{s.name}", s) for ls in walk for s in ls.stats]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def _brief(layer: Layer) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in layer.to_dict().items() if k != "kind")
    return f"{layer.kind}({fields})"
