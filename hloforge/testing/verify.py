"""`hloforge verify [NAME...]`: the gate on every registered (or each named) plugin, as one table.

One row per gate case (`gate.collect_cases`), with the distribution the plugin came from, its
three errors (f64 vs jax.vjp of its reference, f64 vs finite differences, f32 vs jax) and
pass/FAIL against the gate's tolerances. A case whose modules cannot even be built or run,
a layer/loss/optimizer whose gate cases are missing or cannot be built (`gate.CaseError`), and a
plugin that failed to load (`Registry.broken`) are failures too, each a FAIL row naming the
plugin and its distribution: verify passes only when everything asked about is gated and green.
A NAME is a component name (`conv2d`, `adam`) or a distribution (`hloforge-foo`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from hloforge.core.errors import PluginError
from hloforge.testing.gate import (
    TOL_FD_F64,
    TOL_JAX_F32,
    TOL_JAX_F64,
    TOL_OPT_F32,
    TOL_OPT_F64,
    GateCase,
    GateResult,
    collect_cases,
    fault,
    plugin_label,
    require_oracles,
)

GATED = ("layer", "loss", "optimizer")
COLUMNS = f"{'kind':9} {'name':16} {'distribution':20} {'case':44} {'jax f64':>9} {'fd f64':>9} {'jax f32':>9}  result"


def result_row(case: GateCase, r: GateResult) -> str:
    mark = "pass" if r.passed else "FAIL"
    return (f"{case.kind:9} {case.name:16} {case.distribution:20} {r.case:44} {r.err_jax_f64:9.1e} "
            f"{r.err_fd_f64:9.1e} {r.err_jax_f32:9.1e}  {mark}")


def error_row(kind: str, name: str, dist: str, what: str) -> str:
    return f"{kind:9} {name:16} {dist:20} {'':44} {'-':>9} {'-':>9} {'-':>9}  FAIL  {' '.join(what.split())}"


def select(registry: Any, names: Sequence[str]) -> tuple[list[GateCase], list[str]]:
    """The gate cases of the named plugins (all when `names` is empty), and the failure rows for
    what cannot be gated: a component whose cases are missing or cannot be built, a broken plugin,
    a named component of a kind that has no gate."""
    wanted = set(names)
    broken = [b for b in registry.broken if not wanted or wanted & {b.name, b.distribution}]
    entries = [e for e in registry.entries() if not wanted or wanted & {e.name, e.distribution}]
    found = {e.name for e in entries} | {e.distribution for e in entries} | \
        {b.name for b in broken} | {b.distribution for b in broken}
    unknown = sorted(wanted - found)
    if unknown:
        known = ", ".join(f"{e.name} ({e.distribution})" for e in registry.entries() if e.kind in GATED)
        raise PluginError(f"verify: no plugin or distribution named {unknown}; gated plugins: {known}")
    # Only the named plugins' cases are built: another plugin's broken gate_cases() is not run.
    cases, errors = collect_cases(registry, names)
    rows = [error_row("broken", b.name, b.distribution, b.error) for b in broken]
    rows += [error_row(err.kind, err.name, err.distribution, err.message) for err in errors]
    gated_names = {e.name for e in entries if e.kind in GATED}
    for e in entries:  # (a strategy kind named like its layer, conv2d, is gated with that layer's cases)
        if e.kind not in GATED and wanted & {e.name} - gated_names:
            rows.append(error_row(e.kind, e.name, e.distribution, f"a {e.kind} has no gate (layers, losses and "
                                                                 "optimizers do)"))
    return cases, rows


def verify(names: Sequence[str] = (), registry: Any = None, out: Callable[[str], None] = print) -> int:
    """Print the table; returns the number of failures (0: every case green)."""
    from hloforge.core.registry import default_registry

    reg = registry or default_registry()
    cases, failed_rows = select(reg, names)
    require_oracles(cases)
    t0 = time.perf_counter()
    out(f"tolerances: jax f64 <= {TOL_JAX_F64:g}, fd f64 <= {TOL_FD_F64:g}, jax f32 <= {TOL_JAX_F32:g}; "
        f"optimizers against optax: f64 <= {TOL_OPT_F64:g}, f32 <= {TOL_OPT_F32:g}")
    out(COLUMNS)
    for row in failed_rows:
        out(row)
    failures, passed = len(failed_rows), 0
    for case in cases:
        try:
            r = case.run()
        except Exception as e:  # a plugin whose gate modules cannot be built or run has failed its gate
            who = plugin_label(case.kind, case.name, case.distribution)
            out(error_row(case.kind, case.name, case.distribution, f"{who} {fault(e, f'on {case.id}', who)}"))
            failures += 1
            continue
        out(result_row(case, r))
        if r.passed:
            passed += 1
        else:
            failures += 1
    out(f"gated {len(cases)} case(s) in {time.perf_counter() - t0:.1f}s")
    out(f"verify: {passed} passed, {failures} failed")
    return failures
