"""The `hloforge` command."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from hloforge.core.errors import HloforgeError, UnsupportedSpec


def _plugins(args: argparse.Namespace) -> None:
    from hloforge.core.registry import default_registry

    reg = default_registry()
    rows = [(e.kind, e.name, e.distribution) for e in reg.entries()]
    # A plugin that failed to load: its entry-point name, its distribution and why (see Registry.broken).
    rows += [("broken", b.name, f"{b.distribution}  {b.error}") for b in reg.broken]
    w = max(len(r[1]) for r in rows)
    for kind, name, dist in rows:
        print(f"{kind:10} {name:{w}}  {dist}")


def _render(args: argparse.Namespace) -> None:
    from hloforge.core.modules import forward_module, train_step_module
    from hloforge.core.variant import Variant
    from hloforge.zoo import get_net

    variant = Variant(args.optimizer, args.weight_decay, args.loss, args.label_smoothing,
                      **{k: getattr(args, k) for k in VARIANT_FLAGS if getattr(args, k) is not None})
    spec = variant.apply_to(get_net(args.net, args.classes, args.input))  # the eval graph at the variant's BN ε
    os.makedirs(args.out, exist_ok=True)
    t = time.perf_counter()
    eps = variant.eval_suffix
    files = {
        f"{spec.ident}_fwd{eps}.mlir": forward_module(spec, args.batch),
        f"{spec.ident}_fwd_eval{eps}.mlir": forward_module(spec, args.batch, eval_mode=True),
        f"{spec.ident}_{variant.slug}_train_step.mlir": train_step_module(spec, variant, args.batch)[0],
    }
    secs = time.perf_counter() - t
    for name, text in files.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(text)
        print(os.path.join(args.out, name))
    print(f"rendered {spec.name} ({spec.param_count():,} params, batch {args.batch}) in {secs:.2f}s", file=sys.stderr)


# The Variant's options beyond optimizer / weight decay / loss / label smoothing (`variant_flags`).
VARIANT_FLAGS = ("ema", "accum", "clip", "mixup", "cutmix", "dropout", "drop_path", "bn_eps", "precision")
TRAIN_FLAGS = ("net", "classes", "input", "data", "data_dir", "data_file", "workers", "augment", "backend", "epochs",
               "batch", "optimizer", "lr", "schedule", "warmup_epochs", "weight_decay", "label_smoothing", "seed",
               "run_dir", "tag", "replicas", "devices", "sync_bn", "loss", *VARIANT_FLAGS, "data_options",
               "diffusion_steps", "beta_start", "beta_end", "autotune")


def _train(args: argparse.Namespace) -> None:
    from hloforge.train.trainer import TrainConfig, load_config, train

    if args.net_flag:
        if args.net and args.net != args.net_flag:
            raise UnsupportedSpec(f"two nets given: {args.net!r} and --net {args.net_flag!r}")
        args.net = args.net_flag
    given = {k: getattr(args, k) for k in TRAIN_FLAGS if getattr(args, k) is not None}
    cfg = load_config(args.config, **given) if args.config else TrainConfig(**given)
    train(cfg, resume=args.resume, cross_backend=args.cross_backend, progress=not args.no_progress)


def _eval(args: argparse.Namespace) -> None:
    from hloforge.train.trainer import evaluate_checkpoint

    evaluate_checkpoint(args.run, backend=args.backend, region=args.region, replicas=args.replicas,
                        devices=args.devices)


def _verify(args: argparse.Namespace) -> int:
    from hloforge.testing.verify import verify

    return 1 if verify(args.names) else 0


def _generate(args: argparse.Namespace) -> None:
    from hloforge.train.generate import generate

    generate(args.run, args.prompt, args.tokens, args.temperature, args.seed, args.backend,
             out=lambda s: print(s, end="", flush=True))
    print()


def _cam(args: argparse.Namespace) -> None:
    from hloforge.train.cam import cam_run

    cam_run(args.run, args.image, args.out, args.cls)


def _prepare(args: argparse.Namespace) -> None:
    from hloforge.datasets.prepare import PREPARERS, prepare

    opts = {o.name: getattr(args, o.name) for o in PREPARERS[args.dataset].options}
    summary = prepare(args.dataset, args.src, args.out, **opts)
    written = ", ".join(f"{os.path.join(args.out, f)} ({n} records)" for f, n in summary["records"].items())
    print(f"prepared {args.dataset}: {written}")


def prepare_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`hloforge prepare NAME SRC OUT [options]`, one subcommand per entry of PREPARERS."""
    from hloforge.datasets.prepare import PREPARERS

    sp = sub.add_parser("prepare", help="build a dataset's binaries from its downloaded layout "
                                        f"({', '.join(sorted(PREPARERS))})")
    names = sp.add_subparsers(dest="dataset", required=True)
    for name, prep in sorted(PREPARERS.items()):
        q = names.add_parser(name, help=prep.help)
        q.add_argument("src")
        q.add_argument("out")
        for o in prep.options:
            q.add_argument("--" + o.name.replace("_", "-"), dest=o.name, type=o.type, default=o.default,
                           help=f"{o.help} (default {o.default})")
    sp.set_defaults(func=_prepare)


