"""fp8 (E4M3) training, seed 003: fp32 master weights; before each step every weight slot is
projected onto the E4M3 grid per output channel (a conv kernel [oc, …] per oc, a dense [in, out]
per output column; biases, BN γ/β and layer scales stay fp32) and the input per tensor, on the
host with ml_dtypes' float8_e4m3fn. The SAME compiled train step runs on those operands (its
arithmetic stays fp32), and the update it returns is folded back into the master as a delta
(master += θq' − θq = master − lr·∇ for a plain step). Eval, checkpoints and the EMA-free
scorer see the fp32 master: between steps the session holds it.

Scope (as the seed's): fp8 weights and fp8 input; the intermediate activations and the
backward's cotangents are computed inside the fused step in fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hloforge.core.errors import UnsupportedSpec
from hloforge.core.spec import ParamSlot

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def quantize_e4m3(a: np.ndarray, channel_axis: int | None = None) -> np.ndarray:
    """`a` projected onto the E4M3 grid (returned in float32): scaled so the largest magnitude maps
    to 448, per tensor (`channel_axis` None) or per slice along `channel_axis`."""
    import ml_dtypes

    a = np.asarray(a, np.float32)
    if channel_axis is None:
        amax = np.max(np.abs(a), keepdims=True) if a.size else np.zeros((1,) * a.ndim, np.float32)
    else:
        axes = tuple(i for i in range(a.ndim) if i != channel_axis % a.ndim)
        amax = np.max(np.abs(a), axis=axes, keepdims=True)
    scale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    q = (a / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return q * scale


def channel_axis(slot: ParamSlot) -> int | None:
    """The output-channel axis of a weight slot, or None for a slot that stays fp32."""
    if slot.init == "he_fan_out":  # conv kernel [oc, ic/groups, kh, kw]
        return 0
    if slot.init == "glorot":  # dense [in, out] (and the other projection matrices)
        return -1
    return None


def quantize_params(params: Sequence[np.ndarray], slots: Sequence[ParamSlot]) -> list[np.ndarray]:
    out = []
    for p, s in zip(params, slots, strict=True):
        ax = channel_axis(s)
        out.append(np.asarray(p, np.float32) if ax is None else quantize_e4m3(p, ax))
    return out


def check_variant(variant: Any, spec: Any = None) -> None:
    from hloforge.train.inputs import token_vocab

    vocab = None if spec is None else token_vocab(spec)
    if vocab is not None:  # scaled onto E4M3's 3-bit-mantissa grid, most ids would round to another id
        raise UnsupportedSpec(f"precision fp8 with net {spec.name!r}, whose input is token ids (vocabulary {vocab}): "
                              "E4M3 cannot hold the ids, the input would be other tokens; expected precision fp32")
    if variant.ema:
        raise UnsupportedSpec("precision fp8 with an EMA shadow: the shadow would average the fp8 operands, not "
                              "the fp32 master; train fp8 without --ema")


def fp8_train_step(session: Any, x: np.ndarray, y: np.ndarray, lr: float,
                   masks: Sequence[np.ndarray] | None = None) -> float:
    """One step of `session` (a TrainSession) on E4M3 weights and input; θ returns to the updated
    fp32 master. Returns the batch loss."""
    slots = [s for _, s in session.layout.params]
    master = session.read_params()
    q = quantize_params(master, slots)
    session.replace_params(q)
    loss = float(session.train_step(quantize_e4m3(x), y, lr, masks))
    out = session.read_params()
    session.replace_params([m + (o - w) if channel_axis(s) is not None else o
                            for m, o, w, s in zip(master, out, q, slots, strict=True)])
    return loss
