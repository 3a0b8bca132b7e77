"""One third party's broken plugin is its own FAIL, never the end of the gate for everyone.

A plugin whose gate cases cannot be listed or built (an invalid ParamSlot init, a `gate_cases()`
that raises or returns none, a class that is not attrs) gets one FAIL row in `hloforge verify`
naming it and its distribution, and one failing item under `pytest --hloforge-gate`; naming
other plugins never builds its cases. A missing contract method is named in its row. A plugin
that claims a built-in's name is listed by `hloforge plugins` (every other command refuses it).

The "pip-installed" distributions are a module and a dist-info on PYTHONPATH, as in
tests/test_plugins_ecosystem.py; the in-process ones go through `Registry(extra_plugins=...)`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from plugin_site import env_with, fake_dist

from hloforge.core.errors import PluginError
from hloforge.core.registry import NameClash, Registry
from hloforge.testing.gate import collect_cases, fault, gate_cases
from hloforge.testing.verify import verify

DIST = "hloforge-bad"

BAD_MODULE = textwrap.dedent('''
    """Plugins with their authors' mistakes, beside one good layer."""
    from typing import ClassVar

    import attrs
    from hloforge.core.hookspecs import hookimpl
    from hloforge.core.spec import Layer, Loss, ParamSlot
    from hloforge.core.variant import Optimizer

    CALLS = []  # whose gate_cases() ran


    @attrs.frozen
    class FineDouble(Layer):
        kind = "fineDouble"

        def out_shape(self, in_shape):
            return in_shape

        def forward(self, b, x, params, ctx):
            return x * 2.0

        def reference(self, params, x, ctx):
            return 2.0 * x

        @classmethod
        def gate_cases(cls):
            CALLS.append(cls.kind)
            return [(cls(), (3,))]


    @attrs.frozen
    class BadInit(FineDouble):
        kind = "badInit"

        def param_slots(self, in_shape):
            return (ParamSlot("s", (in_shape[0],), "kaiming", False),)


    @attrs.frozen
    class CasesRaise(FineDouble):
        kind = "casesRaise"

        @classmethod
        def gate_cases(cls):
            CALLS.append(cls.kind)
            raise RuntimeError("my cases are broken")


    class NotAttrs(Layer):  # no @attrs.frozen
        kind = "notAttrs"

        def out_shape(self, in_shape):
            return in_shape

        @classmethod
        def gate_cases(cls):
            CALLS.append(cls.kind)
            return [(cls(), (3,))]


    @attrs.frozen
    class NoForward(Layer):
        kind = "noForward"

        def out_shape(self, in_shape):
            return in_shape

        def reference(self, params, x, ctx):
            return x

        @classmethod
        def gate_cases(cls):
            CALLS.append(cls.kind)
            return [(cls(), (3,))]


    @attrs.frozen
    class NoSample(Loss):
        name = "noSample"

        def label_spec(self, out_shape):
            return out_shape, "f32"

        @classmethod
        def gate_cases(cls):
            CALLS.append(cls.name)
            return [(cls(), (4,))]


    @attrs.frozen
    class NoCasesOpt(Optimizer):
        name: ClassVar[str] = "noCasesOpt"

        def direction(self, b, g, state, scalars):
            return g, {}

        @classmethod
        def gate_cases(cls):
            CALLS.append(cls.name)
            return []


    @attrs.frozen
    class NoOptax(Optimizer):
        name: ClassVar[str] = "noOptax"

        def direction(self, b, g, state, scalars):
            return g, {}


    @hookimpl
    def hloforge_layers():
        return [FineDouble, BadInit, CasesRaise, NotAttrs, NoForward]


    @hookimpl
    def hloforge_losses():
        return [NoSample]


    @hookimpl
    def hloforge_optimizers():
        return [NoCasesOpt, NoOptax]
''')

DUP_MODULE = textwrap.dedent('''
    import attrs
    from hloforge.core.hookspecs import hookimpl
    from hloforge.core.spec import Layer


    @attrs.frozen
    class MyDense(Layer):
        kind = "dense"
        units: int = 1

        def out_shape(self, in_shape):
            return in_shape


    @hookimpl
    def hloforge_layers():
        return [MyDense]
