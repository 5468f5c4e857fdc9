"""The rules own op semantics (issue 12): which operand dims an op sums over (``summed_dim``),
which names multiply into its FLOPs (``flop_name``) and which ops are elementwise
(``elementwise_op``) are derived by the Datalog rules and read back into ``Analysis``.

Hand-worked programs here; on the bundled examples the goldens (Soufflé's outputs, tests/golden/)
pin every row. A user's ``--rules`` contraction gets the same treatment as the bundled ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import engines

from toast import analyze, read_text


@pytest.mark.parametrize("engine", engines())
def test_a_reduce_sums_the_dims_it_does_not_keep_and_elementwise_ops_are_listed(engine):
    """``x.sum(axis=1)`` of a [2, 3] tensor reduces dim 1 of its input (operand 0; operand 1 is the scalar
    init); its body's add and the program's own multiply are the elementwise ops."""
    args = [jax.ShapeDtypeStruct((2, 3), jnp.float32)]
    analysis = analyze("sum", fn=lambda x: (x * 2.0).sum(axis=1), args=args, engine=engine)
    (reduce,) = [op for op in analysis.program.ops if op.kind == "stablehlo.reduce"]
    assert analysis.summed_dims == {(reduce.id, 0, 1)}
    assert analysis.flop_names == {}
    assert {analysis.program.ops[op].kind for op in analysis.elementwise_ops} == {"stablehlo.multiply",
                                                                                  "stablehlo.add"}


@pytest.mark.parametrize("engine", engines())
def test_a_scatter_add_sums_its_updates_scatter_dims_and_a_scatter_that_sets_none(engine):
    """An embedding's gradient (scatter-add of [B, S, H] updates at [B, S] indices into [V, H]): B and S of the
    indices and of the updates are summed (each device's updates combine into a partial table). ``.at[].set``
    overwrites: nothing to sum."""
    args = [jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((2, 3), jnp.int32),
            jax.ShapeDtypeStruct((2, 3, 8), jnp.float32)]
    added = analyze("add", fn=lambda t, i, u: t.at[i].add(u), args=args, engine=engine)
    (scatter,) = [op for op in added.program.ops if op.kind == "stablehlo.scatter"]
    assert added.summed_dims == {(scatter.id, 1, 0), (scatter.id, 1, 1), (scatter.id, 2, 0), (scatter.id, 2, 1)}
    replaced = analyze("set", fn=lambda t, i, u: t.at[i].set(u), args=args, engine=engine)
    assert replaced.summed_dims == frozenset()


@pytest.mark.parametrize("engine", engines())
def test_a_coordinate_scatter_add_sums_nothing_and_one_at_two_label_columns_sums_its_updates(engine):
    """``t.at[arange(4), labels].add(u)`` (a loss's gradient: cross_entropy's through torchax) writes u[i] into
    row i of t: split along that dim, each device adds its own rows, nothing to reduce. ``t.at[rows, labels]``
    with rows a second [4] argument may send any update to any row: dim 0 of the indices (operand 1) and of the
    updates (operand 2) is summed, as in the embedding's gradient above."""
    args = [jax.ShapeDtypeStruct((4, 6), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32),
            jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32)]
    coordinate = analyze("coordinate", fn=lambda t, i, u, r: t.at[jnp.arange(4), i].add(u), args=args,
                         engine=engine)
    assert coordinate.summed_dims == frozenset()
    rows = analyze("rows", fn=lambda t, i, u, r: t.at[r, i].add(u), args=args, engine=engine)
    (scatter,) = [op for op in rows.program.ops if op.kind == "stablehlo.scatter"]
    assert rows.summed_dims == {(scatter.id, 1, 0), (scatter.id, 2, 0)}


@pytest.mark.parametrize("engine", engines())
def test_a_batched_einsum_sums_its_contracting_dim_and_counts_b_i_j_k(engine):
    b, i, j, k = 2, 3, 4, 5
    args = [jax.ShapeDtypeStruct((b, i, j), jnp.float32), jax.ShapeDtypeStruct((b, j, k), jnp.float32)]
    analysis = analyze("einsum", fn=lambda x, y: jnp.einsum("bij,bjk->bik", x, y), args=args, engine=engine)
    (dot,) = [op for op in analysis.program.ops if op.kind == "stablehlo.dot_general"]
    # x[b,i,j] . y[b,j,k]: j is dim 2 of x and dim 1 of y.
    assert analysis.summed_dims == {(dot.id, 0, 2), (dot.id, 1, 1)}
    out = analysis.names.def_base[dot.results[0]]
    j_of_x = analysis.use_dim_name(dot.id, 0, 2)
    assert analysis.flop_names == {dot.id: (out, out + 1, out + 2, j_of_x)}
    assert [analysis.program.values[v].shape[d] for v, d in analysis.names.defs[out:out + 3]] == [b, i, k]
    assert analysis.names.uses[j_of_x - len(analysis.names.defs)] == (dot.id, 0, 2)
    assert analysis.elementwise_ops == frozenset()


