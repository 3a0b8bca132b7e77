"""What each `hloforge` subcommand does with its parsed flags (the parser, commands/options.py, names
them by `set_defaults(func=...)`), and the flags read as a Variant's or a TrainConfig's fields."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from hloforge.commands.exits import EXIT_FAILED, EXIT_OK
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec

if TYPE_CHECKING:
    from hloforge.train.config import RunRecord
    from hloforge.train.trainer import TrainConfig


def _plugins(args: argparse.Namespace) -> None:
    import warnings

    from hloforge.core.registry import NameClash, PluginLoadWarning, Registry, default_registry

    try:
        reg = default_registry()
    except NameClash:
        # Every other command refuses a name two plugins claim; this one is where a user finds which
        # distribution to uninstall, so it lists what is installed and the clash. (Broken plugins
        # were warned about by the first attempt, and are rows below.)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PluginLoadWarning)
            reg = Registry(keep_clashes=True)
    rows = [(e.kind, e.name, e.distribution) for e in reg.entries()]
    # A plugin that failed to load: its entry-point name, its distribution and why (see Registry.broken).
    rows += [("broken", b.name, f"{b.distribution}  {b.error}") for b in reg.broken]
    rows += [("clash", c.second.name, f"{c.second.distribution}  {c.message}; other commands refuse to run "
                                      "until one of them is uninstalled") for c in reg.clashes]
    w = max(len(r[1]) for r in rows)
    for kind, name, dist in rows:
        print(f"{kind:10} {name:{w}}  {dist}")


def _render(args: argparse.Namespace) -> None:
    import json

    from hloforge.commands import manifest
    from hloforge.core.modules import forward_input_roles, forward_module, train_step_module
    from hloforge.core.registry import hloforge_version
    from hloforge.core.variant import Variant
    from hloforge.train.checkpoint import VERSION
    from hloforge.train.tasks import default_loss
    from hloforge.zoo import get_net

    spec = get_net(args.net, args.classes, args.input)
    loss = args.loss or default_loss(spec, args.data)  # the loss `train` picks (a DDPM's mse, an LM's, a mask's)
    variant = Variant(**{**given(args, Variant), "loss": loss})
    spec = variant.apply_to(spec)  # the eval graph at the variant's BN ε
    t = time.perf_counter()
    eps = variant.eval_suffix
    step, layout = train_step_module(spec, variant, args.batch)
    files = {
        f"{spec.ident}_fwd{eps}.mlir": forward_module(spec, args.batch),
        f"{spec.ident}_fwd_eval{eps}.mlir": forward_module(spec, args.batch, eval_mode=True),
        f"{spec.ident}_{variant.slug}_train_step.mlir": step,
    }
    secs = time.perf_counter() - t
    about = {"net": spec.name, "batch": args.batch, VERSION: hloforge_version()}  # each module: its renderer
    modules = {name: {**about, **manifest.describe(text, forward_input_roles(spec, eval_mode), [("out", "")])}
               for name, text, eval_mode in zip(files, files.values(), (False, True), strict=False)}
    modules[next(reversed(files))] = {**about, "variant": variant.slug, "schedule": list(layout.scalars),
                                      **manifest.describe(step, layout.input_roles(), layout.output_roles())}
    from hloforge.core.paths import make_dir
    from hloforge.train.checkpoint import write_atomic

    make_dir(args.out, "--out")  # only once every module rendered: a refused net writes nothing
    listed = manifest.merged(os.path.join(args.out, manifest.MANIFEST), modules)
    # each file written aside and renamed, the manifest last: a full disk leaves every file whole, said in one line
    for name, text in [*files.items(), (manifest.MANIFEST, json.dumps(listed, indent=1) + "\n")]:
        write_atomic(os.path.join(args.out, name), text.encode(), "module" if name.endswith(".mlir") else "manifest",
                     then="free space and render again")
        print(os.path.join(args.out, name))
    print(f"rendered {spec.name} ({spec.param_count():,} params, batch {args.batch}) in {secs:.2f}s", file=sys.stderr)


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The flags set on the command line that are fields of the attrs class `cls` (a flag's dest is its
    field's name): unset ones (None) are left to the class's defaults, or to --config's file."""
    import attrs

    return {f.name: getattr(args, f.name) for f in attrs.fields(cls) if getattr(args, f.name, None) is not None}


