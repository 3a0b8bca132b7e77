"""`hloforge train NET --init DIR_OR_FILE`: a new run that starts from other weights.

The init is a run directory (`hloforge train`, `hloforge import-weights`, `Model.save`), a checkpoint
file, an export directory (`hloforge export`: weights.safetensors and manifest.json) or a bare weights
file of `param/…` and `stat/…` tensors (a `module.` / `_orig_mod.` prefix on every name dropped). θ and
the BatchNorm running statistics are taken, every tensor matched by name and shape (half, bfloat16 and
double ones read as float32); the optimizer state is not (it starts at step 0, as any new run's). Of a run
that kept an EMA shadow, the shadow's weights and statistics are θ and the statistics taken, the weights
`hloforge eval` scores (`init_region`, --init-region: auto, live or ema); the new run's own shadow, if it
keeps one, starts at that θ. When the run's class count differs from the init's (as
its metadata or export manifest states it, else as its head's shapes give it), the head (the last layer
with parameters) is re-initialised by the net's own rule at the run's seed, and the log says so. Anything
else that does not fit is one line, read before anything is written; a file that is no safetensors (an
.npz, a PyTorch pickle) is named as what it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from hloforge.core.errors import DataError, HloforgeError
from hloforge.core.slots import check_stats
from hloforge.core.switches import whole_number
from hloforge.core.variant import SHADOW, Variant, covers
from hloforge.train import checkpoint as ckpt
from hloforge.train.arraydata import check_names
from hloforge.train.config import CHECKPOINT

if TYPE_CHECKING:
    from hloforge.train.session import TrainSession

Run = Any  # hloforge.train.trainer.Run, which imports this module

EXPORT_WEIGHTS, EXPORT_MANIFEST = "weights.safetensors", "manifest.json"  # what `hloforge export` writes
EXPORT_FORMAT = "hloforge-export-1"  # its manifest's "format": what this hloforge writes and reads
EXPORT_TORCH_WEIGHTS = "model.safetensors"  # `hloforge export --format torchvision|timm`'s state dict


@attrs.frozen
class Init:
    """The weights a run starts from, in the run's parameter and statistics order."""

    path: str
    params: list[np.ndarray]
    stats: list[np.ndarray]
    reinit: tuple[str, ...]  # the head's tensors re-initialised (a new class count), else ()


