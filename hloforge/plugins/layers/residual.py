"""ResNet stages (torchvision ResNet v1.5): residualStage (basic blocks) and bottleneckStage.

A stage is n blocks; the first takes the stage's stride and, when its stride or channels
change, a 1×1 projection convBn on the skip. Every conv is a convBn (norm.py).
"""

from __future__ import annotations

import attrs

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Layer, Shape
from hloforge.plugins.layers.compose import Block, BlockLayer, Part, stage_blocks
from hloforge.plugins.layers.norm import BN_EPS, ConvBn


def shortcut(ic: int, oc: int, stride: int, project: bool, eps: float) -> tuple[Part, ...]:
    """The skip of a residual block: identity when nothing changes, else a 1×1 projection convBn
    (`project=False` keeps it an identity, which the block's skip check then refuses)."""
    if project and (stride != 1 or ic != oc):
        return (Part("down.", ConvBn(oc, k=1, stride=stride, act="identity", eps=eps)),)
    return ()


@attrs.frozen
class ResidualStage(BlockLayer):
    """n basic blocks: 3×3 convBn relu → 3×3 convBn, + skip, relu. The first block strides."""

    kind = "residualStage"
    out: int
    n: int = 2
    stride: int = 1
    project: bool = True
    eps: float = BN_EPS
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        def make(i: int, ic: int) -> Block:
            s = self.stride if i == 0 else 1
            main = (Part("conv1.", ConvBn(self.out, k=3, stride=s, act="relu", eps=self.eps)),
                    Part("conv2.", ConvBn(self.out, k=3, act="identity", eps=self.eps)))
            return Block(main, shortcut(ic, self.out, s, self.project, self.eps), "relu", self.drop_path)

        return stage_blocks(self.n, make, in_shape, self.out)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(4, n=1), (4, 4, 4)), (cls(4, n=2, stride=2), (2, 4, 4)), (cls(4, n=2, drop_path=0.5), (4, 4, 4)),
                (cls(4, n=1, stride=2), (2, 5, 5))]  # 5 → 3 on both paths


@attrs.frozen
class BottleneckStage(BlockLayer):
    """n bottleneck blocks: 1×1 (mid = out/expansion) → 3×3 with the stride (v1.5) → 1×1 to out,
    + skip, relu."""

    kind = "bottleneckStage"
    out: int
    n: int = 3
    stride: int = 1
    expansion: int = 4
    project: bool = True
    eps: float = BN_EPS
    drop_path: float = 0.0  # stochastic depth on each block that has a skip

    def blocks(self, in_shape: Shape) -> list[tuple[str, Block]]:
        if self.expansion <= 0 or self.out % self.expansion:
            raise UnsupportedSpec(f"expansion {self.expansion} must divide out channels {self.out}")
        mid = self.out // self.expansion

        def make(i: int, ic: int) -> Block:
            s = self.stride if i == 0 else 1
            main = (Part("conv1.", ConvBn(mid, k=1, act="relu", eps=self.eps)),
                    Part("conv2.", ConvBn(mid, k=3, stride=s, act="relu", eps=self.eps)),
                    Part("conv3.", ConvBn(self.out, k=1, act="identity", eps=self.eps)))
            return Block(main, shortcut(ic, self.out, s, self.project, self.eps), "relu", self.drop_path)

        return stage_blocks(self.n, make, in_shape, self.out)

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(8, n=2, stride=2), (4, 4, 4))]


@hookimpl
def hloforge_layers() -> list[type]:
    return [ResidualStage, BottleneckStage]
