"""Training across processes on MPI (hloforge.train.mpi), with real processes: MPICH's `mpiexec -n 2 -iface lo`
(loopback only). The MPI tests skip when mpi4py or MPICH's mpiexec is absent (`pip install 'hloforge[mpi]'`).

The children are this file: `python tests/test_mpi.py session OUT` (a data-parallel session for 20 steps,
every rank's θ and losses to OUT) and the `hloforge` command itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from hloforge.core.errors import BackendError, UnsupportedSpec
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.plugins.layers.dense import Dense, Flatten
from hloforge.plugins.layers.dropout import Dropout
from hloforge.plugins.layers.norm import ConvBn
from hloforge.train import mpi
from hloforge.train.parallel import DataParallelTrainSession
from hloforge.train.session import TrainSession, make_backend

ROOT = Path(__file__).resolve().parents[1]
STEPS, BATCH = 20, 8
VARIANT = Variant("adam", clip=1.0)  # clipping: it must see the averaged gradient, as the fused DP step's does
FROZEN = Variant("adam", clip=1.0, frozen=("0",))  # the conv + BN layer held: inputs alone, no ∂θ, no state


def tiny_net() -> NetSpec:
    """Conv + BN (per-replica statistics), dropout (per-example masks), dense."""
    return NetSpec("mpi-tiny", (1, 6, 6), [ConvBn(3), Flatten(), Dropout(0.3), Dense(5)], 5)


def batches(spec: NetSpec, n: int = STEPS) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((BATCH, *spec.input_shape)).astype(np.float32),
             rng.integers(0, spec.num_classes, BATCH).astype(np.int32)) for _ in range(n)]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def drive(session: TrainSession, spec: NetSpec) -> dict[str, np.ndarray]:
    """STEPS steps at lr 0.05; θ, the optimizer state, the losses and the last batch statistics."""
    losses = [session.train_step(x, y, 0.05) for x, y in batches(spec)]
    out = {f"p{i}": p for i, p in enumerate(session.read_params())}
    out |= {f"s{i}": s for i, s in enumerate(session.read_state())}
    out |= {f"b{i}": s for i, s in enumerate(session.batch_stats())}
    out["loss"] = np.array(losses, np.float32)
    return out


# ------------------------------------------------------------------ the child


def session_child(out: str) -> None:
    """Under mpiexec: MpiTrainSession over the world, its all-reduce in one call a step, then again in
    64-byte buckets; alone: the one-process 2-replica session."""
    w = mpi.world()
    spec = tiny_net()
    if w.size == 1:
        be = make_backend("xla", devices=2)
        for name, variant, sync in (("alone", VARIANT, False), ("alone-frozen", FROZEN, False),
                                    ("alone-sync", VARIANT, True)):
            s = DataParallelTrainSession(spec, variant, BATCH, be, replicas=2, seed=1, sync_bn=sync)
            np.savez(os.path.join(out, f"{name}.npz"), **drive(s, spec))
        return
    be = make_backend("xla")
    for name, bucket, variant, sync in (("one", mpi.BUCKET_BYTES, VARIANT, False), ("bucketed", 64, VARIANT, False),
                                        ("frozen", mpi.BUCKET_BYTES, FROZEN, False),
                                        ("sync", mpi.BUCKET_BYTES, VARIANT, True)):
        mpi.BUCKET_BYTES, w.allreduce_calls = bucket, 0
        m = mpi.MpiTrainSession(spec, variant, BATCH, be, world=w, replicas=2, seed=1, sync_bn=sync)
        res = drive(m, spec)
        res["calls"] = np.array([w.allreduce_calls, m._flat.nbytes])
        np.savez(os.path.join(out, f"{name}{w.rank}.npz"), **res)
    w.finalize()


def fit_child(out: str) -> None:
    """A user's script under mpiexec: Model.fit on digits with a callback; every rank's weights to OUT."""
    import hloforge as hf
    from hloforge.callbacks import Callback

    rank = mpi.world().rank

    class Note(Callback):
        def on_epoch_end(self, epoch: int, logs: dict) -> None:
            with open(os.path.join(out, f"epochs{rank}.txt"), "a") as f:
                f.write(f"{epoch}\n")

    class Stop(Callback):  # rank 0's alone: its stop must reach rank 1, or rank 1 would wait at a step
        def on_epoch_end(self, epoch: int, logs: dict) -> None:
            self.model.stop_training = True

    m = hf.Model("mnist-mlp", dropout=0.2, schedule="constant")
    m.fit(data="digits", epochs=2, batch_size=64, callbacks=[Note()], verbose=True)
    np.savez(os.path.join(out, f"fit{rank}.npz"), **m.params)
    m.fit(data="digits", epochs=3, batch_size=64, callbacks=[Stop()], verbose=False)
    with open(os.path.join(out, f"stopped{rank}.txt"), "w") as f:
        f.write(f"{m._epoch} {m._step}")


def fit_refused_child(out: str) -> None:
    """Model.fit whose callback (rank 0's alone) monitors a metric the fit never logs: every rank refuses
    before a step, none waits on the others; each rank's message and step count to OUT, rank 1's a second
    after rank 0's (rank 0 exiting first cut rank 1 short, 1 run in 8–12, before a refusal ended in MPI_Finalize)."""
    import hloforge as hf
    from hloforge.core.errors import HloforgeError

    rank = mpi.world().rank
    m = hf.Model("mnist-mlp")
    try:
        m.fit(data="digits", epochs=2, batch_size=64, callbacks=[hf.EarlyStopping("zzz")], verbose=False)
    except HloforgeError as e:
        if rank:  # rank 0 exits first: the others must still get to handle the refusal
            time.sleep(1)
        with open(os.path.join(out, f"refused{rank}.txt"), "w") as f:
            f.write(f"{m._step} {e}")


def fit_save_child(out: str) -> None:
    """Model.fit then save to one path from every rank (no `if rank == 0`), as a script written for one process
    does; each rank notes the path save returned."""
    import hloforge as hf

    m = hf.Model("mnist-mlp")
    m.fit(data="digits", epochs=1, batch_size=64, verbose=False)
    rank = mpi.world().rank
    said = m.save(os.path.join(out, "run"))
    m.save(os.path.join(out, f"rank{rank}"))  # rank 1's writes nothing
    with open(os.path.join(out, f"saved{rank}.txt"), "w") as f:
        f.write(said)


# ------------------------------------------------------------------ one process: the split step's halves


def test_launched_reads_each_launchers_variables():
    assert mpi.launched({}) == (0, 1, "")
    assert mpi.launched({"PMI_SIZE": "1", "PMI_RANK": "0"}) == (0, 1, "")
    assert mpi.launched({"PMI_SIZE": "4", "PMI_RANK": "2"}) == (2, 4, "PMI_SIZE")
    assert mpi.launched({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}) == (1, 2, "OMPI_COMM_WORLD_SIZE")
    assert mpi.launched({"SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "1"}) == (1, 3, "SLURM_STEP_NUM_TASKS")
    assert mpi.launched({"SLURM_NTASKS": "8"}) == (0, 1, "")  # an sbatch script's own shell is one process


def test_a_multi_process_launch_without_mpi4py_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(BackendError, match=r"needs mpi4py \(PMI_SIZE=2.*pip install 'hloforge\[mpi\]'"):
        mpi.world({"PMI_SIZE": "2", "PMI_RANK": "1"})
    assert mpi.world({}).size == 1  # a plain run never imports it


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")
def test_a_launch_whose_mpi_sees_one_process_is_refused(tmp_path):
    """srun without its MPI plugin: the launcher says 2, MPI (a singleton) says 1."""
    code = "from hloforge.train import mpi; mpi.world()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=env(SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1"))
    assert r.returncode != 0
    assert "the launcher started 2 processes (SLURM_STEP_NUM_TASKS=2) but MPI sees 1" in r.stderr


def test_sync_bn_and_an_uneven_replica_count_are_refused_across_processes():
    two = mpi.World(0, 2)
    assert mpi.global_replicas(1, False, two) == 2 and mpi.global_replicas(4, False, two) == 4
    assert mpi.global_replicas(1, True, two) == 2 and mpi.global_replicas(2, True, two) == 2
    with pytest.raises(UnsupportedSpec, match="--sync-bn across 2 MPI processes runs one replica per process; "
                                              "--replicas 4 puts 2 in each"):
        mpi.global_replicas(4, True, two)
    with pytest.raises(UnsupportedSpec, match="--replicas 3 does not split over 2 MPI processes"):
        mpi.global_replicas(3, False, two)


@pytest.mark.parametrize("variant", [Variant("sgd"), VARIANT, Variant("adam", accum=2, ema=0.9), FROZEN],
                         ids=["sgd", "adam-clip", "adam-accum-ema", "frozen"])
def test_split_step_is_the_fused_step(variant):
    """The gradient half then the update half (one process, no all-reduce) against the fused train step."""
    spec = tiny_net()
    be = make_backend("xla")
    fused = drive(TrainSession(spec, variant, BATCH, be, seed=1), spec)
    split = drive(mpi.MpiTrainSession(spec, variant, BATCH, be, world=mpi.World(), replicas=1, seed=1), spec)
    assert fused.keys() == split.keys()
    for k in fused:
        assert rel(split[k], fused[k]) <= 1e-6, k


def test_gradient_half_is_jax_grad_of_the_loss():
    """The gradient half's ∂θ (before any all-reduce) against jax autodiff of the layers' references."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import optax

    from hloforge.core.modules import gradient_step_module

    spec = NetSpec("mpi-dense", (6,), [Dense(4, act="relu"), Dense(3)], 3)
    text, lay = gradient_step_module(spec, Variant("sgd"), BATCH)
    exe = make_backend("xla").compile(text)
    rng = np.random.default_rng(3)
    params = spec.init_params(2)
    x = rng.standard_normal((BATCH, 6)).astype(np.float32)
    y = rng.integers(0, 3, BATCH).astype(np.int32)
    be = make_backend("xla")
    outs = [be.to_host(o) for o in be.execute(exe, [be.to_device(a) for a in [*params, x, y]])]
    walk = spec.walk()

    def loss(ps):
        h, it = x, iter(ps)
        for ls in walk:
            h = ls.layer.reference({s.name: next(it) for s in ls.slots}, h, None)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(h, y))

    want_loss, want = jax.value_and_grad(loss)([jnp.asarray(p) for p in params])
    assert rel(outs[lay.n_params], np.asarray(want_loss)) <= 1e-6
    for got, ref in zip(outs[:lay.n_params], want, strict=True):
        assert rel(got, np.asarray(ref)) <= 1e-5


@pytest.mark.parametrize("variant", [VARIANT, FROZEN], ids=["adam-clip", "frozen"])
@pytest.mark.parametrize("resident", [True, False], ids=["resident", "copying"])
def test_local_replicas_under_a_one_process_world_are_the_data_parallel_session(resident, variant):
    """replicas > 1 per process: the gradient half's in-graph mean over the local devices."""
    spec = tiny_net()
    be = make_backend("xla", devices=2)
    dp = drive(DataParallelTrainSession(spec, variant, BATCH, be, replicas=2, seed=1), spec)
    split = drive(mpi.MpiTrainSession(spec, variant, BATCH, be, world=mpi.World(), replicas=2, seed=1,
                                      resident=resident), spec)
    for k in dp:
        assert rel(split[k], dp[k]) <= 1e-6, k


# ------------------------------------------------------------------ real processes under MPICH

MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")


def _mpich() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'hloforge[mpi]')"
    if MPIEXEC is None:
        return "no mpiexec (pip install mpich)"
    info = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    return "" if "HYDRA" in info else f"{MPIEXEC} is not MPICH's hydra (these tests take -iface lo)"


