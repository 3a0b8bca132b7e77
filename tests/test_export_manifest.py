"""`hloforge export`'s manifest is enough to drive forward.mlir from another runtime: it names the one
output (shape, type, what it means) and how the dataset scales pixels into the input. Before, it named
the dataset alone, and a user fed raw pixels read hloforge's source for the scaling."""

from __future__ import annotations

import json
import os

import numpy as np

import hloforge as hf
from hloforge.backends.xla import default_client
from hloforge.datasets.digits import N_TRAIN, Digits, bundled_digits
from hloforge.interop.exporter import export_run

L = hf.layers


def test_following_the_export_manifest_alone_reproduces_predict_on_raw_pixels(tmp_path) -> None:
    spec = hf.NetSpec("raw-digits", (2, 8, 8), [L.Conv2d(out=4, k=3, act="relu"), L.BatchNorm(), L.GlobalAvgPool(),
                                                L.Dense(10)], 10)
    options = {"size": 8, "channels": 2}  # the digits as stored (8×8, 0..16), each grey image in 2 channels
    m = hf.Model(spec)
    m.fit(data="digits", data_options=options, epochs=1, batch_size=64, verbose=False)
    run, out = str(tmp_path / "run"), str(tmp_path / "export")
    m.save(run, data="digits", data_options=options)
    export_run(run, out, log=lambda s: None)
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    output = manifest["output"]
    assert {k: output[k] for k in ("name", "shape", "dtype", "kind")} == \
        {"name": "out", "shape": [1, 10], "dtype": "f32", "kind": "class"}
    assert "logits over the 10 classes" in output["meaning"]
    assert "class_names" not in manifest  # digits names none: none is made up
    pixels = manifest["preprocessing"]["pixels"]
    assert pixels["range"] == [0, 16] and len(pixels["mean"]) == len(pixels["std"]) == 2

    # the user's side: raw pixels, the manifest's scaling and argument order, the exported weights
    from safetensors.numpy import load_file

    raw, _ = bundled_digits()
    raw = raw[np.random.default_rng(0).permutation(len(raw))][N_TRAIN:N_TRAIN + 12]  # digits' test rows
    raw = np.repeat(raw[:, None], 2, axis=1)
    scale, mean, std = (np.float32(pixels["scale"]), np.float32(pixels["mean"]).reshape(-1, 1, 1),
                        np.float32(pixels["std"]).reshape(-1, 1, 1))
    weights = load_file(os.path.join(out, "weights.safetensors"))
    with open(os.path.join(out, "forward.mlir"), encoding="utf-8") as f:
        exe = default_client().compile(f.read())
    try:
        got = np.concatenate([np.asarray(exe.run([((img * scale - mean) / std)[None].astype(np.float32),
                                                  *(weights[n] for n in manifest["arguments"][1:])])[0])
                              for img in raw])
    finally:
        exe.close()
    assert got.shape == (len(raw), *output["shape"][1:])
    want = hf.load(run).predict(Digits(**options).arrays("test")[0][:len(raw)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert (got.argmax(1) == want.argmax(1)).all()


def test_export_makes_no_backend(tmp_path, monkeypatch) -> None:
    """Export compiles nothing, so the run's backend need not be installed (an IREE run exported where IREE is
    not): before, opening the run made its backend, and without the packages export was refused."""
    from hloforge.core.errors import BackendError
    from hloforge.train import session, trainer

    m = hf.Model(hf.NetSpec("tiny", (4,), [L.Dense(3)], 3))
    m.fit(np.zeros((8, 4), np.float32), np.arange(8) % 3, epochs=1, batch_size=4, verbose=False)
    m.save(str(tmp_path / "run"))

    def unavailable(*args, **kwargs):
        raise BackendError("the iree backend needs the IREE Python packages")

    for module in (session, trainer):
        monkeypatch.setattr(module, "make_backend", unavailable)
    export_run(str(tmp_path / "run"), str(tmp_path / "export"), log=lambda s: None)
    with open(tmp_path / "export" / "manifest.json", encoding="utf-8") as f:
        assert json.load(f)["arguments"][0] == "x"


def test_the_manifest_names_the_classes_in_label_id_order_and_the_version_that_wrote_it(tmp_path) -> None:
    """Before: the manifest of a run on the user's own image folders carried the class count alone (a reader had to
    guess that label 0 is the first folder in sorted order) and no hloforge version."""
    from test_prepare import write_jpeg_tree

    from hloforge.core.registry import hloforge_version
    from hloforge.datasets.prepare import prepare

    write_jpeg_tree(tmp_path / "src", per_class=2, classes=("zebra", "ant", "moose"))
    data = str(tmp_path / "prepared")
    prepare("imagenette", str(tmp_path / "src"), data, train_size=10, val_size=8)
    options = {"data_dir": data, "train_size": 10, "crop": 8}
    spec = hf.NetSpec("folders", (3, 8, 8), [L.Conv2d(out=4, k=3, act="relu"), L.GlobalAvgPool(), L.Dense(3)], 3)
    m = hf.Model(spec)
    m.fit(data="imagenette", data_options=options, epochs=1, batch_size=2, verbose=False)
    run = str(tmp_path / "run")
    m.save(run, data="imagenette", data_options=options)
    export_run(run, str(tmp_path / "export"), log=lambda s: None)
    with open(tmp_path / "export" / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["class_names"] == ["ant", "moose", "zebra"]  # label i: the i-th folder in sorted order
    assert manifest["hloforge_version"] == hloforge_version()


def test_the_manifest_names_the_classes_the_run_trained_on_after_its_data_was_renamed(tmp_path) -> None:
    """Before: the class names were read from the data directory at export: one re-prepared after training from
    folders of other names exported those names for the ids the run trained under the old ones."""
    import shutil

    from test_prepare import write_jpeg_tree

    from hloforge.datasets.prepare import prepare
    from hloforge.train.trainer import TrainConfig, train

    write_jpeg_tree(tmp_path / "src", per_class=2, classes=("zebra", "ant", "moose"))
    data = str(tmp_path / "prepared")
    prepare("imagenette", str(tmp_path / "src"), data, train_size=10, val_size=8)
    spec = hf.NetSpec("folders", (3, 8, 8), [L.Conv2d(out=4, k=3, act="relu"), L.GlobalAvgPool(), L.Dense(3)], 3)
    net, run = tmp_path / "folders.json", str(tmp_path / "run")
    net.write_text(json.dumps(spec.to_dict()))
    train(TrainConfig(net=str(net), data="imagenette", data_options=(f"data_dir={data}", "train_size=10", "crop=8"),
                      epochs=1, batch=2, run_dir=run), spec=spec, log=lambda s: None, progress=False)
    shutil.rmtree(data)  # re-prepared after training from folders of other names (the same images, ids, split)
    write_jpeg_tree(tmp_path / "other", per_class=2, classes=("cow", "ape", "bee"))
    prepare("imagenette", str(tmp_path / "other"), data, train_size=10, val_size=8)
    export_run(run, str(tmp_path / "export"), log=lambda s: None)
    with open(tmp_path / "export" / "manifest.json", encoding="utf-8") as f:
        assert json.load(f)["class_names"] == ["ant", "moose", "zebra"]  # as recorded when the run started


def test_the_manifest_types_every_argument_as_forward_mlir_declares_it(tmp_path) -> None:
    """Before, the manifest named the arguments alone: a reader could not tell x's dtype or shape (a text model's
    token ids are f32 in forward.mlir, not the integers the vocabulary suggests) without parsing the module."""
    from safetensors.numpy import load_file

    from hloforge.commands.manifest import parse_main_signature

    spec = hf.NetSpec("typed", (2, 8, 8), [L.Conv2d(out=4, k=3), L.BatchNorm(), L.GlobalAvgPool(), L.Dense(3)], 3)
    m = hf.Model(spec)
    m.fit(np.random.default_rng(0).standard_normal((8, 2, 8, 8)).astype(np.float32), np.arange(8) % 3, epochs=1,
          batch_size=4, verbose=False)
    m.save(str(tmp_path / "run"))
    export_run(str(tmp_path / "run"), str(tmp_path / "e"), log=lambda s: None)
    with open(tmp_path / "e" / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    inputs = manifest["inputs"]
    assert [i["name"] for i in inputs] == manifest["arguments"]
    assert inputs[0] == {"name": "x", "shape": [1, 2, 8, 8], "dtype": "f32"}
    weights = load_file(str(tmp_path / "e" / "weights.safetensors"))
    assert all(i["shape"] == list(weights[i["name"]].shape) and i["dtype"] == "f32" for i in inputs[1:])
    declared = parse_main_signature((tmp_path / "e" / "forward.mlir").read_text())
    assert [list(a.shape) for a in declared] == [i["shape"] for i in inputs]
