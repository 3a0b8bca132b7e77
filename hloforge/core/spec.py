"""A net is data: NetSpec, the shape walk and initialisation (Layer, Loss: contracts; ParamSlot, Ctx: slots).

Shapes in a spec exclude the batch axis; the builder sees [B, *shape].
`ParamSlot` is the one definition the train-step signature, initialisation,
the parameter count, optimizer state and checkpoints all read.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import re
import reprlib
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

# the bases live with the other contracts; re-exported so `from hloforge.core.spec import Layer` keeps working
from hloforge.core.contracts import Layer as Layer
from hloforge.core.contracts import Loss as Loss
from hloforge.core.contracts import layer_fields as layer_fields
from hloforge.core.errors import PluginError, UnsupportedSpec, unreadable_text
from hloforge.core.registry import component_label
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


# The largest element count of one tensor (per example) a spec may ask for: 2**40 float32s are 4 TiB,
# beyond any device, and far below where shape arithmetic would overflow int64.
MAX_ELEMENTS = 2**40
SPEC_KEYS = ("name", "input_shape", "num_classes", "layers")
# The most times a layer may repeat a block (a stage's n, a detector's tower): far above any real net
# (ResNet-152's longest stage has 36), far below where the walk over the blocks would hang.
MAX_REPEAT = 1000


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _shape(v: Sequence[int]) -> Shape:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence | np.ndarray) or not all(_is_int(n) for n in v):
        raise UnsupportedSpec(f"input_shape must be a list of positive integers, got {v!r}")
    return tuple(int(n) for n in v)


def _layers(v: Any) -> tuple[Layer, ...]:
    if isinstance(v, Layer):  # NetSpec(name, shape, Dense(10), 10): tuple() of it was Python's TypeError
        cls = type(v).__name__
        raise UnsupportedSpec(f"layers must be a list of layers, got one {cls} layer, not a list; "
                              f"wrap it: [{cls}(...)]")
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable):
        raise UnsupportedSpec(f"layers must be a list of layers, got {_SHORT.repr(v)} (type {type(v).__name__})")
    return tuple(v)


def check_shape(what: str, shape: Shape) -> None:
    """Refuse a shape with a dimension that is no integer or is below 1, or more elements than any device holds."""
    odd = [n for n in shape if not _is_int(n)]
    if odd:  # a float (in_shape[0] / 2) is no size at all, however positive
        raise UnsupportedSpec(f"{what} {list(shape)} has a dimension that is not an integer: {odd[0]!r} (type "
                              f"{type(odd[0]).__name__}); every dimension must be a positive int")
    if not all(n >= 1 for n in shape):
        raise UnsupportedSpec(f"{what} {list(shape)} has a dimension below 1; every dimension must be positive")
    if math.prod(shape) > MAX_ELEMENTS:
        raise UnsupportedSpec(f"{what} {list(shape)} has {math.prod(shape):,} elements, more than the "
                              f"{MAX_ELEMENTS:,} a spec may ask of one tensor")


def _physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the C library does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None


_HINTS: dict[type, dict[str, Any]] = {}


def conforms(v: Any, tp: Any) -> bool:
    """Whether a value has its field's declared type (int, float, str, bool, None, unions and tuples
    of those); a type this does not know (a plugin's own class) is left to the layer's own checks."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return v is None
    if tp is bool:
        return isinstance(v, (bool, np.bool_))
    if tp is int:
        return _is_int(v)
    if tp is float:  # an int is a float option's value too (TOML writes eps = 1); NaN and ±inf are not
        return (_is_int(v) or isinstance(v, (float, np.floating))) and math.isfinite(v)
    if tp is str:
        return isinstance(v, str)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(v, a) for a in args)
    if origin is tuple:
        if not isinstance(v, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(x, args[0]) for x in v)
        return len(v) == len(args) and all(conforms(x, a) for x, a in zip(v, args, strict=True))
    return True


