"""The hooks a plugin implements. Built-ins implement them exactly as third parties do.

A plugin is a module named by an entry point in one of the groups
`hloforge.layers`, `hloforge.losses`, `hloforge.optimizers`,
`hloforge.backends`, `hloforge.datasets`, `hloforge.callbacks`; it decorates functions with
`hloforge.core.hookspecs.hookimpl`. It may declare the plugin API it is written
for as a module-level `HLOFORGE_PLUGIN_API = 1`; the registry refuses a plugin
targeting another than `hloforge.PLUGIN_API_VERSION` (no declaration: the current one).

What each returned class provides — every attribute and method the core, the trainer, the
gate and the CLI read, with its default — is its contract in `hloforge.core.contracts`
(listed below the hooks).
"""

from __future__ import annotations

from typing import Any

import pluggy

# The plugin API this hloforge provides (`hf.PLUGIN_API_VERSION`). A plugin module may declare the one
# it was written for as a module-level `HLOFORGE_PLUGIN_API = 1`; the registry refuses a plugin that
# targets another (no declaration means "the current one"). Bump it only when a hook or a contract
# (hloforge.core.contracts) changes in a way existing plugins cannot follow.
PLUGIN_API_VERSION = 1

hookspec = pluggy.HookspecMarker("hloforge")
hookimpl = pluggy.HookimplMarker("hloforge")


@hookspec
def hloforge_layers() -> list[type]:
    """Return the layer classes this plugin provides.

    Each is an attrs frozen subclass of `hloforge.core.contracts.Layer` with a
    unique class attribute `kind` (its name in specs), `out_shape`,
    `param_slots`, `forward` (builder ops; the backward is derived, or given
    with `Builder.custom_vjp`), `reference` (plain jax.numpy, the gate's
    oracle) and `gate_cases` (contract: `Layer`).
    """


@hookspec
def hloforge_strategy_kinds() -> list[Any]:
    """Return the lowering strategy kinds this layer plugin's forms consult.

    Each is a `hloforge.core.strategy.StrategyKind`: a unique `name`, its named `choices` (the
    first the portable form, what a module rendered for no target gets) and a `doc`. A layer
    lists the kinds it consults in `strategy_kinds`; each backend picks its choice of a kind in
    its class's `strategy_defaults`, and the gate runs the layer's cases once per choice.
    """


@hookspec
def hloforge_losses() -> list[type]:
    """Return the loss classes this plugin provides (subclasses of `hloforge.core.contracts.Loss`)."""


@hookspec
def hloforge_optimizers() -> list[type]:
    """Return the optimizer classes this plugin provides (subclasses of `hloforge.core.contracts.Optimizer`)."""


@hookspec
def hloforge_backends() -> list[type]:
    """Return backend classes, each satisfying `hloforge.core.contracts.Backend`.

    A class has `name` (what `--backend` / $HLOFORGE_BACKEND select) and is made with
    no arguments; it may declare `strategy_defaults`, a mapping strategy kind -> choice (see
    `hloforge_strategy_kinds`): then it is a render target, its modules rendered with those
    choices (a kind it does not name in its portable form), else every module it gets is
    portable; an instance has `backend_name()` (what is really loaded),
    `compile(mlir_text, num_replicas=1)`, `to_device(array)`, `to_host(buffer)` and
    `execute(exe, args, keep=())`. It refuses arguments of the wrong dtype or shape
    before running, consumes donated inputs unless kept, and raises BackendError for
    what it cannot do (more replicas than devices) rather than running on one device.
    Import the backend's own packages lazily, in `__init__`, so a missing one is a
    BackendError naming the package to install, not a registry that fails to load.
    `hloforge.testing.backend_conformance` checks a backend against the contract.
    """


@hookspec
def hloforge_datasets() -> list[type]:
    """Return dataset classes, each satisfying `hloforge.core.contracts.Dataset` (subclassing it is optional).

    A class has `name` (what `--data` selects), `num_classes` and `arrays(split)` giving (x, y)
    numpy arrays; its `label_kind`, `image_shape` and `regions` (defaults in the contract) pick
    the task, the loss and the metrics. It is made with the user's dataset options as keywords.
    """


@hookspec
def hloforge_callbacks() -> list[type]:
    """Return training callback classes, each subclassing `hloforge.callbacks.Callback`.

    A class has `name` (what `hloforge train --callback NAME` and `hf.callbacks[NAME]` select) and
    is made with the user's options as keywords. It overrides any of the hooks `on_train_begin(logs)`,
    `on_train_end(logs)`, `on_epoch_begin(epoch, logs)`, `on_epoch_end(epoch, logs)` (`logs`: the
    epoch's metrics) and `on_step_end(step, logs)`, run by the training loop; `self.model` is the
    `hf.Model` being fitted or the `hloforge train` run, and setting `self.model.stop_training =
    True` ends training after the epoch.
    """


@hookspec
def hloforge_on_epoch_end(run: Any, epoch: int, metrics: dict[str, float]) -> None:
    """Called after each epoch's evaluation, e.g. to log or plot `metrics`."""
