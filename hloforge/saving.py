"""`Model.save`: a model written as the run directory `hloforge train` writes (config.toml and
checkpoint.safetensors, by the trainer's own writers), which `hloforge eval` scores and `hf.load`
(hloforge/loading.py) reads back. A part of `hf.Model` (api.py), which inherits it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import attrs

from hloforge.core.errors import HloforgeError, UnsupportedSpec
from hloforge.core.variant import VariantFields
from hloforge.datasets.records import replaced_together
from hloforge.keywords import checked_keywords
from hloforge.train import arraydata, mpi
from hloforge.train import checkpoint as ckpt
from hloforge.train.arraydata import ARRAYS
from hloforge.train.config import BITMAP, CHECKPOINT, CONFIG, file_fields, parse_data_options
from hloforge.train.curves import PNG
from hloforge.train.rundir import METRICS, NET_FILE, RUN_ID, check_own_files, check_save_dir, checked_path, locked


class Saving:
    """The run directory side of `hf.Model` (its attributes are the Model's): its config, `save`, and what a save
    records of its dataset."""

    def _config(self, path: str, data: str, **fields: Any) -> Any:
        """The TrainConfig of this model (a run directory's config.toml, or the config its fit runs)."""
        from hloforge.train.trainer import TrainConfig

        v = self.variant
        net = self._net_ref or (os.path.join(os.path.abspath(path), NET_FILE) if path else self.spec.name)
        variant = {f.name: getattr(v, f.name) for f in attrs.fields(VariantFields)}  # every one, frozen too
        base = dict(net=net, classes=self._classes, input=self._input, data=data, backend=self.backend.name,
                    epochs=max(self._epoch, 1), batch=self._batch, lr=self.lr, schedule=self.schedule,
                    warmup_epochs=self.warmup_epochs, decay_rate=self.decay_rate, bn_momentum=self.bn_momentum,
                    seed=self.seed, run_dir=path, **self._run_options, **variant)
        return TrainConfig(**{**base, **fields})

    @checked_keywords
    def save(self, path: str, data: str | None = None, overwrite: bool = False, *,
             data_options: Mapping[str, Any] | None = None) -> str:
        """Write the run directory `hloforge train` writes (config.toml and checkpoint.safetensors, by
        the trainer's own writers), so `hloforge eval DIR` scores it on `data`'s test split (the
        dataset the config names, refused unless the net fits it; default: the one the model last
        trained on or a loaded run named; none, "arrays", for a model fit on arrays or not at all:
        `eval` then refuses it, `hloforge export` needs none) and `hf.load(DIR)` reads it back bit for
        bit; what a run wrote beside its last checkpoint (its metrics, curves, eval bitmap) goes, being
        another model's. Under the directory's lock: a run training there is never overwritten.
        `data_options`: the options of the dataset `data` names (`size`, `channels`, ...), as fit takes them. Returns
        `path`. `overwrite=True` replaces a checkpoint there (default False: a directory holding one is refused).
        After a fit under MPI, rank 0 writes it (as `hloforge train` writes its checkpoints); the other ranks, which
        hold the same weights, return `path` without writing."""
        path, overwrite = checked_path(path, "save"), arraydata.checked_flag("overwrite", overwrite)
        if mpi.world_made() and not mpi.world().is_root:  # two ranks writing one path on a shared disk: one refused
            return path
        options, data = self._options_for(data), data or self._data
        if data_options is not None:  # the options a net of another input than the dataset's default needs
            if not isinstance(data_options, Mapping):
                raise UnsupportedSpec("data_options must be a mapping of option names to values, got a "
                                      f"{type(data_options).__name__}")
            if data == ARRAYS:
                raise UnsupportedSpec("save's data_options are the options of the dataset it names; pass data=NAME")
            options = tuple(f"{k}={v}" for k, v in data_options.items())
        check_save_dir(path)
        check_own_files(path, "save directory", "the save", "save to another path")  # before the dataset loads
        file = os.path.join(path, CHECKPOINT)
        if os.path.exists(file) and not overwrite:
            raise HloforgeError(f"{path} already holds a checkpoint; pass overwrite=True to replace it")
        cfg = self._config(path, data, **file_fields(options))  # checked before anything is written
        eval_set = self._eval_set_of(path, data, options)
        tensors = self._checkpoint_tensors()
        meta = {"spec": self.spec.to_dict(), "variant": attrs.asdict(self.variant), "backend": self.backend.name,
                "epoch": self._epoch, "step": self._step, "seed": self.seed, "config": attrs.asdict(cfg), **eval_set,
                **({"inputs": attrs.asdict(self._inputs)} if self._inputs else {})}
        try:
            # config (and net) renamed over once the checkpoint is written: a failed save leaves the last one whole
            with locked(path, file), replaced_together(path, "save directory", "save again") as stage:
                for name, text in ((CONFIG, cfg.to_toml()), *(((NET_FILE, self._declared_spec.to_json()),)
                                                              if not self._net_ref else ())):
                    with open(stage(name), "w", encoding="utf-8") as f:
                        f.write(text)
                ckpt.save_checkpoint(file, list(tensors), list(tensors.values()), meta,
                                     then="free space and save again")
                for stale in (METRICS, BITMAP, PNG, RUN_ID, *((NET_FILE,) if self._net_ref else ())):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(path, stale))
        except OSError as e:  # a missing parent that cannot be made, a read-only or virtual file system (/proc)
            raise HloforgeError(f"cannot save to {path}: {e.strerror or e}; expected a directory that can be "
                                "created and written") from None
        return path

    def _options_for(self, data: str | None) -> tuple[str, ...]:
        """The data options a save naming dataset `data` records: the model's own for its own dataset
        (None), another's defaults."""
        return self._data_options if data in (None, self._data) else ()

    def _eval_set_of(self, path: str, data: str, options: tuple[str, ...] | None = None) -> dict[str, Any]:
        """{"eval_set": its id} (and the dataset's "class_names") for a save to `path` naming dataset `data`, refused
        unless the net fits its test split as `hloforge eval` will read it; {} for the user's arrays, no registered
        eval set (nothing to compare a later eval against). ModelCheckpoint asks it before the first step."""
        if data == ARRAYS:
            return {}
        arraydata.check_dataset_kind(self._inputs, data, self.spec, f"cannot save {path} naming",
                                     "save it with no dataset (data='arrays')")
        try:
            given = parse_data_options(self._options_for(data) if options is None else options)
            test = self._run(data, self._batch, data_options=given, eval_only=True)
        except HloforgeError as e:
            raise type(e)(f"cannot save {path} naming dataset {data!r}: {e}") from None
        return {"eval_set": test.eval_set, **test.named}
