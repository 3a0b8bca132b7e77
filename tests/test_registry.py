"""The plugin registry: built-ins through entry points, clear lookup errors, conflicts, tracing."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import types

import attrs
import pytest

from hloforge.core.errors import PluginError
from hloforge.core.hookspecs import hookimpl
from hloforge.core.registry import KINDS, Registry, default_registry
from hloforge.core.spec import Layer
from hloforge.plugins.layers.dense import Dense

BUILTINS = {
    "layer": {"dense", "conv2d", "flatten", "maxPool", "globalAvgPool", "relu", "relu6", "gelu", "swish", "sigmoid",
              "hSwish", "hSigmoid", "identity"},
    "loss": {"crossEntropy", "mse"},
    "optimizer": {"sgd", "momentum", "adam", "adamw"},
    "backend": {"xla"},
    "callback": {"early_stopping", "model_checkpoint", "csv_logger", "tensorboard"},
}


@pytest.fixture(scope="module")
def reg() -> Registry:
    return Registry()


@pytest.mark.parametrize("kind", sorted(BUILTINS))
def test_every_builtin_comes_from_an_entry_point_of_hloforge(reg: Registry, kind: str) -> None:
    assert BUILTINS[kind] <= set(reg.names(kind)), f"missing {BUILTINS[kind] - set(reg.names(kind))}"
    group = KINDS[kind][0]
    for name in BUILTINS[kind]:
        e = reg.entry(kind, name)
        assert e.distribution == "hloforge"
        # Registered under its entry point ("dist:group:ep-name"): the path a third party takes, nothing special.
        assert e.plugin.startswith(f"hloforge:{group}:"), e.plugin
        assert e.kind == kind and e.name == name
        assert getattr(e.obj, KINDS[kind][2]) == name
        assert reg.get(kind, name) is e.obj


def test_entries_cover_every_table_in_order(reg: Registry) -> None:
    entries = list(reg.entries())
    assert [(e.kind, e.name) for e in entries] == [(k, n) for k in KINDS for n in reg.names(k)]


def test_default_registry_is_shared_and_complete() -> None:
    assert default_registry() is default_registry()
    assert default_registry().get("layer", "dense") is Dense


def test_unknown_name_lists_registered_names_with_distributions(reg: Registry) -> None:
    with pytest.raises(PluginError) as ei:
        reg.get("layer", "denes")
    msg = str(ei.value)
    assert msg.startswith("unknown layer 'denes'; registered: ")
    for name in BUILTINS["layer"]:
        assert f"{name} (hloforge)" in msg
    with pytest.raises(PluginError, match=r"unknown optimizer 'lion'; registered: .*adamw \(hloforge\)"):
        reg.get("optimizer", "lion")


@attrs.frozen
class OtherDense(Layer):
    kind = "dense"
    units: int = 1


def _plugin_module(name: str, *classes: type) -> types.ModuleType:
    mod = types.ModuleType(name)

    @hookimpl
    def hloforge_layers() -> list[type]:
        return list(classes)

    mod.hloforge_layers = hloforge_layers  # type: ignore[attr-defined]
    return mod


def test_two_plugins_claiming_one_name_is_an_error_naming_both() -> None:
    with pytest.raises(PluginError) as ei:
        Registry(extra_plugins=((_plugin_module("fake_dense", OtherDense), "fake-dist"),))
    msg = str(ei.value)
    assert "layer 'dense' is claimed twice" in msg
    assert "'hloforge'" in msg and "'fake-dist'" in msg


def test_extra_plugin_registers_with_its_distribution() -> None:
    @attrs.frozen
    class Twice(Layer):
        kind = "twice"

    # Re-exporting a built-in class is not a conflict: the same object under the same name.
    r = Registry(extra_plugins=((_plugin_module("fake_twice", Twice, Dense), "fake-dist"),))
    assert r.get("layer", "twice") is Twice
    e = r.entry("layer", "twice")
    assert e.distribution == "fake-dist" and e.plugin == "fake-dist:fake_twice"
    assert r.entry("layer", "dense").obj is Dense
    with pytest.raises(PluginError, match=r"twice \(fake-dist\)"):
        r.get("layer", "nope")


def test_trace_prints_each_hook_call_and_result(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HLOFORGE_TRACE_PLUGINS", "1")
    r = Registry()
    err = capsys.readouterr().err
    assert "hloforge trace: hloforge_layers() -> [hloforge:hloforge.layers:conv]" in err
    assert "hloforge trace: hloforge_layers returned [[<class 'hloforge.plugins.layers.conv.Conv2d'>]]" in err
    for hook in ("hloforge_losses", "hloforge_optimizers", "hloforge_backends"):
        assert f"hloforge trace: {hook}()" in err
    # Event hooks called later go through the same monitor, arguments included.
    r.pm.hook.hloforge_on_epoch_end(run=None, epoch=3, metrics={"top1": 0.5})
    err = capsys.readouterr().err
    assert "hloforge_on_epoch_end(run=None, epoch=3, metrics={'top1': 0.5})" in err

    monkeypatch.delenv("HLOFORGE_TRACE_PLUGINS")
    Registry()
    assert capsys.readouterr().err == ""


def test_trace_in_a_fresh_process() -> None:
    code = "from hloforge.core.registry import default_registry; print(default_registry().names('loss'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HLOFORGE_TRACE_PLUGINS": "1"})
    assert proc.returncode == 0, proc.stderr
    names = ast.literal_eval(proc.stdout.strip())  # every registered loss, sorted: the built-ins among them
    assert {"crossEntropy", "mse", "tokenCrossEntropy"} <= set(names) and names == sorted(names)
    assert "hloforge trace: hloforge_losses() -> [hloforge:hloforge.losses:ce]" in proc.stderr
