"""The `shapes` dataset: deterministic, masks and boxes that agree with each other."""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.core.errors import DataError
from hloforge.core.registry import default_registry
from hloforge.datasets.shapes import BOX_CLASSES, MASK_CLASSES, Shapes, _shape_pixels


def small(**kw) -> Shapes:
    return Shapes(**{"size": 24, "n_train": 24, "n_test": 8, **kw})


def test_same_options_same_bytes_and_seed_changes_them():
    a, b, c = small(), small(), small(seed=1)
    for split in ("train", "test"):
        (xa, ma), (xb, mb) = a.arrays(split), b.arrays(split)
        assert xa.tobytes() == xb.tobytes() and ma.tobytes() == mb.tobytes()
        assert all(np.array_equal(p, q) for p, q in zip(a.boxes(split), b.boxes(split), strict=True))
    assert not np.array_equal(a.arrays("train")[1], c.arrays("train")[1])
    # the test images do not depend on how many training images there are
    assert np.array_equal(small(n_train=30).arrays("test")[1], a.arrays("test")[1])


def test_shapes_dtypes_and_standardisation():
    ds = default_registry().make("dataset", "shapes", size=24, n_train=24, n_test=8)
    x, m = ds.arrays("train")
    assert ds.image_shape == (3, 24, 24) and ds.num_classes == 4 and ds.splits == ("train", "test")
    assert x.shape == (24, 3, 24, 24) and x.dtype == np.float32 and m.shape == (24, 24, 24) and m.dtype == np.int32
    assert np.allclose(x.mean(axis=(0, 2, 3)), 0, atol=1e-4) and np.allclose(x.std(axis=(0, 2, 3)), 1, atol=1e-4)
    assert set(np.unique(m)) <= set(MASK_CLASSES.values())
    with pytest.raises(DataError, match="no split 'val'"):
        ds.arrays("val")
    with pytest.raises(DataError, match="an integer ≥ 16"):
        Shapes(size=8)


def test_boxes_bound_each_shapes_visible_mask_pixels():
    ds = small()
    _, masks = ds.arrays("train")
    for mask, boxes in zip(masks, ds.boxes("train"), strict=True):
        assert boxes.dtype == np.float32 and boxes.ndim == 2 and boxes.shape[1] == 5 and 1 <= len(boxes) <= 3
        for cls, x0, y0, x1, y1 in boxes:
            assert 0 <= x0 < x1 <= 24 and 0 <= y0 < y1 <= 24 and cls in BOX_CLASSES.values()
            inside = mask[int(y0):int(y1), int(x0):int(x1)]
            # box classes are mask classes minus one (no background); the shape shows inside its box
            assert (inside == cls + 1).any()
        # every foreground pixel is inside some box of its class
        for r, c in zip(*np.nonzero(mask), strict=True):
            assert any(b[0] + 1 == mask[r, c] and b[1] <= c < b[3] and b[2] <= r < b[4] for b in boxes)


def test_box_is_the_tight_bound_of_the_drawn_pixels():
    pix = _shape_pixels("square", 10.0, 10.0, 3.0, 24)
    rows, cols = np.nonzero(pix)
    assert (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1) == (7, 7, 13, 13)
    tri = _shape_pixels("triangle", 12.0, 12.0, 6.0, 24)
    rows, cols = np.nonzero(tri)
    # upright: the base row is the widest, the apex row the narrowest
    widths = [int(tri[r].sum()) for r in range(rows.min(), rows.max() + 1)]
    assert widths == sorted(widths) and widths[-1] > widths[0]
