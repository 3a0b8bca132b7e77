"""Image files as every reader of them takes them (datasets/images.py): turned as EXIF says, 16-bit grey
scaled, a file Pillow cannot decode one line naming it. Through `prepare imagenette`, `prepare yolo` and
`hloforge detect`'s reader."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from hloforge.core.errors import DataError
from hloforge.datasets.images import open_rgb, read_rgb, square_rgb
from hloforge.train.detection import load_image

GRADIENT = [0, 100, 255, 256, 1000, 16384, 32768, 65535]


def _sixteen_bit_png(path) -> None:
    Image.fromarray(np.array([GRADIENT] * 2, np.uint16)).save(path)
    with Image.open(path) as im:
        assert im.mode.startswith("I")  # Pillow reads it back 16-bit: the case its own RGB conversion clips


def _sideways_jpeg(path) -> None:
    """64 wide, 32 high as stored, its left 16 columns white; EXIF orientation 6: shown 32 wide, 64 high,
    the white band its top 16 rows."""
    im = Image.new("RGB", (64, 32), "black")
    im.paste((255, 255, 255), (0, 0, 16, 32))
    exif = Image.Exif()
    exif[0x0112] = 6
    im.save(path, exif=exif, quality=95)


def test_sixteen_bit_grey_is_scaled_not_clipped(tmp_path) -> None:
    """Before: Pillow's conversion stored [0, 100, 255, 255, 255, 255, 255, 255] (every value past 255
    clipped: a 16-bit photo almost all white), silently."""
    _sixteen_bit_png(tmp_path / "g16.png")
    want = [round(v * 255 / 65535) for v in GRADIENT]
    assert want == [0, 0, 1, 1, 4, 64, 128, 255]
    got = np.asarray(open_rgb(str(tmp_path / "g16.png")))
    assert got.shape == (2, 8, 3) and got[0, :, 0].tolist() == want and (got == got[..., :1]).all()
    np.testing.assert_allclose(load_image(str(tmp_path / "g16.png"))[0, 0], np.array(want) / 255.0, atol=1e-7)


def test_exif_orientation_is_applied(tmp_path) -> None:
    """Before: the stored pixels, unturned, under labels drawn on the turned image."""
    _sideways_jpeg(tmp_path / "side.jpg")
    rgb = np.asarray(open_rgb(str(tmp_path / "side.jpg")), np.float32)
    assert rgb.shape == (64, 32, 3)
    assert rgb[:14].mean() > 240 and rgb[18:].mean() < 15
    shown = load_image(str(tmp_path / "side.jpg"))
    assert shown.shape == (3, 64, 32) and shown[:, :14].mean() > 0.94
    chw = square_rgb(str(tmp_path / "side.jpg"), 16)  # prepare imagenette's
    assert chw[:, :3].mean() > 240 and chw[:, 5:].mean() < 15


def test_prepare_yolo_stores_the_image_its_labels_were_drawn_on(tmp_path) -> None:
    """A box on the top quarter of a turned photo covers its white band in the stored record."""
    from hloforge.datasets.yolo import Yolo, prepare_yolo

    for split in ("train", "val"):
        (tmp_path / "src" / "images" / split).mkdir(parents=True)
        (tmp_path / "src" / "labels" / split).mkdir(parents=True)
        _sideways_jpeg(tmp_path / "src" / "images" / split / "a.jpg")
        (tmp_path / "src" / "labels" / split / "a.txt").write_text("0 0.5 0.125 1.0 0.25\n")
    prepare_yolo(str(tmp_path / "src"), str(tmp_path / "out"), size=32, grid=4, classes=3)
    x, _ = Yolo(str(tmp_path / "out"), size=32, grid=4, classes=3).arrays("test")
    assert x[0, :, :7].mean() > x[0, :, 10:].mean() + 3  # standardised: white is ~2, black ~ -2


@pytest.mark.parametrize("damage", ["header", "bomb"])
def test_an_image_pillow_cannot_decode_is_one_line_in_every_reader(tmp_path, damage) -> None:
    """Before: Pillow's ValueError ('Truncated IHDR chunk') or DecompressionBombError escaped `prepare yolo`
    and `hloforge detect` as an internal error (they caught OSError alone)."""
    from hloforge.datasets.yolo import prepare_yolo

    bad = tmp_path / "bad.png"
    if damage == "header":
        Image.new("RGB", (20, 24)).save(bad)
        data = bytearray(bad.read_bytes())
        data[11] = 0  # IHDR's length
        bad.write_bytes(bytes(data))
    else:
        Image.new("1", (20000, 20000)).save(bad)  # 400 million pixels in a few kB
    with pytest.raises(DataError) as said:
        read_rgb(str(bad))
    assert str(said.value).startswith(f"{bad}: cannot decode it as an image (") and "\n" not in str(said.value)
    with pytest.raises(DataError, match="cannot decode it as an image"):
        load_image(str(bad))
    for split in ("train", "val"):
        (tmp_path / "src" / "images" / split).mkdir(parents=True)
        (tmp_path / "src" / "labels" / split).mkdir(parents=True)
        (tmp_path / "src" / "images" / split / "a.png").write_bytes(bad.read_bytes())
        (tmp_path / "src" / "labels" / split / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(DataError, match=r"a\.png: cannot decode it as an image"):
        prepare_yolo(str(tmp_path / "src"), str(tmp_path / "out"), size=32, grid=4, classes=3)
    with pytest.raises(Exception) as raw:  # prepare imagenette's reader: Pillow's own, so it can skip the file
        open_rgb(str(bad))
    assert not isinstance(raw.value, DataError)


def test_pixels_of_no_known_range_are_refused(tmp_path) -> None:
    Image.fromarray(np.full((4, 4), 1.5, np.float32)).save(tmp_path / "f.tiff")
    with pytest.raises(DataError, match="floating-point pixels; expected an 8- or 16-bit image"):
        read_rgb(str(tmp_path / "f.tiff"))
    Image.fromarray(np.full((4, 4), 70000, np.int32)).save(tmp_path / "i.tiff")
    with pytest.raises(DataError, match="32-bit integer pixels; expected an 8- or 16-bit image"):
        read_rgb(str(tmp_path / "i.tiff"))


def test_an_image_path_that_is_no_file_is_said_so(tmp_path) -> None:
    """Before: `hloforge detect RUN nope.png` said "nope.png: cannot decode it as an image ([Errno 2] ...)"."""
    for path, said in ((tmp_path / "nope.png", "no such file or directory"), (tmp_path, "is a directory")):
        with pytest.raises(DataError) as e:
            read_rgb(str(path))
        assert str(e.value) == f"{path}: {said}; expected an image file"
