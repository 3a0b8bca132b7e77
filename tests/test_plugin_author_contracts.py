"""A plugin author's component that breaks its contract — a layer's shape method returning another type, an
optimizer whose declarations disagree with what it returns, a backend's or a strategy kind's declaration
nobody can use, a name or a tuple written the way Python reads otherwise — is one line naming the plugin and
what was expected: never an internal error, an error blamed on hloforge or on other plugins, or a plausible
wrong message (a float dimension "below 1"). A plugin refused as it loads is a broken row of `hloforge
plugins`, and every command that does not use it still works.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import pytest
from plugin_site import env_with, fake_dist

from hloforge.backends.xla.backend import XlaBackend
from hloforge.core import contracts, strategy
from hloforge.core.errors import PluginError, UnsupportedSpec
from hloforge.core.hlo import Builder
from hloforge.core.hookspecs import hookimpl
from hloforge.core.registry import PluginLoadWarning, Registry
from hloforge.core.spec import Layer, ParamSlot, walk_layers
from hloforge.core.variant import Optimizer, Wrappers


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(strategy.ENV_VAR, raising=False)


# ------------------------------------------------------------------ a layer's shape methods
@attrs.frozen
class Same(Layer):
    kind = "cSame"

    def out_shape(self, in_shape: Any) -> Any:
        return in_shape


@attrs.frozen
class OutNone(Same):
    kind = "cOutNone"

    def out_shape(self, in_shape: Any) -> Any:
        in_shape  # noqa: B018  the author forgot the `return`


@attrs.frozen
class OutInt(Same):
    kind = "cOutInt"

    def out_shape(self, in_shape: Any) -> Any:
        return in_shape[0]


@attrs.frozen
class OutFloat(Same):
    kind = "cOutFloat"

    def out_shape(self, in_shape: Any) -> Any:
        return (in_shape[0] / 2,)


@attrs.frozen
class SlotsSingle(Same):
    kind = "cSlotsSingle"

    def param_slots(self, in_shape: Any) -> Any:
        return ParamSlot("s", (in_shape[0],), "ones", False)


@attrs.frozen
class SlotsTuples(Same):
    kind = "cSlotsTuples"

    def param_slots(self, in_shape: Any) -> Any:
        return [("s", (in_shape[0],), "ones", False)]


@attrs.frozen
class SlotsFloat(Same):
    kind = "cSlotsFloat"

    def param_slots(self, in_shape: Any) -> Any:
        return (ParamSlot("s", (in_shape[0] / 1,), "ones", False),)


@pytest.mark.parametrize("layer, said", [
    # were: internal error "TypeError: 'NoneType' object is not iterable" / "'int' object is not iterable"
    (OutNone(), r"layer 'cOutNone'.*: layer 1's out_shape returned None \(type NoneType\); expected its output "
                r"shape, a tuple of positive ints"),
    (OutInt(), r"layer 'cOutInt'.*: layer 1's out_shape returned 4 \(type int\); expected its output shape"),
    # were: "TypeError: 'ParamSlot' object is not iterable" / "AttributeError: 'tuple' object has no attribute 'name'"
    (SlotsSingle(), r"layer 'cSlotsSingle'.*param_slots returned ParamSlot\(.*\) \(type ParamSlot\); expected a "
                    r"tuple of hloforge.core.slots.ParamSlot \(one slot is `return \(ParamSlot\(...\),\)`\)"),
    (SlotsTuples(), r"layer 'cSlotsTuples'.*param_slots returned \[\('s', \(4,\), 'ones', False\)\] \(type list "
                    r"holding tuple\); expected a tuple of hloforge.core.slots.ParamSlot"),
])
def test_a_shape_method_returning_another_type_is_a_plugin_error_naming_the_layer(layer: Layer, said: str) -> None:
    with pytest.raises(PluginError, match=said):
        walk_layers([Same(), layer], (4,))


@pytest.mark.parametrize("layer, said", [
    # were: "parameter s [4.0] has a dimension below 1; every dimension must be positive" (it is 4)
    (SlotsFloat(), r"layer 0 \(cSlotsFloat\(\)\) on input \[4\]: parameter s \[4.0\] has a dimension that is not "
                   r"an integer: 4.0 \(type float\); every dimension must be a positive int"),
    (OutFloat(), r"layer 0 \(cOutFloat\(\)\) on input \[4\]: output shape \[2.0\] has a dimension that is not an "
                 r"integer: 2.0 \(type float\)"),
])
def test_a_float_dimension_is_said_to_be_no_integer(layer: Layer, said: str) -> None:
    with pytest.raises(UnsupportedSpec, match=said) as e:
        walk_layers([layer], (4,))
    assert "below 1" not in str(e.value)


# ------------------------------------------------------------------ an optimizer's declarations
@attrs.frozen
class Plain(Optimizer):
    name: ClassVar[str] = "cPlain"

    def direction(self, b: Any, g: Any, state: Any, scalars: Any) -> Any:
        return g, {}


@attrs.frozen
class ScalarsMissing(Plain):
    name: ClassVar[str] = "cScalarsMissing"
    scalars: ClassVar[tuple[str, ...]] = ("lr", "bc")  # host_scalars (the base's) gives only lr


@attrs.frozen
class DirShape(Plain):
    name: ClassVar[str] = "cDirShape"

    def direction(self, b: Any, g: Any, state: Any, scalars: Any) -> Any:
        return b.sum(g), {}


@attrs.frozen
class InitWrong(Plain):
    name: ClassVar[str] = "cInitWrong"
    state: ClassVar[tuple[str, ...]] = ("m",)

    def init_state(self, slot: ParamSlot) -> dict[str, np.ndarray]:
        return {"m": np.zeros((1,), np.float32)}


def test_host_scalars_without_a_declared_scalar_names_the_optimizer_and_the_scalar() -> None:
    """Was: `train --optimizer scalarsMissing` -> internal error: KeyError: 'bc'."""
    opt = ScalarsMissing()
    with pytest.raises(PluginError, match=r"optimizer 'cScalarsMissing'.*: host_scalars returned \['lr'\], without "
                                          r"\['bc'\]; expected .* each name its `scalars` declares: \['lr', 'bc'\]"):
        Wrappers().layout(opt).host_scalars(opt, 1, 0.1)


def test_a_direction_of_another_shape_names_the_optimizer() -> None:
    """Was: "stablehlo.multiply operands differ: tensor<10xf32> vs tensor<f32>", naming no optimizer."""
    b = Builder()
    slot = ParamSlot("w", (10,), "zeros", True)
    p, g, lr = b.arg((10,)), b.arg((10,)), b.arg(())
    with pytest.raises(PluginError, match=r"optimizer 'cDirShape'.*: its update of parameter 'w' \[10\]: direction "
                                          r"returned tensor<f32> for a gradient of tensor<10xf32>; expected a "
                                          r"direction of the gradient's own shape and dtype"):
        Wrappers().emit_update(b, DirShape(), [slot], [p], [g], {}, {"lr": lr})


def test_an_initial_state_of_another_shape_names_the_optimizer_and_the_slot() -> None:
    """Was: the backend refusing "argument 6 is DeviceBuffer(1 float32), but the executable was compiled for
    784x512 float32", naming neither the optimizer nor its state."""
    opt = InitWrong()
    slot = ParamSlot("w", (3, 2), "glorot", True)
    with pytest.raises(PluginError, match=r"optimizer 'cInitWrong'.*: init_state of parameter 'w' returned state "
                                          r"'m' of shape \[1\] float32; expected a float array of the parameter's "
                                          r"shape \[3, 2\]"):
        Wrappers().layout(opt).initial(opt, [slot], [np.zeros((3, 2), np.float32)])