def train_flags(args: argparse.Namespace) -> dict[str, Any]:
    """`hloforge train`'s flags that set a TrainConfig field (the net given as an argument or --net)."""
    from hloforge.train.config import TrainConfig

    if args.net_flag:
        if args.net and args.net != args.net_flag:
            raise UnsupportedSpec(f"two nets given: {args.net!r} and --net {args.net_flag!r}")
        args.net = args.net_flag
    if args.tag is not None and args.run_dir is not None:  # --run-dir names the directory whole: no tag ends it
        raise UnsupportedSpec(f"--tag {args.tag!r} ends the default run directory's name (runs/<net>_<variant>_"
                              f"<backend>_<tag>), which --run-dir {args.run_dir} replaces, so the tag would be "
                              "dropped; give one of them")
    return given(args, TrainConfig)


def train_config(args: argparse.Namespace, record: RunRecord | None = None) -> TrainConfig:
    """`hloforge train`'s parsed flags as the run's config: over --config's file when given, else on
    --resume over the run's own config.toml (`record`: as rank 0 read it, under MPI)."""
    from hloforge.train.config import resumed_config
    from hloforge.train.trainer import TrainConfig, load_config

    flags = train_flags(args)
    if args.config:
        return load_config(args.config, **flags)
    return resumed_config(TrainConfig(**flags), flags, record) if args.resume else TrainConfig(**flags)


def _launch(args: argparse.Namespace) -> tuple[Any, Any]:
    """Under a launch across processes (mpiexec): its world, made before any option is checked so that a
    refusal on any rank is met by every rank (mpi.refuse_together), and what rank 0 alone read of the run
    directory --resume continues (config.RunRecord, or its refusal), given to every rank: the run directory
    need only be on rank 0's machine. (None, None) in one process, which reads its own."""
    from hloforge.core.launcher import launched

    if launched()[1] == 1:
        return None, None
    from hloforge.train import mpi
    from hloforge.train.config import TrainConfig, run_record

    world = mpi.world()
    record: Any = None
    if world.is_root and args.resume and not args.config:
        try:
            record = run_record(TrainConfig(**train_flags(args)))
        except HloforgeError as e:
            record = e
    return world, world.bcast(record, "the resumed run's config", slow=True)


def _train(args: argparse.Namespace) -> None:
    from hloforge.train.trainer import train

    world, record = _launch(args)
    failed = None
    try:
        if isinstance(record, HloforgeError):
            raise record
        cfg, callbacks, spec = _train_options(args, record)
    except HloforgeError as e:
        failed = e
    if world is not None:
        from hloforge.train.mpi import refuse_together

        refuse_together(world, failed)
    elif failed is not None:
        raise failed
    try:
        train(cfg, resume=args.resume, cross_backend=args.cross_backend, spec=spec, progress=not args.no_progress,
              callbacks=callbacks)
    except DataError as e:
        from hloforge.commands.opening import moved_data_hint

        hint = moved_data_hint(cfg) if args.resume else ""  # a resumed run's data may have moved since
        if not hint:
            raise
        raise type(e)(f"{e}{hint}") from None


def _train_options(args: argparse.Namespace, record: RunRecord | None) -> tuple[TrainConfig, list[Any], Any]:
    """`hloforge train`'s options checked and made the run's config, callbacks and (for --config of a run)
    spec, before anything is read, compiled or written."""
    from hloforge.callbacks import from_items

    if args.init is not None and args.resume:
        raise UnsupportedSpec("--init starts a new run from other weights, --resume continues this run's own "
                              "checkpoint; give one of them")
    if args.cross_backend and not args.resume:  # a flag that would do nothing is a mistake said, not dropped
        raise UnsupportedSpec("--cross-backend lets --resume continue another backend's checkpoint; without "
                              "--resume it does nothing")
    callbacks = from_items(args.callback or ())  # refused before anything trains or is written
    cfg = train_config(args, record)
    decay = [f"--{f.replace('_', '-')}" for f in ("decay_rate", "decay_epochs") if getattr(args, f) is not None]
    if decay and cfg.schedule != "exp":  # the exp schedule's alone: under another they were taken unsaid
        raise UnsupportedSpec(f"{' and '.join(decay)} set the exp schedule's decay, but the run's schedule is "
                              f"{cfg.schedule!r}; expected --schedule exp with them, or neither")
    schedule = [f"--{f.replace('_', '-')}" for f in ("diffusion_steps", "beta_start", "beta_end")
                if getattr(args, f) is not None]
    if schedule:
        from hloforge.train.diffusion import is_time_conditioned
        from hloforge.zoo import get_net

        if not is_time_conditioned(net := get_net(cfg.net, cfg.classes, cfg.input)):
            raise UnsupportedSpec(f"{' and '.join(schedule)} set a DDPM's noise schedule; net {net.name!r} is no "
                                  "DDPM (no layer reads the time channel)")
    from hloforge.train.rundir import config_spec

    spec = config_spec(args.config, cfg) if args.config and not args.resume and not args.net else None
    return cfg, callbacks, spec


