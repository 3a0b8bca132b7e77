"""Fuzzed checkpoints: a real one (mnist-linear on digits, one epoch, EMA so the shadow's tensors are
there) truncated, with flipped bytes, a safetensors header that lies about offsets, dtypes or shapes,
tampered metadata, tensors of the wrong shape or dtype, or another net's, variant's or backend's.
Each is opened as eval opens it and restored as resume restores it: accepted (and then the weights
loaded are the file's), or refused in one line naming the checkpoint; nothing on disk changes."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from typing import Any

import numpy as np
import pytest
from fuzz_util import REFUSED, corrupt, outcome
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save

from hloforge.commands.opening import open_checkpoint
from hloforge.core.errors import DataError, HloforgeError
from hloforge.train import checkpoint as ckpt
from hloforge.train.session import TrainSession
from hloforge.train.trainer import CHECKPOINT, Run, TrainConfig, train


@pytest.fixture(scope="module")
def good(tmp_path_factory: Any) -> dict[str, Any]:
    """The run directory, the checkpoint's bytes, tensors and metadata, and one resume-ready session."""
    d = tmp_path_factory.mktemp("ck")
    cfg = TrainConfig(net="mnist-linear", epochs=1, batch=64, ema=0.9, run_dir=str(d / "run"))
    train(cfg, progress=False, log=lambda s: None)
    path = str(d / "run" / CHECKPOINT)
    with open(path, "rb") as f:
        raw = f.read()
    tensors, meta = ckpt.load_checkpoint(path)
    run = Run(attrs_evolve(cfg, epochs=2), log=lambda s: None, progress=False, resume=True)
    session = TrainSession(run.spec, run.variant, cfg.batch, run.backend, seed=cfg.seed)
    return Good({"dir": str(d / "run"), "raw": raw, "tensors": tensors, "meta": meta, "run": run,
                 "session": session})


class Good(dict):  # type: ignore[type-arg]
    def __repr__(self) -> str:  # hypothesis prints its arguments: not the whole checkpoint
        return "<the good checkpoint>"


def attrs_evolve(cfg: TrainConfig, **kw: Any) -> TrainConfig:
    import attrs

    return attrs.evolve(cfg, **kw)


