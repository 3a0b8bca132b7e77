"""Own weights in, models out: the state dicts users bring as their training scripts save them (a checkpoint
dict, a Lightning module's prefix, another variant's weights, an empty file, a head of other classes) and the
weights `hloforge export` writes for a run with an EMA shadow. The state dicts are made without torch (the
exporter's own `torch_state_dict` of a zoo net's init) except where a pickle is the point: those tests skip
without torch."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hloforge.core.errors import DataError
from hloforge.interop import export_run, import_weights, map_state_dict, read_state_dict, torch_state_dict
from hloforge.interop.importer import MAX_LISTED
from hloforge.zoo import get_net

INPUT = (3, 32, 32)


def _state_dict(source: str, net: str, classes: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """`source`'s PyTorch state dict holding the zoo net's init (seed `seed`), as numpy arrays."""
    spec = get_net(net, classes=classes, input=INPUT)
    return torch_state_dict(source, spec, spec.init_params(seed), [s.initial() for _, s in spec.stats()])


def test_a_lightning_modules_prefix_on_every_name_is_dropped() -> None:
    sd = _state_dict("torchvision:resnet18", "resnet18")
    got = map_state_dict("torchvision:resnet18", {f"model.{k}": v for k, v in sd.items()}, input=INPUT)
    want = map_state_dict("torchvision:resnet18", sd, input=INPUT)
    assert all(np.array_equal(a, b) for a, b in zip(got.params, want.params, strict=True))


def test_a_lightning_module_holding_more_than_the_net_is_refused_naming_only_the_rest() -> None:
    """A Lightning module's `model.` net beside a loss's class weights (`criterion.weight`): the net's names are
    matched under the prefix and the loss's tensor is the one problem listed, not every net tensor as missing."""
    sd = {f"model.{k}": v for k, v in _state_dict("torchvision:resnet18", "resnet18").items()}
    sd["criterion.weight"] = np.ones(10, np.float32)
    with pytest.raises(DataError) as e:
        map_state_dict("torchvision:resnet18", sd, input=INPUT)
    assert str(e.value).splitlines()[1:] == ["  unused: criterion.weight [10]"]


def test_a_module_holding_the_net_and_an_ema_copy_is_refused_asking_which() -> None:
    """`model.` and `ema_model.` both hold the net: one line naming both prefixes and how to keep one (before: every
    net tensor listed as missing, the prefixes unsaid)."""
    sd = _state_dict("torchvision:resnet18", "resnet18")
    both = {**{f"model.{k}": v for k, v in sd.items()}, **{f"ema_model.{k}": v for k, v in sd.items()}}
    with pytest.raises(DataError, match=r"^the state dict holds the net under 2 prefixes \(ema_model\., model\.: "):
        map_state_dict("torchvision:resnet18", both, input=INPUT)


def test_a_prefix_that_does_not_make_the_names_match_is_kept_and_refused() -> None:
    sd = _state_dict("torchvision:resnet18", "resnet18")
    with pytest.raises(DataError, match=r"missing: conv1\.weight"):
        map_state_dict("torchvision:resnet18", {f"model.backbone.{k}": v for k, v in sd.items()}, input=INPUT)


def test_another_variants_state_dict_is_named_and_the_listing_is_capped() -> None:
    sd = _state_dict("torchvision:resnet34", "resnet34")
    with pytest.raises(DataError) as e:
        map_state_dict("torchvision:resnet18", sd, input=INPUT)
    text = str(e.value)
    assert "its names are those of torchvision:resnet34: pass that SOURCE" in text.splitlines()[0]
    assert len(text.splitlines()) == 1 + MAX_LISTED + 1 and text.endswith(f"and {80 - MAX_LISTED} more")


def test_an_empty_weights_file_is_one_line(tmp_path) -> None:
    for name in ("w.pth", "w.safetensors"):
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(DataError, match=r"is empty; expected a saved state dict$"):
            read_state_dict(str(tmp_path / name))


def test_a_directory_for_the_weights_file_says_so_and_names_the_files_in_it(tmp_path) -> None:
    """An export --format torchvision's folder passed whole: a directory, its state dict named (not 'does not
    exist', which it does)."""
    (tmp_path / "r18-torch").mkdir()
    with pytest.raises(DataError, match=r"r18-torch is a directory; expected a state dict file \(\.safetensors, or "
                       r"torch\.save's \.pth\)$"):
        read_state_dict(str(tmp_path / "r18-torch"))
    (tmp_path / "r18-torch" / "model.safetensors").write_bytes(b"")
    with pytest.raises(DataError, match=r"is a directory; .* \(it holds model\.safetensors: pass the one you mean\)$"):
        import_weights("torchvision:resnet18", str(tmp_path / "r18-torch"), str(tmp_path / "w.safetensors"))
    assert not (tmp_path / "w.safetensors").exists()


