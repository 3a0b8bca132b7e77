"""Fine-tuning: frozen parameters (Variant.frozen) in the train step, and `train --init` from a run,
a checkpoint or an export, with a new head when the class count changes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hloforge.cli import EXIT_BAD_INPUT, EXIT_OK, main
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.modules import train_step_module
from hloforge.core.variant import Variant
from hloforge.interop.exporter import export_run
from hloforge.train import checkpoint as ckpt
from hloforge.train.session import TrainSession, make_backend
from hloforge.train.trainer import Run, TrainConfig, train
from hloforge.zoo import get_net

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy


# ------------------------------------------------------------------ the variant field
def test_frozen_prefixes_name_the_variant_and_an_empty_set_names_nothing_new() -> None:
    v = Variant(frozen=("1.b0", "0.", "1"))
    assert v.frozen == ("0", "1")  # "0." is "0"; "1" covers "1.b0"
    assert v.slug != Variant().slug and v.slug.startswith("adam_frz")
    assert Variant.parse(v.slug) == v
    assert Variant(frozen=()).slug == "adam" and Variant(clip=1.0, frozen=()).slug == "adam_clip1"
    assert v.frozen_indices(["0.w", "1.b0.w", "10.w", "2.w"]) == (0, 1)  # "1" never covers "10.w"


@pytest.mark.parametrize("frozen, what", [
    (("9",), "frozen prefix '9' matches no parameter of net 'mnist-mlp'; valid prefixes are layer indices"),
    (("0", "1", "2"), "covers every parameter"),
    (("a_b",), "expected a parameter-name prefix"),
])
def test_a_frozen_set_that_names_nothing_or_everything_is_one_line(frozen: tuple[str, ...], what: str) -> None:
    with pytest.raises(UnsupportedSpec, match=what):
        train_step_module(get_net("mnist-mlp"), Variant(frozen=frozen), 4)


def test_the_rendered_step_takes_frozen_params_as_inputs_with_no_state() -> None:
    text, lay = train_step_module(get_net("mnist-mlp"), Variant(frozen=("0",)), 4)
    assert lay.frozen == (0, 1) and lay.trained == (2, 3, 4, 5) and lay.n_carried == 4 * 3
    main_line = next(ln for ln in text.splitlines() if "@main(" in ln)
    args, outs = main_line.split("@main(", 1)[1].split(") -> (", 1)
    args = args.split("%arg")[1:]
    assert outs.count("tensor<") == 4 * 3 + 1  # θ', m', v' of the trained four, the loss
    assert "aliasing_output" not in args[0] and "aliasing_output" not in args[1]  # θ 0.w, 0.b: inputs alone
    assert [f"aliasing_output = {j} " in args[2 + j] for j in range(4)] == [True] * 4
    assert len(args) == 6 + 2 * 4 + 3  # θ (all), m and v of the trained four, schedule, x, y


# ------------------------------------------------------------------ the gate: frozen against jax
def test_frozen_params_stay_bit_identical_and_the_rest_train_as_jax_with_them_as_constants() -> None:
    """Adam with a global-norm clip that binds: the frozen θ never move and have no state, and the
    trained ones follow jax + optax with the frozen θ closed over as constants (so their gradients are
    neither applied nor counted in the clip's norm)."""
    spec, batch, lr, steps = get_net("mnist-mlp"), 8, 1e-2, 4
    variant = Variant("adam", clip=0.05, frozen=("0",))
    session = TrainSession(spec, variant, batch, make_backend("xla"), seed=3)
    init = spec.init_params(3)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((batch, *spec.input_shape)).astype(np.float32) for _ in range(steps)]
    ys = [rng.integers(0, 10, batch).astype(np.int32) for _ in range(steps)]
    losses = [session.train_step(x, y, lr) for x, y in zip(xs, ys, strict=True)]
    got = session.read_params()
    assert all(np.array_equal(got[i], init[i]) for i in (0, 1))
    assert len(session.read_state()) == 2 * 4  # m and v of the four trained tensors only

    walk = spec.walk()

    def loss_fn(trained, x, y):
        it = iter([jnp.asarray(init[0]), jnp.asarray(init[1]), *trained])
        for ls in walk:
            x = ls.layer.reference({s.name: next(it) for s in ls.slots}, x, None)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(x, y))

    tx = variant.wrappers.optax_reference(session.optimizer, lr, [s.decay for _, s in spec.params()[2:]])
    ps = [jnp.asarray(p) for p in init[2:]]
    state, ref_losses = tx.init(ps), []
    for x, y in zip(xs, ys, strict=True):
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        assert float(optax.tree.norm(g)) > 0.05  # the clip binds on every step
        upd, state = tx.update(g, state, ps)
        ps = optax.apply_updates(ps, upd)
        ref_losses.append(float(loss))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    # how far each trained tensor moved, against how far jax moved it (a clip counting the frozen gradients
    # would scale every step: measured ~0.3 relative; f32 rounding leaves ~1e-5)
    for j, (a, b) in enumerate(zip(got[2:], ps, strict=True)):
        moved, ref = a - init[2 + j], np.asarray(b) - init[2 + j]
        assert np.linalg.norm(ref) > 0 and np.linalg.norm(moved - ref) <= 1e-4 * np.linalg.norm(ref), j