def check_options(layer: Layer) -> None:
    """Refuse a layer whose options are not of their declared types (a string for a size, a float for a
    count, a NaN for an epsilon): the layer's own shape rules assume them."""
    cls = type(layer)
    if cls not in _HINTS:
        try:
            _HINTS[cls] = typing.get_type_hints(cls)
        except (NameError, TypeError):  # annotations that do not resolve: the layer checks its own
            _HINTS[cls] = {}
    for f in layer_fields(layer):
        v = getattr(layer, f.name)
        if f.name in _HINTS[cls] and not conforms(v, _HINTS[cls][f.name]):
            want = str(_HINTS[cls][f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "")
            raise UnsupportedSpec(f"option {f.name}={v!r} is not of its type {want}")


@attrs.frozen
class NetSpec:
    """A net as data: `name` (its modules', artifacts' and run directory's), `input_shape` (one example's, no batch
    axis), `layers` (layer instances in order, `hf.layers.Dense(64, act="relu")`, ...) and `num_classes`. Frozen and
    hashable; `to_dict` / `to_json` / `to_toml` and `from_dict` / `from_json` / `from_toml` / `from_file` round-trip
    it; `walk()` checks every layer's shapes, refusing what a plugin cannot render with the layer named."""

    name: str
    input_shape: Shape = attrs.field(converter=_shape)
    layers: tuple[Layer, ...] = attrs.field(converter=_layers)
    num_classes: int

    @property
    def ident(self) -> str:
        return sanitize(self.name)

    # ------------------------------------------------------------- the shape walk
    def walk(self) -> list[LayerShapes]:
        """Every layer's in/out shapes and slots; refuses anything a plugin cannot render faithfully.
        Walked once per spec (a NetSpec and its layers are frozen); each call gets a list of its own."""
        return list(self._walked)

    @property
    def out_shape(self) -> Shape:
        """The net's output per example (the last layer's out shape)."""
        return self._walked[-1].out_shape

    @functools.cached_property
    def _walked(self) -> tuple[LayerShapes, ...]:
        if not isinstance(self.name, str) or not self.name:
            raise UnsupportedSpec(f"net name must be a non-empty string, got {self.name!r}")
        if not self.layers:
            raise UnsupportedSpec(f"net {self.name!r} has no layers")
        if not _is_int(self.num_classes) or self.num_classes < 1:
            raise UnsupportedSpec(f"net {self.name!r}: num_classes must be a positive integer, got "
                                  f"{self.num_classes!r}")
        if not all(isinstance(layer, Layer) for layer in self.layers):
            raise UnsupportedSpec(f"net {self.name!r}: layers must be Layer instances, got "
                                  f"{[type(layer).__name__ for layer in self.layers]}")
        if not self.input_shape:
            raise UnsupportedSpec(f"net {self.name!r}: input_shape is empty; expected a list of positive integers")
        check_shape(f"net {self.name!r}: input_shape", self.input_shape)
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
            return tuple(out)
        if not (last == (nc,) or (len(last) == 2 and last[1] == nc) or (len(last) == 3 and last[0] == nc)):
            raise UnsupportedSpec(f"net {self.name!r} ends in shape {list(out[-1].out_shape)}, "
                                  f"expected [{self.num_classes}] (num_classes), [T, {self.num_classes}] "
                                  f"or [{self.num_classes}, H, W]")
        return tuple(out)

    def params(self) -> list[tuple[str, ParamSlot]]:
        return qualified_params(self.walk())

    def stats(self) -> list[tuple[str, StatSlot]]:
        return qualified_stats(self.walk())

    def param_count(self) -> int:
        return sum(s.size for _, s in self.params())

    def init_params(self, seed: int) -> list[np.ndarray]:
        """Deterministic per seed and per slot position, so adding a layer moves no other layer's init. θ of
        more float32 bytes than this machine has memory is refused (numpy's MemoryError, or, under the
        address space, the kernel ending the process as the draw touches its pages)."""
        slots = self.params()
        need, have = 4 * sum(s.size for _, s in slots), _physical_memory()
        if have is not None and need > have:
            raise UnsupportedSpec(f"net {self.name!r} has {need // 4:,} parameters, {need / 2**30:,.1f} GiB of "
                                  f"float32, more than this machine's {have / 2**30:,.1f} GiB of memory")
        return [s.initial(np.random.default_rng([seed, i])) for i, (_, s) in enumerate(slots)]

    # ------------------------------------------------------------- dict / TOML / JSON
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "layers": [layer.to_dict() for layer in self.layers]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], registry: Registry | None = None, source: str = "spec") -> NetSpec:
        from hloforge.core.registry import default_registry

        reg = registry or default_registry()
        if not isinstance(d, Mapping):
            raise UnsupportedSpec(f"{source}: a spec is a table of {', '.join(SPEC_KEYS)}; got {type(d).__name__}")
        missing = set(SPEC_KEYS) - set(d)
        if missing:
            raise UnsupportedSpec(f"{source}: missing key(s) {sorted(missing)}; expected name, input_shape, "
                                  f"num_classes, layers{_where_missing(d, missing)}")
        unknown = sorted(str(k) for k in set(d) - set(SPEC_KEYS))
        if unknown:
            raise UnsupportedSpec(f"{source}: unknown key(s) {unknown}; a spec has only {', '.join(SPEC_KEYS)}")
        name, shape, nc, lds = (d[k] for k in SPEC_KEYS)
        if not isinstance(name, str) or not name:
            raise UnsupportedSpec(f"{source}: name must be a non-empty string, got {name!r}")
        if not isinstance(nc, int) or isinstance(nc, bool) or nc < 1:
            raise UnsupportedSpec(f"{source}: num_classes must be a positive integer, got {nc!r}")
        if not isinstance(shape, list | tuple) or not shape or not all(_is_int(n) and n >= 1 for n in shape):
            raise UnsupportedSpec(f"{source}: input_shape must be a list of positive integers, got {shape!r}")
        if isinstance(lds, Mapping):  # TOML's [layers], one bracket short of [[layers]]
            raise UnsupportedSpec(f"{source}: layers must be a list of tables (each with a 'kind'), got one table "
                                  f"{lds!r}; in TOML each layer goes under its own [[layers]] header (two brackets), "
                                  "in JSON into a list: [{...}, ...]")
        if not isinstance(lds, list | tuple) or not all(isinstance(ld, Mapping) for ld in lds):
            raise UnsupportedSpec(f"{source}: layers must be a list of tables (each with a 'kind'), got {lds!r}")
        layers = []
        for i, ld in enumerate(lds):
            ld = dict(ld)
            kind = ld.pop("kind", None)
            if kind is None:
                raise UnsupportedSpec(f"{source}: layer {i} has no 'kind'")
            if not isinstance(kind, str):
                raise UnsupportedSpec(f"{source}: layer {i}: kind must be a layer name (a string), got {kind!r}")
            try:
                reg.entry("layer", kind)
            except PluginError as e:
                raise PluginError(f"{source}: layer {i}: {e}") from None
            opts = {str(k): _tuples(v) for k, v in ld.items()}
            try:
                layer = reg.make("layer", kind, **opts)
                check_options(layer)
            except UnsupportedSpec as e:
                raise UnsupportedSpec(f"{source}: layer {i}: {e}") from None
            layers.append(layer)
        return cls(name, shape, layers, nc)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_toml(self) -> str:
        lines = [f"name = {toml_string(self.name)}", f"input_shape = {list(self.input_shape)}",
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
    def from_json(cls, text: str, registry: Registry | None = None, source: str = "JSON spec text") -> NetSpec:
        """The net of JSON spec text (`to_json`'s); a malformed one is one line naming `source`."""
        return cls._from_text(text, "JSON", registry, source)

    @classmethod
    def from_toml(cls, text: str, registry: Registry | None = None, source: str = "TOML spec text") -> NetSpec:
        """The net of TOML spec text (`to_toml`'s); a malformed one is one line naming `source`."""
        return cls._from_text(text, "TOML", registry, source)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], registry: Registry | None = None) -> NetSpec:
        """The net of a .json spec file, else a TOML one."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UnsupportedSpec(f"{path}: cannot read it as a UTF-8 spec file ({unreadable_text(e)})") from None
        return cls._from_text(text, "JSON" if path.endswith(".json") else "TOML", registry, path, "spec file")

    @classmethod
    def _from_text(cls, text: str, syntax: str, registry: Registry | None, source: str,
                   what: str = "spec") -> NetSpec:
        try:  # JSON's NaN and Infinity are no spec's values, nor a key said twice: refused like any other non-JSON
            d = (json.loads(text, parse_constant=_no_constant, object_pairs_hook=_once_each)
                 if syntax == "JSON" else tomllib.loads(text))
        except (ValueError, RecursionError) as e:
            raise UnsupportedSpec(f"{source}: not a valid {what}: {_one_line(e)}") from None
        spec = cls.from_dict(d, registry, source=source)
        try:  # a text's net is walked here, so what it cannot render is refused naming its source
            spec.walk()
        except UnsupportedSpec as e:
            raise UnsupportedSpec(f"{source}: {e}") from None
        return spec


def _where_missing(d: Mapping[str, Any], missing: set[str]) -> str:
    """Where a spec's missing top-level keys likely are, as a phrase to end its refusal with ("" when not seen)."""
    if missing == set(SPEC_KEYS) and isinstance(d.get("net"), str):  # `net = ...`: train's options, not a net
        return (f"; it is train's options (a config.toml, of net {d['net']!r}), not a net: give the net itself, or "
                "the file as train's --config")
    lds = d.get("layers")
    last = lds[-1] if isinstance(lds, list) and lds and isinstance(lds[-1], Mapping) else {}
    held = [k for k in SPEC_KEYS if k in missing and k in last]
    if held:  # name = ... written below a [[layers]] header is an option of that layer, not the spec's
        return (f"; the last [[layers]] table holds {held}: TOML puts every key after a [[layers]] header into "
                "that layer, so write them above the first [[layers]]")
    near = [f"{m[0]!r} (not {u!r})" for u in sorted(str(k) for k in set(d) - set(SPEC_KEYS))
            if (m := difflib.get_close_matches(u, sorted(missing), n=1))]
    return f"; did you mean {', '.join(near)}?" if near else ""


