"""Fuzzed specs: dicts, TOML and JSON files mutated from the zoo's nets (unknown kinds and fields,
wrong types, negative and huge sizes, impossible shapes). Each is accepted — it walks, counts its
parameters and round-trips through dict, JSON and TOML — or refused in one line; nothing on disk changes."""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from typing import Any

import attrs
import pytest
from fuzz_util import REFUSED, corrupt, outcome
from hypothesis import given
from hypothesis import strategies as st

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.registry import default_registry
from hloforge.core.spec import NetSpec
from hloforge.zoo import NETS, get_net

REG = default_registry()
KINDS = REG.names("layer")
SMALL = ["mnist-linear", "mnist-mlp", "mnist-cnn", "resnet-mini", "mobilenetv2-mini", "mobilenetv3-mini", "unet-mini",
         "tinygpt-nano", "vit-mini", "ddpm-mini", "yolov1-mini", "fpn-mini", "convnext-mini", "efficientnet-mini"]
BASES = {n: get_net(n).to_dict() for n in SMALL if n in NETS}
STRINGS = ["relu", "gelu", "identity", "same", "valid", "dense", "flash", "ln", "bn", "sequence", "", "x" * 3]
SIZES = st.sampled_from([0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**30, -(2**63)])
SCALAR = st.one_of(st.none(), st.booleans(), SIZES, st.integers(-4, 64), st.floats(), st.sampled_from(STRINGS),
                   st.text(max_size=6))
JUNK = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=4), inner, max_size=2)),
                    max_leaves=6)


def _fields(kind: str) -> list[str]:
    try:
        return [f.name for f in attrs.fields(REG.get("layer", kind))]
    except Exception:  # noqa: BLE001 - an unknown kind has no fields
        return []


@st.composite
def mutated(draw: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.integers(1, 3))):
        layers = d.get("layers")
        what = draw(st.sampled_from(["top", "drop_top", "shape", "field", "drop_field", "kind", "insert",
                                     "delete_layer", "classes"]))
        if what == "top":
            d[draw(st.sampled_from(["name", "input_shape", "num_classes", "layers", "extra"]))] = draw(JUNK)
        elif what == "drop_top" and d:
            d.pop(draw(st.sampled_from(sorted(d))))
        elif what == "shape":
            d["input_shape"] = draw(st.lists(st.one_of(SIZES, st.integers(1, 40)), max_size=4))
        elif what == "classes":
            d["num_classes"] = draw(st.one_of(SIZES, st.integers(1, 20), st.floats(1, 20)))
        elif isinstance(layers, list) and layers and all(isinstance(ld, dict) for ld in layers):
            i = draw(st.integers(0, len(layers) - 1))
            ld = layers[i]
            names = _fields(str(ld.get("kind")))
            if what == "field":
                key = draw(st.one_of(st.sampled_from(names), st.text(max_size=5)) if names else st.text(max_size=5))
                ld[key] = draw(st.one_of(SIZES, st.integers(-2, 9), JUNK))
            elif what == "drop_field" and len(ld) > 1:
                ld.pop(draw(st.sampled_from(sorted(ld))))
            elif what == "kind":
                ld["kind"] = draw(st.one_of(st.sampled_from(KINDS), st.text(max_size=6), JUNK))
            elif what == "insert":
                kind = draw(st.sampled_from(KINDS))
                new = {"kind": kind, **{f: draw(st.one_of(st.integers(0, 9), SCALAR))
                                        for f in _fields(kind) if draw(st.booleans())}}
                layers.insert(draw(st.integers(0, len(layers))), new)
            elif what == "delete_layer":
                layers.pop(i)
    return d