def test_an_empty_state_dict_is_said_as_that_not_as_every_weight_missing(tmp_path) -> None:
    """`torch.save({}, f)`, or a safetensors file of no tensor: one clause, not 102 'missing:' lines cut at 12."""
    from safetensors.numpy import save_file

    torch = pytest.importorskip("torch")
    torch.save({}, tmp_path / "empty.pth")
    save_file({}, str(tmp_path / "empty.safetensors"))
    for name in ("empty.pth", "empty.safetensors"):
        with pytest.raises(DataError, match=r"holds an empty state dict; expected the net's tensors by name$"):
            import_weights("torchvision:resnet18", str(tmp_path / name), str(tmp_path / "w.safetensors"))
    assert not (tmp_path / "w.safetensors").exists()


def test_a_head_of_other_classes_than_the_dataset_says_how_to_fine_tune(tmp_path) -> None:
    from safetensors.numpy import save_file

    file = str(tmp_path / "r18_4.safetensors")
    save_file(_state_dict("torchvision:resnet18", "resnet18", classes=4), file)
    with pytest.raises(DataError) as e:
        import_weights("torchvision:resnet18", file, str(tmp_path / "run"), input=INPUT, data="digits",
                       data_options=("size=32", "channels=3"), log=lambda s: None)
    text = str(e.value)
    assert "pass --classes" not in text  # import-weights has no such option: the trainer's advice does not apply
    assert "`hloforge train resnet18 --init FILE.safetensors --classes 10 --input 3,32,32 --data digits" in text
    assert "dataset 'digits' has 10 classes, net 'resnet18' has 4" in text and "--init FILE.safetensors" in text
    assert not os.path.exists(tmp_path / "run")


def test_init_from_a_pytorch_state_dict_in_safetensors_points_to_import_weights(tmp_path) -> None:
    from safetensors.numpy import save_file

    from hloforge.train.trainer import TrainConfig, train

    file = str(tmp_path / "resnet18.safetensors")
    save_file(_state_dict("torchvision:resnet18", "resnet18"), file)
    with pytest.raises(DataError, match=r"holds no param/… or stat/… tensors \(its names are like 'fc\.bias'\); a "
                                        r"torchvision / timm state dict is mapped onto its zoo net first: `hloforge "
                                        r"import-weights SOURCE .*resnet18\.safetensors --out FILE\.safetensors`"):
        train(TrainConfig(net="resnet-mini", input=(1, 12, 12), data_options=("size=12",), epochs=1, batch=128,
                          init=file, run_dir=str(tmp_path / "run")), progress=False)
    assert not os.path.exists(tmp_path / "run" / "checkpoint.safetensors")


# ------------------------------------------------------------------ PyTorch pickles as training scripts save them
def _pickled(tmp_path, obj: object) -> str:
    torch = pytest.importorskip("torch", reason="reading a .pth needs torch")
    path = str(tmp_path / "ckpt.pth")
    torch.save(obj, path)
    return path


def test_a_checkpoint_dict_under_model_imports_the_live_model_not_its_ema(tmp_path) -> None:
    torch = pytest.importorskip("torch", reason="reading a .pth needs torch")
    live, ema = (_state_dict("torchvision:resnet18", "resnet18", seed=s) for s in (0, 1))
    path = _pickled(tmp_path, {"model": {k: torch.from_numpy(v) for k, v in live.items()},
                               "model_ema": {k: torch.from_numpy(v) for k, v in ema.items()}, "epoch": 3})
    sd = read_state_dict(path)
    assert sorted(sd) == sorted(live) and all(np.array_equal(sd[k], live[k]) for k in live)


def test_a_checkpoint_dict_with_no_state_dict_where_scripts_put_it_is_one_line(tmp_path) -> None:
    torch = pytest.importorskip("torch", reason="reading a .pth needs torch")
    path = _pickled(tmp_path, {"net": {"conv1.weight": torch.zeros(1)}, "optimizer": {}})
    with pytest.raises(DataError, match=r"a checkpoint dict \(keys \['net', 'optimizer'\]\) with no state dict under "
                                        r"'state_dict' / 'model_state_dict' / 'model'; save the one you mean alone: "
                                        r"torch.save\(ckpt\['net'\], FILE\)$"):
        read_state_dict(path)


