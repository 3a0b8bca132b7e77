"""Render-time autotuning of the per-layer lowering strategies: opt-in and cached, like cuDNN's
benchmark mode (issue #11).

For each layer of a net whose render consults a per-layer strategy kind (core/strategy.py), at
that layer's input shape and the per-step batch, every distinct form of the layer alone —
forward and backward, `modules.vjp_module` under `strategy.forced` for each combination of the
kinds it consults — is compiled and run on the real backend (one warm-up run each, then `REPS`
rounds that run every candidate once, interleaved; the median counts) and the fastest is kept
(the target's default unless another form is `MARGIN` faster). Combinations that render the
same program (a kind the layer does not consult under that combination, e.g. "conv2d" inside an
NHWC stretch) are timed once. The decision is stored in a cache keyed on the layer and its input
shape, the batch, the dtype, the backend and its fingerprint (plugin/compiler version and flags),
the CPU model and core count, and a digest of the candidate programs themselves — so a changed
emitter, compiler or machine re-times instead of reusing a stale answer, and an unchanged one
renders instantly and deterministically.

Layers alone can mislead (a form faster on its own can be slower between its neighbours), so a
plan that changes anything is then checked on the whole net: its forward and backward rendered
with the plan and with the defaults, timed the same way; unless the plan is `MARGIN` faster there
too, the defaults stay (that verdict is cached like a layer's). `--autotune` never makes a net
slower than its defaults by more than the noise.

The result is a `strategy.tuned` plan: render inside `with strategy.tuned(result.plan):`. Kinds
a `forced` block or HLOFORGE_STRATEGY fixes are not tuned (they win over a plan anyway), and kinds
decided once per net ("layout") never are.

The cache is one small JSON file per decision in <cache root>/autotune (HLOFORGE_CACHE_DIR, as
the IREE artifact cache), written to a temp file and renamed, so processes share it without
locks and a reader never sees half an entry. An entry that cannot be read, or that does not
match its key, is reported with a warning naming the file and timed again (then rewritten): the
cache only memoises a measurement, so re-measuring is always correct, while stopping a training
run over a damaged memo is not useful. A damaged entry is never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import platform
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from hloforge.backends.base import CACHE_ENV_VAR, backend_fingerprint, cache_root, parse_main_signature
from hloforge.backends.disk_cache import first_unwritable, write_atomic
from hloforge.core import strategy
from hloforge.core.errors import BackendError, HloforgeWarning, UnsupportedSpec
from hloforge.core.modules import vjp_module
from hloforge.core.spec import LayerShapes, NetSpec
from hloforge.core.switches import env_switch

ENV_VAR = "HLOFORGE_AUTOTUNE"
REPS = 5  # timed rounds (one run of every candidate each) after one warm-up run; the median decides
# A form replaces the target's default only when it is at least this much faster: closer calls are
# noise on a busy machine, and flipping on noise would make tuned renders differ for nothing.
MARGIN = 0.05
CACHE_FORMAT = 1  # bump when an entry's layout changes: old entries then miss instead of misreading

Choices = tuple[tuple[str, str], ...]  # (kind, choice) pairs, sorted by kind
# The two whole-net candidates of a plan's check: the net with the layers' choices, and with the defaults.
TUNED: Choices = (("plan", "tuned"),)
DEFAULTS: Choices = (("plan", "defaults"),)


class AutotuneCacheWarning(HloforgeWarning):
    """A cache entry was unreadable or did not match its key (the layer was timed again), or could not be
    written (the run went on)."""


class AutotuneCandidateWarning(HloforgeWarning):
    """The backend refused a candidate form of a layer (it did not compile or run); the others competed."""


def label_of(choices: Choices) -> str:
    """"kind=choice,kind=choice": how a candidate is named in the cache, the timings and the summary."""
    return ",".join(f"{k}={c}" for k, c in choices)


@attrs.frozen
class Candidate:
    """One distinct program for a layer: the choices that render it and its text."""

    choices: Choices
    text: str

    @property
    def label(self) -> str:
        return label_of(self.choices)


@attrs.frozen
class Decision:
    """The choice for one layer of the walk. `source`: "timed" here, "cached" (from the cache
    file) or "reused" (an identical layer earlier in this walk)."""

    index: int
    kind: str
    in_shape: tuple[int, ...]
    choices: Choices
    source: str
    times_ms: Mapping[str, float]


@attrs.define
class TuneResult:
    """What a tuning pass decided: the plan to render with and one decision per tuned layer.
    `whole_net_ms`: the whole net's fwd+bwd with the layers' choices ("plan=tuned") and with the
    defaults ("plan=defaults"), when the choices changed anything; `rejected`: they did not make
    the whole net faster, so the plan is empty (the decisions stay, for the summary)."""

    plan: dict[strategy.LayerKey, dict[str, str]]
    decisions: list[Decision]
    seconds: float
    from_config: bool = False
    whole_net_ms: Mapping[str, float] = attrs.field(factory=dict)
    rejected: bool = False

    def records(self) -> tuple[str, ...]:
        """The decisions as a run's config keeps them: "index:kind=choice[,kind=choice]" per layer
        (none when the whole net rejected them: a replay renders the defaults, as this run did)."""
        if self.rejected:
            return ()
        return tuple(f"{d.index}:{label_of(d.choices)}" for d in self.decisions)

    def summary(self) -> str:
        """One line: how many layers, how they were decided, and the choices per kind."""
        if not self.decisions:
            return "autotune: no layer has a per-layer strategy choice here"
        if self.rejected:
            t = self.whole_net_ms
            return (f"autotune: the layers' choices ran the whole net no faster ({t.get(label_of(TUNED), 0.0):.1f} "
                    f"vs {t.get(label_of(DEFAULTS), 0.0):.1f} ms for the defaults, forward and backward): kept the "
                    "defaults")
        per_kind: dict[str, Counter[str]] = {}
        for d in self.decisions:
            for k, c in d.choices:
                per_kind.setdefault(k, Counter())[c] += 1
        picks = "; ".join(f"{k} " + " ".join(f"{c}×{n}" for c, n in counts.most_common())
                          for k, counts in sorted(per_kind.items()))
        n = len(self.decisions)
        if self.from_config:
            return f"autotune: {n} layers, choices from the run's config; {picks}"
        how = Counter(d.source for d in self.decisions)
        timed, cached = how["timed"], how["cached"] + how["reused"]
        return f"autotune: {n} layers, {cached} cached, {timed} timed in {self.seconds:.1f} s; {picks}"


def enabled(flag: bool | None = None) -> bool:
    """Tuning is on when asked (`--autotune`, a config's `autotune = true`) or HLOFORGE_AUTOTUNE is set."""
    if flag:
        return True
    return env_switch(ENV_VAR, on="time each layer's lowering strategies and render with the fastest",
                      error=UnsupportedSpec)


def default_cache_dir() -> Path:
    return cache_root() / "autotune"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo) and the cores this process may run on: a choice timed
    on one machine is not evidence about another."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Hardware", "cpu model"):
                    model = value.strip()
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown cpu"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 0
    return f"{model} ({cores} cores)"


