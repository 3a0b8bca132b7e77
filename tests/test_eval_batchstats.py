"""Seed 003's EVAL_BATCHSTATS diagnostic: `hloforge eval RUN --batch-stats` scores with each eval
batch's own BatchNorm statistics, and refuses a padded tail (the zero rows would enter them)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_datasets import tiny_mnist  # tests/ is on sys.path (rootdir-relative, no package)

from hloforge.cli import main
from hloforge.commands import opening
from hloforge.commands.opening import evaluate_checkpoint, open_checkpoint
from hloforge.core.spec import Ctx
from hloforge.train.trainer import TrainConfig, train

jax = pytest.importorskip("jax")


def bn_run(tmp_path, n_test: int) -> str:
    net = tmp_path / "bn-net.json"
    net.write_text(json.dumps({"name": "bn-net", "input_shape": [1, 28, 28], "num_classes": 10, "layers": [
        {"kind": "convBn", "out": 4, "stride": 2}, {"kind": "convBn", "out": 8, "stride": 2},
        {"kind": "flatten"}, {"kind": "dense", "units": 10}]}))
    data = tmp_path / "data"
    data.mkdir()
    tiny_mnist(data, n_train=64, n_test=n_test)
    run = tmp_path / "run"
    train(TrainConfig(net=str(net), data="mnist", data_dir=str(data), epochs=1, batch=32, run_dir=str(run)),
          progress=False, log=lambda s: None)
    return str(run)


def test_batch_stats_eval_normalises_with_each_batchs_statistics(tmp_path, monkeypatch) -> None:
    run = bn_run(tmp_path, n_test=64)
    logits: list[np.ndarray] = []
    score = opening.evaluate

    def spy(evaluator, buffers, x, y):
        logits.append(evaluator.logits(x, buffers))
        return score(evaluator, buffers, x, y)

    monkeypatch.setattr(opening, "evaluate", spy)
    lines: list[str] = []
    res = evaluate_checkpoint(run, batch_stats=True, log=lines.append)
    assert res.n == 64 and "batch statistics" in lines[-1]
    evaluate_checkpoint(run, log=lambda s: None)
    batch_logits, running_logits = logits
    # the oracle: the layers' jax references in train mode (batch statistics), one eval batch at a time
    oc = open_checkpoint(run, log=lambda s: None)
    _, params, _ = oc.region_weights("live")
    named = dict(zip([n for n, _ in oc.spec.params()], params, strict=True))
    x_te = oc.run.x_te
    want = []
    for i in range(0, len(x_te), 32):
        h = jax.numpy.asarray(x_te[i:i + 32], np.float32)
        for ls in oc.spec.walk():
            ps = {n.split(".", 1)[1]: v for n, v in named.items() if n.split(".", 1)[0] == str(ls.index)}
            h = ls.layer.reference(ps, h, Ctx(train=True))
        want.append(np.asarray(h))
    np.testing.assert_allclose(batch_logits, np.concatenate(want), rtol=1e-4, atol=1e-4)
    assert not np.allclose(batch_logits, running_logits, rtol=1e-3, atol=1e-3)  # not the running statistics


def test_batch_stats_eval_refuses_a_padded_tail(tmp_path, capsys) -> None:
    run = bn_run(tmp_path, n_test=40)  # 40 = 32 + a tail of 8 padded to 32
    capsys.readouterr()
    assert main(["eval", run, "--batch-stats"]) == 3
    err = capsys.readouterr().err.strip()
    # before: "score a split whose size divides by 32", a split the user cannot choose; now the batches that would do
    assert err == ("hloforge: error: --batch-stats scores in batches of 32, and the test split's 40 rows "
                   "leave a last batch of 8 whose zero padding would shift the real rows' statistics; expected a "
                   "--batch dividing 40 (such as 8, 10, 20, 40)"), err
    assert main(["eval", run]) == 0  # the running-statistics eval pads it, as always
    assert main(["eval", run, "--batch-stats", "--batch", "20"]) == 0  # eval's own --batch, which divides 40


def test_eval_batch_scores_in_batches_of_its_own_with_the_same_scores(tmp_path, capsys) -> None:
    """A run trained at a batch its scoring device cannot hold: eval ran out of memory and advised --batch, which
    eval did not take. `eval --batch N` compiles the forward at N and scores every row alone (a padded tail's
    zeros never read, BN on its running statistics): the same top-1 and loss as at the run's 32."""
    run = bn_run(tmp_path, n_test=40)
    sizes = []
    made = opening.make_forward_session

    def spy(net, batch, *args, **kw):
        sizes.append(batch)
        return made(net, batch, *args, **kw)

    scores = []
    for batch in (None, 7, 40, 1000):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(opening, "make_forward_session", spy)
            res = evaluate_checkpoint(run, log=lambda s: None, batch=batch)
        scores.append((res.correct.tolist(), round(res.nll, 5)))
    assert sizes == [32, 7, 40, 1000] and scores[1:] == scores[:1] * 3
    capsys.readouterr()
    assert main(["eval", run, "--batch", "0"]) == 2 and "--batch" in capsys.readouterr().err


def test_batch_stats_on_a_net_without_batchnorm_is_refused_as_plain_eval(tmp_path, capsys) -> None:
    """Before: on mnist-mlp it was refused for a padded tail, as if it could otherwise differ from plain eval."""
    run = str(tmp_path / "mlp")
    train(TrainConfig(net="mnist-linear", epochs=1, run_dir=run), progress=False, log=lambda s: None)
    capsys.readouterr()
    assert main(["eval", run, "--batch-stats"]) == 3
    assert capsys.readouterr().err.strip() == ("hloforge: error: --batch-stats: net 'mnist-linear' keeps no BatchNorm "
                                               "statistics, so it would score as plain eval does; expected a net with "
                                               "BatchNorm")
