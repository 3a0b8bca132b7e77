"""What cam, detect and sample refuse before they compute: an image cam cannot explain (not finite, not the
net's input shape, a negative test index), a net cam does not support (a detector, a DDPM, an MLP), and an
--out they cannot write as an image (checked by one helper, argtypes.image_out). Each refusal is one line
and exit 3, and nothing is written."""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.cli import main
from hloforge.commands.argtypes import IMAGE_OUT_SUFFIXES
from hloforge.core.errors import DataError
from hloforge.core.spec import NetSpec
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.ddpm import NoiseHead, TimeResBlock
from hloforge.train.trainer import TrainConfig, train


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    """One small run per kind cam meets: a conv classifier, an MLP, a detector and a DDPM (one epoch each)."""
    d = tmp_path_factory.mktemp("image-cmds")
    out = {"cnn": str(d / "cnn"), "mlp": str(d / "mlp"), "det": str(d / "det"), "ddpm": str(d / "ddpm")}
    train(TrainConfig(net="mnist-cnn", epochs=1, batch=64, run_dir=out["cnn"]), progress=False, log=quiet)
    train(TrainConfig(net="mnist-mlp", epochs=1, batch=64, run_dir=out["mlp"]), progress=False, log=quiet)
    shapes = ["--data", "shapes", "--data-opt", "n_train=32", "--data-opt", "n_test=4", "--epochs", "1",
              "--batch", "16", "--no-progress"]
    assert main(["train", "yolov1-mini", *shapes, "--run-dir", out["det"]]) == 0
    ddpm = d / "ddpm.toml"
    ddpm.write_text(NetSpec("ddpm-cam", (4, 16, 16), [Conv2d(4, k=3), TimeResBlock(4, nfreq=2), NoiseHead(3)],
                            3).to_toml())
    assert main(["train", str(ddpm), *shapes, "--data-opt", "size=16", "--diffusion-steps", "8",
                 "--beta-start", "0.3", "--beta-end", "0.9", "--run-dir", out["ddpm"]]) == 0
    return out


def refused(argv: list[str], capsys) -> str:
    """Run `hloforge ARGV`: it must exit 3 with one line on stderr; that line."""
    capsys.readouterr()
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error" not in err, err
    return err


# ------------------------------------------------------------------ cam's image and net
@pytest.mark.parametrize("array,needle", [
    (np.full((1, 28, 28), np.nan, np.float32), "x holds NaN or inf"),
    (np.full((1, 28, 28), np.inf, np.float32), "x holds NaN or inf"),
    (np.full((1, 28, 28), 1e300), "beyond float32's range"),  # finite in float64, inf as the f32 the net takes
    (np.zeros((3, 28, 28), np.float32), "x has shape [3, 28, 28], expected [1, 28, 28] (the input of net "
                                        "'mnist-cnn'"),
    (np.zeros((784,), np.float32), "x has shape [784], expected [1, 28, 28]"),  # no longer reshaped into one
    (np.zeros((1, 28, 28), np.complex64), "x has dtype complex64, expected real numbers"),
])
def test_cam_refuses_an_image_the_net_cannot_take(array, needle, runs, tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, array)
    out = tmp_path / "cam.png"
    err = refused(["cam", runs["cnn"], str(x), "--out", str(out)], capsys)
    assert needle in err and str(x) in err, err
    assert not out.exists()


def test_cam_refuses_an_npy_it_cannot_read(runs, tmp_path, capsys):
    """Before: an empty file was an internal error (numpy's EOFError), an .npz under a .npy name "dtype <U1"."""
    empty, npz = tmp_path / "empty.npy", tmp_path / "arch.npz"
    empty.write_bytes(b"")
    np.savez(npz, x=np.zeros((1, 28, 28), np.float32))
    renamed = tmp_path / "arch.npy"
    renamed.write_bytes(npz.read_bytes())
    for x, needle in ((empty, "not a readable .npy array"), (renamed, "an .npz archive, not a .npy array; expected "
                                                                      "one array of shape [1, 28, 28]")):
        err = refused(["cam", runs["cnn"], str(x), "--out", str(tmp_path / "cam.png")], capsys)
        assert err.startswith(f"hloforge: error: {x}: ") and needle in err, err
    assert not (tmp_path / "cam.png").exists()