# ------------------------------------------------------------------ models out
def test_the_export_of_an_ema_run_holds_the_weights_eval_scores(tmp_path) -> None:
    from safetensors.numpy import load_file

    from hloforge.commands.opening import open_checkpoint
    from hloforge.train.trainer import TrainConfig, train

    run = str(tmp_path / "run")
    train(TrainConfig(net="resnet-mini", input=(1, 12, 12), data_options=("size=12",), epochs=1, batch=128,
                      augment=False, ema=0.5, run_dir=run), progress=False)
    oc = open_checkpoint(run, log=lambda s: None, needs_data=False)
    names = [f"param/{n}" for n, _ in oc.spec.params()] + [f"stat/{n}" for n, _ in oc.spec.stats()]
    for region, want in (("auto", "ema"), ("live", "live")):
        out = str(tmp_path / region)
        export_run(run, out, log=lambda s: None, region=region)
        _, params, stats = oc.region_weights(want)
        got = load_file(os.path.join(out, "weights.safetensors"))
        assert all(np.array_equal(got[n], a) for n, a in zip(names, [*params, *stats], strict=True))
        with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
            assert json.load(f)["region"] == want
    live = load_file(os.path.join(tmp_path, "live", "weights.safetensors"))
    shadow = load_file(os.path.join(tmp_path, "auto", "weights.safetensors"))
    assert not np.array_equal(shadow["param/0.w"], live["param/0.w"])  # the shadow is not θ: the test can tell
    # the command line: the default is the shadow too, and --region live picks θ in the PyTorch format as well
    from hloforge.cli import EXIT_OK, main

    assert main(["export", run, "--out", str(tmp_path / "cli")]) == EXIT_OK
    assert np.array_equal(load_file(str(tmp_path / "cli" / "weights.safetensors"))["param/0.w"], shadow["param/0.w"])
    assert main(["export", run, "--out", str(tmp_path / "cli_live"), "--region", "live"]) == EXIT_OK
    assert np.array_equal(load_file(str(tmp_path / "cli_live" / "weights.safetensors"))["param/0.w"],
                          live["param/0.w"])


def test_an_export_that_meets_a_full_disk_is_one_line_and_leaves_no_half_export(tmp_path) -> None:
    """A disk that filled up mid-export (here: a file-size limit, EFBIG) was an internal error (exit 4,
    safetensors' SerializeError) that left forward.mlir behind, and the same --out was then refused as
    already holding an export. Now: one line, nothing left, and the same command works once there is room."""
    import subprocess
    import sys

    from hloforge.cli import main
    from hloforge.train.trainer import TrainConfig, train

    run, out = str(tmp_path / "run"), str(tmp_path / "out")
    train(TrainConfig(net="mnist-linear", epochs=1, run_dir=run), progress=False)
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))\n"
            f"from hloforge.cli import main\nsys.exit(main(['export', {run!r}, '--out', {out!r}]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HLOFORGE_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 3, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("hloforge: error: could not write exported weights ") and "export again" in p.stderr
    assert not os.path.exists(out)
    assert main(["export", run, "--out", out]) == 0
    assert sorted(os.listdir(out)) == ["forward.mlir", "manifest.json", "weights.safetensors"]
    (tmp_path / "file").write_text("x")
    assert main(["export", run, "--out", str(tmp_path / "file")]) == 3


@pytest.mark.parametrize("value, said", [
    (np.int32(3), "has dtype int32, expected a float one"),
    (np.complex64(1 + 2j), "has dtype complex64, expected a float one"),
    (np.float32(np.nan), "holds NaN or inf, expected finite numbers"),
    (np.float64(1e300), "holds values beyond float32's range"),
])
def test_a_tensor_no_float32_weight_can_be_is_listed_not_cast(value, said) -> None:
    """An integer (a quantized export's), complex, NaN or beyond-float32 tensor is a problem listed with the rest,
    not cast into the net's weights: int 3 read as 3.0, NaN kept, 1e300 read as inf."""
    sd = _state_dict("torchvision:resnet18", "resnet18")
    sd["fc.bias"] = np.full(sd["fc.bias"].shape, value)
    with pytest.raises(DataError) as e:
        map_state_dict("torchvision:resnet18", sd, input=INPUT)
    lines = str(e.value).splitlines()
    assert "1 problem(s); nothing written" in lines[0] and len(lines) == 2
    assert lines[1].startswith(f"  value: fc.bias {said}")



