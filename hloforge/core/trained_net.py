"""The net a Variant trains: its flags that change the user's net (`--dropout`, `--drop-path`, `--bn-eps`) applied.

Classifier dropout goes before the net's classifier, wherever the layers after it are; drop_path and bn_eps set
the option on every layer that has it. A flag sets the value of every layer it reaches: one the spec set itself
(not its layer's default) is replaced, with a warning naming it, so a flag never rewrites a spec's choice unsaid.
`Variant.apply_to` is the entry; the eval forward is rendered from this same net, so it normalises at the same ε.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hloforge.core.errors import HloforgeWarning, UnsupportedSpec
from hloforge.core.spec import NetSpec, layer_fields, walk_layers

if TYPE_CHECKING:
    from hloforge.core.registry import Registry


def trained_net(spec: NetSpec, dropout: float, drop_path: float, bn_eps: float | None,
                registry: Registry | None = None) -> NetSpec:
    """`spec` as a variant with these fields trains it (the module docstring). Idempotent."""
    layers = list(spec.layers)
    if bn_eps is not None:
        bn = [ls.index for ls in walk_layers(layers, spec.input_shape) if ls.stats]
        if not bn:
            raise UnsupportedSpec(f"bn_eps {bn_eps:g}: net {spec.name!r} has no BatchNorm")
        for i in bn:
            if not _has(layers[i], "eps"):
                raise UnsupportedSpec(f"bn_eps: layer {i} ({layers[i].kind}) has BatchNorm statistics but no "
                                      "eps option")
        _set_option(spec.name, layers, bn, "bn_eps", "eps", bn_eps)
    if drop_path:
        hit = [i for i, layer in enumerate(layers) if _has(layer, "drop_path")]
        if not hit:
            raise UnsupportedSpec(f"drop_path {drop_path:g}: net {spec.name!r} has no layer with a "
                                  "drop_path option")
        _set_option(spec.name, layers, hit, "drop_path", "drop_path", drop_path)
    if dropout:
        from hloforge.core.registry import default_registry

        drop = (registry or default_registry()).make("layer", "dropout", rate=dropout)
        head = classifier_index(spec.name, layers, spec.input_shape, f"dropout {dropout:g}")
        if head and layers[head - 1].kind == drop.kind:  # the spec's own dropout there: the flag sets its rate
            _set_option(spec.name, layers, [head - 1], "dropout", "rate", dropout)
        else:
            layers.insert(head, drop)
    if layers == list(spec.layers):
        return spec
    new: Any = layers  # (attrs' tuple converter confuses mypy about the element type)
    return NetSpec(spec.name, spec.input_shape, new, spec.num_classes)


def classifier_index(name: str, layers: Sequence[Any], input_shape: Sequence[int], what: str) -> int:
    """The net's classifier, where classifier dropout goes: its last layer with a weight (a slot under weight
    decay: a kernel, not a bias or a norm's scale), as timm's drop_rate sits before its head. The layers after it
    (pooling, flatten, an activation, a norm) hold no weight, and dropout there would drop logits. A last weighted
    layer with several weights is a block with its own head inside (a detector's FPN, a residual stage): there
    is no one place, and `what` is refused."""
    weighted = [(ls.index, sum(s.decay for s in ls.slots)) for ls in walk_layers(layers, tuple(input_shape))]
    weighted = [(i, n) for i, n in weighted if n]
    if weighted and weighted[-1][1] == 1:
        return weighted[-1][0]
    last = (f"its last layer with weights, layer {weighted[-1][0]} ({layers[weighted[-1][0]].kind}), is a block of "
            f"{weighted[-1][1]}" if weighted else "it has no layer with weights")
    raise UnsupportedSpec(f"{what}: net {name!r} has no one classifier layer to put it before ({last}); put "
                          "Dropout layers in the spec where they belong")


def _has(layer: Any, option: str) -> bool:
    return any(f.name == option for f in layer_fields(layer))


def _set_option(net: str, layers: list[Any], at: Sequence[int], flag: str, option: str, value: float) -> None:
    """`layers[i].option = value` at each i of `at`; a value the spec set itself (neither its layer's default nor
    `value`) is replaced with one warning naming the layers."""
    own = [(i, getattr(layers[i], option)) for i in at
           if getattr(layers[i], option) not in (value, attrs.fields_dict(type(layers[i]))[option].default)]
    if own:
        said = ", ".join(f"layer {i} ({layers[i].kind}) {option} {v:g}" for i, v in own)
        warnings.warn(HloforgeWarning(f"{flag} {value:g} replaces what net {net!r} sets itself: {said}"),
                      stacklevel=4)
    for i in at:
        layers[i] = attrs.evolve(layers[i], **{option: value})
