"""The `hloforge` command's parser: every subcommand and its flags (the Variant's from its fields)."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from hloforge.commands.argtypes import (
    IMAGE_OUT_SUFFIXES,
    MAX_DIFFUSION_STEPS,
    MAX_PROCESSES,
    _shape,
    finite_float,
    integer,
    nonneg_float,
    nonneg_int,
    number,
    path,
    plugin_name,
    positive_float,
    positive_int,
    probability,
    unit_open,
    variant_value,
)
from hloforge.commands.exits import EXIT_USAGE, exit_codes_text
from hloforge.commands.handlers import (
    _cam,
    _classify,
    _compare,
    _detect,
    _eval,
    _export,
    _generate,
    _import_weights,
    _plot,
    _plugins,
    _prepare,
    _render,
    _sample,
    _summary,
    _train,
    _verify,
)
from hloforge.core.regions import DEFAULT_REGION, REGIONS

DESCRIPTION = "The `hloforge` command."
IMAGE_OUT_HELP = f"the image written ({', '.join(IMAGE_OUT_SUFFIXES)})"  # cam, detect and sample's --out


def _region_flag(sp: argparse.ArgumentParser, auto_also: str = "") -> None:
    sp.add_argument("--region", default=DEFAULT_REGION, choices=REGIONS,
                    help="live weights, the EMA shadow, or auto (default: the shadow when the run kept "
                         f"one{auto_also})")


def _moved_data_flags(sp: argparse.ArgumentParser) -> None:
    """--data-dir and --data-file of a command that opens a run's dataset (`opening.open_checkpoint`)."""
    sp.add_argument("--data-dir", help="where the run's file-based dataset is now, when it moved (default: the "
                                       "path the run recorded); its test split must be the one the run scored",
                    type=path)
    sp.add_argument("--data-file", type=path, help="where the run's dataset file (text's corpus) is now, when it moved "
                                        "(default: the path the run recorded)")


def version() -> str:
    """The installed distribution's version (hloforge.__version__)."""
    import hloforge

    return str(hloforge.__version__)


# The out-of-memory advice (the cli's) of a command that takes no --batch: `smaller` in its defaults.
ONE_AT_A_TIME = "it runs one input at a time already: free memory, or run it where there is more"


class Parser(argparse.ArgumentParser):
    """A usage error is one line naming the flag and what it expects, and where the help is. A flag is taken
    only as spelled in full: argparse's prefixes read `eval RUN --batch 32` as `--batch-stats`."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} -h`)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but a flag the command does not take is its command's error, pointing at its help
        (argparse says it at the top, whose help lists no command's flags)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            said: argparse.ArgumentParser = self
            while True:  # down to the (sub)command given: `prepare imagenette`'s own flags
                subs = [a for a in said._actions if isinstance(a, argparse._SubParsersAction)]
                below = subs[0].choices.get(getattr(ns, subs[0].dest, None) or "") if subs else None
                if not isinstance(below, argparse.ArgumentParser):
                    break
                said = below
            extras = _late_positionals(said, ns, extras)
            if extras:
                said.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns


def _late_positionals(parser: argparse.ArgumentParser, ns: argparse.Namespace, extras: list[str]) -> list[str]:
    """`extras` less those that are an optional positional given after a flag (`detect RUN --score 0.1 IMAGE`),
    set on `ns`: argparse fills such a positional, empty, with the one before the flag, and calls it unrecognized."""
    unset = [a for a in parser._actions if not a.option_strings and a.nargs == "?" and getattr(ns, a.dest) is None]
    while extras and unset and not extras[0].startswith("-"):
        action = unset.pop(0)
        setattr(ns, action.dest, parser._get_values(action, [extras.pop(0)]))
    return extras


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


def prepare_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`hloforge prepare NAME SRC OUT [options]`, one subcommand per entry of PREPARERS."""
    from hloforge.datasets.prepare import PREPARERS

    sp = _command(sub, "prepare", help="build a dataset's binaries from its downloaded layout "
                                       f"({', '.join(sorted(PREPARERS))})")
    names = sp.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    for name, prep in sorted(PREPARERS.items()):
        q = _command(names, name, help=prep.help)
        q.add_argument("src", type=path, help="the downloaded layout to read")
        q.add_argument("out", type=path, help="the directory the binaries are written to")
        for o in prep.options:
            # The Option's least value is refused here, before SRC is read; the preparer checks the rest.
            kind = {int: integer() if o.lo is None else integer(o.lo), float: finite_float}.get(o.type, o.type)
            q.add_argument("--" + o.name.replace("_", "-"), dest=o.name, type=kind, default=o.default,
                           help=f"{o.help} (default {o.default})")
    sp.set_defaults(func=_prepare)

