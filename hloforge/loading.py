"""`hf.load`: a run directory (`Model.save`'s or `hloforge train`'s) back as a Model."""

from __future__ import annotations

import os

import attrs

from hloforge.api import Model
from hloforge.core.errors import DataError
from hloforge.core.spec import NetSpec
from hloforge.core.variant import Variant
from hloforge.train import arraydata
from hloforge.train import checkpoint as ckpt
from hloforge.train.config import CHECKPOINT, CONFIG
from hloforge.train.diffusion import is_time_conditioned
from hloforge.train.finetune import EXPORT_TORCH_WEIGHTS, EXPORT_WEIGHTS
from hloforge.train.rundir import checked_path

# where a weights file goes instead of hf.load (docs/api.md, "Weights by name")
_WEIGHTS_ELSEWHERE = ("a weights file's param/… and stat/… tensors are assigned to a Model's params and state by name "
                      "instead, and a PyTorch state dict is mapped first with "
                      "hloforge.interop.import_weights(SOURCE, FILE, 'w.safetensors')")


def load(path: str, backend: str | None = None) -> Model:
    """The run directory `path` (`Model.save`'s or `hloforge train`'s) as a Model: θ, optimizer state,
    BN statistics, step and epoch as saved, bit for bit. `backend`: where it runs (default: the run's own)."""
    from hloforge.commands.opening import check_run_dir, no_checkpoint
    from hloforge.train.trainer import load_config
    from hloforge.zoo import SPEC_SUFFIXES

    path = checked_path(path, "hf.load")
    if os.path.isfile(path):
        if os.path.basename(path) == CHECKPOINT:  # a run's own checkpoint: its directory is the run
            raise DataError(f"hf.load reads a run directory; {path} is a file (pass {os.path.dirname(path) or '.'}, "
                            "the directory holding it)")
        raise DataError(f"hf.load reads a run directory (Model.save, hloforge train or import-weights wrote it); "
                        f"{path} is a file: {_WEIGHTS_ELSEWHERE}")
    if not os.path.isdir(path):  # not `checkpoint PATH/checkpoint.safetensors does not exist`: PATH itself does not
        raise DataError(f"hf.load: {path} does not exist; expected a run directory (Model.save or hloforge train)")
    file = os.path.join(path, CHECKPOINT)
    if not os.path.exists(file):
        held = [f for f in (EXPORT_WEIGHTS, EXPORT_TORCH_WEIGHTS) if os.path.isfile(os.path.join(path, f))]
        if held:  # an export's directory: hloforge's own (weights.safetensors) or PyTorch's (model.safetensors)
            raise DataError(f"hf.load reads a run directory; {path} holds no {CHECKPOINT} but {held[0]}, an "
                            f"export: {_WEIGHTS_ELSEWHERE}")
        raise no_checkpoint(path, or_file=False)
    tensors, meta = ckpt.load_checkpoint(file)
    if not os.path.exists(os.path.join(path, CONFIG)):
        raise DataError(f"{path} has no {CONFIG}; expected a run directory (Model.save or hloforge train)")
    cfg = load_config(os.path.join(path, CONFIG))
    check_run_dir(path, file, meta)  # its config's net and variant are the checkpoint's, as `hloforge eval` checks
    v = Variant(**meta["variant"])
    fields = {f.name: getattr(v, f.name) for f in attrs.fields(Variant) if f.name != "optimizer"}
    # A net from a spec file (a saved NetSpec's net.json among them) is the checkpoint's own copy: the run
    # directory or the file may have moved since. A zoo net is rebuilt by name (check_run_dir held it to the
    # checkpoint's spec).
    stored = NetSpec.from_dict(meta["spec"], source=file)
    net = stored if cfg.net.endswith(SPEC_SUFFIXES) else cfg.net
    by_name = isinstance(net, str)  # (a NetSpec states its own classes and input)
    # the options its schedule and net read (a config may hold others, unread: Model refuses them)
    read = {**({"decay_rate": cfg.decay_rate, "decay_epochs": cfg.decay_epochs} if cfg.schedule == "exp" else {}),
            **({"diffusion_steps": cfg.diffusion_steps, "beta_start": cfg.beta_start, "beta_end": cfg.beta_end}
               if is_time_conditioned(stored) else {})}
    model = Model(net, v.optimizer, cfg.lr, cfg.schedule, backend or meta["backend"], cfg.seed,
                  warmup_epochs=cfg.warmup_epochs, bn_momentum=cfg.bn_momentum, augment=cfg.augment,
                  classes=cfg.classes if by_name else None, input=cfg.input if by_name else None, **read, **fields)
    lay = model._state_layout
    trained = model._trained_names()
    lay.check_slots(f"checkpoint {file}", list(tensors))  # the shapes, dtype and finiteness eval checks too
    ckpt.check_tensors(file, tensors, *ckpt.expected_tensors(
        [(n, s.shape) for n, s in model._param_slots], lay.slots, model.spec.stats(), lay.shadows, model._frozen()))
    names = ckpt.tensor_names([n for n, _ in model._param_slots], lay.slots, model._stat_names, trained=trained)
    try:
        got = [tensors[n] for n in names]
    except KeyError as e:
        raise DataError(f"checkpoint {file} lacks tensor {e.args[0]}; it is not of this net") from None
    n, k, m = len(model._param_slots), len(lay.slots) * len(trained), len(model._stat_names)
    model._params, model._opt_state, model._running = got[:n], got[n:n + k], got[n + k:n + k + m]
    if lay.shadows:  # one that predates them is refused, as `hloforge eval` refuses its shadow
        model._shadow_running = ckpt.shadow_stats(tensors, model._stat_names, f"checkpoint {file}",
                                                  "`hloforge eval --region live` scores its live weights")
    model._step, model._epoch, model._batch = int(meta["step"]), int(meta["epoch"]), cfg.batch
    # the run's dataset files as a fit's data_options record them: else a save named the dataset's default ones
    files = tuple(f"{k}={v}" for k, v in (("data_dir", cfg.data_dir), ("data_file", cfg.data_file)) if v)
    model._data, model._data_options = cfg.data, (*files, *cfg.data_options)
    model._eval_set = meta.get("eval_set")  # its test split as the run scored it (evaluate on it checks it)
    model._named = {k: meta[k] for k in ("class_names", "vocabulary") if isinstance(meta.get(k), list)}
    model._inputs = arraydata.saved_inputs(file, meta, cfg.data, model.spec)
    return model
