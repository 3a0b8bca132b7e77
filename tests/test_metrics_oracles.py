"""Every reported metric against an independent implementation (scikit-learn, scipy, a VOC AP written
from the devkit's definition), with the edge cases: ties in the logits, fewer than 5 classes, a class
never present, accuracy at the bounds, no discordant pairs, NaN/inf outputs (refused, never scored)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, confusion_matrix, jaccard_score, log_loss, top_k_accuracy_score

from hloforge.core.errors import DataError
from hloforge.core.spec import NetSpec
from hloforge.datasets.text import IGNORE, bits_per_char
from hloforge.plugins.layers.fpn import Yolov1Head
from hloforge.plugins.layers.norm import ConvBn
from hloforge.train import segmentation
from hloforge.train.detection import DetectionHead, box_iou, mean_ap
from hloforge.train.evaluation import evaluate, evaluate_lm, nll_sum
from hloforge.train.metrics import label_rank, mcnemar_exact, wilson
from hloforge.train.tasks import DetectionTask, SegmentationTask


class Outputs:
    """A stand-in eval session: row i of x is the index of the output it returns."""

    def __init__(self, out: np.ndarray):
        self.out = out

    def logits(self, x: np.ndarray, buffers: list) -> np.ndarray:
        return self.out[np.asarray(x, int).reshape(len(x), -1)[:, 0]]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------ classification
@pytest.mark.parametrize("classes", [2, 3, 5, 10])
def test_top1_top5_and_loss_match_sklearn(classes: int) -> None:
    rng = np.random.default_rng(classes)
    z = (3 * rng.standard_normal((37, classes))).astype(np.float32)
    y = rng.integers(0, classes, 37).astype(np.int32)
    res = evaluate(Outputs(z), [], np.arange(37)[:, None], y)
    assert res.top1 == round(37 * accuracy_score(y, z.argmax(1)))
    if classes <= 5:  # every label is in the top 5: always 100%, so no top-5 is scored or printed
        assert res.top5 is None and "top-5" not in res.line()
    else:
        assert res.top5 == round(37 * top_k_accuracy_score(y, z, k=5, labels=np.arange(classes)))
        assert res.line().endswith(f"top-5 {100 * res.top5 / 37:.2f}%")
    assert res.nll == pytest.approx(log_loss(y, softmax(z.astype(np.float64)), labels=np.arange(classes)), rel=1e-9)


def test_top1_of_tied_logits_is_the_predicted_class() -> None:
    # argmax predicts class 2 (ties go to the lower index); top-1 must count that prediction right
    z = np.array([[0, 0, 1, 1]], np.float32)
    assert (label_rank(z, np.array([2])) < 1).tolist() == [True]
    assert (label_rank(z, np.array([3])) < 1).tolist() == [False]
    z5 = np.array([[0, 0, 0, 0, 1, 1]], np.float32)  # the top 5: 4, 5, then 0, 1, 2 of the tied zeros
    assert (label_rank(np.repeat(z5, 6, axis=0), np.arange(6)) < 5).tolist() == [True, True, True, False, True, True]


@pytest.mark.parametrize("k", [1, 5])
def test_topk_with_heavy_ties_is_the_stable_ranking(k: int) -> None:
    rng = np.random.default_rng(7)
    z = rng.integers(0, 3, (500, 37)).astype(np.float32)
    y = rng.integers(0, 37, 500)
    oracle = np.any(np.argsort(-z, axis=1, kind="stable")[:, :k] == y[:, None], axis=1)
    np.testing.assert_array_equal(label_rank(z, y) < k, oracle)
    if k == 1:
        np.testing.assert_array_equal(label_rank(z, y) < 1, z.argmax(1) == y)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits_are_refused_not_scored(bad: float) -> None:
    z = np.array([[bad, 0.0, 0.0], [2.0, 0.0, 0.0]], np.float32)
    with pytest.raises(DataError, match="eval logits hold .* expected finite numbers"):
        evaluate(Outputs(z), [], np.arange(2)[:, None], np.array([0, 0]))


@pytest.mark.parametrize("n", [1, 2, 10, 97, 100000])
def test_wilson_matches_scipy_at_and_between_the_bounds(n: int) -> None:
    for k in sorted({0, 1, n // 2, n - 1, n}):
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 1), (5, 5), (0, 10), (3, 7), (1000, 1100), (12345, 12000)])
def test_mcnemar_exact_matches_scipy_binomtest(b: int, c: int) -> None:
    same = 7  # concordant pairs change nothing
    a = np.array([True] * b + [False] * c + [True] * same)
    nb, nc, p = mcnemar_exact(a, np.array([False] * b + [True] * c + [True] * same))
    assert (nb, nc) == (b, c)
    assert p == pytest.approx(1.0 if b + c == 0 else stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


# ------------------------------------------------------------------ segmentation
def test_segmentation_scores_match_sklearn_with_a_class_never_present() -> None:
    rng = np.random.default_rng(3)
    gt, pred = rng.integers(0, 3, (4, 5, 6)), rng.integers(0, 3, (4, 5, 6))  # class 3 of 4: in neither
    confs = segmentation.confusion_matrices(gt, pred, 4)
    np.testing.assert_array_equal(confs.sum(0), confusion_matrix(gt.ravel(), pred.ravel(), labels=range(4)))
    m = segmentation.scores(confs, segmentation.default_regions(4))
    iou = jaccard_score(gt.ravel(), pred.ravel(), labels=range(3), average=None)
    assert [m[f"iou/{c}"] for c in range(3)] == pytest.approx(iou.tolist(), abs=1e-12)
    assert math.isnan(m["iou/3"]) and m["miou"] == pytest.approx(iou.mean(), abs=1e-12)  # left out, not a 0
    assert m["pixel_acc"] == pytest.approx(accuracy_score(gt.ravel(), pred.ravel()), abs=1e-12)
    assert m["dice/class3"] == 1.0  # BraTS: absent from truth and prediction


def _segmentation_task(y: np.ndarray, classes: int) -> SegmentationTask:
    task = object.__new__(SegmentationTask)  # its scoring alone: no net or dataset to check
    task.run = types.SimpleNamespace(x_te=np.arange(len(y))[:, None], y_te=y, cfg=types.SimpleNamespace(batch=2),
                                     feed=types.SimpleNamespace(streams=False),
                                     data=types.SimpleNamespace(num_classes=classes))
    return task


def test_segmentation_refuses_nan_outputs() -> None:
    y = np.zeros((2, 3, 3), np.int32)
    out = np.zeros((2, 2, 3, 3), np.float32)
    out[:, 0] = 1.0
    assert _segmentation_task(y, 2).evaluate(Outputs(out), []).metrics["pixel_acc"] == 1.0
    out[1, 1, 2, 2] = np.nan  # argmax would call this pixel class 1: a plausible miss
    with pytest.raises(DataError, match="eval outputs hold 1 NaN"):
        _segmentation_task(y, 2).evaluate(Outputs(out), [])


# ------------------------------------------------------------------ detection
def voc_ap(dets: list[np.ndarray], gts: list[np.ndarray], c: int) -> float:
    """VOC all-point AP written from the devkit's definition, with hloforge's documented matching: each
    detection, best score first, takes the unmatched truth of its image and class of highest IoU ≥ 0.5."""
    truth = [g[g[:, 0] == c, 1:] for g in gts]
    used = [np.zeros(len(t), bool) for t in truth]
    cand = sorted(((d[1], i, d[2:]) for i, ds in enumerate(dets) for d in ds if d[0] == c), key=lambda r: -r[0])
    tp = []
    for _, i, box in cand:
        ov = np.where(used[i], -1.0, box_iou(box, truth[i])[0]) if len(truth[i]) else np.zeros(0)
        hit = len(ov) > 0 and ov.max() >= 0.5
        if hit:
            used[i][int(ov.argmax())] = True
        tp.append(hit)
    if not cand:
        return 0.0
    hits = np.cumsum(tp)
    rec, prec = hits / sum(len(t) for t in truth), hits / np.arange(1, len(cand) + 1)
    ap, seen = 0.0, 0.0
    for r in np.unique(rec):  # area under the envelope: at each recall level the best precision at or past it
        ap += (r - seen) * prec[rec >= r].max()
        seen = r
    return ap


def test_map_matches_a_devkit_ap() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        gts, dets = [], []
        for _ in range(3):
            xy = rng.uniform(0, 20, (rng.integers(0, 4), 2))
            g = np.c_[rng.integers(0, 3, len(xy)), xy, xy + rng.uniform(3, 10, (len(xy), 2))]
            jit = g[np.repeat(np.arange(len(g)), rng.integers(0, 3, len(g)))]  # misses and duplicates
            d = np.c_[jit[:, :1], rng.random(len(jit)), jit[:, 1:] + rng.normal(0, 1.5, (len(jit), 4))]
            fp = np.c_[rng.integers(0, 3, 2), rng.random(2), np.tile(rng.uniform(0, 20, (2, 2)), 2) + [0, 0, 4, 4]]
            gts.append(g)
            dets.append(np.r_[d, fp])
        res = mean_ap(dets, gts)
        assert set(res.ap) == {int(c) for g in gts for c in g[:, 0]}  # classes with truth alone
        for c, ap in res.ap.items():
            assert ap == pytest.approx(voc_ap(dets, gts, c), abs=1e-12)


def test_map_edge_cases() -> None:
    gt = [np.array([[0, 0, 0, 10, 10]]), np.zeros((0, 5))]
    assert mean_ap([np.zeros((0, 6)), np.zeros((0, 6))], gt).ap == {0: 0.0}  # no predictions
    # a false positive on the image without boxes halves precision; a class without truth is not scored
    res = mean_ap([np.array([[0, .9, 0, 0, 10, 10], [1, .95, 0, 0, 5, 5]]), np.array([[0, .99, 0, 0, 3, 3]])], gt)
    assert res.ap == {0: 0.5}
    dup = mean_ap([np.array([[0, .9, 0, 0, 10, 10], [0, .95, 0, 0, 10, 10]]), np.zeros((0, 6))], gt)
    assert dup.ap == {0: 1.0}  # the duplicate is a false positive after full recall


def test_detection_refuses_nan_outputs() -> None:
    head = DetectionHead.of(NetSpec("det", (3, 32, 32), [ConvBn(4, k=3, stride=4), Yolov1Head(3)], 3))
    truth = [np.array([[0, 2, 3, 12, 14]], np.float32), np.array([[1, 5, 5, 25, 27]], np.float32)]
    out = head.targets(truth)[:, :-1].copy()  # a perfect net's output
    task = object.__new__(DetectionTask)
    task.head, task.truth = head, truth
    task.run = types.SimpleNamespace(x_te=np.arange(2)[:, None], y_te=out, feed=types.SimpleNamespace(streams=False),
                                     cfg=types.SimpleNamespace(batch=2))
    assert task.evaluate(Outputs(out), []).metrics["map50"] == pytest.approx(1.0)
    out[1] = np.nan  # decoded, its boxes would be dropped: a plausible 50% mAP
    with pytest.raises(DataError, match="eval outputs hold .* NaN"):
        task.evaluate(Outputs(out), [])


# ------------------------------------------------------------------ language model
def test_bits_per_char_excludes_padding_and_matches_sklearn() -> None:
    rng = np.random.default_rng(5)
    z = (3 * rng.standard_normal((3, 8, 6))).astype(np.float32)
    y = rng.integers(0, 6, (3, 8))
    y[2, 5:] = IGNORE  # the last window's padding
    keep = y >= 0
    bpc, n = bits_per_char(z, y)
    assert n == int(keep.sum()) == 21
    ref = log_loss(y[keep], softmax(z[keep].astype(np.float64)), labels=np.arange(6)) / math.log(2)
    assert bpc == pytest.approx(ref, rel=1e-9)
    assert nll_sum(z[keep], y[keep]) / 21 / math.log(2) == pytest.approx(ref, rel=1e-9)


def test_lm_eval_refuses_inf_logits() -> None:
    z = np.zeros((1, 4, 3), np.float32)
    z[0, 3, 1] = np.inf
    with pytest.raises(DataError, match="eval logits hold 0 NaN and 1 infinite"):
        evaluate_lm(Outputs(z), [], np.zeros((1, 1)), np.array([[0, 1, 2, IGNORE]]))