def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hloforge", description=DESCRIPTION, formatter_class=HelpFormatter, epilog=exit_codes_text())
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sp = _command(sub, "plugins", help="list every registered plugin: kind, name, distribution")
    sp.set_defaults(func=_plugins)

    sp = _command(sub, "render", help="write the forward, eval and train-step StableHLO of a net")
    sp.add_argument("net", help="a zoo name or a .toml/.json spec")
    sp.add_argument("--out", type=path, required=True, help="the directory the .mlir files are written to")
    sp.add_argument("--batch", type=positive_int, default=128, help="the modules' batch size")
    sp.add_argument("--data", help="pick the default loss as `train` does on this dataset (default: from the net's "
                                   "output alone)")
    net_opts(sp)
    variant_flags(sp)
    sp.set_defaults(func=_render)

    sp = _command(sub, "train", help="train a net (default: mnist-mlp on digits on XLA)")
    sp.add_argument("net", nargs="?", default=None, help="a zoo name or a .toml/.json spec (default mnist-mlp)")
    sp.add_argument("--net", dest="net_flag", metavar="NET",
                    help="the net, as a flag (the same as the positional net; default mnist-mlp)")
    sp.add_argument("--config", type=path,
                    help="a config.toml (e.g. a run's own); flags given here override it (default: none)")
    net_opts(sp)
    sp.add_argument("--data", help="a dataset plugin (`hloforge plugins` lists them)")
    sp.add_argument("--data-dir", help="where a file-based dataset reads from, e.g. mnist's IDX files (default: the "
                                       "dataset's own)", type=path)
    sp.add_argument("--data-file", type=path,
                    help="a file-based dataset's file (text: a UTF-8 corpus; default pydoc topics)")
    sp.add_argument("--data-opt", dest="data_options", action="append", metavar="KEY=VALUE",
                    help="a dataset option (repeatable; int, float, true/false or text), e.g. shapes: "
                         "--data-opt size=48 --data-opt noise=0; kept with the run for eval, detect and sample "
                         "(default: none)")
    sp.add_argument("--workers", type=integer(0, MAX_PROCESSES),
                    help="stream batches from N producer processes (default 0: in process)")
    sp.add_argument("--no-augment", dest="augment", action="store_const", const=False,
                    help="train without the dataset's augmentation (crops become centre crops)")
    sp.add_argument("--backend", type=plugin_name,
                    help="xla, iree or a backend plugin (default: $HLOFORGE_BACKEND, else xla)")
    sp.add_argument("--replicas", type=positive_int, help="data-parallel over N devices (XLA); --batch is the "
                                                          "global batch")
    sp.add_argument("--devices", type=integer(1, MAX_PROCESSES),
                    help="the XLA CPU client's device count (default: one per replica of --replicas, else 1)")
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
    sp.add_argument("--run-dir", type=path, help="the run directory (default: runs/<net>_<variant>_<backend>[_<tag>], "
                                      "a new _2, _3 ... if taken)")
    sp.add_argument("--tag", help="a suffix of the default run directory (default: none)")
    sp.add_argument("--resume", action="store_true",
                    help="continue the run directory's checkpoint, with its config.toml (a flag given replaces "
                         "its value)")
    sp.add_argument("--init", type=path, metavar="DIR_OR_FILE",
                    help="start a new run from these weights (a run directory, a checkpoint, an export directory "
                         "or a weights file), matched by name and shape; a new class count re-initialises the "
                         "head; fresh optimizer state (default: none, the net's own init)")
    sp.add_argument("--init-region", choices=REGIONS,
                    help="which of an hloforge run's weights --init takes: live, ema, or auto, the EMA shadow "
                         "where that run kept one: the weights `hloforge eval` scores")
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
    sp.add_argument("run", type=path, help="a run directory or a checkpoint file")
    sp.add_argument("--backend", type=plugin_name, help="score on this backend (default: the one it trained on)")
    _region_flag(sp)
    sp.add_argument("--replicas", type=positive_int, default=1,
                    help="score sharded over N devices (XLA; same result)")
    sp.add_argument("--devices", type=integer(1, MAX_PROCESSES),
                    help="the XLA CPU client's device count (default: one per replica of --replicas, else 1)")
    sp.add_argument("--batch", type=positive_int,
                    help="score in batches of N, where the run's batch does not fit the device; the scores are "
                         "the same (default: the run's training batch)")
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
    _moved_data_flags(sp)
    sp.set_defaults(func=_eval)

    sp = _command(sub, "plot", help="draw a run's curves.png (train loss and the task's metric) from its metrics")
    sp.add_argument("run", type=path, help="a run directory")
    sp.set_defaults(func=_plot)

    sp = _command(sub, "summary", help="print a net's layers (kind, input → output shape, parameters) and totals")
    sp.add_argument("net", help="a zoo name or a .toml/.json spec")
    net_opts(sp)
    sp.set_defaults(func=_summary)

    sp = _command(sub, "import-weights", help="a torchvision or timm state dict as a run directory, mapped onto its "
                                              "zoo net by tensor name")
    sp.add_argument("source", metavar="SOURCE", help="torchvision:NAME or timm:NAME, e.g. torchvision:resnet18")
    sp.add_argument("file", help="the state dict: .safetensors, or .pth/.pt/.bin/.pth.tar/.ckpt (read with torch, "
                                 "weights_only=True)", type=path)
    sp.add_argument("--out", required=True, help="the run directory written (refused if it holds a checkpoint); "
                                                 "a FILE.safetensors: the bare weights, for `train --init`", type=path)
    sp.add_argument("--input", type=_shape,
                    help="the net's input shape without batch, e.g. 3,64,64 (default: the net's own)")
    sp.add_argument("--data", help="the dataset the run evaluates and fine-tunes on (default: train's default); "
                                   "its class count must be the state dict's")
    sp.add_argument("--data-opt", dest="data_options", action="append", metavar="KEY=VALUE",
                    help="a dataset option, as train's (repeatable; default: none)")
    sp.add_argument("--data-dir", help="where the run's file-based dataset reads from, as train's (default: the "
                                       "dataset's own)", type=path)
    sp.add_argument("--data-file", type=path,
                    help="the run's file-based dataset's file, as train's (default: the dataset's own)")
    sp.add_argument("--backend", type=plugin_name, help="the run's backend (default: $HLOFORGE_BACKEND, else xla)")
    sp.set_defaults(func=_import_weights)

    sp = _command(sub, "export", help="a run's model out: its eval forward (StableHLO), weights and manifest, "
                                      "or a torchvision/timm state dict")
    sp.add_argument("run", type=path, help="a run directory or a checkpoint file")
    sp.add_argument("--out", type=path, required=True, help="the directory written")
    sp.add_argument("--format", default="hloforge", choices=("hloforge", "torchvision", "timm"),
                    help="hloforge: forward.mlir, weights.safetensors, manifest.json; torchvision/timm: "
                         "model.safetensors, loadable with load_state_dict(strict=True)")
    _region_flag(sp, ", the weights `hloforge eval` scores")
    sp.set_defaults(func=_export)

    sp = _command(sub, "verify", help="gate every registered (or each named) plugin against its oracles; "
                                      "exit 1 on any failure")
    sp.add_argument("names", nargs="*", metavar="NAME",
                    help="a plugin (conv2d, adam) or a distribution (default: every registered plugin)")
    sp.set_defaults(func=_verify)

    sp = _command(sub, "generate", help="sample text from a trained character language model run")
    sp.add_argument("run", type=path, help="a run directory or a checkpoint file")
    sp.add_argument("--prompt", default="\n", help="the text the sample continues (default: a newline)")
    sp.add_argument("--tokens", type=nonneg_int, default=200, help="how many characters to sample")
    sp.add_argument("--temperature", type=nonneg_float, default=0.8, help="0: always the most likely character")
    sp.add_argument("--seed", type=nonneg_int, default=0, help="seeds the sampling")
    sp.add_argument("--backend", type=plugin_name, help="run on this backend (default: the one it trained on)")
    _region_flag(sp, ", the weights `hloforge eval` scores")
    _moved_data_flags(sp)
    sp.set_defaults(func=_generate, smaller=ONE_AT_A_TIME)

    sp = _command(sub, "cam", help="Grad-CAM heatmap of one image through a run's checkpoint")
    sp.add_argument("run", type=path, help="a run directory or a checkpoint file")
    sp.add_argument("image", type=path, help="test:N (the N-th eval image) or a .npy array of the net's input shape")
    sp.add_argument("--out", type=path, default="cam.png", help=IMAGE_OUT_HELP)
    sp.add_argument("--class", dest="cls", type=nonneg_int, help="class to explain (default: the predicted one)")
    sp.add_argument("--backend", type=plugin_name, help="run on this backend (default: the one it trained on)")
    _region_flag(sp, ", the weights `hloforge eval` scores")
    _moved_data_flags(sp)
    sp.set_defaults(func=_cam, smaller=ONE_AT_A_TIME)

    sp = _command(sub, "detect", help="a detector run's boxes on one image, drawn to an image file")
    sp.add_argument("run", type=path, help="a run directory or a checkpoint file")
    sp.add_argument("image", type=path, nargs="?", help="a PNG/JPEG file (or give --index; default: none)")
    sp.add_argument("--index", type=nonneg_int, help="take test image N of the run's dataset instead of a file "
                                                     "(default: none)")
    sp.add_argument("--out", type=path, default="boxes.png", help=IMAGE_OUT_HELP)
    sp.add_argument("--score", type=probability, default=0.3, help="lowest score drawn")
    sp.add_argument("--backend", type=plugin_name, help="run on this backend (default: the one it trained on)")
    _region_flag(sp, ", the weights `hloforge eval` scores")
    _moved_data_flags(sp)
    sp.set_defaults(func=_detect, smaller=ONE_AT_A_TIME)

    sp = _command(sub, "classify", help="a classifier run's top classes for image files, with their probabilities")
    sp.add_argument("run", type=path, help="a run directory or a checkpoint file")
    sp.add_argument("images", type=path, nargs="+", metavar="IMAGE",
                    help="PNG/JPEG files, each read as the run's dataset reads its eval images (its files unread)")
    sp.add_argument("--top", type=positive_int, default=5, help="classes printed per image")
    sp.add_argument("--backend", type=plugin_name, help="run on this backend (default: the one it trained on)")
    _region_flag(sp, ", the weights `hloforge eval` scores")
    sp.set_defaults(func=_classify, smaller=ONE_AT_A_TIME)

    sp = _command(sub, "compare", help="McNemar's exact test on two runs' eval bitmaps (a report: exit 0 either way)")
    sp.add_argument("run_a", type=path, help="a run directory (or its eval_correct.npz)")
    sp.add_argument("run_b", type=path,
                    help="another run directory (or its eval_correct.npz), scored on the same eval set")
    _region_flag(sp, ", the weights `hloforge eval` scores")
    _moved_data_flags(sp)  # the EMA shadow is scored from the checkpoint, on the run's data
    sp.set_defaults(func=_compare, smaller="it scores at each run's training batch: free memory, or run it where "
                                         "there is more")

    sp = _command(sub, "sample",
                  help="draw images from a DDPM run's checkpoint (ancestral sampling) as a grid in an image file")
    sp.add_argument("run", type=path, help="a run directory or a checkpoint file")
    sp.add_argument("-n", type=positive_int, default=16, help="how many images")
    sp.add_argument("--out", type=path, default="grid.png", help=IMAGE_OUT_HELP)
    sp.add_argument("--seed", type=nonneg_int, default=0, help="seeds the sampling noise")
    sp.add_argument("--backend", type=plugin_name, help="run on this backend (default: the one it trained on)")
    _region_flag(sp)
    sp.add_argument("--no-clip", dest="clip", action="store_false",
                    help="leave each step's predicted clean image unclipped (default: clip it to the data's range)")
    _moved_data_flags(sp)
    sp.set_defaults(func=_sample, smaller="ask for fewer images (a smaller -n)")  # -n is its batch
    prepare_parser(sub)
    sub.add_parser("bench", add_help=False, help="step time vs jax.jit and PyTorch (see `hloforge bench -h`)")
    return p
