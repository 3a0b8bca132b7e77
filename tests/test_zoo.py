"""The zoo: published parameter counts, sizes, refusals, renders, and the -mini nets on a train step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.modules import forward_module, train_step_module
from hloforge.core.variant import Variant
from hloforge.zoo import NETS, get_net

# 1000 classes at 3×224×224. Parameters (γ/β included), not buffers (BN running statistics excluded).
# torchvision: the "num_params" of each model's weights entry in torchvision.models (e.g.
# ResNet18_Weights.IMAGENET1K_V1.meta["num_params"]), as tabulated at
# https://pytorch.org/vision/stable/models.html.
# mobilenetv4_conv_small: timm's `mobilenetv4_conv_small` (timm/models/mobilenetv3.py,
# _gen_mobilenet_v4, 'small' arch_def; model card huggingface.co/timm/mobilenetv4_conv_small.e2400_r224_in1k:
# "Params (M): 3.8"); the exact count 3,774,024 is the one timm reports via
# sum(p.numel() for p in model.parameters()), as quoted in the lucid model docs
# (mobilenet_v4_conv_small, "Total Parameters: 3,774,024") and elsewhere, with 2,493,024 for the
# num_classes=0 backbone — both checked below.
PUBLISHED = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "mobilenet_v2": 3_504_872,
    "mobilenet_v3_large": 5_483_032,
    "efficientnet_b0": 5_288_548,
    "efficientnet_v2_s": 21_458_488,
    "convnext_tiny": 28_589_128,
    "mobilenetv4_conv_small": 3_774_024,
}
# the digits classifiers (a segmenter, detector or DDPM -mini trains on shapes: tests/test_segmentation.py, ...)
MINIS = [n for n in NETS if n.endswith("-mini") and len(get_net(n).walk()[-1].out_shape) == 1]


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_is_the_published_one(name: str) -> None:
    spec = get_net(name)
    assert spec.input_shape == (3, 224, 224) and spec.num_classes == 1000
    assert spec.param_count() == PUBLISHED[name]


def test_mobilenetv4_backbone_count_without_the_classifier() -> None:
    spec = get_net("mobilenetv4_conv_small")
    assert spec.param_count() - (1280 * 1000 + 1000) == 2_493_024


def test_classes_and_input_override() -> None:
    spec = get_net("resnet18", classes=10, input=(3, 32, 32))
    assert spec.num_classes == 10 and spec.input_shape == (3, 32, 32)
    assert spec.param_count() == PUBLISHED["resnet18"] - 513_000 + 5_130  # only the classifier changes
    assert get_net("convnext_tiny", classes=10).walk()[-1].out_shape == (10,)


def test_a_spec_file_refuses_classes_or_input_it_does_not_state(tmp_path) -> None:
    """--classes / --input were dropped without a word for a spec file (its net as written): a run then
    trained another head than asked, or a mismatch surfaced later, far from its cause."""
    path = tmp_path / "net.json"
    path.write_text(get_net("mnist-mlp").to_json(), encoding="utf-8")
    assert get_net(str(path), 10, (784,)).num_classes == 10  # restating what it states is fine
    with pytest.raises(UnsupportedSpec, match=r"states 10 classes, not 7: --classes does not reshape"):
        get_net(str(path), 7)
    with pytest.raises(UnsupportedSpec, match=r"states input \[784\], not \[1, 28, 28\]: --input does not"):
        get_net(str(path), input=(1, 28, 28))


def test_impossible_input_names_the_layer_block_and_rule() -> None:
    with pytest.raises(UnsupportedSpec) as e:
        get_net("convnext_tiny", input=(3, 60, 60))  # the 4×4 stem: 15, whose 2×2 downsample would drop a row
    msg = str(e.value)
    assert msg.startswith("layer 3 (convNextDownsample(") and "on input [96, 15, 15]: block 0: " \
        "stride 2 does not divide the 15x15 input" in msg and "\n" not in msg


def test_resnets_take_sizes_a_stride_does_not_divide_as_torchvision_does() -> None:
    """A stride-2 conv of an odd map floors as torch.nn.Conv2d does (both paths of a block alike), so
    resnet18 runs at 28×28 (14 → 7 → 4 → 2 → 1) and 100×100 (…, 25 → 13 → 7 → 4), as torchvision's does."""
    assert get_net("resnet18", classes=10, input=(3, 28, 28)).out_shape == (10,)
    spec = get_net("resnet18", input=(3, 100, 100))
    assert [w.out_shape[1:] for w in spec.walk()][-3] == (4, 4)


def test_fixed_nets_keep_working_and_refuse_other_sizes() -> None:
    assert get_net("mnist-cnn").num_classes == 10
    assert get_net("mnist-cnn", classes=10).name == "mnist-cnn"
    with pytest.raises(UnsupportedSpec, match="defined for 10 classes on input"):
        get_net("mnist-mlp", classes=100)
    with pytest.raises(UnsupportedSpec, match="unknown net 'resnet9'"):
        get_net("resnet9")
    with pytest.raises(UnsupportedSpec, match=r"unknown net 'mnist_mlp'; .*; did you mean 'mnist-mlp'\?$"):
        get_net("mnist_mlp")  # the near name ends the line, as a misspelt layer's or optimizer's does


