"""The `hloforge` command."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from hloforge.core.errors import HloforgeError, UnsupportedSpec

if TYPE_CHECKING:
    from hloforge.train.trainer import TrainConfig


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
    from hloforge.train.tasks import default_loss
    from hloforge.zoo import get_net

    spec = get_net(args.net, args.classes, args.input)
    loss = args.loss or default_loss(spec, args.data)  # the loss `train` picks (a DDPM's mse, an LM's, a mask's)
    variant = Variant(**{**given(args, Variant), "loss": loss})
    spec = variant.apply_to(spec)  # the eval graph at the variant's BN ε
    t = time.perf_counter()
    eps = variant.eval_suffix
    files = {
        f"{spec.ident}_fwd{eps}.mlir": forward_module(spec, args.batch),
        f"{spec.ident}_fwd_eval{eps}.mlir": forward_module(spec, args.batch, eval_mode=True),
        f"{spec.ident}_{variant.slug}_train_step.mlir": train_step_module(spec, variant, args.batch)[0],
    }
    secs = time.perf_counter() - t
    os.makedirs(args.out, exist_ok=True)  # only once every module rendered: a refused net writes nothing
    for name, text in files.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(text)
        print(os.path.join(args.out, name))
    print(f"rendered {spec.name} ({spec.param_count():,} params, batch {args.batch}) in {secs:.2f}s", file=sys.stderr)


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The flags set on the command line that are fields of the attrs class `cls` (a flag's dest is its
    field's name): unset ones (None) are left to the class's defaults, or to --config's file."""
    import attrs

    return {f.name: getattr(args, f.name) for f in attrs.fields(cls) if getattr(args, f.name, None) is not None}


def train_config(args: argparse.Namespace) -> TrainConfig:
    """`hloforge train`'s parsed flags as the run's config (over --config's file when given)."""
    from hloforge.train.trainer import TrainConfig, load_config

    if args.net_flag:
        if args.net and args.net != args.net_flag:
            raise UnsupportedSpec(f"two nets given: {args.net!r} and --net {args.net_flag!r}")
        args.net = args.net_flag
    flags = given(args, TrainConfig)
    return load_config(args.config, **flags) if args.config else TrainConfig(**flags)


def _train(args: argparse.Namespace) -> None:
    from hloforge.callbacks import from_items
    from hloforge.train.trainer import train

    if args.init is not None and args.resume:
        raise UnsupportedSpec("--init starts a new run from other weights, --resume continues this run's own "
                              "checkpoint; give one of them")
    callbacks = from_items(args.callback or ())  # refused before anything trains or is written
    train(train_config(args), resume=args.resume, cross_backend=args.cross_backend, progress=not args.no_progress,
          callbacks=callbacks)


def _plot(args: argparse.Namespace) -> None:
    from hloforge.train import curves

    print(curves.plot_run(args.run))


def _eval(args: argparse.Namespace) -> None:
    from hloforge.commands.opening import evaluate_checkpoint

    evaluate_checkpoint(args.run, backend=args.backend, region=args.region, replicas=args.replicas,
                        devices=args.devices, batch_stats=args.batch_stats, size=args.size, crop=args.crop)


def _summary(args: argparse.Namespace) -> None:
    from hloforge.api import summary_table
    from hloforge.zoo import get_net

    print(summary_table(get_net(args.net, args.classes, args.input)))


def _import_weights(args: argparse.Namespace) -> None:
    from hloforge.interop import import_weights

    import_weights(args.source, args.file, args.out, input=args.input, data=args.data or "",
                   data_options=args.data_options or (), backend=args.backend or "")


def _export(args: argparse.Namespace) -> None:
    from hloforge.interop.exporter import export_run

    export_run(args.run, args.out, args.format)


def _verify(args: argparse.Namespace) -> int:
    from hloforge.testing.verify import verify

    return EXIT_FAILED if verify(args.names) else EXIT_OK


def _generate(args: argparse.Namespace) -> None:
    from hloforge.commands.generate import generate

    generate(args.run, args.prompt, args.tokens, args.temperature, args.seed, args.backend,
             out=lambda s: print(s, end="", flush=True))
    print()


