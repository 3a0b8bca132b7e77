"""Every numeric option of every `hloforge` command, fuzzed: a value is accepted and works (train's
config checks and reads back from its config.toml as given), or it is refused at parse time with
one line naming the flag and what it expects — never a traceback, never a run directory."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import subprocess
import sys
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hloforge.cli import F32_MAX, I64_MAX, parser, train_config
from hloforge.commands.argtypes import path as path_arg
from hloforge.commands.argtypes import plugin_name
from hloforge.core.errors import HloforgeError
from hloforge.train.trainer import TrainConfig, load_config

PARSER = parser()
# what each command needs before its flags (nothing is read: parsing only)
POSITIONALS = {"render": ["mnist-linear", "--out", "OUT"], "eval": ["RUN"], "generate": ["RUN"], "sample": ["RUN"],
               "detect": ["RUN"], "cam": ["RUN", "test:0"], "classify": ["RUN", "IMAGE"], "prepare": ["SRC", "OUT"],
               "summary": ["mnist-linear"],
               "import-weights": ["torchvision:resnet18", "W.safetensors", "--out", "OUT"]}


def _typed_options() -> list[tuple[tuple[str, ...], str, argparse.Action]]:
    """(command path, flag, action) of every option that parses its value with a numeric type function (not a name
    or a path)."""
    found = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, q in a.choices.items():
                    walk(q, (*path, name))
            elif a.type not in (None, plugin_name, path_arg) and a.option_strings:
                found.append((path, a.option_strings[-1], a))

    walk(PARSER, ())
    return found


OPTIONS = _typed_options()
# the edges every option is tried with: zero, negative, nan, inf, huge, non-numeric, and a few plain ones
EDGES = ["0", "-0", "-1", "1", "2", "0.5", "1.5", "1e-3", "nan", "-nan", "inf", "-inf", "1e400", "1e39", "3e38",
         str(I64_MAX), str(I64_MAX + 1), "9" * 30, "9" * 40, "1e3", "0x10", "", " ", "abc", "1,2", "3,32,32",
         "1_000", "٣"]


def attempt(path: tuple[str, ...], flag: str, value: str) -> tuple[argparse.Namespace | None, str]:
    """Parse `hloforge PATH [positionals] FLAG=VALUE`: (the namespace, "") or (None, stderr)."""
    argv = [*path, *POSITIONALS.get(path[0], []), f"{flag}={value}"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return PARSER.parse_args(argv), ""
        except SystemExit as e:
            assert e.code == 2, (argv, e.code, err.getvalue())
    return None, err.getvalue()


def check(path: tuple[str, ...], flag: str, action: argparse.Action, value: str, tmp: str) -> str:
    args, err = attempt(path, flag, value)
    if args is None:  # refused: one line, naming the flag
        lines = err.strip().splitlines()
        assert len(lines) == 1, (flag, value, err)
        prog = " ".join(("hloforge", *path))
        assert lines[0].startswith(f"{prog}: error: argument {'/'.join(action.option_strings)}: "), (flag, value, err)
        return "refused"
    v = getattr(args, action.dest)
    for x in (v if isinstance(v, tuple) else (v,)):  # --input's dims, or the value
        assert type(x) in (int, float), (flag, value, v)
        assert (-I64_MAX - 1 <= x <= I64_MAX) if type(x) is int else abs(x) <= F32_MAX, (flag, value, v)
    if path == ("train",):
        try:  # a combination the config refuses (replicas that do not split the batch) is one line too
            cfg = train_config(args)
            cfg.check()
            cfg.variant()
        except HloforgeError as e:
            assert len(str(e).splitlines()) == 1, e
            return "refused by the config"
        toml = os.path.join(tmp, "config.toml")
        with open(toml, "w", encoding="utf-8") as f:
            f.write(cfg.to_toml())
        assert load_config(toml) == cfg, (flag, value)  # what --config reads back is what ran
    return "accepted"


def test_every_numeric_option_is_walked():
    flags = {(p, f) for p, f, _ in OPTIONS}
    for want in [(("train",), "--epochs"), (("train",), "--warmup-epochs"), (("train",), "--ema"),
                 (("train",), "--seed"), (("train",), "--input"), (("eval",), "--replicas"),
                 (("sample",), "-n"), (("generate",), "--temperature"), (("detect",), "--score"),
                 (("cam",), "--class"), (("classify",), "--top"), (("render",), "--batch"),
                 (("prepare", "brats"), "--val-frac")]:
        assert want in flags, want
    assert len(OPTIONS) > 50


@pytest.mark.parametrize("path,flag,action", OPTIONS, ids=[" ".join((*p, f)) for p, f, _ in OPTIONS])
def test_each_option_at_the_edges(path, flag, action, tmp_path):
    outcomes = {v: check(path, flag, action, v, str(tmp_path)) for v in EDGES}
    # never a non-finite value, nor one f32 (a float) or TOML's i64 (an int) cannot hold: `check` asserts
    # an accepted value's range, so 2**63 may pass as a float but never as an int
    for v in ("nan", "-nan", "inf", "-inf", "1e400", "1e39", "9" * 40, "", "abc"):
        assert outcomes[v] == "refused", (flag, v, outcomes[v])
    assert "accepted" in outcomes.values(), (flag, outcomes)  # and some plain value goes through


VALUES = st.one_of(
    st.sampled_from(EDGES),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-10, 10).map(lambda x: f"{x:g}"),
    st.text(max_size=8),
)


@settings(deadline=None)
@given(option=st.sampled_from(OPTIONS), value=VALUES)
def test_numeric_options_fuzzed(option, value, tmp_path_factory):
    path, flag, action = option
    check(path, flag, action, value, str(tmp_path_factory.mktemp("cfg")))


@pytest.mark.parametrize("argv,needle", [
    (["--warmup-epochs", "inf"], "argument --warmup-epochs: expected a finite number ≥ 0"),  # issue 22, defect 2
    (["--epochs", "nan"], "argument --epochs: expected an integer ≥ 1, got 'nan'"),
    (["--seed", "-1"], "argument --seed: expected an integer ≥ 0, got '-1'"),
    (["--ema", "1"], "argument --ema: ema decay must be in [0, 1)"),
    (["--workers", "100000"], "argument --workers: expected an integer from 0 to 1024"),
    (["--backend", ""], "argument --backend: expected a name, got ''"),  # was xla, unsaid
])
def test_refused_in_a_real_process_with_one_line_and_no_run_dir(argv, needle, tmp_path):
    r = subprocess.run([sys.executable, "-m", "hloforge.cli", "train", *argv], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_edge_values_accepted_in_a_real_process_train_and_read_back(tmp_path):
    """Edge-but-valid values work: a warm-up of all but the run's last step, the largest seed, one step an epoch
    (a warm-up as long as the run, or of less than one step, is refused: tests/test_run_mistakes.py)."""
    argv = [sys.executable, "-m", "hloforge.cli", "train", "mnist-linear", "--epochs", "2", "--batch", "1437",
            "--warmup-epochs", "1.999", "--seed", str(I64_MAX), "--clip", "0", "--no-progress", "--run-dir", "r"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "r" / "config.toml", "rb") as f:
        d = tomllib.load(f)
    assert d["seed"] == I64_MAX and d["warmup_epochs"] == 1.999 and math.isfinite(d["lr"])
    assert load_config(str(tmp_path / "r" / "config.toml")) == TrainConfig(**d)


@pytest.mark.parametrize("argv,unknown", [
    (["eval", "RUN", "--batch-stat"], "--batch-stat"),  # was read as --batch-stats
    (["train", "--epoch", "2"], "--epoch"),  # a typo of --epochs, taken as it (2 is then the net)
])
def test_a_flag_is_taken_only_as_spelled_in_full(argv: list[str], unknown: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        PARSER.parse_args(argv)
    assert e.value.code == 2 and f"unrecognized arguments: {unknown}" in err.getvalue(), err.getvalue()


def test_the_bench_parser_takes_no_prefix_either() -> None:
    from hloforge.bench.cli import parser as bench_parser

    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        bench_parser().parse_args(["--round", "2"])


def test_detects_image_may_follow_its_flags(capsys) -> None:
    """argparse took no IMAGE before the flag and called the one after it unrecognized: `detect RUN --score 0.1
    img.png` was refused, and `detect RUN --index 0 img.png` said so, not that detect takes one of the two."""
    from hloforge.cli import main

    ns = PARSER.parse_args(["detect", "RUN", "--score", "0.1", "img.png"])
    assert (ns.run, ns.image, ns.score) == ("RUN", "img.png", 0.1)
    assert main(["detect", "RUN", "--index", "0", "img.png"]) == 3
    assert capsys.readouterr().err == ("hloforge: error: detect takes an image file or --index N (a test image of the "
                                       "run's dataset), one of them\n")
    with pytest.raises(SystemExit):
        PARSER.parse_args(["detect", "RUN", "--score", "0.1", "img.png", "more.png"])
    assert "unrecognized arguments: more.png" in capsys.readouterr().err
