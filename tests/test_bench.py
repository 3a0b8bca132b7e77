"""The step-time benchmark runs end to end at tiny settings (no timing assertions: machines are noisy)."""

from __future__ import annotations

import json
import os

import pytest

from hloforge import bench
from hloforge.core.errors import UnsupportedSpec

pytest.importorskip("jax")
pytest.importorskip("optax")


def test_bench_tiny_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--nets", "mnist-linear", "--batch", "8", "--steps", "2", "--warmup", "1", "--rounds", "2",
                     "--backends", "hloforge-xla,jax.jit", "--dispatch-calls", "20", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "mnist-linear (8)" in text and "hloforge-xla" in text and "jax.jit" in text
    assert "OK" in text and "MISMATCH" not in text  # first-step losses agree

    data = json.loads(out.read_text())
    rows = {r["backend"]: r for r in data["results"]}
    assert set(rows) == {"hloforge-xla", "jax.jit"}
    for r in rows.values():
        assert r["net"] == "mnist-linear" and r["batch"] == 8
        assert len(r["ms"]) == 2 * 2 and all(t > 0 for t in r["ms"]) and r["median_ms"] > 0  # both rounds' steps
        assert r["compile_s"] > 0 and r["first_loss"] > 0
    ref = rows["hloforge-xla"]["first_loss"]
    assert abs(rows["jax.jit"]["first_loss"] - ref) <= 1e-4 * ref
    for b in ("hloforge-xla", "jax.jit"):
        assert data["dispatch_us"][b]["us"] > 0
    assert all(c["ok"] for c in data["sanity"])


def test_a_round_that_fails_is_said_and_the_others_still_count(monkeypatch, tmp_path):
    calls = []

    def measure(net, backend, batch, steps, warmup, lr, seed):
        calls.append(backend)
        if len(calls) == 2:
            raise RuntimeError("the machine fell over")
        return bench.Result(net, backend, batch, [1.0] * steps, 0.1, 2.0)

    monkeypatch.setattr(bench.cli, "measure", measure)
    out = tmp_path / "r.json"
    bench.main(["--nets", "mnist-linear", "--batch", "4", "--steps", "2", "--rounds", "3", "--isolate", "",
                "--backends", "hloforge-xla", "--dispatch-calls", "0", "--no-roofline", "--json", str(out)])
    (row,) = json.loads(out.read_text())["results"]
    assert calls == ["hloforge-xla"] * 3 and len(row["ms"]) == 2 * 2
    assert row["note"] == "round 2 failed: RuntimeError: the machine fell over"


@pytest.mark.parametrize("cold", [False, True])
def test_setup_of_each_round_is_counted_as_compiled_or_cached(cold, monkeypatch, tmp_path, capsys):
    """Without --cold a net's later rounds load the first round's executable from the cache (as a
    second run would) and the table says so in a row of its own; with --cold every round compiles."""
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "r.json"
    bench.main(["--nets", "mnist-linear", "--batch", "4", "--steps", "1", "--warmup", "1", "--rounds", "3",
                "--isolate", "", "--backends", "hloforge-xla", "--dispatch-calls", "0", "--no-roofline",
                "--json", str(out), *(["--cold"] if cold else [])])
    (row,) = json.loads(out.read_text())["results"]
    assert (len(row["cold_setups"]), len(row["cached_setups"])) == ((3, 0) if cold else (1, 2))
    assert row["compile_s"] == row["cold_setups"][0] > 0
    text = capsys.readouterr().out
    assert "  setup " in text and ("  setup, cached" in text) != cold
    assert "(compiled " in text
    # the empty caches were the rounds' own: the user's setting is back
    assert os.environ["HLOFORGE_CACHE_DIR"] == str(tmp_path / "cache")
    assert any((tmp_path / "cache").rglob("*")) != cold


