"""Named nets. `get_net` also accepts a path to a TOML or JSON spec file."""

from __future__ import annotations

import os
from collections.abc import Callable

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.zoo import mnist

NETS: dict[str, Callable[[], NetSpec]] = {
    "mnist-linear": mnist.mnist_linear,
    "mnist-mlp": mnist.mnist_mlp,
    "mnist-cnn": mnist.mnist_cnn,
}


def get_net(name: str) -> NetSpec:
    if name in NETS:
        return NETS[name]()
    if name.endswith((".toml", ".json")) and os.path.exists(name):
        return NetSpec.from_file(name)
    raise UnsupportedSpec(f"unknown net {name!r}; expected one of {sorted(NETS)} or a .toml/.json spec file")
