"""A third-party plugin author's ordinary mistakes, each met with one line naming the plugin and what was
expected (an HloforgeError in Python, a one-line refusal and a non-zero exit on the command line), never a
traceback, an internal error blamed on hloforge, or a plugin that silently does nothing; and a broken
plugin does not stop a command that does not use it.

In-process plugins go through `Registry(extra_plugins=...)`; the "pip-installed" ones are a module and a
dist-info on PYTHONPATH (tests/plugin_site.py).
"""

from __future__ import annotations

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

from hloforge.commands.exits import EXIT_BAD_INPUT
from hloforge.core import modules
from hloforge.core.errors import PluginError
from hloforge.core.hookspecs import hookimpl
from hloforge.core.registry import PluginLoadWarning, Registry
from hloforge.core.spec import Layer, Loss, NetSpec, ParamSlot
from hloforge.core.variant import Optimizer
from hloforge.datasets.stream import split_labels, split_pair
from hloforge.testing.gate import gate_layer

HEAD = '''
import attrs
from hloforge.core.hookspecs import hookimpl
from hloforge.core.spec import Layer


@attrs.frozen
class Twice(Layer):
    kind = "KIND"

    def out_shape(self, in_shape):
        return in_shape

    def forward(self, b, x, params, ctx):
        return x * 2.0

    def reference(self, params, x, ctx):
        return 2.0 * x
'''


def _module(name: str, hooks: str, kind: str = "twice") -> types.ModuleType:
    """A plugin module: the layer class `Twice` (registered as `kind`), then `hooks`."""
    mod = types.ModuleType(name)
    source = textwrap.dedent(HEAD).replace("KIND", kind) + textwrap.dedent(hooks)
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    return mod


def _broken_error(hooks: str) -> str:
    """The one line a registry gives the plugin module with these hooks (it must be refused, alone)."""
    with pytest.warns(PluginLoadWarning):
        reg = Registry(extra_plugins=((_module("hf_fuzz", hooks), "hf-fuzz"),))
    assert [b.distribution for b in reg.broken] == ["hf-fuzz"], reg.broken
    assert "twice" not in reg.names("layer") and "dense" in reg.names("layer")  # the others still load
    error = reg.broken[0].error
    assert "\n" not in error
    return error


# ------------------------------------------------------------------ the hook
@pytest.mark.parametrize("hooks, said", [
    # a hook function taking an argument its hook does not have (was: pluggy's PluginValidationError
    # out of Registry(), so every command was an internal error)
    ("@hookimpl\ndef hloforge_layers(config):\n    return [Twice]\n",
     "module 'hf_fuzz' does not fit hloforge's hooks: .*hloforge_layers\\(config\\).*'config'"),
    # a misspelt hook, and one without its decorator (were: silently nothing registered)
    ("@hookimpl\ndef hloforge_layer():\n    return [Twice]\n",
     "module 'hf_fuzz' implements hloforge_layer, which is not a hloforge hook \\(did you mean hloforge_layers\\?\\)"),
    ("def hloforge_layers():\n    return [Twice]\n",
     "module 'hf_fuzz' defines hloforge_layers without the @hookimpl decorator"),
    # the class itself instead of a list of classes (was: "'_Component' object is not iterable")
    ("@hookimpl\ndef hloforge_layers():\n    return Twice\n",
     "hloforge_layers\\(\\) returned <class 'hf_fuzz.Twice'>, expected a list of classes \\(`return \\[Twice\\]`\\)"),
    # an instance instead of its class, and a class that is no Layer (were: registered, then an error or an
    # internal error wherever a spec used them)
    ("@hookimpl\ndef hloforge_layers():\n    return [Twice()]\n",
     "hloforge_layers\\(\\) returned Twice\\(\\), which is not a layer component: an instance, expected its class"),
    ("class Plain:\n    kind = 'plain'\n\n@hookimpl\ndef hloforge_layers():\n    return [Twice, Plain]\n",
     "returned <class 'hf_fuzz.Plain'>, which is not a layer component: expected a subclass of "
     "hloforge.core.contracts.Layer"),
])
def test_a_hook_the_registry_cannot_use_is_one_broken_line(hooks: str, said: str) -> None:
    import re

    error = _broken_error(hooks)
    assert re.search(said, error), error


