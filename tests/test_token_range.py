"""Token ids outside a language model's vocabulary (or not whole) are refused in one line, in a train
batch, an eval and hf.Model's fit and predict: the embedding clamps them, so id 1000 scored as the last
id, 3.7 as 3 and -1 as 0, a plausible wrong answer with no word."""

from __future__ import annotations

import numpy as np
import pytest

import hloforge as hf
from hloforge.core.errors import DataError
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.plugins.layers.dense import Dense
from hloforge.plugins.layers.tokens import TokenPositionEmbed
from hloforge.train.inputs import finite_inputs, net_inputs, token_vocab
from hloforge.train.session import ForwardSession, TrainSession, make_backend
from hloforge.zoo import get_net

VOCAB, T = 5, 4
EXPECTED = rf"expected integer ids 0..{VOCAB - 1} \(the net's vocabulary of {VOCAB}\)"


def toy() -> NetSpec:
    """The smallest net that takes token ids: an embedding and a per-token head."""
    return NetSpec("toylm", (T,), [TokenPositionEmbed(VOCAB, 3), Dense(VOCAB)], VOCAB)


def test_the_vocabulary_is_the_first_layers_and_only_a_token_net_has_one():
    assert token_vocab(get_net("tinygpt-nano")) == 65 and token_vocab(toy()) == VOCAB
    assert token_vocab(get_net("mnist-mlp")) is None
    pixels = np.full((1, 784), 1000.0)  # not ids: any finite number goes
    assert (net_inputs(pixels, get_net("mnist-mlp"), 1, "fit") == 1000).all()


@pytest.mark.parametrize("ids,kind,named", [
    ([0, 1, 5, 2], "out-of-range", "5"),
    ([0, -1, 2, 3], "out-of-range", "-1"),
    ([0, 1000, 2, 3], "out-of-range", "1000"),
    ([0, 3.7, 2, 3], "non-integer", "3.7"),
    ([0, 1, 2, 3.0000001], "non-integer", "3.0000001"),  # whole once cast to float32: checked as given
    ([-1, 3.5, 2, 9], "out-of-range and non-integer", "-1, 3.5, 9"),
])
def test_ids_outside_the_vocabulary_or_not_whole_are_named(ids, kind, named):
    with pytest.raises(DataError, match=rf"^fit x holds {kind} token ids \({named}\); {EXPECTED}$"):
        net_inputs(np.array([ids]), toy(), 1, "fit")


def test_whole_ids_in_range_pass_as_float32_in_any_dtype():
    for x in (np.array([[0, 1, 2, 4]]), np.array([[0, 1, 2, 4]], np.uint8), np.array([[0.0, -0.0, 2.0, 4.0]])):
        got = net_inputs(x, toy(), 1, "fit")
        assert got.dtype == np.float32 and (got == np.abs(x)).all()
    assert finite_inputs(np.array([[9.0]]), (1, 1), "fit").tolist() == [[9.0]]  # no vocab given: not ids


def test_a_forward_session_refuses_ids_it_would_clamp():
    spec, be = toy(), make_backend("xla")
    fwd, params = ForwardSession(spec, 2, be), spec.init_params(0)
    ok = fwd.logits(np.array([[0, 1, 2, 4]], np.float32), params)
    assert ok.shape == (1, T, VOCAB) and np.isfinite(ok).all()
    for bad, shown in (([[0, 1, 2, 1000]], "1000"), ([[0, 1, 2, 3.7]], "3.7"), ([[-1, 1, 2, 4]], "-1")):
        with pytest.raises(DataError, match=rf"^eval x holds .* token ids \({shown}\); {EXPECTED}$"):
            fwd.logits(np.array(bad), params)


def test_a_train_step_refuses_them_before_the_step_counts():
    spec = toy()
    s = TrainSession(spec, Variant("adam", loss="tokenCrossEntropy"), 2, make_backend("xla"), seed=0)
    y = np.zeros((2, T), np.int32)
    before = s.read_params()
    with pytest.raises(DataError, match=rf"^train batch x holds out-of-range token ids \({VOCAB}\); {EXPECTED}$"):
        s.train_step(np.array([[0, 1, 2, 3], [1, 2, 3, VOCAB]], np.float32), y, 1e-3)
    assert s.step == 0 and all((a == b).all() for a, b in zip(before, s.read_params(), strict=True))
    s.train_step(np.array([[0, 1, 2, 3], [1, 2, 3, 4]], np.float32), y, 1e-3)  # in range: it trains
    assert s.step == 1


def test_a_models_predict_and_fit_refuse_them():
    m = hf.Model(toy())
    x = np.array([[0, 1, 2, 3], [1, 2, 3, 4]], np.float64)
    assert m.predict(x).shape == (2, T, VOCAB)
    for bad in (1000, -1, 3.7):
        xb = x.copy()
        xb[1, 2] = bad
        with pytest.raises(DataError, match=rf"x holds .* token ids \({bad}\); {EXPECTED}$"):
            m.predict(xb)
    xb = x.copy()
    xb[0, 0] = VOCAB
    with pytest.raises(DataError, match=rf"x holds out-of-range token ids \({VOCAB}\); {EXPECTED}$"):
        m.fit(xb, np.zeros((2, T), np.int64), batch_size=2, epochs=1)


def test_labels_that_are_x_itself_or_the_previous_tokens_are_refused_before_the_compile(monkeypatch):
    """Hugging Face's labels=input_ids (the model shifts them there): here the net shifts nothing, so y == x
    trained a copy of the input, its bits_per_char a plausible low number; x and y swapped did alike."""
    import hloforge.api as api

    monkeypatch.setattr(api, "TrainSession", None)  # compiling would call it: refused before
    w = np.random.default_rng(0).integers(0, VOCAB, (8, T + 1))
    m = hf.Model(toy())
    said = r"labels equal x token for token; expected each position's next token .* x = w\[:, :-1\] and y = w\[:, 1:\]$"
    with pytest.raises(DataError, match="^fit " + said):
        m.fit(w[:, :-1], w[:, :-1], batch_size=4, epochs=1, verbose=False)
    with pytest.raises(DataError, match="^evaluate " + said):
        m.evaluate(w[:, :-1].astype(np.float32), w[:, :-1])
    swapped = r"labels are each position's previous token \(x and y swapped\?\); expected each position's next token"
    with pytest.raises(DataError, match="^fit " + swapped):
        m.fit(w[:, 1:], w[:, :-1], batch_size=4, epochs=1, verbose=False)
    assert m._step == 0
    from hloforge.train.arraydata import check_next_tokens

    check_next_tokens("tokens", w[:, :-1].astype(np.float32), w[:, 1:], "fit")  # the next tokens: taken


def test_a_language_model_of_another_vocabulary_than_its_text_names_the_classes_that_fit(tmp_path, capsys):
    """The language models' check says what to pass, as the classifiers' does (tasks.classes_mismatch)."""
    from hloforge.cli import main

    assert main(["train", "tinygpt-nano", "--classes", "50", "--data", "text", "--epochs", "1",
                 "--run-dir", str(tmp_path / "r"), "--no-progress"]) == 3
    assert capsys.readouterr().err == ("hloforge: error: dataset 'text' has 65 classes, net 'tinygpt-nano' has 50; "
                                       "pass --classes 65 (hf.Model's classes=65) to give the net a head of 65\n")