def _cam(args: argparse.Namespace) -> None:
    from hloforge.commands.cam import cam_run

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

    sp = _command(sub, "prepare", help="build a dataset's binaries from its downloaded layout "
                                       f"({', '.join(sorted(PREPARERS))})")
    names = sp.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    for name, prep in sorted(PREPARERS.items()):
        q = _command(names, name, help=prep.help)
        q.add_argument("src", help="the downloaded layout to read")
        q.add_argument("out", help="the directory the binaries are written to")
        for o in prep.options:
            kind = {int: integer(), float: finite_float}.get(o.type, o.type)  # its range is the preparer's
            q.add_argument("--" + o.name.replace("_", "-"), dest=o.name, type=kind, default=o.default,
                           help=f"{o.help} (default {o.default})")
    sp.set_defaults(func=_prepare)


def _detect(args: argparse.Namespace) -> None:
    from hloforge.commands.detect import detect_run

    detect_run(args.run, args.image, args.out, index=args.index, score_min=args.score, backend=args.backend)


def _compare(args: argparse.Namespace) -> None:
    from hloforge.train.compare import compare_runs

    compare_runs(args.run_a, args.run_b)


def _sample(args: argparse.Namespace) -> None:
    from hloforge.commands.sample import sample_run

    sample_run(args.run, args.n, args.out, args.seed, args.backend, args.region, args.clip)


# ------------------------------------------------------------------ option types
# Every numeric option is parsed by one of these, so a value of the wrong kind or range is refused at
# parse time (exit 2, one line naming the flag and what it expects), before anything is read or
# written. Ints stop at I64_MAX and floats must be finite: a run's config.toml holds its options, and
# TOML has no integer beyond 64 bits (nor may a config hold nan/inf and be read back as given); the
# programs take their scalars (lr, clip norm, decays) as f32, so a float must also be one f32 can hold.
I64_MAX = 2**63 - 1
F32_MAX = 3.4028234663852886e38
# A count that starts processes or devices: a typo of a few digits must not fork a million producers
# or ask the XLA CPU plugin for a million devices.
MAX_PROCESSES = 1024
# A DDPM's T: its schedule is T floats and sampling runs T forward passes.
MAX_DIFFUSION_STEPS = 1_000_000


def integer(lo: int = -I64_MAX - 1, hi: int = I64_MAX) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi]."""
    what = ("an integer ≥ 1" if lo == 1 else "an integer ≥ 0" if lo == 0 else "an integer") if hi == I64_MAX \
        else f"an integer from {lo} to {hi}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v

    return parse


def number(lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
           hi_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in the interval from lo to hi (each end closed unless *_open)."""
    if lo == -math.inf and hi == math.inf:
        what = "a finite number (at most f32's 3.4e38 in size)"
    elif hi == math.inf:
        what = f"a finite number {'>' if lo_open else '≥'} {lo:g} (at most f32's 3.4e38)"
    else:
        what = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        ok = abs(v) <= F32_MAX and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v

    return parse


positive_int = integer(1)
nonneg_int = integer(0)  # a seed, an index, a count where 0 means none
finite_float = number()
positive_float = number(0.0, lo_open=True)
nonneg_float = number(0.0)
probability = number(0.0, 1.0)
unit_open = number(0.0, 1.0, lo_open=True, hi_open=True)  # a DDPM's β: a noise variance per step


def variant_value(name: str, parse: Callable[[str], Any], variant: type | None = None) -> Callable[[str], Any]:
    """An argparse type for a field of `variant` (default: hloforge.core.variant.Variant): `parse`, then the
    Variant's own rule for that field (one definition of each range), refused at parse time."""

    def check(text: str) -> Any:
        from hloforge.core.variant import Variant

        v = parse(text)
        try:
            (variant or Variant)(**{name: v})
        except HloforgeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return v

    return check


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 3,32,32, got {text!r}") from None
    if not dims or min(dims) <= 0 or max(dims) > I64_MAX:
        raise argparse.ArgumentTypeError(f"expected positive dimensions, got {text!r}")
    return dims


# ------------------------------------------------------------------ exit codes
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_FAILED: "a check ran and failed (verify: a plugin failed its gate)",
    EXIT_USAGE: "usage: an unknown command or flag, a missing argument, a value of the wrong kind or range",
    EXIT_BAD_INPUT: "bad input, refused in one line: a spec, dataset, checkpoint or run that cannot be\n"
                    "used, options that do not go together, a file that cannot be read or written",
    EXIT_INTERNAL: "internal error (a bug): one line naming the file that holds the traceback\n"
                   "(HLOFORGE_DEBUG=1 prints it instead)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
DEBUG_ENV_VAR = "HLOFORGE_DEBUG"


