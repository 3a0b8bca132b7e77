"""The kill -9 drill: SIGKILL a real `hloforge train` at random points, resume until done, and check
the run ends with the bytes an uninterrupted run ends with.

    python scripts/crash_drill.py --backend xla --kills 20
    python scripts/crash_drill.py --backend iree --kills 50 --seed 7 --keep /tmp/drill

Each kill aims at a phase drawn at random — mid-step, mid-eval, mid-checkpoint-write, or anywhere
(a random delay from the process's start) — in a random epoch the run has not checkpointed yet:
the drill waits for the phase's trace line (HLOFORGE_DRILL_TRACE), sleeps a random fraction of the
phase's length, and sends SIGKILL. Where the kill landed is read back from the trace (the last
phase the process entered). Checkpoint writes are slowed (HLOFORGE_DRILL_SLOW_WRITE) so the
mid-write window is wide enough to hit. After every kill: the checkpoint on disk loads whole, the
eval bitmap loads whole. At the end: checkpoint.safetensors and config.toml equal the uninterrupted
run's byte for byte, eval_correct.npz holds the same arrays, metrics.jsonl the same lines (timings
aside), and no temp file is left. Exit status 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hloforge.train import checkpoint as ckpt
from hloforge.train.trainer import BITMAP, CHECKPOINT

TARGETS = ("step", "eval", "checkpoint", "any")
# where a kill landed, by the last trace line before it ("startup": before the first step: imports,
# compile, restore; "logs": the epoch's metrics line and eval bitmap; "saved": after the checkpoint)
LANDED = {None: "startup", "step": "mid-step", "eval": "mid-eval", "logs": "epoch-end logs",
          "checkpoint": "mid-checkpoint-write", "saved": "after checkpoint"}
TIMINGS = ("seconds", "images_per_s", "tokens_per_s")  # the metrics that legitimately differ run to run
RUN = "run"  # the same relative --run-dir in both trees: the recorded config (and so the bytes) match
TIMEOUT = 600


@dataclass
class Kill:
    target: str
    epoch: int
    landed: str = ""
    at: str = ""
    ckpt_epoch: int | None = None
    rc: int | None = None
    resumed: bool = False  # the attempt killed was a --resume


@dataclass
class Report:
    backend: str
    kills: list[Kill] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    finished: int = 0  # runs that reached their last epoch (each compared with the uninterrupted one)

    def summary(self) -> str:
        by = Counter(k.landed for k in self.kills)
        resumed = sum(k.resumed for k in self.kills)
        lines = [f"{self.backend}: {len(self.kills)} kills ({resumed} of them in a resumed process), "
                 f"{self.finished} finished runs compared; landed "
                 + ", ".join(f"{n} {w}" for w, n in sorted(by.items()))]
        lines += [f"  kill {i + 1:2d}: aimed {k.target:10s} epoch {k.epoch}  landed {k.landed:20s} at {k.at:14s} "
                  f"checkpoint then: epoch {k.ckpt_epoch}" for i, k in enumerate(self.kills)]
        lines.append("  every check held: final checkpoint byte-identical" if not self.failures
                     else "  FAILED:\n" + "\n".join(f"    {f}" for f in self.failures))
        return "\n".join(lines)


def drill_config(path: str, backend: str, epochs: int, net: str, ema: float) -> None:
    """A tiny run: digits (22 steps an epoch at batch 64), a step line logged every step."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'net = "{net}"\nbackend = "{backend}"\nepochs = {epochs}\nbatch = 64\nlog_every = 1\n'
                f"ema = {ema}\n")


def argv(config: str, resume: bool) -> list[str]:
    return [sys.executable, "-m", "hloforge.cli", "train", "--config", config, "--run-dir", RUN, "--no-progress",
            *(["--resume"] if resume else [])]


def checkpoint_epoch(run_dir: str) -> int | None:
    path = os.path.join(run_dir, CHECKPOINT)
    if not os.path.exists(path):
        return None
    _, meta = ckpt.load_checkpoint(path)  # a torn file raises: the drill reports it
    return int(meta["epoch"])


def last_line(trace: str) -> str | None:
    if not os.path.exists(trace):
        return None
    with open(trace, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[-1] if lines else None


def wait_for(proc: subprocess.Popen[bytes], trace: str, want: tuple[str, ...], deadline: float) -> bool:
    """Poll the trace until a line starting with `want` appears; False if the process ends first."""
    pos = 0
    buf = ""
    while time.monotonic() < deadline:
        if os.path.exists(trace):
            with open(trace, encoding="utf-8") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            buf += chunk
            *done, buf = buf.split("\n")
            if any(tuple(line.split()[:len(want)]) == want for line in done):
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.0005)
    raise TimeoutError(f"no trace line {' '.join(want)} within {TIMEOUT}s")


