"""hf.Model.fit refuses a callback option that cannot work (a monitor the run never logs) before it compiles
anything: a wrong option must not cost a train step's compile first (fit asks the trainer's Run to check
its callbacks before it asks for a session; labels are checked against the loss's label type, not a
compiled session's layout).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from test_api import blobs, tiny_net  # tests/ is on sys.path (rootdir-relative, no package)

import hloforge as hf
from hloforge.core.errors import HloforgeError


def tiny_model() -> hf.Model:
    return hf.Model(tiny_net())


def counting_compiles(model: hf.Model, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every module `model`'s backend compiles, recorded (and compiled as before)."""
    compiled: list[Any] = []
    real = model.backend.compile

    def compile(*args: Any, **kwargs: Any) -> Any:
        compiled.append(args[0][:60])
        return real(*args, **kwargs)

    monkeypatch.setattr(model.backend, "compile", compile)
    return compiled


def test_a_good_fit_compiles_through_the_counted_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count below sees the compiles a fit makes, so a zero there means none was made."""
    m = tiny_model()
    compiled = counting_compiles(m, monkeypatch)
    m.fit(*blobs(32), epochs=1, batch_size=16, validation_data=blobs(16, 1), verbose=False,
          callbacks=[hf.EarlyStopping("val_loss")])
    assert compiled


def test_fit_on_arrays_refuses_an_unknown_monitor_before_any_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    m = tiny_model()
    compiled = counting_compiles(m, monkeypatch)
    with pytest.raises(HloforgeError, match=re.escape("EarlyStopping monitors 'val_los', but the epoch's metrics")):
        m.fit(*blobs(32), epochs=1, batch_size=16, validation_data=blobs(16, 1), verbose=False,
              callbacks=[hf.EarlyStopping("val_los")])
    assert compiled == []


def test_fit_on_a_dataset_refuses_an_unknown_monitor_before_any_compile(tmp_path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    m = hf.Model("mnist-linear")
    compiled = counting_compiles(m, monkeypatch)
    with pytest.raises(HloforgeError, match=re.escape("ModelCheckpoint monitors 'zzz', but the epoch's metrics")):
        m.fit(data="digits", epochs=1, verbose=False, callbacks=[hf.ModelCheckpoint(str(tmp_path / "best"), "zzz")])
    assert compiled == [] and not (tmp_path / "best").exists()