@pytest.mark.parametrize("name", [n for n in NETS if not n.startswith("mnist")])
def test_every_net_renders_train_step_and_eval(name: str) -> None:
    from hloforge.train.tasks import default_loss

    spec = get_net(name)
    # the loss the net trains with: tokenCrossEntropy for a language model, perPixelCE for a segmenter, ...
    variant = Variant("adam", loss=default_loss(spec, "shapes"))
    text, lay = train_step_module(spec, variant, 2)
    assert len(lay.stats) == len(spec.stats())
    assert text.startswith(f"module @{spec.ident}_{variant.slug}_train_step")
    eval_text = forward_module(spec, 2, eval_mode=True)
    assert eval_text.count("%arg") >= 1 + len(lay.params) + len(lay.stats)


@pytest.mark.parametrize("name", MINIS)
def test_mini_nets_take_a_train_step_on_digits_shapes(name: str, backend: str) -> None:
    from hloforge.train.session import ForwardSession, TrainSession, make_backend

    spec = get_net(name)
    assert spec.input_shape == (1, 28, 28) and spec.num_classes == 10
    assert spec.param_count() < 100_000
    be = make_backend(backend)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 8).astype(np.int32)
    session = TrainSession(spec, Variant("adam"), 8, be)
    losses = [session.train_step(x, y, 1e-2) for _ in range(3)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    stats = session.batch_stats()
    assert len(stats) == len(spec.stats()) and all(np.isfinite(s).all() for s in stats)
    running = [s.initial() for _, s in spec.stats()]
    logits = ForwardSession(spec, 8, be).logits(x, [*session.read_params(), *running])
    assert logits.shape == (8, 10) and np.isfinite(logits).all()


# One net of each family the digits minis above do not cover (mlp, cnn, unet, yolo, fpn, ddpm, tinygpt):
# with the minis, every zoo family takes a train step on the backend under test.
# (net, a smaller input where it takes one)
FAMILIES = [("mnist-mlp", None), ("mnist-cnn", None), ("unet-mini", (3, 16, 16)), ("yolov1-mini", (3, 16, 16)),
            ("fpn-mini", None), ("ddpm-mini", (4, 16, 16)), ("tinygpt-nano", (8,))]


@pytest.mark.parametrize(("name", "shape"), FAMILIES, ids=[n for n, _ in FAMILIES])
def test_every_family_takes_a_train_step(name: str, shape: tuple[int, ...] | None, backend: str) -> None:
    from hloforge.core.registry import default_registry
    from hloforge.train.session import TrainSession, make_backend
    from hloforge.train.tasks import default_loss

    spec = get_net(name, input=shape) if shape else get_net(name)
    variant = Variant("adam", loss=default_loss(spec, "shapes"))  # its task's loss (crossEntropy: a classifier)
    loss = variant.make_loss(default_registry())
    rng = np.random.default_rng(0)
    out = spec.walk()[-1].out_shape
    x = rng.standard_normal((2, *spec.input_shape)).astype(np.float32)
    if len(out) == 2:  # a language model: token ids, as the session's f32 input
        x = rng.integers(0, out[1], (2, *spec.input_shape)).astype(np.float32)
    y = loss.sample_labels(rng, 2, out)
    session = TrainSession(spec, variant, 2, make_backend(backend))
    losses = [session.train_step(x, y, 1e-3) for _ in range(2)]
    assert all(math.isfinite(v) for v in losses) and losses[1] != losses[0]


@pytest.mark.parametrize("name", ["resnet-mini", "mobilenetv2-mini"])
def test_mini_nets_learn_digits(name: str, tmp_path) -> None:
    from hloforge.train.trainer import TrainConfig, train

    # bn_momentum 0.9: 22 steps an epoch is too few for the 0.99 default's running average to settle.
    m = train(TrainConfig(net=name, epochs=6, batch=64, lr=3e-3, bn_momentum=0.9, run_dir=str(tmp_path),
                          log_every=0), progress=False, log=lambda s: None)
    assert m["top1"] >= 0.9


def test_vit_cifar_is_the_issue_11_benchmark_vit() -> None:
    spec = get_net("vit-cifar")
    assert spec.input_shape == (3, 32, 32) and spec.num_classes == 10
    assert spec.walk()[0].out_shape == (65, 128)  # patch 4: 8×8 patches + the class token
    # patch embed 3·16·128 + 128 + 128 (cls) + 65·128 (pos) = 14,720; per block: 2 LNs 512, qkv 49,536,
    # proj 16,512, fc1 33,024, fc2 32,896 = 132,480, ×6; final LN 256; head 1,290
    assert spec.param_count() == 14_720 + 6 * 132_480 + 256 + 1_290 == 811_146
