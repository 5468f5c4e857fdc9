"""The simplified attention of Figure 5a of the TOAST paper.

        def attn(x : [S, D], wq : [D, H1], wk : [D, H1], wv : [D, H2]) {
            k : [S, H1] = matmul(x, wk)
            v : [S, H2] = matmul(x, wv)
            q : [S, H1] = matmul(x, wq)
            qt: [H1, S] = transpose(q)
            a : [S, S]  = matmul(k, qt)
            b : [S]     = reduce_{1,add}(a)      # mock softmax (averaging) ...
            c : [S, S]  = broadcast_0(b)
            d : [S, S]  = div(a, c)              # ... end of mock softmax
            z : [S, H2] = matmul(d, v)
            return z
        }

It lowers to exactly these StableHLO ops, in this order: ``dot_general`` x3,
``transpose``, ``dot_general``, ``reduce`` (whose body is ``add`` and
``return``), ``broadcast_in_dim``, ``divide``, ``dot_general``, plus the
``constant`` 0 that initialises the reduce.

Which axis is reduced.  The paper's rules (Figure 3) number dimensions from 1,
so ``reduce_{1,add}`` sums over the *first* dimension of ``a`` and
``broadcast_0`` puts the new dimension in front: ``c[i, j] = b[j]``.  This is
the reading under which the sequence-sharded version of Figure 5b needs only
the all_gather of ``k`` and the reduce_scatter of ``z``: with ``a`` sharded on
its last dimension the reduce over the first one is local.  That is the
default here (``reduce_axis=0``).  ``reduce_axis=1`` gives the other reading
(``b = a.sum(1)``, ``c[i, j] = b[i]``, a row normalisation), which lowers to
the same op multiset and the same dimension-graph shape (five conflicts), but
under Figure 5b's sharding its reduce crosses devices.  Both variants write the
broadcast with ``lax.broadcast_in_dim`` so there is exactly one
``broadcast_in_dim`` (``a / b[:, None]`` would lower to two).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["attention"]


def attention(*, seq: int = 128, d_model: int = 64, h1: int = 32, h2: int = 32,
              reduce_axis: int = 0, dtype=jnp.float32):
    """Returns ``(fn, args)`` for Figure 5a; arguments are named x, wq, wk, wv.

    Args:
        seq: S, the sequence length (rows of ``x``).
        d_model: D, the model width.
        h1: H1, the query/key width.
        h2: H2, the value width.
        reduce_axis: 0 (the paper, see the module docstring) or 1.
        dtype: element type of every argument.
    """
    if reduce_axis not in (0, 1):
        raise ValueError(f"reduce_axis must be 0 or 1, got {reduce_axis!r}")
    # The kept dimension of ``a`` is the one ``b`` is broadcast back along.
    kept = 1 - reduce_axis

    def attn(x, wq, wk, wv):
        k = x @ wk
        v = x @ wv
        q = x @ wq
        qt = q.T
        a = k @ qt
        b = a.sum(reduce_axis)
        c = lax.broadcast_in_dim(b, a.shape, (kept,))
        d = a / c
        z = d @ v
        return z

    args = (
        jax.ShapeDtypeStruct((seq, d_model), dtype),  # x
        jax.ShapeDtypeStruct((d_model, h1), dtype),   # wq
        jax.ShapeDtypeStruct((d_model, h1), dtype),   # wk
        jax.ShapeDtypeStruct((d_model, h2), dtype),   # wv
    )
    return attn, args
