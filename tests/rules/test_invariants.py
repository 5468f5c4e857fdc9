"""The invariants: every check of the rule base feeds the one ``invalid(Check, File, Line, Detail)`` output,
and each fires on a tiny fixture made to break it (the examples keep them empty: the goldens and the
op-conformance suite).

The checks on facts Python writes run on hand-made facts through the default variant's program; the checks on
rules run on a real program with a user's rule file that breaks them. Expected details are written by hand.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import engines

from toast import analyze
from toast.datalog.engine import evaluate
from toast.datalog.variants import assemble, load_variant
from toast.facts.schema import NDA


def _invalid(facts: dict[str, list[tuple]], engine: str) -> set[tuple[str, str]]:
    """``(check, detail)`` of the default rules' ``invalid`` rows on ``facts``."""
    program = assemble(load_variant("default"), stage=NDA)
    every = {relation.name: [] for relation in NDA.inputs} | facts  # Soufflé reads a file per input
    rows = evaluate(program.text, every, NDA.outputs, engine=engine)["invalid"]  # type: ignore[arg-type]
    return {(check, detail) for check, _, _, detail in rows}


@pytest.mark.parametrize("engine", engines())
def test_a_while_result_without_an_operand_is_invalid(engine):
    facts = {"op": [(0, "stablehlo.while")], "result": [(0, 0, 5), (0, 1, 6)], "operand": [(0, 0, 0, 1)]}
    assert _invalid(facts, engine) == {("while_carries", "op 0: result 1 has no operand")}


@pytest.mark.parametrize("engine", engines())
def test_a_scatter_with_the_wrong_operand_count_is_invalid(engine):
    # One input: input, indices, update = operands 0..2; here a fourth.
    operands = [(3, k, k, k) for k in range(4)]
    facts = {"op": [(3, "stablehlo.scatter")], "scatter_inputs": [(3, 1)], "operand": operands}
    assert _invalid(facts, engine) == {("scatter_operands", "op 3: 1 inputs")}


@pytest.mark.parametrize("engine", engines())
def test_a_whole_reshape_factor_of_another_size_is_invalid(engine):
    # reshape [6] -> [6] claiming a whole factor of 3.
    facts = {"op": [(1, "stablehlo.reshape")], "operand": [(1, 0, 0, 0)], "result": [(1, 0, 1)],
             "def_dim": [(0, 0, 0, 6), (1, 1, 0, 6)], "use_dim": [(2, 0, 0)],
             "reshape_factor": [(1, 0, 0, 3, 1)]}
    found = _invalid(facts, engine)
    assert ("reshape_whole_factor", "op 1: dims 0 -> 0 of 6 -> 6 elements, factor 3") in found


MATMUL = [jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((3, 5), jnp.float32)]


def _with_rules(tmp_path: Path, text: str, engine: str, fn=lambda x, w: jnp.tanh(x @ w), args=None):
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "broken.dl").write_text(text)
    # The rows themselves, not the InvalidRules error they make (tests/test_invalid_rows.py).
    return analyze("broken", fn=fn, args=args or MATMUL, engine=engine, rules=folder, check_invariants=False)


@pytest.mark.parametrize("engine", engines())
def test_a_kind_with_two_kernel_classes_or_an_unknown_one_is_invalid(engine, tmp_path):
    analysis = _with_rules(tmp_path, 'kernel_class("stablehlo.tanh", "library").\n'
                                     'custom_call_class("my_call", "gpu_magic").\n', engine)
    found = {(i.check, i.detail) for i in analysis.invalid}
    assert found == {("kernel_class_twice", "stablehlo.tanh: fusible and library"),
                     ("kernel_class_twice", "stablehlo.tanh: library and fusible"),
                     ("kernel_class_unknown", "custom_call @my_call: gpu_magic")}
    assert all(i.file == "rules/nda.dl" for i in analysis.invalid)


@pytest.mark.parametrize("engine", engines())
def test_an_identity_of_names_of_different_sizes_blames_the_rule_that_made_it(engine, tmp_path):
    # x[2, 3] @ w[3, 5]: identifying x's dim 0 (2) with w's dim 1 (5) is wrong.
    analysis = _with_rules(tmp_path, 'ident(A, B, Op, __FILE__, __LINE__) :-\n'
                                     '    op(Op, "stablehlo.dot_general"), in_dim(Op, 0, 0, A, _),\n'
                                     '    in_dim(Op, 1, 1, B, _).\n', engine)
    dot = next(op.id for op in analysis.program.ops if op.kind == "stablehlo.dot_general")
    a, b = analysis.use_dim_name(dot, 0, 0), analysis.use_dim_name(dot, 1, 1)
    (invalid,) = [i for i in analysis.invalid if i.check == "ident_size"]
    assert invalid.line == 1 and invalid.file.endswith("rules/broken.dl")
    assert invalid.detail == f"op {dot}: names {a} (2 elements) and {b} (5 elements)"
    # Both result dims now lie in one node: the conflicts stage's check fires too.
    assert {i.check for i in analysis.invalid} == {"ident_size", "self_conflict"}


@pytest.mark.parametrize("engine", engines())
def test_contracts_rows_on_an_op_that_is_no_contraction_are_invalid(engine, tmp_path):
    analysis = _with_rules(tmp_path, 'contracts(Op, 0, 0) :- op(Op, "stablehlo.tanh").\n', engine)
    tanh = next(op.id for op in analysis.program.ops if op.kind == "stablehlo.tanh")
    assert {(i.check, i.detail) for i in analysis.invalid} >= {("contracts_not_contraction", f"op {tanh}")}


@pytest.mark.parametrize("engine", engines())
def test_mechanics_rows_that_do_not_fit_their_ops_are_invalid(engine, tmp_path):
    """An update in place whose target is not the result's shape; a window selection naming operands the
    op lacks."""
    def fn(x):
        return jax.lax.dynamic_slice(x, (1, 0), (2, 3)) + 1.0

    analysis = _with_rules(tmp_path, 'in_place_update("stablehlo.dynamic_slice", 0, 1).\n'
                                     'window_selection("stablehlo.add", 1, 4).\n',
                           engine, fn=fn, args=[jax.ShapeDtypeStruct((4, 3), jnp.float32)])
    ops = {op.kind: op.id for op in analysis.program.ops}
    found = {(i.check, i.detail) for i in analysis.invalid}
    assert ("in_place_shape", f"op {ops['stablehlo.dynamic_slice']}: dim 0 of 4 -> 2 elements") in found
    assert ("window_selection_operands", f"op {ops['stablehlo.add']} (stablehlo.add)") in found


@pytest.mark.parametrize("engine", engines())
def test_two_dims_of_one_tensor_in_one_node_are_a_self_conflict(engine, tmp_path):
    """The conflicts stage's check: identifying both dims of a square x."""
    analysis = _with_rules(tmp_path, 'ident(A, B, Op, __FILE__, __LINE__) :-\n'
                                     '    op(Op, "stablehlo.tanh"), in_dim(Op, 0, 0, A, _), in_dim(Op, 0, 1, B, _).\n',
                           engine, fn=jnp.tanh, args=[jax.ShapeDtypeStruct((4, 4), jnp.float32)])
    checks = {i.check for i in analysis.invalid}
    assert checks == {"self_conflict"}
    assert all(i.file == "rules/conflicts/conflicts.dl" for i in analysis.invalid)