@pytest.mark.parametrize("content,why", [
    (b"hello\n", "it is not a .npy file"),  # was numpy's advice to load it unsafely with allow_pickle
    (b"", "it is empty or cut short"),  # was "No data left in file"
    (None, "is a directory"),  # was "[Errno 21] Is a directory: PATH"
])
def test_cam_says_why_an_npy_cannot_be_read_in_a_users_words(content, why, runs, tmp_path, capsys):
    x = tmp_path / "x.npy"
    if content is None:
        x.mkdir()
    else:
        x.write_bytes(content)
    err = refused(["cam", runs["cnn"], str(x), "--out", str(tmp_path / "cam.png")], capsys)
    assert err == (f"hloforge: error: {x}: not a readable .npy array ({why}); expected one array of shape "
                   "[1, 28, 28] (np.save)")


@pytest.mark.parametrize("ref", ["test:-1", "test:-360", "test:360", "test:x"])
def test_cam_refuses_a_test_index_out_of_range(ref, runs, tmp_path, capsys):
    err = refused(["cam", runs["cnn"], ref, "--out", str(tmp_path / "cam.png")], capsys)
    assert f"image {ref!r}: expected test:N with 0 ≤ N < 360" in err, err


@pytest.mark.parametrize("kind,needle", [
    ("det", "net 'yolov1-mini' outputs [13, 8, 8]; cam explains a classifier"),
    ("ddpm", "net 'ddpm-cam' outputs [3, 16, 16]; cam explains a classifier"),
    ("mlp", "net 'mnist-mlp' has no image feature map"),
])
def test_cam_refuses_a_net_it_does_not_support(kind, needle, runs, tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((10, 10), np.float32))  # the net is refused first, whatever the image
    for ref in ("test:0", str(x)):
        err = refused(["cam", runs[kind], ref, "--out", str(tmp_path / "cam.png")], capsys)
        assert needle in err, err
    assert not (tmp_path / "cam.png").exists()


def test_gradcam_refuses_nan_before_compiling(runs):
    from hloforge.commands.cam import gradcam
    from hloforge.commands.opening import open_checkpoint
    from hloforge.train import checkpoint as ckpt

    oc = open_checkpoint(runs["cnn"], log=quiet)
    params = oc.weights(ckpt.PARAMS, [n for n, _ in oc.spec.params()])
    running = oc.weights(ckpt.STATS, [n for n, _ in oc.spec.stats()])
    with pytest.raises(DataError, match="holds NaN or inf"):
        gradcam(oc.spec, params, running, np.full((1, 28, 28), np.nan, np.float32), oc.run.backend)


def test_cam_refuses_raw_pixels_as_predict_does(runs, tmp_path, capsys):
    """uint8 0…255 to a net trained on digits' standardised floats: predict refuses it (one definition,
    arraydata.check_input_kind), and so does cam, rather than drawing a heatmap of unscaled input."""
    import hloforge as hf

    raw = np.random.default_rng(0).integers(0, 256, (1, 28, 28)).astype(np.uint8)
    x = tmp_path / "a_u8.npy"
    np.save(x, raw)
    with pytest.raises(DataError, match="the model was trained on real numbers") as said:
        hf.load(runs["cnn"]).predict(raw[None])
    out = tmp_path / "cam.png"
    err = refused(["cam", runs["cnn"], str(x), "--out", str(out)], capsys)
    assert f"image {x}: x is uint8 in 0 … 255, but the model was trained on real numbers" in err, err
    assert "scale and standardise x as dataset 'digits' does" in err and "test:N" in err, err
    assert "trained on real numbers" in str(said.value) and not out.exists()
    np.save(x, np.random.default_rng(0).normal(size=(1, 28, 28)).astype(np.float32))  # standardised: drawn
    assert main(["cam", runs["cnn"], str(x), "--out", str(out)]) == 0 and out.exists()


