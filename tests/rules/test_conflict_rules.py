"""Tiny per-rule fixtures for the conflicts stage (rules/conflicts/), on hand-written facts.

The inputs are def_class/use_class rows as toast.analysis.conflicts writes them; the expected rows are
written by hand from the rules' intent (sections 3.3-3.5 of the paper).
"""

from __future__ import annotations

import pytest
from conftest import engines

from toast.datalog import assemble, evaluate, load_variant
from toast.facts import CONFLICTS


def _run(facts, engine, variant="default"):
    program = assemble(load_variant(variant), stage=CONFLICTS)
    return evaluate(program.text, facts, CONFLICTS.outputs, engine=engine)


# Value 7 is [S, S] with dims in nodes 10 and 11 of color 0; use 3 of it (by some op) has its
# dims in nodes 20 and 21; use 4 of it keeps dim 0 in node 10 (I identified it with the def's
# node, as a loop would) and dim 1 in node 22.
FACTS = {
    "def_class": [(7, 0, 10, 0), (7, 1, 11, 0)],
    "use_class": [(3, 7, 0, 20, 0), (3, 7, 1, 21, 0), (4, 7, 0, 10, 0), (4, 7, 1, 22, 0)],
}


@pytest.mark.parametrize("engine", engines())
def test_conflicts_on_definitions_and_uses(engine):
    out = _run(FACTS, engine)
    assert out["color_conflict_def"] == [(7, 0, 1, 0)]
    assert out["color_conflict_use"] == [(3, 0, 1, 0), (4, 0, 1, 0)]
    assert out["conflict_def"] == [(10, 11, 7, 0, 1)]
    assert out["conflict_use"] == [(10, 22, 4, 0, 1), (20, 21, 3, 0, 1)]
    assert out["invalid"] == []


@pytest.mark.parametrize("engine", engines())
def test_conflict_edges_are_spelled_with_the_smaller_node_first(engine):
    # Dim 0 in the larger node: the edge is (11, 12) with DimA = 1.
    out = _run({"def_class": [(5, 0, 12, 2), (5, 1, 11, 2)], "use_class": []}, engine)
    assert out["conflict_def"] == [(11, 12, 5, 1, 0)]


@pytest.mark.parametrize("engine", engines())
def test_boxes_join_corresponding_dims(engine):
    out = _run(FACTS, engine)
    # The definition's node for dim 0 (10) goes with each use's node for dim 0.
    assert out["box"] == [(10, 11, 10, 22, 7, 4), (10, 11, 20, 21, 7, 3)]


@pytest.mark.parametrize("engine", engines())
def test_no_box_variant_derives_no_boxes(engine):
    out = _run(FACTS, engine, variant="no_box")
    assert out["box"] == []
    assert out["conflict_def"] == [(10, 11, 7, 0, 1)]


@pytest.mark.parametrize("engine", engines())
def test_two_dims_in_one_node_violate_the_invariant(engine):
    out = _run({"def_class": [(2, 0, 9, 1), (2, 1, 9, 1)], "use_class": [(6, 2, 0, 9, 1), (6, 2, 2, 9, 1)]}, engine)
    assert {(check, detail) for check, _, _, detail in out["invalid"]} == {
        ("self_conflict", "value 2: dims 0 and 1 in one node"), ("self_conflict", "use 6: dims 0 and 2 in one node")}
    assert out["conflict_def"] == [] and out["conflict_use"] == []


@pytest.mark.parametrize("engine", engines())
def test_different_colors_are_no_conflict(engine):
    out = _run({"def_class": [(1, 0, 3, 0), (1, 1, 4, 1)], "use_class": []}, engine)
    assert out["color_conflict_def"] == [] and out["conflict_def"] == []
