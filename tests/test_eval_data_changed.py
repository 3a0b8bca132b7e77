"""A run's checkpoint is opened (eval, generate, cam, ...) only on the data it was scored on: a corpus
edited after training is refused in one line, not scored (and decoded) plausibly and wrongly."""

from __future__ import annotations

import os

from hloforge.cli import main
from hloforge.datasets.text import default_corpus


def test_eval_and_generate_refuse_a_corpus_changed_since_the_run(tmp_path, capsys):
    corpus, run = os.path.join(tmp_path, "corpus.txt"), os.path.join(tmp_path, "run")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(default_corpus()[:6000])
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-file", corpus, "--epochs", "1", "--batch", "16",
                 "--run-dir", run, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", run]) == 0
    scored = capsys.readouterr().out
    assert "bits/char" in scored
    with open(corpus, "w", encoding="utf-8") as f:  # the same length, other text
        f.write(default_corpus()[6000:12000])
    for command in (["eval", run], ["generate", run, "--tokens", "8"]):
        assert main(command) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is not the one the run was scored on" in err, err