needs_mpi = pytest.mark.skipif(bool(_mpich()), reason=_mpich() or "MPICH present")


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")])
    return {**e, **extra}


def launch(n: int, *args: str, flags: tuple[str, ...] = (), **kw) -> subprocess.CompletedProcess:
    assert MPIEXEC is not None
    return subprocess.run([MPIEXEC, "-n", str(n), "-iface", "lo", *flags, *args], capture_output=True, text=True,
                          env=env(), timeout=300, **kw)


HLOFORGE = [sys.executable, "-m", "hloforge.cli"]


@needs_mpi
def test_two_processes_are_the_two_replica_step_and_every_rank_holds_the_same_theta(tmp_path):
    """20 steps, the flat buffer all-reduced in one call a step, and in 64-byte buckets; with the first
    layer frozen (its θ the init's, bit for bit; the buffer holds the trained ∂θ alone); and with sync BN
    (the statistics' sums all-reduced inside the step, by the host call) against the in-graph sync BN."""
    me = [sys.executable, str(Path(__file__).resolve()), "session", str(tmp_path)]
    r = subprocess.run(me, capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 0, r.stderr
    r = launch(2, *me)
    assert r.returncode == 0, r.stdout + r.stderr
    spec = tiny_net()
    init = spec.init_params(1)
    n_frozen = len(FROZEN.frozen_indices([n for n, _ in spec.params()]))
    trained_floats = sum(p.size for p in init[n_frozen:])
    refs = {"frozen": "alone-frozen.npz", "sync": "alone-sync.npz"}
    for name in ("one", "bucketed", "frozen", "sync"):
        ref = dict(np.load(tmp_path / refs.get(name, "alone.npz")))
        ranks = [dict(np.load(tmp_path / f"{name}{i}.npz")) for i in range(2)]
        calls, nbytes = ranks[0].pop("calls")
        ranks[1].pop("calls")
        # never per tensor: one gradient all-reduce a step (sync BN: and one per statistics sum the step makes)
        per_step = {"bucketed": -(-nbytes // 64), "sync": 1 + 3}.get(name, 1)
        assert calls == STEPS * per_step and nbytes > 64, (name, calls)
        if name == "frozen":
            assert n_frozen == 3  # the conv's w and BN's γ, β
            assert nbytes == 4 * (trained_floats + 1 + 6 + 2)  # trained ∂θ alone, the loss, 2 × 3 BN stats, 2 flags
            for i in range(n_frozen):
                assert np.array_equal(ranks[0][f"p{i}"], init[i]) and np.array_equal(ref[f"p{i}"], init[i])
        worst = max(rel(ranks[0][k], ref[k]) for k in ref)
        assert worst <= 1e-6, (name, worst)
        for k in ref:
            if name == "sync" or not k.startswith("b"):  # θ, state, losses (synced: statistics too): bit for bit
                assert np.array_equal(ranks[0][k], ranks[1][k]), (name, k)
    pooled, own = dict(np.load(tmp_path / "sync0.npz")), dict(np.load(tmp_path / "one0.npz"))
    assert rel(pooled["b0"], own["b0"]) > 1e-3  # the sync run really pooled: its statistics are not rank 0's


def train_cmd(run_dir: Path, epochs: int, *more: str, net: str = "mnist-mlp") -> list[str]:
    return [*HLOFORGE, "train", net, "--data", "digits", "--epochs", str(epochs), "--batch", "64",
            "--dropout", "0.2", "--schedule", "constant", "--run-dir", str(run_dir), "--no-progress", *more]


def tensors(run_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(run_dir / "checkpoint.safetensors"))


def top1s(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m["top1"] for m in map(json.loads, lines) if m.get("kind") == "epoch"]


def alone(cmd: list[str]) -> None:
    r = subprocess.run([*cmd, "--replicas", "2", "--devices", "2"], capture_output=True, text=True, env=env(),
                       timeout=300)
    assert r.returncode == 0, r.stderr


def under_mpi(cmd: list[str]) -> subprocess.CompletedProcess:
    r = launch(2, *cmd)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@needs_mpi
def test_hloforge_train_under_mpiexec_is_the_two_replica_run_and_resumes_at_any_process_count(tmp_path):
    """`mpiexec -n 2 hloforge train` = `hloforge train --replicas 2 --devices 2` (θ, state, top-1 per
    epoch); a 2-process run continued by one process, and a 1-process run by two, follow the same path."""
    ref, a, b = tmp_path / "ref", tmp_path / "a", tmp_path / "b"
    alone(train_cmd(ref, 2))
    r = under_mpi(train_cmd(a, 1))
    assert r.stdout.count("epoch 1/1") == 1  # rank 0 logs, the others do not
    assert sorted(p.name for p in a.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in ref.iterdir() if not p.name.startswith("."))
    alone(train_cmd(a, 2, "--resume"))
    alone(train_cmd(b, 1))
    under_mpi(train_cmd(b, 2, "--resume"))
    want = tensors(ref)
    for run in (a, b):
        got = tensors(run)
        assert got.keys() == want.keys()
        worst = max(rel(got[k], want[k]) for k in want)
        assert worst <= 1e-6, (run.name, worst)
        assert top1s(run) == top1s(ref)


@needs_mpi
def test_a_finished_run_resumed_under_mpiexec_with_a_callback_of_rank_0_is_refused_once(tmp_path):
    """A resume of a finished run runs its callbacks' start for no epoch (ModelCheckpoint completes a copy a kill
    cut off; tests/test_resumed_monitors.py) on every rank, rank 0's callbacks alone: the stop broadcast after
    their start is met by every rank, and the run is refused in one line. With rank 0 alone there, it waited."""
    run, best = tmp_path / "r", tmp_path / "best"
    watch = ("--callback", f"model_checkpoint:path={best},monitor=top1")
    under_mpi(train_cmd(run, 1, *watch))
    (best / "eval_correct.npz").unlink()  # a copy a kill cut off
    r = launch(2, *train_cmd(run, 1, "--resume", *watch))
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stderr.count("already finished") == 1 and (best / "eval_correct.npz").exists(), r.stderr


@needs_mpi
def test_an_early_stopped_run_resumed_under_mpiexec_stops_on_every_rank(tmp_path):
    """A run its EarlyStopping (rank 0's) ended, resumed under mpiexec: the stop its start decides reaches every
    rank (tests/test_resumed_monitors.py), so none trains an epoch alone waiting on rank 0 at its steps."""
    run = tmp_path / "r"
    stop = ("--callback", "early_stopping:monitor=lr,patience=1")  # a constant lr: no better after epoch 1
    under_mpi(train_cmd(run, 6, *stop))
    (run / "curves.png").unlink()  # a kill as they were drawn
    r = launch(2, *train_cmd(run, 6, "--resume", *stop))
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(top1s(run)) == 2 and (run / "curves.png").exists()


@needs_mpi
def test_sync_bn_under_mpiexec_is_the_one_process_sync_bn_run(tmp_path):
    """`mpiexec -n 2 hloforge train resnet-mini --sync-bn`: BN over the global batch, its sums all-reduced
    inside the step, = `--replicas 2 --devices 2 --sync-bn` in one process (checkpoint and top-1)."""
    def cmd(run_dir: Path) -> list[str]:
        return [*HLOFORGE, "train", "resnet-mini", "--data", "digits", "--epochs", "1", "--batch", "64",
                "--sync-bn", "--run-dir", str(run_dir), "--no-progress"]

    alone(cmd(tmp_path / "ref"))
    under_mpi(cmd(tmp_path / "mpi"))
    want, got = tensors(tmp_path / "ref"), tensors(tmp_path / "mpi")
    assert got.keys() == want.keys()
    assert max(rel(got[k], want[k]) for k in want) <= 1e-6
    assert top1s(tmp_path / "mpi") == top1s(tmp_path / "ref")


@needs_mpi
def test_model_fit_in_a_script_under_mpiexec_is_the_two_replica_run(tmp_path):
    """`mpiexec -n 2 python script.py` calling Model.fit: data-parallel over the ranks as `hloforge train`
    is (the same weights as `hloforge train --replicas 2 --devices 2` with the Model's settings, ≤ 1e-6),
    identical weights on both ranks, the callbacks and the log on rank 0 alone; a stop rank 0's callback
    decides ends the fit on every rank after that epoch."""
    ref = tmp_path / "ref"
    alone(train_cmd(ref, 2))
    r = launch(2, sys.executable, str(Path(__file__).resolve()), "fit", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (r.stdout + r.stderr).count("epoch 2/2") == 1  # rank 0 logs
    assert (tmp_path / "epochs0.txt").read_text() == "1\n2\n" and not (tmp_path / "epochs1.txt").exists()
    ranks = [dict(np.load(tmp_path / f"fit{i}.npz")) for i in range(2)]
    want = {k.removeprefix("param/"): v for k, v in tensors(ref).items() if k.startswith("param/")}
    assert ranks[0].keys() == want.keys()
    for k in want:
        assert np.array_equal(ranks[0][k], ranks[1][k]), k
        assert rel(ranks[0][k], want[k]) <= 1e-6, k
    steps = 1437 // 64
    assert [(tmp_path / f"stopped{i}.txt").read_text() for i in range(2)] == [f"3 {3 * steps}"] * 2


@needs_mpi
def test_a_save_every_rank_makes_after_a_fit_under_mpiexec_is_written_by_rank_0(tmp_path):
    """Both ranks wrote the same path: on a shared disk one of them was refused ('in use by another hloforge
    process', 'already holds a checkpoint') in 4 runs of 5. Rank 0 writes it, as the trainer writes its
    checkpoints, and every rank returns its path."""
    for i in range(3):
        out = tmp_path / str(i)
        out.mkdir()
        r = launch(2, sys.executable, str(Path(__file__).resolve()), "fit-save", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        assert [(out / f"saved{k}.txt").read_text() for k in range(2)] == [str(out / "run")] * 2
        assert (out / "run" / "checkpoint.safetensors").is_file()
        assert (out / "rank0" / "checkpoint.safetensors").is_file() and not (out / "rank1").exists()


@needs_mpi
def test_a_fit_callback_refused_on_rank_0_is_refused_on_every_rank_before_a_step(tmp_path):
    r = launch(2, sys.executable, str(Path(__file__).resolve()), "fit-refused", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    said = [(tmp_path / f"refused{i}.txt").read_text() for i in range(2)]
    assert said[0] == said[1] and said[0].startswith("0 EarlyStopping monitors 'zzz', but the epoch's metrics are")


@needs_mpi
def test_hloforge_train_freeze_and_ema_under_mpiexec_is_the_two_replica_run(tmp_path):
    """`--freeze 0 --ema 0.9` across 2 processes: the frozen layer's θ is the one-process run's (the
    init's) bit for bit, the trained θ, state and EMA shadow within 1e-6 of `--replicas 2 --devices 2`
    with the same flags, and each epoch scores the shadow as that run does."""
    ref, run = tmp_path / "ref", tmp_path / "mpi"
    alone(train_cmd(ref, 1, "--freeze", "0", "--ema", "0.9"))
    under_mpi(train_cmd(run, 1, "--freeze", "0", "--ema", "0.9"))
    scored = [[(m["top1"], m["top1_ema"]) for m in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
               if m.get("kind") == "epoch"] for d in (ref, run)]
    assert scored[0] == scored[1] and len(scored[0]) == 1
    want, got = tensors(ref), tensors(run)
    assert any(k.startswith("state/E/") for k in want)
    assert got.keys() == want.keys()
    frozen = [k for k in want if k.startswith("param/0.")]
    assert frozen and not any(k.startswith("state/") and "/0." in k for k in want)  # no state for a frozen θ
    for k in want:
        if k in frozen:
            assert np.array_equal(got[k], want[k]), k
        else:
            assert rel(got[k], want[k]) <= 1e-6, k


@needs_mpi
@pytest.mark.parametrize(("more", "message"), [
    (("--replicas", "4", "--devices", "2", "--sync-bn"),
     "--sync-bn across 2 MPI processes runs one replica per process; --replicas 4 puts 2 in each"),
    (("--batch", "63"), "batch 63 (the global batch) does not split evenly over 2 replicas"),
    (("--init", "no-such-run"), "--init no-such-run does not exist"),
    (("--callback", "early_stopping:monitor=zzz"), "EarlyStopping monitors 'zzz', but the epoch's metrics are"),
    (("--replicas", "3"), "batch 64 (the global batch) does not split evenly over 3 replicas"),  # before MPI starts
    (("--cutmix", "0.3"), "cutmix pastes a box of an image: it needs an input [C, H, W] or [H, W], not [784]"),
    (("--backend", "xl"), "unknown backend 'xl'; registered:"),  # before: said by every rank, then MPI_Abort
    (("--optimizer", "adamm"), "unknown optimizer 'adamm'; registered: adam (hloforge)"),  # so were these two
    (("--loss", "nope"), "unknown loss 'nope'; registered: anchorYolo (hloforge)"),
    (("--warmup-epochs", "0.01"), "warmup_epochs 0.01 is less than one optimizer update (0.01 of an epoch of 22)"),
    (("--accum", "4"), "accum 4: the 22 batches of an epoch do not divide into updates of 4 micro-batches"),
    (("--batch", "5000"), "batch 5000 is larger than the 1437-example training split"),
    (("--data-dir", "/no-such-dir"), "--data-dir /no-such-dir: dataset 'digits' reads no data dir"),
])
def test_a_refusal_every_rank_reaches_under_mpiexec_is_one_line(tmp_path, more, message):
    """Printed by rank 0 alone; --replicas left at its default (one per process) refused for what MPI makes of it."""
    r = launch(2, *train_cmd(tmp_path / "r", 1, *more))
    assert r.returncode == 3
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("hloforge:")]
    assert len(lines) == 1 and message in lines[0], r.stdout + r.stderr
    assert not (tmp_path / "r").exists()


@needs_mpi
def test_a_usage_error_under_mpiexec_is_printed_once(tmp_path):
    r = launch(2, *train_cmd(tmp_path / "r", 0))
    assert r.returncode == 2
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("hloforge")]
    assert lines == ["hloforge train: error: argument --epochs: expected an integer ≥ 1, got '0' (see `hloforge "
                     "train -h`)"], r.stdout + r.stderr


@needs_mpi
def test_a_rank_started_with_another_config_is_refused_in_one_line(tmp_path):
    cmd = train_cmd(tmp_path / "r", 1)
    r = launch(1, *cmd, ":", "-n", "1", *cmd[:-1], "--lr", "0.002", "--no-progress")
    assert r.returncode != 0
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("hloforge:")]
    assert len(lines) == 1, r.stdout + r.stderr
    assert "rank 1 of 2 was started with another config, net or data than rank 0" in lines[0] and "lr" in lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "r" / "checkpoint.safetensors").exists()


@needs_mpi
@pytest.mark.parametrize(("alone", "more", "message"), [
    (1, ("--epochs", "0"), "hloforge train: error: argument --epochs: expected an integer ≥ 1, got '0'"),
    (0, ("--bogus",), "hloforge train: error: unrecognized arguments: --bogus"),
    (1, ("--config", "/no-such.toml"), "hloforge: error: config /no-such.toml: no such file or directory"),
    # refused once the run starts: an unknown plugin, an option its net cannot take
    (1, ("--backend", "xl"), "hloforge: error: unknown backend 'xl'"),
    (0, ("--sync-bn",), "hloforge: error: sync_bn: net 'mnist-mlp' has no BatchNorm"),
])
def test_a_rank_that_alone_ends_or_refuses_is_one_line_naming_it(tmp_path, alone, more, message):
    """A usage error or a refusal on one rank only. Before: a rank ending before the start left before
    MPI_Init, said by rank 0 alone or by nobody, and the others waited in MPI_Init for ever; a rank refusing its
    options once started ended quietly (as if every rank refused alike), and the others waited at their next
    collective for 20 × the timeout, then named it missing with no cause. Now the rank says it, once."""
    cmd = train_cmd(tmp_path / "r", 1)
    ranks = [cmd, [*cmd, *more]] if alone else [[*cmd, *more], cmd]
    assert MPIEXEC is not None
    t = time.monotonic()
    r = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "1", *ranks[0], ":", "-n", "1", *ranks[1]],
                       capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode in (2, 3) and time.monotonic() - t < 120, r.stdout + r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("hloforge")]
    assert len(lines) == 1 and lines[0].startswith(message), r.stdout + r.stderr
    assert lines[0].endswith(f"(on rank {alone} of 2 alone: start every rank with the same command)")
    assert not (tmp_path / "r").exists()


