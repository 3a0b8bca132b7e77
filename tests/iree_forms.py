"""Shared by the strategy tests: one layer's (y, ∂θ, ∂x) on IREE in a chosen form and on XLA in
the portable (gated) form, from the same random inputs. IREE has no f64, so this f32 agreement is
how a form the XLA gate checks is checked on IREE too."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from hloforge.core import strategy
from hloforge.core.modules import vjp_module
from hloforge.train.session import make_backend


def layer_vjp_on_iree_and_xla(layer: Any, shape: tuple[int, ...], choice: Mapping[str, str] | None = None,
                              batch: int = 3) -> tuple[str, str, list[np.ndarray], list[np.ndarray]]:
    """(IREE text, portable text, IREE outputs, XLA outputs); `choice` is forced on the IREE render
    (None: IREE's own defaults)."""
    want_text = vjp_module([layer], shape, batch, target=None)
    with strategy.forced(choice or {}):
        got_text = vjp_module([layer], shape, batch, target="iree")
    sig = re.search(r"@main\((.*?)\) ->", want_text)
    assert sig is not None
    shapes = [tuple(int(d) for d in t.split("x")[:-1]) for t in re.findall(r"tensor<([0-9x]*)f32>", sig.group(1))]
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def run(be: Any, text: str) -> list[np.ndarray]:
        outs = be.execute(be.compile(text), [be.to_device(a) for a in ins])
        return [np.asarray(be.to_host(o), np.float64) for o in outs]

    return got_text, want_text, run(make_backend("iree"), got_text), run(make_backend("xla"), want_text)
