"""`hloforge render`'s manifest.json: each rendered module's inputs and outputs by name, shape and element
type, in order, so the `.mlir` files can be driven from another runtime (iree-run-module, a PJRT of one's
own) without reading hloforge. Tensors are named as a checkpoint names them (`param/0.w`, `state/m/0.w`,
`stat/1.mean`), so a run's checkpoint.safetensors feeds a train step by name. Each module's entry names the
hloforge release that rendered it (`hloforge_version`): modules of several renders share one manifest."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hloforge.backends.signature import mlir_of_dtype, parse_main_results, parse_main_signature
from hloforge.core.errors import DataError, HloforgeError
from hloforge.train.checkpoint import PARAMS, STATS, names_in, state_group

FORMAT = "hloforge-render-1"
MANIFEST = "manifest.json"
_GROUPS = {"param": PARAMS, "stat": STATS}


def role_name(group: str, name: str) -> str:
    """One input's or output's name: a tensor as a checkpoint names it, else the group (x, y, schedule, loss)
    or group/name (mask/…, batch_stat/…)."""
    if not name:
        return group
    if group in _GROUPS:
        return names_in(_GROUPS[group], [name])[0]
    if group in ("mask", "batch_stat"):
        return f"{group}/{name}"
    return names_in(state_group(group), [name])[0]  # an optimizer's or a wrapper's state slot


def describe(text: str, inputs: Sequence[tuple[str, str]], outputs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A module's entry: its inputs (with the output each is donated to) and outputs, named by `inputs` /
    `outputs` (a layout's roles) and typed from the module's own text."""
    args, results = parse_main_signature(text), parse_main_results(text)
    if args is None or results is None or len(args) != len(inputs) or len(results) != len(outputs):
        raise HloforgeError(f"internal: the manifest names {len(inputs)} inputs and {len(outputs)} outputs, the "
                            f"module has {len(args or ())} and {len(results or ())}")

    def typed(shape: Any, dtype: Any) -> dict[str, Any]:
        return {"shape": list(shape or ()), "dtype": mlir_of_dtype(dtype)}

    return {
        "inputs": [{"name": role_name(*r), **typed(a.shape, a.dtype),
                    **({"donated_to": a.aliasing_output} if a.aliasing_output is not None else {})}
                   for r, a in zip(inputs, args, strict=True)],
        "outputs": [{"name": role_name(*r), **typed(*res)} for r, res in zip(outputs, results, strict=True)],
    }


def merged(path: str, modules: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest `path` will hold: its modules (another net rendered into the same directory) with
    `modules` added or replaced; a file there that is no render manifest is replaced whole."""
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = None
    kept = old["modules"] if isinstance(old, dict) and old.get("format") == FORMAT and \
        isinstance(old.get("modules"), dict) else {}
    for name, module in modules.items():  # file names keep a net name's a-z and 0-9 alone: "Net ü" is "net__"
        was = kept.get(name)
        if isinstance(was, dict) and was.get("net") != module["net"]:
            raise DataError(f"{os.path.dirname(path) or '.'} already holds {name}, rendered from net "
                            f"{was.get('net')!r}; net {module['net']!r} renders to the same file name (a name's "
                            "characters other than a-z and 0-9 become _), so it would replace it: render it into "
                            "another --out")
    return {"format": FORMAT, "modules": {**kept, **modules}}
