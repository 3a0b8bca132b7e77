"""Weights of the researcher's own in another form than the one asked for (`Model.params = …`, `--init`): one
line saying how they differ and what is expected, not a line about something else."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError


def test_the_nets_weights_without_the_variants_dropout_are_said_renumbered() -> None:
    # The variant's dropout before the head moves it from layer 2 to 3; before, the refusal named '2.b' and
    # listed names that did not show '3.w', so the user could not tell what the net wanted.
    plain = hf.Model("mnist-mlp", seed=0)
    dropped = hf.Model("mnist-mlp", seed=1, dropout=0.2)
    with pytest.raises(DataError) as e:
        dropped.params = plain.params
    text = str(e.value)
    assert len(text.splitlines()) == 1 and text.startswith("params: no tensor named '2.b'")
    assert "numbered otherwise" in text and "expected them renamed 2.… → 3.…" in text
    renamed = {n.replace("2.", "3.", 1) if n.startswith("2.") else n: w for n, w in plain.params.items()}
    dropped.params = renamed  # the renaming the line asks for is taken
    assert all(np.array_equal(dropped.params[n], w) for n, w in renamed.items())


def test_a_pytorch_state_dict_assigned_points_to_import_weights() -> None:
    # Before: "no tensor named 'bn1.bias'" and six zoo names, no word of how a torch state dict gets here.
    from hloforge.interop import torch_state_dict
    from hloforge.zoo import get_net

    spec = get_net("resnet18", classes=10, input=(3, 32, 32))
    sd = torch_state_dict("torchvision:resnet18", spec, spec.init_params(0), [s.initial() for _, s in spec.stats()])
    model = hf.Model("resnet18", classes=10, input=(3, 32, 32))
    for what, given in (("params", {k: v for k, v in sd.items() if "running" not in k}),
                        ("state", {k: v for k, v in sd.items() if "running" in k})):
        with pytest.raises(DataError) as e:
            setattr(model, what, given)
        text = str(e.value)
        assert len(text.splitlines()) == 1 and text.startswith(f"{what}: no tensor named ")
        assert "a PyTorch state dict's name: map it onto the zoo net first, with hloforge.interop.import_weights(" \
            in text


def test_init_from_model_params_saved_under_their_bare_names_says_the_prefix(tmp_path) -> None:
    # Before: "holds no param/… or stat/… tensors (its names are like '0.b'); a torchvision / timm state dict is
    # mapped onto its zoo net first: `hloforge import-weights …`", advice for a file that is no PyTorch one.
    import os

    from safetensors.numpy import save_file

    from hloforge.train.trainer import TrainConfig, train

    file = str(tmp_path / "mine.safetensors")
    save_file(hf.Model("mnist-linear", seed=3).params, file)
    with pytest.raises(DataError) as e:
        train(TrainConfig(net="mnist-linear", epochs=1, init=file, run_dir=str(tmp_path / "run")), progress=False)
    text = str(e.value)
    assert len(text.splitlines()) == 1 and "under their bare names" in text and "import-weights" not in text
    assert "{f'param/{k}': v for k, v in model.params.items()}" in text
    assert not os.path.exists(tmp_path / "run" / "checkpoint.safetensors")
