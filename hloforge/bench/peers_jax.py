"""The jax peer: the net as the layers' jax.numpy references, `value_and_grad` and `optax.adam`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hloforge.bench.common import StepFn, load_net


def jax_forward(spec: Any) -> Callable[[Sequence[Any], Any], Any]:
    """The net as a composition of the layers' jax.numpy references (as tests/test_train_step.py)."""
    walk = spec.walk()

    def forward(ps: Sequence[Any], x: Any) -> Any:
        it = iter(ps)
        for ls in walk:
            x = ls.layer.reference({s.name: next(it) for s in ls.slots}, x, None)
        return x

    return forward


def jax_adam_step(spec: Any, lr: float) -> tuple[Any, Callable[..., Any]]:
    """The jax peer: (optax transform, train_step(θ, state, x, y) -> (θ', state', loss)) with
    hloforge's Adam hyper-parameters and mean softmax cross-entropy over every label."""
    import jax
    import jax.numpy as jnp
    import optax

    from hloforge.core.registry import default_registry

    adam = default_registry().make("optimizer", "adam")
    forward = jax_forward(spec)
    tx = optax.adam(lr, b1=adam.b1, b2=adam.b2, eps=adam.eps)

    def loss_fn(ps: Any, x: Any, y: Any) -> Any:
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(forward(ps, x), y))

    def train_step(ps: Any, st: Any, x: Any, y: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        upd, st = tx.update(g, st, ps)
        return optax.apply_updates(ps, upd), st, loss

    return tx, train_step


def make_jax(net: str, batch: int, lr: float, seed: int) -> tuple[float, StepFn, str]:
    import jax

    spec = load_net(net)
    tx, train_step = jax_adam_step(spec, lr)

    cpu = jax.devices("cpu")[0]
    x0 = np.zeros((batch, *spec.input_shape), np.float32)
    y0 = np.zeros((batch,), np.int32)
    t = time.perf_counter()  # setup as every peer counts it: θ drawn and placed, optimizer state, compile
    params = [jax.device_put(np.asarray(p, np.float32), cpu) for p in spec.init_params(seed)]
    opt_state = tx.init(params)
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, opt_state, x0, y0).compile()
    compile_s = time.perf_counter() - t
    state = [params, opt_state]

    def step(x: np.ndarray, y: np.ndarray) -> float:
        ps, st, loss = compiled(state[0], state[1], x, y)
        state[0], state[1] = ps, st
        return float(loss.block_until_ready())

    return compile_s, step, ""
