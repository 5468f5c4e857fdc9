"""Tiny per-rule fixtures: one op in a hand-written StableHLO function, the expected colors.

Each fixture lists the expected partition of the definition dims (``value:dim``) into
colors, written by hand from the op's semantics (StableHLO spec) and the rule's intent.
"""

from __future__ import annotations

import pytest
from conftest import engines

from toast import analyze, read_text


def _colors(text: str, engine: str) -> set[frozenset[str]]:
    analysis = analyze(read_text(text, source="fixture.mlir"), engine=engine)
    assert analysis.invalid == ()
    assert analysis.unruled_ops == ()
    # The colors of the named values (arguments, results): a fixture of several ops leaves out its steps (%0 ...).
    named = ({f"{d.value}:{d.dim}" for d in color.dims if not d.value.startswith("%")} for color in analysis.colors)
    return {frozenset(dims) for dims in named if dims}


def _fn(signature: str, body: str) -> str:
    """A ``@main`` whose arguments carry JAX-style names: ``%x: T`` gets ``loc("x")``."""
    arguments, results = signature.split(") -> (")
    named = ", ".join(f'{arg} loc("{arg.split(":")[0].strip()[1:]}")' for arg in arguments.split(", "))
    return f"func.func @main({named}) -> ({results}) {{\n{body}\n}}\n"


# The start indices of x[jnp.arange(4), labels] (as jax.jit lowers it): the iota column, normalized as jnp
# normalizes every index (select(i < 0, i + 4, i)), then labels' column, concatenated along the index vector
# dim (1); {iota} names the iota's column before normalization.
_COORDINATES = (
    "  %0 = stablehlo.iota dim = 0 : tensor<4xi32>\n"
    "  %one = stablehlo.constant dense<1> : tensor<4xi32>\n"
    "  %shifted = stablehlo.add %0, %one : tensor<4xi32>\n"
    "  %c0 = stablehlo.constant dense<0> : tensor<i32>\n"
    "  %zero = stablehlo.broadcast_in_dim %c0, dims = [] : (tensor<i32>) -> tensor<4xi32>\n"
    "  %neg = stablehlo.compare LT, {iota}, %zero, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>\n"
    "  %c4 = stablehlo.constant dense<4> : tensor<i32>\n"
    "  %four = stablehlo.broadcast_in_dim %c4, dims = [] : (tensor<i32>) -> tensor<4xi32>\n"
    "  %wrapped = stablehlo.add {iota}, %four : tensor<4xi32>\n"
    "  %rows = stablehlo.select %neg, %wrapped, {iota} : tensor<4xi1>, tensor<4xi32>\n"
    "  %col0 = stablehlo.broadcast_in_dim %rows, dims = [0] : (tensor<4xi32>) -> tensor<4x1xi32>\n"
    "  %col1 = stablehlo.broadcast_in_dim %labels, dims = [0] : (tensor<4xi32>) -> tensor<4x1xi32>\n"
    "  %idx = stablehlo.concatenate %col0, %col1, dim = 1 : (tensor<4x1xi32>, tensor<4x1xi32>) -> tensor<4x2xi32>\n"
)