def _accepted_spec_works(spec: NetSpec, d: str) -> None:
    """What an accepted spec must do: walk, count, and come back equal through dict, JSON and TOML."""
    spec.walk()
    assert spec.param_count() >= 0
    assert NetSpec.from_dict(spec.to_dict()) == spec
    assert NetSpec.from_dict(json.loads(spec.to_json())) == spec
    path = os.path.join(d, "back.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(spec.to_toml())
    assert NetSpec.from_file(path) == spec


def _load_and_walk(d: dict[str, Any]) -> NetSpec:
    spec = NetSpec.from_dict(d)
    spec.walk()
    return spec


@given(d=mutated())
def test_spec_dict_fuzzed(d):
    with tempfile.TemporaryDirectory() as tmp:
        got = outcome("spec dict", lambda: _load_and_walk(d), ["spec", "net", "layer"], [tmp])
        if got is not REFUSED:
            _accepted_spec_works(got, tmp)


@given(d=mutated(), as_json=st.booleans())
def test_spec_file_fuzzed(d, as_json):
    """The same mutations written as a JSON or TOML file (where TOML can write them) and read by the zoo."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "net.json" if as_json else "net.toml")
        try:
            text = json.dumps(d) if as_json else _to_toml(d)
        except (TypeError, ValueError):
            return  # not writable in this syntax
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        got = outcome("spec file", lambda: _walked(get_net(path)), [path], [tmp])
        if got is not REFUSED:
            _accepted_spec_works(got, tmp)


@given(base=st.sampled_from(sorted(BASES)), as_json=st.booleans(),
       ops=st.lists(st.tuples(st.sampled_from(["truncate", "flip", "append"]), st.integers(0, 4000),
                              st.integers(1, 255)), min_size=1, max_size=3))
def test_spec_file_bytes_fuzzed(base, as_json, ops):
    """A valid spec file truncated, with flipped bytes (invalid UTF-8 among them), or with junk appended."""
    spec = NetSpec.from_dict(BASES[base])
    raw = (spec.to_json() if as_json else spec.to_toml()).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "net.json" if as_json else "net.toml")
        with open(path, "wb") as f:
            f.write(corrupt(raw, ops))
        got = outcome("spec file bytes", lambda: _walked(NetSpec.from_file(path)), [path], [tmp])
        if got is not REFUSED:
            _accepted_spec_works(got, tmp)


def _walked(spec: NetSpec) -> NetSpec:
    spec.walk()
    return spec


def _toml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_scalar(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))  # None has no TOML form


def _to_toml(d: dict[str, Any]) -> str:
    lines = [f"{json.dumps(k)} = {_toml_scalar(v)}" for k, v in d.items()
             if k != "layers" or not (isinstance(v, list) and all(isinstance(x, dict) for x in v))]
    layers = d.get("layers")
    if isinstance(layers, list) and all(isinstance(x, dict) for x in layers):
        for ld in layers:
            lines.append("[[layers]]")
            lines += [f"{json.dumps(k)} = {_toml_scalar(v)}" for k, v in ld.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ what the properties found (each failed before)
def _mlp(**top: Any) -> dict[str, Any]:
    return {**copy.deepcopy(BASES["mnist-mlp"]), **top}


@pytest.mark.parametrize("change, match", [
    ({"input_shape": [1, 28.5, 28]}, r"input_shape must be a list of positive integers, got \[1, 28.5, 28\]"),
    ({"num_classes": 10.0}, r"num_classes must be a positive integer, got 10.0"),
    ({"name": ["x"]}, r"name must be a non-empty string"),
    ({"layers": {"kind": "dense"}}, r"layers must be a list of tables"),
    ({"loss": "ce"}, r"unknown key\(s\) \['loss'\]"),
], ids=["float-size", "float-classes", "list-name", "layers-table", "unknown-key"])
def test_bad_top_level_values_are_refused(change, match):
    with pytest.raises(UnsupportedSpec, match=match):
        NetSpec.from_dict(_mlp(**change))


@pytest.mark.parametrize("kind, opts, match", [
    ("dense", {"units": "64"}, r"option units='64' is not of its type int"),  # TypeError before
    ("dense", {"units": [64]}, r"option units=\(64,\) is not of its type int"),
    ("batchNorm", {"eps": float("nan")}, r"option eps=nan is not of its type float"),
    ("conv2d", {"out": 4, "groups": 0}, r"groups must be positive, got 0$"),  # ZeroDivisionError before
    ("conv2d", {"out": 4, "stride": 0}, r": stride must be positive, got 0$"),  # was "out, k, stride and groups"
    ("maxPool", {"stride": 0}, r"k and stride must be positive"),  # silently stride k before
    ("residualStage", {"out": 4, "n": 2**31}, r"a stage needs 1..1000 blocks"),  # hung before
    ("dense", {"units": 2**62}, r"more than the 1,099,511,627,776"),
])
def test_bad_layer_options_are_refused(kind, opts, match):
    d = {"name": "t", "input_shape": [3, 8, 8], "num_classes": 4,
         "layers": [{"kind": kind, **opts}, {"kind": "flatten"}, {"kind": "dense", "units": 4}]}
    if kind == "dense":
        d["layers"] = [{"kind": "flatten"}, {"kind": kind, **opts}, {"kind": "dense", "units": 4}]
    with pytest.raises(UnsupportedSpec, match=match):
        NetSpec.from_dict(d).walk()


def test_python_specs_are_checked_too():
    from hloforge.plugins.layers.dense import Dense, Flatten

    with pytest.raises(UnsupportedSpec, match=r"input_shape must be a list of positive integers"):
        NetSpec("t", (3.5,), [Dense(3)], 3)  # truncated to 3 before
    with pytest.raises(UnsupportedSpec, match=r"layer 1 \(dense\(units='3'.*not of its type int"):
        NetSpec("t", (2, 2), [Flatten(), Dense("3")], 3).walk()  # type: ignore[arg-type]


def test_unreadable_spec_files_are_one_line(tmp_path):
    bad = tmp_path / "net.toml"
    bad.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(UnsupportedSpec) as e:  # was the codec's "'utf-8' codec can't decode byte 0xe9 in position 11"
        NetSpec.from_file(str(bad))
    assert str(e.value) == f"{bad}: cannot read it as a UTF-8 spec file (byte 0xe9 at offset 11 is not UTF-8)"
    bad.write_text(NetSpec.from_dict(_mlp(num_classes=7)).to_toml())
    with pytest.raises(UnsupportedSpec, match=r"^.*net.toml: net 'mnist-mlp' ends in shape \[10\], expected \[7\]"):
        NetSpec.from_file(str(bad))  # named the net only before, not the file
    js = tmp_path / "net.json"
    js.write_text(json.dumps(_mlp()).replace('"units": 512', '"units": NaN', 1))
    with pytest.raises(UnsupportedSpec, match=r"net.json: not a valid spec file: NaN is not a number"):
        NetSpec.from_file(str(js))
