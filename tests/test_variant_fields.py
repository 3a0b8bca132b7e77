"""The Variant's fields are defined once (hloforge.core.variant.VariantFields, each with its `option`): the
command line's flags and TrainConfig's variant keys are made from them, so a field added there is a flag
and a config key with no other edit, and a config.toml written before still loads."""

from __future__ import annotations

import argparse
import types
import typing

import attrs
import pytest

from hloforge.cli import parser, train_config, variant_flags
from hloforge.core.variant import OPTION, Variant, VariantFields, option
from hloforge.train.config import TrainConfig, load_config

FIELDS = attrs.fields(Variant)


def _sub(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]  # type: ignore[no-any-return]


def _flag(p: argparse.ArgumentParser, name: str) -> argparse.Action:
    hit = [a for a in p._actions if a.dest == name and a.option_strings]
    assert len(hit) == 1, (name, [a.option_strings for a in hit])
    return hit[0]


def _sample(f: attrs.Attribute) -> tuple[str, object]:  # type: ignore[type-arg]
    """A value other than the field's default, as text on the command line and as parsed."""
    o = f.metadata[OPTION]
    if o.choices:
        return o.choices[-1], o.choices[-1]
    hint = typing.get_type_hints(Variant)[f.name]
    kind = next(t for t in (typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,))
                if t is not type(None))
    if typing.get_origin(kind) is tuple:  # a repeated flag: one item (frozen's "0" is a prefix)
        return "0", ("0",)
    return {int: ("2", 2), float: ("0.5", 0.5), str: ("abc", "abc")}[kind]


def test_variant_adds_no_field_of_its_own():
    # a field on Variant but not VariantFields would be a flag with no config key
    assert [f.name for f in FIELDS] == [f.name for f in attrs.fields(VariantFields)]
    assert all(OPTION in f.metadata and f.metadata[OPTION].help for f in FIELDS)


def test_train_config_restates_no_variant_field():
    assert issubclass(TrainConfig, VariantFields)
    own = set(TrainConfig.__dict__.get("__annotations__", {}))
    assert own & {f.name for f in FIELDS} == {"loss"}  # loss alone: its default is "the net's", not crossEntropy
    config = attrs.fields_dict(TrainConfig)
    assert all(config[f.name].default == f.default for f in FIELDS if f.name != "loss")


@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
def test_every_variant_field_is_a_train_and_render_flag_and_reaches_the_variant(field, tmp_path):
    flag = field.metadata[OPTION].flag or "--" + field.name.replace("_", "-")
    for command in ("train", "render"):
        a = _flag(_sub(command), field.name)
        assert a.option_strings == [flag] and field.metadata[OPTION].help in a.help
    text, value = _sample(field)
    cfg = train_config(parser().parse_args(["train", flag, text]))
    assert getattr(cfg, field.name) == value and getattr(cfg.variant(), field.name) == value
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml(), encoding="utf-8")
    assert load_config(str(path)) == cfg


def test_a_field_added_through_option_is_a_flag():
    @attrs.frozen
    class Wider(Variant):
        warmup_ema: float = option(0.0, "a field this test adds", metavar="W")
        keep: tuple[str, ...] = option((), "names kept (repeatable)", flag="--keep-only", repeat=True,
                                       converter=lambda v: (v,) if isinstance(v, str) else tuple(v))

    p = argparse.ArgumentParser()
    variant_flags(p, Wider)
    a = _flag(p, "warmup_ema")
    assert a.option_strings == ["--warmup-ema"] and a.metavar == "W"
    assert a.help == "a field this test adds (default 0.0)"
    assert p.parse_args(["--warmup-ema", "0.25"]).warmup_ema == 0.25
    assert _flag(p, "keep").option_strings == ["--keep-only"]
    args = p.parse_args(["--keep-only", "a", "b", "--keep-only", "c"])
    assert Wider(keep=args.keep).keep == ("a", "b", "c")
    with pytest.raises(SystemExit):  # the Variant's own rules still run at parse time (ema in [0, 1))
        p.parse_args(["--ema", "1"])


def test_a_config_toml_written_before_the_derivation_loads(tmp_path):
    # config.toml as main wrote it (the variant keys among the run's, in TrainConfig's old order)
    old = """net = "mnist-linear"\ndata = "digits"\nepochs = 1\nbatch = 64\noptimizer = "sgd"\nlr = 0.001
weight_decay = 0.01\nlabel_smoothing = 0.1\nloss = ""\ndiffusion_steps = 1000\nema = 0.9\naccum = 2\nclip = 1.0
mixup = 0.2\ncutmix = 0.0\ndropout = 0.1\ndrop_path = 0.0\nbn_eps = 0.001\nprecision = "fp8"\nbn_momentum = 0.9
seed = 0\nlog_every = 50\nautotune = false\ntuned = []\n"""
    path = tmp_path / "config.toml"
    path.write_text(old, encoding="utf-8")
    cfg = load_config(str(path))
    assert cfg.variant() == Variant("sgd", 0.01, "crossEntropy", 0.1, ema=0.9, accum=2, clip=1.0, mixup=0.2,
                                    dropout=0.1, bn_eps=0.001, precision="fp8")
    assert cfg == TrainConfig(net="mnist-linear", epochs=1, optimizer="sgd", weight_decay=0.01, label_smoothing=0.1,
                              ema=0.9, accum=2, clip=1.0, mixup=0.2, dropout=0.1, bn_eps=0.001, precision="fp8")


def test_a_config_value_of_the_wrong_kind_for_a_tuple_field_is_one_line(tmp_path):
    from hloforge.core.errors import UnsupportedSpec

    path = tmp_path / "config.toml"
    path.write_text("frozen = 5\n", encoding="utf-8")
    with pytest.raises(UnsupportedSpec, match="frozen prefixes 5: expected a list"):
        load_config(str(path))