@needs_mpi
def test_a_rank_that_read_other_data_under_the_same_path_is_refused_in_one_line(tmp_path):
    """One --data-file path, another file behind it on rank 1 (another machine's copy; here /proc/self/cwd and
    -wdir). Before: every rank trained on its own data, rank 0 scored a plausible loss, and the ranks, at other
    step counts, met at mismatched collectives until one was named missing."""
    for rank, word in enumerate(("the quick brown fox ", "lorem ipsum dolor sit amet ")):
        (tmp_path / f"w{rank}").mkdir()
        (tmp_path / f"w{rank}" / "corpus.txt").write_text(word * (400 + 300 * rank))
    cmd = [*HLOFORGE, "train", "tinygpt-nano", "--data", "text", "--data-file", "/proc/self/cwd/corpus.txt",
           "--epochs", "1", "--batch", "32", "--run-dir", str(tmp_path / "r"), "--no-progress"]
    assert MPIEXEC is not None
    r = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "1", "-wdir", str(tmp_path / "w0"), *cmd, ":", "-n", "1",
                        "-wdir", str(tmp_path / "w1"), *cmd], capture_output=True, text=True, timeout=300,
                       env=env(HLOFORGE_MPI_TIMEOUT="5"))
    assert r.returncode != 0
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("hloforge")]
    assert len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith("hloforge: error: rank 1 of 2 was started with another config, net or data than "
                               "rank 0 (data.eval_set: 'text:test:"), lines[0]
    assert not (tmp_path / "r" / "checkpoint.safetensors").exists()


