"""Weights of the researcher's own in another form than the one asked for (`Model.params = …`, `--init`): one
line saying how they differ and what is expected, not a line about something else."""

from __future__ import annotations

import pickle

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


def test_statistics_assigned_after_the_weights_reach_an_ema_models_shadow() -> None:
    # api.md's order (params, then state's stat/… tensors) on a model with an EMA shadow: the shadow, which
    # predict and evaluate score by default, kept its initial BatchNorm statistics (mean 0, variance 1), and
    # an imported resnet18's logits came out 0.7 off PyTorch's. Now it takes the assigned ones.
    net = hf.NetSpec("bn", (6,), [hf.layers.Dense(5), hf.layers["batchNorm"](), hf.layers.Dense(3)], 3)
    rng = np.random.default_rng(0)
    plain = hf.Model(net, seed=0)
    stats = {n: rng.uniform(0.5, 2.0, w.shape).astype(np.float32)
             for n, w in plain.state.items() if n.startswith("stat/")}
    plain.state = stats
    averaged = hf.Model(net, seed=1, ema=0.99)
    averaged.params = plain.params
    averaged.state = stats
    x = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(averaged.predict(x), plain.predict(x))  # region auto: the shadow
    np.testing.assert_array_equal(averaged.predict(x, region="live"), plain.predict(x))
    # the shadow's own statistics, when given, are its own
    shadow = {f"stat/E/{n.removeprefix('stat/')}": np.ones_like(w) for n, w in stats.items()}
    averaged.state = {**stats, **shadow}
    assert all(np.array_equal(averaged.state[n], w) for n, w in shadow.items())


def test_init_from_a_pytorch_export_directory_says_what_it_holds(tmp_path) -> None:
    # Before: "a directory holding neither checkpoint.safetensors (a run) nor weights.safetensors (an export)",
    # of a directory `hloforge export --format torchvision` wrote, with no word of its model.safetensors.
    import os

    from hloforge.interop import export_run
    from hloforge.train.trainer import TrainConfig, train

    run = hf.Model("resnet18", classes=10, input=(3, 32, 32)).save(str(tmp_path / "run"))
    exported = export_run(run, str(tmp_path / "pt"), "torchvision", log=lambda s: None)
    with pytest.raises(DataError) as e:
        train(TrainConfig(net="resnet18", classes=10, input=(3, 32, 32), data_options=("size=32", "channels=3"),
                          epochs=1, init=exported, run_dir=str(tmp_path / "ft")), progress=False)
    text = str(e.value)
    assert len(text.splitlines()) == 1 and "its model.safetensors is a PyTorch state dict" in text
    assert f"--init the run it was exported from, or map it with `hloforge import-weights SOURCE " \
           f"{os.path.join(exported, 'model.safetensors')} --out FILE.safetensors`" in text


def test_load_of_a_weights_file_or_an_export_says_where_weights_go(tmp_path) -> None:
    # Before: a weights file got "pass ., the directory holding it" (no run there), an export directory
    # "checkpoint …/checkpoint.safetensors does not exist".
    from safetensors.numpy import save_file

    from hloforge.interop import export_run

    run = hf.Model("mnist-linear").save(str(tmp_path / "run"))
    exported = export_run(run, str(tmp_path / "exported"), log=lambda s: None)
    save_file({f"param/{k}": v for k, v in hf.Model("mnist-linear").params.items()}, str(tmp_path / "w.safetensors"))
    for given, said in ((tmp_path / "w.safetensors", "is a file: a weights file's param/… and stat/… tensors are "
                                                     "assigned to a Model's params and state by name instead"),
                        (exported, "holds no checkpoint.safetensors but weights.safetensors, an export: a weights "
                                   "file's param/… and stat/… tensors")):
        with pytest.raises(DataError) as e:
            hf.load(given)
        assert said in str(e.value) and "the directory holding it" not in str(e.value), str(e.value)
    with pytest.raises(DataError, match=r"is a file \(pass .*run, the directory holding it\)"):
        hf.load(tmp_path / "run" / "checkpoint.safetensors")


def test_a_head_of_another_class_count_says_to_leave_it_out() -> None:
    # ImageNet-style weights (here a net's at 7 classes) onto a model of 10: before, the line named the shape
    # alone, with no word that the rest can be taken without the head, as --init takes them.
    def net(classes: int) -> hf.NetSpec:
        return hf.NetSpec("mlp", (784,), [hf.layers.Dense(512), hf.layers.Dense(512), hf.layers.Dense(classes)],
                          classes)

    theirs = hf.Model(net(7), seed=2).params
    model = hf.Model(net(10), seed=0)
    with pytest.raises(DataError) as e:
        model.params = theirs
    assert str(e.value).endswith("(the net's head, of another class count there: leave ['2.w', '2.b'] out to keep "
                                 "this model's own, as --init re-initialises it)")
    model.params = {n: w for n, w in theirs.items() if not n.startswith("2.")}
    assert np.array_equal(model.params["1.w"], theirs["1.w"])
    with pytest.raises(DataError, match=r"params\['0.w'\] has shape \[10, 64\], expected \[784, 512\]$"):
        model.params = {"0.w": np.zeros((10, 64), np.float32)}  # not the head: no such advice


def test_item_assignment_on_params_sets_the_models_weight() -> None:
    """Before: `model.params["0.w"] = w` set a copy's entry alone, so the model trained on as before, silently."""
    model = hf.Model("mnist-linear")
    w = np.full_like(model.params["0.w"], 0.5, dtype=np.float64)  # read as float32, as assigning the mapping reads it
    model.params["0.w"] = w
    got = model.params["0.w"]
    assert got.dtype == np.float32 and np.all(got == 0.5)
    model.params.update({"0.b": np.ones_like(model.params["0.b"])})
    assert np.all(model.params["0.b"] == 1)
    model.state["m/0.b"] = np.full_like(model.state["m/0.b"], 0.25)  # the optimizer state's the same way
    assert np.all(model.state["m/0.b"] == 0.25)


def test_item_assignment_on_params_is_checked_as_the_mapping_is() -> None:
    model = hf.Model("mnist-linear")
    before = model.params["0.w"]
    for bad, said in [(np.zeros((3, 3), np.float32), "params['0.w'] has shape [3, 3], expected"),
                      (np.zeros(before.shape, np.int32), "params['0.w'] has dtype int32, expected a float one")]:
        with pytest.raises(DataError) as e:
            model.params["0.w"] = bad
        assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(DataError, match="params: no tensor named '9.w'"):
        model.params["9.w"] = before
    assert np.array_equal(model.params["0.w"], before)  # a refused assignment changes nothing


def test_the_edited_params_assigned_back_and_their_pickle_are_plain() -> None:
    model, other = hf.Model("mnist-linear", seed=1), hf.Model("mnist-linear", seed=2)
    p = model.params
    p["0.w"] = np.zeros_like(p["0.w"])
    other.params = p  # the edited copy assigned to a model, as before
    assert np.all(other.params["0.w"] == 0) and np.array_equal(other.params["0.b"], model.params["0.b"])
    plain = pickle.loads(pickle.dumps(p))
    assert type(plain) is dict and np.all(plain["0.w"] == 0)
