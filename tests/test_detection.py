"""Detection beyond the gate: the FPN neck probe (seed 001), the whole-detector probe, target
encoding and decoding, per-class NMS and mAP@0.5 on perfect, random and mixed detections.

Every layer and loss here is also gated by tests/test_gate.py (it iterates the registry):
yolov1Head, fpnDetect, diou, yolov1, anchorYolo, fpnYolo.
"""

from __future__ import annotations

import numpy as np
import pytest

from hloforge.core import autodiff
from hloforge.core.errors import DataError, UnsupportedSpec
from hloforge.core.hlo import Builder
from hloforge.core.spec import Ctx, NetSpec, ParamSlot, qualified_params, walk_layers
from hloforge.losses.detection import MultiScaleYoloLoss, Yolov1Loss
from hloforge.plugins.layers.fpn import FpnDetect, Yolov1Head, neck_probe_module, ref_neck
from hloforge.plugins.layers.norm import ConvBn
from hloforge.train.detection import DetectionHead, average_precision, box_iou, mean_ap, nms

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)


def _run(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    from hloforge.backends.xla import default_client

    exe = default_client().compile(text)
    try:
        return [np.asarray(o) for o in exe.run(inputs)]
    finally:
        exe.close()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(b), 1e-30))


# ------------------------------------------------------------------ probes (f64)
def test_fpn_neck_probe_matches_jax_and_finite_differences() -> None:
    batch, oc, taps, g5 = 2, 3, (2, 4, 5), 2
    rng = np.random.default_rng(0)
    grids = (4 * g5, 2 * g5, g5)
    cs = [rng.standard_normal((batch, c, g, g)) for c, g in zip(taps, grids, strict=True)]
    ws = [rng.standard_normal((oc, c)) for c in taps]
    ds = [rng.standard_normal((batch, oc, g, g)) for g in grids]
    got = _run(neck_probe_module(batch, oc, taps, g5), [*cs, *ws, *ds])
    ps, pullback = jax.vjp(ref_neck, *cs, *ws)
    refs = [*ps, *pullback(tuple(ds))]
    assert max(_rel(g, r) for g, r in zip(got, refs, strict=True)) < 1e-12
    # Finite differences of the emitted forward ⟨P, dP⟩ along a random direction, per input.
    fwd = neck_probe_module(batch, oc, taps, g5)
    inputs = [*cs, *ws]
    for i in range(6):
        d = rng.standard_normal(inputs[i].shape)
        vals = []
        for sign in (1.0, -1.0):
            moved = list(inputs)
            moved[i] = inputs[i] + sign * 1e-6 * d
            outs = _run(fwd, [*moved, *ds])[:3]
            vals.append(sum(float(np.sum(o * g)) for o, g in zip(outs, ds, strict=True)))
        fd = (vals[0] - vals[1]) / 2e-6
        an = float(np.sum(got[3 + i] * d))
        assert abs(fd - an) <= 1e-7 * max(abs(an), 1.0), (i, fd, an)


def test_fpn_neck_fault_makes_the_probe_red() -> None:
    batch, oc, taps, g5 = 1, 2, (2, 2, 3), 1
    rng = np.random.default_rng(1)
    grids = (4 * g5, 2 * g5, g5)
    ins = [rng.standard_normal((batch, c, g, g)) for c, g in zip(taps, grids, strict=True)]
    ins += [rng.standard_normal((oc, c)) for c in taps]
    ds = [rng.standard_normal((batch, oc, g, g)) for g in grids]
    with autodiff.inject_fault("custom") as calls:
        text = neck_probe_module(batch, oc, taps, g5)
    assert calls[0] == 1
    got = _run(text, [*ins, *ds])
    _, pullback = jax.vjp(ref_neck, *ins)
    assert max(_rel(g, r) for g, r in zip(got[3:], pullback(tuple(ds)), strict=True)) > 1e-4


ANCHORS = (((0.1, 0.15), (0.2, 0.1)), ((0.3, 0.3), (0.25, 0.4)), ((0.6, 0.5), (0.5, 0.7)))


