"""One program that exercises every StableHLO op kind the analysis has to handle.

The other examples are real models and use a small core of ops.  This one is not a model:
each line is there to make JAX emit one op kind (or one form of it), so a single lowering
covers the whole op list.  Lowered with ``jax.jit(fn).lower(*args)`` on CPU, ``main``,
its private functions and its regions hold:

=================================  =====================================================
StableHLO op                       written as
=================================  =====================================================
negate abs exponential log sqrt    ``-x``, ``jnp.abs``, ``jnp.exp``, ``jnp.log``, ...
rsqrt tanh sine cosine tan         ``lax.rsqrt``, ``jnp.tanh``, ``jnp.sin``, ...
floor ceil sign cbrt               ``jnp.floor``, ``jnp.ceil``, ``jnp.sign``, ``jnp.cbrt``
exponential_minus_one              ``jnp.expm1``
log_plus_one                       ``jnp.log1p``
round_nearest_even / _afz          ``jnp.round``, ``lax.round(.., AWAY_FROM_ZERO)``
is_finite                          ``jnp.isfinite``
add subtract multiply divide       ``+ - * /``
maximum minimum power remainder    ``jnp.maximum``, ``jnp.minimum``, ``lax.pow``, ``lax.rem``
atan2                              ``jnp.arctan2``
and or xor not                     ``& | ^ ~`` on int32
shift_left shift_right_*           ``<<``, ``>>`` (arithmetic), ``lax.shift_right_logical``
popcnt count_leading_zeros         ``lax.population_count``, ``lax.clz``
compare, select                    ``jnp.where(x > y, x, y)``
clamp                              ``lax.clamp(0., x, 1.)``
convert                            ``.astype(jnp.int32)``
bitcast_convert                    ``lax.bitcast_convert_type(x, jnp.int32)``
reduce_precision                   ``lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)``
broadcast_in_dim                   ``jnp.broadcast_to(row, (R, C))``
transpose                          ``x.T``
reshape (split, merge)             ``x.reshape(R, 4, C // 4)``, ``.reshape(R * 4, C // 4)``
dot_general (batch dims)           ``jnp.einsum('bij,bjk->bik', lhs, rhs)``
reduce                             ``jnp.sum(x, axis=0)``, ``jnp.max``
reduce (two results)               ``jnp.argmax(x, axis=1)`` (value and index)
reduce_window                      ``jnp.cumsum(x, axis=0)`` (private ``@cumsum``)
select_and_scatter                 gradient of a max ``lax.reduce_window``
convolution                        ``lax.conv_general_dilated`` (1-D, NWC)
concatenate                        ``jnp.concatenate([x, y], axis=0)``
slice                              ``x[2:10, ::2]``
dynamic_slice                      ``lax.dynamic_slice(x, (start, 0), ..)``
dynamic_update_slice               ``lax.dynamic_update_slice(x, patch, (start, 0))``
pad                                ``lax.pad(x, 0., ((1, 2, 0), (0, 0, 1)))`` (interior too)
gather                             ``x[indices]``
scatter                            ``x.at[indices].add(..)``
gather, scatter (coordinate)       ``x[jnp.arange(n), labels]``, ``.at[jnp.arange(n), labels].add(..)``
iota                               ``lax.iota`` / ``jnp.arange``
sort (one operand)                 ``jnp.sort(x, axis=1)``
sort (two operands, two results)   ``lax.sort((keys, values), num_keys=1)``
reverse                            ``jnp.flip(x, axis=0)``
case                               ``lax.cond`` (two branches), ``lax.switch`` (three)
while                              ``lax.fori_loop(0, steps, ..)`` with a traced bound
optimization_barrier               ``lax.optimization_barrier``
rng_bit_generator                  ``lax.rng_bit_generator`` (two results)
constant (large, dense)            a closed-over numpy array of 1000 floats
custom_call                        ``jnp.linalg.cholesky`` (``@lapack_spotrf_ffi`` on CPU,
                                   two results), ``solve_triangular``
                                   (``@lapack_strsm_ffi``)
func.call                          ``jax.nn.relu`` and ``jnp.cumsum`` (private functions)
=================================  =====================================================

``extras=True`` adds ops outside StableHLO proper that JAX still emits for everyday code:
``chlo.square`` (``jnp.square``), ``chlo.erfc`` (exact ``jax.nn.gelu``), ``chlo.top_k``
(``lax.top_k``), ``chlo.lgamma``, ``chlo.sinh``, and complex-valued ``fft``, ``real``,
``imag``, ``complex`` (``jnp.fft.fft``).  These are kept out of the default program so
that it stays within plain StableHLO on real element types.

The custom_call targets depend on the platform the program is lowered for (LAPACK on CPU,
cuSOLVER/cuBLAS on GPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["ops_zoo", "ops_zoo_extras"]

# A large dense constant: JAX keeps closed-over numpy arrays as ``stablehlo.constant``.
_TABLE = np.cos(np.arange(1000, dtype=np.float32) / 7.0).astype(np.float32)


def ops_zoo(*, rows: int = 16, cols: int = 32, batch: int = 4, inner: int = 8,
            num_indices: int = 5, extras: bool = False):
    """Returns ``(fn, args)`` for the op-coverage program.

    Args:
        rows, cols: shape of the two f32 matrices ``x`` and ``y``; ``cols`` must be a
            multiple of 4 and ``rows`` at least 10.
        batch: batch size of the batched matmul ``lhs: [batch, inner, cols]``,
            ``rhs: [batch, cols, inner]``.
        inner: see ``batch``; also the size of the square ``matrix`` for the
            LAPACK custom_calls.
        num_indices: length of ``indices`` (gather / scatter).
        extras: also emit the chlo and complex-valued ops listed in the module docstring.

    Arguments of ``fn``: ``x, y: f32[rows, cols]``, ``lhs, rhs``, ``matrix: f32[inner,
    inner]``, ``indices: int32[num_indices]``, ``start: int32[]`` (a dynamic offset),
    ``steps: int32[]`` (a loop trip count), ``branch: int32[]`` (a ``lax.switch`` index).
    ``fn`` returns a dict of results so that nothing is dead.

    Long on purpose: the program is one function, as a user writes one, with an op or two per line
    (the table in the module docstring lists them); splitting it would change the lowered module.
    """
    if cols % 4 or rows < 10:
        raise ValueError(f"need cols % 4 == 0 and rows >= 10, got rows={rows}, cols={cols}")

    def ops_zoo(x, y, lhs, rhs, matrix, indices, start, steps, branch):
        """The program: one function, long on purpose (see the factory's docstring)."""
        out = {}
        # --- elementwise unary (float) ---
        out["unary"] = (-x + jnp.abs(x) + jnp.exp(x) + jnp.log(jnp.abs(x) + 1.0)
                        + jnp.sqrt(jnp.abs(x)) + lax.rsqrt(jnp.abs(x) + 1.0) + jnp.tanh(x)
                        + jnp.sin(x) + jnp.cos(x) + jnp.tan(x) + jnp.floor(x) + jnp.ceil(x)
                        + jnp.sign(x) + jnp.cbrt(x) + jnp.expm1(x) + jnp.log1p(jnp.abs(x))
                        + jnp.round(x) + lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO))
        out["is_finite"] = jnp.isfinite(x)                                   # is_finite
        # --- elementwise binary (float) ---
        out["binary"] = (x + y - x * y / (jnp.abs(y) + 1.0) + jnp.maximum(x, y)
                         + jnp.minimum(x, y) + lax.pow(jnp.abs(x), y) + lax.rem(x, y)
                         + jnp.arctan2(x, y))                                 # atan2
        # --- integer and bitwise ---
        xi = lax.bitcast_convert_type(x, jnp.int32)                          # bitcast_convert
        yi = y.astype(jnp.int32)                                             # convert
        out["bits"] = ((xi & yi) | (xi ^ yi)) + ~xi                          # and or xor not
        out["bits"] += (xi << 1) + (xi >> 2)                                 # shl, shr arithmetic
        out["bits"] += lax.shift_right_logical(xi, 3)                        # shift_right_logical
        out["bits"] += lax.population_count(xi) + lax.clz(xi)                # popcnt, clz
        # --- compare, select, clamp, reduce_precision ---
        out["where"] = jnp.where(x > y, x, y)                                # compare, select
        out["clamp"] = lax.clamp(0.0, x, 1.0)                                # clamp
        out["bf16ish"] = lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)
        # --- shapes: broadcast, transpose, reshape split and merge ---
        row = jnp.sum(x, axis=0)                                             # reduce
        out["broadcast"] = jnp.broadcast_to(row, (rows, cols)) * y           # broadcast_in_dim
        out["transpose"] = x.T                                               # transpose
        split = x.reshape(rows, 4, cols // 4)                                # reshape (split)
        out["merge"] = jnp.max(split, axis=1).reshape(rows * cols // 4)      # reshape (merge)
        # --- contraction with batch dimensions ---
        out["batched"] = jnp.einsum("bij,bjk->bik", lhs, rhs)                # dot_general (batch)
        # --- multi-result reduce, cumulative reduce_window ---
        out["argmax"] = jnp.argmax(x, axis=1)                                # reduce with 2 results
        out["cumsum"] = jnp.cumsum(x, axis=0)                                # reduce_window
        # --- windowed max and its gradient ---
        def pooled(t):
            return lax.reduce_window(t, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID").sum()
        out["pool_grad"] = jax.grad(pooled)(x)                               # select_and_scatter
        # --- convolution (1-D, NWC / WIO) ---
        out["conv"] = lax.conv_general_dilated(
            x[None], jnp.ones((3, cols, 8), x.dtype), window_strides=(1,), padding="SAME",
            dimension_numbers=("NWC", "WIO", "NWC"))                         # convolution
        # --- concatenate, slice, dynamic slice and update, pad ---
        out["concat"] = jnp.concatenate([x, y], axis=0)                      # concatenate
        out["slice"] = x[2:10, ::2]                                          # slice (strided)
        window = lax.dynamic_slice(x, (start, 0), (4, cols))                 # dynamic_slice
        patch = window * 2.0
        out["updated"] = lax.dynamic_update_slice(y, patch, (start, 0))      # dynamic_update_slice
        out["pad"] = lax.pad(x, 0.0, ((1, 2, 0), (0, 0, 1)))                 # pad (interior too)
        # --- gather, scatter ---
        out["gather"] = x[indices]                                           # gather
        out["scatter"] = x.at[indices].add(y[:num_indices])                  # scatter
        # --- iota, sort, reverse ---
        out["iota"] = lax.iota(jnp.int32, rows) * 2                          # iota
        out["sorted"] = jnp.sort(x, axis=1)                                  # sort
        keys, perm = lax.sort((x, jnp.broadcast_to(jnp.arange(cols), (rows, cols))),
                              dimension=1, num_keys=1)                       # sort, 2 results
        out["sort_keys"], out["sort_perm"] = keys, perm
        out["reverse"] = jnp.flip(x, axis=0)                                 # reverse
        # --- control flow ---
        out["cond"] = lax.cond(jnp.sum(x) > 0.0, lambda t: t * 2.0,
                               lambda t: t - 1.0, x)                         # case (2 branches)
        out["switch"] = lax.switch(branch, [lambda t: t, jnp.sin, jnp.cos], x)  # case (3 branches)
        out["loop"] = lax.fori_loop(0, steps, lambda i, t: t * 0.5 + y, x)   # while
        # --- barrier, random bits ---
        a, b = lax.optimization_barrier((x, y))                              # optimization_barrier
        out["barrier"] = a + b
        key, bits = lax.rng_bit_generator(jnp.zeros((4,), jnp.uint32), (rows, cols))
        out["rng_key"], out["rng_bits"] = key, bits                          # rng_bit_generator
        # --- a large dense constant, and a call to a private function ---
        out["table"] = jnp.asarray(_TABLE)[indices]                          # constant (1000)
        out["relu"] = jax.nn.relu(x)                                         # func.call @relu
        # --- custom_call (LAPACK on CPU) ---
        spd = matrix @ matrix.T + inner * jnp.eye(inner, dtype=matrix.dtype)
        chol = jnp.linalg.cholesky(spd)                                      # custom_call potrf
        out["cholesky"] = chol
        solve = jax.scipy.linalg.solve_triangular
        out["solve"] = solve(chol, lhs[0], lower=True)                       # custom_call trsm
        # --- a coordinate gather and scatter: an iota index column (a loss's log-probability per label) ---
        first = x[:num_indices]
        rows_at = jnp.arange(num_indices)
        out["picked"] = first[rows_at, indices]                              # gather (coordinate)
        out["picked_grad"] = first.at[rows_at, indices].add(1.0)             # scatter (coordinate)
        if extras:
            out["square"] = jnp.square(x)                                    # chlo.square
            out["erf_gelu"] = jax.nn.gelu(x, approximate=False)              # chlo.erfc
            out["top_k"] = lax.top_k(x, 3)                                   # chlo.top_k
            out["lgamma"] = lax.lgamma(jnp.abs(x) + 1.0)                     # chlo.lgamma
            out["sinh"] = jnp.sinh(x)                                        # chlo.sinh
            spectrum = jnp.fft.fft(x, axis=1)                                # fft (complex)
            out["fft"] = jnp.real(spectrum) + jnp.imag(spectrum)             # real, imag
            out["complex"] = lax.complex(x, y)                               # complex
        return out

    f32 = jnp.float32
    args = (
        jax.ShapeDtypeStruct((rows, cols), f32),                # x
        jax.ShapeDtypeStruct((rows, cols), f32),                # y
        jax.ShapeDtypeStruct((batch, inner, cols), f32),        # lhs
        jax.ShapeDtypeStruct((batch, cols, inner), f32),        # rhs
        jax.ShapeDtypeStruct((inner, inner), f32),              # matrix
        jax.ShapeDtypeStruct((num_indices,), jnp.int32),        # indices
        jax.ShapeDtypeStruct((), jnp.int32),                    # start
        jax.ShapeDtypeStruct((), jnp.int32),                    # steps
        jax.ShapeDtypeStruct((), jnp.int32),                    # branch
    )
    return ops_zoo, args


def ops_zoo_extras(**settings):
    """``ops_zoo(extras=True)``: adds chlo ops (square, erfc, top_k, lgamma, sinh) and
    complex-valued fft / real / imag / complex."""
    return ops_zoo(extras=True, **settings)
