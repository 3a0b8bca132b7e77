"""`hloforge export`: a run's trained model out, for serving or for PyTorch.

The default format writes the eval forward as StableHLO (`forward.mlir`, batch 1: `@main(x, θ…,
running…)`), the weights as safetensors under their names (`weights.safetensors`: `param/…`,
`stat/…`) and `manifest.json` (spec, input shape and preprocessing, classes and, where the dataset names
them, their names in label-id order, the module's argument order and its output (shape, type, meaning), the
backend it trained on, the region, the hloforge version that wrote it). Its preprocessing
names the dataset, its options and the data directory and file the run recorded, how the dataset scales
pixels into the input (`pixels`), and for a text model the character vocabulary.
The weights are those `hloforge eval` scores: by default the EMA shadow when the run kept one.
`torchvision` / `timm` write the state dict of the matching PyTorch model instead (`model.safetensors`,
names and layouts by hloforge.interop.torch_names), which that model loads with `load_state_dict(strict=True)`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from hloforge.core.errors import HloforgeError, UnsupportedSpec
from hloforge.core.regions import DEFAULT_REGION
from hloforge.core.registry import hloforge_version
from hloforge.core.spec import NetSpec
from hloforge.interop.torch_names import LAYOUTS, SOURCES, units

FORMATS = ("hloforge", "torchvision", "timm")


def torch_state_dict(source: str, spec: NetSpec, params: list[np.ndarray],
                     stats: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The PyTorch state dict of `source` holding θ and the running statistics (BatchNorm's step
    counters as zeros: buffers PyTorch's strict load requires)."""
    tables = SOURCES[source].table(spec)
    out: dict[str, np.ndarray] = {}
    for name, a in zip([n for n, _ in [*spec.params(), *spec.stats()]], [*params, *stats], strict=True):
        unit, _, suffix = name.rpartition(".")
        src, layout = tables[unit][suffix]
        out[src] = np.ascontiguousarray(LAYOUTS[layout].to_source(np.asarray(a, np.float32)))
    for unit, suffixes in units(spec).items():
        if "mean" in suffixes:  # a BatchNorm
            bn = tables[unit]["mean"][0].removesuffix(".running_mean")
            out[f"{bn}.num_batches_tracked"] = np.zeros((), np.int64)
    return out


def _source_for(net: str, fmt: str, meta: dict[str, Any]) -> str:
    imported = meta.get("imported", {}).get("source", "")
    if imported.startswith(f"{fmt}:"):
        return str(imported)
    found = [s for s, f in SOURCES.items() if f.net == net and s.startswith(f"{fmt}:")]
    if not found:
        have = sorted(f"{s} ({f.net})" for s, f in SOURCES.items())
        raise UnsupportedSpec(f"net {net!r} has no {fmt} counterpart; the mapped ones are {have}")
    return found[0]


def _check_pytorch_net(run: str, source: str, spec: NetSpec, variant: Any) -> None:
    """Refuse a net that scores otherwise than `source`'s PyTorch model at eval: its state dict would load
    there with strict=True and give other logits. The variant's dropout and drop_path are the identity at eval;
    its bn_eps is not (PyTorch's model keeps its own ε)."""
    import attrs

    from hloforge.zoo import get_net

    plain = get_net(SOURCES[source].net, classes=spec.num_classes, input=spec.input_shape)
    if attrs.evolve(variant, bn_eps=None).apply_to(plain) == spec:
        return
    why = (f"the variant's BN ε {variant.bn_eps:g} (bn_eps), where {source}'s model normalises at its own"
           if variant.bn_eps is not None else f"its layers are not {source}'s")
    raise UnsupportedSpec(f"{run}: net {spec.name!r} differs from the PyTorch model at eval: {why}; its state dict "
                          "would load with strict=True and give other logits; expected a run without it, or "
                          "--format hloforge, whose forward keeps it")