def walk_layers(layers: Sequence[Layer], in_shape: Shape) -> list[LayerShapes]:
    out: list[LayerShapes] = []
    shape = tuple(in_shape)
    skips: list[tuple[int, Shape]] = []  # (pushing layer, skip shape), the stack the forward will keep
    for i, layer in enumerate(layers):
        try:
            check_options(layer)
            nxt = _returned_shape(layer, i, layer.out_shape(shape))
            check_shape("output shape", nxt)
            slots = _returned_slots(layer, i, "param_slots", layer.param_slots(shape), ParamSlot)
            for s in slots:
                check_shape(f"parameter {s.name}", s.shape)
            stats = _returned_slots(layer, i, "stat_slots", layer.stat_slots(shape), StatSlot)
            masks = _returned_slots(layer, i, "mask_slots", layer.mask_slots(shape), MaskSlot)
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


# What a layer's shape methods return is the plugin's own doing: a value of another type is refused naming the
# layer (a PluginError), not left to fail in the walk's own code as hloforge's bug.
def _returned_shape(layer: Layer, i: int, got: Any) -> Shape:
    if isinstance(got, (str, bytes)) or not isinstance(got, Sequence | np.ndarray):
        raise PluginError(f"{component_label('layer', layer)}: layer {i}'s out_shape returned {_returned(got)}; "
                          "expected its output shape, a tuple of positive ints without the batch axis")
    return tuple(got)


