"""The MNIST-sized nets (28×28×1 → 10)."""

from __future__ import annotations

from hloforge.core.spec import NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.dense import Dense, Flatten
from hloforge.plugins.layers.pool import MaxPool


def mnist_linear() -> NetSpec:
    return NetSpec("mnist-linear", (784,), [Dense(10)], 10)


def mnist_mlp() -> NetSpec:
    return NetSpec("mnist-mlp", (784,), [Dense(512, act="relu"), Dense(512, act="relu"), Dense(10)], 10)


def mnist_cnn() -> NetSpec:
    return NetSpec("mnist-cnn", (1, 28, 28), [
        Conv2d(32, act="relu"), Conv2d(32, act="relu"), MaxPool(2),
        Conv2d(64, act="relu"), Conv2d(64, act="relu"), MaxPool(2),
        Flatten(), Dense(512, act="relu"), Dense(10),
    ], 10)