def test_whole_detector_probe_finite_differences() -> None:
    """Seed 001's detector probe: neck + tower + heads + concat + multi-scale loss (γ = 0), every
    parameter and input gradient of the emitted module against central differences in f64."""
    layer, in_shape, batch = FpnDetect(2, ANCHORS, oc=3, c4=3, c5=3, tower=1), (2, 8, 8), 2
    loss = MultiScaleYoloLoss(gamma=0.0)
    walk = walk_layers([layer], in_shape)
    slots = [s for _, s in qualified_params(walk)]
    out_shape = walk[0].out_shape
    b = Builder("f64", "detector_probe")
    ps = [b.arg(s.shape) for s in slots]
    x = b.arg((batch, *in_shape))
    y = b.arg((batch, *out_shape))
    ctx = Ctx(train=True)
    lv = loss.forward(b, layer.forward(b, x, {s.name: p for s, p in zip(slots, ps, strict=True)}, ctx), y)
    text = b.module([lv, *autodiff.grad(b, [lv], [b.full(1.0)], [*ps, x])])
    rng = np.random.default_rng(2)
    params = [rng.standard_normal(s.shape) * 0.5 for s in slots]
    xs = rng.standard_normal((batch, *in_shape))
    ys = loss.sample_labels(rng, batch, out_shape).astype(np.float64)
    from hloforge.backends.xla import default_client

    exe = default_client().compile(text)
    try:
        got = [np.asarray(o) for o in exe.run([*params, xs, ys])]
        inputs = [*params, xs]
        worst = 0.0
        for i in range(len(inputs)):
            d = rng.standard_normal(inputs[i].shape)
            f = []
            for sign in (1.0, -1.0):
                moved = list(inputs)
                moved[i] = inputs[i] + sign * 1e-6 * d
                f.append(float(np.asarray(exe.run([*moved, ys])[0])))
            fd, an = (f[0] - f[1]) / 2e-6, float(np.sum(got[1 + i] * d))
            # relative, with a floor of 1: the loss is O(100), so f64 differences carry ~1e-8 of noise
            worst = max(worst, abs(fd - an) / max(abs(an), abs(fd), 1.0))
    finally:
        exe.close()
    assert len(slots) == 2 * 9 + 9 + 6 * 1  # two one-block residual stages (9 tensors each), 9 + 6·tower
    assert worst < 1e-6


def test_fpn_param_layout_is_the_seed_order() -> None:
    (ls,) = walk_layers([FpnDetect(3, ANCHORS, oc=4, c4=4, c5=4, tower=2)], (3, 8, 8))
    fpn = [s.name for s in ls.slots if not s.name.startswith(("c4.", "c5."))]
    assert fpn[:3] == ["neck.n3", "neck.n4", "neck.n5"]
    assert fpn[3:7] == ["tower.p3.0.w", "tower.p3.0.b", "tower.p3.1.w", "tower.p3.1.b"]
    assert fpn[-6:] == ["head.h3", "head.h4", "head.h5", "head.b3", "head.b4", "head.b5"]
    assert len(fpn) == 9 + 6 * 2
    assert ls.out_shape == (8 * 8 + 4 * 4 + 2 * 2, 2, 8)  # P3 8×8, P4 4×4, P5 2×2; 2 anchors; 5 + 3


def test_fpn_prior_bias_init_starts_objectness_at_pi() -> None:
    """Seed 001's RetinaNet prior-bias init on the zoo net: every objectness bias starts at
    −log((1 − π)/π), π = 0.01, so with the head weights zeroed each cell's objectness is exactly π."""
    from hloforge.zoo import get_net

    spec = get_net("fpn-mini")
    layer = spec.layers[-1]
    assert isinstance(layer, FpnDetect) and layer.prior == 0.01
    init = dict(zip([n for n, _ in spec.params()], spec.init_params(0), strict=True))
    per = layer.per_anchor
    for lv in "345":
        (bias,) = [v for n, v in init.items() if n.endswith(f".head.b{lv}")]
        rows = bias.reshape(len(layer.anchors[0]), per)
        np.testing.assert_allclose(1.0 / (1.0 + np.exp(-rows[:, 4].astype(np.float64))), 0.01, rtol=1e-6)
        assert not rows[:, :4].any() and not rows[:, 5:].any()  # only the objectness channel moves
    (ls,) = walk_layers([layer], spec.walk()[-1].in_shape)
    params = {s.name: s.initial(np.random.default_rng(i)) for i, s in enumerate(ls.slots)}
    params = {k: np.zeros_like(v) if k.startswith("head.h") else v for k, v in params.items()}
    x = np.random.default_rng(1).normal(size=(2, *ls.in_shape)).astype(np.float32)
    out = np.asarray(layer.reference(params, x, Ctx(train=True)))
    np.testing.assert_allclose(1.0 / (1.0 + np.exp(-out[..., 4])), 0.01, rtol=1e-6)


def test_fpn_prior_zero_is_the_zero_init_net() -> None:
    """π = 0 (the layer's default) keeps the plain zero-init bias slots and the same forward; the
    prior changes only the biases' starting values, never the render."""
    base = FpnDetect(3, ANCHORS, oc=4, c4=4, c5=4, tower=1)
    with_prior = FpnDetect(3, ANCHORS, oc=4, c4=4, c5=4, tower=1, prior=0.01)
    (ls0,) = walk_layers([base], (3, 8, 8))
    (ls1,) = walk_layers([with_prior], (3, 8, 8))
    heads = [s for s in ls0.slots if s.name.startswith("head.b")]
    assert heads and all(type(s) is ParamSlot and s.init == "zeros" for s in heads)
    rng = np.random.default_rng
    for s0, s1 in zip(ls0.slots, ls1.slots, strict=True):
        assert (s0.name, s0.shape, s0.decay) == (s1.name, s1.shape, s1.decay)
        same = np.array_equal(s0.initial(rng(3)), s1.initial(rng(3)))
        assert same != s1.name.startswith("head.b")  # only the head biases differ
    def render(layer: FpnDetect) -> str:
        b = Builder("f32", "fwd")
        ps = {s.name: b.arg(s.shape) for s in ls0.slots}
        x = b.arg((2, 3, 8, 8))
        return b.module([layer.forward(b, x, ps, Ctx(train=True))])
    assert render(base) == render(with_prior)
    with pytest.raises(UnsupportedSpec, match="0 ≤ π < 1"):
        walk_layers([FpnDetect(3, ANCHORS, prior=1.0)], (3, 8, 8))