def _header(raw: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _with_header(header: dict[str, Any], body: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def _resave(tensors: dict[str, np.ndarray], meta: dict[str, Any], raw_meta: dict[str, str] | None = None) -> bytes:
    md = {"format": ckpt.FORMAT, **{k: json.dumps(v) for k, v in meta.items()}, **(raw_meta or {})}
    return save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=md)


JSONISH = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=False),
                    st.text(max_size=5), st.lists(st.integers(0, 3), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def tampered(draw: Any, good: dict[str, Any]) -> bytes:
    raw, tensors, meta = good["raw"], dict(good["tensors"]), json.loads(json.dumps(good["meta"]))
    how = draw(st.sampled_from(["bytes", "offsets", "header_dtype", "meta", "meta_raw", "config", "spec",
                                "variant", "backend", "shape", "dtype", "drop", "extra", "rename"]))
    names = sorted(tensors)
    if how == "bytes":
        ops = draw(st.lists(st.tuples(st.sampled_from(["truncate", "flip", "append"]),
                                      st.one_of(st.integers(0, 16), st.integers(0, len(raw))), st.integers(1, 255)),
                            min_size=1, max_size=3))
        return corrupt(raw, ops)
    if how in ("offsets", "header_dtype"):
        header, body = _header(raw)
        name = draw(st.sampled_from(names))
        if how == "offsets":
            lo, hi = header[name]["data_offsets"]
            header[name]["data_offsets"] = [draw(st.sampled_from([lo, 0, hi, lo + 4, len(body)])),
                                            draw(st.sampled_from([hi, lo, hi + 4, hi - 4, len(body) + 8, 2**40]))]
        else:
            header[name]["dtype"] = draw(st.sampled_from(["F64", "F16", "I32", "U8", "BOOL", "Q9", ""]))
            if draw(st.booleans()):
                header[name]["shape"] = draw(st.lists(st.integers(0, 9), max_size=3))
        return _with_header(header, body)
    if how == "meta":
        key = draw(st.sampled_from([*ckpt.META_TYPES, "seed", "eval_set"]))
        if draw(st.booleans()):
            meta.pop(key, None)
        else:
            meta[key] = draw(JSONISH)
    if how == "meta_raw":
        return _resave(tensors, meta, {draw(st.sampled_from(["epoch", "spec", "config"])): draw(st.text(max_size=8))})
    if how == "config":
        key = draw(st.sampled_from([*meta["config"], "bogus"]))
        meta["config"][key] = draw(JSONISH)
    if how == "spec":
        meta["spec"]["layers"][-1]["units"] = draw(st.sampled_from([11, 5, 0, -1]))
        if draw(st.booleans()):
            meta["spec"]["name"] = draw(st.sampled_from(["mnist-mlp", "other"]))
    if how == "variant":
        key = draw(st.sampled_from(sorted(meta["variant"])))
        meta["variant"][key] = draw(JSONISH)
    if how == "backend":
        meta["backend"] = draw(st.sampled_from(["iree", "cuda", "", "XLA"]))
    name = draw(st.sampled_from(names))
    if how == "shape":
        t = tensors[name]
        tensors[name] = np.zeros(draw(st.sampled_from([(t.size,), (*t.shape, 1), (1,), (2, 3)])), np.float32)
    if how == "dtype":
        tensors[name] = tensors[name].astype(draw(st.sampled_from([np.float64, np.float16, np.int32, np.uint8])))
    if how == "drop":
        tensors.pop(name)
    if how == "extra":
        tensors[draw(st.sampled_from(["param/9.w", "state/v/0.w", "stat/0.mean", "junk"]))] = np.zeros(3, np.float32)
    if how == "rename":
        tensors["param/7." + name.rsplit(".", 1)[-1]] = tensors.pop(name)
    return _resave(tensors, meta)


def _eval_open(path: str) -> Any:
    oc = open_checkpoint(path, log=lambda s: None)
    return oc.region_weights("auto"), oc.region_weights("live")


def _resume(good: dict[str, Any]) -> int:
    return good["run"].restore(good["session"])


@given(data=st.data())
def test_checkpoint_fuzzed(good, data):
    blob = data.draw(tampered(good))
    run_dir = good["dir"]
    path = os.path.join(run_dir, CHECKPOINT)
    with open(path, "wb") as f:
        f.write(blob)
    try:
        got = outcome("checkpoint (eval open)", lambda: _eval_open(path), [path], [run_dir])
        if got is not REFUSED:
            (region, params, stats), (_, live, _) = got
            assert region == "ema" and all(p.dtype == np.float32 for p in [*params, *live, *stats])
        got = outcome("checkpoint (resume)", lambda: _resume(good), [path], [run_dir])
        if got is not REFUSED:
            assert got == 1
            tensors, _ = ckpt.load_checkpoint(path)
            for (n, _), a in zip(good["session"].layout.params, good["session"].read_params(), strict=True):
                np.testing.assert_array_equal(a, tensors[f"param/{n}"])
    finally:
        with open(path, "wb") as f:
            f.write(good["raw"])


# ------------------------------------------------------------------ what the properties found (each failed before)
def test_tampered_checkpoints_are_refused_in_one_line(good):
    with tempfile.TemporaryDirectory() as d:
        shutil.copytree(good["dir"], os.path.join(d, "run"))
        path = os.path.join(d, "run", CHECKPOINT)
        tensors, meta = dict(good["tensors"]), good["meta"]
        cases = [
            (_resave(tensors, meta, {"epoch": "{not json"}), r"metadata 'epoch' is not JSON"),
            (_resave(tensors, {**meta, "step": "7"}), r"metadata 'step' is '7', expected a count"),
            (_resave(tensors, {k: v for k, v in meta.items() if k != "spec"}),
             r"metadata 'spec' is missing, expected a table; tampered"),  # was "is None": a value it never held
            (_resave(tensors, {**meta, "config": {**meta["config"], "bogus": 1}}), r"its config does not read"),
            (_resave({**tensors, "param/0.w": tensors["param/0.w"].astype(np.float64)}, meta),
             r"tensor param/0.w is float64 \[784, 10\], expected float32 \[784, 10\]"),
            (_resave({**tensors, "stat/junk": np.zeros(2, np.float32)}, meta), r"holds tensor stat/junk"),
        ]
        spec = json.loads(json.dumps(meta["spec"]))
        spec["layers"][0]["units"] = 11
        cases.append((_resave(tensors, {**meta, "spec": spec}), r"as defined now \(layers\[0\].units: 11, not 10\)"))
        cases.append((_resave(tensors, {**meta, "variant": {**meta["variant"], "ema": 0.5}}),
                      r"its variant differs from the one its config makes \(ema: 0.5, not 0.9\)"))  # eval scored it
        cases.append((_resave(tensors, {**meta, "config": {**meta["config"], "ema": 1.0}}),
                      r"checkpoint .*: ema decay must be in \[0, 1\)"))  # named no checkpoint before
        for blob, match in cases:
            with open(path, "wb") as f:
                f.write(blob)
            with pytest.raises(HloforgeError, match=match):
                _eval_open(path)
        t = dict(tensors)
        t["param/0.w"] = np.full_like(t["param/0.w"], np.nan)
        with open(path, "wb") as f:
            f.write(_resave(t, meta))
        with pytest.raises(DataError, match=r"tensor param/0.w holds a NaN"):
            _eval_open(path)
        # the wrong shape of one tensor (eval handed it to the backend before)
        t = dict(tensors)
        t["param/0.b"] = np.zeros(11, np.float32)
        with open(path, "wb") as f:
            f.write(_resave(t, meta))
        with pytest.raises(DataError, match=r"tensor param/0.b is float32 \[11\], expected float32 \[10\]"):
            _eval_open(path)


def test_a_device_count_the_backend_would_abort_on_is_refused():
    # a checkpoint's config with devices=2**31 killed the process in the XLA client (std::length_error)
    with pytest.raises(HloforgeError, match=r"^devices must be from 1 to 1024, got 2147483648$"):
        TrainConfig(devices=2**31).check()
