"""The `hloforge` command."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from hloforge.core.errors import HloforgeError


def _plugins(args: argparse.Namespace) -> None:
    from hloforge.core.registry import default_registry

    rows = [(e.kind, e.name, e.distribution) for e in default_registry().entries()]
    w = max(len(r[1]) for r in rows)
    for kind, name, dist in rows:
        print(f"{kind:10} {name:{w}}  {dist}")


def _render(args: argparse.Namespace) -> None:
    from hloforge.core.modules import forward_module, train_step_module
    from hloforge.core.variant import Variant
    from hloforge.zoo import get_net

    spec = get_net(args.net)
    variant = Variant(args.optimizer, args.weight_decay, args.loss, args.label_smoothing)
    os.makedirs(args.out, exist_ok=True)
    t = time.perf_counter()
    files = {
        f"{spec.ident}_fwd.mlir": forward_module(spec, args.batch),
        f"{spec.ident}_fwd_eval.mlir": forward_module(spec, args.batch, eval_mode=True),
        f"{spec.ident}_{variant.slug}_train_step.mlir": train_step_module(spec, variant, args.batch)[0],
    }
    secs = time.perf_counter() - t
    for name, text in files.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(text)
        print(os.path.join(args.out, name))
    print(f"rendered {spec.name} ({spec.param_count():,} params, batch {args.batch}) in {secs:.2f}s", file=sys.stderr)


def _train(args: argparse.Namespace) -> None:
    from hloforge.train.trainer import TrainConfig, train

    train(TrainConfig(net=args.net, data=args.data, backend=args.backend, epochs=args.epochs, batch=args.batch,
                      optimizer=args.optimizer, lr=args.lr, warmup_epochs=args.warmup_epochs,
                      weight_decay=args.weight_decay, label_smoothing=args.label_smoothing, seed=args.seed))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hloforge", description=__doc__)
    sub = p.add_subparsers(dest="command")
    sp = sub.add_parser("plugins", help="list every registered plugin: kind, name, distribution")
    sp.set_defaults(func=_plugins)

    def variant_opts(q: argparse.ArgumentParser) -> None:
        q.add_argument("--optimizer", default="adam")
        q.add_argument("--weight-decay", type=float, default=None)
        q.add_argument("--label-smoothing", type=float, default=0.0)

    sp = sub.add_parser("render", help="write the forward, eval and train-step StableHLO of a net")
    sp.add_argument("net")
    sp.add_argument("--out", required=True)
    sp.add_argument("--batch", type=int, default=128)
    sp.add_argument("--loss", default="crossEntropy")
    variant_opts(sp)
    sp.set_defaults(func=_render)

    sp = sub.add_parser("train", help="train a net (default: mnist-mlp on digits on XLA)")
    sp.add_argument("net", nargs="?", default="mnist-mlp")
    sp.add_argument("--data", default="digits")
    sp.add_argument("--backend", default="xla")
    sp.add_argument("--epochs", type=int, default=5)
    sp.add_argument("--batch", type=int, default=64)
    sp.add_argument("--lr", type=float, default=1e-3)
    sp.add_argument("--warmup-epochs", type=float, default=0.0)
    sp.add_argument("--seed", type=int, default=0)
    variant_opts(sp)
    sp.set_defaults(func=_train)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        args = parser().parse_args(["train", *(argv or [])])
    try:
        args.func(args)
    except HloforgeError as e:
        print(f"hloforge: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