def test_head_refusals() -> None:
    with pytest.raises(UnsupportedSpec, match="same number"):
        FpnDetect(2, (((0.1, 0.1),), ((0.2, 0.2), (0.3, 0.3)), ((0.5, 0.5),)))
    with pytest.raises(UnsupportedSpec, match="divides by 4"):
        walk_layers([FpnDetect(2, ANCHORS)], (3, 6, 6))
    spec = NetSpec("det", (3, 8, 8), [ConvBn(4), Yolov1Head(3)], 4)
    with pytest.raises(UnsupportedSpec, match="head for 3 classes, but num_classes is 4"):
        spec.walk()
    with pytest.raises(UnsupportedSpec, match="more than 10"):
        Yolov1Loss().check((9, 7, 7))


def test_zoo_detector_grids() -> None:
    from hloforge.zoo import get_net

    full = get_net("yolov1")  # seed 001: ResNet-34 to a 7×7 grid, 2 boxes·5 + 20 classes per cell
    assert full.input_shape == (3, 224, 224) and full.walk()[-1].out_shape == (30, 7, 7)
    mini = get_net("yolov1-mini")  # stride 4 on shapes' 32×32: 8×8 cells of 4 px
    assert mini.walk()[-1].out_shape == (13, 8, 8) and DetectionHead.of(mini).label_shape == (14, 8, 8)
    assert get_net("fpn-mini").walk()[-1].out_shape == (8 * 8 + 4 * 4 + 2 * 2, 1, 8)


# ------------------------------------------------------------------ encoding and decoding
def _perfect_raw(head: DetectionHead, targets: np.ndarray) -> np.ndarray:
    """The raw output a perfect net would give for these targets (inverse of the decoder's maps)."""
    if isinstance(head.layer, Yolov1Head):
        return targets[:, :-1].copy()
    t = targets.astype(np.float64)
    raw = np.full(t.shape, -12.0)
    obj = t[..., 4] > 0.5
    off = np.clip(t[..., 0:2], 1e-6, 1 - 1e-6)
    raw[..., 0:2] = np.log(off / (1 - off))
    raw[..., 2:4] = np.log(np.where(obj[..., None], t[..., 2:4], 1.0))
    raw[..., 4] = np.where(obj, 12.0, -12.0)
    raw[..., 5:] = np.where(t[..., 5:] > 0.5, 12.0, -12.0)
    return raw


GT = [np.array([[0, 2, 3, 12, 14], [2, 20, 18, 30, 31]], np.float32),
      np.array([[1, 5, 5, 25, 27]], np.float32),
      np.zeros((0, 5), np.float32)]


@pytest.mark.parametrize("head_layer", [Yolov1Head(3), FpnDetect(3, ANCHORS)], ids=["yolov1", "fpn"])
def test_targets_round_trip_to_perfect_detections(head_layer) -> None:
    trunk = [ConvBn(4, k=3, stride=4)] if isinstance(head_layer, Yolov1Head) else [ConvBn(4, k=3, stride=2)]
    spec = NetSpec("det", (3, 32, 32), [*trunk, head_layer], 3)
    head = DetectionHead.of(spec)
    targets = head.targets(GT)
    assert targets.shape[1:] == head.label_shape
    dets = head.decode(_perfect_raw(head, targets), score_min=0.5)
    assert [len(d) for d in dets] == [2, 1, 0]
    for d, g in zip(dets, GT, strict=True):
        if len(g):
            order = np.argsort(d[:, 0])
            np.testing.assert_allclose(d[order][:, 2:], g[:, 1:], atol=1e-4)
            np.testing.assert_array_equal(d[order][:, 0], g[:, 0])
    assert mean_ap(dets, GT).map == pytest.approx(1.0)


def test_encoding_refuses_bad_boxes() -> None:
    head = DetectionHead.of(NetSpec("det", (3, 32, 32), [ConvBn(4, k=3, stride=4), Yolov1Head(3)], 3))
    with pytest.raises(DataError, match=r"box class 3 is not one of the detector's 3 classes"):
        head.targets([np.array([[3, 1, 1, 5, 5]])])
    with pytest.raises(DataError, match="x1 > x0"):
        head.targets([np.array([[0, 5, 1, 5, 5]])])


