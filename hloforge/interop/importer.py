"""`hloforge import-weights`: a torchvision / timm state dict onto its zoo net, by tensor name
(hloforge.interop.torch_names), written as a run directory that eval, `train --resume` and every
command reading a checkpoint accept.

`.safetensors` are read with the safetensors library (no torch); `.pth` / `.pt` / `.bin` only through
`torch.load(weights_only=True)`, so a pickle that would run code is refused, never run; a training
script's checkpoint dict is read for the state dict in it (`CHECKPOINT_KEYS`). Every problem
(a tensor of the wrong shape, a missing one, an unused one) is reported together, and nothing is
written unless all of them fit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.slots import check_stats
from hloforge.core.spec import NetSpec
from hloforge.interop.torch_names import IGNORED_SUFFIXES, LAYOUTS, SOURCES, Family, Unit, units
from hloforge.train.checkpoint import PICKLED, SAFETENSORS, as_float32_weight, ends_in, read_weights_file, unwrapped
from hloforge.train.rundir import checked_path
from hloforge.zoo import get_net


def family(source: str) -> Family:
    if source not in SOURCES:
        raise UnsupportedSpec(f"unknown weights source {source!r}; expected one of {sorted(SOURCES)}")
    return SOURCES[source]


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """A state dict's tensors as float32 numpy arrays (integer buffers kept as they are)."""
    path = checked_path(path, "read_state_dict")  # a Path too
    if os.path.isdir(path):  # an export --format torchvision, a downloaded model's folder: the file in it is meant
        held = sorted(f for f in os.listdir(path) if ends_in(f, (SAFETENSORS, *PICKLED)))
        said = f" (it holds {', '.join(held[:3])}: pass the one you mean)" if held else ""
        raise DataError(f"weights file {path} is a directory; expected a state dict file (.safetensors, or "
                        f"torch.save's .pth){said}")
    if not os.path.isfile(path):
        raise DataError(f"weights file {path} does not exist")
    if os.path.getsize(path) == 0:  # torch.load and safetensors both fail on one with no message worth quoting
        raise DataError(f"weights file {path} is empty; expected a saved state dict")
    if ends_in(path, SAFETENSORS):
        return _not_ours(path, _not_empty(path, read_weights_file(path, "weights file")))
    if not ends_in(path, PICKLED):
        raise DataError(f"weights file {path}: expected a .safetensors file, or {'/'.join(PICKLED)} (needs torch)")
    try:
        import torch
    except ImportError:
        raise DataError(f"weights file {path} is a PyTorch pickle, and reading one needs torch (not installed); "
                        "save it as .safetensors instead") from None
    import pickle
    import warnings

    kind = _container(path)
    neither = (f"weights file {path} is not a PyTorch file: neither the zip archive torch.save writes nor a "
               "pickle; expected a saved state dict (.safetensors, or torch.save's .pth)")
    try:
        with warnings.catch_warnings(), _checkpoint_globals(torch):  # torch's warnings are no line of ours
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if kind is None:  # torch read it as a pickle for want of a zip archive; it is neither
            raise DataError(neither) from None
        if kind in ("pickle 4", "pickle 5") and "Unsupported operand" in str(e):  # its framing, not its content
            raise DataError(f"weights file {path} is a protocol-{kind[-1]} pickle, which torch's safe loader does "
                            "not read; save the state dict with torch.save's default "
                            "protocol, or as .safetensors") from None
        raise DataError(f"weights file {path}: refused, its pickle would run code or build objects other than "
                        f"tensors ({_unpickling_refusal(str(e))})") from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"weights file {path} cannot be read as a PyTorch state dict ({said})") from None
    except Exception:
        if kind is None:  # text torch's unpickler read as opcodes ("j": a memo lookup, a KeyError): no pickle at all
            raise DataError(neither) from None
        raise
    if not isinstance(obj, dict):
        raise DataError(f"weights file {path} holds a {type(obj).__name__}, not a state dict (a name → tensor dict)")
    obj = _inner_state_dict(path, obj)
    out: dict[str, np.ndarray] = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            raise DataError(f"weights file {path}: entry {k!r} is a {type(v).__name__}, not a tensor")
        v = v.detach().cpu()
        try:
            out[str(k)] = (v.float() if v.dtype == torch.bfloat16 else v).numpy()  # numpy has no bfloat16 of torch's
        except TypeError:  # nor a quantized, float8 or sparse tensor
            what = f"has dtype {v.dtype}" if v.layout == torch.strided else f"is a {v.layout} tensor"
            raise DataError(f"weights file {path}: entry {k!r} {what}, which numpy cannot hold; expected dense "
                            "float16, bfloat16, float32 or float64 tensors") from None
    return _not_empty(path, out)