def exit_codes_text() -> str:
    rows = (f"  {code:<5}" + meaning.replace("\n", "\n" + " " * 7) for code, meaning in EXIT_CODES.items())
    return "exit codes:\n" + "\n".join(rows)


def version() -> str:
    """The installed distribution's version (hloforge.__version__)."""
    import hloforge

    return str(hloforge.__version__)


# ------------------------------------------------------------------ the parser
class Parser(argparse.ArgumentParser):
    """A usage error is one line naming the flag and what it expects, and where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} -h`)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's help ends with its default (as argparse's ArgumentDefaultsHelpFormatter does),
    unless the help already names it or the default is an unset None or a switch's False."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "default" in text or unset or action.required:
            return text
        if not action.option_strings and action.nargs not in ("?", "*"):
            return text
        return text + " (default: %(default)s)"


def _command(sub: argparse._SubParsersAction, name: str, **kw: Any) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    return sub.add_parser(name, formatter_class=HelpFormatter, **kw)  # type: ignore[no-any-return]


def variant_flags(q: argparse.ArgumentParser, variant: type | None = None) -> None:
    """A flag for every field of the Variant (hloforge.core.variant; or of `variant`, a subclass), made from the
    field's `option`: its help (and default), metavar and choices; its value parsed by the option's `parse` or the
    field's type, then checked by the Variant's rule. Unset flags stay None: the Variant's defaults, or --config's."""
    import types
    import typing

    import attrs

    from hloforge.core.variant import OPTION, Variant

    cls = variant or Variant
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        o = f.metadata[OPTION]
        hint = hints[f.name]
        kind = next(t for t in (typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,))
                    if t is not type(None))
        if typing.get_origin(kind) is tuple:  # a repeated flag's items
            kind = typing.get_args(kind)[0]
        if o.parse is None and kind not in (int, float, str):
            raise TypeError(f"Variant field {f.name}: no flag parses a {kind}; give its option a parse")
        parse = o.parse or {int: integer(), float: finite_float}.get(kind)  # a str is taken as written
        shown = o.help if "default" in o.help or f.default in (None, ()) else f"{o.help} (default {f.default})"
        q.add_argument(o.flag or "--" + f.name.replace("_", "-"), dest=f.name, choices=o.choices or None,
                       metavar=o.metavar, help=shown, type=None if parse is None else variant_value(f.name, parse, cls),
                       **({"action": "extend", "nargs": "+"} if o.repeat else {}))


def net_opts(q: argparse.ArgumentParser) -> None:
    q.add_argument("--classes", type=positive_int, help="a zoo net's number of classes (default: its own)")
    q.add_argument("--input", type=_shape,
                   help="a zoo net's input shape without batch, e.g. 3,32,32 (default: its own)")


def _train_defaults(q: argparse.ArgumentParser) -> None:
    """Train's flags default to None (unset: --config's value, else TrainConfig's); their help shows
    TrainConfig's default, the one definition, where the help does not say it already."""
    import attrs

    from hloforge.train.trainer import TrainConfig

    defaults = {f.name: f.default for f in attrs.fields(TrainConfig)}
    for a in q._actions:
        d = defaults.get(a.dest)
        if a.help and "default" not in a.help and d not in (None, "", ()) and a.nargs != 0:
            a.help += f" (default {d})"


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hloforge", description=__doc__, formatter_class=HelpFormatter, epilog=exit_codes_text())
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sp = _command(sub, "plugins", help="list every registered plugin: kind, name, distribution")
    sp.set_defaults(func=_plugins)

    sp = _command(sub, "render", help="write the forward, eval and train-step StableHLO of a net")
    sp.add_argument("net", help="a zoo name or a .toml/.json spec")
    sp.add_argument("--out", required=True, help="the directory the .mlir files are written to")
    sp.add_argument("--batch", type=positive_int, default=128, help="the modules' batch size")
    sp.add_argument("--data", help="pick the default loss as `train` does on this dataset (default: from the net's "
                                   "output alone)")
    net_opts(sp)
    variant_flags(sp)
    sp.set_defaults(func=_render)

    sp = _command(sub, "train", help="train a net (default: mnist-mlp on digits on XLA)")
    sp.add_argument("net", nargs="?", default=None, help="a zoo name or a .toml/.json spec (default mnist-mlp)")
    sp.add_argument("--net", dest="net_flag", metavar="NET",
                    help="the net, as a flag (the same as NET; default mnist-mlp)")
    sp.add_argument("--config", help="a config.toml (e.g. a run's own); flags given here override it (default: none)")
    net_opts(sp)
    sp.add_argument("--data", help="a dataset plugin (`hloforge plugins` lists them)")
    sp.add_argument("--data-dir", help="where a file-based dataset reads from, e.g. mnist's IDX files (default: the "
                                       "dataset's own)")
    sp.add_argument("--data-file", help="a file-based dataset's file (text: a UTF-8 corpus; default pydoc topics)")
    sp.add_argument("--data-opt", dest="data_options", action="append", metavar="KEY=VALUE",
                    help="a dataset option (repeatable; int, float, true/false or text), e.g. shapes: "
                         "--data-opt size=48 --data-opt noise=0; kept with the run for eval, detect and sample "
                         "(default: none)")
    sp.add_argument("--workers", type=integer(0, MAX_PROCESSES),
                    help="stream batches from N producer processes (default 0: in process)")
    sp.add_argument("--no-augment", dest="augment", action="store_const", const=False,
                    help="train without the dataset's augmentation (crops become centre crops)")
    sp.add_argument("--backend", help="xla, iree or a backend plugin (default: $HLOFORGE_BACKEND, else xla)")
    sp.add_argument("--replicas", type=positive_int, help="data-parallel over N devices (XLA); --batch is the "
                                                          "global batch")
    sp.add_argument("--devices", type=integer(1, MAX_PROCESSES),
                    help="the XLA CPU plugin's device count (default: the plugin's, 4)")
    sp.add_argument("--sync-bn", action="store_const", const=True, dest="sync_bn",
                    help="with --replicas: BN statistics over the global batch (default: each replica's own)")
    sp.add_argument("--epochs", type=positive_int, help="passes over the training split")
    sp.add_argument("--batch", type=positive_int, help="examples per step (with --replicas: over all of them)")
    sp.add_argument("--lr", type=positive_float, help="the peak learning rate")
    sp.add_argument("--schedule", choices=("cosine", "exp", "constant"), help="the learning-rate schedule")
    sp.add_argument("--decay-rate", type=number(0.0, 1.0, lo_open=True),
                    help="--schedule exp: the lr's factor every --decay-epochs")
    sp.add_argument("--decay-epochs", type=positive_float, help="--schedule exp: the decay period in epochs "
                                                                "(EfficientNet: --decay-rate 0.97 every 2.4)")
    sp.add_argument("--warmup-epochs", type=nonneg_float, help="linear warm-up to --lr over this many epochs")
    variant_flags(sp)
    sp.add_argument("--diffusion-steps", type=integer(2, MAX_DIFFUSION_STEPS), help="a DDPM's T (default 1000)")
    sp.add_argument("--beta-start", type=unit_open, help="a DDPM's β_1 (default 1e-4), linear to --beta-end")
    sp.add_argument("--beta-end", type=unit_open, help="a DDPM's β_T (default 0.02)")
    sp.add_argument("--seed", type=nonneg_int, help="seeds the initialisation, shuffling and augmentation")
    sp.add_argument("--run-dir", help="the run directory (default: runs/<net>_<variant>_<backend>[_<tag>], "
                                      "a new _2, _3 ... if taken)")
    sp.add_argument("--tag", help="a suffix of the default run directory (default: none)")
    sp.add_argument("--resume", action="store_true", help="continue the run directory's checkpoint")
    sp.add_argument("--init", metavar="DIR_OR_FILE",
                    help="start a new run from these weights (a run directory, a checkpoint, an export directory "
                         "or a weights file), matched by name and shape; a new class count re-initialises the "
                         "head; fresh optimizer state (default: none, the net's own init)")
    sp.add_argument("--cross-backend", action="store_true",
                    help="with --resume: accept a checkpoint trained on another backend")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")
    sp.add_argument("--callback", action="append", metavar="NAME[:KEY=VALUE,...]",
                    help="a registered callback (`hloforge plugins`), run in the loop; repeatable, e.g. "
                         "model_checkpoint:path=best,monitor=top1 (default: none)")
    sp.add_argument("--autotune", action="store_const", const=True,
                    help="time each layer's lowering strategies on the backend once and keep the fastest "
                         "(cached; also HLOFORGE_AUTOTUNE=1); the run's config records the choices")
    _train_defaults(sp)
    sp.set_defaults(func=_train)

    sp = _command(sub, "eval", help="score a run's checkpoint alone (the same top-1 the run printed)")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("--backend", help="score on this backend (default: the one it trained on)")
    sp.add_argument("--region", default="auto", choices=("live", "ema", "auto"),
                    help="live weights, the EMA shadow, or auto (default: the shadow when the run kept one)")
    sp.add_argument("--replicas", type=positive_int, default=1,
                    help="score sharded over N devices (XLA; same result)")
    sp.add_argument("--devices", type=integer(1, MAX_PROCESSES),
                    help="the XLA CPU plugin's device count (default: the plugin's, 4)")
    sp.add_argument("--batch-stats", action="store_true",
                    help="diagnostic: BatchNorm with each eval batch's own statistics, not the running ones "
                         "(refused when the last batch would be padded)")
    sp.add_argument("--size", type=positive_int,
                    help="score at S×S (timm's test protocol): the eval graph rendered at S, the eval images "
                         "resized and center-cropped to it; nets with global pooling before the classifier "
                         "(default: the trained size, as trained)")
    sp.add_argument("--crop", type=number(0, 1, lo_open=True),
                    help="with --size: the crop fraction F (timm's crop_pct): resize the short side to "
                         "floor(S / F), keep the center S×S (default: the net's timm protocol, else 1)")
    sp.set_defaults(func=_eval)

    sp = _command(sub, "plot", help="draw a run's curves.png (train loss and the task's metric) from its metrics")
    sp.add_argument("run", help="a run directory")
    sp.set_defaults(func=_plot)

    sp = _command(sub, "summary", help="print a net's layers (kind, input → output shape, parameters) and totals")
    sp.add_argument("net", help="a zoo name or a .toml/.json spec")
    net_opts(sp)
    sp.set_defaults(func=_summary)

    sp = _command(sub, "import-weights", help="a torchvision or timm state dict as a run directory, mapped onto its "
                                              "zoo net by tensor name")
    sp.add_argument("source", metavar="SOURCE", help="torchvision:NAME or timm:NAME, e.g. torchvision:resnet18")
    sp.add_argument("file", help="the state dict: .safetensors, or .pth/.pt/.bin (read with torch, "
                                 "weights_only=True)")
    sp.add_argument("--out", required=True, help="the run directory written (refused if it holds a checkpoint); "
                                                 "a FILE.safetensors: the bare weights, for `train --init`")
    sp.add_argument("--input", type=_shape,
                    help="the net's input shape without batch, e.g. 3,64,64 (default: the net's own)")
    sp.add_argument("--data", help="the dataset the run evaluates and fine-tunes on (default: train's default); "
                                   "its class count must be the state dict's")
    sp.add_argument("--data-opt", dest="data_options", action="append", metavar="KEY=VALUE",
                    help="a dataset option, as train's (repeatable; default: none)")
    sp.add_argument("--backend", help="the run's backend (default: $HLOFORGE_BACKEND, else xla)")
    sp.set_defaults(func=_import_weights)

    sp = _command(sub, "export", help="a run's model out: its eval forward (StableHLO), weights and manifest, "
                                      "or a torchvision/timm state dict")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("--out", required=True, help="the directory written")
    sp.add_argument("--format", default="hloforge", choices=("hloforge", "torchvision", "timm"),
                    help="hloforge: forward.mlir, weights.safetensors, manifest.json; torchvision/timm: "
                         "model.safetensors, loadable with load_state_dict(strict=True)")
    sp.set_defaults(func=_export)

    sp = _command(sub, "verify", help="gate every registered (or each named) plugin against its oracles; "
                                      "exit 1 on any failure")
    sp.add_argument("names", nargs="*", metavar="NAME",
                    help="a plugin (conv2d, adam) or a distribution (default: every registered plugin)")
    sp.set_defaults(func=_verify)

    sp = _command(sub, "generate", help="sample text from a trained character language model run")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("--prompt", default="\n", help="the text the sample continues (default: a newline)")
    sp.add_argument("--tokens", type=nonneg_int, default=200, help="how many characters to sample")
    sp.add_argument("--temperature", type=nonneg_float, default=0.8, help="0: always the most likely character")
    sp.add_argument("--seed", type=nonneg_int, default=0, help="seeds the sampling")
    sp.add_argument("--backend", help="run on this backend (default: the one it trained on)")
    sp.set_defaults(func=_generate)

    sp = _command(sub, "cam", help="Grad-CAM heatmap of one image through a run's checkpoint")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("image", help="test:N (the N-th eval image) or a .npy array of the net's input shape")
    sp.add_argument("--out", default="cam.png", help="the PNG written")
    sp.add_argument("--class", dest="cls", type=nonneg_int, help="class to explain (default: the predicted one)")
    sp.set_defaults(func=_cam)

    sp = _command(sub, "detect", help="a detector run's boxes on one image, drawn to a PNG")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("image", nargs="?", help="a PNG/JPEG file (or give --index; default: none)")
    sp.add_argument("--index", type=nonneg_int, help="take test image N of the run's dataset instead of a file "
                                                     "(default: none)")
    sp.add_argument("--out", default="boxes.png", help="the PNG written")
    sp.add_argument("--score", type=probability, default=0.3, help="lowest score drawn")
    sp.add_argument("--backend", help="run on this backend (default: the one it trained on)")
    sp.set_defaults(func=_detect)

    sp = _command(sub, "compare", help="McNemar's exact test on two runs' eval bitmaps (a report: exit 0 either way)")
    sp.add_argument("run_a", help="a run directory (or its eval_correct.npz)")
    sp.add_argument("run_b", help="another run directory scored on the same eval set")
    sp.set_defaults(func=_compare)

    sp = _command(sub, "sample",
                  help="draw images from a DDPM run's checkpoint (ancestral sampling) as a PNG grid")
    sp.add_argument("run", help="a run directory or a checkpoint file")
    sp.add_argument("-n", type=positive_int, default=16, help="how many images")
    sp.add_argument("--out", default="grid.png", help="the PNG written")
    sp.add_argument("--seed", type=nonneg_int, default=0, help="seeds the sampling noise")
    sp.add_argument("--backend", help="run on this backend (default: the one it trained on)")
    sp.add_argument("--region", default="auto", choices=("live", "ema", "auto"),
                    help="live weights, the EMA shadow, or auto (default: the shadow when the run kept one)")
    sp.add_argument("--no-clip", dest="clip", action="store_false",
                    help="leave each step's predicted clean image unclipped (default: clip it to the data's range)")
    sp.set_defaults(func=_sample)
    prepare_parser(sub)
    sub.add_parser("bench", add_help=False, help="step time vs jax.jit and PyTorch (see `hloforge bench -h`)")
    return p