def test_a_frozen_step_is_the_same_resident_or_copying_and_an_ema_run_scores_its_shadow(tmp_path) -> None:
    spec, batch = get_net("mnist-mlp"), 8
    variant = Variant("adam", ema=0.9, frozen=("0",))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *spec.input_shape)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    a, b = (TrainSession(spec, variant, batch, make_backend("xla"), resident=r) for r in (True, False))
    for s in (a, b):
        s.train_step(x, y, 1e-2)
        s.train_step(x, y, 1e-2)
    assert all(np.array_equal(p, q) for p, q in zip(a.read_params(), b.read_params(), strict=True))
    assert all(np.array_equal(p, q) for p, q in zip(a.read_state(), b.read_state(), strict=True))
    # the shadow of a frozen θ is θ itself: the eval forward gets every θ
    assert len(a.slot_buffers("E")) == len(spec.params())

    from hloforge.commands.opening import evaluate_checkpoint

    run = str(tmp_path / "r")
    train(TrainConfig(net="mnist-mlp", epochs=1, ema=0.9, frozen=("0",), run_dir=run), progress=False)
    got, _ = ckpt.load_checkpoint(os.path.join(run, "checkpoint.safetensors"))
    assert "state/E/0.w" not in got and "state/E/1.w" in got
    live, ema = (evaluate_checkpoint(run, region=r, log=lambda s: None) for r in ("live", "ema"))
    assert 0 < ema.top1 <= ema.n and live.n == ema.n


# ------------------------------------------------------------------ --init
SMALL = dict(net="resnet-mini", input=(1, 12, 12), data_options=("size=12",), epochs=1, batch=128, augment=False,
             log_every=1)


def _first_step_loss(run_dir: str) -> float:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return next(r["loss"] for r in map(json.loads, f) if r.get("kind") == "step" and r["step"] == 1)


def _loss_on_first_batch(cfg: TrainConfig, params: list[np.ndarray]) -> float:
    """The train-mode loss of `params` on the first batch a run of `cfg` draws (what its step 1 reports)."""
    run = Run(cfg, progress=False)
    session = TrainSession(run.spec, run.variant, cfg.batch, run.backend, params=params)
    xb, yb = next(iter(run.feed.epoch(1)))
    return run.step(session, xb, yb, run.lr(0))


def test_init_continues_at_the_same_loss_from_a_run_and_from_its_export(tmp_path) -> None:
    a, b, c, e = (str(tmp_path / n) for n in "abce")
    train(TrainConfig(**SMALL, run_dir=a), progress=False)
    tensors, _ = ckpt.load_checkpoint(os.path.join(a, "checkpoint.safetensors"))
    names = [n for n, _ in get_net("resnet-mini", input=(1, 12, 12)).params()]
    final = [tensors[f"param/{n}"] for n in names]
    want = _loss_on_first_batch(TrainConfig(**SMALL, run_dir=str(tmp_path / "probe")), final)

    # from the run directory, through the command line, stem frozen: the same loss, bit for bit
    assert main(["train", "--config", os.path.join(a, "config.toml"), "--init", a, "--freeze", "0",
                 "--run-dir", b, "--no-progress"]) == EXIT_OK
    assert _first_step_loss(b) == want
    got, _ = ckpt.load_checkpoint(os.path.join(b, "checkpoint.safetensors"))
    for n in ("0.w", "0.gamma", "0.beta"):
        assert np.array_equal(got[f"param/{n}"], tensors[f"param/{n}"])  # frozen: bit-identical
        assert f"state/m/{n}" not in got  # and no optimizer state
    assert not np.array_equal(got["param/5.w"], tensors["param/5.w"])
    # a frozen BN layer's running statistics still follow its batches (train mode), from the init's
    assert not np.array_equal(got["stat/0.mean"], tensors["stat/0.mean"])
    # a frozen run resumes
    assert main(["train", "--config", os.path.join(b, "config.toml"), "--epochs", "2", "--resume",
                 "--no-progress"]) == EXIT_OK
    assert np.array_equal(ckpt.load_checkpoint(os.path.join(b, "checkpoint.safetensors"))[0]["param/0.w"],
                          tensors["param/0.w"])

    # from the export: the same loss
    export_run(a, e, log=lambda s: None)
    train(TrainConfig(**SMALL, run_dir=c, init=e), progress=False)
    assert _first_step_loss(c) == want


