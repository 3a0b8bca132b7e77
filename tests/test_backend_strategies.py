"""Backends own their lowering choices: a backend class declares `strategy_defaults`, the render
targets are the registered backends that do, and the strategy kinds come from the layer plugins'
`hloforge_strategy_kinds` hook (core/strategy.py). A third party's backend gets its own choices."""

from __future__ import annotations

import types

import pytest

from hloforge.backends.xla.backend import XlaBackend
from hloforge.core import strategy
from hloforge.core.hookspecs import hookimpl
from hloforge.core.modules import vjp_module
from hloforge.core.registry import Registry
from hloforge.plugins.layers.conv import Conv2d

# a stride-1 conv on a big enough image: XLA's chunked ∂w and IREE's written one differ
LAYERS, SHAPE = [Conv2d(4, k=3, act="relu")], (3, 6, 6)


class ToyBackend(XlaBackend):
    """The XLA backend under another name, choosing the written conv backward where XLA chunks."""

    name = "toy"
    strategy_defaults = {**XlaBackend.strategy_defaults, "convGrad": "written"}


class Portable(XlaBackend):
    """A backend that declares no choices: every module it gets is in the portable form."""

    name = "portable-toy"
    strategy_defaults = None


def _plugin(name: str, *backends: type, kinds: tuple[strategy.StrategyKind, ...] = ()) -> types.ModuleType:
    mod = types.ModuleType(name)

    @hookimpl
    def hloforge_backends() -> list[type]:
        return list(backends)

    mod.hloforge_backends = hloforge_backends  # type: ignore[attr-defined]
    if kinds:
        @hookimpl
        def hloforge_strategy_kinds() -> list[strategy.StrategyKind]:
            return list(kinds)

        mod.hloforge_strategy_kinds = hloforge_strategy_kinds  # type: ignore[attr-defined]
    return mod


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(strategy.ENV_VAR, raising=False)


def test_the_builtin_targets_come_from_the_backends() -> None:
    assert {"xla", "iree"} <= set(strategy.targets())
    assert strategy.targets()["xla"] == XlaBackend.strategy_defaults
    assert {"conv2d", "convGrad", "bnReduce", "maxPool", "sdpaGrad", "layout", "sums"} <= set(strategy.kinds())


def test_a_toy_backend_declares_its_own_choice_and_gets_it() -> None:
    reg = Registry(extra_plugins=((_plugin("toy_backend", ToyBackend, Portable), "toy-dist"),))
    assert not [b for b in reg.broken if b.distribution == "toy-dist"]
    with strategy.using(reg):
        assert strategy.chosen("convGrad", "toy") == "written"
        assert strategy.chosen("convGrad", "xla") == "winograd" and strategy.chosen("layout", "toy") == "nhwc"
        assert strategy.target_of(ToyBackend()) == "toy"
        assert strategy.target_of(Portable()) is None
        toy = vjp_module(LAYERS, SHAPE, 2, target="toy")
        xla = vjp_module(LAYERS, SHAPE, 2, target="xla")
        with strategy.forced({"convGrad": "written"}):
            xla_written = vjp_module(LAYERS, SHAPE, 2, target="xla")
    assert toy == xla_written and toy != xla
    assert "toy" not in strategy.targets()  # outside the block: the default registry's targets
