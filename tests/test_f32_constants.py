"""A number the programs take as f32 is one f32 holds, or one line: a normaliser's ε in a spec file of 1e300
was an internal error at render (struct's OverflowError packing it), and one of 1e-60 silently 0."""

from __future__ import annotations

import pytest

from hloforge.cli import main
from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.core.ssa import float_literal


@pytest.mark.parametrize("kind", ["batchNorm", "layerNormLast"])
@pytest.mark.parametrize("eps", [1e300, 1e-60, 0.0])
def test_a_normalisers_eps_f32_cannot_hold_is_refused_as_the_spec_is_read(kind, eps) -> None:
    shape = [1, 28, 28] if kind == "batchNorm" else [4, 8]
    spec = {"name": "x", "input_shape": shape, "num_classes": 10,
            "layers": [{"kind": kind, "eps": eps}, {"kind": "flatten"}, {"kind": "dense", "units": 10}]}
    with pytest.raises(UnsupportedSpec, match=r"eps must be a positive number that f32 holds \(1\.2e-38 to 3\.4e38 "
                                              r"in size\), got "):
        NetSpec.from_dict(spec).walk()
    NetSpec.from_dict({**spec, "layers": [{"kind": kind, "eps": 1e-5}, *spec["layers"][1:]]}).walk()


def test_through_the_cli_it_is_one_line_exit_3(tmp_path, capsys) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"name":"x","input_shape":[1,28,28],"num_classes":10,"layers":[{"kind":"batchNorm",'
                    '"eps":1e300},{"kind":"flatten"},{"kind":"dense","units":10}]}')
    for command in (["train", str(path), "--epochs", "1", "--no-progress", "--run-dir", str(tmp_path / "r")],
                    ["render", str(path), "--out", str(tmp_path / "d")]):
        assert main(command) == 3
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "eps must be a positive number that f32 holds" in err, err


def test_any_constant_past_f32s_range_is_refused_as_it_is_printed() -> None:
    """The printer's own guard, for an option no check of its layer or loss bounds."""
    assert float_literal(3.0e38, "f32") == "0x7F61B1E6"
    with pytest.raises(UnsupportedSpec, match=r"^the constant 1e\+300 is beyond float32's range"):
        float_literal(1e300, "f32")
    assert float_literal(float("inf"), "f32") == "0x7F800000"  # inf itself prints (masks' −inf, max's init)