def test_a_safetensors_tensor_numpy_has_no_dtype_for_is_one_line(tmp_path) -> None:
    """A float8 tensor (safetensors F8_E4M3, as a quantized model saves it): named, not numpy's AttributeError."""
    sd = {k: v for k, v in _state_dict("torchvision:resnet18", "resnet18").items() if k != "fc.bias"}
    from safetensors.numpy import save

    blob = save(sd)  # then fc.bias appended as F8_E4M3: a header entry and 10 bytes
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    header["fc.bias"] = {"dtype": "F8_E4M3", "shape": [10], "data_offsets": [end, end + 10]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "w.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + n:] + bytes(10))
    with pytest.raises(DataError, match=r"w\.safetensors: tensor 'fc\.bias' has dtype F8_E4M3, which numpy cannot "
                       r"hold; expected float16, bfloat16, float32 or float64 tensors$"):
        read_state_dict(str(tmp_path / "w.safetensors"))


def test_a_state_dict_or_weights_file_where_a_checkpoint_is_expected_says_what_it_is(tmp_path) -> None:
    """`hloforge export` / `eval` of the user's .pth: named a PyTorch pickle and pointed at import-weights (not
    'truncated or not a safetensors file'); of a bare weights file: pointed at --init, not 'format None'."""
    from safetensors.numpy import save_file

    pth = tmp_path / "resnet18.pth"
    pth.write_bytes(b"PK\x03\x04" + bytes(60))  # torch.save's zip archive, as far as its first bytes go
    with pytest.raises(DataError, match=r"resnet18\.pth is a PyTorch pickle, not an hloforge checkpoint .*`hloforge "
                       r"import-weights SOURCE .*resnet18\.pth --out DIR`$"):
        export_run(str(pth), str(tmp_path / "out"))
    bare = str(tmp_path / "w.safetensors")
    save_file({"param/0.w": np.zeros(2, np.float32)}, bare, metadata={"source": "torchvision:resnet18"})
    with pytest.raises(DataError, match=r"without an hloforge checkpoint's metadata: a weights file, which starts a "
                       r"run with `hloforge train NET --init .*w\.safetensors`"):
        export_run(bare, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_hloforges_own_weights_given_to_import_weights_say_so(tmp_path) -> None:
    """import-weights of a run's checkpoint.safetensors (or an export's weights) listed every torchvision tensor as
    missing, over 14 lines, not saying the file was hloforge's own; now one line pointing at --init."""
    import hloforge as hf
    from hloforge.interop.importer import import_weights

    hf.Model("mnist-linear").save(str(tmp_path / "run"))
    ckpt = str(tmp_path / "run" / "checkpoint.safetensors")
    with pytest.raises(DataError) as e:
        import_weights("torchvision:resnet18", ckpt, str(tmp_path / "out"))
    assert str(e.value) == (f"weights file {ckpt} holds hloforge's own weights (tensors named param/…), not a "
                            "PyTorch state dict; expected a torchvision/timm state dict (hloforge's own start a run "
                            f"as they are: `hloforge train NET --init {ckpt}`)")
    assert not (tmp_path / "out").exists()


def test_an_import_that_meets_a_full_disk_is_one_line_and_leaves_no_half_run(tmp_path) -> None:
    """import-weights into a run directory on a disk that filled up at the checkpoint left config.toml alone there
    (no run: eval refused it) and said 'free space and --resume', a run it had not made. Now: one line saying to
    import again, nothing left, and the same command works once there is room."""
    import subprocess
    import sys

    from safetensors.numpy import save_file

    from hloforge.cli import EXIT_OK, main

    sd, out = str(tmp_path / "sd.safetensors"), str(tmp_path / "run")
    save_file(_state_dict("torchvision:resnet18", "resnet18"), sd)
    argv = ["import-weights", "torchvision:resnet18", sd, "--input", "3,32,32", "--data", "digits", "--data-opt",
            "size=32", "--data-opt", "channels=3", "--out", out]
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
            f"from hloforge.cli import main\nsys.exit(main({argv!r}))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HLOFORGE_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 3, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.strip().endswith("free space and import again")
    assert not os.path.exists(out)
    assert main(argv) == EXIT_OK and sorted(os.listdir(out)) == ["checkpoint.safetensors", "config.toml"]
