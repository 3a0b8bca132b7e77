"""A net written by hand: the mistakes a user makes in a spec file or a NetSpec, each one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloforge.cli import main
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.plugins.layers.conv import Conv2d


def test_a_json_key_given_twice_is_refused_not_the_last_one_kept(tmp_path: Path, capsys) -> None:
    # json would keep k=5 without a word: a 5x5 conv where the file also says 3x3
    text = ('{"name": "twice", "input_shape": [1, 8, 8], "num_classes": 4, "layers": '
            '[{"kind": "conv2d", "out": 4, "k": 3, "k": 5}, {"kind": "globalAvgPool"}]}')
    with pytest.raises(UnsupportedSpec, match=r"^JSON spec text: not a valid spec: key 'k' is given twice"):
        NetSpec.from_json(text)
    path = tmp_path / "net.json"
    path.write_text(text)
    assert main(["summary", str(path)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "net.json: not a valid spec file: key 'k' is given twice in one object (3, then 5)" in err
    # the same key in two layers is no repeat
    ok = text.replace(', "k": 5', "").replace('{"kind": "globalAvgPool"}', '{"kind": "conv2d", "out": 4, "k": 3}, '
                                                                          '{"kind": "globalAvgPool"}')
    assert NetSpec.from_json(ok).layers[:2] == (Conv2d(4, k=3), Conv2d(4, k=3))


@pytest.mark.parametrize("name", ["net 😀", "del\x7fchar", 'quote " back \\ tab \t', "网络-ü"])
def test_any_name_to_toml_reads_back(name: str, tmp_path: Path) -> None:
    # json.dumps wrote 😀 as a surrogate pair (\ud83d\ude00), which no TOML reader takes, and DEL raw
    spec = NetSpec(name, (1, 8, 8), [Conv2d(4, k=3)], 4)
    path = tmp_path / "net.toml"
    path.write_text(spec.to_toml(), encoding="utf-8")
    assert NetSpec.from_file(str(path)) == spec


@pytest.mark.parametrize("layers, says", [
    (Conv2d(4), r"^layers must be a list of layers, got one Conv2d layer, not a list; wrap it: \[Conv2d\(\.\.\.\)\]$"),
    (None, r"^layers must be a list of layers, got None \(type NoneType\)$"),
    ("conv2d", r"^layers must be a list of layers, got 'conv2d' \(type str\)$"),
], ids=["one-layer", "none", "a-name"])
def test_layers_that_are_no_list_are_one_line(layers, says: str) -> None:
    # NetSpec(name, shape, Conv2d(4), 4) was Python's TypeError "'Conv2d' object is not iterable"
    with pytest.raises(UnsupportedSpec, match=says):
        NetSpec("one", (1, 8, 8), layers, 4)
    assert NetSpec("one", (1, 8, 8), (layer for layer in [Conv2d(4)]), 4).layers == (Conv2d(4),)


@pytest.mark.parametrize("kind, near", [("conv2", "conv2d"), ("Conv2D", "conv2d"), ("maxpool", "maxPool"),
                                        ("residual", "residualStage"), ("zzz", None)])
def test_a_misspelt_layer_kind_names_the_near_one(kind: str, near: str | None, tmp_path: Path, capsys) -> None:
    path = tmp_path / "net.toml"
    path.write_text(f'name = "typo"\ninput_shape = [1, 8, 8]\nnum_classes = 4\n[[layers]]\nkind = "{kind}"\nout = 4\n')
    assert main(["summary", str(path)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"net.toml: layer 0: unknown layer {kind!r}; registered: " in err
    assert err.endswith(f"(hloforge); did you mean {near!r}?") if near else "did you mean" not in err


HEAD = 'name = "t"\ninput_shape = [784]\nnum_classes = 10\n'
DENSE = 'kind = "dense"\nunits = 10\n'


@pytest.mark.parametrize("text, says", [
    # the spec's own keys written below a [[layers]] header are that layer's options
    (f"[[layers]]\n{DENSE}{HEAD}", "missing key(s) ['input_shape', 'name', 'num_classes']; expected name, "
     "input_shape, num_classes, layers; the last [[layers]] table holds ['name', 'input_shape', 'num_classes']: "
     "TOML puts every key after a [[layers]] header into that layer, so write them above the first [[layers]]"),
    (f"{HEAD}[[layer]]\n{DENSE}", "missing key(s) ['layers']; expected name, input_shape, num_classes, layers; "
     "did you mean 'layers' (not 'layer')?"),
    (f"{HEAD}[layers]\n{DENSE}", "layers must be a list of tables (each with a 'kind'), got one table "
     "{'kind': 'dense', 'units': 10}; in TOML each layer goes under its own [[layers]] header (two brackets)"),
    # a run's config.toml given as the net: was the missing keys alone
    ('net = "mnist-linear"\nepochs = 1\n', "missing key(s) ['input_shape', 'layers', 'name', 'num_classes']; "
     "expected name, input_shape, num_classes, layers; it is train's options (a config.toml, of net "
     "'mnist-linear'), not a net: give the net itself, or the file as train's --config"),
], ids=["keys-below-a-layer", "layer-for-layers", "one-bracket", "a-config"])
def test_a_toml_spec_laid_out_wrong_says_where(text: str, says: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "net.toml"
    path.write_text(text)
    assert main(["summary", str(path)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"net.toml: {says}" in err


def test_a_spec_file_given_as_a_pathlib_path_is_read_as_its_str(tmp_path: Path) -> None:
    # hf.Model(Path(...)) was "net must be a NetSpec, a zoo name or a spec file path, got PosixPath", and
    # NetSpec.from_file(Path(...)) an AttributeError, where save and hf.load take a Path
    import hloforge as hf

    spec = NetSpec("by-path", (1, 8, 8), [Conv2d(4, k=3)], 4)
    path = tmp_path / "net.toml"
    path.write_text(spec.to_toml())
    assert NetSpec.from_file(path) == spec
    by_path, by_str = hf.Model(path), hf.Model(str(path))
    assert by_path.spec == by_str.spec == spec and by_path._net_ref == by_str._net_ref == str(path)
    with pytest.raises(UnsupportedSpec, match=r"got dict \(a spec's dict is hf\.NetSpec\.from_dict\(d\)\)$"):
        hf.Model(spec.to_dict())
