"""Checkpoints: safetensors files (no code runs on load) with the spec, variant, backend,
epoch, step and RNG state in the metadata.

Written to a sibling temp file, fsynced and renamed, so a crash mid-write leaves the
previous checkpoint whole; a failed write (a full disk) removes the temp file and says so in one
line. The header is canonical (sorted keys), so the same run writes the same bytes: a run killed
and resumed ends with the file an uninterrupted run ends with (scripts/crash_drill.py).

Tensor names come from the slots (`param/0.w`,
`state/m/0.w`, `stat/1.mean`), so a checkpoint of another net cannot load silently
misaligned. A variant with an EMA shadow also keeps the shadow's BatchNorm statistics
(`stat/E/1.mean`: an EMA of the running statistics, seed 003's `ema_bn`) next to the
running ones, so the shadow is scored with its own statistics and the live weights with theirs.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import time
import typing
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np

from hloforge.core.errors import DataError, HloforgeError
from hloforge.core.regions import check_region
from hloforge.core.registry import hloforge_version
from hloforge.core.slots import StatSlot
from hloforge.core.switches import env_path, whole_number
from hloforge.core.variant import SHADOW
from hloforge.train.provenance import (
    IN_PROCESS,
    PLUGINS,
    check_in_process,
    check_plugin_layers,
    in_process_components,
    plugin_layers,
)

FORMAT_FAMILY = "hloforge-checkpoint-"  # + the layout's version
FORMAT = f"{FORMAT_FAMILY}1"
VERSION = "hloforge_version"  # the metadata key naming the hloforge release that wrote the file
# Test knobs (seed 003's "fault knobs"), never set in a real run:
# SIGKILL the process halfway through writing epoch N's checkpoint;
FAULT_ENV = "HLOFORGE_FAULT_KILL_IN_CHECKPOINT"
# write checkpoints in 16 chunks with this many seconds between them (widens the crash drill's mid-write window);
SLOW_WRITE_ENV = "HLOFORGE_DRILL_SLOW_WRITE"
# append "phase epoch [n]" lines to this file as the run passes them (where the crash drill's kills landed).
TRACE_ENV = "HLOFORGE_DRILL_TRACE"
TMP_SUFFIX = ".tmp"  # one writer per run directory (the run's lock), so one fixed temp name
PARAMS = "param"  # θ
STATE = "state"  # the optimizer state's groups: state/m, state/E, ...
T = TypeVar("T")
STATS = "stat"  # the running BatchNorm statistics: what the live weights are scored with
SHADOW_STATS = f"{STATS}/{SHADOW}"  # the EMA shadow's statistics: what the shadow is scored with


def state_group(slot: str) -> str:
    """The group of a state slot's tensors (`state/m`, `state/E`, ...)."""
    return f"{STATE}/{slot}"


def names_in(group: str, names: Sequence[str]) -> list[str]:
    """The checkpoint tensor names of `names` in `group` (PARAMS, STATS, a state_group, ...): the one
    place a checkpoint tensor is named."""
    return [f"{group}/{n}" for n in names]


def tensor_names(param_names: Sequence[str], state_names: Sequence[str], stat_names: Sequence[str],
                 shadow_stats: bool = False, trained: Sequence[str] | None = None) -> list[str]:
    """θ, the state slots, the running statistics and (`shadow_stats`) the shadow's, in that order.
    Every θ is saved (a frozen one too); the state slots hold the `trained` θ's (default: all)."""
    held = param_names if trained is None else trained
    return (names_in(PARAMS, param_names) + [n for k in state_names for n in names_in(state_group(k), held)]
            + names_in(STATS, stat_names) + (names_in(SHADOW_STATS, stat_names) if shadow_stats else []))