def test_a_hook_with_wrong_arguments_installed_does_not_stop_other_commands(tmp_path: Path) -> None:
    """pip-installed: `hloforge render mnist-mlp` still works, and `hloforge plugins` shows the broken row
    (was: exit 4, "internal error: PluginValidationError", for every command)."""
    site = tmp_path / "site"
    fake_dist(site, "hf-wrongargs", {"hf_wrongargs": textwrap.dedent(HEAD) +
                                     "\n@hookimpl\ndef hloforge_layers(config):\n    return [Twice]\n"},
              {"hloforge.layers": {"wrongargs": "hf_wrongargs"}})
    env = env_with(site)
    env.pop("HLOFORGE_DEBUG", None)
    run = [sys.executable, "-m", "hloforge.cli"]
    proc = subprocess.run([*run, "render", "mnist-mlp", "--out", str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "was not loaded" in proc.stderr
    proc = subprocess.run([*run, "plugins"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in proc.stdout.splitlines() if r.startswith("broken"))
    assert "wrongargs" in row and "hf-wrongargs" in row and "hloforge_layers(config)" in row, row


# ------------------------------------------------------------------ a layer's rules disagreeing
@attrs.frozen
class Doubled(Layer):
    """out_shape says twice the features; forward keeps them."""

    kind = "fuzzDoubled"

    def out_shape(self, in_shape: Any) -> Any:
        return (in_shape[0] * 2,)

    def forward(self, b: Any, x: Any, params: Any, ctx: Any) -> Any:
        return x * 2.0

    def reference(self, params: Any, x: Any, ctx: Any) -> Any:
        return 2.0 * x


@attrs.frozen
class ForgetsReturn(Doubled):
    kind = "fuzzForgets"

    def out_shape(self, in_shape: Any) -> Any:
        return in_shape

    def forward(self, b: Any, x: Any, params: Any, ctx: Any) -> Any:
        x * 2.0  # noqa: B018  the author's mistake: no return


def test_forward_disagreeing_with_out_shape_is_a_plugin_error_naming_the_layer() -> None:
    """Was: AssertionError (an internal error, "a bug" in hloforge)."""
    with pytest.raises(PluginError, match=r"layer 'fuzzDoubled'.*forward emitted \[2, 3\], but its out_shape "
                                          r"declares \[2, 6\]"):
        modules.layers_forward_module([Doubled()], (3,), 2)
    with pytest.raises(PluginError, match=r"layer 'fuzzForgets'.*forward returned None, expected the builder value"):
        modules.layers_forward_module([ForgetsReturn()], (3,), 2)


@attrs.frozen
class BadReshape(ForgetsReturn):
    kind = "fuzzBadReshape"

    def forward(self, b: Any, x: Any, params: Any, ctx: Any) -> Any:
        return b.reshape(x, (x.shape[0], 4))  # the author's mistake: 3 features do not make 4


def test_a_builder_op_misused_in_forward_names_the_layer() -> None:
    """Was: the builder's line alone ("reshape tensor<2x3xf32> -> tensor<2x4xf32>: element counts differ"),
    naming no layer."""
    with pytest.raises(PluginError, match=r"^layer 'fuzzBadReshape': layer 0's forward: reshape tensor<2x3xf32> "
                                          r"-> tensor<2x4xf32>: element counts differ$"):
        modules.layers_forward_module([BadReshape()], (3,), 2)


def test_the_gate_names_a_reference_disagreeing_with_out_shape() -> None:
    """Was: jax's "unexpected JAX type ... for argument to VJP function", naming neither rule."""
    with pytest.raises(PluginError, match=r"layer 'fuzzDoubled'.*reference returned \[2, 3\], but out_shape "
                                          r"declares \[2, 6\]"):
        gate_layer(Doubled(), (3,))


class NotAttrs(Layer):  # the author forgot @attrs.frozen
    kind = "fuzzNotAttrs"

    def out_shape(self, in_shape: Any) -> Any:
        return in_shape


def test_a_layer_class_without_attrs_is_refused_in_a_spec() -> None:
    """Was: attrs' NotAnAttrsClassError out of the spec reader (an internal error)."""
    mod = types.ModuleType("hf_notattrs")

    @hookimpl
    def hloforge_layers() -> list[type]:
        return [NotAttrs]

    mod.hloforge_layers = hloforge_layers  # type: ignore[attr-defined]
    reg = Registry(extra_plugins=((mod, "hf-notattrs"),))
    spec = {"name": "n", "input_shape": [4], "num_classes": 4, "layers": [{"kind": "fuzzNotAttrs"}]}
    with pytest.raises(PluginError, match=r"layer 'fuzzNotAttrs' \(.*NotAttrs\) is not an attrs class: "
                                          r"decorate it with @attrs.frozen"):
        NetSpec.from_dict(spec, reg)


# ------------------------------------------------------------------ a loss and an optimizer
@attrs.frozen
class PerElement(Loss):
    """Returns the per-element error instead of its mean."""

    name = "fuzzPerElement"

    def label_spec(self, out_shape: Any) -> Any:
        return out_shape, "f32"

    def forward(self, b: Any, logits: Any, y: Any) -> Any:
        return logits - y


def test_a_loss_whose_forward_is_no_scalar_is_a_plugin_error() -> None:
    """Was: "AssertionError: VJP produced cotangent tensor<f32> for tensor<3x4xf32>"."""
    with pytest.raises(PluginError, match=r"loss 'fuzzPerElement'.*forward returned tensor<3x4xf32>, expected a "
                                          r"scalar tensor<f32> \(the mean over the batch\)"):
        modules.loss_module(PerElement(), (4,), 3)


@attrs.frozen
class ForgetsV(Optimizer):
    name: ClassVar[str] = "fuzzForgetsV"
    state: ClassVar[tuple[str, ...]] = ("m", "v")

    def direction(self, b: Any, g: Any, state: Any, scalars: Any) -> Any:
        return g, {"m": state["m"] * 0.9 + g}


@attrs.frozen
class Renames(ForgetsV):
    name: ClassVar[str] = "fuzzRenames"
    state: ClassVar[tuple[str, ...]] = ("m",)

    def direction(self, b: Any, g: Any, state: Any, scalars: Any) -> Any:
        return g, {"momentum": g}


@pytest.mark.parametrize("opt, returned, declared", [(ForgetsV(), "['m']", "['m', 'v']"),
                                                     (Renames(), "['momentum']", "['m']")])
def test_an_optimizer_returning_other_state_than_it_declares_is_a_plugin_error(opt: Optimizer, returned: str,
                                                                               declared: str) -> None:
    """Was: AssertionError (an internal error); a misnamed slot was not even named."""
    slots = [ParamSlot("w", (3, 4), "glorot", True)]
    with pytest.raises(PluginError) as ei:
        modules.optimizer_step_module(slots, opt)
    msg = str(ei.value)
    assert f"optimizer {opt.name!r}" in msg and f"returned new state {returned}" in msg, msg
    assert f"its `state` declares: {declared}" in msg, msg


# ------------------------------------------------------------------ on the command line
SPEC = '''
name = "fuzz-net"
input_shape = [1, 28, 28]
num_classes = 10

[[layers]]
kind = "flatten"

[[layers]]
kind = "KIND"

[[layers]]
kind = "dense"
units = 10
'''


@pytest.fixture(scope="module")
def doubled_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A pip-installed layer `twice` whose out_shape says twice the features its forward and reference keep."""
    site = tmp_path_factory.mktemp("doubled")
    source = textwrap.dedent(HEAD).replace("KIND", "twice").replace("return in_shape", "return (in_shape[0] * 2,)")
    fake_dist(site, "hf-doubled", {"hf_doubled": source + textwrap.dedent('''
        @classmethod
        def _cases(cls):
            return [(cls(), (3,))]


        Twice.gate_cases = _cases


        @hookimpl
        def hloforge_layers():
            return [Twice]
        ''')}, {"hloforge.layers": {"doubled": "hf_doubled"}})
    env = env_with(site)
    env.pop("HLOFORGE_DEBUG", None)
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hloforge.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600)


def test_render_with_a_layer_whose_rules_disagree_is_one_line_naming_its_distribution(
        doubled_env: dict[str, str], tmp_path: Path) -> None:
    """Was: exit 4, "internal error: AssertionError: layer 1 (...) emitted ..." (a bug, said to be hloforge's)."""
    spec = tmp_path / "net.toml"
    spec.write_text(SPEC.replace("KIND", "twice"))
    proc = _cli(doubled_env, "render", str(spec), "--out", str(tmp_path / "o"))
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0] == ("hloforge: error: layer 'twice' (dist 'hf-doubled'): layer 1's forward emitted [128, 784], "
                        "but its out_shape declares [128, 1568] (NCHW, batch first)"), lines[0]
    assert not (tmp_path / "o").exists()


def test_verify_names_the_disagreeing_rule_and_the_plugin_once(doubled_env: dict[str, str]) -> None:
    """Was: jax's "unexpected JAX type ... for argument to VJP function" in the row."""
    proc = _cli(doubled_env, "verify", "hf-doubled")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(r for r in proc.stdout.splitlines() if "FAIL" in r)
    assert row.endswith("FAIL  layer 'twice' (dist 'hf-doubled') failed on layer:twice:@3: reference returned "
                        "[2, 3], but out_shape declares [2, 6] (batch first)"), row


# ------------------------------------------------------------------ a dataset's arrays
class _Rows:
    name, num_classes = "rowsOff", 10

    def __init__(self, got: Any) -> None:
        self.got = got

    def arrays(self, split: str) -> Any:
        return self.got


X, Y = np.zeros((6, 4), np.float32), np.zeros(6, np.int32)


@pytest.mark.parametrize("got, said", [
    ((X, Y[:4]), "arrays('test') gave 6 rows of x but 4 labels, expected one label per row"),
    (X, "arrays('test') returned ndarray, expected a pair (x, y) of arrays, one label per row of x"),
    ((X, Y, Y), "arrays('test') returned 3 items, expected a pair"),
    ((X, 3), "arrays('test') returned 2 items, expected a pair"),
])
def test_a_dataset_whose_arrays_are_no_pair_of_equal_lengths_is_one_line(got: Any, said: str) -> None:
    """(was: an IndexError out of the feed, or "too many values to unpack" in the trainer: exit 4, a bug)"""
    with pytest.raises(PluginError) as e:
        split_labels(_Rows(got), "test")
    assert str(e.value).startswith(f"dataset 'rowsOff': {said}")
    assert split_pair(_Rows((X, Y)), "test") == (X, Y)


def test_train_on_a_pip_installed_dataset_with_short_labels_names_it(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_dist(site, "hf-short", {"hf_short": '''
        import numpy as np
        from hloforge.core.hookspecs import hookimpl


        class Short:
            name, num_classes = "shortLabels", 10

            def arrays(self, split):
                return np.zeros((64, 1, 28, 28), np.float32), np.zeros(60, np.int32)


        @hookimpl
        def hloforge_datasets():
            return [Short]
        '''}, {"hloforge.datasets": {"short": "hf_short"}})
    env = env_with(site)
    env.pop("HLOFORGE_DEBUG", None)
    proc = _cli(env, "train", "--net", "mnist-cnn", "--data", "shortLabels", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == EXIT_BAD_INPUT and proc.stdout == ""
    assert proc.stderr == ("hloforge: error: dataset 'shortLabels' (dist 'hf-short'): arrays('test') gave 64 rows "
                           "of x but 60 labels, expected one label per row\n")
