"""The step-time benchmark (`hloforge bench`, `python -m hloforge.bench`): hloforge's fused train
step against jax.jit and PyTorch eager; :mod:`.cli` says what it measures and how.

The parts: :mod:`.common` (backends, suite, nets, data, a result), :mod:`.peers_jax` and
:mod:`.peers_torch` (the same net and step in jax and in torch), :mod:`.timing` (the
measurements, a child process each), :mod:`.report` (the tables) and :mod:`.cli`.
"""

from hloforge.bench.cli import main, parser
from hloforge.bench.common import (
    BACKENDS,
    DISPATCH_BACKENDS,
    LOSS_RTOL,
    SUITE,
    Result,
    batches,
    load_net,
    unavailable,
)
from hloforge.bench.peers_jax import jax_adam_step, jax_forward, make_jax
from hloforge.bench.peers_torch import make_torch, torch_net
from hloforge.bench.report import details, sanity, table, throughput
from hloforge.bench.timing import dispatch_us, make_step, measure, measure_isolated, sgemm_gflops, step_gflop

__all__ = ["BACKENDS", "DISPATCH_BACKENDS", "LOSS_RTOL", "SUITE", "Result", "batches", "details", "dispatch_us",
           "jax_adam_step", "jax_forward", "load_net", "main", "make_jax", "make_step", "make_torch", "measure",
           "measure_isolated", "parser", "sanity", "sgemm_gflops", "step_gflop", "table", "throughput",
           "torch_net", "unavailable"]
