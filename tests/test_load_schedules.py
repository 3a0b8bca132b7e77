"""hf.load keeps the run's options: exp decay's period, a DDPM's β schedule and --no-augment, not Model's
defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_datasets_formats import write_cifar  # tests/ is on sys.path (rootdir-relative, no package)
from test_diffusion import tiny_ddpm

import hloforge as hf
from hloforge.cli import main
from hloforge.train.schedule import lr_at


def test_a_loaded_runs_fit_decays_the_lr_over_its_decay_epochs(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "mnist-linear", "--epochs", "1", "--batch", "64", "--schedule", "exp", "--decay-rate", "0.5",
                 "--decay-epochs", "4", "--run-dir", str(run), "--no-progress"]) == 0
    model = hf.load(str(run))
    model.fit("digits", epochs=1, batch_size=64, verbose=False)
    # 22 steps an epoch: the lr of the fit's last step is 0.5^(21 / (22·4)), not 0.5^(21/22)
    want = lr_at(21, base=1e-3, total_steps=22, schedule="exp", decay_rate=0.5, steps_per_epoch=22, decay_epochs=4)
    assert model.history["lr"][-1] == pytest.approx(want, rel=1e-12)
    model.save(str(tmp_path / "saved"))  # and kept in what it saves
    assert "decay_epochs = 4.0" in (tmp_path / "saved" / "config.toml").read_text()


def test_a_loaded_ddpm_scores_the_noise_mse_its_run_logged(tmp_path):
    path = tmp_path / "ddpm.toml"
    path.write_text(tiny_ddpm().to_toml())
    run = tmp_path / "run"
    opts = {"size": 16, "noise": 0, "n_train": 64, "n_test": 16}
    assert main(["train", str(path), "--data", "shapes", *(f"--data-opt={k}={v}" for k, v in opts.items()),
                 "--epochs", "1", "--batch", "32", "--diffusion-steps", "40", "--beta-start", "1e-3",
                 "--beta-end", "0.4", "--run-dir", str(run), "--no-progress"]) == 0
    logged = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["noise_mse"]
    # scored with T 40 and β 1e-3 … 0.4, the run's, not the default 1000 steps of 1e-4 … 0.02
    assert hf.load(str(run)).evaluate("shapes", data_options=opts)["noise_mse"] == pytest.approx(logged, rel=1e-6)


def test_a_loaded_run_trained_without_augmentation_goes_on_without_it(tmp_path):
    """Before: hf.load dropped --no-augment, and the loaded model's fit on the dataset augmented."""
    from hloforge.train import checkpoint as ckpt

    data = tmp_path / "cifar"
    data.mkdir()
    write_cifar(data, n_per_file=32)
    net = tmp_path / "net.toml"
    net.write_text(hf.NetSpec("tiny", (3, 32, 32), [hf.layers.Flatten(), hf.layers.Dense(10)], 10).to_toml())
    run, straight = tmp_path / "run", tmp_path / "straight"
    argv = ["train", str(net), "--data", "cifar10", "--data-dir", str(data), "--batch", "32", "--schedule",
            "constant", "--no-augment", "--no-progress"]
    assert main([*argv, "--epochs", "1", "--run-dir", str(run)]) == 0
    model = hf.load(str(run))
    assert main([*argv, "--epochs", "2", "--run-dir", str(straight)]) == 0
    model.fit("cifar10", data_options={"data_dir": str(data)}, epochs=1, batch_size=32, verbose=False)
    # epoch 2 of the loaded model is epoch 2 of the same run trained straight through
    want, _ = ckpt.load_checkpoint(str(straight / "checkpoint.safetensors"))
    for name, got in model.params.items():
        np.testing.assert_array_equal(got, want[f"param/{name}"], err_msg=name)


def test_a_loaded_run_saved_again_is_scored_on_its_own_corpus(tmp_path, capsys):
    """Before: hf.load dropped the run's --data-file, so its save named the default corpus and `hloforge eval`
    scored that (a plausible bits/char, of another text)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(("alpha", "beta", "gamma", "delta")[i * 7 % 4] for i in range(3000)))
    net = tmp_path / "lm.toml"
    net.write_text(hf.NetSpec("lm", (16,), [hf.layers["tokenPositionEmbed"](65, 8), hf.layers.Dense(65)], 65).to_toml())
    run, saved = tmp_path / "run", tmp_path / "saved"
    assert main(["train", str(net), "--data", "text", "--data-file", str(corpus), "--epochs", "1", "--batch", "16",
                 "--run-dir", str(run), "--no-progress"]) == 0
    hf.load(str(run)).save(str(saved))
    capsys.readouterr()
    scores = []
    for d in (run, saved):
        assert main(["eval", str(d)]) == 0
        scores.append(capsys.readouterr().out.split(": val ")[1])
    assert scores[1] == scores[0]