def run_once(config: str, cwd: str, env: dict[str, str], resume: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv(config, resume), cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def one_kill(rng: random.Random, target: str, config: str, cwd: str, env: dict[str, str], epochs: int, steps: int,
             slow_write: float, loop_s: float) -> Kill:
    run_dir = os.path.join(cwd, RUN)
    done = checkpoint_epoch(run_dir) or 0
    kill = Kill(target, rng.randint(done + 1, epochs), resumed=done > 0)
    trace = os.path.join(cwd, "trace")
    if os.path.exists(trace):
        os.remove(trace)
    env = {**env, ckpt.TRACE_ENV: trace}
    out = open(os.path.join(cwd, "attempts.log"), "ab")
    proc = subprocess.Popen(argv(config, resume=kill.resumed), cwd=cwd, env=env, stdout=out, stderr=out)
    out.close()
    deadline = time.monotonic() + TIMEOUT
    reached = True
    if kill.target == "any":  # anywhere from the first step to the end of an uninterrupted run
        reached = wait_for(proc, trace, ("step",), deadline)
        time.sleep(rng.uniform(0, loop_s))
    elif kill.target == "step":
        reached = wait_for(proc, trace, ("step", str(kill.epoch), str(rng.randrange(steps))), deadline)
        time.sleep(rng.uniform(0, 0.005))
    elif kill.target == "eval":
        reached = wait_for(proc, trace, ("eval", str(kill.epoch)), deadline)
        time.sleep(rng.uniform(0, 0.01))
    else:
        reached = wait_for(proc, trace, ("checkpoint", str(kill.epoch)), deadline)
        time.sleep(rng.uniform(0, 16 * slow_write))
    if reached and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    kill.rc = proc.wait(TIMEOUT)
    line = last_line(trace)
    if kill.rc != -signal.SIGKILL:
        kill.landed = "ended before the kill" if kill.rc == 0 else f"exited {kill.rc}"
    else:
        kill.landed = LANDED[line.split()[0] if line else None]
    kill.at = line or "-"
    return kill


def compare(ref: str, got: str, report: Report) -> None:
    """The killed-and-resumed run directory `got` against the uninterrupted `ref`."""
    report.finished += 1

    def fail(msg: str) -> None:
        report.failures.append(f"{got}: {msg}")

    for name in (CHECKPOINT, "config.toml"):
        a, b = (hashlib.sha256(open(os.path.join(d, name), "rb").read()).hexdigest() for d in (ref, got))
        if a != b:
            fail(f"{name} differs from the uninterrupted run's (sha256 {a[:12]} vs {b[:12]})")
    if os.path.exists(os.path.join(ref, BITMAP)):
        with np.load(os.path.join(ref, BITMAP)) as a, np.load(os.path.join(got, BITMAP)) as b:
            if sorted(a.files) != sorted(b.files) or any(not np.array_equal(a[k], b[k]) for k in a.files):
                fail(f"{BITMAP} holds other arrays than the uninterrupted run's")

    def rows(d: str) -> list[dict[str, object]]:
        with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
            return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in f]

    ra, rb = rows(ref), rows(got)
    if ra != rb:
        first = next((i for i, (x, y) in enumerate(zip(ra, rb, strict=False)) if x != y), min(len(ra), len(rb)))
        fail(f"metrics.jsonl differs from the uninterrupted run's ({len(ra)} vs {len(rb)} lines; first at line "
             f"{first + 1})")
    if not os.path.exists(os.path.join(got, "curves.png")):
        fail("no curves.png")
    left = [f for f in os.listdir(got) if ckpt.TMP_SUFFIX in f]
    if left:
        fail(f"temp files left in the run directory: {left}")


