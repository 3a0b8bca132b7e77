"""The contracts module (hloforge.core.contracts): one home for the Layer, Loss, Optimizer, Backend and
Dataset contracts, re-exported from their old homes, documented member by member, importing nothing
above the core; built-in plugins satisfy them; readers fall back to the declared defaults."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from hloforge.core import contracts
from hloforge.core.errors import DataError
from hloforge.core.registry import default_registry

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _gen_hookspecs() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_hookspecs", DOCS / "gen_hookspecs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_old_homes_re_export_the_contracts():
    from hloforge.backends.base import Backend
    from hloforge.core.spec import Layer, Loss, layer_fields
    from hloforge.core.variant import Optimizer

    assert (Layer, Loss, Optimizer, Backend, layer_fields) == (
        contracts.Layer, contracts.Loss, contracts.Optimizer, contracts.Backend, contracts.layer_fields)


def test_contracts_import_nothing_above_the_core():
    code = "import sys, hloforge.core.contracts; print(' '.join(m for m in sys.modules if m.startswith('hloforge')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert [m for m in loaded if not (m == "hloforge" or m.startswith("hloforge.core"))] == []


def test_every_contract_member_is_documented():
    members = _gen_hookspecs().contract_members()
    names = [cls.name for cls, _ in members]
    assert {"Layer", "Loss", "Optimizer", "Backend", "Dataset"} <= set(names)
    undocumented = [f"{cls.name}.{title}" for cls, ms in members for title, doc in ms if doc == "(undocumented)"]
    assert undocumented == []
    # what the core, the trainer and the gate read is declared, not only got by getattr
    declared = {cls.name: {title.split("(")[0].split(":")[0] for title, _ in ms} for cls, ms in members}
    assert {"kind", "head_classes", "strategy_kinds", "out_shape", "forward", "reference", "gate_cases"} <= \
        declared["Layer"]
    assert {"name", "label_kind", "label_spec", "sample_labels"} <= declared["Loss"]
    assert {"name", "state", "scalars", "layout_free", "weight_decay"} <= declared["Optimizer"]
    assert {"name", "backend_name", "compile", "to_device", "to_host", "execute"} <= declared["Backend"]
    assert {"device_count", "execute_replicated", "fingerprint", "input_slot"} <= declared["BackendExtras"]
    assert {"name", "num_classes", "splits", "label_kind", "image_shape", "regions", "arrays"} <= declared["Dataset"]


@pytest.mark.parametrize("kind, base", [("layer", contracts.Layer), ("loss", contracts.Loss),
                                        ("optimizer", contracts.Optimizer), ("dataset", contracts.Dataset)])
def test_builtin_plugins_subclass_their_contract(kind, base):
    reg = default_registry()
    builtin = [e for e in reg.entries() if e.kind == kind and e.distribution == "hloforge"]
    assert builtin and [e.name for e in builtin if not issubclass(e.obj, base)] == []


def test_builtin_datasets_declare_known_label_kinds():
    kinds = {e.obj.label_kind for e in default_registry().entries() if e.kind == "dataset"}
    assert kinds <= {"class", "mask", "boxes", "tokens"} and "class" in kinds


class NoImageShape(contracts.Dataset):
    """A dataset that does not know its images' shape (imagenette, brats): the contract's None."""

    name = "noImageShape"
    num_classes = 2

    def arrays(self, split):
        return np.zeros((2, 1, 8, 8), np.float32), np.zeros(2, np.int32)


def test_a_ddpm_on_a_dataset_without_image_shape_is_one_clear_error():
    from hloforge.train.tasks import DiffusionTask

    last = types.SimpleNamespace(out_shape=(1, 8, 8))
    run = types.SimpleNamespace(
        spec=types.SimpleNamespace(name="ddpm", input_shape=(2, 8, 8), walk=lambda: [last], out_shape=last.out_shape),
        cfg=types.SimpleNamespace(data="noImageShape", diffusion_steps=1000, beta_start=1e-4, beta_end=0.02),
        data=NoImageShape())
    with pytest.raises(DataError, match=r"dataset 'noImageShape' gives \[\]"):
        DiffusionTask(run)


def test_every_layer_attribute_the_trainer_reads_is_declared():
    """A layer attribute train/ reads by name (`getattr(layer, "head_kind", None)`) is a contract member: declared on
    `contracts.Layer` with its default, so it is in docs/hookspecs.md for a plugin author. Before, `head_kind` and
    `time_conditioned` were set by the built-in heads and DDPM layers and read by train/detection.py and
    train/diffusion.py, and no contract or reference page named them."""
    import re

    train = Path(__file__).resolve().parent.parent / "hloforge" / "train"
    read = {name for path in train.glob("*.py") for name in re.findall(r'getattr\(layer, "(\w+)"', path.read_text())}
    assert read >= {"head_kind", "time_conditioned"}
    assert [name for name in sorted(read) if not hasattr(contracts.Layer, name)] == []
    assert (contracts.Layer.head_kind, contracts.Layer.time_conditioned) == (None, False)
