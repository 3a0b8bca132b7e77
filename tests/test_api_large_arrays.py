"""A user's own data larger than memory, through the API: x saved as .npy and opened with
np.load(path, mmap_mode="r") stays on disk through fit, evaluate and predict — float32 rows, and integer
rows (8-bit pixels), which are cast to float32 a batch at a time rather than copied whole (4× their size)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import hloforge as hf

Dense = hf.layers.Dense

_ON_DISK = r'''
import re, sys, warnings
import numpy as np
import hloforge as hf
warnings.simplefilter("ignore")  # unscaled pixels: said, and beside the point here
path, rows = sys.argv[1], int(sys.argv[2])
x = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, 784))
for i in range(0, rows, 8192):
    x[i:i + 8192] = np.random.default_rng(i).integers(0, 256, (min(8192, rows - i), 784), dtype=np.uint8)
x.flush()
del x
def anonymous_mb():  # the process's own memory, not the file's pages it has mapped
    return int(re.search(r"RssAnon:\s+(\d+)", open("/proc/self/status").read()).group(1)) >> 10
x = np.load(path, mmap_mode="r")
y = (np.arange(rows) % 10).astype(np.int32)
m = hf.Model(hf.NetSpec("on-disk", (784,), [hf.layers.Dense(16, act="relu"), hf.layers.Dense(10)], 10), seed=0)
m.predict(x[:256])  # the backend, its client and a forward made: what is left to grow is x's copies
before = anonymous_mb()
m.fit(x, y, epochs=1, batch_size=512, verbose=False, validation_data=(x[:4096], y[:4096]))
fit = anonymous_mb() - before
m.evaluate(x, y)
evaluate = anonymous_mb() - before
assert m.predict(x).shape == (rows, 10)
print(fit, evaluate, anonymous_mb() - before)
'''


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the process's memory from /proc")
def test_fit_evaluate_and_predict_read_pixels_on_disk_a_batch_at_a_time(tmp_path):
    """A 94 MB file of 8-bit pixels: its float32 copy would be 376 MB of the process's own memory (fit, evaluate and
    predict each made one: 743 MB for a 149 MB file)."""
    rows = 120_000
    done = subprocess.run([sys.executable, "-c", _ON_DISK, str(tmp_path / "x.npy"), str(rows)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    grown = [int(v) for v in done.stdout.split()]
    float32_mb = rows * 784 * 4 >> 20
    assert max(grown) < float32_mb // 4, f"the process grew by {grown} MB (fit, evaluate, predict); x as float32 " \
                                         f"is {float32_mb} MB"


def test_integer_rows_cast_a_batch_at_a_time_train_and_score_as_their_float32_copy():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (96, 12)).astype(np.uint8)
    y = rng.integers(0, 3, 96).astype(np.int32)
    net = hf.NetSpec("cast-tiny", (12,), [Dense(8, act="relu"), Dense(3)], 3)
    scores, predictions = [], []
    for rows in (x, x.astype(np.float32)):
        m = hf.Model(net, lr=1e-3, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unscaled pixels
            history = m.fit(rows, y, epochs=2, batch_size=16, verbose=False, validation_data=(rows[:32], y[:32]))
        scores.append((history.history["loss"], history.history["val_loss"], m.evaluate(rows, y)["loss"]))
        predictions.append(m.predict(rows))
    assert scores[0] == scores[1]
    np.testing.assert_array_equal(predictions[0], predictions[1])


def test_the_span_of_a_large_array_read_in_chunks_is_its_min_and_max():
    from hloforge.train.inputs import SPAN_CHUNK, value_span

    rows = SPAN_CHUNK // 100 * 3 + 7  # three chunks and a ragged last one, of rows of 100
    x = np.random.default_rng(0).normal(size=(rows, 100)).astype(np.float32)
    assert value_span(x) == (float(x.min()), float(x.max()))
    assert value_span(x[:, ::3]) == (float(x[:, ::3].min()), float(x[:, ::3].max()))  # a view, not copied
    pixels = np.random.default_rng(1).integers(0, 200, (rows, 100), dtype=np.uint8)
    pixels[-1, -1] = 255
    assert value_span(pixels) == (0.0, 255.0)
    x[-1, 5] = np.inf
    assert value_span(x)[1] == np.inf
    x[rows // 2, 0] = np.nan  # in a middle chunk: both NaN, as numpy's min and max say
    lo, hi = value_span(x)
    assert np.isnan(lo) and np.isnan(hi)