# ------------------------------------------------------------------ NMS and mAP
def test_nms_is_per_class_and_greedy() -> None:
    d = np.array([[0, 0.9, 0, 0, 10, 10], [0, 0.8, 1, 1, 11, 11], [1, 0.7, 0, 0, 10, 10],
                  [0, 0.6, 20, 20, 30, 30]])
    kept = nms(d, 0.5)
    np.testing.assert_array_equal(kept[:, 1], [0.9, 0.7, 0.6])  # the 0.8 box overlaps the 0.9 one of its class


def test_box_iou() -> None:
    assert box_iou([0, 0, 2, 2], [1, 0, 3, 2])[0, 0] == pytest.approx(1 / 3)
    assert box_iou([0, 0, 1, 1], [2, 2, 3, 3])[0, 0] == 0.0


def test_map_perfect_random_and_mixed() -> None:
    gts = [np.array([[0, 0, 0, 10, 10], [1, 20, 20, 30, 30]]), np.array([[0, 5, 5, 15, 15]])]
    perfect = [np.array([[0, 0.9, 0, 0, 10, 10], [1, 0.8, 20, 20, 30, 30]]), np.array([[0, 0.7, 5, 5, 15, 15]])]
    assert mean_ap(perfect, gts).map == 1.0
    rng = np.random.default_rng(0)
    random = []
    for _ in gts:
        xy = rng.uniform(0, 90, (20, 2))
        random.append(np.column_stack([rng.integers(0, 2, 20), rng.random(20), xy, xy + rng.uniform(2, 10, (20, 2))]))
    assert mean_ap(random, gts).map < 0.1
    # Mixed, class 0: ranked TP (0.9), FP (0.8), TP (0.6) over 2 truths → P = 1, 1/2, 2/3 at R = ½, ½, 1:
    # envelope AP = ½·1 + ½·⅔ = 5/6. Class 1: its only detection misses (IoU < 0.5) → AP 0.
    mixed = [np.array([[0, 0.9, 0, 0, 10, 10], [0, 0.8, 50, 50, 60, 60], [1, 0.5, 24, 24, 34, 34]]),
             np.array([[0, 0.6, 5, 5, 15, 15]])]
    res = mean_ap(mixed, gts)
    assert res.ap[0] == pytest.approx(5 / 6)
    assert res.ap[1] == 0.0
    assert res.map == pytest.approx(5 / 12)


def test_map_counts_duplicates_as_false_positives() -> None:
    gts = [np.array([[0, 0, 0, 10, 10]])]
    dets = [np.array([[0, 0.9, 0, 0, 10, 10], [0, 0.8, 0, 0, 10, 10]])]  # the second matches an already-used truth
    assert mean_ap(dets, gts).map == 1.0  # recall hits 1 at precision 1 before the duplicate
    dets = [np.array([[0, 0.9, 0, 0, 10, 10], [0, 0.95, 0, 0, 10, 10]])]
    assert mean_ap(dets, gts).map == 1.0


def test_map_without_any_ground_truth_is_refused_not_zero() -> None:
    with pytest.raises(DataError, match=r"^mean_ap: no ground-truth box in any of the 2 images; mAP needs"):
        mean_ap([np.array([[0, 0.9, 0, 0, 10, 10]]), np.zeros((0, 6))], [np.zeros((0, 5)), []])


def test_all_point_ap() -> None:
    assert average_precision(np.array([0.5, 1.0]), np.array([1.0, 0.5])) == pytest.approx(0.75)
    assert average_precision(np.array([]), np.array([])) == 0.0


# ------------------------------------------------------------------ the yolo dataset and prepare
def _yolo_tree(root, n: int = 3) -> None:
    from PIL import Image

    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for k in range(n):
            pixels = rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "images" / split / f"{k}.png")
            if k:  # image 0 has no label file: no objects
                (root / "labels" / split / f"{k}.txt").write_text(f"{k % 3} 0.55 0.4 0.3 0.2\n2 0.1 0.9 0.1 0.1\n")


