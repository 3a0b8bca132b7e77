"""Step-time benchmark: hloforge's fused train step against jax.jit and PyTorch (eager, torch.compile).

For each net it times one Adam train step as a user pays it — host batch in,
loss (a Python float) out — and reports the median ms/step after a warm-up,
with compile time reported separately:

- ``hloforge-xla`` / ``hloforge-iree``: a `TrainSession` on that backend
  (device-resident θ and optimizer state, one fused step per call, including
  the host→device copy of x, y and the read-back of the loss);
- ``jax.jit``: ``value_and_grad`` + ``optax.adam`` of the same net written with
  the layers' own jax.numpy ``reference`` functions, θ and optimizer state
  donated, f32;
- ``torch``: the torch.nn equivalent in eager mode with ``torch.optim.Adam``;
- ``torch-compile``: the same module, its forward and loss through ``torch.compile``
  (inductor), compiled in setup.

Each (net, backend) runs in a child process of its own (``--isolate``); the
table's "peak RSS" rows are that child's peak resident set size, MB. Its "setup"
rows are the median over the rounds of the setups that compiled and, apart, of
those that loaded their compiled program from an on-disk cache (hloforge's
executables, torch.compile's inductor graphs: a net's rounds after the first,
unless ``--cold`` gives every round empty caches).

All start from ``spec.init_params(seed)`` and see the same batches, so their
first-step losses must agree (printed as a sanity check; a mismatch fails).
Setup is counted alike for every backend: from the spec to a step-ready
state — θ drawn and placed, the optimizer state made, the step compiled.
It also measures dispatch overhead: µs per call of a 1-element graph
(``a + 1``) including the scalar's trip to the device and back.

jax, optax and torch are benchmark peers only (extra ``bench``); never
imported on the training path.

    python -m hloforge.bench --nets mnist-mlp,mnist-cnn --batch 128 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from hloforge.backends.host_memory import retain_freed_host_memory
from hloforge.bench.common import (
    BACKENDS,
    DEFAULT_STEPS,
    DISPATCH_BACKENDS,
    LOSS_RTOL,
    OTHER_STEPS,
    SGEMM_N,
    SUITE,
    Result,
    cpu_count,
    failed_note,
    load_net,
    unavailable,
)
from hloforge.bench.report import details, sanity, strategy_lines, strategy_table, table, throughput, versions
from hloforge.bench.timing import (
    _in_child,
    dispatch_us,
    empty_cache,
    measure,
    measure_isolated,
    peak_rss_mb,
    sgemm_gflops,
    step_gflop,
)
from hloforge.commands.argtypes import nonneg_int, positive_float, positive_int
from hloforge.commands.options import Parser


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hloforge bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nets", default="mnist-mlp,mnist-cnn",
                   help="comma-separated classifier nets: zoo names or spec files (default %(default)s)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="per-step batch (default 128; with --suite each net's own: " +
                   ", ".join(f"{n} {b}" for n, b in SUITE) + ")")
    p.add_argument("--suite", action="store_true", help="benchmark the issue-#11 suite (overrides --nets)")
    p.add_argument("--roofline", action=argparse.BooleanOptionalAction, default=True,
                   help=f"measure the sgemm roofline ({SGEMM_N}³ f32) and report GFLOP/s against it (default: "
                        "on; --no-roofline skips it)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="timed steps per (net, backend) (default: " +
                   ", ".join(f"{n} {s}" for n, s in DEFAULT_STEPS.items()) + f", another net {OTHER_STEPS})")
    p.add_argument("--warmup", type=positive_int, default=3,
                   help="untimed steps after compile (at least 1; default %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="measure each net's backends this many times, alternating, and pool the steps: "
                        "a ratio then compares steps from the same stretches of time (default %(default)s)")
    p.add_argument("--cold", action="store_true",
                   help="every round's setup compiles: hloforge's executable cache and torch.compile's inductor "
                        "cache empty (by default a net's later rounds load from them, as a second run would)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"comma-separated subset of {', '.join(BACKENDS)}; unavailable ones are skipped with a note "
                        "(default: all)")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="the steps' learning rate (default %(default)s)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seeds the weights and the batch (default %(default)s)")
    p.add_argument("--dispatch-calls", type=nonneg_int, default=2000,
                   help="0 skips the dispatch measurement (default %(default)s)")
    # Every backend in a process of its own by default: XLA (jaxlib's and the plugin's), IREE and
    # PyTorch each keep worker threads that spin after a step and slowed whichever ran next in one process.
    p.add_argument("--isolate", default=",".join(BACKENDS),
                   help="backends measured in a child process killed after --cap-s (comma-separated; '' for none; "
                        "default: all)")
    p.add_argument("--cap-s", type=positive_float, default=600.0,
                   help="time cap per isolated (net, backend), seconds (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (default: not written)")
    p.add_argument("--autotune", action="store_true",
                   help="render hloforge's steps with autotuned per-layer strategies (the same as "
                        "HLOFORGE_AUTOTUNE=1; the tuning time is not in the compile time)")
    p.add_argument("--_child", help=argparse.SUPPRESS)  # internal: write one Result as JSON and exit
    p.add_argument("--_dispatch_child", help=argparse.SUPPRESS)  # internal: write one dispatch timing and exit
    return p


def _writable_file(path: str) -> bool:
    """Whether `path` can be written as a file: not a directory, in a directory that exists and this user
    may write."""
    folder = os.path.dirname(os.path.abspath(path))
    return not os.path.isdir(path) and os.path.isdir(folder) and os.access(folder, os.W_OK) and \
        (not os.path.exists(path) or os.access(path, os.W_OK))


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    try:
        args = p.parse_args(argv)
        for flag, given in (("--backends", args.backends), ("--isolate", args.isolate)):  # a typo measures apart
            bad = [b for b in given.split(",") if b and b not in BACKENDS]
            if bad:
                p.error(f"argument {flag}: unknown backend(s) {bad}; expected a subset of {list(BACKENDS)}")
        for flag, given in (("--nets", "x" if args.suite else args.nets), ("--backends", args.backends)):
            if not [n for n in given.split(",") if n]:
                p.error(f"argument {flag}: names nothing to measure ({given!r}); expected a comma-separated list")
        if args.json and not _writable_file(args.json):  # checked now: the suite takes minutes to hours
            p.error(f"argument --json: cannot write {args.json}; expected a file path in an existing, writable "
                    "directory")
    except SystemExit as e:  # a usage error (2) or -h (0), printed: returned, as hloforge.cli.main returns its own
        return e.code if isinstance(e.code, int) else 2
    nets = [n for n, _ in SUITE] if args.suite else [n for n in args.nets.split(",") if n]
    suite_batch = dict(SUITE) if args.suite else {}
    if args._child:  # the parent resolved the batch already
        suite_batch = {}

    def batch_of(net: str) -> int:
        return args.batch or suite_batch.get(net) or 128
    backends = [b for b in args.backends.split(",") if b]
    if args.autotune:  # through the environment, so isolated children tune too
        from hloforge.train.autotune import ENV_VAR as AUTOTUNE_ENV_VAR

        os.environ[AUTOTUNE_ENV_VAR] = "1"
    if args._child:  # one measurement for measure_isolated
        try:
            r = measure(nets[0], backends[0], batch_of(nets[0]), args.steps, args.warmup, args.lr, args.seed)
        except Exception as e:  # noqa: BLE001 - said in the row as an in-process failure is, not as stderr's last line
            r = Result(nets[0], backends[0], batch_of(nets[0]), note=failed_note(e))
        r.peak_rss_mb = peak_rss_mb()  # this child measured only this (net, backend)
        with open(args._child, "w", encoding="utf-8") as f:
            json.dump(asdict(r), f)
        return 0
    if args._dispatch_child:  # one dispatch timing, for the isolated dispatch measurement
        c, us = dispatch_us(backends[0], args.dispatch_calls)
        with open(args._dispatch_child, "w", encoding="utf-8") as f:
            json.dump({"us": us, "compile_s": c, "calls": args.dispatch_calls}, f)
        return 0

    for net in nets:  # a name no peer can build is the user's typo: refused before minutes of measuring
        load_net(net)
    isolate = {b for b in args.isolate.split(",") if b}
    if any(b.startswith("hloforge-") and b not in isolate for b in backends):
        # Measured in this process: its heap policy first. jax's client (step_gflop, the jax peer)
        # starting threads before it would fix glibc's arena limit, and XLA's step scratch would come
        # from the kernel every step (vit-cifar: ~41 000 page faults a step).
        retain_freed_host_memory()
    notes = {b: unavailable(b) for b in backends}
    results: list[Result] = []
    gflop: dict[str, float | None] = {}
    for net in nets:
        steps = args.steps or DEFAULT_STEPS.get(net, OTHER_STEPS)
        batch = batch_of(net)
        try:
            gflop[net] = step_gflop(net, batch)
        except Exception:  # noqa: BLE001 - a net the jax peer cannot lower has no FLOP count; still time it
            gflop[net] = None
        pooled: dict[str, Result] = {}
        for rnd in range(args.rounds):  # backends alternate, so a slow spell of the machine hits them alike
            for b in backends:
                if notes[b]:
                    pooled.setdefault(b, Result(net, b, batch, note=f"skipped: {notes[b]}"))
                    continue
                if b in pooled and not pooled[b].ms:  # failed in an earlier round: once is enough
                    continue
                print(f"[bench] {net} batch {batch} on {b}: compile, {args.warmup} warm-up, {steps} timed steps"
                      + (f" (round {rnd + 1}/{args.rounds})" if args.rounds > 1 else ""), file=sys.stderr, flush=True)
                try:
                    with empty_cache(b) if args.cold else contextlib.nullcontext():
                        if b in isolate:
                            r = measure_isolated(net, b, batch, steps, args.warmup, args.lr, args.seed, args.cap_s)
                        else:
                            r = measure(net, b, batch, steps, args.warmup, args.lr, args.seed)
                except Exception as e:  # noqa: BLE001 - report the failure in the table, keep benchmarking
                    r = Result(net, b, batch, note=failed_note(e))
                if b in pooled:  # a later round: its steps and setup join the first round's (its loss stays)
                    pooled[b].ms += r.ms
                    pooled[b].cold_setups += r.cold_setups
                    pooled[b].cached_setups += r.cached_setups
                    if not r.ms:  # said, not dropped: the median is then over the rounds that ran
                        pooled[b].note = "; ".join(n for n in (pooled[b].note, f"round {rnd + 1} {r.note}") if n)
                else:
                    pooled[b] = r
        results += [pooled[b] for b in backends]
    roof = sgemm_gflops() if args.roofline else {}
    roofline = max(roof.values()) if roof else None

    dispatch: dict[str, dict[str, Any]] = {}
    if args.dispatch_calls > 0:
        for b in (b for b in backends if b in DISPATCH_BACKENDS):
            if notes[b]:
                dispatch[b] = {"note": f"skipped: {notes[b]}"}
                continue
            print(f"[bench] dispatch on {b}: {args.dispatch_calls} calls", file=sys.stderr, flush=True)
            try:
                if b in isolate:  # like the steps: another runtime's spinning threads would slow it
                    got = _in_child("--_dispatch_child", ["--backends", b, "--dispatch-calls",
                                                          str(args.dispatch_calls)], args.cap_s)
                    dispatch[b] = {"note": got} if isinstance(got, str) else got
                else:
                    c, us = dispatch_us(b, args.dispatch_calls)
                    dispatch[b] = {"us": us, "compile_s": c, "calls": args.dispatch_calls}
            except Exception as e:  # noqa: BLE001
                dispatch[b] = {"note": failed_note(e)}

    checks = sanity(results)
    print(f"hloforge bench: Adam train step, median ms/step (ratio to jax.jit); f32; {cpu_count()} CPU threads; "
          f"host batch in, loss out")
    print(table(results, backends, dispatch))
    if roof:
        print(f"\nachieved GFLOP/s (% of the sgemm roofline, {roofline:.1f} GFLOP/s: best of "
              + ", ".join(f"{k} {v:.1f}" for k, v in roof.items()) + f" on {SGEMM_N}³ f32)")
    else:
        print("\nachieved GFLOP/s")
    print(throughput(results, backends, gflop, roofline))
    print(details(results, dispatch))
    forced = os.environ.get("HLOFORGE_STRATEGY")
    print("\nlowering strategies (kind: choice per target" + (f"; forced by HLOFORGE_STRATEGY={forced}" if forced
                                                              else "") + "):")
    print("\n".join(strategy_lines()))
    if checks:
        print(f"\nsanity (first-step loss, rtol {LOSS_RTOL:.0e}):")
        for line, _ in checks:
            print("  " + line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                       "machine": {"platform": platform.platform(), "cpus": cpu_count(), **versions()},
                       "results": [r.to_dict() for r in results], "dispatch_us": dispatch,
                       "gflop_per_step": gflop, "sgemm_gflops": roof,
                       "strategies": {k: t for k, _, t in strategy_table()},
                       "sanity": [{"check": line, "ok": ok} for line, ok in checks]}, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0 if all(ok for _, ok in checks) else 1