def _read(path: str, region: str) -> tuple[str, dict[str, np.ndarray], int | None, str, str]:
    """(the file read, its tensors, the class count it was trained for when it says, the region of an
    hloforge checkpoint's weights taken: `_in_region`; "" for another file, the net it holds the weights of
    when it says; else "")."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, CHECKPOINT)):
            path = os.path.join(path, CHECKPOINT)
        elif os.path.exists(os.path.join(path, EXPORT_WEIGHTS)):
            path = os.path.join(path, EXPORT_WEIGHTS)
        else:
            torch_sd = os.path.join(path, EXPORT_TORCH_WEIGHTS)
            said = (f"; its model.safetensors is a PyTorch state dict (export --format torchvision|timm): --init the "
                    f"run it was exported from, or map it with `hloforge import-weights SOURCE {torch_sd} --out "
                    "FILE.safetensors`" if os.path.isfile(torch_sd) else "")
            raise DataError(f"--init {path}: a directory holding neither {CHECKPOINT} (a run) nor {EXPORT_WEIGHTS} "
                            f"(an export); expected one of those, or a weights file{said}")
    if not os.path.isfile(path):
        raise DataError(f"--init {path} does not exist")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "np") as f:
            fmt = (f.metadata() or {}).get("format")
    except (SafetensorError, OSError, ValueError) as e:
        raise DataError(_not_safetensors(path, e)) from None
    if fmt == ckpt.FORMAT:
        tensors, meta = ckpt.load_checkpoint(path)
        tensors, region = _in_region(tensors, region, path, _variant_slug(meta))
        return path, tensors, int(meta["spec"].get("num_classes", 0)) or None, region, str(meta["spec"].get("name", ""))
    # a DataParallel's or torch.compile's prefix on every name dropped, as import-weights drops it
    tensors = dict(ckpt.unwrapped(ckpt.read_weights_file(path, "--init")))
    manifest = os.path.join(os.path.dirname(path), EXPORT_MANIFEST)
    with safe_open(path, "np") as f:  # a bare weights file (import-weights --out FILE.safetensors) says them
        said = f.metadata() or {}
    classes, net = whole_number(said.get("classes", "")), _net_named(said.get("spec", ""))
    if classes is None and os.path.exists(manifest):
        try:
            with open(manifest, encoding="utf-8") as f:
                stated = json.load(f)
            classes, net = int(stated["classes"]), _net_named(stated.get("spec"))
        except (OSError, ValueError, KeyError, TypeError):
            raise DataError(f"--init {path}: its {manifest} does not read as an export manifest") from None
        if stated.get("format") != EXPORT_FORMAT:  # another version's layout: its fields may not mean these
            raise DataError(f"--init {path}: its {manifest} is of format {stated.get('format')!r}; expected "
                            f"{EXPORT_FORMAT!r}, what this hloforge exports (one from another hloforge version?)")
    return path, tensors, classes, "", net


def _net_named(spec: Any) -> str:
    """The name in a stated spec (a dict, or its JSON text: a bare weights file's metadata), else ""."""
    try:
        spec = json.loads(spec) if isinstance(spec, str) else spec
    except ValueError:
        return ""
    return str(spec.get("name", "")) if isinstance(spec, dict) else ""


def _variant_slug(meta: dict[str, Any]) -> str:
    """The slug of the variant a checkpoint's metadata records (its optimizer's name where that variant
    is not one this hloforge makes: another version's field, a plugin not installed)."""
    try:
        return Variant(**meta["variant"]).slug
    except (TypeError, HloforgeError):
        return str(meta["variant"].get("optimizer", "?"))


def _in_region(tensors: dict[str, np.ndarray], region: str, path: str,
               slug: str) -> tuple[dict[str, np.ndarray], str]:
    """An hloforge checkpoint's tensors with `region`'s weights as its θ and running statistics
    (ckpt.region_weights, the weights `hloforge eval` scores: under `ema` the shadow's, a θ without a
    shadow, a frozen one, its own)."""
    shadow = f"{ckpt.state_group(SHADOW)}/"
    params = [n.split("/", 1)[1] for n in tensors if n.startswith(f"{ckpt.PARAMS}/")]
    stats = [n.split("/", 1)[1] for n in tensors
             if n.startswith(f"{ckpt.STATS}/") and not n.startswith(f"{ckpt.SHADOW_STATS}/")]
    frozen = {i for i, n in enumerate(params) if shadow + n not in tensors}
    region, theta, running = ckpt.region_weights(tensors, region, params, stats, frozen,
                                                 any(n.startswith(shadow) for n in tensors), f"--init {path}",
                                                 slug, "--init-region live")
    taken = dict(tensors)
    taken.update(zip(ckpt.names_in(ckpt.PARAMS, params), theta, strict=True))
    taken.update(zip(ckpt.names_in(ckpt.STATS, stats), running, strict=True))
    return taken, region


def _not_safetensors(path: str, error: Exception) -> str:
    """The refusal of an --init file that does not read as safetensors: what it is when that is known
    (an .npz, a PyTorch pickle) and what --init reads instead."""
    what = ckpt.foreign_format(path)
    if what is None:
        return ckpt.not_safetensors("--init", path, error)
    if ckpt.ends_in(path, ckpt.PICKLED):
        return (f"--init {path} is {what}; --init reads safetensors files: map a torchvision / timm state dict "
                f"onto its zoo net with `hloforge import-weights SOURCE {path} --out FILE.safetensors`, then --init "
                "that file")
    return (f"--init {path} is {what}; --init reads safetensors files (an hloforge run directory or checkpoint, a "
            f"weights file of {ckpt.PARAMS}/… and {ckpt.STATS}/… tensors, `hloforge import-weights` output): write "
            "the arrays with safetensors.numpy.save_file under those names")


def read_init(run: Run, log: Callable[[str], None] = print) -> Init:
    """`run.cfg.init` read and matched against `run`'s net, or one DataError naming what does not fit."""
    path, tensors, classes, region, net = _read(run.cfg.init, run.cfg.init_region)
    check_names(run, {}, lambda: _corpus_of(os.path.dirname(path), run), f"--init {path}")
    if region == "ema":
        log(f"  init {path}: its EMA shadow's weights, the ones `hloforge eval` scores (--init-region live: θ)")
    spec = run.spec
    params, stats = spec.params(), spec.stats()
    want = {f"{g}/{n}": s.shape for g, slots in ((ckpt.PARAMS, params), (ckpt.STATS, stats)) for n, s in slots}
    # θ and the running statistics are taken; optimizer state and an EMA shadow's statistics are not
    have = {n: a for n, a in tensors.items()
            if n.startswith(f"{ckpt.PARAMS}/") or (n.startswith(f"{ckpt.STATS}/")
                                                    and not n.startswith(f"{ckpt.SHADOW_STATS}/"))}
    bare = sorted(n for n, _ in params if n in tensors)  # model.params' keys saved as they are
    if bare and not any(n.startswith(f"{ckpt.PARAMS}/") for n in have):
        raise DataError(f"--init {path} holds the net's parameters under their bare names ({bare[0]!r}: model.params' "
                        f"keys) where a weights file has them under '{ckpt.PARAMS}/'; expected them saved as "
                        f"{{f'{ckpt.PARAMS}/{{k}}': v for k, v in model.params.items()}}, with model.state's "
                        f"{ckpt.STATS}/… tensors as they are")
    if tensors and not have:  # no name of ours at all: most likely a PyTorch state dict saved as safetensors
        raise DataError(f"--init {path} holds no {ckpt.PARAMS}/… or {ckpt.STATS}/… tensors (its names are like "
                        f"{min(tensors, key=len)!r}); a torchvision / timm state dict is mapped onto its zoo net "
                        f"first: `hloforge import-weights SOURCE {path} --out FILE.safetensors`, then --init that file")
    moved = ckpt.renumbered(list(have), list(want))
    if moved:
        have = {ckpt.renamed(n, moved): a for n, a in have.items()}
        log(f"  init {path}: its layers with tensors are the net's, numbered otherwise (layers without tensors, "
            f"e.g. dropout, differ): {', '.join(f'{o} → {n}' for o, n in sorted(moved.items()))}")
    layer = params[-1][0].split(".")[0] if params else ""  # the head: the last layer with parameters
    in_head = [n for n in want if layer and covers(layer, n.split("/", 1)[1])]
    if classes is None:  # a file that does not say: its head's shapes do
        classes = _head_classes(have, {n: want[n] for n in in_head}, spec.num_classes)
    head = in_head if classes is not None and classes != spec.num_classes else []
    problems = [f"lacks {n} {list(s)}" for n, s in want.items() if n not in have and n not in head]
    problems += [f"holds {n} {list(np.shape(have[n]))} that the net does not have" for n in have if n not in want]
    for n, s in want.items():
        if n in have and n not in head:
            a = have[n]
            if tuple(a.shape) != tuple(s):
                problems.append(f"{n} is {a.dtype} {list(a.shape)}, expected float32 {list(s)}")
                continue
            f32 = ckpt.as_float32_weight(a)  # half, bfloat16 and double weights are read as float32
            if isinstance(f32, str):
                problems.append(f"{n} {f32}")
                continue
            have[n] = f32
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        of = f" (it holds the weights of net {net!r})" if net and net != spec.name else ""
        raise DataError(f"--init {path} does not fit net {spec.name!r}{of}: {'; '.join(problems[:3])}{more}")
    fresh = spec.init_params(run.cfg.seed) if head else []
    fresh_stats = [s.initial() for _, s in stats]
    p = [fresh[i] if f"{ckpt.PARAMS}/{n}" in head else have[f"{ckpt.PARAMS}/{n}"] for i, (n, _) in enumerate(params)]
    st = [fresh_stats[i] if f"{ckpt.STATS}/{n}" in head else have[f"{ckpt.STATS}/{n}"]
          for i, (n, _) in enumerate(stats)]
    check_stats(stats, st, f"--init {path}")
    if head:
        names = [h.split("/", 1)[1] for h in head]
        log(f"  init {path}: {classes} classes there, {spec.num_classes} here: head {names} re-initialised"
            f" (the net's own init, seed {run.cfg.seed})")
    return Init(path, [np.array(a, np.float32) for a in p], [np.array(a, np.float32) for a in st], tuple(head))


def _corpus_of(folder: str, run: Run) -> Any:
    """The dataset the run in `folder` was trained on, where it is `run`'s (a language model's corpus, whose
    vocabulary its weights read), else None."""
    from hloforge.core.registry import default_registry
    from hloforge.train.config import CONFIG, data_path_options, load_config, parse_data_options

    if not hasattr(run.data, "chars") or not os.path.isfile(os.path.join(folder, CONFIG)):
        return None
    cfg = load_config(os.path.join(folder, CONFIG))
    if cfg.data != run.cfg.data:
        return None
    reg = default_registry()
    opts = {**data_path_options(cfg, reg.get("dataset", cfg.data)), **parse_data_options(cfg.data_options),
            "seq_len": run.data.seq_len}
    return reg.make("dataset", cfg.data, **opts)


def _head_classes(have: dict[str, np.ndarray], head: dict[str, tuple[int, ...]], num_classes: int) -> int | None:
    """The class count of an init that does not state one, read off its head's tensors (`head`: the
    net's shapes): the one size they all have where the net's have `num_classes` (a [512, 7] and a [7]
    against [512, 10] and [10]: 7), every other size alike. None when the head is the net's or differs
    otherwise (another net: its mismatches are then listed as any tensor's)."""
    sizes: set[int] = set()
    for n, shape in head.items():
        if n not in have:
            continue
        got = tuple(np.shape(have[n]))
        if len(got) != len(shape):
            return None
        for g, w in zip(got, shape, strict=True):
            if g != w:
                if w != num_classes:
                    return None
                sizes.add(g)
    return sizes.pop() if len(sizes) == 1 else None


def start_from(run: Run, session: TrainSession, init: Init) -> None:
    """Put `init` into a new run before its first step: θ (frozen ones too), fresh optimizer state (the
    layout's own init from these θ: an EMA shadow starts at them), step 0, the running statistics."""
    lay = session.layout
    trained = lay.trained
    state: list[Any] = run.state_layout.initial(session.optimizer, [lay.params[i][1] for i in trained],
                                                [init.params[i] for i in trained])
    session.load(init.params, state, 0)
    run.running = [s.copy() for s in init.stats]
    run.shadow_running = [s.copy() for s in init.stats] if run.state_layout.shadows else []
