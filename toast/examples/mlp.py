"""The two-layer MLP of Figure 2a of the TOAST paper.

        def mlp(x : [256, 32], w1 : [32, 64], w2 : [64, 16]) {
            y : [256, 64] = matmul(x, w1)
            z : [256, 64] = ReLU(y)
            w : [256, 16] = matmul(z, w2)
            return w
        }

Lowers to ``dot_general``, a ``call @relu`` (a private function holding
``constant``, ``broadcast_in_dim``, ``maximum``) and a second ``dot_general``:
6 ops besides the returns.  The NDA finds four colors: B (256), X (32),
U (64) and W (16), as in Figure 4c.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["mlp"]


def mlp(*, batch: int = 256, d_in: int = 32, d_hidden: int = 64, d_out: int = 16,
        dtype=jnp.float32):
    """Returns ``(fn, args)`` for Figure 2a; arguments are named x, w1, w2.

    Args:
        batch: rows of ``x`` (the paper's 256, color B).
        d_in: columns of ``x`` / rows of ``w1`` (32, color X).
        d_hidden: the hidden width (64, color U).
        d_out: columns of ``w2`` (16, color W).
        dtype: element type of every argument.
    """

    def mlp(x, w1, w2):
        y = x @ w1
        z = jax.nn.relu(y)
        w = z @ w2
        return w

    args = (
        jax.ShapeDtypeStruct((batch, d_in), dtype),      # x
        jax.ShapeDtypeStruct((d_in, d_hidden), dtype),   # w1
        jax.ShapeDtypeStruct((d_hidden, d_out), dtype),  # w2
    )
    return mlp, args
