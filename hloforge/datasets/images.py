"""Image files decoded the one way every reader of them here takes them (`prepare imagenette`, `prepare yolo`,
`hloforge detect`, `hloforge classify`): 8-bit RGB, the way a viewer shows the file.

- EXIF orientation applied: a phone's JPEG stores its pixels sideways and says so in its EXIF; viewers and
  YOLO's labelling tools show (and label) it turned, so a box drawn on it is in the turned frame.
- 16-bit grey (a PNG of depth 16) scaled to 8 bits: Pillow's own conversion to RGB clips it at 255, so a
  normal 16-bit photo came out almost all white.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from hloforge.core.errors import DataError

_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


ENDLESS = "a named pipe, socket or device, not a file, whose reading would never end"


def endless(path: str) -> bool:
    """Whether `path` is a named pipe, socket or device (ENDLESS), on whose open() a reader waits for a writer
    forever: a file named like an image or a label that is none."""
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def open_rgb(path: str) -> Any:
    """The image at `path` as a decoded 8-bit RGB PIL image (see the module). Raises what Pillow raises for a
    file it cannot decode (OSError, ValueError, SyntaxError, its decompression-bomb error, ...), and
    ValueError for 32-bit pixels (of no range it could scale): for a caller that skips such files."""
    from PIL import Image, ImageOps

    if endless(path):
        raise ValueError(f"{ENDLESS}; expected an image file")
    with warnings.catch_warnings():
        # Pillow warns, in two raw lines amid prepare's own, of what it decodes all the same: an image past
        # MAX_IMAGE_PIXELS (89M pixels: a 108-megapixel phone photo), EXIF it reads in part ("Truncated File Read",
        # a camera's), a palette PNG with transparency bytes; what it cannot decode it raises (skipped and said)
        warnings.simplefilter("ignore")
        with Image.open(path) as im:
            im.load()
            im = ImageOps.exif_transpose(im)
            if im.mode in _SIXTEEN_BIT:
                a = np.asarray(im, np.int64)
                im = Image.fromarray(((a * 255 + 0x7FFF) // 0xFFFF).astype(np.uint8), "L")
            elif im.mode in ("I", "F"):  # of no range a viewer knows: 32-bit integers or floats (a TIFF's)
                kind = "32-bit integer" if im.mode == "I" else "floating-point"
                raise ValueError(f"{kind} pixels; expected an 8- or 16-bit image")
            return im.convert("RGB")


def read_rgb(path: str) -> Any:
    """`open_rgb`, a file it cannot decode one DataError line naming it."""
    try:
        return open_rgb(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:  # no image to decode: say which
        raise DataError(f"{path}: {(e.strerror or str(e)).lower()}; expected an image file") from None
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for a bad file; each becomes one line
        raise DataError(f"{path}: cannot decode it as an image ({' '.join(str(e).split()) or type(e).__name__})") \
            from None


def square_rgb(path: str, side: int, read: Callable[[str], Any] = open_rgb) -> np.ndarray:
    """The image at `path` as uint8 RGB [3, side, side], resized bilinearly: how `prepare imagenette` stores one
    (`read`: `open_rgb`, or `read_rgb` for one DataError line on a file it cannot decode)."""
    from PIL import Image

    rgb = read(path).resize((side, side), Image.Resampling.BILINEAR)
    return np.asarray(rgb, np.uint8).transpose(2, 0, 1)