FIXTURES = {
    "elementwise": (
        _fn("%x: tensor<2x3xf32>, %y: tensor<2x3xf32>) -> (tensor<2x3xf32>",
            "  %0 = stablehlo.add %x, %y : tensor<2x3xf32>\n  return %0 : tensor<2x3xf32>"),
        [{"x:0", "y:0", "result[0]:0"}, {"x:1", "y:1", "result[0]:1"}],
    ),
    "transpose": (
        _fn("%x: tensor<2x3xf32>) -> (tensor<3x2xf32>",
            "  %0 = stablehlo.transpose %x, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>\n"
            "  return %0 : tensor<3x2xf32>"),
        [{"x:0", "result[0]:1"}, {"x:1", "result[0]:0"}],
    ),
    "broadcast_in_dim: new dim fresh, size-1 dim expanded not identified": (
        _fn("%x: tensor<1x3xf32>) -> (tensor<5x4x3xf32>",
            "  %0 = stablehlo.broadcast_in_dim %x, dims = [1, 2] : (tensor<1x3xf32>) -> tensor<5x4x3xf32>\n"
            "  return %0 : tensor<5x4x3xf32>"),
        [{"x:0"}, {"x:1", "result[0]:2"}, {"result[0]:0"}, {"result[0]:1"}],
    ),
    "reshape: split D into H x Dh identifies D with H": (
        _fn("%x: tensor<2x12xf32>) -> (tensor<2x3x4xf32>",
            "  %0 = stablehlo.reshape %x : (tensor<2x12xf32>) -> tensor<2x3x4xf32>\n"
            "  return %0 : tensor<2x3x4xf32>"),
        [{"x:0", "result[0]:0"}, {"x:1", "result[0]:1"}, {"result[0]:2"}],
    ),
    "dot_general: batch, free and contracting dims": (
        _fn("%a: tensor<2x3x4xf32>, %b: tensor<2x4x5xf32>) -> (tensor<2x3x5xf32>",
            "  %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] :"
            " (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>\n  return %0 : tensor<2x3x5xf32>"),
        [{"a:0", "b:0", "result[0]:0"}, {"a:1", "result[0]:1"}, {"a:2", "b:1"}, {"b:2", "result[0]:2"}],
    ),
    "reduce: kept dims map, the reduced dim is alone": (
        _fn("%x: tensor<2x3x4xf32>) -> (tensor<2x4xf32>",
            "  %c = stablehlo.constant dense<0.0> : tensor<f32>\n"
            "  %0 = stablehlo.reduce(%x init: %c) applies stablehlo.add across dimensions = [1] :"
            " (tensor<2x3x4xf32>, tensor<f32>) -> tensor<2x4xf32>\n  return %0 : tensor<2x4xf32>"),
        [{"x:0", "result[0]:0"}, {"x:1"}, {"x:2", "result[0]:1"}],
    ),
    "concatenate: all but the concatenated dim": (
        _fn("%x: tensor<2x3xf32>, %y: tensor<2x5xf32>) -> (tensor<2x8xf32>",
            "  %0 = stablehlo.concatenate %x, %y, dim = 1 : (tensor<2x3xf32>, tensor<2x5xf32>) -> tensor<2x8xf32>\n"
            "  return %0 : tensor<2x8xf32>"),
        [{"x:0", "y:0", "result[0]:0"}, {"x:1"}, {"y:1"}, {"result[0]:1"}],
    ),
    "slice: only dims kept whole": (
        _fn("%x: tensor<4x6xf32>) -> (tensor<4x2xf32>",
            "  %0 = stablehlo.slice %x [0:4, 1:3] : (tensor<4x6xf32>) -> tensor<4x2xf32>\n"
            "  return %0 : tensor<4x2xf32>"),
        [{"x:0", "result[0]:0"}, {"x:1"}, {"result[0]:1"}],
    ),
    "pad: only unpadded dims": (
        _fn("%x: tensor<4x6xf32>) -> (tensor<4x8xf32>",
            "  %p = stablehlo.constant dense<0.0> : tensor<f32>\n"
            "  %0 = stablehlo.pad %x, %p, low = [0, 1], high = [0, 1], interior = [0, 0] :"
            " (tensor<4x6xf32>, tensor<f32>) -> tensor<4x8xf32>\n  return %0 : tensor<4x8xf32>"),
        [{"x:0", "result[0]:0"}, {"x:1"}, {"result[0]:1"}],
    ),
    "reverse: dims not reversed": (
        _fn("%x: tensor<4x6xf32>) -> (tensor<4x6xf32>",
            "  %0 = stablehlo.reverse %x, dims = [1] : tensor<4x6xf32>\n  return %0 : tensor<4x6xf32>"),
        [{"x:0", "result[0]:0"}, {"x:1"}, {"result[0]:1"}],
    ),
    "dynamic_update_slice: the update maps only where it covers the dim": (
        _fn("%x: tensor<4x6xf32>, %u: tensor<4x2xf32>, %i: tensor<i32>) -> (tensor<4x6xf32>",
            "  %0 = stablehlo.dynamic_update_slice %x, %u, %i, %i"
            " : (tensor<4x6xf32>, tensor<4x2xf32>, tensor<i32>, tensor<i32>) -> tensor<4x6xf32>\n"
            "  return %0 : tensor<4x6xf32>"),
        [{"x:0", "u:0", "result[0]:0"}, {"x:1", "result[0]:1"}, {"u:1"}],
    ),
    "gather: embedding lookup table[ids]": (
        _fn("%table: tensor<10x8xf32>, %ids: tensor<3x1xi32>) -> (tensor<3x8xf32>",
            '  %0 = "stablehlo.gather"(%table, %ids) {dimension_numbers = #stablehlo.gather<offset_dims = [1],'
            " collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 8>}"
            " : (tensor<10x8xf32>, tensor<3x1xi32>) -> tensor<3x8xf32>\n  return %0 : tensor<3x8xf32>"),
        [{"table:0"}, {"table:1", "result[0]:1"}, {"ids:0", "result[0]:0"}, {"ids:1"}],
    ),
    "scatter: segment_sum rows of updates into the input": (
        _fn("%x: tensor<10x8xf32>, %ids: tensor<3x1xi32>, %u: tensor<3x8xf32>) -> (tensor<10x8xf32>",
            '  %0 = "stablehlo.scatter"(%x, %ids, %u) ({\n  ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n'
            "    %s = stablehlo.add %a, %b : tensor<f32>\n    stablehlo.return %s : tensor<f32>\n"
            "  }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0],"
            " scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}"
            " : (tensor<10x8xf32>, tensor<3x1xi32>, tensor<3x8xf32>) -> tensor<10x8xf32>\n"
            "  return %0 : tensor<10x8xf32>"),
        [{"x:0", "result[0]:0"}, {"x:1", "u:1", "result[0]:1"}, {"ids:0", "u:0"}, {"ids:1"}],
    ),
    # x[jnp.arange(4), labels] as jnp writes it (torch.gather, and cross_entropy's nll_loss, through torchax
    # alike): the iota column is normalized (select(i < 0, i + 4, i)), made a [4, 1] column and concatenated
    # before the labels' column. Index vector i starts at row i of x: x:0 pairs with the indices' dim 0, the
    # batch of the result (as an operand_batching_dims pair would); x:1 is read one column per row, alone.
    "gather: a coordinate gather x[arange(4), labels] pairs x's rows with the indices": (
        _fn("%x: tensor<4x6xf32>, %labels: tensor<4xi32>) -> (tensor<4xf32>",
            _COORDINATES.format(iota="%0") +
            '  %g = "stablehlo.gather"(%x, %idx) {dimension_numbers = #stablehlo.gather<collapsed_slice_dims ='
            " [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, slice_sizes = array<i64: 1, 1>}"
            " : (tensor<4x6xf32>, tensor<4x2xi32>) -> tensor<4xf32>\n  return %g : tensor<4xf32>"),
        [{"x:0", "labels:0", "result[0]:0"}, {"x:1"}],
    ),
    # The same with the iota shifted by one (x[arange(4) + 1, labels]): row i reads row i + 1, not alike.
    "gather: an iota plus one is no coordinate": (
        _fn("%x: tensor<4x6xf32>, %labels: tensor<4xi32>) -> (tensor<4xf32>",
            _COORDINATES.format(iota="%shifted") +
            '  %g = "stablehlo.gather"(%x, %idx) {dimension_numbers = #stablehlo.gather<collapsed_slice_dims ='
            " [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, slice_sizes = array<i64: 1, 1>}"
            " : (tensor<4x6xf32>, tensor<4x2xi32>) -> tensor<4xf32>\n  return %g : tensor<4xf32>"),
        [{"x:0"}, {"labels:0", "result[0]:0"}, {"x:1"}],
    ),
    # An iota over 4 rows of an 8-row operand reads half of it: no pair (an axis splitting both would not
    # split them alike).
    "gather: an iota shorter than the operand dim is no coordinate": (
        _fn("%x: tensor<8x6xf32>, %labels: tensor<4xi32>) -> (tensor<4xf32>",
            _COORDINATES.format(iota="%0") +
            '  %g = "stablehlo.gather"(%x, %idx) {dimension_numbers = #stablehlo.gather<collapsed_slice_dims ='
            " [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, slice_sizes = array<i64: 1, 1>}"
            " : (tensor<8x6xf32>, tensor<4x2xi32>) -> tensor<4xf32>\n  return %g : tensor<4xf32>"),
        [{"x:0"}, {"labels:0", "result[0]:0"}, {"x:1"}],
    ),
    # That gather's gradient: a scatter-add of u[i] into row i, column labels[i], of x: x's rows, the
    # result's, the indices' and the updates' dim are one.
    "scatter: a coordinate scatter-add pairs the input's rows with the indices": (
        _fn("%x: tensor<4x6xf32>, %labels: tensor<4xi32>, %u: tensor<4xf32>) -> (tensor<4x6xf32>",
            _COORDINATES.format(iota="%0") +
            '  %s = "stablehlo.scatter"(%x, %idx, %u) ({\n  ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n'
            "    %r = stablehlo.add %a, %b : tensor<f32>\n    stablehlo.return %r : tensor<f32>\n"
            "  }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1],"
            " scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1>}"
            " : (tensor<4x6xf32>, tensor<4x2xi32>, tensor<4xf32>) -> tensor<4x6xf32>\n"
            "  return %s : tensor<4x6xf32>"),
        [{"x:0", "labels:0", "u:0", "result[0]:0"}, {"x:1", "result[0]:1"}],
    ),
    "while: carried value is one name per dim across cond, body and result": (
        _fn("%x: tensor<4x6xf32>, %n: tensor<i32>) -> (tensor<4x6xf32>",
            "  %0:2 = stablehlo.while(%a = %x, %k = %n) : tensor<4x6xf32>, tensor<i32>\n"
            "  cond {\n    %c = stablehlo.compare LT, %k, %k : (tensor<i32>, tensor<i32>) -> tensor<i1>\n"
            "    stablehlo.return %c : tensor<i1>\n  } do {\n"
            "    %t = stablehlo.transpose %a, dims = [0, 1] : (tensor<4x6xf32>) -> tensor<4x6xf32>\n"
            "    stablehlo.return %t, %k : tensor<4x6xf32>, tensor<i32>\n  }\n"
            "  return %0#0 : tensor<4x6xf32>"),
        None,  # checked below: x:0 and result:0 one color, x:1 and result:1 another
    ),
}


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_op_rule_fixture(name, engine):
    text, expected = FIXTURES[name]
    colors = _colors(text, engine)
    if expected is None:
        by_dim = {member: color for color in colors for member in color}
        assert by_dim["x:0"] == by_dim["result[0]:0"] != by_dim["x:1"] == by_dim["result[0]:1"]
        return
    assert colors == {frozenset(c) for c in expected}