def _internal_error(e: BaseException) -> str:
    """Write the traceback to a file (under the cache root, else the temp dir); its path."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(e))
    name = f"traceback-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    try:
        from hloforge.backends.base import cache_root

        d = cache_root() / "tracebacks"
        d.mkdir(parents=True, exist_ok=True)
        path = str(d / name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except Exception:  # an unwritable cache (or one that cannot be imported): the temp dir
        fd, path = tempfile.mkstemp(prefix="hloforge-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    return path


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns its exit status (EXIT_CODES), --help's and a usage error's included."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get(DEBUG_ENV_VAR, "") not in ("", "0")
    try:
        if argv[:1] == ["bench"]:  # bench parses its own options, -h included
            from hloforge import bench

            return bench.main(argv[1:])
        p = parser()
        try:
            args = p.parse_args(argv)
        except SystemExit as e:  # a usage error (2), or -h / --version (0): argparse has printed it
            return e.code if isinstance(e.code, int) else EXIT_USAGE
        if args.command is None:  # a bare `hloforge`: the help, and nothing run
            p.print_help(sys.stderr)
            return EXIT_USAGE
        rc = args.func(args)  # a command may return its exit status (verify: 1 on a failed gate)
    except KeyboardInterrupt:
        print("hloforge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (HloforgeError, OSError) as e:  # a refusal, or a file the user named that cannot be read or written
        if getattr(e, "quiet", False):  # an MPI rank whose refusal another rank reports (hloforge.train.mpi)
            return EXIT_BAD_INPUT
        if debug:
            import traceback

            traceback.print_exc()
        print(f"hloforge: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError as e:  # a size asked for (a batch, an input shape) that does not fit, not a bug
        print(f"hloforge: error: out of host memory ({_one_line(e)}); ask for a smaller batch or input",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:
        if debug:
            import traceback

            traceback.print_exc()
            print(f"hloforge: internal error: {_one_line(e)}", file=sys.stderr)
        else:
            print(f"hloforge: internal error: {_one_line(e)} (a bug; the full traceback is in {_internal_error(e)}, "
                  f"or run with {DEBUG_ENV_VAR}=1)", file=sys.stderr)
        return EXIT_INTERNAL
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
