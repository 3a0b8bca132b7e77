"""A running variance below 0 is no statistic any run makes, and it scored plausibly wrong: the eval's rsqrt of
it is NaN, the next ReLU turns that into zeros, and a BatchNorm net predicted class 0 for every row with no
word. Every way running statistics come in refuses one in a line naming it (StatSlot.nonnegative): a
checkpoint (eval, load, resume), `Model.state`, `--init`, import-weights, and a ForwardSession's inputs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import hloforge as hf
from hloforge.cli import main
from hloforge.core.errors import DataError
from hloforge.interop import map_state_dict, torch_state_dict
from hloforge.train.config import CHECKPOINT
from hloforge.train.session import ForwardSession, make_backend
from hloforge.zoo import get_net

VAR = "stat/1.var"  # the BatchNorm's running variance in bn_net's checkpoints


def bn_net() -> hf.NetSpec:
    return hf.NetSpec("bn-var", (4,), [hf.layers.Dense(8), hf.layers.BatchNorm(), hf.layers.Dense(3)], 3)


def test_a_negative_variance_assigned_to_state_is_refused_and_the_state_kept() -> None:
    model = hf.Model(bn_net(), seed=0)
    before = model.state[VAR]
    with pytest.raises(DataError, match=r"^state: statistic 1\.var holds 8 negative value\(s\); expected a "
                                        r"variance, ≥ 0$"):
        model.state = {VAR: -0.5 - np.abs(before)}
    assert np.array_equal(model.state[VAR], before)


def digits_bn_net(tmp_path) -> str:
    """A spec file of a BatchNorm net that fits digits (its running variance: stat/2.var)."""
    path = tmp_path / "bn.json"
    path.write_text(json.dumps({"name": "bn-digits", "input_shape": [1, 28, 28], "num_classes": 10, "layers": [
        {"kind": "flatten"}, {"kind": "dense", "units": 8}, {"kind": "batchNorm"}, {"kind": "dense", "units": 10}]}))
    return str(path)


def test_a_checkpoint_holding_a_negative_variance_is_refused_by_eval_and_load(tmp_path, capsys) -> None:
    run = hf.Model(digits_bn_net(tmp_path), seed=0).save(str(tmp_path / "run"), data="digits")
    path = f"{run}/{CHECKPOINT}"
    with safe_open(path, "np") as f:
        meta = f.metadata()
    tensors = load_file(path)
    tensors["stat/2.var"] = -tensors["stat/2.var"]
    save_file(tensors, path, metadata=meta)
    said = (r"tensor stat/2\.var holds 8 negative value\(s\), expected a variance, ≥ 0; tampered, or not written "
            "by hloforge")
    with pytest.raises(DataError, match=said + "$"):
        hf.load(run)
    assert main(["eval", run]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(said, err), err


def test_init_from_weights_with_a_negative_variance_is_refused(tmp_path) -> None:
    from hloforge.train.trainer import TrainConfig, train

    net = digits_bn_net(tmp_path)
    spec = get_net(net)
    weights = {f"param/{n}": p for (n, _), p in zip(spec.params(), spec.init_params(0), strict=True)}
    weights.update({f"stat/{n}": s.initial() for n, s in spec.stats()})
    weights["stat/2.var"] = -weights["stat/2.var"]
    init = str(tmp_path / "w.safetensors")
    save_file(weights, init)
    with pytest.raises(DataError, match=r"^--init .*w\.safetensors: statistic 2\.var holds 8 negative value\(s\)"):
        train(TrainConfig(net=net, init=init, epochs=1, run_dir=str(tmp_path / "run")), log=lambda s: None,
              progress=False)


def test_a_pytorch_state_dict_with_a_negative_running_var_is_not_imported() -> None:
    spec = get_net("resnet18", input=(3, 32, 32))
    sd = torch_state_dict("torchvision:resnet18", spec, spec.init_params(0), [s.initial() for _, s in spec.stats()])
    sd["layer1.0.bn2.running_var"] = sd["layer1.0.bn2.running_var"] - 2.0
    with pytest.raises(DataError, match=r"negative value\(s\); expected a variance, ≥ 0$"):
        map_state_dict("torchvision:resnet18", sd, input=(3, 32, 32))


def test_a_forward_sessions_negative_running_variance_is_refused_not_scored_as_zeros() -> None:
    spec = bn_net()
    session = ForwardSession(spec, 4, make_backend("xla"))
    stats = [s.initial() for _, s in spec.stats()]
    x = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    assert np.isfinite(session.logits(x, [*spec.init_params(0), *stats])).all()
    stats[1] = -stats[1]
    with pytest.raises(DataError, match=r"^eval: statistic 1\.var holds 8 negative value\(s\)"):
        session.logits(x, [*spec.init_params(0), *stats])
