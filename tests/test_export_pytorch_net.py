"""`hloforge export --format torchvision|timm` of a net that scores otherwise than the PyTorch model at eval:
refused, not written as a state dict that loads with strict=True and gives other logits."""

from __future__ import annotations

import pytest

import hloforge as hf
from hloforge.core.errors import UnsupportedSpec
from hloforge.interop import export_run


def test_a_run_with_its_own_bn_eps_is_refused_for_pytorch_and_exported_for_hloforge(tmp_path) -> None:
    # Before: written; torchvision's resnet18 (ε 1e-5) loaded it and gave logits 34% off the run's.
    run = hf.Model("resnet18", classes=10, input=(3, 32, 32), bn_eps=0.1).save(str(tmp_path / "run"))
    with pytest.raises(UnsupportedSpec) as e:
        export_run(run, str(tmp_path / "pt"), "torchvision", log=lambda s: None)
    text = str(e.value)
    assert len(text.splitlines()) == 1 and "the variant's BN ε 0.1 (bn_eps)" in text and "--format hloforge" in text
    assert not (tmp_path / "pt").exists()
    export_run(run, str(tmp_path / "hf"), "hloforge", log=lambda s: None)  # its forward keeps the ε
    assert (tmp_path / "hf" / "weights.safetensors").exists()


def test_eval_identical_variants_and_the_nets_own_eps_still_export(tmp_path) -> None:
    for i, fields in enumerate(({"dropout": 0.2, "drop_path": 0.1}, {"bn_eps": 1e-5})):  # resnet18's own ε
        run = hf.Model("resnet18", classes=10, input=(3, 32, 32), **fields).save(str(tmp_path / f"run{i}"))
        export_run(run, str(tmp_path / f"pt{i}"), "torchvision", log=lambda s: None)
        assert (tmp_path / f"pt{i}" / "model.safetensors").exists()