def test_a_new_class_count_reinitialises_the_head_and_trains(tmp_path, capsys) -> None:
    a, e, c = (str(tmp_path / n) for n in ("a", "e", "c"))
    train(TrainConfig(**SMALL, run_dir=a), progress=False)
    export_run(a, e, log=lambda s: None)
    # the export as a 12-class net's: its head's tensors 12 wide
    from safetensors.numpy import load_file, save_file

    w = load_file(os.path.join(e, "weights.safetensors"))
    w["param/5.w"] = np.ones((w["param/5.w"].shape[0], 12), np.float32)
    w["param/5.b"] = np.ones((12,), np.float32)
    save_file(w, os.path.join(e, "weights.safetensors"))
    with open(os.path.join(e, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["classes"] = 12
    with open(os.path.join(e, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    capsys.readouterr()
    res = train(TrainConfig(**SMALL, run_dir=c, init=e), progress=False)
    out = capsys.readouterr().out
    assert "12 classes there, 10 here: head ['5.w', '5.b'] re-initialised (the net's own init, seed 0)" in out
    got, _ = ckpt.load_checkpoint(os.path.join(c, "checkpoint.safetensors"))
    fresh = get_net("resnet-mini", input=(1, 12, 12)).init_params(0)
    assert got["param/5.w"].shape == fresh[-2].shape and not np.array_equal(got["param/5.w"], fresh[-2])  # trained
    assert np.isfinite(res["loss"])


def test_an_init_from_an_export_of_another_format_is_refused(tmp_path) -> None:
    """Before: a manifest of another format ("hloforge-export-2", another version's layout) was read for its classes
    and net as if this version's, its format unread."""
    a, e, c = (str(tmp_path / n) for n in ("a", "e", "c"))
    train(TrainConfig(**SMALL, run_dir=a), progress=False)
    export_run(a, e, log=lambda s: None)
    with open(os.path.join(e, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["format"] = "hloforge-export-2"
    with open(os.path.join(e, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    with pytest.raises(DataError, match=r"manifest.json is of format 'hloforge-export-2'; expected "
                                        r"'hloforge-export-1', what this hloforge exports"):
        train(TrainConfig(**SMALL, run_dir=c, init=e), progress=False)
    assert not os.path.exists(c)


def test_an_init_that_does_not_fit_is_one_line_and_writes_nothing(tmp_path) -> None:
    src = tmp_path / "e"
    src.mkdir()
    spec = get_net("resnet-mini", input=(1, 12, 12))
    w = {f"param/{n}": p for (n, _), p in zip(spec.params(), spec.init_params(0), strict=True)}
    w.update({f"stat/{n}": s.initial() for n, s in spec.stats()})
    w["param/0.w"] = np.zeros((3, 3), np.float32)
    del w["stat/0.mean"]
    w["param/9.w"] = np.zeros((2,), np.float32)
    from safetensors.numpy import save_file

    save_file(w, str(src / "weights.safetensors"))
    out = tmp_path / "run"
    with pytest.raises(DataError) as e:
        train(TrainConfig(**SMALL, run_dir=str(out), init=str(src)), progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "does not fit net 'resnet-mini'" in msg
    assert "lacks stat/0.mean [16]" in msg and "holds param/9.w [2] that the net does not have" in msg
    assert "param/0.w is float32 [3, 3], expected float32 [16, 1, 3, 3]" in msg
    assert not out.exists()


def test_an_init_of_another_nets_weights_names_that_net(tmp_path) -> None:
    """Another net's run, export or bare weights file passed to --init: the refusal names the net whose weights it
    holds (as --resume and eval do), not only the tensors the run's net lacks."""
    from safetensors.numpy import save_file

    other = str(tmp_path / "linear")
    train(TrainConfig(net="mnist-linear", epochs=1, run_dir=other), progress=False)
    export_run(other, str(tmp_path / "export"), log=lambda s: None)
    spec = get_net("mnist-linear")
    bare = str(tmp_path / "w.safetensors")
    save_file({f"param/{n}": p for (n, _), p in zip(spec.params(), spec.init_params(0), strict=True)}, bare,
              metadata={"classes": "10", "spec": json.dumps(spec.to_dict())})
    for init in (other, str(tmp_path / "export"), bare):
        with pytest.raises(DataError, match=r"does not fit net 'resnet-mini' \(it holds the weights of net "
                           r"'mnist-linear'\): lacks "):
            train(TrainConfig(**SMALL, run_dir=str(tmp_path / "run"), init=init), progress=False)
    assert not (tmp_path / "run").exists()


def test_an_init_tensor_no_float32_weight_can_be_is_named_for_what_it_is(tmp_path) -> None:
    """A double beyond float32's range is said as that (not 'a NaN or an infinity' after numpy's overflow warning),
    an integer one by its dtype: the words every reader of weights uses (checkpoint.as_float32_weight)."""
    import warnings

    from safetensors.numpy import save_file

    spec = get_net("resnet-mini", input=(1, 12, 12))
    w = {f"param/{n}": p for (n, _), p in zip(spec.params(), spec.init_params(0), strict=True)}
    w.update({f"stat/{n}": s.initial() for n, s in spec.stats()})
    w["param/0.w"] = np.full(w["param/0.w"].shape, 1e300)
    w["param/0.beta"] = np.zeros(w["param/0.beta"].shape, np.int32)
    save_file(w, str(tmp_path / "w.safetensors"))
    out = tmp_path / "run"
    with warnings.catch_warnings(), pytest.raises(DataError) as e:
        warnings.simplefilter("error")  # numpy's overflow warning is no line of ours
        train(TrainConfig(**SMALL, run_dir=str(out), init=str(tmp_path / "w.safetensors")), progress=False)
    msg = str(e.value)
    assert "param/0.w holds values beyond float32's range (±3.4e38)" in msg
    assert "param/0.beta has dtype int32, expected a float one" in msg
    assert not out.exists()


def test_an_empty_init_file_is_said_as_empty(tmp_path) -> None:
    """Not 'truncated or not a safetensors file (header too small)', of a file of no bytes (eval and --resume
    say a checkpoint so too: checkpoint.foreign_format)."""
    (tmp_path / "w.safetensors").write_bytes(b"")
    with pytest.raises(DataError, match=r"^--init \S+w\.safetensors is an empty file; --init reads safetensors "):
        train(TrainConfig(**SMALL, run_dir=str(tmp_path / "run"), init=str(tmp_path / "w.safetensors")),
              progress=False)
    assert not (tmp_path / "run").exists()


def test_init_from_an_ema_run_takes_the_weights_eval_scores_unless_told_otherwise(tmp_path, capsys) -> None:
    from hloforge.train import finetune

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train(TrainConfig(**SMALL, ema=0.9, frozen=("0",), run_dir=a), progress=False)
    tensors, _ = ckpt.load_checkpoint(os.path.join(a, "checkpoint.safetensors"))
    spec = get_net("resnet-mini", input=(1, 12, 12))
    names, stat_names = [n for n, _ in spec.params()], [n for n, _ in spec.stats()]
    live = [tensors[f"param/{n}"] for n in names]
    # the frozen stem has no shadow: its θ is its own
    shadow = [tensors.get(f"state/E/{n}", tensors[f"param/{n}"]) for n in names]
    assert any(not np.array_equal(p, e) for p, e in zip(live, shadow, strict=True))

    def taken(region: str) -> finetune.Init:
        return finetune.read_init(Run(TrainConfig(**SMALL, run_dir=b, init=a, init_region=region), progress=False),
                                  log=lambda line: None)

    for region, params, stats in (("auto", shadow, "stat/E"), ("ema", shadow, "stat/E"), ("live", live, "stat")):
        init = taken(region)
        assert all(np.array_equal(p, q) for p, q in zip(init.params, params, strict=True)), region
        assert all(np.array_equal(s, tensors[f"{stats}/{n}"]) for s, n in zip(init.stats, stat_names, strict=True))

    # through the command line: the log says which, and the first step is the shadow's loss
    assert main(["train", "--config", os.path.join(a, "config.toml"), "--init", a, "--run-dir", b,
                 "--no-progress"]) == EXIT_OK
    assert "its EMA shadow's weights" in capsys.readouterr().out
    assert _first_step_loss(b) == _loss_on_first_batch(TrainConfig(**SMALL, ema=0.9, frozen=("0",),
                                                                   run_dir=str(tmp_path / "probe")), shadow)

    # a run without a shadow has no ema to take; a region without --init picks nothing
    plain = str(tmp_path / "plain")
    train(TrainConfig(net="mnist-mlp", epochs=1, run_dir=plain), progress=False)
    with pytest.raises(DataError, match=r"^--init .* has no EMA shadow .*; use --init-region live$"):
        finetune.read_init(Run(TrainConfig(net="mnist-mlp", run_dir=str(tmp_path / "c"), init=plain,
                                           init_region="ema"), progress=False))
    assert main(["train", "mnist-mlp", "--init-region", "live", "--run-dir", str(tmp_path / "d")]) == EXIT_BAD_INPUT
    assert "give --init too" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_init_and_resume_together_are_refused(tmp_path, capsys) -> None:
    assert main(["train", "mnist-mlp", "--init", str(tmp_path), "--resume", "--run-dir", str(tmp_path / "r")]) \
        == EXIT_BAD_INPUT
    assert "give one of them" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_digits_channels_repeat_the_grey_image() -> None:
    from hloforge.datasets.digits import Digits

    x1, y1 = Digits(size=8).arrays("test")
    x3, y3 = Digits(size=8, channels=3).arrays("test")
    assert x3.shape == (len(y1), 3, 8, 8) and np.array_equal(y1, y3)
    assert all(np.array_equal(x3[:, c], x1[:, 0]) for c in range(3))


def _doc_blocks() -> tuple[str, str]:
    """The worked example's shell block and its PyTorch round trip, as docs/interop.md has them."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "interop.md"), encoding="utf-8").read()
    example = text.split("### A worked example", 1)[1]
    shell = example.split("```bash\n", 1)[1].split("\n```", 1)[0]
    check = example.split("```python\n", 1)[1].split("\n```", 1)[0]
    return shell, check


@pytest.mark.slow
def test_the_worked_example_runs_as_documented(tmp_path) -> None:
    """The doc's commands as written (one epoch instead of two), then its PyTorch round trip (~3 min)."""
    import importlib.util
    import subprocess
    import sys

    if not (importlib.util.find_spec("torch") and importlib.util.find_spec("torchvision")):  # (not imported here)
        pytest.skip("the worked example builds the torchvision model: needs torch and torchvision")
    shell, check = _doc_blocks()
    assert "--epochs 2" in shell
    py = f'"{sys.executable}"'
    cli = f'hloforge() {{ {py} -c "import sys; from hloforge.cli import main; sys.exit(main(sys.argv[1:]))" "$@"; }}'
    script = "set -e\n" + cli + "\n" + shell.replace("--epochs 2", "--epochs 1").replace("python -", f"{py} -")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "head ['7.w', '7.b'] re-initialised" in r.stdout and "frozen ['0'] (3 tensors)" in r.stdout
    r = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.startswith("top-1 "), r.stdout + r.stderr[-2000:]


def test_the_round_trips_imports_run_as_written() -> None:
    """Before: the PyTorch side of the worked example, as written, died importing torchvision here (operator
    torchvision::nms does not exist); only the shell block carried this environment's workaround."""
    import importlib.util
    import subprocess
    import sys

    if not (importlib.util.find_spec("torch") and importlib.util.find_spec("torchvision")):  # (not imported here)
        pytest.skip("the round trip builds the torchvision model: needs torch and torchvision")
    imports = _doc_blocks()[1].split("\nmodel = ", 1)[0]  # everything before the model is built
    r = subprocess.run([sys.executable, "-c", imports], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_imported_bare_weights_start_a_run_with_a_new_head(tmp_path, capsys) -> None:
    """`import-weights --out FILE.safetensors` (a 1000-class head no dataset here has) read by --init: every
    tensor taken as imported but the head's, re-initialised at the run's seed."""
    from safetensors.numpy import save_file

    from hloforge.interop import torch_state_dict
    from hloforge.train import finetune

    src = get_net("resnet18", classes=1000, input=(3, 32, 32))
    params = [p + 0.5 for p in src.init_params(7)]
    stats = [s.initial() + 0.25 for _, s in src.stats()]
    save_file(torch_state_dict("torchvision:resnet18", src, params, stats), str(tmp_path / "sd.safetensors"))
    out = str(tmp_path / "r18.safetensors")
    assert main(["import-weights", "torchvision:resnet18", str(tmp_path / "sd.safetensors"), "--input", "3,32,32",
                 "--out", out]) == EXIT_OK
    cfg = TrainConfig(net="resnet18", classes=10, input=(3, 32, 32), data_options=("size=32", "channels=3"), init=out,
                      seed=3, run_dir=str(tmp_path / "run"))
    capsys.readouterr()
    init = finetune.read_init(Run(cfg, progress=False))
    assert "1000 classes there, 10 here: head ['7.w', '7.b'] re-initialised" in capsys.readouterr().out
    fresh = get_net("resnet18", classes=10, input=(3, 32, 32)).init_params(3)
    assert all(np.array_equal(a, b) for a, b in zip(init.params[:-2], params[:-2], strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(init.params[-2:], fresh[-2:], strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(init.stats, stats, strict=True))
    assert not (tmp_path / "run").exists()


def test_an_init_from_a_run_without_dropout_starts_a_run_with_it_and_back(tmp_path, capsys) -> None:
    """Classifier dropout is a layer without tensors before the head: it renumbers the head (`2.w` → `3.w`).
    An init whose layers with tensors are the net's, numbered otherwise, is taken as the net's, and said so;
    one that differs in anything else is still refused."""
    from hloforge.train import finetune

    plain, dropped = str(tmp_path / "plain"), str(tmp_path / "dropped")
    train(TrainConfig(net="mnist-mlp", epochs=1, run_dir=plain), progress=False)
    train(TrainConfig(net="mnist-mlp", epochs=1, run_dir=dropped, dropout=0.2), progress=False)
    for src, dropout, moved in ((plain, 0.2, "2 → 3"), (dropped, 0.0, "3 → 2")):
        tensors, _ = ckpt.load_checkpoint(os.path.join(src, "checkpoint.safetensors"))
        capsys.readouterr()
        run = Run(TrainConfig(net="mnist-mlp", init=src, dropout=dropout, run_dir=str(tmp_path / "r")), progress=False)
        init = finetune.read_init(run)
        assert f"numbered otherwise (layers without tensors, e.g. dropout, differ): {moved}" in capsys.readouterr().out
        old, new = moved.split(" → ")
        back = {new: old}
        names = [n for n, _ in run.spec.params()]
        theirs = [f"param/{back.get(n.split('.')[0], n.split('.')[0])}.{n.split('.', 1)[1]}" for n in names]
        assert len(init.params) == len(theirs) == len([n for n in tensors if n.startswith("param/")])
        assert all(np.array_equal(a, tensors[n]) for a, n in zip(init.params, theirs, strict=True))
    assert ckpt.renumbered(["param/0.w", "param/2.w"], ["param/0.w", "param/3.b"]) == {}  # another tensor
    assert ckpt.renumbered(["param/0.w", "param/2.w"], ["param/0.w", "param/1.w", "param/3.w"]) == {}


def test_the_readmes_fine_tune_line_is_the_worked_examples_command() -> None:
    """Before: the README's line was `hloforge train resnet18 --init r18.safetensors --classes 10 --freeze 0 ...`:
    run as written it was refused (the digits' [1, 28, 28] for the net's [3, 224, 224]), and the refusal's
    `--input 1,28,28` then did not fit the weights' 3-channel stem. Its flags are now the worked example's, which
    the slow test runs, but for the weights file and the example's own epochs, batch and run directory."""
    import shlex

    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    start = readme.index("hloforge train resnet18 --init")
    line = readme[start:].replace("\\\n", " ").split("\n", 1)[0].split("#", 1)[0]
    worked = next(s for s in _doc_blocks()[0].replace("\\\n", " ").splitlines() if s.startswith("hloforge train "))

    def flags(command: str) -> dict[str, list[str]]:
        words, out = shlex.split(command)[2:], {}
        for k, v in zip(words[1::2], words[2::2], strict=False):
            out.setdefault(k, []).append(v)
        return {"net": [words[0]], **{k: v for k, v in out.items() if k not in ("--init", "--epochs", "--batch",
                                                                                 "--run-dir")}}

    assert flags(line) == flags(worked)
