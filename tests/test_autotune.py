"""The render-time autotuner (hloforge.train.autotune) and the per-layer strategy hook under it.

Timing is injected (a function of the candidate's choices), so no assertion depends on how fast
anything really ran; the real-backend timing path runs once, on a tiny layer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hloforge.core import strategy
from hloforge.core.autodiff import grad
from hloforge.core.errors import BackendError, UnsupportedSpec
from hloforge.core.hlo import Builder, Value
from hloforge.core.modules import train_step_module
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.plugins.layers.conv import Conv2d
from hloforge.plugins.layers.dense import Dense, Flatten
from hloforge.plugins.layers.pool import MaxPool
from hloforge.train import autotune
from hloforge.train.autotune import AutotuneCacheWarning, AutotuneCandidateWarning, Candidate
from hloforge.train.session import TrainSession, make_backend
from hloforge.train.trainer import TrainConfig, train

BATCH = 4
# Two convs at different shapes (two decisions) and a third identical to the second (one reused).
NET = NetSpec("autotune-tiny", (2, 6, 6), [
    Conv2d(3, act="relu"), Conv2d(3, act="relu"), Conv2d(3, act="relu"), Flatten(), Dense(3),
], 3)
NHWC_CONV = "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]"  # the convolution spec of the "nhwc" form
# These tests tune "conv2d", the kind that decides a conv's form inside an NCHW net. XLA's nets are
# NHWC by default (there every conv is NHWC and conv2d is moot), so the activation layout and the
# NHWC conv's backward are pinned: conv2d then has exactly two forms, as these tests count them.
PINNED = "layout=nchw,convGrad=written"


def timed_as(seconds: Callable[[Candidate], float], calls: list[str] | None = None) -> autotune.Prepare:
    """In place of compiling and running on the backend: each run of candidate c 'takes' seconds(c)."""
    def prepare(c: Candidate) -> autotune.Run:
        if calls is not None:
            calls.append(c.label)
        return lambda: seconds(c)
    return prepare


def slow_when(kind: str, choice: str, calls: list[str] | None = None) -> autotune.Prepare:
    """Every candidate with kind=choice takes 5 s, the rest 1 s; the whole net with the plan 0.5 s
    (the plan's check passes)."""
    return timed_as(lambda c: 0.5 if ("plan", "tuned") in c.choices else 5.0 if (kind, choice) in c.choices
                    else 1.0, calls)


def no_timing(c: Candidate) -> autotune.Run:
    raise AssertionError(f"timed {c.label} although the cache should have answered")


@pytest.fixture(scope="module")
def xla() -> object:
    return make_backend("xla")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(strategy.ENV_VAR, PINNED)
    monkeypatch.delenv(autotune.ENV_VAR, raising=False)
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path))


def conv_choices(result: autotune.TuneResult) -> list[str]:
    return [dict(d.choices)["conv2d"] for d in result.decisions if "conv2d" in dict(d.choices)]


# ------------------------------------------------------------------ picking and caching
@pytest.mark.parametrize("slow", ["nchw", "nhwc"])
def test_picks_the_faster_candidate(xla: object, tmp_path: Path, slow: str) -> None:
    res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("conv2d", slow))
    fast = "nhwc" if slow == "nchw" else "nchw"
    assert conv_choices(res) == [fast] * 3
    assert [d.source for d in res.decisions] == ["timed", "timed", "reused"]
    assert res.records() == tuple(f"{i}:conv2d={fast}" for i in range(3))
    assert re.fullmatch(rf"autotune: 3 layers, 1 cached, 2 timed in \d+\.\d s; conv2d {fast}×3", res.summary())


@pytest.mark.parametrize(("nhwc_seconds", "kept"), [(0.97, "nchw"), (0.9, "nhwc")])
def test_the_default_stays_unless_beaten_by_the_margin(xla: object, tmp_path: Path, nhwc_seconds: float,
                                                       kept: str) -> None:
    assert autotune.MARGIN == 0.05  # 3% faster is noise on a shared machine; 10% is a win
    seconds = timed_as(lambda c: nhwc_seconds if ("conv2d", "nhwc") in c.choices else 1.0)
    assert conv_choices(autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=seconds)) == [kept] * 3


def test_second_call_is_answered_by_the_cache(xla: object, tmp_path: Path) -> None:
    calls: list[str] = []
    first = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("conv2d", "nchw", calls))
    # two layers, two forms; then the whole net with the plan and with the defaults
    assert sorted(calls) == ["conv2d=nchw", "conv2d=nchw", "conv2d=nhwc", "conv2d=nhwc", "plan=defaults", "plan=tuned"]
    again = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=no_timing)
    assert again.plan == first.plan and [d.source for d in again.decisions] == ["cached", "cached", "reused"]