# ------------------------------------------------------------------ candidates
def _render(ls: LayerShapes, batch: int, dtype: str, target: str | None, choices: Choices) -> tuple[str, set[str]]:
    """The layer alone (forward and backward) under these choices, and the kinds its render consulted."""
    with strategy.tuned({}), strategy.forced(dict(choices)), strategy.consulted() as seen:
        text = vjp_module([ls.layer], ls.in_shape, batch, dtype=dtype, name=f"autotune_{ls.layer.kind}",
                          target=target)
    return text, seen


def candidates(ls: LayerShapes, batch: int, dtype: str, target: str | None) -> list[Candidate]:
    """Every distinct program of the layer over the per-layer kinds its render consults (those
    that appear only under another kind's choice included), the target's defaults first. Empty
    when the layer has nothing to choose."""
    pinned = strategy.pinned()

    def tunable(seen: set[str]) -> set[str]:
        return {k for k in seen if strategy.kind(k).per_layer and k not in pinned}

    kinds = tunable(_render(ls, batch, dtype, target, ())[1])
    while True:
        ordered = sorted(kinds)
        defaults = {k: strategy.kind(k).default(target) for k in ordered}
        # the target's default choice first in each kind, so a tie keeps the default form
        options = [[defaults[k], *(c for c in strategy.kind(k).choices if c != defaults[k])] for k in ordered]
        combos: list[Choices] = [tuple(zip(ordered, pick, strict=True)) for pick in itertools.product(*options)]
        renders = {combo: _render(ls, batch, dtype, target, combo) for combo in combos}
        more = set().union(*(tunable(seen) for _, seen in renders.values())) - kinds
        if not more:
            break
        kinds |= more
    distinct: dict[str, Candidate] = {}
    for combo, (text, _) in renders.items():
        distinct.setdefault(text, Candidate(combo, text))
    return list(distinct.values()) if len(distinct) > 1 else []


