"""The step-time benchmark runs end to end at tiny settings (no timing assertions: machines are noisy)."""

from __future__ import annotations

import json

import pytest

from hloforge import bench

pytest.importorskip("jax")
pytest.importorskip("optax")


def test_bench_tiny_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--nets", "mnist-linear", "--batch", "8", "--steps", "2", "--warmup", "1",
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
        assert len(r["ms"]) == 2 and all(t > 0 for t in r["ms"]) and r["median_ms"] > 0
        assert r["compile_s"] > 0 and r["first_loss"] > 0
    ref = rows["hloforge-xla"]["first_loss"]
    assert abs(rows["jax.jit"]["first_loss"] - ref) <= 1e-4 * ref
    for b in ("hloforge-xla", "jax.jit"):
        assert data["dispatch_us"][b]["us"] > 0
    assert all(c["ok"] for c in data["sanity"])


def test_bench_skips_unavailable_backend_with_a_note(monkeypatch, capsys):
    monkeypatch.setattr(bench, "hloforge_backend_names", lambda: ["xla"])
    rc = bench.main(["--nets", "mnist-linear", "--batch", "4", "--steps", "1", "--warmup", "1",
                     "--backends", "hloforge-iree", "--dispatch-calls", "5"])
    assert rc == 0
    assert "skipped: backend 'iree' not registered" in capsys.readouterr().out


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