@needs_mpi
def test_a_callback_of_hloforge_train_runs_on_rank_0_alone(tmp_path):
    """`--callback tensorboard:logdir=tb,every_step=true` (a relative logdir; each rank in its own -wdir). Before:
    rank 1 opened a writer of its own and wrote every step's loss again (a second events file on another machine;
    here, in the same second, the same file name)."""
    pytest.importorskip("tensorboardX")
    cmd = [*train_cmd(tmp_path / "r", 1), "--callback", "tensorboard:logdir=tb,every_step=true"]
    for rank in (0, 1):
        (tmp_path / f"w{rank}").mkdir()
    assert MPIEXEC is not None
    r = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "1", "-wdir", str(tmp_path / "w0"), *cmd, ":", "-n", "1",
                        "-wdir", str(tmp_path / "w1"), *cmd], capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(os.listdir(tmp_path / "w0" / "tb")) == 1
    assert not (tmp_path / "w1" / "tb").exists() or not os.listdir(tmp_path / "w1" / "tb")


@needs_mpi
def test_init_weights_on_a_path_rank_0_alone_sees_start_every_rank(tmp_path):
    """--init read by rank 0 and broadcast, as a resumed checkpoint is (before: every rank read it, and rank 1,
    on a machine without the file, stopped the job with '--init ... does not exist')."""
    alone(train_cmd(tmp_path / "ref", 1))
    for rank in (0, 1):
        (tmp_path / f"w{rank}").mkdir()
    (tmp_path / "w0" / "ref").symlink_to(tmp_path / "ref")
    cmd = [*train_cmd(tmp_path / "r", 1), "--init", "/proc/self/cwd/ref"]
    assert MPIEXEC is not None
    r = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "1", "-wdir", str(tmp_path / "w0"), *cmd, ":", "-n", "1",
                        "-wdir", str(tmp_path / "w1"), *cmd], capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert tensors(tmp_path / "r").keys() == tensors(tmp_path / "ref").keys()