# ------------------------------------------------------------------ timing
# A candidate made ready to run (compiled, inputs on the device): a call runs it once and returns the seconds.
Run = Callable[[], float]
Prepare = Callable[[Candidate], Run]


def runner_on(backend: Any, seed: int = 0) -> Prepare:
    """Candidates made ready on `backend`: compiled, fed random inputs once; each run is waited for
    by reading its smallest output back."""

    def prepare(c: Candidate) -> Run:
        exe = backend.compile(c.text)
        specs = parse_main_signature(c.text) or []
        rng = np.random.default_rng(seed)
        inputs = []
        for s in specs:
            if s.shape is None or s.dtype is None or any(d is None for d in s.shape):
                raise UnsupportedSpec(f"autotune: cannot read the input types of the {c.label} module")
            shape = tuple(int(d) for d in s.shape if d is not None)
            host = (rng.standard_normal(shape).astype(s.dtype) if np.issubdtype(s.dtype, np.floating)
                    else np.zeros(shape, s.dtype))
            inputs.append(backend.to_device(host))

        def run() -> float:
            t = time.perf_counter()
            outs = backend.execute(exe, inputs)
            backend.to_host(min(outs, key=lambda o: int(np.prod(o.shape))))
            return time.perf_counter() - t

        return run

    return prepare


# ------------------------------------------------------------------ the cache
def cache_key(ls: LayerShapes, batch: int, dtype: str, backend: Any, cands: Sequence[Candidate]) -> dict[str, Any]:
    """Everything a layer's timing depends on, readable; its sha256 names the cache file."""
    return cache_key_for(ls.layer.to_dict(), ls.in_shape, batch, dtype, backend, cands)


def cache_key_for(what: Mapping[str, Any], in_shape: Sequence[int], batch: int, dtype: str, backend: Any,
                  cands: Sequence[Candidate]) -> dict[str, Any]:
    """The key of a timing of `what` (a layer's or a net's dict) at `in_shape`: see cache_key."""
    programs = hashlib.sha256("\0".join(sorted(c.text for c in cands)).encode()).hexdigest()
    return {"format": CACHE_FORMAT, "layer": dict(what), "in_shape": list(in_shape), "batch": batch,
            "dtype": dtype, "backend": getattr(backend, "name", type(backend).__name__),
            "backend_version": backend_fingerprint(backend), "cpu": cpu_model(),
            "candidates": sorted(c.label for c in cands), "programs": programs}


def _canonical(key: Any) -> str:
    return json.dumps(key, sort_keys=True, default=repr)


def entry_path(cache_dir: Path, key: Mapping[str, Any]) -> Path:
    return cache_dir / f"{hashlib.sha256(_canonical(key).encode()).hexdigest()}.json"