# ------------------------------------------------------------------ a backend's and a strategy kind's declarations
def _module(name: str, backends: tuple[type, ...] = (), kinds: tuple[Any, ...] = (), api: Any = None,
            layers: tuple[type, ...] = (), optimizers: tuple[type, ...] = ()) -> types.ModuleType:
    """A plugin module whose hooks return these components (and that declares plugin API `api`, if given)."""
    mod = types.ModuleType(name)
    for hook, items in (("hloforge_backends", backends), ("hloforge_strategy_kinds", kinds),
                        ("hloforge_layers", layers), ("hloforge_optimizers", optimizers)):
        if items:
            setattr(mod, hook, _returning(items))
    if api is not None:
        mod.HLOFORGE_PLUGIN_API = api  # type: ignore[attr-defined]
    return mod


def _returning(items: tuple[Any, ...]) -> Any:
    @hookimpl
    def hook() -> list[Any]:
        return list(items)

    return hook


def _broken(mod: types.ModuleType, dist: str) -> tuple[Registry, str]:
    """The registry with this plugin module, which must be refused as it loads, alone; and its one line."""
    with pytest.warns(PluginLoadWarning):
        reg = Registry(extra_plugins=((mod, dist),))
    assert [b.distribution for b in reg.broken] == [dist], reg.broken
    assert "xla" in reg.names("backend") and "dense" in reg.names("layer")  # the others still load
    error = reg.broken[0].error
    assert "\n" not in error
    return reg, error


class ListDefaults(XlaBackend):
    name = "cListXla"
    strategy_defaults = ["convGrad"]  # type: ignore[assignment]


class TypoDefaults(XlaBackend):
    name = "cTypoXla"
    strategy_defaults = {**XlaBackend.strategy_defaults, "convGrad": "writen"}