def _returned_slots(layer: Layer, i: int, method: str, got: Any, cls: type) -> Any:
    if not isinstance(got, (list, tuple)) or not all(isinstance(s, cls) for s in got):
        one = f" (one slot is `return ({cls.__name__}(...),)`)" if isinstance(got, cls) else ""
        raise PluginError(f"{component_label('layer', layer)}: layer {i}'s {method} returned {_returned(got)}; "
                          f"expected a tuple of {cls.__module__}.{cls.__name__}{one}")
    return got


_SHORT = reprlib.Repr()
_SHORT.maxother = _SHORT.maxstring = 80


def _returned(v: Any) -> str:
    """A returned value for a message: short, with its type (and its items' types where it holds others)."""
    items = sorted({type(x).__name__ for x in v}) if isinstance(v, (list, tuple)) else []
    held = f" holding {', '.join(items)}" if items else ""
    return f"{_SHORT.repr(v)} (type {type(v).__name__}{held})"


def qualified_params(walk: Sequence[LayerShapes]) -> list[tuple[str, ParamSlot]]:
    """(qualified name, slot) in train-step order: layer by layer, slot by slot."""
    return [(f"{ls.index}.{s.name}", s) for ls in walk for s in ls.slots]


def qualified_masks(walk: Sequence[LayerShapes]) -> list[tuple[str, MaskSlot]]:
    """(qualified name, mask slot) in the order the train step takes them, after the labels."""
    return [(f"{ls.index}.{s.name}", s) for ls in walk for s in ls.masks]