def read_entry(path: Path, key: Mapping[str, Any],
               cands: Sequence[Candidate]) -> tuple[Candidate, dict[str, float]] | None:
    """The cached winner for `key` and the times it was chosen on, or None on a miss. An entry that
    is unreadable, or that names another key or no candidate of this layer, warns (naming the file)
    and counts as a miss."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no directory) there: a miss, not damage
        return None
    except OSError as e:
        why = f"cannot read it ({e.strerror or e})"
    else:
        try:
            entry = json.loads(text)
            if not isinstance(entry, dict):
                raise ValueError("not a JSON object")
            if _canonical(entry.get("key")) != _canonical(key):
                raise ValueError("its key is not this layer's")
            label = entry.get("choice")
            found = next((c for c in cands if c.label == label), None)
            if found is None:
                raise ValueError(f"its choice {label!r} is none of {[c.label for c in cands]}")
            times = entry.get("times_ms", {})
            return found, dict(times) if isinstance(times, dict) else {}
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            why = str(e)
    warnings.warn(AutotuneCacheWarning(f"autotune cache entry {path} is damaged ({why}); timing the layer again"),
                  stacklevel=3)
    return None


def write_entry(path: Path, key: Mapping[str, Any], winner: Candidate, times_ms: Mapping[str, float]) -> None:
    """Write the entry to a temp file beside it and rename it into place (atomic on one filesystem). One that
    cannot be written (a full disk, a read-only cache) is said once per cause and the run goes on,
    as the compile caches do: a cache is no part of the run."""
    data = json.dumps({"key": key, "choice": winner.label, "times_ms": dict(times_ms)}, sort_keys=True,
                      default=repr, indent=1)
    try:
        write_atomic(path, data.encode())
    except OSError as e:
        why = first_unwritable(path.parent, e)
        if why is not None:
            warnings.warn(AutotuneCacheWarning(f"autotune cache: cannot write to {path.parent} ({why}); timings are "
                                               f"not cached (${CACHE_ENV_VAR} names a writable directory)"),
                          stacklevel=2)


# ------------------------------------------------------------------ tuning a net
def _time_all(what: str, cands: Sequence[Candidate], prepare: Prepare,
              reps: int) -> tuple[dict[str, float], Candidate]:
    """Each candidate's median time (ms) and the winner: the fastest, unless the default form (the
    first) is within `MARGIN` of it. Every candidate is made ready and run once (a warm-up), then
    timed in `reps` rounds of one run each, so a burst of load from elsewhere hits every candidate
    alike instead of one candidate's whole series. A form the backend refuses to compile or run is
    out of the running (warned about); all refused is the error."""
    runs: dict[str, Run] = {}
    refused: list[str] = []
    for c in cands:
        try:
            run = prepare(c)
            run()
        except BackendError as e:
            refused.append(f"{c.label}: {str(e).splitlines()[0]}")
        else:
            runs[c.label] = run
    if not runs:
        raise BackendError(f"autotune: the backend ran no form of {what}: " + "; ".join(refused))
    if refused:
        warnings.warn(AutotuneCandidateWarning(f"autotune: {what} left out " + "; ".join(refused)), stacklevel=3)
    samples: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(max(reps, 1)):
        for label, run in runs.items():
            samples[label].append(run())
    times = {label: statistics.median(ts) * 1e3 for label, ts in samples.items()}
    fastest = min((c for c in cands if c.label in times), key=lambda c: times[c.label])
    default = cands[0]  # candidates() puts the target's defaults first
    if default.label in times and times[fastest.label] > (1.0 - MARGIN) * times[default.label]:
        return times, default  # within the noise of a shared machine: keep the default form
    return times, fastest


def tune(spec: NetSpec, batch: int, backend: Any, *, dtype: str = "f32",
         cache_dir: str | os.PathLike[str] | None = None, prepare: Prepare | None = None,
         reps: int = REPS) -> TuneResult:
    """Decide every tunable layer of `spec` at per-step `batch` on `backend` (cache first, else
    timed: `prepare` makes a candidate ready to run, default `runner_on(backend)`), and return the plan."""
    t0 = time.perf_counter()
    target = strategy.target_of(backend)
    where = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    ready = prepare or runner_on(backend)
    plan: dict[strategy.LayerKey, dict[str, str]] = {}
    decisions: list[Decision] = []
    done: dict[strategy.LayerKey, Decision] = {}
    for ls in spec.walk():
        key_here = (ls.layer, tuple(ls.in_shape))
        if key_here in done:
            first = done[key_here]
            decisions.append(attrs.evolve(first, index=ls.index, source="reused"))
            continue
        try:
            cands = candidates(ls, batch, dtype, target)
        except UnsupportedSpec:  # a layer that cannot stand alone (it reads a skip another layer pushed)
            continue
        if not cands:
            continue
        key = cache_key(ls, batch, dtype, backend, cands)
        winner, times, source = _decide(f"layer {ls.index} ({ls.layer.kind})", key, cands, where, ready, reps)
        d = Decision(ls.index, ls.layer.kind, tuple(ls.in_shape), winner.choices, source, times)
        done[key_here] = d
        decisions.append(d)
        plan[key_here] = dict(winner.choices)
    whole_net_ms, rejected = _check_whole_net(spec, batch, dtype, target, plan, backend, where, ready, reps)
    return TuneResult({} if rejected else plan, decisions, time.perf_counter() - t0, whole_net_ms=whole_net_ms,
                      rejected=rejected)


def _check_whole_net(spec: NetSpec, batch: int, dtype: str, target: str | None,
                     plan: Mapping[strategy.LayerKey, Mapping[str, str]], backend: Any, where: Path,
                     ready: Prepare, reps: int) -> tuple[dict[str, float], bool]:
    """The whole net's fwd+bwd under the plan against the defaults (cached like a layer's decision):
    ({label: ms}, whether the plan is rejected). Nothing to check when the plan renders the defaults."""

    def render(p: Mapping[strategy.LayerKey, Mapping[str, str]]) -> str:
        with strategy.tuned({k: dict(v) for k, v in p.items()}):
            return vjp_module(spec.layers, spec.input_shape, batch, dtype=dtype, name="autotune_net", target=target)

    try:
        defaults = Candidate(DEFAULTS, render({}))
        tuned = Candidate(TUNED, render(plan))
    except UnsupportedSpec:  # a net the bare layer stack cannot render: the layers' word stands
        return {}, False
    if tuned.text == defaults.text:
        return {}, False
    cands = [defaults, tuned]  # the defaults first: they stay unless the plan is MARGIN faster
    key = {**cache_key_for(spec.to_dict(), spec.input_shape, batch, dtype, backend, cands), "check": "whole net"}
    winner, times, _ = _decide(f"the whole net {spec.name!r}", key, cands, where, ready, reps)
    return times, winner is defaults


def _decide(what: str, key: Mapping[str, Any], cands: Sequence[Candidate], where: Path, ready: Prepare,
            reps: int) -> tuple[Candidate, dict[str, float], str]:
    """(winner, times in ms, "cached" | "timed"): the cache's answer for `key`, else timed and stored."""
    path = entry_path(where, key)
    hit = read_entry(path, key, cands)
    if hit is not None:
        return hit[0], hit[1], "cached"
    times, winner = _time_all(what, cands, ready, reps)
    write_entry(path, key, winner, times)
    return winner, times, "timed"