''')

# (name, what its one line says), for each plugin whose cases cannot be built
CASE_ERRORS = {
    "badInit": "layer 'badInit' (dist 'hloforge-bad') failed building its gate cases: ValueError: 'init' must be in",
    "casesRaise": "layer 'casesRaise' (dist 'hloforge-bad') failed in gate_cases(): RuntimeError: my cases are broken",
    "notAttrs": "layer 'notAttrs' (dist 'hloforge-bad') failed building its gate cases: layer 'notAttrs' "
                "(hf_bad.NotAttrs) is not an attrs class: decorate it with @attrs.frozen",
    "noCasesOpt": "optimizer 'noCasesOpt' (dist 'hloforge-bad') declares no gate cases: its update is not verified",
}
# (name, its row's text) for each plugin whose cases build but cannot run: the missing method named
MISSING = {
    "noForward": "layer 'noForward' (dist 'hloforge-bad') does not implement forward",
    "noSample": "loss 'noSample' (dist 'hloforge-bad') does not implement sample_labels",
    "noOptax": "optimizer 'noOptax' (dist 'hloforge-bad') does not implement optax_direction",
}


def _module(name: str, source: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    return mod


@pytest.fixture
def bad() -> tuple[Registry, types.ModuleType]:
    mod = _module("hf_bad", BAD_MODULE)
    return Registry(extra_plugins=((mod, DIST),)), mod


def _site(root: Path, dist: str, module: str, source: str) -> dict[str, str]:
    """A 'pip-installed' distribution `dist` (module + dist-info) under root/site; the env that sees it."""
    site = root / "site"
    fake_dist(site, dist, {module: source}, {"hloforge.layers": {"plug": module}})
    env = env_with(site)
    env.pop("HLOFORGE_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def bad_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _site(tmp_path_factory.mktemp("badsite"), DIST, "hf_bad", BAD_MODULE)


def _cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hloforge.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


# ------------------------------------------------------------------ building the cases
def test_each_unbuildable_plugin_is_one_case_error_and_the_others_build(bad: tuple[Registry, types.ModuleType]) -> None:
    reg, _ = bad
    cases, errors = collect_cases(reg)
    got = {e.name: e for e in errors}
    assert set(got) == set(CASE_ERRORS), errors
    for name, text in CASE_ERRORS.items():
        err = got[name]
        assert err.distribution == DIST and err.message.startswith(text), err.message
        assert "\n" not in err.message and "Attribute(" not in err.message  # attrs' validator repr is not shown
    assert "(got 'kaiming')" in got["badInit"].message
    names = {c.name for c in cases}
    assert {"fineDouble", "noForward", "noSample", "noOptax", "dense", "conv2d", "adam"} <= names
    assert not names & set(CASE_ERRORS)
    # The programmatic form refuses in one line naming every such plugin, unless they are not asked for.
    with pytest.raises(PluginError) as ei:
        gate_cases(reg)
    assert all(text in str(ei.value) for text in CASE_ERRORS.values())
    assert {c.name for c in gate_cases(reg, ["fineDouble"])} == {"fineDouble"}


def test_names_are_applied_before_any_gate_cases_runs(bad: tuple[Registry, types.ModuleType]) -> None:
    reg, mod = bad
    cases, errors = collect_cases(reg, ["dense"])
    assert errors == [] and cases and {c.name for c in cases} == {"dense"}
    assert mod.CALLS == []  # no third party's gate_cases() ran
    cases, errors = collect_cases(reg, [DIST])  # a distribution names all of its plugins
    assert {c.name for c in cases} == {"fineDouble", "noForward", "noSample", "noOptax"}
    assert {e.name for e in errors} == set(CASE_ERRORS)


def test_fault_names_the_missing_contract_method_else_the_error() -> None:
    from hloforge.core.contracts import Layer

    try:
        Layer().forward(None, None, {}, None)  # type: ignore[arg-type]
    except NotImplementedError as e:
        assert fault(e, "on x") == "does not implement forward"

    def own_refusal() -> None:
        raise NotImplementedError

    try:
        own_refusal()  # a plugin's own NotImplementedError is not a missing contract method
    except NotImplementedError as e:
        assert fault(e, "on x") == "failed on x: NotImplementedError: (raised in own_refusal)"
    assert fault(KeyError("nope")) == "failed: KeyError: 'nope'"


# ------------------------------------------------------------------ verify
def test_verify_gives_each_broken_plugin_a_fail_row(bad: tuple[Registry, types.ModuleType]) -> None:
    reg, _ = bad
    rows: list[str] = []
    failures = verify([DIST], registry=reg, out=rows.append)
    assert failures == len(CASE_ERRORS) + 1 + 1 + 3  # noOptax: its two cases and the wrapped one
    assert rows[-1] == f"verify: 1 passed, {failures} failed"
    assert all("\n" not in r for r in rows)
    for name, text in {**CASE_ERRORS, **MISSING}.items():
        mine = [r for r in rows if re.match(rf"\w+ +{name} +{DIST} ", r)]
        assert mine and all(r.split()[-1] != "pass" and f"FAIL  {text}" in r for r in mine), (name, rows)
    assert any(re.match(rf"layer +fineDouble +{DIST} .* pass$", r) for r in rows), rows
    assert not any(r.rstrip().endswith("NotImplementedError:") for r in rows)


def test_verify_of_a_builtin_never_builds_the_broken_plugins_cases(bad: tuple[Registry, types.ModuleType]) -> None:
    reg, mod = bad
    rows: list[str] = []
    assert verify(["dense"], registry=reg, out=rows.append) == 0
    assert not any(DIST in r for r in rows)
    assert mod.CALLS == []  # no gate_cases() of this distribution ran
    assert rows[-1] == f"verify: {len(collect_cases(reg, ['dense'])[0])} passed, 0 failed"


@pytest.mark.parametrize(("name", "missing"), [("dense", "jax"), ("adam", "optax")])
def test_verify_without_the_oracles_is_one_line_not_a_fail_per_plugin(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, missing: str) -> None:
    """An install without the gate extra: one refusal naming the package and the extra, not every case a FAIL
    row blaming its plugin for the missing import."""
    from hloforge.cli import EXIT_BAD_INPUT, main

    monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` fails, as where it is not installed
    assert main(["verify", name]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert "FAIL" not in out and len(err.splitlines()) == 1, out + err
    assert f"need {missing} (not importable here); pip install 'hloforge[gate]'" in err, err


def test_verify_command_with_a_broken_plugin_installed(bad_env: dict[str, str]) -> None:
    proc = _cli(bad_env, "verify", "dense")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "internal error" not in out, out
    assert re.search(r"verify: \d+ passed, 0 failed$", proc.stdout.strip()), out
    proc = _cli(bad_env, "verify", DIST)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "internal error" not in out and "Traceback" not in out
    for text in {**CASE_ERRORS, **MISSING}.values():
        assert text in proc.stdout, out
    assert proc.stdout.splitlines()[-1] == "verify: 1 passed, 9 failed"


# ------------------------------------------------------------------ pytest --hloforge-gate
def test_pytest_gate_collects_and_fails_only_the_broken_plugins(bad_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "test_own.py").write_text("def test_own():\n    assert True\n")

    def pytest_(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hloforge-gate", *args],
                              cwd=tmp_path, env=bad_env, capture_output=True, text=True, timeout=600)

    proc = pytest_("--collect-only", "-q")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "error" not in proc.stdout.splitlines()[-1], out
    ids = {ln for ln in proc.stdout.splitlines() if ln.startswith("hloforge-gate::gate[")}
    for name in CASE_ERRORS:
        kind = "optimizer" if name == "noCasesOpt" else "layer"
        assert f"hloforge-gate::gate[{kind}:{name}:gate_cases]" in ids, out
    assert "hloforge-gate::gate[layer:dense:units=4,act=relu,bias=True@6]" in ids  # the built-ins are there too
    assert "test_own.py::test_own" in proc.stdout

    proc = pytest_("-q", "-k", f"{DIST} or test_own")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "9 failed, 2 passed" in out, out  # fineDouble and test_own pass
    for text in {**CASE_ERRORS, **MISSING}.values():
        assert text in out, out
    assert "Traceback" not in out and "RuntimeError(" not in out


# ------------------------------------------------------------------ a built-in's name claimed
def test_a_clash_is_listed_with_keep_clashes_and_refused_otherwise() -> None:
    mod = _module("hf_dup", DUP_MODULE)
    with pytest.raises(NameClash, match="layer 'dense' is claimed twice"):
        Registry(extra_plugins=((mod, "hloforge-dup"),))
    reg = Registry(extra_plugins=((mod, "hloforge-dup"),), keep_clashes=True)
    assert reg.entry("layer", "dense").distribution == "hloforge"  # the built-in keeps its name
    [clash] = reg.clashes
    assert clash.second.distribution == "hloforge-dup" and clash.second.name == "dense"
    assert "'hloforge'" in clash.message and "'hloforge-dup'" in clash.message


def test_plugins_command_lists_a_clash_other_commands_refuse_it(tmp_path: Path) -> None:
    env = _site(tmp_path, "hloforge-dup", "hf_dup", DUP_MODULE)
    proc = _cli(env, "plugins")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = proc.stdout.splitlines()
    assert any(re.match(r"layer +dense +hloforge$", r) for r in rows), proc.stdout
    assert any(re.match(r"layer +conv2d +hloforge$", r) for r in rows)
    clash = [r for r in rows if r.startswith("clash")]
    assert len(clash) == 1 and re.match(r"clash +dense +hloforge-dup  layer 'dense' is claimed twice: ", clash[0])
    proc = _cli(env, "verify", "dense")
    assert proc.returncode == 3 and "layer 'dense' is claimed twice" in proc.stderr, proc.stdout + proc.stderr


def test_verify_of_a_layer_named_like_a_strategy_kind_gates_the_layer_alone() -> None:
    """`hloforge verify maxPool`: the strategy kind of that name is gated with the layer's cases (one per choice),
    not failed as a component with no gate; a name only an ungated component carries (a backend) still fails."""
    from hloforge.core.registry import default_registry

    reg = default_registry()
    rows: list[str] = []
    assert verify(["maxPool"], registry=reg, out=rows.append) == 0, rows
    assert rows[-1] == f"verify: {len(collect_cases(reg, ['maxPool'])[0])} passed, 0 failed"
    rows = []
    assert verify(["xla"], registry=reg, out=rows.append) == 1
    assert any(r.startswith("backend") and "a backend has no gate" in r for r in rows), rows
