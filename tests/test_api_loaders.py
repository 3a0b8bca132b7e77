"""`Model.fit(batches)` on a re-iterable (a DataLoader, a class with __iter__) reads it afresh each epoch, as PyTorch
and Keras do, so a loader's augmentation is new every epoch; a list or a generator is read once."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError

Dense = hf.layers.Dense


def tiny_net() -> hf.NetSpec:
    return hf.NetSpec("loader-tiny", (6,), [Dense(8, act="relu"), Dense(3)], 3)


def rows(epoch: int, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The pass a loader gives at its `epoch`-th iteration (0-based): other rows each time, as augmentation makes."""
    rng = np.random.default_rng(epoch)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


class Loader:
    """A re-iterable of batches of 16, another pass at each iteration (`sizes`: each pass's rows)."""

    def __init__(self, sizes: tuple[int, ...] = (64, 64, 64)):
        self.sizes, self.passes = sizes, 0

    def __iter__(self):
        x, y = rows(self.passes, self.sizes[self.passes])
        self.passes += 1
        return iter([(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)])


def test_a_loader_is_read_afresh_each_epoch_and_trains_as_each_pass_given_as_arrays():
    """Before: read once, every epoch trained on its first pass (a loader's augmentation drawn once for the whole fit).
    The reference: the same passes given as arrays, one fit an epoch (a constant schedule, so the fits' schedules are
    the run's; the step and epoch counts, and with them Adam's and the shuffle's, go on across fits)."""
    loader = Loader()
    streamed = hf.Model(tiny_net(), lr=1e-2, schedule="constant", seed=0)
    history = streamed.fit(loader, epochs=3, verbose=False)
    assert loader.passes == 3
    by_pass = hf.Model(tiny_net(), lr=1e-2, schedule="constant", seed=0)
    for e in range(3):
        by_pass.fit(*rows(e), epochs=1, batch_size=16, verbose=False)
    assert history.history["loss"] == by_pass.history["loss"]
    for a, b in zip(streamed.params.values(), by_pass.params.values(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_list_and_a_generator_are_read_once():
    x, y = rows(0)
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    listed = hf.Model(tiny_net(), seed=0)
    listed.fit(batches, epochs=2, verbose=False)
    generated = hf.Model(tiny_net(), seed=0)
    generated.fit((b for b in batches), epochs=2, verbose=False)
    for a, b in zip(listed.params.values(), generated.params.values(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_later_pass_of_other_rows_is_one_line_and_the_epochs_before_are_kept():
    m = hf.Model(tiny_net(), seed=0)
    with pytest.raises(DataError) as e:
        m.fit(Loader((64, 64, 48)), epochs=3, verbose=False)
    assert str(e.value) == ("fit batches, read again for epoch 3, gave 48 rows of float32 where the first pass gave 64 "
                            "of float32; expected a loader of the same rows each epoch (as a DataLoader of one dataset "
                            "gives)")
    assert len(m.history["loss"]) == 2


def test_a_later_pass_holding_nan_is_refused_naming_its_epoch():
    class Spoiled(Loader):
        def __iter__(self):
            batches = list(super().__iter__())
            if self.passes == 2:
                batches[1][0][3, 2] = np.nan
            return iter(batches)

    m = hf.Model(tiny_net(), seed=0)
    with pytest.raises(DataError, match=r"^fit batches, read again for epoch 2: x holds NaN or inf"):
        m.fit(Spoiled(), epochs=2, verbose=False)
    assert len(m.history["loss"]) == 1


def test_a_torch_dataloader_with_random_augmentation_gives_new_rows_each_epoch():
    torch = pytest.importorskip("torch")
    x, y = rows(0)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    seen = []

    def noisy(batch):  # an augmentation drawn anew at each pass
        xb, yb = torch.utils.data.default_collate(batch)
        noised = xb + 0.1 * torch.randn_like(xb)
        seen.append(noised.numpy().copy())
        return noised, yb

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True, collate_fn=noisy)
    m = hf.Model(tiny_net(), seed=0)
    m.fit(loader, epochs=2, verbose=False)
    assert len(seen) == 8  # two passes of four batches
    assert not np.array_equal(np.concatenate(seen[:4]), np.concatenate(seen[4:]))