def qualified_stats(walk: Sequence[LayerShapes]) -> list[tuple[str, StatSlot]]:
    """(qualified name, stat slot) in the order the train step returns and the eval module takes them."""
    return [(f"{ls.index}.{s.name}", s) for ls in walk for s in ls.stats]


def _tuples(v: Any) -> Any:
    """A dict's lists as tuples, nested ones too (options are hashable values)."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a spec may hold")


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each said once: json keeps a repeated key's last value without a word,
    so `"k": 3, "k": 5` would be a net of k=5 (TOML refuses the same repeat itself)."""
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"key {k!r} is given twice in one object ({d[k]!r}, then {v!r}); say it once")
        d[k] = v
    return d


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return toml_string(v)
    return repr(v)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
                 "\r": "\\r"}


def toml_string(s: str) -> str:
    """A TOML basic string: quote and backslash escaped, control characters (and DEL) as escapes.
    A lone surrogate (an undecodable file name) is no Unicode scalar value, so no TOML can hold it."""
    out = []
    for ch in s:
        o = ord(ch)
        if 0xD800 <= o <= 0xDFFF:
            raise UnsupportedSpec(f"string {s!r} holds a lone surrogate; it cannot be written as TOML")
        out.append(_TOML_ESCAPES.get(ch) or (f"\\u{o:04x}" if o < 0x20 or o == 0x7F else ch))
    return '"' + "".join(out) + '"'


def _brief(layer: Layer) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in layer.to_dict().items() if k != "kind")
    return f"{layer.kind}({fields})"


def summary_table(spec: NetSpec, frozen: Iterable[int] = ()) -> str:
    """A net's layers as a table (index, kind, input → output shape, parameters) and its totals; `frozen`: the
    positions in `spec.params()` a variant freezes, counted apart from the trainable ones."""
    walk = spec.walk()
    rows = [(str(w.index), w.layer.kind, f"{list(w.in_shape)} → {list(w.out_shape)}",
             f"{sum(s.size for s in w.slots):,}") for w in walk]
    head = ("#", "kind", "input → output", "params")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]

    def line(r: Sequence[str]) -> str:
        return "  ".join([r[0].rjust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]), r[3].rjust(widths[3])])

    rule = "-" * len(line(head))
    total = spec.param_count()
    held = set(frozen)
    fixed = sum(s.size for i, (_, s) in enumerate(spec.params()) if i in held)
    trained = f"{total - fixed:,} trainable, {fixed:,} frozen" if fixed else "trainable"
    stats = sum(math.prod(s.shape) for _, s in spec.stats())
    foot = [f"{spec.name}: {len(walk)} layers, {total:,} parameters ({trained}), "
            f"{stats:,} running statistics, input {list(spec.input_shape)}"]
    return "\n".join([line(head), rule, *map(line, rows), rule, *foot])
