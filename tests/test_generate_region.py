"""`hloforge generate` on a language model that kept an EMA shadow samples from the weights `hloforge eval` scores
(the shadow by default; `--region live` the live θ), as predict and export do."""

from __future__ import annotations

import os

import numpy as np

import hloforge as hf
from hloforge.cli import main
from hloforge.commands.generate import generate
from hloforge.datasets.text import Text, default_corpus
from hloforge.train.trainer import TrainConfig, train


def sampled(model: hf.Model, text: Text, prompt: str, tokens: int, region: str, seed: int = 0,
            temperature: float = 0.8) -> str:
    """generate's sampling, by predict alone: its window (the last T ids, zeros after them), its softmax at
    `temperature` and its draws from default_rng(seed)."""
    t, rng = model.spec.input_shape[0], np.random.default_rng(seed)
    ids = list(text.encode(prompt))
    for _ in range(tokens):
        ctx = ids[-t:]
        x = np.zeros((1, t), np.float32)
        x[0, :len(ctx)] = ctx
        z = model.predict(x, region=region)[0, len(ctx) - 1].astype(np.float64)
        p = np.exp((z - z.max()) / temperature)
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return prompt + text.decode(ids[len(text.encode(prompt)):])


def test_generate_samples_from_the_weights_eval_scores(tmp_path, capsys) -> None:
    """Before, generate read the live θ whatever the run kept: an --ema run's text came from other weights than
    the ones whose bits/char `hloforge eval` printed."""
    corpus = os.path.join(tmp_path, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(default_corpus()[:6000])
    run = os.path.join(tmp_path, "run")
    train(TrainConfig(net="tinygpt-nano", data="text", data_file=corpus, ema=0.5, epochs=1, batch=16, run_dir=run),
          log=lambda s: None, progress=False)
    m, text = hf.load(run), Text(data_file=corpus, seq_len=64)
    want = {r: sampled(m, text, "The ", 40, r) for r in ("ema", "live")}
    assert want["ema"] != want["live"]
    assert generate(run, "The ", 40) == want["ema"]
    assert generate(run, "The ", 40, region="live") == want["live"]
    capsys.readouterr()
    assert main(["generate", run, "--prompt", "The ", "--tokens", "40", "--region",
                 "live"]) == 0
    assert capsys.readouterr().out == want["live"] + "\n"