def _plot(args: argparse.Namespace) -> None:
    from hloforge.train import curves

    print(curves.plot_run(args.run))


def _eval(args: argparse.Namespace) -> None:
    from hloforge.commands.opening import evaluate_checkpoint

    evaluate_checkpoint(args.run, backend=args.backend, region=args.region, replicas=args.replicas,
                        devices=args.devices, batch_stats=args.batch_stats, size=args.size, crop=args.crop,
                        data_dir=args.data_dir, data_file=args.data_file, batch=args.batch)


def _summary(args: argparse.Namespace) -> None:
    from hloforge.core.spec import summary_table
    from hloforge.zoo import get_net

    print(summary_table(get_net(args.net, args.classes, args.input)))


def _import_weights(args: argparse.Namespace) -> None:
    from hloforge.interop import import_weights

    import_weights(args.source, args.file, args.out, input=args.input, data=args.data or "",
                   data_options=args.data_options or (), data_dir=args.data_dir or "",
                   data_file=args.data_file or "", backend=args.backend or "")


def _export(args: argparse.Namespace) -> None:
    from hloforge.interop.exporter import export_run

    export_run(args.run, args.out, args.format, region=args.region)


def _verify(args: argparse.Namespace) -> int:
    from hloforge.testing.verify import verify

    return EXIT_FAILED if verify(args.names) else EXIT_OK


def _generate(args: argparse.Namespace) -> None:
    from hloforge.commands.generate import generate

    generate(args.run, args.prompt, args.tokens, args.temperature, args.seed, args.backend,
             out=lambda s: print(s, end="", flush=True), data_dir=args.data_dir, data_file=args.data_file,
             region=args.region)
    print()


def _cam(args: argparse.Namespace) -> None:
    from hloforge.commands.cam import cam_run

    cam_run(args.run, args.image, args.out, args.cls, data_dir=args.data_dir, data_file=args.data_file,
            backend=args.backend, region=args.region)


def _prepare(args: argparse.Namespace) -> None:
    from hloforge.datasets.prepare import PREPARERS, prepare

    opts = {o.name: getattr(args, o.name) for o in PREPARERS[args.dataset].options}
    summary = prepare(args.dataset, args.src, args.out, **opts)
    written = ", ".join(f"{os.path.join(args.out, f)} ({n} records)" for f, n in summary["records"].items())
    print(f"prepared {args.dataset}: {written}")
    for line in summary.get("warnings", ()):  # e.g. the images that could not be decoded, per split
        print(f"  {line}")
    if summary.get("data_options"):  # files the dataset's defaults would misread (another size)
        opts_line = " ".join(f"--data-opt {o}" for o in summary["data_options"])
        print(f"  train on them with: --data {args.dataset} --data-dir {args.out} {opts_line}")


def _detect(args: argparse.Namespace) -> None:
    from hloforge.commands.detect import detect_run

    detect_run(args.run, args.image, args.out, index=args.index, score_min=args.score, backend=args.backend,
               data_dir=args.data_dir, data_file=args.data_file, region=args.region)


def _classify(args: argparse.Namespace) -> None:
    from hloforge.commands.classify import classify_run

    classify_run(args.run, args.images, args.top, backend=args.backend, region=args.region)


def _compare(args: argparse.Namespace) -> None:
    import numpy as np

    from hloforge.commands.opening import evaluate_checkpoint
    from hloforge.train.compare import compare_runs

    def score(run_dir: str, region: str) -> np.ndarray:  # as `hloforge eval --region REGION` scores it
        res = evaluate_checkpoint(run_dir, region=region, log=lambda s: None, data_dir=args.data_dir,
                                  data_file=args.data_file)
        if getattr(res, "correct", None) is None:
            raise DataError(f"{run_dir}: its {region} weights' eval gives no per-example results to compare"
                            + ("; use --region live" if region == "ema" else ""))
        return np.asarray(res.correct, bool)

    compare_runs(args.run_a, args.run_b, region=args.region, score=score)


def _sample(args: argparse.Namespace) -> None:
    from hloforge.commands.sample import sample_run

    sample_run(args.run, args.n, args.out, args.seed, args.backend, args.region, args.clip,
               data_dir=args.data_dir, data_file=args.data_file)