class Renamed:
    """The XLA backend under another fingerprint (as after a plugin or compiler upgrade)."""

    name = "xla"

    def __init__(self, inner: object, fingerprint: str):
        self._inner, self._fp = inner, fingerprint

    def fingerprint(self) -> str:
        return self._fp

    def __getattr__(self, attr: str) -> object:
        return getattr(self._inner, attr)


@pytest.mark.parametrize("change", ["shape", "batch", "backend version", "cpu model"])
def test_a_changed_key_misses(xla: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("conv2d", "nchw"))
    spec, batch, backend = NET, BATCH, xla
    if change == "shape":
        spec = NetSpec(NET.name, (2, 7, 7), NET.layers, 3)
    elif change == "batch":
        batch = BATCH * 2
    elif change == "backend version":
        backend = Renamed(xla, "xla of another build")
    else:
        monkeypatch.setattr(autotune, "cpu_model", lambda: "another cpu (2 cores)")
    calls: list[str] = []
    res = autotune.tune(spec, batch, backend, cache_dir=tmp_path, prepare=slow_when("conv2d", "nhwc", calls))
    assert len(calls) == 4 and conv_choices(res) == ["nchw"] * 3


@pytest.mark.parametrize("damage", ["not json", "wrong key", "unknown choice"])
def test_a_damaged_cache_entry_warns_and_is_timed_again(xla: object, tmp_path: Path, damage: str) -> None:
    autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("conv2d", "nchw"))
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 3  # two layers and the whole net's check
    files = [f for f in files if "whole net" not in f.read_text()]
    victim = files[0]
    if damage == "not json":
        victim.write_text('{"key": {"format": 1, "lay')  # cut short
    elif damage == "wrong key":
        victim.write_text(files[1].read_text())  # another layer's entry under this name
    else:
        entry = json.loads(victim.read_text())
        victim.write_text(json.dumps({**entry, "choice": "conv2d=winograd"}))
    calls: list[str] = []
    with pytest.warns(AutotuneCacheWarning, match=re.escape(str(victim))):
        res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("conv2d", "nhwc", calls))
    # the damaged layer re-timed under the new timer, then the whole net under the plan that changed with it
    assert calls == ["conv2d=nchw", "conv2d=nhwc", "plan=defaults", "plan=tuned"] and "nchw" in conv_choices(res)
    entry = json.loads(victim.read_text())  # ... and its entry rewritten whole
    assert entry["choice"] == "conv2d=nchw"


def test_an_unwritable_cache_warns_once_and_the_tuning_goes_on(xla: object, tmp_path: Path) -> None:
    """A cache directory that cannot be made (here under a file; a read-only home, a container's HOME=/).
    Before, every layer's read warned its entry 'damaged' and the first write ended `hloforge train
    --autotune` with the directory's error, every candidate timed for nothing; now one warning, and the
    decisions stand, not kept."""
    (tmp_path / "file").write_text("")
    where = tmp_path / "file" / "autotune"
    with pytest.warns(AutotuneCacheWarning) as said:
        res = autotune.tune(NET, BATCH, xla, cache_dir=where, prepare=slow_when("conv2d", "nchw"))
    assert conv_choices(res) == ["nhwc"] * 3
    assert [str(w.message) for w in said] == [f"autotune cache: cannot write to {where} (Not a directory); timings "
                                              "are not cached ($HLOFORGE_CACHE_DIR names a writable directory)"]


