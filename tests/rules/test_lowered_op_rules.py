"""Per-rule fixtures on tiny JAX functions: the colors of the arguments' and results' dims.

Expected partitions are written by hand from each op's semantics; only the dims of function
arguments and results are compared (JAX adds helper values in between).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import engines
from jax import lax

from toast import analyze


def _f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _partition(fn, args, engine):
    analysis = analyze("fixture", fn=fn, args=args, engine=engine)
    assert analysis.invalid == ()
    assert analysis.unruled_ops == ()
    boundary = {analysis.program.values[v].name for v in analysis.program.arguments + analysis.program.results}
    colors = set()
    for color in analysis.colors:
        members = frozenset(f"{d.value}:{d.dim}" for d in color.dims if d.value in boundary)
        if members:
            colors.add(members)
    return colors


def conv_same(x, k):
    return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_strided(x, k):
    return lax.conv_general_dilated(x, k, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def sort_pairs(keys, values):
    return lax.sort((keys, values), dimension=1, num_keys=1)


def max_pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 1), (1, 2, 1), "VALID")


def branch(p, x):
    return lax.cond(p, lambda v: v * 2.0, lambda v: v + 1.0, x)


def erf(x):
    return lax.erf(x)


def iota_plus(x):
    return x + jnp.arange(x.shape[1], dtype=x.dtype)


CASES = {
    # batch, input features contract with the kernel's, output features; a 3-wide window at the "same"
    # size reads a row of each neighbour (a halo exchange when split: halo_dim), so the spatial dims map.
    "convolution SAME": (conv_same, (_f32(2, 8, 8, 3), _f32(3, 3, 3, 5)), [
        {"x:0", "result:0"}, {"x:1", "result:1"}, {"x:2", "result:2"}, {"x:3", "k:2"},
        {"k:3", "result:3"}, {"k:0"}, {"k:1"}]),
    # a 1x1 kernel at stride 1: each output pixel reads its own input pixel, spatial dims map.
    "convolution 1x1": (conv_same, (_f32(2, 8, 8, 3), _f32(1, 1, 3, 5)), [
        {"x:0", "result:0"}, {"x:1", "result:1"}, {"x:2", "result:2"}, {"x:3", "k:2"},
        {"k:3", "result:3"}, {"k:0"}, {"k:1"}]),
    # a strided spatial dim changes size: not identified.
    "convolution strided": (conv_strided, (_f32(2, 8, 8, 3), _f32(2, 2, 3, 5)), [
        {"x:0", "result:0"}, {"x:1"}, {"x:2"}, {"result:1"}, {"result:2"}, {"x:3", "k:2"},
        {"k:3", "result:3"}, {"k:0"}, {"k:1"}]),
    # variadic sort: all operands and results along the unsorted dim only.
    "sort": (sort_pairs, (_f32(4, 6), _f32(4, 6)), [
        {"keys:0", "values:0", "result[0]:0", "result[1]:0"}, {"keys:1"}, {"values:1"},
        {"result[0]:1"}, {"result[1]:1"}]),
    # reduce_window: dims with a trivial window map; the pooled dim does not.
    "reduce_window": (max_pool, (_f32(3, 8, 5),), [
        {"x:0", "result:0"}, {"x:1"}, {"result:1"}, {"x:2", "result:2"}]),
    # case: both branches return values carried to the result.
    "case": (branch, (jax.ShapeDtypeStruct((), jnp.bool_), _f32(4, 6)), [
        {"x:0", "result:0"}, {"x:1", "result:1"}]),
    # chlo.erf is elementwise.
    "chlo elementwise": (erf, (_f32(4, 6),), [{"x:0", "result:0"}, {"x:1", "result:1"}]),
    # iota's dim takes the color of what it is added to.
    "iota": (iota_plus, (_f32(4, 6),), [{"x:0", "result:0"}, {"x:1", "result:1"}]),
}


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("name", sorted(CASES))
def test_lowered_op_rule(name, engine):
    fn, args, expected = CASES[name]
    assert _partition(fn, args, engine) == {frozenset(c) for c in expected}
