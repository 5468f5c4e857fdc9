"""Fact writing: reshape factorization and dot_general dim positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from toast.facts.writer import program_facts, reshape_factors
from toast.frontend.stablehlo import read_callable


@pytest.mark.parametrize(
    ("in_shape", "out_shape", "expected"),
    [
        # Split and merge of heads: D is identified with H (major factor 12).
        ((4, 128, 768), (4, 128, 12, 64), [(0, 0, 4, True), (1, 1, 128, True), (2, 2, 12, False)]),
        ((4, 128, 12, 64), (4, 128, 768), [(0, 0, 4, True), (1, 1, 128, True), (2, 2, 12, False)]),
        # Shardy's table (op-rules.md section 8): 2x4 -> 8 shares i (2) as the major factor.
        ((2, 4), (8,), [(0, 0, 2, False)]),
        ((8,), (2, 4), [(0, 0, 2, False)]),
        # 8x4x5 -> 2x16x5: i (2) major on both sides; l (5) kept; j, k are minor somewhere.
        ((8, 4, 5), (2, 16, 5), [(0, 0, 2, False), (2, 2, 5, True)]),
        # 6x4 -> 4x6: only i (gcd 2) is major on both sides.
        ((6, 4), (4, 6), [(0, 0, 2, False)]),
        # 3x2 -> 2x3: gcd 1, nothing shared.
        ((3, 2), (2, 3), []),
        # size-1 dims hold no factor.
        ((1, 8, 4), (8, 1, 4, 1), [(1, 0, 8, True), (2, 2, 4, True)]),
        ((1, 1), (), []),
    ],
)
def test_reshape_factors(in_shape, out_shape, expected):
    assert reshape_factors(in_shape, out_shape) == expected


def test_dot_general_free_dims_follow_batch_dims():
    def f(a, b):
        return jnp.einsum("bij,bjk->bik", a, b)

    program = read_callable(f, [jax.ShapeDtypeStruct((2, 3, 4), jnp.float32),
                                jax.ShapeDtypeStruct((2, 4, 5), jnp.float32)])
    facts, names = program_facts(program)
    dot = next(op.id for op in program.ops if op.kind == "stablehlo.dot_general")
    assert [r for r in facts["dot_batch"] if r[0] == dot] == [(dot, 0, 0, 0)]
    assert [r for r in facts["dot_contract"] if r[0] == dot] == [(dot, 2, 1)]
    assert sorted(r for r in facts["dot_free"] if r[0] == dot) == [(dot, 0, 1, 1), (dot, 1, 2, 2)]
    # Names: one per definition dim, then one per use dim.
    assert names.count == len(facts["def_dim"]) + len(facts["use_dim"])
    assert len({row[0] for row in facts["def_dim"] + facts["use_dim"]}) == names.count


def test_a_malformed_attribute_is_an_error_not_dropped_rows():
    """zip(strict=True): a dot_general whose lhs has two batch dims and rhs one must not lose a
    row silently."""
    import dataclasses

    from toast.errors import InputError

    def f(a, b):
        return jnp.einsum("bij,bjk->bik", a, b)

    program = read_callable(f, [jax.ShapeDtypeStruct((2, 3, 4), jnp.float32),
                                jax.ShapeDtypeStruct((2, 4, 5), jnp.float32)])
    dot = next(op for op in program.ops if op.kind == "stablehlo.dot_general")
    numbers = dict(dot.attr("dot_dimension_numbers"), lhs_batching_dimensions=(0, 1))
    broken = dataclasses.replace(dot, attrs=tuple((k, numbers if k == "dot_dimension_numbers" else v)
                                                  for k, v in dot.attrs))
    ops = tuple(broken if op.id == dot.id else op for op in program.ops)
    with pytest.raises(InputError, match="dot_general has malformed attributes"):
        program_facts(dataclasses.replace(program, ops=ops))


def test_uses_are_numbered_once_for_every_stage():
    """The numbering the facts carry is the one later stages look up (DimensionNames)."""

    def f(a, b):
        return a @ b + 1.0

    program = read_callable(f, [jax.ShapeDtypeStruct((3, 4), jnp.float32), jax.ShapeDtypeStruct((4, 5), jnp.float32)])
    facts, names = program_facts(program)
    for op_id, operand, use_id, value_id in facts["operand"]:
        assert names.use_id(op_id, operand) == use_id
        site = names.use_sites[use_id]
        assert (site.op, site.operand, site.value) == (op_id, operand, value_id)
        rank = len(program.values[value_id].shape)
        assert [r for r in facts["use_dim"] if r[1] == use_id] == [
            (names.use_name(op_id, operand, d), use_id, d) for d in range(rank)]