def test_a_cache_on_a_full_disk_warns_once_and_the_tuning_goes_on(xla: object, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the first entry's ENOSPC ended the run, said as the run directory's ('run directory r: No space left
    on device (a write); there is no checkpoint yet; free space and --resume') though it had room: now said once,
    as the compile caches say it, and the plan is the one a writable cache gets; no temp file is left."""
    import errno
    import os

    from hloforge.backends import disk_cache

    want = conv_choices(autotune.tune(NET, BATCH, xla, cache_dir=tmp_path / "room", prepare=slow_when("conv2d",
                                                                                                      "nchw")))

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk_cache.os, "fsync", full)
    monkeypatch.setattr(disk_cache, "_UNWRITABLE", set())
    with pytest.warns(AutotuneCacheWarning) as caught:
        res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path / "full", prepare=slow_when("conv2d", "nchw"))
    said = [str(w.message) for w in caught if isinstance(w.message, AutotuneCacheWarning)]
    assert said == [f"autotune cache: cannot write to {tmp_path / 'full'} (No space left on device); timings are "
                    "not cached ($HLOFORGE_CACHE_DIR names a writable directory)"]
    assert conv_choices(res) == want and list((tmp_path / "full").iterdir()) == []


def test_a_plan_the_whole_net_does_not_confirm_is_dropped(xla: object, tmp_path: Path) -> None:
    """Every layer alone runs faster in NHWC, the whole net does not: the defaults stay, the
    decisions are reported, nothing is recorded for a replay, and the verdict is cached."""
    calls: list[str] = []
    timer = timed_as(lambda c: {("plan", "tuned"): 2.0, ("plan", "defaults"): 1.0}.get(
        c.choices[0], 5.0 if ("conv2d", "nchw") in c.choices else 1.0), calls)
    res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=timer)
    assert res.rejected and res.plan == {} and res.records() == ()
    assert conv_choices(res) == ["nhwc"] * 3 and res.whole_net_ms == {"plan=defaults": 1000.0, "plan=tuned": 2000.0}
    assert res.summary() == ("autotune: the layers' choices ran the whole net no faster (2000.0 vs 1000.0 ms for the "
                             "defaults, forward and backward): kept the defaults")
    assert calls.count("plan=tuned") == 1
    with autotune.rendering(res):
        assert train_step_module(NET, Variant("adam"), BATCH, target="xla")[0] == \
            train_step_module(NET, Variant("adam"), BATCH, target="xla")[0]
    again = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=no_timing)
    assert again.rejected and again.plan == {} and again.whole_net_ms == res.whole_net_ms


def test_a_plan_of_the_defaults_is_not_checked_on_the_whole_net(xla: object, tmp_path: Path) -> None:
    calls: list[str] = []
    res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("conv2d", "nhwc", calls))
    assert conv_choices(res) == ["nchw"] * 3 and not res.rejected and res.whole_net_ms == {}
    assert not any(label.startswith("plan=") for label in calls)


def test_a_form_the_backend_refuses_is_left_out(xla: object, tmp_path: Path) -> None:
    def nhwc_refused(c: Candidate) -> autotune.Run:
        if ("conv2d", "nhwc") in c.choices:
            raise BackendError("iree-compile rejected the module\nmore detail")
        return lambda: 5.0

    refusal = r"\(conv2d\) left out conv2d=nhwc: iree-compile rejected the module$"
    with pytest.warns(AutotuneCandidateWarning, match=refusal):
        res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=nhwc_refused)
    assert conv_choices(res) == ["nchw"] * 3

    def refuse_all(c: Candidate) -> autotune.Run:
        raise BackendError("no")

    with pytest.raises(BackendError, match=r"ran no form of layer 0 \(conv2d\): conv2d=nchw: no; conv2d=nhwc: no"):
        autotune.tune(NET, BATCH * 2, xla, cache_dir=tmp_path, prepare=refuse_all)


def test_the_real_timer_runs_each_candidate_on_the_backend(xla: object, tmp_path: Path) -> None:
    spec = NetSpec("autotune-one", (2, 5, 5), [Conv2d(2), Flatten(), Dense(2)], 2)
    res = autotune.tune(spec, 2, xla, cache_dir=tmp_path, reps=1)
    (d,) = res.decisions
    assert d.source == "timed" and set(d.times_ms) == {"conv2d=nchw", "conv2d=nhwc"}
    assert all(t > 0 for t in d.times_ms.values())
    # the rule on the real times: the fastest wins unless the default (timed first) is within MARGIN of it
    default, fastest = next(iter(d.times_ms)), min(d.times_ms, key=lambda k: d.times_ms[k])
    close = d.times_ms[fastest] > (1.0 - autotune.MARGIN) * d.times_ms[default]
    assert ",".join(f"{k}={c}" for k, c in d.choices) == (default if close else fastest)


def test_moot_and_pinned_kinds_are_not_timed(xla: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # inside an NHWC stretch every conv is in the NHWC form: "conv2d" changes nothing there
    iree_like = Renamed(xla, "pretend")
    iree_like.name = "iree"  # type: ignore[misc]
    convs = NetSpec("autotune-convs", (2, 6, 6), [Conv2d(3), Conv2d(3), Flatten(), Dense(3)], 3)
    monkeypatch.setenv(strategy.ENV_VAR, "convGrad=written")  # IREE's own layout (NHWC); its backward pinned
    assert autotune.tune(convs, BATCH, iree_like, cache_dir=tmp_path, prepare=no_timing).decisions == []
    monkeypatch.setenv(strategy.ENV_VAR, f"{PINNED},conv2d=nhwc")  # fixed by the environment: it would win anyway
    assert autotune.tune(convs, BATCH, xla, cache_dir=tmp_path, prepare=no_timing).decisions == []


def test_xla_s_nhwc_convs_tune_their_backward(xla: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In XLA's default (NHWC) net a conv's form is its backward: winograd (the default; on these small
    images the same module as chunked's and autodiff's, so timed once) or written out."""
    monkeypatch.delenv(strategy.ENV_VAR)
    calls: list[str] = []
    res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("convGrad", "winograd", calls))
    assert sorted(calls) == sorted(["convGrad=winograd", "convGrad=written"] * 2 + ["plan=defaults", "plan=tuned"])
    assert [dict(d.choices) for d in res.decisions] == [{"convGrad": "written"}] * 3


def test_kinds_consulted_inside_a_block_are_found(xla: object, tmp_path: Path) -> None:
    """A block's parts consult kinds its own `strategy_kinds` does not list; the render says which."""
    from hloforge.plugins.layers.residual import ResidualStage

    stage = ResidualStage(4, n=1, stride=2)
    (ls,) = [w for w in NetSpec("s", (4, 6, 6), [stage, Flatten(), Dense(2)], 2).walk() if w.layer is stage]
    labels = [c.label for c in autotune.candidates(ls, BATCH, "f32", "xla")]
    assert labels and all("conv2d=" in label for label in labels) and "conv2d" not in stage.strategy_kinds


# ------------------------------------------------------------------ the per-layer hook
def test_tuned_render_equals_the_forced_render(xla: object, tmp_path: Path) -> None:
    res = autotune.tune(NET, BATCH, xla, cache_dir=tmp_path, prepare=slow_when("conv2d", "nchw"))
    with autotune.rendering(res):
        tuned_text = train_step_module(NET, Variant("adam"), BATCH, target="xla")[0]
    with strategy.forced({"conv2d": "nhwc"}):
        forced_text = train_step_module(NET, Variant("adam"), BATCH, target="xla")[0]
    assert tuned_text == forced_text


def test_choices_are_per_layer() -> None:
    walk = NET.walk()
    plan = {(walk[0].layer, walk[0].in_shape): {"conv2d": "nhwc"}}  # the first conv only
    with strategy.tuned(plan):
        text = train_step_module(NET, Variant("adam"), BATCH, target="xla")[0]
    with strategy.forced({"conv2d": "nhwc"}):
        every = train_step_module(NET, Variant("adam"), BATCH, target="xla")[0]
    # forward + ∂x convolutions in the NHWC form: one layer's worth, a third of all three layers'
    assert every.count(NHWC_CONV) == 3 * text.count(NHWC_CONV) > 0


def test_precedence_forced_then_environment_then_plan_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    ls = NET.walk()[0]
    other = NET.walk()[1]
    with strategy.tuned({(ls.layer, ls.in_shape): {"conv2d": "nhwc"}}):
        with strategy.in_layer(ls.layer, ls.in_shape):
            assert strategy.chosen("conv2d", "xla") == "nhwc"  # the plan over the target's default
            monkeypatch.setenv(strategy.ENV_VAR, f"{PINNED},conv2d=nchw")
            assert strategy.chosen("conv2d", "xla") == "nchw"  # the environment over the plan
            with strategy.forced({"conv2d": "nhwc"}):
                assert strategy.chosen("conv2d", "iree") == "nhwc"  # forced over everything
            monkeypatch.delenv(strategy.ENV_VAR)
        with strategy.in_layer(other.layer, other.in_shape):
            assert strategy.chosen("conv2d", "xla") == "nchw"  # a layer the plan does not name: the default
        assert strategy.chosen("conv2d", "xla") == "nchw"  # outside any layer: the default


def test_bad_plans_are_one_clear_error() -> None:
    ls = NET.walk()[0]
    with pytest.raises(UnsupportedSpec, match=r"decided once per net, not per layer"):
        with strategy.tuned({(ls.layer, ls.in_shape): {"layout": "nhwc"}}):
            pass
    with pytest.raises(UnsupportedSpec, match=re.escape("conv2d at [2, 6, 6]: strategy conv2d='winograd'")):
        with strategy.tuned({(ls.layer, ls.in_shape): {"conv2d": "winograd"}}):
            pass
    for bad, message in [("0:conv2d", "expected 'layer index:kind=choice"), ("x:conv2d=nhwc", "expected"),
                         ("9:conv2d=nhwc", "has layers 0..4"), ("0:conv2d=winograd", "expected one of")]:
        with pytest.raises(UnsupportedSpec, match=re.escape(message)):
            autotune.from_records(NET, [bad])


def test_a_closed_form_backward_sees_its_forward_s_choice() -> None:
    """`Builder.custom_vjp` runs bwd in the forward's context: a choice made for the layer holds for
    the backward autodiff emits after the layer's context has closed."""
    seen: list[str] = []
    b = Builder("f32", "t", "xla")
    x = b.arg((2,))

    def bwd(b: Builder, g: Value) -> list[Value]:
        seen.append(strategy.chosen("conv2d", b.target))
        return [g]

    with strategy.forced({"conv2d": "nhwc"}):
        (y,) = b.custom_vjp(lambda v: [v * 2.0], bwd, x)
    grad(b, [y], [b.full(1.0, (2,))], [x])
    assert seen == ["nhwc"]


def test_env_var_turns_tuning_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not autotune.enabled() and autotune.enabled(True)
    monkeypatch.setenv(autotune.ENV_VAR, "1")
    assert autotune.enabled()
    monkeypatch.setenv(autotune.ENV_VAR, "maybe")
    with pytest.raises(UnsupportedSpec, match="HLOFORGE_AUTOTUNE='maybe'"):
        autotune.enabled()


# ------------------------------------------------------------------ same math, and the run records it
def test_tuned_train_step_matches_the_untuned_one(xla: object, tmp_path: Path) -> None:
    spec = NetSpec("autotune-pool", (2, 8, 8), [Conv2d(4, act="relu"), MaxPool(2), Conv2d(4), Flatten(), Dense(3)], 3)

    @timed_as
    def defaults_slow(c: Candidate) -> float:  # every layer gets a form XLA would not get by default
        if c.choices[0][0] == "plan":  # ... and the whole net confirms it
            return 0.5 if c.choices == (("plan", "tuned"),) else 1.0
        return sum(5.0 if choice == strategy.kind(k).default("xla") else 1.0 for k, choice in c.choices)

    res = autotune.tune(spec, BATCH, xla, cache_dir=tmp_path, prepare=defaults_slow)
    assert res.decisions and all(c != strategy.kind(k).default("xla") for d in res.decisions for k, c in d.choices)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, 2, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, BATCH).astype(np.int32)
    plain = TrainSession(spec, Variant("adam"), BATCH, xla, seed=0)
    with autotune.rendering(res):
        tuned = TrainSession(spec, Variant("adam"), BATCH, xla, seed=0)
    losses = [(plain.train_step(x, y, 1e-2), tuned.train_step(x, y, 1e-2)) for _ in range(2)]
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in losses)
    for p, q in zip(plain.read_params(), tuned.read_params(), strict=True):
        np.testing.assert_allclose(q, p, rtol=1e-4, atol=1e-6)