def test_detect_reports_boxes_in_the_image_own_pixels(runs, tmp_path, capsys):
    """An image of another size than the net's input is resized for the net, said once, and its boxes come
    back in the image's own pixels (each axis scaled alone), drawn on the image itself."""
    from PIL import Image

    from hloforge.commands.detect import detect_run
    from hloforge.train.detection import load_image

    wide = tmp_path / "rgb100.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (60, 100, 3)).astype(np.uint8)).save(wide)
    size = 32  # the shapes run's images (yolov1-mini at shapes' 32×32)
    resized = load_image(str(wide), size)
    small = tmp_path / "rgb32.png"  # the very image the net sees, as a file of its own size
    Image.fromarray(np.round(resized.transpose(1, 2, 0) * 255).astype(np.uint8)).save(small)
    lines: list[str] = []
    dets = detect_run(runs["det"], str(wide), str(tmp_path / "d.png"), score_min=0.0, log=lines.append)
    same = detect_run(runs["det"], str(small), str(tmp_path / "s.png"), score_min=0.0, log=lambda _: None)
    assert len(dets) and len(dets) == len(same)
    want = np.asarray(same, np.float64).reshape(-1, 6) * [1, 1, 100 / size, 60 / size, 100 / size, 60 / size]
    np.testing.assert_allclose(np.asarray(dets, np.float64).reshape(-1, 6), want, rtol=1e-5, atol=1e-4)
    said = [line for line in lines if "resized" in line]
    assert said == [f"{wide} is 100×60: resized to the net's {size}×{size} input; boxes are in the image's own "
                    "pixels"], lines
    assert Image.open(tmp_path / "d.png").size[0] / Image.open(tmp_path / "d.png").size[1] == 100 / 60


# ------------------------------------------------------------------ --out, before anything is opened
def _commands(run: str, out: str) -> list[list[str]]:
    return [["cam", run, "test:0", "--out", out], ["detect", run, "--index", "0", "--out", out],
            ["sample", run, "-n", "1", "--out", out]]


@pytest.mark.parametrize("name,needle", [
    ("x.txt", "has suffix '.txt'; expected an image file name ending in .png, .jpg, .jpeg"),
    ("noext", "has no suffix; expected an image file name ending in .png, .jpg, .jpeg"),
    ("DIR", "is a directory; expected an image file name ending in .png"),
    ("DIR.png", "is a directory"),
    ("missing/x.png", "directory"),
])
def test_every_image_command_checks_its_out_first(name, needle, tmp_path, capsys):
    (tmp_path / "DIR").mkdir()
    (tmp_path / "DIR.png").mkdir()
    out = str(tmp_path / name)
    # the run does not exist: --out is refused before the run is opened (or anything computed)
    for argv in _commands(str(tmp_path / "no-such-run"), out):
        err = refused(argv, capsys)
        assert f"--out {out!r}" in err and needle in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR", "DIR.png"]  # nothing written


def test_cam_writes_and_names_exactly_the_out_given(runs, tmp_path, capsys):
    out = tmp_path / "heat.JPG"  # any case of a supported suffix
    capsys.readouterr()
    assert main(["cam", runs["cnn"], "test:3", "--out", str(out)]) == 0
    assert f"wrote {out} (" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["heat.JPG"] and out.read_bytes()[:2] == b"\xff\xd8"


