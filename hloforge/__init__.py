"""hloforge: declarative nets to StableHLO forward, eval and fused train-step programs."""

# The plugin API this hloforge provides. A plugin module may declare the one it was written
# for as a module-level `HLOFORGE_PLUGIN_API = 1`; the registry refuses a plugin that targets
# another (no declaration means "the current one"). Bump it only when a hook or a base class
# (Layer, Loss, Optimizer, Backend, Dataset) changes in a way existing plugins cannot follow.
PLUGIN_API_VERSION = 1