def test_a_tuned_run_records_its_choices_and_its_config_replays_them(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec_file = tmp_path / "tiny.json"
    spec_file.write_text(json.dumps(NetSpec("autotune-digits", (1, 28, 28), [
        Conv2d(4, stride=2, act="relu"), MaxPool(2), Flatten(), Dense(10)], 10).to_dict()))
    monkeypatch.setattr(autotune, "runner_on", lambda backend: slow_when("conv2d", "nchw"))
    lines: list[str] = []
    base = {"net": str(spec_file), "epochs": 1, "batch": 128}
    train(TrainConfig(**base, autotune=True, run_dir=str(tmp_path / "a")), log=lines.append,
          progress=False)
    summary = [ln for ln in lines if "autotune:" in ln]
    assert len(summary) == 1 and "conv2d nhwc×1" in summary[0] and "timed" in summary[0]
    config = (tmp_path / "a" / "config.toml").read_text()
    assert "autotune = true" in config and 'tuned = ["0:conv2d=nhwc"' in config

    monkeypatch.setattr(autotune, "runner_on", lambda backend: no_timing)
    from hloforge.cli import main

    assert main(["train", "--config", str(tmp_path / "a" / "config.toml"),
                 "--run-dir", str(tmp_path / "b"), "--no-progress"]) == 0
    from hloforge.train import checkpoint as ckpt

    pa = ckpt.load_checkpoint(str(tmp_path / "a" / "checkpoint.safetensors"))[0]
    pb = ckpt.load_checkpoint(str(tmp_path / "b" / "checkpoint.safetensors"))[0]
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
