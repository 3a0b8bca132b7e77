"""NetSpec: parameter counts, round trips, validation messages and initialisation rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from hloforge.core.errors import PluginError, UnsupportedSpec
from hloforge.core.spec import NetSpec, ParamSlot
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.dense import Dense, Flatten
from hloforge.plugins.layers.pool import GlobalAvgPool, MaxPool
from hloforge.zoo import NETS, get_net

ZOO_COUNTS = {"mnist-linear": 7_850, "mnist-mlp": 669_706, "mnist-cnn": 1_676_266}


@pytest.mark.parametrize("name, count", sorted(ZOO_COUNTS.items()))
def test_zoo_param_counts(name: str, count: int) -> None:
    spec = get_net(name)
    assert spec.param_count() == count
    assert sum(math.prod(a.shape) for a in spec.init_params(0)) == count


def test_param_names_and_order() -> None:
    names = [n for n, _ in get_net("mnist-cnn").params()]
    assert names == ["0.w", "0.b", "1.w", "1.b", "3.w", "3.b", "4.w", "4.b", "7.w", "7.b", "8.w", "8.b"]
    slots = dict(get_net("mnist-cnn").params())
    assert slots["0.w"].shape == (32, 1, 3, 3) and slots["7.w"].shape == (64 * 7 * 7, 512)
    assert slots["0.w"].decay and not slots["0.b"].decay


def odd_spec() -> NetSpec:
    """Every option type a layer has: ints, strings, bools, None, an int pad, groups."""
    return NetSpec("odd net/v2", (4, 9, 9), [
        Conv2d(8, k=3, stride=2, pad=1, groups=2, act="hSwish", bias=False),
        MaxPool(3, stride=None, pad="same"), Conv2d(6, k=1, pad="valid", act="gelu"), GlobalAvgPool(),
        Dense(5, act="relu6"), Dense(3),
    ], 3)


SPECS = [*(f() for f in NETS.values()), odd_spec()]


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_round_trips(spec: NetSpec, tmp_path: Path) -> None:
    spec.walk()
    assert NetSpec.from_dict(spec.to_dict()) == spec
    assert NetSpec.from_dict(json.loads(spec.to_json())) == spec
    toml_path = tmp_path / "net.toml"
    toml_path.write_text(spec.to_toml())
    back = NetSpec.from_file(str(toml_path))
    assert back == spec and hash(back) == hash(spec)
    json_path = tmp_path / "net.json"
    json_path.write_text(spec.to_json())
    assert NetSpec.from_file(str(json_path)) == spec
    assert get_net(str(toml_path)) == spec  # the zoo accepts a spec file too


def test_specs_are_values() -> None:
    a, b = get_net("mnist-cnn"), get_net("mnist-cnn")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != get_net("mnist-mlp")
    assert Conv2d(4) != Conv2d(4, act="relu")
    assert "Conv2d(out=32" in repr(a)
    with pytest.raises(AttributeError):
        a.name = "other"  # type: ignore[misc]
    assert odd_spec().ident == "odd_net_v2"


def test_toml_refuses_a_none_it_cannot_write(tmp_path: Path) -> None:
    spec = NetSpec("bad", (3,), [Dense(None)], 3)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedSpec, match=r"layer 0 \(dense\): option units=None"):
        spec.to_toml()


# ------------------------------------------------------------------ validation
def test_unknown_layer_kind_is_named() -> None:
    d = get_net("mnist-mlp").to_dict()
    d["layers"][1]["kind"] = "dnese"
    with pytest.raises(PluginError, match=r"^spec: layer 1: unknown layer 'dnese'; registered: .*dense \(hloforge\)"):
        NetSpec.from_dict(d)


def test_bad_dicts_name_the_source_and_layer(tmp_path: Path) -> None:
    d = get_net("mnist-mlp").to_dict()
    d["layers"][2]["unitz"] = 3
    with pytest.raises(UnsupportedSpec, match=r"^spec: layer 2: .*dense.*unitz"):
        NetSpec.from_dict(d)
    d = get_net("mnist-mlp").to_dict()
    del d["layers"][0]["kind"]
    with pytest.raises(UnsupportedSpec, match=r"layer 0 has no 'kind'"):
        NetSpec.from_dict(d)
    with pytest.raises(UnsupportedSpec, match=r"missing key\(s\) \['num_classes'\]"):
        NetSpec.from_dict({"name": "x", "input_shape": [3], "layers": []})
    bad = tmp_path / "broken.toml"
    bad.write_text("name = \n")
    with pytest.raises(UnsupportedSpec, match="broken.toml: not a valid spec file"):
        NetSpec.from_file(str(bad))


def test_dense_after_conv_without_flatten() -> None:
    spec = NetSpec("noflat", (1, 8, 8), [Conv2d(4), Dense(10)], 10)
    with pytest.raises(UnsupportedSpec) as ei:
        spec.walk()
    msg = str(ei.value)
    assert msg.startswith("layer 1 (dense(units=10")
    assert "on input [4, 8, 8]" in msg and "add a flatten layer first" in msg


def test_wrong_final_width() -> None:
    spec = NetSpec("narrow", (784,), [Dense(64, act="relu"), Dense(9)], 10)
    with pytest.raises(UnsupportedSpec, match=r"net 'narrow' ends in shape \[9\], expected \[10\] \(num_classes\)"):
        spec.param_count()
    with pytest.raises(UnsupportedSpec, match="has no layers"):
        NetSpec("empty", (3,), [], 3).walk()


@pytest.mark.parametrize("layers, index, reason", [
    ([Conv2d(4, pad="bogus")], 0, "pad must be 'same', 'valid' or a non-negative int, got 'bogus'"),
    ([Conv2d(4, pad=-1)], 0, "pad must be"),
    ([Conv2d(8), Conv2d(6, groups=4)], 1, "groups=4 must divide in channels 8 and out channels 6"),
    ([Conv2d(4, act="relu"), Conv2d(4, act="mish")], 1, "unknown activation 'mish'"),
    ([Conv2d(4, k=9, pad="valid")], 0, "kernel 9 does not fit a 8x8 input"),
    ([Conv2d(4), MaxPool(3, pad=3)], 1, "would make windows of only padding"),
    ([Flatten(), Dense(0)], 1, "units must be positive"),
    ([Flatten(), Dense(4, act="Relu")], 1, "unknown activation 'Relu'"),
])
def test_bad_options_name_the_layer(layers: list, index: int, reason: str) -> None:
    spec = NetSpec("bad", (3, 8, 8), [*layers, Flatten(), Dense(2)], 2)
    with pytest.raises(UnsupportedSpec) as ei:
        spec.walk()
    msg = str(ei.value)
    assert msg.startswith(f"layer {index} ({layers[index].kind}("), msg
    assert reason in msg


# ------------------------------------------------------------------ initialisation
def test_init_is_deterministic_per_seed() -> None:
    spec = get_net("mnist-cnn")
    a, b, c = spec.init_params(7), spec.init_params(7), spec.init_params(8)
    assert all(x.dtype == np.float32 for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    weights = [i for i, (_, s) in enumerate(spec.params()) if s.init in ("he_fan_out", "glorot")]
    assert all(not np.array_equal(a[i], c[i]) for i in weights)
    # Seeded per slot position: appending a layer moves no other layer's initial values.
    longer = NetSpec("longer", spec.input_shape, [*spec.layers, Dense(3)], 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, longer.init_params(7), strict=False))


def test_he_fan_out_for_conv_kernels() -> None:
    # oc·k·k = 8·9 = 72 (fan-out) vs ic·k·k = 64·9 = 576 (fan-in): the bound tells them apart.
    slot = ParamSlot("w", (8, 64, 3, 3), "he_fan_out", True)
    w = slot.initial(np.random.default_rng(0)).astype(np.float64)
    bound = math.sqrt(6.0 / 72)
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.99 * bound
    assert abs(w.var() / (2.0 / 72) - 1.0) < 0.05
    assert abs(w.mean()) < 0.01
    # Through a spec: the first mnist-cnn kernel is 32·3·3.
    w0 = get_net("mnist-cnn").init_params(1)[0]
    assert np.abs(w0).max() <= math.sqrt(6.0 / (32 * 9))


def test_glorot_for_dense() -> None:
    w = ParamSlot("w", (784, 512), "glorot", True).initial(np.random.default_rng(0)).astype(np.float64)
    bound = math.sqrt(6.0 / (784 + 512))
    assert bound * 0.99 < np.abs(w).max() <= bound
    assert abs(w.var() / (2.0 / (784 + 512)) - 1.0) < 0.02
    spec_w = get_net("mnist-mlp").init_params(0)[2]  # 1.w: [512, 512]
    assert spec_w.shape == (512, 512) and np.abs(spec_w).max() <= math.sqrt(6.0 / 1024)


@pytest.mark.parametrize("init, value", [("ones", 1.0), ("zeros", 0.0), ("layer_scale", 1e-6)])
def test_constant_inits(init: str, value: float) -> None:
    a = ParamSlot("g", (5, 2), init, False).initial(np.random.default_rng(0))
    assert a.shape == (5, 2) and a.dtype == np.float32
    assert np.array_equal(a, np.full((5, 2), value, np.float32))


def test_biases_start_at_zero_and_unknown_init_is_refused() -> None:
    spec = get_net("mnist-mlp")
    for (name, _), a in zip(spec.params(), spec.init_params(3), strict=True):
        if name.endswith(".b"):
            assert not a.any()
    with pytest.raises(ValueError, match="init"):
        ParamSlot("w", (2, 2), "kaiming", True)


def test_the_walk_is_made_once_per_spec_and_each_caller_gets_its_own_list(monkeypatch) -> None:
    import hloforge.core.spec as spec_module

    calls = []
    real = spec_module.walk_layers
    monkeypatch.setattr(spec_module, "walk_layers", lambda *a: calls.append(1) or real(*a))
    spec = get_net("mnist-cnn")
    first = spec.walk()
    first.clear()  # a caller's list is its own: the next caller still sees every layer
    assert len(spec.walk()) == len(spec.layers) and spec.params() and spec.stats() is not None
    assert spec.out_shape == spec.walk()[-1].out_shape == (10,)
    assert len(calls) == 1
    bad = NetSpec("bad", (1, 8, 8), [Flatten(), Dense(3)], 10)
    for _ in range(2):  # a refusal is not kept as a walk: it is raised again on every call
        with pytest.raises(UnsupportedSpec, match="num_classes"):
            bad.walk()


@pytest.mark.parametrize("name", ["mnist-cnn", "resnet18-cifar", "vit-cifar"])
def test_json_and_toml_text_round_trip(name: str) -> None:
    spec = get_net(name)
    assert NetSpec.from_json(spec.to_json()).to_json() == spec.to_json()
    assert NetSpec.from_toml(spec.to_toml()).to_json() == spec.to_json()


@pytest.mark.parametrize("text, says", [
    ("{", "JSON spec text: not a valid spec: Expecting property name"),
    ("[1, 2]", "JSON spec text: a spec is a table of name, input_shape, num_classes, layers; got list"),
    ('{"name": "x", "input_shape": [3], "num_classes": 2, "layers": [{"kind": "dense", "units": NaN}]}',
     "JSON spec text: not a valid spec: NaN is not a number"),
])
def test_malformed_json_text_is_one_line(text: str, says: str) -> None:
    with pytest.raises(UnsupportedSpec) as e:
        NetSpec.from_json(text)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)
