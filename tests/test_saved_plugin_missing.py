"""A model saved with a third-party plugin's layer, opened where that plugin is not installed: one line naming
the layer and the distribution to install, from hf.load and the CLI alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from plugin_site import env_with, fake_dist, installed_in_process, layer_module

import hloforge as hf
from hloforge.core.errors import DataError
from hloforge.core.registry import default_registry


@pytest.fixture
def site(tmp_path: Path) -> Path:
    where = tmp_path / "site"
    where.mkdir()
    fake_dist(where, "hloforge-doubled", {"hf_doubled": layer_module("doubled")},
              {"hloforge.layers": {"doubled": "hf_doubled"}})
    return where


@pytest.fixture
def saved(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model of the plugin's layer, fit and saved with the plugin installed; then the plugin is gone."""
    run = tmp_path / "run"
    steps = installed_in_process(site, tmp_path, monkeypatch)
    next(steps)
    net = hf.NetSpec("doubled-net", (4,), [hf.layers["doubled"](), hf.layers.Dense(3)], 3)
    rng = np.random.default_rng(0)
    m = hf.Model(net, seed=0)
    m.fit(rng.standard_normal((32, 4)).astype(np.float32), rng.integers(0, 3, 32), epochs=1, batch_size=16,
          verbose=False)
    m.save(str(run))
    assert hf.load(str(run)).params.keys() == m.params.keys()  # with the plugin installed it loads
    next(steps, None)  # the registry dropped
    monkeypatch.undo()  # the site off sys.path: the plugin uninstalled
    default_registry.cache_clear()
    return run


SAID = ("checkpoint {file}: its net uses layer 'doubled' of plugin hloforge-doubled 0.1, not installed here; "
        "expected the plugin the run was trained with (pip install hloforge-doubled)")


def test_a_saved_model_of_an_uninstalled_plugin_names_the_plugin_to_install(saved: Path, tmp_path: Path) -> None:
    """Before: 'checkpoint …: layer 0: unknown layer 'doubled'; registered: batchNorm (hloforge), … (48 layers)',
    saying neither that the layer was a plugin's nor which distribution to install."""
    file = saved / "checkpoint.safetensors"
    with pytest.raises(DataError) as e:
        hf.load(str(saved))
    assert str(e.value) == SAID.format(file=file)
    done = subprocess.run([sys.executable, "-m", "hloforge", "export", str(saved), "--out", str(tmp_path / "e")],
                          env=env_with(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and done.stderr.strip() == f"hloforge: error: {SAID.format(file=file)}"


def test_a_net_of_hloforge_layers_records_no_plugin(tmp_path: Path) -> None:
    """Only a plugin's layers are recorded: a net of hloforge's own writes the checkpoint it wrote before."""
    from safetensors import safe_open

    m = hf.Model(hf.NetSpec("own", (4,), [hf.layers.Dense(3)], 3))
    m.save(str(tmp_path / "own"))
    with safe_open(str(tmp_path / "own" / "checkpoint.safetensors"), "np") as f:
        assert "plugin_layers" not in (f.metadata() or {})


def test_the_recorded_plugin_is_its_distribution_and_version(site: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors import safe_open

    for _ in installed_in_process(site, tmp_path, monkeypatch):
        m = hf.Model(hf.NetSpec("doubled-net", (4,), [hf.layers["doubled"](), hf.layers.Dense(3)], 3))
        m.save(str(tmp_path / "run"))
        with safe_open(str(tmp_path / "run" / "checkpoint.safetensors"), "np") as f:
            said = json.loads((f.metadata() or {})["plugin_layers"])
        assert said == {"doubled": {"distribution": "hloforge-doubled", "version": "0.1"}}


def test_a_saved_model_whose_plugin_is_installed_but_fails_to_load_names_its_error_not_an_install(
        saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the line named the import error and still ended '(pip install hloforge-doubled)', advice that
    changes nothing for a plugin already installed."""
    broken = tmp_path / "broken"
    broken.mkdir()
    # a module of another name: the working one the fixture imported stays in sys.modules
    fake_dist(broken, "hloforge-doubled", {"hf_doubled_broken": "raise ImportError('needs libdoubled.so')"},
              {"hloforge.layers": {"doubled": "hf_doubled_broken"}})
    for _ in installed_in_process(broken, tmp_path, monkeypatch):
        with pytest.raises(DataError) as e:
            hf.load(str(saved))
    said = str(e.value)
    assert "of plugin hloforge-doubled 0.1, installed but not loaded (" in said and "needs libdoubled.so" in said, said
    assert "pip install" not in said and said.endswith("(hloforge-doubled loading without that error)"), said
