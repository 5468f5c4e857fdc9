"""The rules own op semantics (issue 12): which operand dims an op sums over (``summed_dim``),
which names multiply into its FLOPs (``flop_name``) and which ops are elementwise
(``elementwise_op``) are derived by the Datalog rules and read back into ``Analysis``.

On every bundled example the rules' sets equal what the cost model computed in Python per op
kind before it read them from the rules (the reference implementations below are that code, kept
here as an independent check), so the switch-over changed no number; a user's ``--rules``
contraction gets the same treatment as the bundled ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import analysis_of, engines, goldens

from toast import analyze, read_text
from toast.examples import EXAMPLES
from toast.resources import resource_dir

# The goldens' examples (ops_zoo among them) and the ops the zoo keeps apart.
SPECS = sorted({EXAMPLES[name] for name in goldens.EXAMPLES} | {EXAMPLES["ops_zoo_extras"]})

# The rows of elementwise_kind, read from the rule file itself.
ELEMENTWISE_KINDS = frozenset(line.split('"')[1] for line in
                              (resource_dir("rules") / "ops" / "elementwise.dl").read_text().splitlines()
                              if line.startswith('elementwise_kind("'))


def _reduced_dims(op, program=None) -> set[tuple[int, int]]:
    """``(operand, dim)`` pairs an op reduces over, per op kind (the cost model's former Python table, and a
    scatter that reduces: its indices' batch dims and its updates' scatter dims)."""
    kind = op.kind.removeprefix("stablehlo.")
    if kind == "scatter" and program is not None:
        body = [o.kind for o in program.ops if o.parent == (op.id, 0) and o.kind != "stablehlo.return"]
        if body not in (["stablehlo.add"], ["stablehlo.maximum"], ["stablehlo.minimum"], ["stablehlo.multiply"],
                        ["stablehlo.and"], ["stablehlo.or"]):
            return set()
        numbers = op.attr("scatter_dimension_numbers", {}) or {}
        count = len(op.results)
        indices_rank = len(program.values[op.operands[count]].shape)
        vector_dim = numbers.get("index_vector_dim", indices_rank)
        found = {(count, d) for d in range(indices_rank) if d != vector_dim}
        for update in range(count + 1, 2 * count + 1):
            rank = len(program.values[op.operands[update]].shape)
            found |= {(update, d) for d in range(rank) if d not in numbers.get("update_window_dims", ())}
        return found
    if kind == "dot_general":
        numbers = op.attr("dot_dimension_numbers", {}) or {}
        return ({(0, d) for d in numbers.get("lhs_contracting_dimensions", ())}
                | {(1, d) for d in numbers.get("rhs_contracting_dimensions", ())})
    if kind == "convolution":
        numbers = op.attr("dimension_numbers", {}) or {}
        if op.attr("feature_group_count", 1) != 1 or op.attr("batch_group_count", 1) != 1:
            return set()
        found = set()
        if "input_feature_dimension" in numbers:
            found.add((0, numbers["input_feature_dimension"]))
        if "kernel_input_feature_dimension" in numbers:
            found.add((1, numbers["kernel_input_feature_dimension"]))
        return found
    if kind == "reduce":
        inputs = len(op.operands) // 2
        return {(k, d) for k in range(inputs) for d in op.attr("dimensions", ())}
    return set()


def _python_summed_dims(analysis) -> frozenset[tuple[int, int, int]]:
    """The per-kind table applied to every op."""
    program = analysis.program
    return frozenset((op.id, operand, dim) for op in program.ops for operand, dim in _reduced_dims(op, program))


def _python_flop_names(analysis) -> dict[int, tuple[int, ...]]:
    """The FLOP names the cost model computed per op kind (its former Python code)."""
    program, names = analysis.program, analysis.names
    found = {}
    for op in program.ops:
        kind = op.kind.removeprefix("stablehlo.")
        if kind not in ("dot_general", "convolution") or not op.results:
            continue
        result = op.results[0]
        base = names.def_base[result]
        members = list(range(base, base + len(program.values[result].shape)))
        rhs_shape = program.values[op.operands[1]].shape
        if kind == "dot_general":
            numbers = op.attr("dot_dimension_numbers", {}) or {}
            members += [names.use_name(op.id, 0, d) for d in numbers.get("lhs_contracting_dimensions", ())]
        else:
            numbers = op.attr("dimension_numbers", {}) or {}
            out_feature = numbers.get("kernel_output_feature_dimension", len(rhs_shape) - 1)
            members += [names.use_name(op.id, 1, d) for d in range(len(rhs_shape)) if d != out_feature]
        found[op.id] = tuple(sorted(members))
    return found


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("spec", SPECS)
def test_the_rules_reproduce_the_python_op_semantics_on_every_example(spec, engine):
    analysis = analysis_of(spec, engine)
    assert analysis.summed_dims == _python_summed_dims(analysis)
    python_flops = _python_flop_names(analysis)
    # An op with no name at all (a dot of two scalars) has no flop_name row: 2 x the empty product.
    assert analysis.flop_names == {op: names for op, names in python_flops.items() if names}
    assert analysis.elementwise_ops == frozenset(op.id for op in analysis.program.ops if op.kind in ELEMENTWISE_KINDS)


def test_the_examples_exercise_every_rule():
    """Contractions of both kinds, reduces and elementwise ops occur, so the equality above means something."""
    kinds = {op.kind for spec in SPECS for op in analysis_of(spec).program.ops}
    assert {"stablehlo.dot_general", "stablehlo.convolution", "stablehlo.reduce"} <= kinds
    zoo = analysis_of(EXAMPLES["ops_zoo"])
    reduces = {op.id for op in zoo.program.ops if op.kind == "stablehlo.reduce"}
    assert {op for op, _, _ in zoo.summed_dims} & reduces
    assert len(zoo.elementwise_ops) > 10


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
    assert analysis.summed_dims == _python_summed_dims(analysis) == frozenset()
    out = analysis.names.def_base[conv.results[0]]
    kernel = [analysis.use_dim_name(conv.id, 1, d) for d in (0, 1)]  # W and I, not O
    assert analysis.flop_names == _python_flop_names(analysis) == {conv.id: (out, out + 1, out + 2, *kernel)}
