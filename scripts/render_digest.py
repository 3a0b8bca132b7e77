"""sha256 digests of rendered modules: the suite nets and one net per zoo family (train step,
forward, eval forward) for every render target and for none, and every layer gate case under each
strategy forcing the gate runs (its vjp module, as the gate renders it for no target).

`python scripts/render_digest.py` writes tests/data/render_digests.json; tests/test_render_identity.py
re-renders and compares, so a refactor that moves lowering code proves every module byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "render_digests.json"

# (zoo net, per-step batch, loss): the issue-#11 suite at its own batches, then one net per zoo family
NETS = (
    ("mnist-mlp", 128, "crossEntropy"),
    ("mnist-cnn", 128, "crossEntropy"),
    ("resnet18-cifar", 32, "crossEntropy"),
    ("mobilenetv2-mini", 128, "crossEntropy"),
    ("vit-cifar", 64, "crossEntropy"),
    ("resnet-mini", 8, "crossEntropy"),
    ("mobilenetv3-mini", 8, "crossEntropy"),
    ("mobilenetv4-mini", 8, "crossEntropy"),
    ("efficientnet-mini", 8, "crossEntropy"),
    ("convnext-mini", 8, "crossEntropy"),
    ("vit-mini", 8, "crossEntropy"),
    ("tinygpt-nano", 4, "tokenCrossEntropy"),
    ("tinygpt-nano-flash", 4, "tokenCrossEntropy"),
    ("unet-mini", 4, "perPixelCE"),
    ("ddpm-mini", 4, "mse"),
    ("yolov1-mini", 4, "yolov1"),
    ("fpn-mini", 4, "fpnYolo"),
)
# The render targets: None is the portable form.
TARGETS = ("xla", "iree", None)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def net_digests(names: tuple[str, ...] | None = None) -> Iterator[tuple[str, str]]:
    from hloforge.core.modules import forward_module, train_step_module
    from hloforge.core.variant import Variant
    from hloforge.zoo import get_net

    for name, batch, loss in NETS:
        if names is not None and name not in names:
            continue
        spec = get_net(name)
        for target in TARGETS:
            t = target or "none"
            yield f"{name}/{t}/train_step", _sha(train_step_module(spec, Variant("adam", loss=loss), batch,
                                                                   target=target)[0])
            yield f"{name}/{t}/forward", _sha(forward_module(spec, batch, target=target))
            yield f"{name}/{t}/eval", _sha(forward_module(spec, batch, eval_mode=True, target=target))


def gate_digests() -> Iterator[tuple[str, str]]:
    from hloforge.core import strategy
    from hloforge.core.modules import vjp_module
    from hloforge.testing.gate import gate_cases

    for case in gate_cases():
        if case.kind != "layer" or case.mode != "train":
            continue
        with strategy.forced(dict(case.strategy)):
            yield f"gate/{case.id}", _sha(vjp_module([case.obj], case.shape, 2, dtype="f64"))


def all_digests() -> dict[str, str]:
    return dict([*net_digests(), *gate_digests()])


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    digests = all_digests()
    OUT.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests)} digests -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