def _not_empty(path: str, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`sd`, refused where it holds no tensor (`torch.save({}, f)`): said as that, not as every weight missing."""
    if not sd:
        raise DataError(f"weights file {path} holds an empty state dict; expected the net's tensors by name")
    return sd


def _not_ours(path: str, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`sd`, refused where its names are hloforge's own (param/…: a run's checkpoint, an export's weights, an
    import's weights file): said as that and where it goes, not as every torchvision/timm tensor missing."""
    if any(name.startswith("param/") for name in sd):
        raise DataError(f"weights file {path} holds hloforge's own weights (tensors named param/…), not a PyTorch "
                        "state dict; expected a torchvision/timm state dict (hloforge's own start a run as they are: "
                        f"`hloforge train NET --init {path}`)")
    return sd


def _checkpoint_globals(torch: Any) -> Any:
    """torch's safe loader, also taking what training scripts save beside the weights and builds nothing else:
    timm train.py's `args` (an argparse.Namespace, whose values are still checked) and numpy scalars (a best
    accuracy as np.float64). Each is data; a pickle that would run code is refused as before."""
    import argparse
    import contextlib

    allow = getattr(torch.serialization, "safe_globals", None)
    if allow is None:  # a torch before 2.5: its own allowlist alone
        return contextlib.nullcontext()
    scalar = np._core.multiarray.scalar if hasattr(np, "_core") else np.core.multiarray.scalar
    dtypes = [type(np.dtype(t)) for t in ("f8", "f4", "f2", "i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1", "?")]
    # numpy 1's pickles name the scalar numpy.core.multiarray.scalar, numpy 2's numpy._core.multiarray.scalar
    return allow([argparse.Namespace, scalar, (scalar, "numpy.core.multiarray.scalar"), np.dtype, *dtypes])


# where training scripts put the model's state dict in a checkpoint dict (Lightning and timm's train.py:
# "state_dict"; DeiT / torchvision's references: "model"); the first one present is taken, so a live model
# wins over an EMA copy saved beside it ("state_dict_ema", "model_ema")
CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model")


def _inner_state_dict(path: str, obj: dict[Any, Any]) -> dict[Any, Any]:
    """The state dict in a training checkpoint's dict (`CHECKPOINT_KEYS`), else `obj` itself; one DataError for a
    checkpoint dict that holds none there."""
    key = next((k for k in CHECKPOINT_KEYS if isinstance(obj.get(k), dict)), None)
    if key is not None:
        return dict(obj[key])
    nested = [str(k) for k, v in obj.items() if isinstance(v, dict)]
    if nested:
        raise DataError(f"weights file {path} is a checkpoint dict (keys {sorted(map(str, obj))[:8]}) with no state "
                        f"dict under {' / '.join(map(repr, CHECKPOINT_KEYS))}; save the one you mean alone: "
                        f"torch.save(ckpt[{nested[0]!r}], FILE)")
    return obj


def _container(path: str) -> str | None:
    """What a .pth's first bytes say it is: "zip" (torch.save's archive), "pickle N" (a pickle of protocol N,
    as the legacy format and pickle.dump write), or None: neither."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":
        return "zip"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # PROTO, then the protocol
        return f"pickle {head[1]}"
    return None


MODEL_MODULES = ("torch.nn.", "torchvision.models.", "timm.models.")  # where a pickled model's classes live


def _unpickling_refusal(text: str) -> str:
    """What torch.load(weights_only=True) refused, in a clause: the class the pickle builds (a whole model
    saved with torch.save(model) builds its nn.Module), else its own reason; never its advice to load with
    weights_only=False, which would run the file's code."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    built = re.search(r"GLOBAL ([\w.]+)", text)
    if built and built.group(1).startswith(MODEL_MODULES):  # a module of torch's or a zoo's: the model itself
        return (f"it builds a {built.group(1)}: a whole model saved with torch.save(model)? save its "
                "state_dict() instead")
    if built and built.group(1).startswith("numpy."):  # its scalars are allowed: arrays, saved in place of tensors
        return (f"it builds numpy arrays ({built.group(1)}), not tensors: save torch.from_numpy(a) for each, or "
                "write the arrays with safetensors.numpy.save_file as FILE.safetensors")
    if built and built.group(1).rpartition(".")[2][:1].isupper():  # a class, by Python's naming
        return (f"it builds a {built.group(1)}: a whole model saved with torch.save(model), or an object a training "
                "script saved beside the weights (its config)? save the state dict alone (model.state_dict(), or "
                "the checkpoint's own: torch.save(ckpt['state_dict'], FILE))")
    if built:
        return f"it calls {built.group(1)}"
    reason = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    return f"torch's safe loader: {reason.group(1).strip() if reason else 'refused'}"


@attrs.frozen
class Imported:
    """A state dict mapped onto its zoo net: θ and the BatchNorm running statistics in the net's order."""

    source: str
    spec: NetSpec
    params: list[np.ndarray]
    stats: list[np.ndarray]


def _entry(tables: Mapping[str, Unit], name: str) -> tuple[str, str] | None:
    unit, _, suffix = name.rpartition(".")
    return tables.get(unit, {}).get(suffix)


def head_classes(fam: Family, spec: NetSpec, sd: Mapping[str, np.ndarray]) -> int | None:
    """The class count the state dict's classifier has (None when it has none)."""
    tables = fam.table(spec)
    last = [u for u in units(spec) if int(u.split(".")[0]) == len(spec.layers) - 1]
    e = _entry(tables, f"{last[-1]}.b") if last else None
    if e is not None and e[0] in sd and np.ndim(sd[e[0]]) == 1:
        return int(np.shape(sd[e[0]])[0])
    return None


def map_state_dict(source: str, sd: Mapping[str, np.ndarray], *, input: Sequence[int] | None = None,
                   where: str = "the state dict") -> Imported:
    """`sd` onto the zoo net of `source` (its classes read off the classifier; a wrapper's `module.` or
    `_orig_mod.` prefix on every name dropped). Raises one DataError
    listing every tensor that does not fit, every missing one and every unused one."""
    fam = family(source)
    spec = get_net(fam.net, input=input)
    sd = _unprefixed(unwrapped(sd), source_names(source), where)
    classes = head_classes(fam, spec, sd)
    if classes is not None and classes != spec.num_classes:
        spec = get_net(fam.net, classes=classes, input=input)
    tables = fam.table(spec)
    used: set[str] = set()
    bad: list[str] = []
    wrong: list[str] = []  # of a dtype or values no float32 weight has
    missing: list[str] = []
    out: dict[str, list[np.ndarray]] = {"param": [], "stat": []}
    for kind, slots in (("param", spec.params()), ("stat", spec.stats())):
        for name, slot in slots:
            e = _entry(tables, name)
            if e is None:
                raise HloforgeError(f"{source}: no table entry for zoo tensor {kind}/{name} (a gap in torch_names)")
            src, layout = e
            lay = LAYOUTS[layout]
            want = tuple(lay.source_shape(tuple(slot.shape)))
            if src not in sd:
                missing.append(f"{src} (for {kind}/{name} {list(slot.shape)})")
                continue
            used.add(src)
            got = tuple(np.shape(sd[src]))
            if got != want:
                bad.append(f"{src} has shape {list(got)}, but {kind}/{name} needs {list(want)} "
                           f"(stored as {list(slot.shape)})")
                continue
            a = as_float32_weight(np.asarray(sd[src]))
            if isinstance(a, str):
                wrong.append(f"{src} {a}")
                continue
            out[kind].append(np.ascontiguousarray(lay.to_zoo(a, tuple(slot.shape))))
    unused = [k for k in sd if k not in used and not k.endswith(IGNORED_SUFFIXES)]
    lines = ([f"shape: {b}" for b in bad] + [f"value: {w}" for w in wrong] + [f"missing: {m}" for m in missing]
             + [f"unused: {u} {list(np.shape(sd[u]))}" for u in unused])
    if lines:
        other = [s for s in SOURCES if s != source and source_names(s) == _names(sd)]
        said = f"; its names are those of {other[0]}: pass that SOURCE" if other else ""
        shown = lines[:MAX_LISTED] + ([f"... and {len(lines) - MAX_LISTED} more"] if len(lines) > MAX_LISTED else [])
        raise DataError(f"{where} does not fit {source} (zoo net {spec.name!r}), {len(lines)} problem(s){said}; "
                        "nothing written:\n  " + "\n  ".join(shown))
    check_stats(spec.stats(), out["stat"], where)
    return Imported(source, spec, out["param"], out["stat"])


MAX_LISTED = 12  # problems listed under a refusal; the rest are counted


def source_names(source: str) -> set[str]:
    """The tensor names of `source`'s state dict (less the ignored buffers)."""
    fam = family(source)
    spec = get_net(fam.net)
    tables = fam.table(spec)
    return {e[0] for name, _ in [*spec.params(), *spec.stats()] if (e := _entry(tables, name)) is not None}


def _names(sd: Mapping[str, Any]) -> set[str]:
    return {k for k in sd if not k.endswith(IGNORED_SUFFIXES)}


def _unprefixed(sd: Mapping[str, np.ndarray], expected: set[str], where: str) -> Mapping[str, np.ndarray]:
    """`sd` without the attribute prefix the net's names sit under (`model.` from a Lightning module holding the
    net as `self.model`), when no name matches as it is and the names under one prefix alone do; a name under
    another (a loss's class weights, `criterion.weight`) is kept as it is, to be listed as unused. The net
    under two (a module holding it and an EMA copy, `model.` and `ema_model.`) is refused: which is meant?"""
    while sd and not _names(sd) & expected:
        heads = {k.partition(".")[0] for k in sd if "." in k}
        fits = sorted(h for h in heads if _names(_under(sd, h)) & expected)
        if len(fits) > 1:
            raise DataError(f"{where} holds the net under {len(fits)} prefixes ({', '.join(f + '.' for f in fits)}: "
                            "a module holding it and a copy, an EMA's say); expected one: save the state dict "
                            f"under the one you mean alone ({{k[len('{fits[0]}.'):]: v for k, v in sd.items() if "
                            f"k.startswith('{fits[0]}.')}})")
        if not fits:
            break
        sd = {**{k: v for k, v in sd.items() if not k.startswith(f"{fits[0]}.")}, **_under(sd, fits[0])}
    return sd


def _under(sd: Mapping[str, np.ndarray], head: str) -> dict[str, np.ndarray]:
    """The names of `sd` under attribute `head`, without it."""
    return {k[len(head) + 1:]: v for k, v in sd.items() if k.startswith(f"{head}.")}


def write_run(imp: Imported, out: str, *, data: str = "", data_options: Sequence[str] = (), data_dir: str = "",
              data_file: str = "", backend: str = "", log: Callable[[str], None] = print) -> str:
    """A run directory at `out` (config.toml and an epoch-0 checkpoint, written by the trainer's own
    functions) holding the imported weights; its path. The run's config must fit (dataset, classes):
    the run is rebuilt, as eval rebuilds it, before anything is written."""
    from hloforge.core.registry import default_registry
    from hloforge.interop.exporter import write_whole
    from hloforge.train import checkpoint as ckpt
    from hloforge.train.rundir import check_own_files
    from hloforge.train.tasks import ClassCountMismatch
    from hloforge.train.trainer import CHECKPOINT, CONFIG, Run, TrainConfig

    path = os.path.join(out, CHECKPOINT)
    if os.path.exists(path):
        raise HloforgeError(f"run directory {out} already holds a checkpoint; pick another --out")
    check_own_files(out, "--out", "the run written there", "pick another --out")  # before the run is built
    fam = family(imp.source)
    given: dict[str, Any] = {"net": fam.net, "classes": imp.spec.num_classes, "input": imp.spec.input_shape,
                             "run_dir": out, "data_options": tuple(data_options)}
    if data:
        given["data"] = data
    given.update({k: v for k, v in (("data_dir", data_dir), ("data_file", data_file), ("backend", backend)) if v})
    try:
        run = Run(TrainConfig(**given), log=log, progress=False)
    except DataError as e:
        import shlex  # the advised command carries the data flags given, quoted as a shell reads them

        data_flags = [*(["--data", data] if data else []), *(w for o in data_options for w in ("--data-opt", o)),
                      *(w for f, v in (("--data-dir", data_dir), ("--data-file", data_file)) if v for w in (f, v))]
        net_flags = [*(["--classes", str(e.classes)] if isinstance(e, ClassCountMismatch) and e.classes else []),
                     *(["--input", ",".join(map(str, imp.spec.input_shape))]
                       if imp.spec.input_shape != get_net(fam.net).input_shape else [])]
        train = shlex.join(["hloforge", "train", fam.net, "--init", "FILE.safetensors", *net_flags, *data_flags])
        # the trainer's advice (--classes) is train's, not import-weights'
        said = f"{e.stated} (the state dict's head)" if isinstance(e, ClassCountMismatch) else str(e)
        if not data:  # a dataset the user never named: say it is the default, and how to do without one
            default = attrs.fields(TrainConfig).data.default
            raise DataError(f"{said}; --out {out} is a run directory, scored on a dataset, and no --data was given "
                            f"({default!r} is train's default): expected --data NAME that fits the state dict, or "
                            f"--out FILE.safetensors for the weights alone (`{train}` starts a run from them)"
                            ) from None
        if not isinstance(e, ClassCountMismatch):
            raise
        raise DataError(f"{said}; to fine-tune on this dataset, write the weights alone "
                        f"(--out FILE.safetensors) and start a run from them: `{train}` re-initialises the head "
                        "for the dataset's classes") from None
    if run.spec != imp.spec:
        raise UnsupportedSpec(f"{imp.source}: the run's net differs from the imported one (a variant that changes "
                              "the net, e.g. dropout or BN eps, is not imported)")
    lay = run.state_layout
    opt = run.variant.make_optimizer(default_registry())
    slots = [s for _, s in run.spec.params()]
    names = ckpt.tensor_names([n for n, _ in run.spec.params()], lay.slots, run.stat_names, shadow_stats=lay.shadows)
    tensors = [*imp.params, *lay.initial(opt, slots, imp.params), *imp.stats,
               *([s.copy() for s in imp.stats] if lay.shadows else [])]
    meta = {**run.meta(0, 0), "imported": {"source": imp.source}}
    # both or neither: a config.toml alone (a full disk at the checkpoint) is no run, and was no --resume's
    write_whole(out, [(path, ckpt.serialize(names, tensors, meta), "checkpoint"),
                      (os.path.join(out, CONFIG), run.cfg.to_toml().encode(), "run config")],
                then="free space and import again")
    return out


def write_weights(imp: Imported, out: str) -> str:
    """A bare weights file at `out` (`param/…`, `stat/…`; the spec and class count in its metadata): what
    `train --init` starts a run from when no dataset has the imported head's classes (an ImageNet head)."""
    import json

    from safetensors.numpy import save

    from hloforge.core.paths import new_dirs
    from hloforge.train.checkpoint import write_atomic

    if os.path.exists(out):
        raise HloforgeError(f"{out} already exists; pick another --out")
    names = [f"param/{n}" for n, _ in imp.spec.params()] + [f"stat/{n}" for n, _ in imp.spec.stats()]
    blob = save(dict(zip(names, [*imp.params, *imp.stats], strict=True)),
                metadata={"source": imp.source, "classes": str(imp.spec.num_classes),
                          "spec": json.dumps(imp.spec.to_dict(), sort_keys=True)})
    with new_dirs(os.path.dirname(os.path.abspath(out)), "--out's directory"):
        write_atomic(out, blob, "weights file", then="pass an --out this user can write, with room for it")
    return out


_FLAGS = {"data": "data", "data_options": "data-opt", "data_dir": "data-dir", "data_file": "data-file",
          "backend": "backend"}  # import_weights's keywords as flags


def import_weights(source: str, file: str, out: str, *, input: Sequence[int] | None = None, data: str = "",
                   data_options: Sequence[str] | Mapping[str, Any] = (), data_dir: str = "", data_file: str = "",
                   backend: str = "", log: Callable[[str], None] = print) -> str:
    """`source` ("torchvision:resnet18", "timm:vit_tiny_patch16_224", ...) weights in `file` as a run
    directory at `out`; returns its path. `input` overrides the net's input shape (C, H, W), `data`
    / `data_options` / `data_dir` / `data_file` the dataset the run evaluates on (default: the trainer's; its
    options a mapping, as Model.fit takes them, or "KEY=VALUE" items). An `out` ending in
    .safetensors (in any case) is a bare weights file instead (`write_weights`: no run, no dataset)."""
    family(source)
    if input is not None and (isinstance(input, str) or not isinstance(input, (Sequence, np.ndarray))):
        raise UnsupportedSpec(f"import_weights input is {input!r}; expected the net's input shape without the batch, "
                              "a sequence of positive integers such as (3, 64, 64)")
    if isinstance(data_options, str):  # its characters would each be read as an option
        raise UnsupportedSpec(f"import_weights data_options is a str ({data_options!r}); expected a mapping of option "
                              "names to values, as Model.fit takes, or a sequence of 'KEY=VALUE' items")
    if isinstance(data_options, Mapping):  # Model.fit's form
        data_options = tuple(f"{k}={v}" for k, v in data_options.items())
    file, out = checked_path(file, "import_weights file"), checked_path(out, "import_weights out")  # a Path too
    if ends_in(out, SAFETENSORS):  # a bare weights file has no run to evaluate on a dataset or backend
        run_only = [n for n, v in (("data", data), ("data_options", data_options), ("data_dir", data_dir),
                                   ("data_file", data_file), ("backend", backend)) if v]
        if run_only:
            raise UnsupportedSpec(f"{out}: a .safetensors out is the bare weights, which name no dataset or backend, "
                                  f"so {' / '.join(run_only)} (--{' / --'.join(_FLAGS[n] for n in run_only)}) would "
                                  "be dropped; expected them left out, or an out directory for a run")
    imp = map_state_dict(source, read_state_dict(file), input=input, where=f"weights file {file}")
    if ends_in(out, SAFETENSORS):
        write_weights(imp, out)
    else:
        write_run(imp, out, data=data, data_options=data_options, data_dir=data_dir, data_file=data_file,
                  backend=backend, log=log)
    log(f"imported {source} from {file}: {imp.spec.name} ({imp.spec.param_count():,} params, "
        f"{imp.spec.num_classes} classes, {len(imp.stats)} BatchNorm statistics) -> {out}")
    return out