def serialize(names: Sequence[str], tensors: Sequence[np.ndarray], meta: dict[str, Any]) -> bytes:
    """The checkpoint's bytes: safetensors' layout with its JSON header re-written with sorted keys
    (safetensors keeps the metadata in a hash map, whose order changes from process to process)."""
    from safetensors.numpy import save

    meta = {**meta, VERSION: hloforge_version()}  # this writer's, over one a re-saved checkpoint carried
    meta.pop(PLUGINS, None)  # and the plugins its net is made of now (none: no key, the bytes as before)
    meta.update({PLUGINS: used} if (used := plugin_layers(meta.get("spec"))) else {})
    meta.pop(IN_PROCESS, None)  # and the classes of the program's own it was trained with (none: no key)
    meta.update({IN_PROCESS: own} if (own := in_process_components(meta)) else {})
    blob = save({n: np.ascontiguousarray(t) for n, t in zip(names, tensors, strict=True)},
                metadata={"format": FORMAT, **{k: json.dumps(v) for k, v in meta.items()}})
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.dumps(json.loads(blob[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the data stays 8-byte aligned, as safetensors pads it
    return struct.pack("<Q", len(header)) + header + blob[8 + n:]


def write_atomic(path: str, data: bytes, what: str, *, fault: bool = False,
                 then: str = "free space and --resume") -> None:
    """`data` to `path` through `path`.tmp, fsynced and renamed over it: a crash at any point leaves
    the old file or the new one, whole. A failed write (ENOSPC, EFBIG, EIO) removes the temp file and
    raises one line saying the old file is untouched and what to do `then`. `fault`: the FAULT_ENV kill,
    halfway through."""
    tmp = path + TMP_SUFFIX
    chunks = 16 if os.environ.get(SLOW_WRITE_ENV) else 1
    pause = float(os.environ.get(SLOW_WRITE_ENV) or 0)
    try:
        with open(tmp, "wb") as f:
            if fault:
                f.write(data[: len(data) // 2])
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            step = max(1, -(-len(data) // chunks))  # empty data too (a metrics log rewound to no line)
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                if pause:
                    f.flush()
                    time.sleep(pause)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # Ctrl-C too: no half-written temp file is left beside the checkpoint
        try:
            os.remove(tmp)
        except OSError:
            pass
        if not isinstance(e, OSError):
            raise
        if e.errno == errno.EISDIR:  # the rename onto a directory: no previous file kept, no space to free
            raise HloforgeError(f"could not write {what} {path}: it is a directory; expected a file there (move the "
                                "directory away)") from None
        old = f"the previous {what} is whole" if os.path.exists(path) else f"there was no {what} before"
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # no space to free: the place is not writable
            then = f"expected a directory this user can write ({os.path.dirname(os.path.abspath(path))} is not)"
        raise HloforgeError(f"could not write {what} {path}: {e.strerror or e} ({old}, the temp file removed); "
                            f"{then}") from None
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_image(path: str, draw: typing.Callable[[typing.BinaryIO, str], None]) -> None:
    """An image a command writes (cam, detect, sample): `draw(file, suffix)` draws it into memory in the format
    `path`'s suffix names ("png", "jpg"), then it is written whole (write_atomic): a full disk leaves no torn
    image in place of the user's and is one line naming it."""
    import io

    buf = io.BytesIO()
    draw(buf, os.path.splitext(path)[1][1:].lower())
    write_atomic(path, buf.getvalue(), "image", then="free space and run it again")


def _fsync_dir(d: str) -> None:
    """The rename itself made durable (a power cut after it keeps the new file)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: str, names: Sequence[str], tensors: Sequence[np.ndarray], meta: dict[str, Any],
                    then: str = "free space and --resume") -> None:
    """The checkpoint written whole (write_atomic; `then`: what a failed write advises)."""
    blob = serialize(names, tensors, meta)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    mark("checkpoint", meta.get("epoch"))
    write_atomic(path, blob, "checkpoint", fault=os.environ.get(FAULT_ENV) == str(meta.get("epoch")), then=then)
    mark("saved", meta.get("epoch"))


def mark(phase: str, epoch: Any, n: int | None = None) -> None:
    """One TRACE_ENV line (the crash drill reads where each kill landed); nothing when it is unset."""
    trace = env_path(TRACE_ENV)
    if not trace:
        return
    fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:  # one write(2) per line on O_APPEND: a kill never leaves half a line
        os.write(fd, f"{phase} {epoch}{'' if n is None else f' {n}'}\n".encode())
    finally:
        os.close(fd)


FLOAT_WEIGHTS = ("float16", "bfloat16", "float32", "float64")  # the weight dtypes read as float32


def host_array(a: Any) -> Any:
    """`a` as numpy can read it: a torch tensor that requires grad (an nn.Parameter, a forward's output) detached
    and a bfloat16 one (a dtype numpy lacks) as float32, where np.asarray raises torch's error; else `a` itself."""
    if type(a).__module__.startswith("torch") and hasattr(a, "detach"):
        a = a.detach().cpu()
        if str(a.dtype) == "torch.bfloat16":
            a = a.float()
    return a


def as_float32_weight(a: np.ndarray) -> np.ndarray | str:
    """`a` as a float32 weight, or why it cannot be one, as a clause ("has dtype int32, expected a float one
    ..."): half, bfloat16 and double are read as float32; an integer, complex, NaN or beyond-float32 one is no
    weight, never cast into one."""
    if a.dtype.name not in FLOAT_WEIGHTS:
        return f"has dtype {a.dtype}, expected a float one ({', '.join(FLOAT_WEIGHTS)}; read as float32)"
    if not np.isfinite(a).all():
        return "holds NaN or inf, expected finite numbers"
    with np.errstate(over="ignore"):  # beyond float32's range: said below, in one line
        f32 = np.array(a, np.float32)
    if not np.isfinite(f32).all():
        return "holds values beyond float32's range (±3.4e38)"
    return f32


# the safetensors dtypes its numpy loader reads (BF16 through ml_dtypes); float8 ones it seeks on numpy, which has none
NUMPY_READS = frozenset({"F64", "F32", "F16", "BF16", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8", "BOOL",
                         "C64"})


def read_weights_file(path: str, what: str) -> dict[str, np.ndarray]:
    """A foreign safetensors file's tensors (`import-weights`, `train --init`), bfloat16 ones too; one
    DataError, naming the file as `what`, for a truncated or foreign one."""
    import ml_dtypes  # noqa: F401  # safetensors' numpy loader knows bfloat16 only once ml_dtypes registers it
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    try:
        with safe_open(path, "np") as f:  # a dtype it has no numpy type for would be an AttributeError of numpy's
            odd = next(((k, d) for k in f.keys() if (d := f.get_slice(k).get_dtype()) not in NUMPY_READS), None)
        if odd is not None:
            raise DataError(f"{what} {path}: tensor {odd[0]!r} has dtype {odd[1]}, which numpy cannot hold; "
                            "expected float16, bfloat16, float32 or float64 tensors")
        return dict(load_file(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise DataError(not_safetensors(what, path, e)) from None


def not_safetensors(what: str, path: str, error: Exception) -> str:
    """A file that did not read as safetensors: the OS's reason (a directory) without its errno, else truncated."""
    if isinstance(error, OSError) and error.strerror:
        return f"{what} {path} cannot be read ({error.strerror.lower()}); expected a safetensors file"
    return f"{what} {path} is truncated or not a safetensors file ({error})"


WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # what nn.DataParallel / DistributedDataParallel and torch.compile add
PICKLED = (".pth", ".pt", ".bin", ".pth.tar", ".ckpt")  # torch.save files (timm train.py: .pth.tar, Lightning: .ckpt)
SAFETENSORS = ".safetensors"


def ends_in(path: str, suffixes: str | tuple[str, ...]) -> bool:
    """Whether a file name ends in one of `suffixes` (lower case), in any case: W.SafeTensors is a safetensors
    file as w.safetensors is (a name another system or tool wrote), not a directory or a refused kind."""
    return path.lower().endswith(suffixes)


def unwrapped(sd: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """`sd` without the prefix a wrapper gives every name (a state dict saved from a DataParallel or a
    compiled model), so it maps as the bare model's."""
    while sd:
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in sd)), None)
        if prefix is None:
            break
        sd = {k[len(prefix):]: v for k, v in sd.items()}
    return sd


def foreign_format(path: str) -> str | None:
    """What a file that does not read as safetensors is instead, when it is a common one (said in a
    refusal: "a NumPy .npz archive"), else None. A PyTorch pickle by its suffix: torch.save's is a zip too."""
    if ends_in(path, PICKLED):
        return "a PyTorch pickle"
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        return None
    if not head:  # safetensors says "header too small", of a file with none
        return "an empty file"
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array"
    if head.startswith(b"PK") or ends_in(path, ".npz"):  # np.savez writes a zip
        return "a NumPy .npz archive" if ends_in(path, ".npz") else "a zip archive"
    return None


def _split(name: str) -> tuple[str, str, str]:
    """`param/2.w` as (group, top-level layer number, the rest): ("param", "2", "w")."""
    group, _, rest = name.partition("/")
    top, _, tail = rest.partition(".")
    return group, top, tail


def renamed(name: str, moved: dict[int, int]) -> str:
    """`name` with its layer number as `moved` (renumbered's) moves it."""
    group, top, tail = _split(name)
    return f"{group}/{moved[int(top)]}.{tail}" if int(top) in moved else name


def renumbered(have: list[str], want: list[str]) -> dict[int, int]:
    """{given layer number: the net's layer number} for the layers that moved, where the given tensors are the
    net's but for the top-level numbers of the layers that hold them: the same layers with tensors, in the
    same order, with the same tensor names (`param/2.w` → `param/3.w` after a classifier dropout is put
    before the head). {} if the names already match or anything else differs."""
    if set(have) == set(want):
        return {}

    def layers(names: list[str]) -> tuple[list[int], list[set[tuple[str, str]]]] | None:
        out: dict[int, set[tuple[str, str]]] = {}
        for n in names:
            group, top, tail = _split(n)
            index = whole_number(top)
            if index is None:
                return None
            out.setdefault(index, set()).add((group, tail))
        return sorted(out), [out[i] for i in sorted(out)]

    a, b = layers(have), layers(want)
    if a is None or b is None or a[1] != b[1] or a[0] == b[0]:
        return {}
    return {old: new for old, new in zip(a[0], b[0], strict=True) if old != new}


def named_by_checkpoint(name: str, what: str) -> str:
    """For `Model.params = …` / `Model.state = …` (`what`) handed a tensor under a weights file's or
    checkpoint's own name (`param/0.w`, `stat/1.mean`, `state/m/0.w`): where it goes, as a clause; else ""."""
    group = name.partition("/")[0]
    if group == PARAMS and what == "params":
        return (f"; a weights file's names carry the prefix '{PARAMS}/': drop it ({{k.removeprefix('{PARAMS}/'): v "
                f"for k, v in d.items() if k.startswith('{PARAMS}/')}}), and give its {STATS}/… tensors to "
                "model.state as they are")
    if group == PARAMS:
        return f"; {PARAMS}/… tensors are weights: model.params takes them without the prefix '{PARAMS}/'"
    if group == STATS and what == "params":
        return f"; {STATS}/… tensors are BatchNorm statistics: model.state takes them as they are"
    if group == STATE:
        return f"; a checkpoint's optimizer state: model.state takes it without the prefix '{STATE}/'"
    return ""


def _numbered_otherwise(given: list[str], names: list[str], what: str) -> str:
    """For `Model.params = …` handed another numbering of this net's own tensors (weights of the net without the
    variant's dropout layer before the head: `7.w` where it is `8.w`): which layers move, as a clause; else ""."""
    if what != "params":
        return ""
    moved = renumbered([f"{PARAMS}/{n}" for n in given], [f"{PARAMS}/{n}" for n in names])
    if not moved:
        return ""
    said = ", ".join(f"{a}.… → {b}.…" for a, b in sorted(moved.items()))
    return (f"; they are this net's tensors numbered otherwise (a layer without tensors, such as the variant's "
            f"dropout, is not in the net they came from): expected them renamed {said}, as `--init` renames them")


# the ends of a PyTorch state dict's names (nn.Conv2d / nn.Linear / nn.BatchNorm2d's), none of which a zoo tensor has
TORCH_SUFFIXES = (".weight", ".bias", ".running_mean", ".running_var", ".num_batches_tracked")


def _named_by_pytorch(name: str, names: list[str]) -> str:
    """For `Model.params = …` / `Model.state = …` handed a PyTorch state dict: how to map it, as a clause; else ""
    (also where the net's own `names` end so: a plugin layer's)."""
    if not name.endswith(TORCH_SUFFIXES) or any(n.endswith(TORCH_SUFFIXES) for n in names):
        return ""
    return ("; that is a PyTorch state dict's name: map it onto the zoo net first, with "
            "hloforge.interop.import_weights(SOURCE, FILE, 'w.safetensors') (SOURCE e.g. 'torchvision:resnet18'), "
            "then assign that file's param/… and stat/… tensors")


def assigned(new: Mapping[str, Any], want: list[tuple[str, tuple[int, ...]]], what: str,
              current: list[np.ndarray], head: Sequence[str] = ()) -> list[np.ndarray]:
    """`current` with the tensors `new` names replaced (`Model.params = …`, `Model.state = …`: `what`), each
    checked for name, shape and dtype (a float one read as float32); `head`: the names of the net's head."""
    if not isinstance(new, Mapping):
        raise DataError(f"{what} must be a mapping of name → array, got {type(new).__name__}")
    index = {n: i for i, (n, _) in enumerate(want)}
    unknown = sorted(set(new) - set(index))
    if unknown:
        raise DataError(f"{what}: no tensor named {unknown[0]!r}; the names are {list(index)[:6]}..."
                        f"{named_by_checkpoint(unknown[0], what) or _numbered_otherwise(list(new), list(index), what)}"
                        f"{_named_by_pytorch(unknown[0], list(index))}")
    out = list(current)
    for name, a in new.items():
        a = np.asarray(host_array(a))
        shape = want[index[name]][1]
        if tuple(a.shape) != tuple(shape):
            # the head of another class count (ImageNet's 1000 onto 10): what `--init` re-initialises
            said = (f" (the net's head, of another class count there: leave {list(head)} out to keep this model's "
                    "own, as --init re-initialises it)" if name in head else "")
            raise DataError(f"{what}[{name!r}] has shape {list(a.shape)}, expected {list(shape)}{said}")
        f32 = as_float32_weight(a)
        if isinstance(f32, str):
            raise DataError(f"{what}[{name!r}] {f32}")
        out[index[name]] = f32
    return out


class NamedTensors(dict[str, np.ndarray]):
    """`Model.params` / `Model.state` (`what`): copies of the model's tensors by name, whose item assignment
    (`model.params["0.w"] = w`; `update`, `|=`) also assigns them to the model, checked as assigning the mapping
    is: a plain copy made that a silent no-op, where PyTorch's and Keras's users expect the weight set.
    Everything else is a dict's (`del`, `pop` edit this copy alone); a pickle or `copy()` is a plain dict."""

    def __init__(self, model: Any, what: str, tensors: Iterable[tuple[str, np.ndarray]]) -> None:
        super().__init__((n, a.copy()) for n, a in tensors)
        self._model, self._what = weakref.ref(model), what  # a kept copy keeps no dropped model (its sessions) alive

    def update(self, *args: Any, **kw: Any) -> None:
        new = dict(*args, **kw)
        if (model := self._model()) is not None:
            setattr(model, self._what, new)  # the model's setter checks every name, shape and dtype first
        for name, a in new.items():  # as the model now holds it (float32), not the model's own array
            held = a if model is None else as_float32_weight(np.asarray(host_array(a)))  # checked: no str here
            super().__setitem__(name, typing.cast(np.ndarray, held))

    def __setitem__(self, name: str, a: Any) -> None:
        self.update({name: a})

    def __ior__(self, other: Any) -> NamedTensors:  # type: ignore[override,misc]
        self.update(other)
        return self

    def setdefault(self, name: str, a: Any = None) -> np.ndarray:
        if name not in self:
            self[name] = a
        return self[name]

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self),)


def load_checkpoint(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """All tensors by name and the decoded metadata; a truncated or foreign file is one clear error."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    if not os.path.exists(path):
        raise DataError(f"checkpoint {path} does not exist")
    try:
        with open(path, "rb") as f:
            tensors = load(f.read())
    except (SafetensorError, OSError, ValueError) as e:
        raise DataError(_unreadable(path, e)) from None
    return tensors, load_meta(path)


def _unreadable(path: str, error: Exception) -> str:
    """The refusal of a checkpoint that does not read as safetensors: what it is when that is known (a PyTorch
    pickle: import-weights maps it into a run directory), else truncated or foreign."""
    what = foreign_format(path)
    if what is None:
        return not_safetensors("checkpoint", path, error)
    said = (f"; a torchvision / timm state dict is mapped onto its zoo net, into a run directory, with `hloforge "
            f"import-weights SOURCE {path} --out DIR`" if ends_in(path, PICKLED) else "")
    return f"checkpoint {path} is {what}, not an hloforge checkpoint (a safetensors file){said}"


def load_meta(path: str) -> dict[str, Any]:
    """A checkpoint's decoded metadata alone (its header: no tensor is read), checked as `load_checkpoint`
    checks it."""
    from safetensors import SafetensorError, safe_open

    if not os.path.exists(path):
        raise DataError(f"checkpoint {path} does not exist")
    try:
        with safe_open(path, "np") as f:
            raw = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise DataError(_unreadable(path, e)) from None
    if raw.get("format") != FORMAT:
        if str(raw.get("format")).startswith(FORMAT_FAMILY):  # another hloforge version's layout, not a foreign file
            recorded = raw.get(VERSION, "").strip('"')  # (a JSON string, as every value but format)
            writer = f"hloforge {recorded}" if recorded else "another hloforge version"
            raise DataError(f"checkpoint {path} was written by {writer} (format {raw.get('format')!r}; "
                            f"this one reads {FORMAT!r}); open it with the hloforge that wrote it")
        if "format" not in raw:  # a weights file: import-weights --out FILE.safetensors, an export, a state dict
            raise DataError(f"checkpoint {path} is a safetensors file without an hloforge checkpoint's metadata: a "
                            f"weights file, which starts a run with `hloforge train NET --init {path}`, or a PyTorch "
                            f"state dict, mapped with `hloforge import-weights SOURCE {path} --out DIR`")
        raise DataError(f"checkpoint {path} is not an hloforge checkpoint (format {raw.get('format')!r}, "
                        f"expected {FORMAT!r})")
    meta = {}
    for k, v in raw.items():
        if k != "format":
            try:
                meta[k] = json.loads(v)
            except (ValueError, RecursionError):
                raise DataError(f"checkpoint {path}: its metadata {k!r} is not JSON; tampered, or not written by "
                                "hloforge") from None
    check_meta(path, meta)
    check_plugin_layers(path, meta)  # before its spec is read: a plugin's layer not installed says which to install
    check_in_process(path, meta)  # and a class of the training program's own not registered, which to register
    return meta


# What the metadata must hold for resume and eval to read it (the writer, Run.meta, always writes these).
META_TYPES: dict[str, type] = {"spec": dict, "variant": dict, "backend": str, "epoch": int, "step": int,
                               "config": dict}


def check_meta(path: str, meta: dict[str, Any]) -> None:
    for k, t in META_TYPES.items():
        v: Any = meta.get(k)
        if not isinstance(v, t) or isinstance(v, bool) or (t is int and typing.cast(int, v) < 0):
            want = {dict: "a table", str: "a string", int: "a count ≥ 0"}[t]
            said = f"is {_short(v)}" if k in meta else "is missing"  # not 'is None', a value it never held
            raise DataError(f"checkpoint {path}: its metadata {k!r} {said}, expected {want}; tampered, "
                            "or not written by hloforge")


def check_tensors(path: str, tensors: dict[str, np.ndarray], want: dict[str, tuple[int, ...]],
                  optional: Sequence[str] = (), nonnegative: Collection[str] = ()) -> None:
    """Refuse a checkpoint whose tensors are not exactly `want` (names, shapes, float32); `optional` names
    may be absent; `nonnegative` ones (variances) hold no value below 0. A tensor of another shape or dtype
    would load misaligned or be cast without a word; a negative variance would score plausibly wrong."""
    missing = [n for n in want if n not in tensors and n not in optional]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DataError(f"checkpoint {path} lacks tensor {missing[0]}{more}; it is not of this net")
    extra = sorted(n for n in tensors if n not in want)
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise DataError(f"checkpoint {path} holds tensor {extra[0]}{more} that this net does not have; "
                        "it is not of this net")
    for n, shape in want.items():
        if n in tensors:
            a = tensors[n]
            if a.dtype != np.float32 or tuple(a.shape) != tuple(shape):
                raise DataError(f"checkpoint {path}: tensor {n} is {a.dtype} {list(a.shape)}, expected float32 "
                                f"{list(shape)}; tampered, or not of this net")
            if not np.isfinite(a).all():  # never written: a run stops at a non-finite loss before saving
                raise DataError(f"checkpoint {path}: tensor {n} holds a NaN or an infinity; corrupt")
            if n in nonnegative and (a < 0).any():  # never written: a running variance averages variances
                raise DataError(f"checkpoint {path}: tensor {n} holds {int((a < 0).sum())} negative value(s), "
                                "expected a variance, ≥ 0; tampered, or not written by hloforge")


def expected_tensors(params: Sequence[tuple[str, tuple[int, ...]]], state_names: Sequence[str],
                     stats: Sequence[tuple[str, StatSlot]], shadow_stats: bool,
                     frozen: Sequence[int] = ()) -> tuple[dict[str, tuple[int, ...]], list[str], list[str]]:
    """(name -> shape of every tensor a checkpoint of this net and layout holds, the optional ones: the
    shadow's statistics, absent from checkpoints that predate them, the variances: `check_tensors`' three
    arguments), in `tensor_names`' order. The `frozen` positions of `params` have no state tensors."""
    pn, sn = [n for n, _ in params], [n for n, _ in stats]
    held = [p for i, p in enumerate(params) if i not in frozen]
    shapes = ([s for _, s in params] + [s for _, s in held] * len(state_names)
              + [s.shape for _, s in stats] * (1 + int(shadow_stats)))
    names = tensor_names(pn, state_names, sn, shadow_stats, [n for n, _ in held])
    optional = [f"{SHADOW_STATS}/{n}" for n in sn] if shadow_stats else []
    variances = [f"{group}/{n}" for group in (STATS, SHADOW_STATS)[:1 + int(shadow_stats)]
                 for n, s in stats if s.nonnegative]
    return dict(zip(names, shapes, strict=True)), optional, variances


def config_from(path: str, cls: type[T], stored: Any) -> T:
    """The attrs config class `cls` (TrainConfig) from a checkpoint's stored config, every value of its
    field's declared type and within the class's own `check()`: a tampered value is refused here, naming
    the checkpoint, not met as a TypeError deep in the run it rebuilds."""
    from hloforge.core.spec import conforms

    try:
        cfg = cls(**stored)
    except (TypeError, ValueError) as e:  # a key no config has; a value its converter cannot take
        raise DataError(f"checkpoint {path}: its config does not read as a training config "
                        f"({' '.join(str(e).split())})") from None
    except HloforgeError as e:  # a value the config's own field checks refuse (TrainConfig.__attrs_post_init__)
        raise DataError(f"checkpoint {path}: its config: {e}") from None
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):  # type: ignore[arg-type]
        v = getattr(cfg, f.name)
        if f.name in hints and not conforms(v, hints[f.name]):
            raise DataError(f"checkpoint {path}: its config's {f.name} is {_short(v)}, not of its type "
                            f"{hints[f.name]}; tampered, or not written by hloforge")
    try:
        cfg.check()  # type: ignore[attr-defined]
    except HloforgeError as e:
        raise DataError(f"checkpoint {path}: its config: {e}") from None
    return cfg


def first_difference(stored: Any, now: Any, where: str = "") -> str:
    """Where two JSON-like values (a stored spec and the current one) first differ, as 'key: a, not b'."""
    if isinstance(stored, dict) and isinstance(now, dict):
        for k in [*now, *(k for k in stored if k not in now)]:
            if stored.get(k) != now.get(k):
                return first_difference(stored.get(k), now.get(k), f"{where}{k}" if not where else f"{where}.{k}")
    if isinstance(stored, list) and isinstance(now, list) and len(stored) == len(now):
        for i, (a, b) in enumerate(zip(stored, now, strict=True)):
            if a != b:
                return first_difference(a, b, f"{where}[{i}]")
    return f"{where or 'the whole'}: {_short(stored)}, not {_short(now)}"


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def shadow_stats(tensors: Mapping[str, np.ndarray], stat_names: Sequence[str], whose: str,
                 remedy: str) -> list[np.ndarray]:
    """The EMA shadow's BatchNorm statistics (`stat/E/…`) out of a checkpoint's tensors (`whose`:
    "checkpoint PATH"). One written before they were kept is refused: the shadow normalised by the
    live running statistics would print a plausible, wrong number. `remedy` says what the caller can
    do instead."""
    names = names_in(SHADOW_STATS, stat_names)
    missing = [n for n, t in zip(stat_names, names, strict=True) if t not in tensors]
    if missing:
        raise DataError(f"{whose} has no BatchNorm statistics for its EMA shadow ({SHADOW_STATS}/"
                        f"{missing[0]} and {len(missing) - 1} more are missing; it predates them), and the shadow "
                        f"is never scored with the live running statistics; {remedy}")
    return [tensors[t] for t in names]


def resolved_region(region: str, shadows: bool, whose: str, slug: str, live: str) -> str:
    """`region` as `region_weights` reads it: `auto` is `ema` when the variant keeps a shadow (`shadows`),
    else `live`; `ema` without a shadow is refused (`whose`, `slug`, `live`: as there)."""
    check_region(region)
    if region == "auto":
        region = "ema" if shadows else "live"
    if region == "ema" and not shadows:
        raise DataError(f"{whose} has no EMA shadow (its variant {slug!r} keeps none); use {live}")
    return region


def region_weights(tensors: Mapping[str, np.ndarray], region: str, params: Sequence[str], stats: Sequence[str],
                   frozen: Collection[int], shadows: bool, whose: str, slug: str,
                   live: str) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
    """(the region, resolved; its θ; its BN statistics) out of checkpoint-named `tensors`, for scoring,
    exporting or sampling: `live` is θ with the running statistics, `ema` the shadow E with the
    shadow's own statistics, `auto` the shadow when the variant keeps one (`shadows`), as its training
    run reported it first. A `frozen` θ (by position in `params`) has no shadow: it is its own. The one
    definition `hloforge eval` / `export` / `sample` and `Model.evaluate` / `predict` share; `whose`
    ("checkpoint PATH", "model 'NAME'") and `live` (how its caller asks for the live weights) word the
    refusals."""
    region = resolved_region(region, shadows, whose, slug, live)

    def group(prefix: str, names: Sequence[str]) -> list[np.ndarray]:
        try:
            return [tensors[t] for t in names_in(prefix, names)]
        except KeyError as e:
            raise DataError(f"{whose} lacks tensor {e.args[0]}") from None

    theta = group(PARAMS, params)
    if region == "live":
        return region, theta, group(STATS, stats)
    shadow = iter(group(state_group(SHADOW), [n for i, n in enumerate(params) if i not in frozen]))
    return region, [p if i in frozen else next(shadow) for i, p in enumerate(theta)], \
        shadow_stats(tensors, stats, whose, f"use the live weights ({live})")