def drill(backend: str, kills: int, seed: int = 0, epochs: int = 3, work: str | None = None,
          slow_write: float = 0.01, net: str = "mnist-mlp", ema: float = 0.99,
          targets: Sequence[str] = (), log: Callable[[str], None] = print) -> Report:
    """`kills` SIGKILLs on `backend`, each followed by a resume, then the comparison (Report.failures).
    Each kill aims at a phase drawn from TARGETS, or at `targets`' phases in turn when given."""
    rng = random.Random(seed)
    work = work or tempfile.mkdtemp(prefix="hloforge-drill-")
    ref, got = os.path.join(work, "ref"), os.path.join(work, "drill")
    os.makedirs(ref, exist_ok=True)
    os.makedirs(got, exist_ok=True)
    config = os.path.join(work, "drill.toml")
    drill_config(config, backend, epochs, net, ema)
    env = {**os.environ, ckpt.SLOW_WRITE_ENV: str(slow_write)}
    env.pop(ckpt.FAULT_ENV, None)
    report = Report(backend)
    trace = os.path.join(ref, "trace")
    proc = subprocess.Popen(argv(config, resume=False), cwd=ref, env={**env, ckpt.TRACE_ENV: trace},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(proc, trace, ("step",), time.monotonic() + TIMEOUT)
    t = time.monotonic()
    _, err = proc.communicate(timeout=TIMEOUT)
    loop_s = time.monotonic() - t
    if proc.returncode:
        report.failures.append(f"the uninterrupted run failed: {err.decode().strip().splitlines()[-1:]}")
        return report
    steps = sum(1 for line in open(os.path.join(ref, RUN, "metrics.jsonl"))
                if json.loads(line)["kind"] == "step") // epochs
    log(f"{backend}: uninterrupted run's loop {loop_s:.1f}s ({epochs} epochs of {steps} steps); {kills} kills in {got}")
    while len(report.kills) < kills:
        if checkpoint_epoch(os.path.join(got, RUN)) == epochs:  # a kill after the last checkpoint: compare, anew
            resume_finished(config, got, env, report)
            compare(os.path.join(ref, RUN), os.path.join(got, RUN), report)
            _fresh(got)
        target = targets[len(report.kills) % len(targets)] if targets else rng.choice(TARGETS)
        kill = one_kill(rng, target, config, got, env, epochs, steps, slow_write, loop_s)
        if kill.rc == 0:  # the run finished before the kill: compare it, then drill a new one
            compare(os.path.join(ref, RUN), os.path.join(got, RUN), report)
            _fresh(got)
            continue
        if kill.rc != -signal.SIGKILL:
            report.failures.append(f"attempt exited {kill.rc}; see {os.path.join(got, 'attempts.log')}")
            return report
        try:
            kill.ckpt_epoch = checkpoint_epoch(os.path.join(got, RUN))
            bitmap = os.path.join(got, RUN, BITMAP)
            if os.path.exists(bitmap):
                with np.load(bitmap) as b:
                    b["correct"].sum()
        except Exception as e:  # any unreadable file is the drill's finding
            report.failures.append(f"after kill {len(report.kills) + 1} ({kill.landed}): {e}")
        report.kills.append(kill)
        log(f"  kill {len(report.kills):2d}: aimed {kill.target}, landed {kill.landed} ({kill.at}); "
            f"checkpoint at epoch {kill.ckpt_epoch}")
    done = checkpoint_epoch(os.path.join(got, RUN))
    if done == epochs:  # the last kill landed after the last checkpoint
        resume_finished(config, got, env, report)
    if done != epochs:  # the last run: to the end, unkilled
        final = run_once(config, got, env, resume=done is not None)
        if final.returncode:
            report.failures.append(f"the last resume failed: {final.stderr.strip().splitlines()[-1:]}")
            return report
    compare(os.path.join(ref, RUN), os.path.join(got, RUN), report)
    return report


def resume_finished(config: str, cwd: str, env: dict[str, str], report: Report) -> None:
    """After a kill that landed past the last checkpoint (drawing the end's plot, say): the user's --resume,
    which says the run is finished and completes what the kill cut short (the plot; no temp file left)."""
    r = run_once(config, cwd, env, resume=True)
    if r.returncode != 3 or "already finished" not in r.stderr:
        said = r.stderr.strip().splitlines()[-1:]
        report.failures.append(f"--resume of a finished run exited {r.returncode}: {said}")


def _fresh(cwd: str) -> None:
    """A finished run directory moved aside (the drill keeps killing a new one)."""
    d = os.path.join(cwd, RUN)
    n = 1
    while os.path.exists(f"{d}.done{n}"):
        n += 1
    os.rename(d, f"{d}.done{n}")


def main(argv_: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default="xla", help="xla or iree (default xla)")
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs to send (default 20)")
    p.add_argument("--seed", type=int, default=0, help="draws the kill points (default 0)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the drilled run (default 3)")
    p.add_argument("--net", default="mnist-mlp", help="the drilled net (default mnist-mlp, on digits)")
    p.add_argument("--ema", type=float, default=0.99, help="its EMA decay, so the shadow is drilled too (default "
                                                           "0.99; 0: none)")
    p.add_argument("--slow-write", type=float, default=0.01,
                   help="seconds between a checkpoint's 16 chunks: the mid-write window (default 0.01)")
    p.add_argument("--keep", help="work in this directory (kept) instead of a temporary one")
    a = p.parse_args(argv_)
    rep = drill(a.backend, a.kills, a.seed, a.epochs, a.keep, a.slow_write, a.net, a.ema)
    print(rep.summary())
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