def test_cold_gives_torch_compile_an_empty_inductor_cache_and_puts_the_setting_back(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with bench.timing.empty_cache("torch-compile"):
        inside = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert os.path.isdir(inside) and not os.listdir(inside)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and not os.path.exists(inside)
    with bench.timing.empty_cache("torch"):  # eager torch keeps nothing on disk
        assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_bench_skips_unavailable_backend_with_a_note(monkeypatch, capsys):
    monkeypatch.setattr(bench.common, "hloforge_backend_names", lambda: ["xla"])
    rc = bench.main(["--nets", "mnist-linear", "--batch", "4", "--steps", "1", "--warmup", "1",
                     "--backends", "hloforge-iree", "--dispatch-calls", "5"])
    assert rc == 0
    assert "skipped: backend 'iree' not registered" in capsys.readouterr().out


def test_a_measurement_that_fails_in_its_child_says_the_error_not_the_tracebacks_last_line(monkeypatch, tmp_path):
    """An isolated child's failure was read off its stderr's last line: for the jax peer, JAX's note 'For simplicity,
    JAX has removed its internal frames ...', which names no error. The child now writes the failure as its row."""
    def measure(net, backend, batch, steps, warmup, lr, seed):
        raise ValueError("axis 2 is out of bounds for array of dimension 2\nmore of JAX's explanation")

    monkeypatch.setattr(bench.cli, "measure", measure)
    out = tmp_path / "r.json"
    assert bench.main(["--_child", str(out), "--nets", "mnist-linear", "--backends", "jax.jit", "--batch", "4"]) == 0
    row = json.loads(out.read_text())
    assert row["ms"] == [] and row["note"] == "failed: ValueError: axis 2 is out of bounds for array of dimension 2"


def test_bench_isolated_measurement_and_cap():
    r = bench.measure_isolated("mnist-linear", "hloforge-xla", 4, 1, 1, 1e-3, 0, cap_s=120)
    assert len(r.ms) == 1 and r.ms[0] > 0 and r.first_loss is not None, r.note
    r = bench.measure_isolated("mnist-linear", "hloforge-xla", 4, 1, 1, 1e-3, 0, cap_s=0.01)
    assert not r.ms and "cap" in r.note


def test_torch_peer_matches_first_step_loss():
    pytest.importorskip("torch")
    r = bench.measure("mnist-cnn", "torch", 2, 1, 1, 1e-3, 0)
    x = bench.measure("mnist-cnn", "hloforge-xla", 2, 1, 1, 1e-3, 0)
    assert r.first_loss == pytest.approx(x.first_loss, rel=1e-4)


def test_net_reference_with_an_input_shape():
    assert bench.load_net("vit-mini:3x32x32").input_shape == (3, 32, 32)
    with pytest.raises(UnsupportedSpec, match="CxHxW"):
        bench.load_net("vit-mini:3xbig")


def test_torch_peer_of_batch_norm_and_blocks_starts_from_the_same_loss(capsys):
    """ConvBn, residual stages and inverted residuals (depthwise convs) translate to torch: the
    first-step losses agree (the sanity check fails the run otherwise)."""
    pytest.importorskip("torch")
    rc = bench.main(["--nets", "resnet-mini,mobilenetv2-mini", "--batch", "2", "--steps", "1", "--warmup", "1",
                     "--backends", "hloforge-xla,torch", "--dispatch-calls", "0", "--no-roofline"])
    out = capsys.readouterr().out
    assert rc == 0 and out.count("torch first-step loss") == 2 and "MISMATCH" not in out


def test_throughput_table_reports_gflops_roofline_and_ratios():
    rs = [bench.Result("n", "hloforge-xla", 8, [2.0]), bench.Result("n", "hloforge-iree", 8, [4.0]),
          bench.Result("n", "jax.jit", 8, [1.0]), bench.Result("n", "torch", 8, [5.0])]
    text = bench.throughput(rs, list(bench.BACKENDS), {"n": 0.1}, roofline=100.0)
    row = text.splitlines()[2].split()
    # 0.1 GFLOP in 2 ms is 50 GFLOP/s, half the roofline; best hloforge 2 ms over torch 5; xla 2 over jax 1
    assert row[:4] == ["n", "0.10", "50.0", "(50%)"] and row[-2:] == ["0.40x", "2.00x"]


def test_suite_vit_is_the_issues_at_batch_64():
    (net, batch), = [(n, b) for n, b in bench.SUITE if n.startswith("vit")]
    spec = bench.load_net(net)
    assert spec.name == "vit-cifar" and batch == 64  # its size: tests/test_zoo.py


def test_torch_and_jax_peers_of_a_vit_follow_hloforge_step_by_step():
    """Patch embedding, LayerNorm, attention (our qkv head split), tanh-GELU MLP, final LN, class
    token and head translate to torch and to the jax references: the same loss on three Adam steps
    over one batch, so the forward and the gradients agree, not just the initial logits."""
    pytest.importorskip("torch")
    net = "vit-mini:3x16x16"  # patch 4: 16 patches + a class token, D 32, 2 heads, 4 blocks
    x, y = bench.batches(bench.load_net(net), 4, 1, 0)[0]
    losses = {}
    for backend in ("hloforge-xla", "jax.jit", "torch"):
        _, step, _, _ = bench.make_step(net, backend, 4, 1e-3, 0)
        losses[backend] = [step(x, y) for _ in range(3)]
    ours = losses["hloforge-xla"]
    assert ours[2] < ours[1] < ours[0]
    for backend in ("jax.jit", "torch"):
        assert losses[backend] == pytest.approx(ours, rel=bench.LOSS_RTOL), backend


def test_torch_compile_peer_and_peak_memory_in_table_and_json(monkeypatch, tmp_path, capsys):
    """torch.compile runs as a peer (its compile in setup, the same first loss; a second round loads
    its graphs from inductor's cache and is counted so) and every isolated (net, backend) reports its
    child's peak resident memory."""
    pytest.importorskip("torch")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    out = tmp_path / "bench.json"
    rc = bench.main(["--nets", "mnist-linear", "--batch", "4", "--steps", "1", "--warmup", "1", "--dispatch-calls", "0",
                     "--rounds", "2", "--no-roofline", "--backends", "hloforge-xla,torch-compile", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "torch-compile first-step loss" in text and "MISMATCH" not in text
    assert "peak RSS" in text
    rows = {r["backend"]: r for r in json.loads(out.read_text())["results"]}
    tc = rows["torch-compile"]
    assert len(tc["ms"]) == 2 and tc["median_ms"] > 0 and tc["compile_s"] > 0, tc["note"]
    assert "torch.compile" in tc["note"]
    assert (len(tc["cold_setups"]), len(tc["cached_setups"])) == (1, 1)
    assert all(r["peak_rss_mb"] > 0 for r in rows.values())


def test_peak_memory_is_the_childs_own_not_the_parents():
    """Linux's ru_maxrss survives exec: a child of a big parent would report the parent's size."""
    import numpy as np

    held = np.ones(32 * 2**20)  # 256 MB resident in this process while the child runs
    r = bench.measure_isolated("mnist-linear", "hloforge-xla", 4, 1, 1, 1e-3, 0, cap_s=120)
    assert r.peak_rss_mb is not None and 0 < r.peak_rss_mb < held.nbytes / 2**20, (r.peak_rss_mb, r.note)


def test_torch_compile_peer_is_skipped_with_a_note_without_torch(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch now raises ImportError
    assert "not importable" in bench.unavailable("torch-compile")


def test_an_in_process_hloforge_measurement_keeps_its_heap_before_jax_starts():
    """jax's client, started first (the step's FLOP count), would fix glibc's arena limit before the
    kept-heap policy: XLA's scratch then came from the kernel every step. A fresh process, since a
    client made by another test would already have applied the policy."""
    import subprocess
    import sys

    code = ("import hloforge.bench.cli as c\n"
            "from hloforge.backends import host_memory as h\n"
            "seen = []\n"
            "c.step_gflop = lambda net, batch: seen.append(h.heap_kept())\n"
            "rc = c.main(['--nets', 'mnist-linear', '--batch', '8', '--steps', '1', '--warmup', '1', '--backends',\n"
            "             'hloforge-xla', '--isolate', '', '--no-roofline', '--dispatch-calls', '0'])\n"
            "print('kept before the FLOP count:', seen, rc)\n")
    env = {k: v for k, v in os.environ.items() if k != "HLOFORGE_HOST_MEMORY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert "kept before the FLOP count: [True] 0" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_strategy_table_and_the_steps_help_read_as_columns_and_words():
    """The lowering-strategy table padded kinds to 8 characters, so a longer one (paramLayout, tokenProduct)
    pushed its row's choices out of line; `bench -h` showed --steps's defaults as a Python dict."""
    from hloforge.bench.cli import parser
    from hloforge.bench.report import strategy_lines, strategy_table

    lines = strategy_lines()
    assert len(lines) == len(strategy_table()) and any(len(kind) > 8 for kind, _, _ in strategy_table())
    assert len({line.index("iree=") for line in lines}) == 1 and len({line.index("(choices:") for line in lines}) == 1
    steps = next(a for a in parser()._actions if "--steps" in a.option_strings)
    assert steps.help.endswith("(default: mnist-mlp 300, mnist-linear 300, mnist-cnn 10, another net 10)")
