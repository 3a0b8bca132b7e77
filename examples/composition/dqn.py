"""A DQN on the composition sessions (docs/composition.md): a Q-net learns a chain MDP.

States 0..N−1 in a row, actions left / right; stepping right into state N−1 pays 1 and ends the
episode. The replay buffer holds every transition; each step fits Q(s, a) to the TD target
r + γ·max Q_target(s'), whose cotangent is formed on the host, through the Q-net's VJP and one Adam
step. The target net tracks the online θ by Polyak averaging, reading θ every step through
`read_params_prefix`. Q* is γ to the number of further steps to the goal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hloforge.core.spec import NetSpec
from hloforge.plugins.layers.dense import Dense
from hloforge.train.composition import OptimizerStepSession, VjpSession
from hloforge.train.session import ForwardSession

N, GAMMA, TAU = 6, 0.9, 0.1
LEFT, RIGHT = 0, 1


def q_net() -> NetSpec:
    return NetSpec("dqn-q", (N,), (Dense(16, act="relu"), Dense(2)), 2)


def transitions() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (s, a, r, s', done) of the chain, states one-hot."""
    s = np.repeat(np.arange(N - 1), 2)  # each non-terminal state, left then right
    a = np.tile([LEFT, RIGHT], N - 1)
    s2 = np.where(a == LEFT, np.maximum(s - 1, 0), s + 1)
    goal = (s2 == N - 1).astype(np.float32)  # the reward, and the end of the episode
    eye = np.eye(N, dtype=np.float32)
    return eye[s], a, goal, eye[s2], goal


def q_star() -> np.ndarray:
    """[N − 1, 2]: the optimal action values of the non-terminal states."""
    dist = np.arange(N - 2, -1, -1)  # steps right to the goal, minus one
    return np.stack([GAMMA * GAMMA ** np.minimum(dist + 1, N - 2), GAMMA ** dist], axis=1).astype(np.float32)


def train(backend: Any, steps: int = 300, lr: float = 1e-2, seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """Train; returns Q of every non-terminal state [N − 1, 2] and the TD loss of every step."""
    s, a, r, s2, done = transitions()
    batch = len(s)
    q = VjpSession(q_net(), batch, backend, seed=seed)
    opt = OptimizerStepSession(q.spec, "adam", backend, params=q.theta)
    target, target_theta = ForwardSession(q.spec, batch, backend), q.read_params()
    rows = np.arange(batch)
    losses = []
    for _ in range(steps):
        y = r + GAMMA * (1.0 - done) * target.logits(s2, target_theta).max(axis=1)
        _, grads, _ = q.vjp(s, _td_cotangent(q.forward(s), rows, a, y, losses))
        opt.step(grads, lr)
        theta = q.read_params_prefix()  # the online θ, every step
        target_theta = [TAU * p + (1.0 - TAU) * t for p, t in zip(theta, target_theta, strict=True)]
    return q.forward(s)[::2], losses  # rows of state 0, 1, …: one per state


def _td_cotangent(qs: np.ndarray, rows: np.ndarray, a: np.ndarray, y: np.ndarray, losses: list[float]) -> np.ndarray:
    """The cotangent of mean (Q(s, a) − y)² on the Q-net's output (zero on the actions not taken)."""
    err = qs[rows, a] - y
    losses.append(float((err**2).mean()))
    gbar = np.zeros_like(qs)
    gbar[rows, a] = 2.0 * err / len(rows)
    return gbar