MY_MATMUL = """\
func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x5xf32>) -> (tensor<2x5xf32>) {
  %0 = stablehlo.custom_call @my_matmul(%a, %b) : (tensor<2x3xf32>, tensor<3x5xf32>) -> tensor<2x5xf32>
  %1 = stablehlo.add %0, %0 : tensor<2x5xf32>
  return %1 : tensor<2x5xf32>
}
"""

# A user's rule file: the custom call @my_matmul is a [M,K] x [K,N] -> [M,N] contraction.
MY_MATMUL_RULES = """\
ruled_custom_call("my_matmul").
contraction_custom_call("my_matmul").
contracts(Op, 1, 0) :- custom_call_target(Op, "my_matmul").
ident(A, B, Op, __FILE__, __LINE__) :-
    custom_call_target(Op, "my_matmul"), in_dim(Op, 0, 0, B, _), out_dim(Op, 0, 0, A, _).
ident(A, B, Op, __FILE__, __LINE__) :-
    custom_call_target(Op, "my_matmul"), in_dim(Op, 1, 1, B, _), out_dim(Op, 0, 1, A, _).
"""


@pytest.mark.parametrize("engine", engines())
def test_a_user_contraction_gets_summed_dims_and_flop_names(engine, tmp_path):
    program = read_text(MY_MATMUL, source="my_matmul.mlir")
    bare = analyze(program, engine=engine)
    assert [u.kind for u in bare.unruled_ops] == ["stablehlo.custom_call @my_matmul"]
    assert bare.summed_dims == frozenset() and bare.flop_names == {}

    (tmp_path / "my_matmul.dl").write_text(MY_MATMUL_RULES)
    analysis = analyze(program, engine=engine, rules=tmp_path)
    assert analysis.unruled_ops == () and analysis.invalid == ()
    call, add = (op.id for op in analysis.program.ops[:2])
    assert analysis.summed_dims == {(call, 0, 1), (call, 1, 0)}
    out = analysis.names.def_base[analysis.program.ops[call].results[0]]
    assert analysis.flop_names == {call: (out, out + 1, analysis.use_dim_name(call, 0, 1))}
    assert analysis.elementwise_ops == {add}
    # [M,K] x [K,N] -> [M,N]: the shared rule identifies the contracting dims K, the user's the others.
    colors = {frozenset(f"{d.value}:{d.dim}" for d in color.dims) for color in analysis.colors if color.dims}
    assert colors == {frozenset({"%arg0:0", "%0:0", "result[0]:0"}), frozenset({"%arg0:1", "%arg1:0"}),
                      frozenset({"%arg1:1", "%0:1", "result[0]:1"})}


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("groups", ["feature_group_count", "batch_group_count"])
def test_a_grouped_convolution_sums_nothing_and_counts_every_kernel_dim_but_the_output_features(engine, groups):
    """Group counts > 1 split the feature dims: no partial sums (as the cost model has it), but
    the FLOPs still multiply the kernel's input features and window."""
    lhs = jax.ShapeDtypeStruct((4, 8, 6), jnp.float32)  # N W C
    rhs = jax.ShapeDtypeStruct((3, 6 if groups == "batch_group_count" else 3, 4), jnp.float32)  # W I O
    analysis = analyze("grouped", fn=lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"), **{groups: 2}), args=[lhs, rhs], engine=engine)
    (conv,) = [op for op in analysis.program.ops if op.kind == "stablehlo.convolution"]
    assert conv.attr(groups) == 2
    assert analysis.summed_dims == frozenset()
    out = analysis.names.def_base[conv.results[0]]
    kernel = [analysis.use_dim_name(conv.id, 1, d) for d in (0, 1)]  # W and I, not O
    assert analysis.flop_names == {conv.id: (out, out + 1, out + 2, *kernel)}
