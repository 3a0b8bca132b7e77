"""Third-party plugins end to end: broken and incompatible plugins, `hloforge verify`, the example
distribution (examples/hloforge-groupnorm: listed, trains, gated, and red when its backward is
broken), and the docs' code.

A "pip-installed" distribution here is a package plus a `<name>.dist-info` (METADATA,
entry_points.txt) in a temporary directory put first on sys.path / PYTHONPATH: exactly what
importlib.metadata reads for an installed wheel, without pip or a network.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from plugin_site import env_with, fake_dist, layer_module

import hloforge
from hloforge.core.errors import PluginError
from hloforge.core.registry import BrokenPlugin, PluginLoadWarning, Registry

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hloforge-groupnorm"
DOCS = ROOT / "docs"


def hloforge_cli(env: dict[str, str], *args: str, cwd: Path | None = None,
                 timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hloforge.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------------------ registry robustness
@pytest.fixture(scope="module")
def troubled_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five fake distributions: one fine, one whose import fails, one targeting plugin API 99, one whose
    hook raises, one returning a non-component."""
    site = tmp_path_factory.mktemp("troubled")
    fake_dist(site, "hloforge-fine", {"hf_fine": layer_module("fineScale")},
              {"hloforge.layers": {"fine": "hf_fine"}})
    fake_dist(site, "hloforge-importfail", {"hf_importfail": "import hloforge_no_such_module\n"},
              {"hloforge.layers": {"importfail": "hf_importfail"}})
    fake_dist(site, "hloforge-future", {"hf_future": layer_module("futureScale", "HLOFORGE_PLUGIN_API = 99\n")},
              {"hloforge.layers": {"future": "hf_future"}})
    fake_dist(site, "hloforge-hookfail", {"hf_hookfail": '''
        from hloforge.core.hookspecs import hookimpl

        @hookimpl
        def hloforge_losses():
            raise RuntimeError("cannot make my losses")
        '''}, {"hloforge.losses": {"hookfail": "hf_hookfail"}})
    fake_dist(site, "hloforge-notacomponent", {"hf_notacomponent": '''
        from hloforge.core.hookspecs import hookimpl

        @hookimpl
        def hloforge_optimizers():
            return [object]
        '''}, {"hloforge.optimizers": {"notacomponent": "hf_notacomponent"}})
    return site


def test_plugin_api_version_is_defined() -> None:
    assert hloforge.PLUGIN_API_VERSION == 1


def test_broken_plugins_are_reported_and_the_others_load(troubled_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(troubled_site))
    with pytest.warns(PluginLoadWarning) as record:
        reg = Registry()
    broken = {b.distribution: b for b in reg.broken}
    assert set(broken) == {"hloforge-importfail", "hloforge-future", "hloforge-hookfail", "hloforge-notacomponent"}
    assert all(isinstance(b, BrokenPlugin) for b in reg.broken)
    imp = broken["hloforge-importfail"]
    assert imp.plugin == "hloforge-importfail:hloforge.layers:importfail" and imp.name == "importfail"
    assert "cannot import 'hf_importfail'" in imp.error and "ModuleNotFoundError" in imp.error
    assert "hloforge_no_such_module" in imp.error
    fut = broken["hloforge-future"].error
    assert "targets hloforge plugin API 99" in fut and "provides plugin API 1" in fut
    assert "hloforge_losses() failed: RuntimeError: cannot make my losses" in broken["hloforge-hookfail"].error
    assert "is not an optimizer component" in broken["hloforge-notacomponent"].error
    assert len(record) == 4 and all("was not loaded" in str(w.message) for w in record)
    # The fine third party and every built-in still load.
    assert reg.entry("layer", "fineScale").distribution == "hloforge-fine"
    assert {"dense", "conv2d"} <= set(reg.names("layer")) and "crossEntropy" in reg.names("loss")
    assert "adam" in reg.names("optimizer")
    # A refused plugin's component is unknown, and the error says which plugins did not load and why.
    with pytest.raises(PluginError, match=r"unknown layer 'futureScale'; registered: .*not loaded: "
                                          r"hloforge-future:hloforge.layers:future \(module 'hf_future' targets"):
        reg.get("layer", "futureScale")


