"""The report: the tables, the first-step loss check, the machine and the lowering strategies."""

from __future__ import annotations

import platform
import statistics
from collections.abc import Sequence
from typing import Any

from hloforge.bench.common import LOSS_RTOL, Result


def strategy_table() -> list[tuple[str, str, dict[str, str]]]:
    """The declared lowering-strategy kinds with their per-target choices (the layers declare them)."""
    import hloforge.plugins.layers.conv  # noqa: F401 - declares "conv2d"
    import hloforge.plugins.layers.norm  # noqa: F401 - declares "bnReduce"
    import hloforge.plugins.layers.pool  # noqa: F401 - declares "maxPool"
    from hloforge.core import strategy

    return strategy.table()


def strategy_lines() -> list[str]:
    """strategy_table as printed: each kind, its choice per target and its choices, in columns as wide as the
    widest kind and the widest choices (the kinds run from `sums` to `tokenProduct`)."""
    rows = [(kind, ", ".join(f"{t}={c}" for t, c in per_target.items()), choices)
            for kind, choices, per_target in strategy_table()]
    kind_w, chosen_w = (max((len(r[i]) for r in rows), default=0) for i in (0, 1))
    return [f"  {kind:{kind_w}}  {chosen:{chosen_w}}  (choices: {choices})" for kind, chosen, choices in rows]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("hloforge", "numpy", "jax", "jaxlib", "optax", "torch"):
        try:
            out[mod] = str(__import__(mod).__version__)
        except Exception:  # noqa: BLE001 - absent or odd module: just leave it out
            pass
    return out


def sanity(results: Sequence[Result]) -> list[tuple[str, bool]]:
    """First-step losses of every peer against hloforge-xla (or the first backend that ran)."""
    lines: list[tuple[str, bool]] = []
    for net in dict.fromkeys(r.net for r in results):
        rows = [r for r in results if r.net == net and r.first_loss is not None]
        if len(rows) < 2:
            continue
        ref = next((r for r in rows if r.backend == "hloforge-xla"), rows[0])
        for r in rows:
            if r is ref:
                continue
            rel = abs(r.first_loss - ref.first_loss) / max(abs(ref.first_loss), 1e-30)  # type: ignore[operator]
            ok = rel <= LOSS_RTOL
            lines.append((f"{net}: {r.backend} first-step loss {r.first_loss:.7f} vs {ref.backend} "
                          f"{ref.first_loss:.7f} (rel {rel:.1e}) {'OK' if ok else 'MISMATCH'}", ok))
    return lines


def table(results: Sequence[Result], backends: Sequence[str], dispatch: dict[str, dict[str, Any]]) -> str:
    """One row per net (and one for dispatch), one column per backend: median and ratio to jax.jit;
    under each net a row of the measuring child's peak resident memory, MB, one of the median setup
    that compiled, s, and where some setup loaded its program from an on-disk cache one of those
    (each ratio to jax.jit's peak or compiling setup)."""
    def cell(value: float | None, base: float | None, unit: str) -> str:
        if value is None:
            return "-"
        ratio = f" ({value / base:.2f}x)" if base else ""
        digits = 3 if value < 1 else 2 if value < 10 else 1
        return f"{value:.{digits}f} {unit}{ratio}"

    head = ["net (batch)", *backends]
    rows = []
    for net in dict.fromkeys(r.net for r in results):
        mine = {r.backend: r for r in results if r.net == net}
        base = mine["jax.jit"].median_ms if "jax.jit" in mine else None
        batch = next(iter(mine.values())).batch
        rows.append([f"{net} ({batch})", *(cell(mine[b].median_ms if b in mine else None, base, "ms")
                                           for b in backends)])
        base = mine["jax.jit"].peak_rss_mb if "jax.jit" in mine else None
        rows.append(["  peak RSS", *(cell(mine[b].peak_rss_mb if b in mine else None, base, "MB")
                                     for b in backends)])
        cold = {b: statistics.median(r.cold_setups) for b, r in mine.items() if r.cold_setups}
        cached = {b: statistics.median(r.cached_setups) for b, r in mine.items() if r.cached_setups}
        rows.append(["  setup", *(cell(cold.get(b), cold.get("jax.jit"), "s") for b in backends)])
        if cached:
            rows.append(["  setup, cached", *(cell(cached.get(b), cold.get("jax.jit"), "s") for b in backends)])
    if dispatch:
        base = dispatch.get("jax.jit", {}).get("us")
        rows.append(["dispatch (a+1)", *(cell(dispatch.get(b, {}).get("us"), base, "us") for b in backends)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def throughput(results: Sequence[Result], backends: Sequence[str], gflop: dict[str, float | None],
               roofline: float | None) -> str:
    """Achieved GFLOP/s per net and backend (the step's FLOPs over its median time), with the
    percentage of the sgemm roofline, and the ratios the issue asks for: best hloforge backend
    over PyTorch eager, hloforge-xla over jax.jit."""
    head = ["net", "GFLOP/step", *backends, "best hf / torch", "hf-xla / jax"]
    rows = []
    for net in dict.fromkeys(r.net for r in results):
        mine = {r.backend: r.median_ms for r in results if r.net == net}
        work = gflop.get(net)

        def rate(ms: float | None, work: float | None = work) -> str:
            if ms is None or work is None:
                return "-"
            g = work / (ms / 1e3)
            return f"{g:.1f}" + (f" ({100 * g / roofline:.0f}%)" if roofline else "")

        ours = [m for b, m in mine.items() if b.startswith("hloforge-") and m is not None]
        torch_ms, jax_ms, xla_ms = mine.get("torch"), mine.get("jax.jit"), mine.get("hloforge-xla")
        rows.append([net, f"{work:.2f}" if work is not None else "-", *(rate(mine.get(b)) for b in backends),
                     f"{min(ours) / torch_ms:.2f}x" if ours and torch_ms else "-",
                     f"{xla_ms / jax_ms:.2f}x" if xla_ms and jax_ms else "-"])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def details(results: Sequence[Result], dispatch: dict[str, dict[str, Any]]) -> str:
    def rounds(r: Result) -> str:
        """Every round's setup where there were several: those that compiled, then the cache hits."""
        if len(r.cold_setups) + len(r.cached_setups) < 2:
            return ""
        parts = [f"{name} " + " ".join(f"{s:.2f}" for s in setups)
                 for name, setups in (("compiled", r.cold_setups), ("cached", r.cached_setups)) if setups]
        return f" ({'; '.join(parts)})"

    lines = ["", "per (net, backend): median / min ms per step over N timed steps, setup (compile) s, first loss, "
             "peak RSS"]
    for r in results:
        if r.ms:
            lines.append(f"  {r.net:12} {r.backend:14} median {r.median_ms:8.3f}  min {min(r.ms):8.3f}  "
                         f"N={len(r.ms):3}  setup {r.compile_s:7.2f}s{rounds(r)}  loss0 {r.first_loss:.6f}"
                         + (f"  peak {r.peak_rss_mb:.0f} MB" if r.peak_rss_mb is not None else "")
                         + (f"  ({r.note})" if r.note else ""))
        else:
            lines.append(f"  {r.net:12} {r.backend:14} {r.note}")
    for b, d in dispatch.items():
        if "us" in d:
            lines.append(f"  dispatch     {b:14} median {d['us']:8.1f} us/call over {d['calls']} calls, "
                         f"compile {d['compile_s']:.3f}s")
        else:
            lines.append(f"  dispatch     {b:14} {d['note']}")
    return "\n".join(lines)
