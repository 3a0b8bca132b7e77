"""Named nets. `get_net` also accepts a path to a TOML or JSON spec file.

Every factory in NETS takes the keyword arguments `classes` and `input` (the input shape
without the batch axis); the ImageNet nets default to 1000 classes at 3×224×224, the
`-mini` ones to 10 classes at 1×28×28 (digits).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.registry import near_name
from hloforge.core.spec import NetSpec
from hloforge.zoo import convnext, ddpm, efficientnet, mnist, mobilenet, resnet, tinygpt, unet, vit, yolo

_FIXED: set[Callable[..., NetSpec]] = set()  # the factories `_fixed` made


def _fixed(factory: Callable[[], NetSpec]) -> Callable[..., NetSpec]:
    """A net defined at one size: `classes`/`input` may only restate it."""

    def make(classes: int | None = None, input: Sequence[int] | None = None) -> NetSpec:
        spec = factory()
        if (classes is not None and classes != spec.num_classes) or \
                (input is not None and tuple(input) != spec.input_shape):
            raise UnsupportedSpec(f"net {spec.name!r} is defined for {spec.num_classes} classes on input "
                                  f"{list(spec.input_shape)} only")
        return spec

    _FIXED.add(make)
    return make


NETS: dict[str, Callable[..., NetSpec]] = {
    "mnist-linear": _fixed(mnist.mnist_linear),
    "mnist-mlp": _fixed(mnist.mnist_mlp),
    "mnist-cnn": _fixed(mnist.mnist_cnn),
    "resnet18": resnet.resnet18,
    "resnet34": resnet.resnet34,
    "resnet50": resnet.resnet50,
    "mobilenet_v2": mobilenet.mobilenet_v2,
    "mobilenet_v3_large": mobilenet.mobilenet_v3_large,
    "mobilenetv4_conv_small": mobilenet.mobilenetv4_conv_small,
    "efficientnet_b0": efficientnet.efficientnet_b0,
    "efficientnet_v2_s": efficientnet.efficientnet_v2_s,
    "convnext_tiny": convnext.convnext_tiny,
    "resnet-mini": resnet.resnet_mini,
    "resnet18-cifar": resnet.resnet18_cifar,
    "mobilenetv2-mini": mobilenet.mobilenetv2_mini,
    "mobilenetv3-mini": mobilenet.mobilenetv3_mini,
    "mobilenetv4-mini": mobilenet.mobilenetv4_mini,
    "efficientnet-mini": efficientnet.efficientnet_mini,
    "convnext-mini": convnext.convnext_mini,
    "vit_tiny": vit.vit_tiny,
    "vit-mini": vit.vit_mini,
    "vit-cifar": vit.vit_cifar,
    "tinygpt-nano": tinygpt.tinygpt_nano,
    "tinygpt-nano-flash": tinygpt.tinygpt_nano_flash,
    "tinygpt-tiny": tinygpt.tinygpt_tiny,
    "tinygpt-tiny-flash": tinygpt.tinygpt_tiny_flash,
    "unet": unet.unet,
    "unet-mini": unet.unet_mini,
    "ddpm-mini": ddpm.ddpm_mini,
    "yolov1": yolo.yolov1,
    "yolov1-mini": yolo.yolov1_mini,
    "fpn-detector": yolo.fpn_detector,
    "fpn-mini": yolo.fpn_mini,
}


SPEC_SUFFIXES = (".toml", ".json")  # what NetSpec.from_file reads


def takes_classes(name: str) -> bool:
    """Whether `get_net(name, classes)` reshapes the net's head: a zoo net not defined at one size (a spec
    file states its own classes)."""
    return name in NETS and NETS[name] not in _FIXED


def get_net(name: str, classes: int | None = None, input: Sequence[int] | None = None) -> NetSpec:
    """A named net (with `classes` / `input` overriding its defaults), or a spec file (as written: a
    `classes` / `input` it does not state is refused)."""
    if name in NETS:
        kw: dict[str, Any] = {}
        if classes is not None:
            kw["classes"] = classes
        if input is not None:
            kw["input"] = tuple(input)
        spec = NETS[name](**kw)
        spec.walk()  # refuse an impossible size here, naming the layer
        return spec
    if name.endswith(SPEC_SUFFIXES):
        if not os.path.isfile(name):
            held = "is a directory" if os.path.isdir(name) else "does not exist"
            raise UnsupportedSpec(f"spec file {name!r} {held} (from {os.getcwd()}); expected a spec file")
        spec = NetSpec.from_file(name)
        # a spec file states its own head and input: another asked for would be dropped without a word
        if classes is not None and classes != spec.num_classes:
            raise UnsupportedSpec(f"spec file {name!r} states {spec.num_classes} classes, not {classes}: --classes "
                                  "does not reshape a spec file's net; edit its num_classes (and its head)")
        if input is not None and tuple(input) != tuple(spec.input_shape):
            raise UnsupportedSpec(f"spec file {name!r} states input {list(spec.input_shape)}, not {list(input)}: "
                                  "--input does not reshape a spec file's net; edit its input_shape")
        return spec
    if os.path.isdir(name):  # a run directory, most likely: the net it trained is named in its config.toml
        raise UnsupportedSpec(f"net {name!r} is a directory; expected a zoo name or a .toml/.json spec file (a run's "
                              "net is the `net` of its config.toml)")
    if os.sep in name or os.path.splitext(name)[1]:  # a path, not a zoo name
        raise UnsupportedSpec(f"net {name!r}: a spec file must end in {' or '.join(SPEC_SUFFIXES)}, and no zoo net "
                              "is named so")
    raise UnsupportedSpec(f"unknown net {name!r}; expected one of {sorted(NETS)} or a .toml/.json spec file"
                          f"{near_name(name, NETS)}")


def net_of(net: NetSpec | str | os.PathLike[str], classes: int | None,
           input: Sequence[int] | None) -> tuple[NetSpec, str]:
    """(the net, what a config names it by: a zoo name or a spec file's path; "" for a NetSpec object)."""
    if isinstance(net, NetSpec):
        if classes is not None or input is not None:
            raise UnsupportedSpec("classes / input override a zoo net's defaults; a NetSpec states its own")
        net.walk()  # refuse an impossible net here, naming the layer
        return net, ""
    if isinstance(net, os.PathLike):  # a pathlib.Path to a spec file, as save and hf.load take their paths
        net = os.fspath(net)
    if not isinstance(net, str):
        hint = " (a spec's dict is hf.NetSpec.from_dict(d))" if isinstance(net, Mapping) else ""
        raise UnsupportedSpec(f"net must be a NetSpec, a zoo name or a spec file path, got {type(net).__name__}"
                              f"{hint}")
    if net.endswith(SPEC_SUFFIXES):  # a leading `~` is the home folder, as save's and hf.load's paths take it
        net = os.path.expanduser(net)
    spec = get_net(net, classes, input)
    return spec, (os.path.abspath(net) if net.endswith(SPEC_SUFFIXES) else net)
