"""Adam written out in plain ``jnp`` (no optax), for the bundled training steps of the GNS and the U-Net.

    new_params, new_opt_state = adam_update(params, grads, opt_state, learning_rate)

``opt_state = {count: int32[], mu, nu}``, the step count and the first and second moments, each moment
shaped like ``params``; ``adam_state(params)`` gives its shapes for ``jax.ShapeDtypeStruct`` parameters.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["adam_state", "adam_update"]

_B1, _B2, _EPS = 0.9, 0.999, 1e-8  # Adam's defaults (Kingma and Ba)


def adam_update(params, grads, opt_state, learning_rate: float):
    """One Adam step in plain ``jnp``; returns ``(new_params, new_opt_state)``.

    ``opt_state`` is ``{count: int32[], mu, nu}``; ``mu`` and ``nu`` are shaped like ``params``.
    The bias corrections are folded into one scalar step size (Kingma and Ba, section 2):
    ``p - lr * sqrt(1 - b2^t) / (1 - b1^t) * mu / (sqrt(nu) + eps)``, ``t = count + 1``.
    """
    count = opt_state["count"] + 1
    t = count.astype(jnp.float32)
    # 1 - b^t as 1 - exp(t log b): the exponent is traced.
    correction_1 = 1 - jnp.exp(t * math.log(_B1))
    correction_2 = 1 - jnp.exp(t * math.log(_B2))
    step_size = learning_rate * jnp.sqrt(correction_2) / correction_1
    mu = jax.tree_util.tree_map(lambda m, g: _B1 * m + (1 - _B1) * g, opt_state["mu"], grads)
    nu = jax.tree_util.tree_map(lambda v, g: _B2 * v + (1 - _B2) * (g * g), opt_state["nu"], grads)
    new_params = jax.tree_util.tree_map(
        lambda p, m, v: p - step_size.astype(p.dtype) * m / (jnp.sqrt(v) + _EPS), params, mu, nu)
    return new_params, {"count": count, "mu": mu, "nu": nu}


def adam_state(params):
    """The Adam state's shapes for ``params`` (a pytree of ``jax.ShapeDtypeStruct``)."""
    return {"count": jax.ShapeDtypeStruct((), jnp.int32),
            "mu": jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), params),
            "nu": jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), params)}