def from_records(spec: NetSpec, records: Sequence[str]) -> TuneResult:
    """The plan a run's config recorded (`TuneResult.records`), checked against `spec`: applied as
    it is, no timing, so re-running a config renders the same modules."""
    walk = spec.walk()
    plan: dict[strategy.LayerKey, dict[str, str]] = {}
    decisions = []
    for item in records:
        index, sep, rest = item.partition(":")
        pairs = [p.partition("=") for p in rest.split(",")] if rest else []
        if not sep or not index.strip().isdigit() or not pairs or any(not k or not s or not c for k, s, c in pairs):
            raise UnsupportedSpec(f"tuned choice {item!r}: expected 'layer index:kind=choice[,kind=choice]'")
        i = int(index)
        if i >= len(walk):
            raise UnsupportedSpec(f"tuned choice {item!r}: net {spec.name!r} has layers 0..{len(walk) - 1}")
        ls = walk[i]
        choices = {k.strip(): c.strip() for k, _, c in pairs}
        key = (ls.layer, tuple(ls.in_shape))
        if key in plan and plan[key] != choices:
            raise UnsupportedSpec(f"tuned choice {item!r}: an identical earlier layer has {plan[key]}; identical "
                                  "layers at one shape share one choice")
        plan[key] = choices
        decisions.append(Decision(i, ls.layer.kind, tuple(ls.in_shape), tuple(sorted(choices.items())), "config", {}))
    with strategy.tuned(plan):  # checks every kind and choice now, naming the layer
        pass
    return TuneResult(plan, decisions, 0.0, from_config=True)


def resolve(spec: NetSpec, batch: int, backend: Any, *, autotune: bool | None = None,
            recorded: Sequence[str] = (), cache_dir: str | os.PathLike[str] | None = None) -> TuneResult | None:
    """A run's plan: the `recorded` one when its config has it, else a tuning pass when tuning is
    `enabled`, else None (render with the defaults)."""
    if recorded:
        return from_records(spec, recorded)
    if not enabled(autotune):
        return None
    return tune(spec, batch, backend, cache_dir=cache_dir)


@contextlib.contextmanager
def rendering(result: TuneResult | None) -> Iterator[None]:
    """Render with the result's plan inside the block (nothing changes for None)."""
    if result is None:
        yield
        return
    with strategy.tuned(result.plan):
        yield