@needs_mpi
def test_a_resume_of_a_run_directory_rank_0_alone_sees_reads_its_config_there(tmp_path):
    """--resume with the run directory on rank 0's machine alone, the run's lr not given again: rank 0 reads
    its config.toml and gives it to the others, as it does the checkpoint (before: every rank read it, so rank 1
    took the default lr and the start refused rank 1 as started with another config)."""
    alone(train_cmd(tmp_path / "ref", 2, "--lr", "0.003"))
    alone(train_cmd(tmp_path / "run", 1, "--lr", "0.003"))
    for rank in (0, 1):
        (tmp_path / f"w{rank}").mkdir()
    (tmp_path / "w0" / "run").symlink_to(tmp_path / "run")
    cmd = train_cmd(Path("/proc/self/cwd/run"), 2, "--resume")
    assert MPIEXEC is not None
    r = subprocess.run([MPIEXEC, "-iface", "lo", "-n", "1", "-wdir", str(tmp_path / "w0"), *cmd, ":", "-n", "1",
                        "-wdir", str(tmp_path / "w1"), *cmd], capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stdout + r.stderr
    got, want = tensors(tmp_path / "run"), tensors(tmp_path / "ref")
    assert max(rel(got[k], want[k]) for k in want) <= 1e-6
    assert top1s(tmp_path / "run") == top1s(tmp_path / "ref")


def _rank_pid(tag: str, rank: int) -> int | None:
    """The pid of rank `rank`'s worker (the process that trains: not its parent, mpi.supervise)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            environ = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if {f"HLOFORGE_TEST_TAG={tag}".encode(), f"PMI_RANK={rank}".encode(),
                f"{mpi.WORKER_ENV}=1".encode()} <= set(environ):
            return int(d.name)
    return None


def drill(tmp_path: Path, sig: int | None, flags: tuple[str, ...] = (), timeout_s: str = "30", net: str = "mnist-mlp",
          more: tuple[str, ...] = (), to_parent: bool = False, left: list[int] | None = None, stop_at: str = ""):
    """Start a 2-process run (train_cmd's of `net`, with `more`), wait until rank 1 is training (a step of epoch 1
    traced), send it (its worker, or with `to_parent` the process hydra started) `sig`; (seconds from the signal
    to the job's end, its output, its exit status). `stop_at` instead of `sig`: rank 1 stops itself as it
    reaches that all-reduce (mpi.STOP_ENV), the seconds counted from then. `left`: gets the ranks whose worker
    outlived the job."""
    tag = uuid.uuid4().hex
    trace = tmp_path / "trace"
    cmd = [MPIEXEC, "-n", "2", "-iface", "lo", *flags, *train_cmd(tmp_path / "r", 50, *more, net=net)]
    e = env(HLOFORGE_TEST_TAG=tag, HLOFORGE_DRILL_TRACE=str(trace), HLOFORGE_MPI_TIMEOUT=timeout_s,
            **({mpi.STOP_ENV: f"1:{stop_at}"} if stop_at else {}))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
    try:
        deadline = time.monotonic() + 240
        started = (lambda text: "stopped " in text) if stop_at else (lambda text: text.count("step 1 ") >= 10)
        while not (trace.exists() and started(trace.read_text())):
            assert p.poll() is None and time.monotonic() < deadline, "the run never started training"
            time.sleep(0.05 if stop_at else 0.2)
        if sig is not None:
            pid = _rank_pid(tag, 1)
            assert pid is not None
            if to_parent:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            os.kill(pid, sig)
        t = time.monotonic()
        out, _ = p.communicate(timeout=120)
        return time.monotonic() - t, out, p.returncode
    finally:
        if p.poll() is None:
            p.kill()
        if left is not None:
            time.sleep(0.5)  # a worker's SIGKILL on its parent's death (supervise._die_with_parent) is not instant
        for rank in (0, 1):
            pid = _rank_pid(tag, rank)
            if pid is not None:
                if left is not None:
                    left.append(rank)
                os.kill(pid, signal.SIGKILL)


def _supervised(worker: str) -> subprocess.CompletedProcess:
    """`mpi.supervise` as hydra starts it (a PMI fd, rank 1 of 2) over a worker running `worker`."""
    r, w = os.pipe()
    try:
        return subprocess.run([sys.executable, "-c", "import sys; from hloforge.train.mpi import supervise; "
                               "supervise(sys.argv[1:])", "-c", worker], pass_fds=(r,), capture_output=True,
                              text=True, timeout=60, env=env(PMI_FD=str(r), PMI_RANK="1", PMI_SIZE="2"))
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize(("worker", "died", "line"), [
    ("import os; os._exit(3)", False, ""),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", True, "rank 1 of 2 died, killed by SIGSEGV (11)"),
], ids=["exits", "killed"])
def test_a_supervising_parent_whose_worker_a_signal_killed_dies_by_sigkill(worker, died, line):
    """Hydra's proxy ends the job for certain only on reaping a process that died by a signal (the PMI socket's
    closing it misses when it reaps the process first: 2 killed-rank drills in 36 then ran into the survivors'
    timeout). A worker's own exit status passes through; one a signal ended takes the parent down by SIGKILL,
    after the line naming it."""
    r = _supervised(worker)
    assert r.returncode == (-signal.SIGKILL if died else 3), (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hloforge:")]
    assert lines == ([f"hloforge: error: {line}; the other ranks stopped"] if line else []), r.stderr


def hloforge_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("hloforge: error")]


@needs_mpi
@pytest.mark.parametrize("flags", [(), ("-disable-auto-cleanup",)], ids=["hydras-cleanup", "no-auto-cleanup"])
def test_a_killed_rank_ends_the_job_with_one_line_naming_it(tmp_path, flags):
    """The dead worker's parent (mpi.supervise) names it, then dies by SIGKILL, which hydra answers by killing
    the survivors; a survivor told first (SIGUSR1, under -disable-auto-cleanup) stops quietly. One drill each:
    the line must come every time, and only once."""
    secs, out, rc = drill(tmp_path, signal.SIGKILL, flags=flags)
    assert rc != 0 and secs <= 60, (secs, out)
    lines = hloforge_lines(out)
    assert len(lines) == 1 and "rank 1 of 2 died, killed by SIGKILL" in lines[0], out
    assert "Traceback" not in out


@needs_mpi
def test_a_rank_the_user_stops_is_not_reported_as_died(tmp_path):
    """A SIGTERM to the job (hydra passes mpiexec's on; the parent hands it to its worker) is not news."""
    secs, out, rc = drill(tmp_path, signal.SIGTERM, to_parent=True)
    assert rc != 0 and secs <= 60, (secs, out)
    assert not [ln for ln in hloforge_lines(out) if "died" in ln], out
    assert "Traceback" not in out


@needs_mpi
def test_a_killed_parent_takes_its_worker_with_it(tmp_path):
    """Hydra's cleanup kills the processes it started (the parents): no worker may outlive the job, still
    training, or stopped and holding the job's output open."""
    left: list[int] = []
    secs, out, rc = drill(tmp_path, signal.SIGKILL, to_parent=True, left=left)
    assert rc != 0 and secs <= 60, (secs, out)
    assert left == [], (left, out)
    assert "Traceback" not in out


@needs_mpi
@pytest.mark.parametrize("flags", [(), ("-disable-auto-cleanup",)], ids=["hydras-cleanup", "no-auto-cleanup"])
def test_a_hung_rank_makes_the_others_stop_within_the_timeout_naming_it(tmp_path, flags):
    """Rank 0 reports and ends the job (MPI_Abort): with the hung rank stopped, nothing else would end it. At
    batch 16 (89 steps an epoch), so that the stop lands mid-epoch: at batch 64 a fast machine ran rank 1's
    last 17 steps within the drill's 0.2 s poll, and rank 0 waited at the epoch's end, whose wait follows rank
    0's checkpoint and so gets SLOW_PHASE_FACTOR timeouts (101 s)."""
    secs, out, rc = drill(tmp_path, signal.SIGSTOP, flags=flags, timeout_s="5", more=("--batch", "16"))
    assert rc != 0 and secs <= 60, (secs, out)
    lines = hloforge_lines(out)
    assert len(lines) == 1 and "rank 1 of 2 did not arrive within 5 s" in lines[0], out
    assert "Traceback" not in out


@needs_mpi
def test_a_hung_rank_inside_the_sync_bn_step_makes_the_others_stop_naming_it(tmp_path):
    """The wait inside the step's host call (on an XLA thread) is watched like every other: rank 1 stops as it
    reaches the statistics' all-reduce (stopped from outside, it may stop after its last one of a step, and
    rank 0 then waits at the gradient all-reduce instead)."""
    secs, out, rc = drill(tmp_path, None, timeout_s="5", net="resnet-mini", more=("--sync-bn",),
                          stop_at="the sync-BN statistics")
    assert rc != 0 and secs <= 60, (secs, out)
    lines = hloforge_lines(out)
    assert len(lines) == 1 and "rank 1 of 2 did not arrive within 5 s (HLOFORGE_MPI_TIMEOUT) at the sync-BN " \
        "statistics" in lines[0], out
    assert "Traceback" not in out


if __name__ == "__main__":
    if sys.argv[1] == "session":
        session_child(sys.argv[2])
    elif sys.argv[1] == "fit":
        fit_child(sys.argv[2])
    elif sys.argv[1] == "fit-refused":
        fit_refused_child(sys.argv[2])
    elif sys.argv[1] == "fit-save":
        fit_save_child(sys.argv[2])