def test_cam_runs_on_the_backend_given_as_detect_generate_and_sample_do(runs, tmp_path, capsys):
    """cam alone took no --backend (exit 2, 'unrecognized arguments'): a run could be explained only on the
    backend it trained on. The heatmap on IREE is XLA's to float rounding; a name no backend has is one line."""
    pytest.importorskip("iree.runtime")
    from hloforge.commands.cam import cam_run

    out = tmp_path / "heat.png"
    capsys.readouterr()
    assert main(["cam", runs["cnn"], "test:3", "--out", str(out), "--backend", "iree"]) == 0
    assert f"wrote {out} (" in capsys.readouterr().out
    on_xla, on_iree = (cam_run(runs["cnn"], "test:3", str(out), log=quiet, backend=b) for b in ("xla", "iree"))
    np.testing.assert_allclose(on_iree, on_xla, atol=1e-4)
    assert on_xla.max() > 0.1  # a heatmap, not zeros agreeing
    assert refused(["cam", runs["cnn"], "test:3", "--out", str(out), "--backend", "ire"], capsys).startswith(
        "hloforge: error: unknown backend 'ire'")


@pytest.mark.parametrize("suffix", IMAGE_OUT_SUFFIXES)
def test_each_writer_writes_each_accepted_suffix(suffix, tmp_path):
    """IMAGE_OUT_SUFFIXES says what all three writers (matplotlib's savefig and imsave, PIL) can write."""
    from PIL import Image

    from hloforge.commands.cam import save_overlay
    from hloforge.commands.sample import save_grid
    from hloforge.train.detection import draw_detections

    img = np.random.default_rng(0).random((1, 16, 16)).astype(np.float32)
    save_overlay(img, img[0], str(tmp_path / f"cam{suffix}"))
    draw_detections(img, np.zeros((0, 6)), str(tmp_path / f"det{suffix}"))
    save_grid(np.random.default_rng(0).random((16, 16, 3)), str(tmp_path / f"grid{suffix}"))
    want = "PNG" if suffix == ".png" else "JPEG"
    for name in ("cam", "det", "grid"):
        assert Image.open(tmp_path / f"{name}{suffix}").format == want
    assert len(list(tmp_path.iterdir())) == 3  # each at exactly the name given


def test_image_out_on_its_own(tmp_path):
    from hloforge.commands.argtypes import image_out

    assert image_out(str(tmp_path / "a.PNG")) == str(tmp_path / "a.PNG")
    assert image_out("grid.png") == "grid.png"  # the current directory
    with pytest.raises(DataError, match=r"has suffix '\.gif'"):
        image_out(str(tmp_path / "a.gif"))


WRITERS = {  # each image command's writer, on an image larger than the limit below
    "cam": "from hloforge.commands.cam import save_overlay as w; w(rng.random((3, 64, 64)), rng.random((64, 64)), OUT)",
    "detect": "from hloforge.train.detection import draw_detections as w; w(rng.random((64, 64, 3)), "
              "np.zeros((0, 6)), OUT, scale=4)",
    "sample": "from hloforge.commands.sample import save_grid as w; w(rng.random((256, 256, 3)), OUT)",
}


@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_an_image_onto_a_full_disk_is_one_line_and_no_torn_file(name, suffix, tmp_path):
    """A write limit (RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC) under the image's size: before, the writer's raw
    OSError ('hloforge: error: a file: file too large' on the command line, naming none) and the image cut at the
    limit, left under the name the user gave. Now one line naming it, and nothing there."""
    import resource
    import subprocess
    import sys

    code = (f"import numpy as np\nfrom hloforge.core.errors import HloforgeError\nOUT = 'o{suffix}'\n"
            f"rng = np.random.default_rng(0)\ntry:\n    {WRITERS[name]}\nexcept HloforgeError as e:\n    print(e)\n")

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=capped)
    assert done.stdout.strip() == (f"could not write image o{suffix}: File too large (there was no image before, the "
                                   "temp file removed); free space and run it again"), done.stdout + done.stderr
    assert not list(tmp_path.iterdir())
