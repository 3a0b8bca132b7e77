"""A MuZero-style unroll on the composition sessions (docs/composition.md).

Representation h (observation -> state), dynamics g ([state | one-hot action] -> next state) and
prediction f (state -> policy logits and a value), unrolled K steps. The value (squared error) and
policy (cross-entropy) losses and their cotangents are computed on the host; the backward pass
walks f, g (K times) and h, each net's ∂x the cotangent of what fed it; the K gradients of g (and
the K + 1 of f) are summed on the device; then one Adam step per net.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hloforge.core.spec import NetSpec
from hloforge.plugins.layers.dense import Dense
from hloforge.train.composition import Gradients, OptimizerStepSession, VjpSession

OBS, STATE, ACTIONS, HIDDEN = 6, 4, 3, 8


def nets() -> dict[str, NetSpec]:
    """h, g and f: two dense layers each."""
    return {
        "h": NetSpec("muzero-h", (OBS,), (Dense(HIDDEN, act="swish"), Dense(STATE)), STATE),
        "g": NetSpec("muzero-g", (STATE + ACTIONS,), (Dense(HIDDEN, act="swish"), Dense(STATE)), STATE),
        "f": NetSpec("muzero-f", (STATE,), (Dense(HIDDEN, act="swish"), Dense(ACTIONS + 1)), ACTIONS + 1),
    }


def policy_value_loss(out: np.ndarray, policy: np.ndarray, value: np.ndarray) -> tuple[float, np.ndarray]:
    """Σ over the batch of CE(policy, softmax(logits)) + (v − value)², divided by the batch, and its
    cotangent on f's output [B, ACTIONS + 1] (logits, then the value)."""
    batch = len(out)
    logits, v = out[:, :ACTIONS], out[:, ACTIONS]
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = (-(policy * logp).sum() + ((v - value) ** 2).sum()) / batch
    cot = np.empty_like(out)
    cot[:, :ACTIONS] = (np.exp(logp) * policy.sum(axis=1, keepdims=True) - policy) / batch
    cot[:, ACTIONS] = 2.0 * (v - value) / batch
    return float(loss), cot


class MuZero:
    """The three nets' VjpSessions and, sharing their θ, one OptimizerStepSession each."""

    def __init__(self, batch: int, backend: Any, *, seed: int = 0, optimizer: str = "adam"):
        self.vjp = {name: VjpSession(spec, batch, backend, seed=seed + i)
                    for i, (name, spec) in enumerate(nets().items())}
        self.opt = {name: OptimizerStepSession(s.spec, optimizer, backend, params=s.theta)
                    for name, s in self.vjp.items()}

    def gradients(self, obs: np.ndarray, actions: np.ndarray, policy: np.ndarray,
                  value: np.ndarray) -> tuple[float, dict[str, Gradients]]:
        """obs [B, OBS], actions [K, B] (ints), policy targets [K + 1, B, ACTIONS], value targets
        [K + 1, B]: the unroll's loss and each net's gradient (device buffers)."""
        h, g, f = self.vjp["h"], self.vjp["g"], self.vjp["f"]
        steps = len(actions)
        # forward: s_0 = h(obs), s_k+1 = g([s_k | a_k]), (logits_k, v_k) = f(s_k)
        states = [h.forward(obs)]
        g_in = []
        for k in range(steps):
            g_in.append(np.concatenate([states[k], np.eye(ACTIONS, dtype=np.float32)[actions[k]]], axis=1))
            states.append(g.forward(g_in[k]))
        loss, cots = 0.0, []
        for k, s in enumerate(states):
            lk, ck = policy_value_loss(f.forward(s), policy[k], value[k])
            loss += lk
            cots.append(ck)
        # backward, last step first: s_k's cotangent is f's ∂x at s_k plus g's ∂x (its state part) at step k
        grads: dict[str, Gradients] = {}
        _, grads["f"], ds = f.vjp(states[steps], cots[steps])
        for k in reversed(range(steps)):
            _, grads["g"], d_in = g.vjp(g_in[k], ds, into=grads.get("g"))  # summed on the device
            _, grads["f"], ds_f = f.vjp(states[k], cots[k], into=grads["f"])
            ds = d_in[:, :STATE] + ds_f
        _, grads["h"], _ = h.vjp(obs, ds)
        return loss, grads

    def train_step(self, obs: np.ndarray, actions: np.ndarray, policy: np.ndarray, value: np.ndarray,
                   lr: float) -> float:
        """One unroll and one optimizer step per net; returns the loss before the step."""
        loss, grads = self.gradients(obs, actions, policy, value)
        for name, opt in self.opt.items():
            opt.step(grads[name], lr)
        return loss