def test_missing_api_declaration_means_current_and_extra_plugins_are_checked_too() -> None:
    import types

    mod = types.ModuleType("hf_declares_current")
    exec(layer_module("currentScale", "HLOFORGE_PLUGIN_API = 1\n"), mod.__dict__)
    old = types.ModuleType("hf_declares_old")
    exec(layer_module("oldScale", "HLOFORGE_PLUGIN_API = 0\n"), old.__dict__)
    with pytest.warns(PluginLoadWarning, match="targets hloforge plugin API 0"):
        reg = Registry(extra_plugins=((mod, "dist-current"), (old, "dist-old")))
    assert reg.entry("layer", "currentScale").distribution == "dist-current"
    assert "oldScale" not in reg.names("layer")
    assert [b.distribution for b in reg.broken] == ["dist-old"]


def test_duplicate_name_across_distributions_names_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist(tmp_path, "hloforge-twin-a", {"hf_twin_a": layer_module("twinScale")},
              {"hloforge.layers": {"twin": "hf_twin_a"}})
    fake_dist(tmp_path, "hloforge-twin-b", {"hf_twin_b": layer_module("twinScale")},
              {"hloforge.layers": {"twin": "hf_twin_b"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as ei:
        Registry()
    msg = str(ei.value)
    assert "layer 'twinScale' is claimed twice" in msg
    assert "'hloforge-twin-a'" in msg and "'hloforge-twin-b'" in msg


def test_plugins_command_lists_broken_plugins(troubled_site: Path) -> None:
    proc = hloforge_cli(env_with(troubled_site), "plugins")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    assert any(re.match(r"layer +fineScale +hloforge-fine$", r) for r in rows), proc.stdout
    assert any(re.match(r"layer +dense +hloforge$", r) for r in rows)
    broken = [r for r in rows if r.startswith("broken")]
    assert len(broken) == 4, proc.stdout
    imp = next(r for r in broken if "importfail" in r)
    assert re.match(r"broken +importfail +hloforge-importfail  cannot import 'hf_importfail': ModuleNotFoundError",
                    imp), imp
    assert any("future" in r and "targets hloforge plugin API 99" in r for r in broken)
    # one line per skipped plugin, as the command's other lines (was: Python's file:line inside hloforge, then
    # a source line)
    said = [r for r in proc.stderr.splitlines() if r.startswith("hloforge: warning: hloforge plugin ")]
    assert len(said) == 4 and all("was not loaded: " in r for r in said), proc.stderr
    assert "registry.py" not in proc.stderr and "PluginLoadWarning" not in proc.stderr


def test_verify_fails_on_broken_plugins_and_unknown_names(troubled_site: Path) -> None:
    env = env_with(troubled_site)
    proc = hloforge_cli(env, "verify", "hloforge-fine", "hloforge-future")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = proc.stdout.splitlines()
    assert any(re.match(r"layer +fineScale +hloforge-fine +\S.* pass$", r) for r in rows), proc.stdout
    assert any(r.startswith("broken") and "hloforge-future" in r and "FAIL" in r for r in rows), proc.stdout
    assert rows[-1] == "verify: 1 passed, 1 failed"
    proc = hloforge_cli(env, "verify", "noSuchLayer")
    assert proc.returncode == 3 and "no plugin or distribution named ['noSuchLayer']" in proc.stderr


# ------------------------------------------------------------------ the example distribution
def install_example(site: Path, *, break_backward: bool = False) -> None:
    """The example as pip would lay it out: its package and a dist-info with its declared entry points."""
    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    pkg = site / "hloforge_groupnorm"
    shutil.copytree(EXAMPLE / "hloforge_groupnorm", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"hloforge_groupnorm-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
        for group, eps in meta["entry-points"].items()))
    if break_backward:  # Huber's closed-form backward off by 1%: the forward (and the reference) stay right
        src = pkg / "losses.py"
        text = src.read_text()
        good = "return [b.clip(d, -delta, delta) * b.broadcast_to(g / n, d.shape)]"
        assert good in text
        src.write_text(text.replace(good, "return [b.clip(d, -delta, delta) * b.broadcast_to(g / n, d.shape) * 1.01]"))


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("example")
    install_example(site)
    return site


def test_example_is_listed_under_its_distribution(example_site: Path) -> None:
    proc = hloforge_cli(env_with(example_site), "plugins")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    assert any(re.match(r"layer +groupNorm +hloforge-groupnorm$", r) for r in rows), proc.stdout
    assert any(re.match(r"loss +huber +hloforge-groupnorm$", r) for r in rows), proc.stdout
    assert not any(r.startswith("broken") for r in rows)


def test_example_verifies_and_a_broken_copy_fails(example_site: Path, tmp_path: Path) -> None:
    proc = hloforge_cli(env_with(example_site), "verify", "hloforge-groupnorm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in proc.stdout.splitlines() if "hloforge-groupnorm" in r]
    assert len(rows) == 5 and all(r.endswith("pass") for r in rows), proc.stdout
    assert proc.stdout.splitlines()[-1] == "verify: 5 passed, 0 failed"

    # The same distribution with a wrong backward, shadowing any installed copy (first on the path).
    install_example(tmp_path, break_backward=True)
    proc = hloforge_cli(env_with(tmp_path), "verify", "groupNorm", "huber")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = proc.stdout.splitlines()
    fails = [r for r in rows if r.endswith("FAIL")]
    assert len(fails) == 2 and all(re.match(r"loss +huber +hloforge-groupnorm ", r) for r in fails), proc.stdout
    assert sum(1 for r in rows if re.match(r"layer +groupNorm .* pass$", r)) == 3
    assert rows[-1] == "verify: 3 passed, 2 failed"


def test_example_spec_trains(example_site: Path, tmp_path: Path) -> None:
    spec = example_site / "hloforge_groupnorm" / "nets" / "groupnorm_cnn.toml"
    proc = hloforge_cli(env_with(example_site), "train", str(spec), "--epochs", "2", "--lr", "0.01",
                        "--run-dir", str(tmp_path / "run"), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tops = [float(m) for m in re.findall(r"top-1 ([\d.]+)%", proc.stdout)]
    assert len(tops) >= 2 and tops[-1] >= 85.0, proc.stdout  # ~96%; 10 classes is 10% by chance
    assert (tmp_path / "run" / "checkpoint.safetensors").exists()


def test_example_gate_under_pytest(example_site: Path) -> None:
    """`pytest --hloforge-gate` in the example's own tree: its tests and the gate of its plugins."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hloforge-gate", "-q",
                           "-k", "hloforge-groupnorm or test_"], cwd=EXAMPLE, env=env_with(example_site),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    n_tests = len(re.findall(r"^def test_", (EXAMPLE / "tests" / "test_groupnorm.py").read_text(), re.M))
    assert f"{n_tests + 5} passed" in out, out


# ------------------------------------------------------------------ the docs
def doc_blocks(path: Path, lang: str = "python") -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), re.S | re.M)


def test_docs_python_examples_run_and_their_plugins_pass_the_gate() -> None:
    """Every ```python block of docs/plugins.md runs, in order, in one namespace; the components it
    defines register, and the layer, loss and optimizer pass the gate."""
    from hloforge.testing import gate_cases

    blocks = doc_blocks(DOCS / "plugins.md")
    assert len(blocks) >= 5
    ns: dict[str, object] = {"__name__": "hloforge_docs_example"}
    for code in blocks:
        exec(compile(code, str(DOCS / "plugins.md"), "exec"), ns)
    import types

    mod = types.ModuleType("hloforge_docs_example")
    mod.__dict__.update(ns)
    reg = Registry(extra_plugins=((mod, "hloforge-docs"),))
    assert not reg.broken
    mine = {e.kind: e.name for e in reg.entries() if e.distribution == "hloforge-docs"}
    assert set(mine) == {"layer", "loss", "optimizer", "backend", "dataset", "callback"}, mine
    cases = [c for c in gate_cases(reg) if c.distribution == "hloforge-docs"]
    assert {c.kind for c in cases} == {"layer", "loss", "optimizer"}
    for case in cases:
        r = case.run()
        assert r.passed, r.row()
    data = reg.make("dataset", mine["dataset"])
    x, y = data.arrays("train")
    assert x.shape[0] == y.shape[0] > 0
    from hloforge.callbacks import Callback

    stop = reg.make("callback", mine["callback"], loss=0.5)
    stop.model = types.SimpleNamespace(stop_training=False)
    stop.on_epoch_end(1, {"loss": 0.4})
    assert isinstance(stop, Callback) and stop.model.stop_training


def test_docs_name_every_entry_point_group() -> None:
    """A plugin author learns the groups from plugins.md and hookspecs.md: each kind's group is there."""
    from hloforge.core.registry import KINDS

    for doc in ("plugins.md", "hookspecs.md"):
        text = (DOCS / doc).read_text()
        assert [g for g, _, _ in KINDS.values() if f"`{g}`" not in text] == [], doc


def test_hookspecs_doc_is_generated_from_the_hookspecs() -> None:
    proc = subprocess.run([sys.executable, str(DOCS / "gen_hookspecs.py"), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (DOCS / "hookspecs.md").read_text()
    from hloforge.core import hookspecs

    for name in dir(hookspecs):
        if name.startswith("hloforge_"):
            assert f"`{name}(" in text
