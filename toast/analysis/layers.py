"""The layer heuristic (TOAST section 3.6): isomorphic compatibility sets share a resolution bit.

Each compatibility set is a sub-graph of the dimension graph: its conflicts' endpoints, its
conflict edges, and the M edges between those endpoints. Repeated layers (forward and
backward) give isomorphic sub-graphs, and corresponding conflicts are resolved alike.

Isomorphism is decided by a canonical form, in linear time overall: the set's conflicts in
program order, each described by the sites it sits on (definition or use, op kind, operand
index, shape, and the dims of its endpoints in the set's resolution-0 orientation), and the M
edges between endpoints written as ``(conflict position, endpoint)`` pairs. Equal forms are
isomorphic sub-graphs with the correspondence given by position, and because the form
includes the orientation, resolution ``r`` of one set corresponds to resolution ``r`` of the
other. The test is sound but not complete: two isomorphic sets whose conflicts appear in a
different program order are not grouped (they keep separate bits).
"""

from __future__ import annotations

from collections.abc import Sequence

from toast.analysis.conflict_types import CompatibilitySet, Conflict, ConflictSite
from toast.analysis.dimension_graph import NodeGraph
from toast.frontend.ir import Program


def canonical_form(program: Program, conflicts: Sequence[Conflict], group_set: CompatibilitySet,
                   graph: NodeGraph, producers: Sequence[str]) -> tuple:
    """The canonical form of one compatibility set (see the module docstring); ``producers``
    is ``producer_kinds(program)``."""
    endpoint_of: dict[int, tuple[int, int]] = {}
    labels = []
    for position, (conflict_id, sharded) in enumerate(zip(group_set.conflicts, group_set.sharded_by_0, strict=True)):
        conflict = conflicts[conflict_id]
        ordered = (conflict.nodes[sharded], conflict.nodes[1 - sharded])
        for endpoint, node in enumerate(ordered):
            endpoint_of.setdefault(node, (position, endpoint))
        labels.append(tuple(sorted(_site_label(program, producers, site, flip=bool(sharded))
                                    for site in conflict.sites)))
    edges = sorted(
        (endpoint_of[node], endpoint_of[target])
        for node in endpoint_of
        for target in graph.successors.get(node, ())
        if target in endpoint_of
    )
    return tuple(labels), tuple(edges)


def group_isomorphic(program: Program, conflicts: Sequence[Conflict], sets: Sequence[CompatibilitySet],
                     graph: NodeGraph) -> list[list[int]]:
    """Set ids grouped by equal canonical form; groups ordered by their first set."""
    producers = producer_kinds(program)
    groups: dict[tuple, list[int]] = {}
    for group_set in sets:
        groups.setdefault(canonical_form(program, conflicts, group_set, graph, producers), []).append(group_set.id)
    return sorted(groups.values())


def producer_kinds(program: Program) -> list[str]:
    """``kinds[value id]``: the kind of the op defining the value, ``argument`` for function
    arguments, ``<kind> region argument`` for block arguments of a region op."""
    kinds = []
    for value_id, op_id in enumerate(program.producer):
        if op_id < 0:
            kinds.append("argument")
        else:
            op = program.ops[op_id]
            kinds.append(op.kind if value_id in op.results else f"{op.kind} region argument")
    return kinds


def _site_label(program: Program, producers: Sequence[str], site: ConflictSite, *, flip: bool) -> tuple:
    dims = site.dims[::-1] if flip else site.dims
    shape = program.values[site.value].shape
    if site.kind == "def":
        return ("def", producers[site.value], shape, dims)
    return ("use", program.ops[site.op].kind, site.operand, shape, dims)