def test_prepare_yolo_round_trip(tmp_path) -> None:
    from hloforge.cli import main
    from hloforge.datasets.yolo import Yolo, record_size

    _yolo_tree(tmp_path / "src")
    out = tmp_path / "out"
    assert main(["prepare", "yolo", str(tmp_path / "src"), str(out), "--size", "32", "--grid", "4",
                 "--classes", "3"]) == 0
    assert (out / "train.bin").stat().st_size == 4 + 3 * record_size(32, 4, 13)
    data = Yolo(str(out), size=32, grid=4, classes=3)
    x, y = data.arrays("test")
    assert x.shape == (3, 3, 32, 32) and y.shape == (3, 14, 4, 4)
    # The stored bytes, scaled as Dataset.pixels says (what an export's manifest tells a runtime), are the input.
    stored = np.fromfile(out / "test.bin", np.uint8, offset=4).reshape(3, -1)[:, :3 * 32 * 32]
    np.testing.assert_allclose(data.pixels(stored.reshape(x.shape), y, None)[0], x, atol=1e-6)
    boxes = data.boxes("test")
    assert [len(b) for b in boxes] == [0, 2, 2]
    np.testing.assert_allclose(boxes[1][0], [1, 0.4 * 32, 0.3 * 32, 0.7 * 32, 0.5 * 32], atol=1e-4)
    # The stored target is what the YOLOv1 head's encoder makes of the stored boxes.
    head = DetectionHead.of(NetSpec("det", (3, 32, 32), [ConvBn(4, k=3, stride=8), Yolov1Head(3)], 3))
    np.testing.assert_allclose(y, head.targets(boxes), atol=1e-5)  # boxes are stored as f32 fractions
    # A file of the wrong geometry is refused before any record is read.
    with pytest.raises(DataError, match="bytes per record"):
        Yolo(str(out), size=32, grid=7, classes=3).arrays("train")


def test_prepare_yolo_refuses_a_bad_label(tmp_path) -> None:
    from hloforge.datasets.yolo import prepare_yolo

    _yolo_tree(tmp_path / "src", n=2)
    (tmp_path / "src" / "labels" / "train" / "1.txt").write_text("0 0.5 0.5 0.2\n")
    with pytest.raises(DataError, match=r"1.txt:1: expected 'class cx cy w h'"):
        prepare_yolo(str(tmp_path / "src"), str(tmp_path / "out"), size=32, grid=4, classes=3)
    assert not (tmp_path / "out" / "train.bin").exists()


def test_a_yolo_label_line_says_what_it_most_likely_is(tmp_path) -> None:
    """'0.0 0.5 0.5 0.2 0.2' (a class column written as floats, which Ultralytics reads as class 0) was refused as
    "expected 'class cx cy w h'", the very form it has; it is now read as class 0. A class 0.5, or a segmentation
    polygon, is refused saying which."""
    from hloforge.datasets.yolo import read_label_file

    label = tmp_path / "a.txt"
    label.write_text("0.0 0.5 0.5 0.2 0.2\n2 0.25 0.5 0.1 0.3\n")
    np.testing.assert_array_equal(read_label_file(str(label), 3), [[0, 0.5, 0.5, 0.2, 0.2], [2, 0.25, 0.5, 0.1, 0.3]])
    label.write_text("0.5 0.5 0.5 0.2 0.2\n")
    with pytest.raises(DataError, match=r"a.txt:1: expected 'class cx cy w h', got '0.5 0.5 0.5 0.2 0.2' \(class 0.5 "
                                        r"is no integer id\)$"):
        read_label_file(str(label), 3)
    label.write_text("1 0.1 0.1 0.3 0.1 0.3 0.4\n")
    with pytest.raises(DataError, match=r"\(a polygon of 3 points, a segmentation label\? a detection label is its "
                                        r"box: class, centre and size\)$"):
        read_label_file(str(label), 3)


def test_prepare_yolo_refuses_more_boxes_than_a_record_holds(tmp_path) -> None:
    """An image of 60 boxes was stored with its first 56: the eval's truth silently lacked 4 (a plausible mAP)."""
    from hloforge.datasets.yolo import MAX_BOXES, Yolo, prepare_yolo

    _yolo_tree(tmp_path / "src", n=2)
    many = "".join(f"0 {(k % 8) / 8 + 0.06:.4f} {(k // 8) / 8 + 0.06:.4f} 0.1 0.1\n" for k in range(MAX_BOXES))
    (tmp_path / "src" / "labels" / "val" / "1.txt").write_text(many)
    prepare_yolo(str(tmp_path / "src"), str(tmp_path / "out"), size=32, grid=4, classes=3)
    assert len(Yolo(str(tmp_path / "out"), size=32, grid=4, classes=3).boxes("test")[1]) == MAX_BOXES  # all fit
    (tmp_path / "src" / "labels" / "val" / "1.txt").write_text(many + "1 0.5 0.5 0.2 0.2\n")
    with pytest.raises(DataError, match=rf"1.txt: {MAX_BOXES + 1} boxes; a yolo record holds at most {MAX_BOXES}"):
        prepare_yolo(str(tmp_path / "src"), str(tmp_path / "out2"), size=32, grid=4, classes=3)


