"""Function ``f`` of section 2.2 of the TOAST paper: the smallest sharding conflict.

        def f(x : [32, 4]) {
            y : [4, 32] = transpose(x)
            z : [32, 32] = matmul(x, y)
            return z
        }

``x`` reaches the matmul along two dataflow paths (directly and through the
transpose), so after identifying names with both I and M, the result ``z``
carries the same dimension name (S) twice: a conflict.  Lowers to
``stablehlo.transpose`` and ``stablehlo.dot_general``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["transpose_matmul"]


def transpose_matmul(*, rows: int = 32, cols: int = 4, dtype=jnp.float32):
    """Returns ``(fn, args)`` for ``f``; the one argument is named x.

    Args:
        rows: first dimension of ``x`` (the paper's 32, name S).
        cols: second dimension of ``x`` (the paper's 4, name T).
        dtype: element type of ``x``.
    """

    def f(x):
        y = x.T
        z = x @ y
        return z

    return f, (jax.ShapeDtypeStruct((rows, cols), dtype),)
