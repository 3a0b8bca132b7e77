"""`evaluate(NAME)` on the dataset a model trained on scores the test split `hloforge eval` scores: with the
options and data file it trained with, and only while that split is the one the run was scored on."""

from __future__ import annotations

import os

import pytest

import hloforge as hf
from hloforge.commands.opening import evaluate_checkpoint
from hloforge.core.errors import DataError
from hloforge.train.trainer import TrainConfig, train


def digits_at_8() -> hf.Model:
    net = hf.NetSpec("digits-8", (1, 8, 8), [hf.layers["flatten"](), hf.layers.Dense(10)], 10)
    return hf.Model(net, lr=1e-2, seed=0)


def test_evaluate_its_own_dataset_reads_it_with_the_options_it_trained_on(tmp_path: str) -> None:
    """Before, evaluate("digits") read the dataset at its defaults (28×28), so a model fit at size 8 was refused
    with 'pass --input 1,28,28', advice that builds another net; in process and after save / hf.load alike."""
    m = digits_at_8()
    history = m.fit("digits", data_options={"size": 8}, epochs=1, batch_size=64, verbose=False)
    assert m.evaluate("digits")["top1"] == history[-1]["val_top1"]
    path = m.save(os.path.join(tmp_path, "run"))
    printed = evaluate_checkpoint(path, log=lambda s: None)
    got = hf.load(path).evaluate("digits")
    assert got["top1"] == history[-1]["val_top1"] and got["correct"] == printed.top1
    # the options given are the ones read: the defaults' 28×28 images are not this net's
    with pytest.raises(DataError, match=r"gives inputs of shape \[1, 28, 28\], but net 'digits-8' expects"):
        m.evaluate("digits", data_options={})


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict]:
    from hloforge.datasets.text import default_corpus

    where = tmp_path_factory.mktemp("text")
    corpus = os.path.join(where, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(default_corpus()[-6000:])
    run = os.path.join(where, "run")
    logged = train(TrainConfig(net="tinygpt-nano", data="text", data_file=corpus, epochs=1, batch=16, run_dir=run),
                   log=lambda s: None, progress=False)
    return run, corpus, logged


def test_a_loaded_language_model_scores_the_corpus_it_trained_on(text_run: tuple[str, str, dict]) -> None:
    """Before, hf.load(run).evaluate("text") scored the embedded default corpus, not the run's --data-file: a
    plausible bits_per_char over other text (4.78 where `hloforge eval` printed 4.53)."""
    run, corpus, logged = text_run
    got = hf.load(run).evaluate("text")
    assert got == {"bits_per_char": logged["val_bits_per_char"], "n": logged["n"]}


def test_evaluate_refuses_its_own_dataset_changed_since_as_eval_does(text_run: tuple[str, str, dict],
                                                                     tmp_path: str) -> None:
    """Before, the run's corpus edited after training (a cut paragraph) was scored by hf.load(run).evaluate("text")
    as a plausible bits_per_char, where `hloforge eval` refused it: its test split is not the one scored then."""
    run, corpus, logged = text_run
    with open(corpus, encoding="utf-8") as f:
        kept = f.read()
    try:
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(kept[:3000] + kept[3400:])
        m = hf.load(run)
        said = (r"^evaluate: the test split of dataset 'text' is not the one the run was scored on \(\d+ examples, "
                r".* then\); its data changed since$")
        with pytest.raises(DataError, match=said):
            m.evaluate("text")
        with pytest.raises(DataError, match=r"the test split of dataset 'text' is not the one the run was scored"):
            evaluate_checkpoint(run, log=lambda s: None)  # the same refusal, in eval's words
        # the text given is scored where its characters are the run's; this edit lost every '6': each id after it
        # would be read as another character, refused (before: scored with the ids shifted)
        with pytest.raises(DataError, match=r"^evaluate: corpus .* numbers its characters otherwise than the one"):
            m.evaluate("text", data_options={"data_file": corpus})
        moved = os.path.join(tmp_path, "moved.txt")  # the text given is scored: here the run's own, moved
        with open(moved, "w", encoding="utf-8") as f:
            f.write(kept)
        assert m.evaluate("text", data_options={"data_file": moved})["bits_per_char"] == logged["val_bits_per_char"]
    finally:
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(kept)
    assert hf.load(run).evaluate("text")["bits_per_char"] == logged["val_bits_per_char"]
    # a model refit on another corpus (of the same vocabulary: another is refused) scores that one, not the run's
    other = os.path.join(tmp_path, "other.txt")
    with open(other, "w", encoding="utf-8") as f:
        f.write(kept[:5400] + kept[:600])  # the run's first 90% (its vocabulary's), another validation tenth
    m = hf.load(run)
    h = m.fit("text", data_options={"data_file": other}, epochs=1, batch_size=16, verbose=False)
    assert m.evaluate("text")["bits_per_char"] == h[-1]["val_bits_per_char"]


def test_its_own_data_file_moved_says_the_data_options_that_find_it(text_run: tuple[str, str, dict],
                                                                    tmp_path: str) -> None:
    """The run's corpus moved: evaluate("text") named only the CLI's --data-file; it now says the data_options
    that give the new place (the model's own options, the moved path as PATH), which then score the run's split."""
    run, corpus, logged = text_run
    moved = os.path.join(tmp_path, "moved.txt")
    os.rename(corpus, moved)
    try:
        m = hf.load(run)
        with pytest.raises(DataError) as e:
            m.evaluate("text")
        assert str(e.value).endswith("; if the model's data moved, pass where it is now: data_options={'data_file': "
                                     "PATH}") and "\n" not in str(e.value)
        assert m.evaluate("text", data_options={"data_file": moved})["bits_per_char"] == logged["val_bits_per_char"]
    finally:
        os.rename(moved, corpus)