def _detect(args: argparse.Namespace) -> None:
    from hloforge.train.detection import detect_run

    detect_run(args.run, args.image, args.out, index=args.index, score_min=args.score, backend=args.backend)


def _compare(args: argparse.Namespace) -> None:
    from hloforge.train.compare import compare_runs

    compare_runs(args.run_a, args.run_b)


def _sample(args: argparse.Namespace) -> None:
    from hloforge.train.diffusion import sample_run

    sample_run(args.run, args.n, args.out, args.seed, args.backend, args.region, args.clip)


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 3,32,32, got {text!r}") from None
    if not dims or min(dims) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive dimensions, got {text!r}")
    return dims


def variant_flags(q: argparse.ArgumentParser) -> None:
    """The training-variant flags (hloforge.core.variant.Variant); unset ones keep the defaults."""
    q.add_argument("--ema", type=float, metavar="DECAY", help="keep an EMA shadow of the weights (e.g. 0.9999)")
    q.add_argument("--accum", type=int, metavar="K", help="accumulate gradients over K micro-batches per update")
    q.add_argument("--clip", type=float, metavar="NORM", help="clip the global gradient norm to NORM")
    q.add_argument("--mixup", type=float, metavar="A", help="mixup with λ ~ Beta(A, A), on the host (soft labels)")
    q.add_argument("--cutmix", type=float, metavar="A", help="cutmix with λ ~ Beta(A, A), on the host (soft labels)")
    q.add_argument("--dropout", type=float, metavar="P", help="classifier dropout before the last layer")
    q.add_argument("--drop-path", type=float, metavar="P", help="stochastic depth on every block that has it")
    q.add_argument("--bn-eps", type=float, metavar="EPS", help="BatchNorm ε of every BN layer (train and eval)")
    q.add_argument("--precision", choices=("fp32", "fp8"), help="fp8: E4M3 weights and input, fp32 master")