def test_prepare_yolo_names_the_files_it_leaves_out_and_the_options_to_train_with(tmp_path, capsys) -> None:
    """A .bmp image and a label file of no image were left out without a word, and the geometry the files were
    written with (needed to read them) was never said."""
    from hloforge.cli import main

    _yolo_tree(tmp_path / "src", n=3)  # val keeps a labelled image: a split of none is refused
    val = tmp_path / "src"
    (val / "images" / "val" / "1.png").rename(val / "images" / "val" / "1.bmp")
    (val / "images" / "val" / ".DS_Store").write_bytes(b"")
    (val / "labels" / "train" / "l.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    out = tmp_path / "out"
    assert main(["prepare", "yolo", str(val), str(out), "--size", "32", "--grid", "4", "--classes", "3"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[1:] == [
        f"  {val}/labels/train: 1 label file(s) of no image (their boxes are not used); the first: l.txt",
        f"  {val}/images/val: skipped 1 file(s) that are not .jpg/.jpeg/.png images; the first: 1.bmp",
        f"  {val}/labels/val: 1 label file(s) of no image (their boxes are not used); the first: 1.txt",
        f"  train on them with: --data yolo --data-dir {out} --data-opt size=32 --data-opt grid=4 --data-opt classes=3"]


def test_prepare_yolo_keeps_a_repeated_box_line_once_and_says_so(tmp_path, capsys) -> None:
    """A box listed twice stayed two ground-truth boxes: a detector predicts one, so that image's AP was capped
    at 0.5 without a word."""
    from hloforge.cli import main
    from hloforge.datasets.yolo import Yolo

    _yolo_tree(tmp_path / "src", n=2)
    label = tmp_path / "src" / "labels" / "val" / "1.txt"
    label.write_text("2 0.1 0.9 0.1 0.1\n1 0.55 0.4 0.3 0.2\n2 0.1 0.9 0.1 0.1\n")
    out = tmp_path / "out"
    assert main(["prepare", "yolo", str(tmp_path / "src"), str(out), "--size", "32", "--grid", "4", "--classes",
                 "3"]) == 0
    said = capsys.readouterr().out
    assert f"{label.parent}: 1 repeated box line(s) in 1 file(s) kept once each; the first: {label}" in said
    kept = Yolo(str(out), size=32, grid=4, classes=3).boxes("test")[1]
    np.testing.assert_allclose(kept[:, 0], [2, 1])  # once each, in the file's order


def test_prepare_yolo_refuses_a_box_with_no_area_inside_the_image(tmp_path) -> None:
    """A sliver at the edge passed prepare and became a zero-area box in float32, which training then refused."""
    from hloforge.cli import main

    _yolo_tree(tmp_path / "src", n=2)
    label = tmp_path / "src" / "labels" / "train" / "1.txt"
    label.write_text("0 1.0 0.5 0.00000001 0.5\n")
    out = tmp_path / "out"
    with pytest.raises(DataError, match=rf"^{label}: box '0 1 0.5 1e-08 0.5' has no area inside the image once "
                                        r"clipped to it at 32×32; expected a box that covers part of the image$"):
        from hloforge.datasets.yolo import prepare_yolo

        prepare_yolo(str(tmp_path / "src"), str(out), size=32, grid=4, classes=3)
    assert main(["prepare", "yolo", str(tmp_path / "src"), str(out), "--size", "32", "--grid", "4", "--classes",
                 "3"]) == 3


def test_a_yolo_label_file_with_a_byte_order_mark_is_read(tmp_path) -> None:
    """A label file saved with a UTF-8 BOM was refused: "expected 'class cx cy w h', got '\\ufeff1 0.5 ...'"."""
    from hloforge.datasets.yolo import read_label_file

    label = tmp_path / "a.txt"
    label.write_bytes(b"\xef\xbb\xbf1 0.5 0.5 0.2 0.2\r\n")
    np.testing.assert_array_equal(read_label_file(str(label), 3), [[1, 0.5, 0.5, 0.2, 0.2]])


def test_prepare_yolo_uses_no_deprecated_pillow_constant(tmp_path, monkeypatch) -> None:
    """The reader resizes with Image.Resampling.BILINEAR, not the deprecated Image.BILINEAR that
    Pillow's typed stubs lack (mypy flags it): it runs on a Pillow without the old aliases."""
    from PIL import Image

    from hloforge.datasets.yolo import Yolo, prepare_yolo

    _yolo_tree(tmp_path / "src", n=2)
    for name in ("NEAREST", "BILINEAR", "BICUBIC", "LANCZOS", "BOX", "HAMMING"):
        monkeypatch.delattr(Image, name)
    prepare_yolo(str(tmp_path / "src"), str(tmp_path / "out"), size=32, grid=4, classes=3)
    x, _ = Yolo(str(tmp_path / "out"), size=32, grid=4, classes=3).arrays("test")
    assert x.shape == (2, 3, 32, 32)


# ------------------------------------------------------------------ shapes' normalize, dataset options
def test_shapes_normalize_is_its_own_standardisation() -> None:
    from hloforge.datasets.shapes import Shapes

    ds = Shapes(size=24, n_train=24, n_test=8)
    raw_test = ds._generate(1, 8)[0]  # split index 1: the test images as drawn, before standardising
    x = ds.arrays("test")[0]
    assert ds.normalize(raw_test).tobytes() == x.tobytes()  # the same float32 arithmetic, bit for bit
    assert ds.normalize(raw_test[3]).tobytes() == x[3].tobytes()  # one image [3, S, S]
    # An image file's bytes: within half a quantisation step, where the drawing is inside [0, 1].
    as_bytes = (np.clip(raw_test, 0, 1) * 255).round().astype(np.uint8)
    inside = (raw_test >= 0) & (raw_test <= 1)
    err = np.abs(ds.normalize(as_bytes) - x) * ds.std
    assert err[inside].max() <= 0.5 / 255 + 1e-6
    with pytest.raises(DataError, match=r"normalises images \[3, 24, 24\]"):
        ds.normalize(np.zeros((24, 24, 3), np.uint8))  # channels last
    with pytest.raises(DataError, match="uint8 or float"):
        ds.normalize(np.zeros((3, 24, 24), np.int32))


def test_data_options_parse_store_and_merge(tmp_path) -> None:
    from hloforge.train.trainer import TrainConfig, load_config, parse_data_options

    opts = parse_data_options(("size=48", "noise=0.0", "flag=TRUE", "name=a b", "size=40"))
    assert opts == {"size": 40, "noise": 0.0, "flag": True, "name": "a b"}  # a later key wins
    assert type(opts["size"]) is int and type(opts["noise"]) is float
    assert TrainConfig(data_options="size=16, noise=0").data_options == ("size=16", "noise=0")  # one string
    cfg = TrainConfig(data="shapes", data_options=["size=16", "noise=0"])
    (tmp_path / "c.toml").write_text(cfg.to_toml())
    assert load_config(str(tmp_path / "c.toml")) == cfg
    merged = load_config(str(tmp_path / "c.toml"), data_options=["noise=0.1"])
    assert parse_data_options(merged.data_options) == {"size": 16, "noise": 0.1}
    with pytest.raises(UnsupportedSpec, match="'size16' is not KEY=VALUE"):
        parse_data_options(["size16"])


def test_an_unknown_data_option_names_the_accepted_ones(tmp_path, capsys) -> None:
    from hloforge.cli import main

    assert main(["train", "yolov1-mini", "--data", "shapes", "--data-opt", "sizze=48", "--run-dir",
                 str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "dataset 'shapes' does not take option(s) ['sizze']; its options are ['size', 'n_train'" in err
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ end to end
def test_a_detector_refuses_streaming_workers(tmp_path, capsys) -> None:
    from hloforge.cli import main

    assert main(["train", "fpn-mini", "--data", "shapes", "--data-opt", "n_train=64", "--data-opt", "n_test=8",
                 "--workers", "1", "--run-dir", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "encoded in process" in err and "--workers 0" in err
    assert not (tmp_path / "r").exists()


def test_a_detector_on_a_test_split_without_boxes_is_refused_before_training(tmp_path, capsys) -> None:
    from hloforge.cli import main

    _yolo_tree(tmp_path / "src")
    for label in (tmp_path / "src" / "labels" / "val").iterdir():  # the test images hold no object (a split
        label.write_text("")  # with no label file at all is refused by prepare)
    out = tmp_path / "data"
    assert main(["prepare", "yolo", str(tmp_path / "src"), str(out), "--size", "32", "--grid", "8",
                 "--classes", "3"]) == 0
    capsys.readouterr()
    assert main(["train", "yolov1-mini", "--data", "yolo", "--data-dir", str(out), "--data-opt", "classes=3",
                 "--data-opt", "size=32", "--data-opt", "grid=8",
                 "--run-dir", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "its test split holds no ground-truth box in any of its 3 images" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("net", "loss", "head", "own"), [
    ("fpn-mini", "anchorYolo", "fpnDetect", "fpnYolo"),  # before: trained, reading [cells, A, 5 + C] as a grid
    ("yolov1-mini", "anchorYolo", "yolov1Head", "yolov1"),
    ("fpn-mini", "yolov1", "fpnDetect", "fpnYolo"),  # before: "… reads 2 box(es) per cell, … head has None"
])
def test_a_box_loss_of_another_head_is_refused_naming_the_heads_own(tmp_path, capsys, net, loss, head, own) -> None:
    from hloforge.cli import main

    assert main(["train", net, "--loss", loss, "--data", "shapes", "--data-opt", "n_train=8", "--data-opt",
                 "n_test=4", "--batch", "4", "--epochs", "1", "--run-dir", str(tmp_path / "r")]) == 3
    assert capsys.readouterr().err == (f"hloforge: error: loss {loss!r} does not read the output of net {net!r}'s "
                                       f"head ({head}); expected {own}, its own (the default, with no loss given)\n")
    assert not (tmp_path / "r").exists()


def test_a_detector_of_fewer_classes_than_the_boxes_names_the_split_and_the_fix(tmp_path, capsys) -> None:
    """fpn-mini --classes 2 on 3-class boxes said 'image 0: box classes must be integers in [0, 2), got
    [np.float64(0.0), np.float64(2.0)]': no dataset, no split, valid classes listed, no way out."""
    from hloforge.cli import main

    _yolo_tree(tmp_path / "src")
    out = tmp_path / "data"
    assert main(["prepare", "yolo", str(tmp_path / "src"), str(out), "--size", "32", "--grid", "8",
                 "--classes", "3"]) == 0
    capsys.readouterr()
    assert main(["train", "fpn-mini", "--classes", "2", "--data", "yolo", "--data-dir", str(out), "--data-opt",
                 "classes=3", "--data-opt", "size=32", "--data-opt", "grid=8", "--run-dir", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err.strip()
    assert err == ("hloforge: error: dataset 'yolo' test split image 1: box class 2 is not one of the detector's 2 "
                   "classes (integers 0..1); a detector of 3 classes: --classes 3"), err
    head = DetectionHead.of(NetSpec("det", (3, 32, 32), [ConvBn(4, k=3, stride=4), Yolov1Head(3)], 3))
    with pytest.raises(DataError, match=r"^image 0: box class 0.5, nan is not one .* \(integers 0..2\)$"):
        head.targets([np.array([[0.5, 1, 1, 5, 5], [np.nan, 1, 1, 5, 5], [1, 1, 1, 5, 5]])])
    with pytest.raises(DataError, match=r"image 0: box 1 is \[0.0, 5.0, 1.0, 5.0, 5.0\] .* x1 > x0"):
        head.targets([np.array([[0, 1, 1, 5, 5], [0, 5, 1, 5, 5]])])


def test_train_and_detect_end_to_end(tmp_path, capsys, backend) -> None:
    import json

    from PIL import Image

    from hloforge.cli import main
    from hloforge.commands.opening import open_checkpoint
    from hloforge.datasets.shapes import Shapes
    from hloforge.train.detection import load_image

    run = tmp_path / "run"
    assert main(["train", "fpn-mini", "--data", "shapes", "--data-opt", "n_train=512", "--data-opt", "n_test=40",
                 "--epochs", "1", "--batch", "64", "--backend", backend, "--run-dir", str(run), "--no-progress"]) == 0
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    epoch = [r for r in rows if r.get("kind") == "epoch"][-1]
    assert 0.0 <= epoch["map50"] <= 1.0 and epoch["n"] == 40  # scored on the optioned test split
    out = tmp_path / "boxes.png"
    assert main(["detect", str(run), "--index", "39", "--out", str(out), "--score", "0.05"]) == 0
    assert Image.open(out).size == (256, 256)
    capsys.readouterr()
    # detect rebuilt the run's dataset with its stored options: 40 test images, not the default 256
    assert main(["detect", str(run), "--index", "40"]) == 3
    assert "the run's test split has 40 images" in capsys.readouterr().err
    # An image file, normalised as the run's dataset normalises its own images.
    raw = Shapes(n_train=512, n_test=40)._generate(1, 1)[0][0]  # test image 0 as drawn
    png = tmp_path / "shape.png"
    Image.fromarray((np.clip(raw, 0, 1) * 255).round().astype(np.uint8).transpose(1, 2, 0)).save(png)
    drawn = tmp_path / "file_boxes.png"
    assert main(["detect", str(run), str(png), "--out", str(drawn), "--score", "0.05"]) == 0
    assert Image.open(drawn).size == (256, 256)
    assert f"written to {drawn}" in capsys.readouterr().out
    data = open_checkpoint(str(run), log=lambda _: None).run.data
    inside = (raw >= 0) & (raw <= 1)
    err = np.abs(data.normalize(load_image(str(png), 32)) - data.arrays("test")[0][0]) * data.std[0]
    assert err[inside].max() <= 0.5 / 255 + 1e-6


@pytest.mark.parametrize("anchors,said", [
    # one level's pairs without their level list: was Python's "'float' object is not subscriptable"
    ([[0.1, 0.15]], "fpnDetect anchors must be 3 levels (P3, P4, P5), each a list of [w, h] pairs, e.g. "
                    "[[[0.1, 0.15]], [[0.3, 0.3]], [[0.6, 0.5]]]; got ((0.1, 0.15),)"),
    # a NaN width passed (NaN <= 0 is false) and became the head's NaN bias
    ([[[0.1, 0.1]], [[0.2, 0.2]], [[float("nan"), 0.5]]],
     "fpnDetect anchors must have positive width and height (fractions of the image)"),
])
def test_fpn_anchors_of_the_wrong_form_are_one_line(anchors, said):
    d = {"name": "t", "input_shape": [8, 16, 16], "num_classes": 3,
         "layers": [{"kind": "fpnDetect", "classes": 3, "anchors": anchors}]}
    with pytest.raises(UnsupportedSpec) as e:
        NetSpec.from_dict(d)
    assert str(e.value) == f"spec: layer 0: {said}"