@pytest.mark.parametrize("mod, said", [
    # was: every render and verify an internal error, "AttributeError: 'list' object has no attribute 'items'"
    (_module("c_list", backends=(ListDefaults,)),
     r"hloforge_backends\(\) returned backend 'cListXla', whose strategy_defaults is \['convGrad'\] \(type list\); "
     r"expected a mapping strategy kind -> choice"),
    # was: listed as fine, and every render of any net refused (verify: a FAIL row for every built-in layer)
    (_module("c_typo", backends=(TypoDefaults,)),
     r"backend 'cTypoXla', whose strategy_defaults names an unknown kind or choice: convGrad='writen' \(its "
     r"choices: \['written', "),
    (_module("c_core", kinds=(strategy.StrategyKind("layout", ("a", "b")),)),
     r"hloforge_strategy_kinds\(\) returned strategy kind 'layout', which takes the name of one of the core's "
     r"kinds \['layout', 'update', 'paramLayout', 'sums'\]; expected a name of its own"),
])
def test_a_strategy_declaration_nobody_can_use_breaks_its_plugin_alone(mod: types.ModuleType, said: str) -> None:
    reg, error = _broken(mod, "c-dist")
    assert re.search(said, error), error
    with strategy.using(reg):  # rendering for the others goes on as before
        assert strategy.chosen("convGrad", "xla") == XlaBackend.strategy_defaults["convGrad"]
        assert strategy.kinds()["layout"] is strategy.LAYOUT and "cTypoXla" not in strategy.targets()


def test_the_core_kinds_the_registry_checks_are_the_core_s() -> None:
    assert {k.name: k.choices for k in strategy.CORE_KINDS} == dict(contracts.CORE_STRATEGY_CHOICES)


def test_a_backend_with_unusable_strategy_defaults_installed_does_not_stop_other_commands(tmp_path: Path) -> None:
    """pip-installed: `hloforge render` still works and `hloforge plugins` shows the broken row (was: every
    render an internal error, and the plugin listed as fine)."""
    site = tmp_path / "site"
    fake_dist(site, "c-backend-list", {"c_backend_list": textwrap.dedent('''
        from hloforge.core.hookspecs import hookimpl
        from hloforge.backends.xla.backend import XlaBackend

        class MyXla(XlaBackend):
            name = "myXla"
            strategy_defaults = ["convGrad"]

        @hookimpl
        def hloforge_backends():
            return [MyXla]
        ''')}, {"hloforge.backends": {"bl": "c_backend_list"}})
    env = env_with(site)
    env.pop("HLOFORGE_DEBUG", None)
    run = [sys.executable, "-m", "hloforge.cli"]
    proc = subprocess.run([*run, "render", "mnist-linear", "--out", str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "was not loaded" in proc.stderr
    proc = subprocess.run([*run, "plugins"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in proc.stdout.splitlines() if r.startswith("broken"))
    assert "c-backend-list" in row and "backend 'myXla', whose strategy_defaults is ['convGrad']" in row, row


# ------------------------------------------------------------------ what Python reads otherwise
@attrs.frozen
class AnnotatedName(Plain):
    name: str = "cAnnotated"  # type: ignore[misc]  the author's mistake: attrs makes it an option


@attrs.frozen
class StateStr(Plain):
    name: ClassVar[str] = "cStateStr"
    state: ClassVar[tuple[str, ...]] = ("mom")  # type: ignore[assignment]  # noqa: UP034  no comma: a string


@attrs.frozen
class StrategyStr(Same):
    kind = "cStrategyStr"
    strategy_kinds = ("myForm")  # type: ignore[assignment]  # noqa: UP034


@pytest.mark.parametrize("mod, said", [
    # was: "which is not a optimizer component: it has no string attribute 'name'"
    (_module("c_annotated", optimizers=(AnnotatedName,)),
     r"returned <class '.*AnnotatedName'>, which is not an optimizer component: its 'name' is annotated, so attrs "
     r"made it an option, .*declare it a plain class attribute \(`name = ...`\) or a ClassVar "
     r"\(`name: ClassVar\[str\] = ...`\)"),
    # was: StateLayout's slots 'm', 'o', 'm'
    (_module("c_state", optimizers=(StateStr,)),
     r"returned optimizer 'cStateStr', whose state is the string 'mom'; expected a tuple of names \(one name is "
     r"`\('mom',\)`, with the comma\)"),
    # was: "unknown strategy kind 'm'" from the gate
    (_module("c_strategy", layers=(StrategyStr,)),
     r"returned layer 'cStrategyStr', whose strategy_kinds is the string 'myForm'; expected a tuple of names"),
    # was: "targets hloforge plugin API '1', but this hloforge provides plugin API 1"
    (_module("c_api", layers=(Same,), api="1"),
     r"module 'c_api' sets HLOFORGE_PLUGIN_API = '1' \(type str\); expected an int, the plugin API it targets "
     r"\(this hloforge provides 1\)"),
])
def test_what_python_reads_otherwise_is_said_as_the_author_wrote_it(mod: types.ModuleType, said: str) -> None:
    _, error = _broken(mod, "c-dist")
    assert re.search(said, error), error