def net_opts(q: argparse.ArgumentParser) -> None:
    q.add_argument("--classes", type=int, help="a zoo net's number of classes (default: its own)")
    q.add_argument("--input", type=_shape, help="a zoo net's input shape without batch, e.g. 3,32,32")


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
    net_opts(sp)
    variant_opts(sp)
    variant_flags(sp)
    sp.set_defaults(func=_render)

    sp = sub.add_parser("train", help="train a net (default: mnist-mlp on digits on XLA)")
    sp.add_argument("net", nargs="?", default=None, help="a zoo name or a .toml/.json spec (default mnist-mlp)")
    sp.add_argument("--net", dest="net_flag", metavar="NET", help="the net, as a flag (the same as NET)")
    sp.add_argument("--config", help="a config.toml (e.g. a run's own); flags given here override it")
    net_opts(sp)
    sp.add_argument("--data", help="a dataset plugin (default digits, embedded)")
    sp.add_argument("--data-dir", help="where a file-based dataset reads from (e.g. mnist's IDX files)")
    sp.add_argument("--data-file", help="a file-based dataset's file (text: a UTF-8 corpus; default pydoc topics)")
    sp.add_argument("--data-opt", dest="data_options", action="append", metavar="KEY=VALUE",
                    help="a dataset option (repeatable; int, float, true/false or text), e.g. shapes: "
                         "--data-opt size=48 --data-opt noise=0; kept with the run for eval, detect and sample")
    sp.add_argument("--workers", type=int, help="stream batches from N producer processes (default 0: in process)")
    sp.add_argument("--no-augment", dest="augment", action="store_const", const=False,
                    help="train without the dataset's augmentation (crops become centre crops)")
    sp.add_argument("--backend")
    sp.add_argument("--replicas", type=int, help="data-parallel over N devices (XLA); --batch is the global batch")
    sp.add_argument("--devices", type=int, help="the XLA CPU plugin's device count (its default is 4)")
    sp.add_argument("--sync-bn", action="store_const", const=True, dest="sync_bn",
                    help="with --replicas: BN statistics over the global batch (default: each replica's own)")
    sp.add_argument("--epochs", type=int)
    sp.add_argument("--batch", type=int)
    sp.add_argument("--optimizer")
    sp.add_argument("--lr", type=float)
    sp.add_argument("--schedule", choices=("cosine", "exp", "constant"))
    sp.add_argument("--warmup-epochs", type=float)
    sp.add_argument("--weight-decay", type=float)
    sp.add_argument("--label-smoothing", type=float)
    sp.add_argument("--loss", help="a loss plugin (default: the net's and dataset's: crossEntropy, perPixelCE for "
                                   "masks, mse for a DDPM)")
    variant_flags(sp)
    sp.add_argument("--diffusion-steps", type=int, help="a DDPM's T (default 1000)")
    sp.add_argument("--beta-start", type=float, help="a DDPM's β_1 (default 1e-4), linear to --beta-end")
    sp.add_argument("--beta-end", type=float, help="a DDPM's β_T (default 0.02)")
    sp.add_argument("--seed", type=int)
    sp.add_argument("--run-dir")
    sp.add_argument("--tag")
    sp.add_argument("--resume", action="store_true", help="continue the run directory's checkpoint")
    sp.add_argument("--cross-backend", action="store_true",
                    help="with --resume: accept a checkpoint trained on another backend")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.add_argument("--autotune", action="store_const", const=True,
                    help="time each layer's lowering strategies on the backend once and keep the fastest "
                         "(cached; also HLOFORGE_AUTOTUNE=1); the run's config records the choices")
    sp.set_defaults(func=_train)

    sp = sub.add_parser("eval", help="score a run's checkpoint alone (the same top-1 the run printed)")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("--backend", help="score on this backend (default: the one it trained on)")
    sp.add_argument("--region", default="auto", choices=("live", "ema", "auto"),
                    help="live weights, the EMA shadow, or auto (default: the shadow when the run kept one)")
    sp.add_argument("--replicas", type=int, default=1, help="score sharded over N devices (XLA; same result)")
    sp.add_argument("--devices", type=int, help="the XLA CPU plugin's device count (its default is 4)")
    sp.set_defaults(func=_eval)

    sp = sub.add_parser("verify", help="gate every registered (or each named) plugin against its oracles; "
                                       "exit 1 on any failure")
    sp.add_argument("names", nargs="*", metavar="NAME", help="a plugin (conv2d, adam) or a distribution")
    sp.set_defaults(func=_verify)

    sp = sub.add_parser("generate", help="sample text from a trained character language model run")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("--prompt", default="\n")
    sp.add_argument("--tokens", type=int, default=200)
    sp.add_argument("--temperature", type=float, default=0.8, help="0: always the most likely character")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--backend", help="run on this backend (default: the one it trained on)")
    sp.set_defaults(func=_generate)

    sp = sub.add_parser("cam", help="Grad-CAM heatmap of one image through a run's checkpoint")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("image", help="test:N (the N-th eval image) or a .npy array of the net's input shape")
    sp.add_argument("--out", default="cam.png")
    sp.add_argument("--class", dest="cls", type=int, help="class to explain (default: the predicted one)")
    sp.set_defaults(func=_cam)

    sp = sub.add_parser("detect", help="a detector run's boxes on one image, drawn to a PNG")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("image", nargs="?", help="a PNG/JPEG file (or give --index)")
    sp.add_argument("--index", type=int, help="take test image N of the run's dataset instead of a file")
    sp.add_argument("--out", default="boxes.png")
    sp.add_argument("--score", type=float, default=0.3, help="lowest score drawn")
    sp.add_argument("--backend", help="run on this backend (default: the one it trained on)")
    sp.set_defaults(func=_detect)

    sp = sub.add_parser("compare", help="McNemar's exact test on two runs' eval bitmaps")
    sp.add_argument("run_a")
    sp.add_argument("run_b")
    sp.set_defaults(func=_compare)

    sp = sub.add_parser("sample", help="draw images from a DDPM run's checkpoint (ancestral sampling) as a PNG grid")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("-n", type=int, default=16, help="how many images")
    sp.add_argument("--out", default="grid.png")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--backend", help="run on this backend (default: the one it trained on)")
    sp.add_argument("--region", default="auto", choices=("live", "ema", "auto"),
                    help="live weights, the EMA shadow, or auto (default: the shadow when the run kept one)")
    sp.add_argument("--no-clip", dest="clip", action="store_false",
                    help="leave each step's predicted clean image unclipped (default: clip it to the data's range)")
    sp.set_defaults(func=_sample)
    prepare_parser(sub)
    sub.add_parser("bench", add_help=False, help="step time vs jax.jit and PyTorch (see `hloforge bench -h`)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # bench parses its own options, -h included
        from hloforge import bench

        return bench.main(argv[1:])
    args = parser().parse_args(argv)
    if args.command is None:
        args = parser().parse_args(["train"])
    try:
        rc = args.func(args)  # a command may return its exit status (verify: 1 on a failed gate)
    except HloforgeError as e:
        print(f"hloforge: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