def export_run(run: str, out: str, fmt: str = "hloforge", log: Callable[[str], None] = print, *,
               region: str = DEFAULT_REGION) -> str:
    """Export the run directory (or checkpoint file) `run` into directory `out`; its path. `region` picks
    the weights as `hloforge eval` does: the live ones, the EMA shadow, or (the default) auto, the shadow
    when the run kept one."""
    from safetensors.numpy import save

    from hloforge.commands.manifest import describe
    from hloforge.commands.opening import open_checkpoint
    from hloforge.core.modules import forward_input_roles, forward_module
    from hloforge.train.checkpoint import SAFETENSORS, VERSION, ends_in
    from hloforge.train.finetune import EXPORT_FORMAT
    from hloforge.train.tasks import output_said

    if fmt not in FORMATS:
        raise UnsupportedSpec(f"export format {fmt!r}; expected one of {list(FORMATS)}")
    if ends_in(out, SAFETENSORS) and not os.path.isdir(out):  # import-weights' bare-weights --out, here a folder
        inside = "model.safetensors" if fmt != "hloforge" else "forward.mlir, weights.safetensors, manifest.json"
        raise UnsupportedSpec(f"--out {out} names a .safetensors file, but export writes a directory ({inside}); "
                              "expected a directory name")
    oc = open_checkpoint(run, log=log, needs_data=False, runs=False)  # a net and its weights: no dataset, no backend
    spec, cfg = oc.spec, oc.run.cfg
    # the weights eval scores (each with its own BN statistics): the EMA shadow's when the run kept one
    region, params, stats = oc.region_weights(region)
    if fmt != "hloforge":
        source = _source_for(cfg.net, fmt, oc.meta)
        _check_pytorch_net(run, source, spec, oc.run.variant)
        from hloforge.train.finetune import EXPORT_TORCH_WEIGHTS

        sd = torch_state_dict(source, spec, params, stats)
        target = os.path.join(out, EXPORT_TORCH_WEIGHTS)
        if os.path.exists(target):
            raise HloforgeError(f"{target} already exists; pick another --out")
        write_whole(out, [(target, save(sd, metadata={"source": source, "region": region}), "PyTorch state dict")])
        log(f"exported {spec.name} as {source} ({region} weights, {len(sd)} tensors) -> {target}")
        return out
    files = [os.path.join(out, f) for f in ("forward.mlir", "weights.safetensors", "manifest.json")]
    if any(os.path.exists(f) for f in files):
        raise HloforgeError(f"{out} already holds an export; pick another --out")
    text = forward_module(spec, 1, eval_mode=True)
    pnames = [f"param/{n}" for n, _ in spec.params()]
    snames = [f"stat/{n}" for n, _ in spec.stats()]
    # the arguments and output typed from the module's own text (as render's manifest types them): x's dtype is
    # not the data's (a text model's token ids are f32 there), and the output says what it means
    typed = describe(text, forward_input_roles(spec, eval_mode=True), [("out", "")])
    (output,) = typed["outputs"]
    manifest = {
        "format": EXPORT_FORMAT, "spec": spec.to_dict(), "input_shape": list(spec.input_shape),
        "classes": spec.num_classes, "batch": 1, "arguments": ["x", *pnames, *snames], "inputs": typed["inputs"],
        "region": region,
        "output": {**output, **output_said(spec, oc.run.task)},
        "preprocessing": preprocessing(cfg, oc.run.data),
        "backend": oc.meta.get("backend"), "epoch": oc.meta.get("epoch"), "step": oc.meta.get("step"),
        **({"class_names": names} if (names := _class_names(oc)) else {}), VERSION: hloforge_version(),
    }
    weights = {n: np.ascontiguousarray(a) for n, a in zip([*pnames, *snames], [*params, *stats], strict=True)}
    write_whole(out, [(files[0], text.encode(), "exported forward"), (files[1], save(weights), "exported weights"),
                      (files[2], json.dumps(manifest, indent=1).encode(), "export manifest")])
    log(f"exported {spec.name} (eval forward, {region} weights: {len(pnames)} parameters, {len(snames)} "
        f"statistics) -> {out}")
    return out


def preprocessing(cfg: Any, data: Any) -> dict[str, Any]:
    """What a reader needs to make the net's input and read its output as the run did: the dataset, its
    options, the data directory and file the run recorded ("" for the dataset's own), and for a text model
    its vocabulary, id i being `vocabulary[i]` (the last id, `other_token`, every rarer character): the
    vocabulary comes from the corpus, so another corpus's (the default's) would decode plausibly wrong text."""
    out: dict[str, Any] = {"data": cfg.data, "data_options": list(cfg.data_options), "data_dir": cfg.data_dir,
                           "data_file": cfg.data_file}
    chars = getattr(data, "chars", None)
    if getattr(data, "label_kind", None) == "tokens" and chars is not None:
        vocabulary = list(getattr(data, "vocabulary", chars))  # every id's, as the run encoded (text's: unused too)
        out.update(vocabulary=vocabulary, other_token=len(vocabulary) - 1)
    if (norm := pixel_scaling(data)) is not None:
        out["pixels"] = {"range": [0.0, round(1.0 / norm.scale, 6)], "scale": norm.scale, "mean": list(norm.mean),
                         "std": list(norm.std)}
    return out


def _class_names(oc: Any) -> list[str] | None:
    """The class names the run recorded when it started (its checkpoint's), else, for a run from before they were
    recorded, its dataset's as it reads now (class_names)."""
    from hloforge.datasets.stream import class_names

    recorded = oc.meta.get("class_names")
    return [str(n) for n in recorded] if isinstance(recorded, list) else class_names(oc.run.data, oc.spec)


def pixel_scaling(data: Any) -> Any:
    """The dataset's Normalize from stored pixels to net input (Dataset.pixels; a record dataset's, the one
    its test transform applies), or None where its input is not one such affine of its pixels."""
    from hloforge.datasets.augment import Normalize

    if getattr(data, "pixels", None) is not None:
        return data.pixels
    if hasattr(data, "records"):  # RecordSource: its test transform makes the input the evaluation scores
        found = [t for t in getattr(data.transform("test"), "transforms", ()) if isinstance(t, Normalize)]
        return found[0] if len(found) == 1 else None
    return None


def write_whole(out: str, files: list[tuple[str, bytes, str]], then: str = "free space and export again") -> None:
    """Each of `files` (path, bytes, what) into directory `out`, each written aside and renamed, and all or
    none: a write that fails (a full disk) removes the ones this export wrote, and the directory where it
    made it, so the same --out takes the export again once there is room (`then`: the failure says so)."""
    from hloforge.core.paths import new_dirs
    from hloforge.train.checkpoint import write_atomic

    written: list[str] = []
    with new_dirs(out, "--out"):  # a file there is said as for every --out
        try:
            for path, data, what in files:
                write_atomic(path, data, what, then=then)
                written.append(path)
        except BaseException:
            for path in written:
                os.remove(path)
            raise
