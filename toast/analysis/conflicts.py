"""Sharding conflicts, compatibility sets and resolution groups (TOAST sections 3.3-3.6).

Data path: classes of the first stage (``color_of``, ``node_of``) -> ``conflict_facts`` ->
the conflicts stage's rules (``rules/conflicts/``: conflicts, box candidates, invariants) ->
``build_conflicts``: a crossing-path check of each box, the closure of compatible boxes into
compatibility sets, and the grouping of isomorphic sets (``toast.analysis.layers``).

Both steps that Datalog would state quadratically run here in linear time: reachability for
the crossing check is one pass of bitsets over the strongly connected components of the
dimension graph (only the colors that have boxes; one more pass per ``while`` body with
boxes, which is checked as one iteration, like one unrolled layer, see
``toast.analysis.dimension_graph``), and the reflexive, symmetric, transitive closure is a
union-find that also tracks orientation (which endpoint of one conflict goes with which
endpoint of the other).

Resolutions. A compatibility set has two resolutions. Resolution 0 shards, for the set's first
conflict (program order), the endpoint holding that conflict's smaller dim where it first
sits; every other conflict of the set follows through the boxes (the endpoints joined by M
are sharded together). Resolution 1 shards the other endpoints. Sets grouped by the layer
heuristic are oriented alike, so one bit picks the same resolution in all of them.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from toast.analysis.conflict_types import (
    Box,
    ColorConflict,
    CompatibilitySet,
    Conflict,
    Conflicts,
    ConflictSite,
    ResolutionGroup,
)
from toast.analysis.dimension_graph import Loops, NodeGraph
from toast.analysis.layers import group_isomorphic
from toast.facts.numbering import DimensionNames
from toast.frontend.ir import Program

Facts = dict[str, list[tuple]]


def conflict_facts(program: Program, names: DimensionNames, color_of: np.ndarray, node_of: np.ndarray) -> Facts:
    """Input facts of the conflicts stage: ``def_class`` and ``use_class`` rows for the dims
    whose color occurs more than once in their tensor (linear in the number of names; in arrays, in
    definition then dim order and use then dim order)."""
    ranks = np.fromiter((len(value.shape) for value in program.values), dtype=np.int64, count=len(program.values))
    value, dim, name = _repeated(np.asarray(names.def_base, dtype=np.int64), ranks, color_of)
    facts: Facts = {"def_class": list(zip(value.tolist(), dim.tolist(), node_of[name].tolist(),
                                          color_of[name].tolist(), strict=True))}
    sites = names.use_sites
    used = np.fromiter(map(_VALUE, sites), dtype=np.int64, count=len(sites))
    first = np.fromiter(map(_FIRST_NAME, sites), dtype=np.int64, count=len(sites))
    use, dim, name = _repeated(first, ranks[used] if len(sites) else np.zeros(0, dtype=np.int64), color_of)
    facts["use_class"] = list(zip(use.tolist(), used[use].tolist(), dim.tolist(), node_of[name].tolist(),
                                  color_of[name].tolist(), strict=True))
    return facts


_VALUE, _FIRST_NAME = operator.itemgetter(2), operator.itemgetter(3)  # a UseSite's value and first name


def _repeated(bases: np.ndarray, ranks: np.ndarray, color_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(site, dim, name)`` of every dim whose color occurs twice among its site's dims (a site's dims are the
    names ``bases[site]`` to ``bases[site] + ranks[site] - 1``), in site then dim order."""
    sites = np.flatnonzero(ranks >= 2)
    ranks = ranks[sites]
    starts = np.cumsum(ranks) - ranks
    site = np.repeat(sites, ranks)
    dim = np.arange(int(ranks.sum())) - np.repeat(starts, ranks)
    name = np.repeat(bases[sites], ranks) + dim
    color = color_of[name]
    order = np.lexsort((color, site))  # a site's dims of one color side by side
    same = (site[order][1:] == site[order][:-1]) & (color[order][1:] == color[order][:-1])
    twice = np.zeros(len(site), dtype=bool)
    twice[order[1:][same]] = True
    twice[order[:-1][same]] = True
    return site[twice], dim[twice], name[twice]


def build_conflicts(program: Program, names: DimensionNames, color_of: np.ndarray, node_of: np.ndarray,
                    m_edges: Sequence[tuple[int, int]] | np.ndarray, outputs: dict[str, list[tuple]],
                    *, layer_heuristic: bool = True) -> Conflicts:
    """Conflicts, compatibility sets and groups from the conflicts stage's ``outputs``."""
    conflicts, conflict_id = _conflict_edges(program, names, color_of, outputs)
    color_conflicts = _color_conflicts(program, names, outputs)
    graph = NodeGraph.of(color_of, node_of, m_edges, colors={c.color for c in conflicts},
                         loops=Loops.of(program, names))
    boxes, crossed = _boxes(names, outputs, conflict_id, graph)
    sets, set_of, contradicting = _compatibility_sets(conflicts, boxes, crossed)
    if layer_heuristic:
        groups_of_sets = group_isomorphic(program, conflicts, sets, graph)
    else:
        groups_of_sets = [[s.id] for s in sets]
    groups = tuple(ResolutionGroup(k, tuple(ids)) for k, ids in enumerate(groups_of_sets))
    group_of = [0] * len(sets)
    for group in groups:
        for set_id in group.sets:
            group_of[set_id] = group.id

    invalid = tuple(outputs["invalid"])
    stats = {
        "color_conflicts": len(color_conflicts),
        "conflicts": len(conflicts),
        "boxes": len(boxes),
        "crossed_boxes": int(sum(crossed)),
        "contradicting_boxes": contradicting,
        "compatibility_sets": len(sets),
        "resolution_bits": len(groups),
    }
    found_boxes = tuple(sorted({Box(first, second, bool(flipped), is_crossed)
                                for (first, second, flipped, *_), is_crossed in zip(boxes, crossed, strict=True)},
                               key=lambda b: (b.def_conflict, b.use_conflict, b.flipped)))
    return Conflicts(color_conflicts, conflicts, tuple(sets), groups, found_boxes, tuple(set_of),
                     tuple(group_of), invalid, stats)


def _site_position(program: Program, site: ConflictSite) -> int:
    """Where a site sits in program order: its value's producer (a definition) or its op (a use)."""
    return program.producer[site.value] if site.kind == "def" else site.op


def _conflict_edges(program: Program, names: DimensionNames, color_of: np.ndarray, outputs: dict[str, list[tuple]]
                    ) -> tuple[tuple[Conflict, ...], dict[tuple[int, int], int]]:
    """The conflict edges, each with every site it sits on, in program order; and each one's id by its nodes."""
    use_sites = names.use_sites
    sites_of: dict[tuple[int, int], list[ConflictSite]] = defaultdict(list)
    for node_a, node_b, value, dim_a, dim_b in outputs["conflict_def"]:
        sites_of[(node_a, node_b)].append(ConflictSite("def", value, -1, -1, (dim_a, dim_b)))
    for node_a, node_b, use, dim_a, dim_b in outputs["conflict_use"]:
        site = use_sites[use]
        sites_of[(node_a, node_b)].append(ConflictSite("use", site.value, site.op, site.operand, (dim_a, dim_b)))
    order = sorted(sites_of, key=lambda nodes: (min(_site_position(program, s) for s in sites_of[nodes]), nodes))
    conflicts = tuple(
        Conflict(k, int(color_of[nodes[0]]), nodes,
                 tuple(sorted(sites_of[nodes],
                              key=lambda s: (_site_position(program, s), s.kind, s.operand, s.dims))))
        for k, nodes in enumerate(order)
    )
    return conflicts, {nodes: k for k, nodes in enumerate(order)}


def _color_conflicts(program: Program, names: DimensionNames, outputs: dict[str, list[tuple]]
                     ) -> tuple[ColorConflict, ...]:
    """The sites where two dims of one color meet, in program order."""
    use_sites = names.use_sites
    return tuple(sorted(
        [ColorConflict(color, ConflictSite("def", value, -1, -1, (a, b)))
         for value, a, b, color in outputs["color_conflict_def"]]
        + [ColorConflict(color, ConflictSite("use", use_sites[use].value, use_sites[use].op, use_sites[use].operand,
                                             (a, b)))
           for use, a, b, color in outputs["color_conflict_use"]],
        key=lambda c: (_site_position(program, c.site), c.site.kind, c.site.operand, c.site.dims),
    ))


def _boxes(names: DimensionNames, outputs: dict[str, list[tuple]], conflict_id: dict[tuple[int, int], int],
           graph: NodeGraph) -> tuple[list[tuple[int, ...]], list[bool]]:
    """The boxes, sorted: ``(def conflict, use conflict, flipped, corners...)``, and whether a path crosses each.
    A box is a pair of conflicts with its four corners; it may sit on several tensors (one definition and use
    each), and it is crossed when a path crosses it on any of them."""
    instances: dict[tuple[int, ...], list[tuple[int, int, int, int, int, int]]] = defaultdict(list)
    for def_a, def_b, use_a, use_b, value, use in outputs["box"]:
        key = (conflict_id[(def_a, def_b)], conflict_id[(min(use_a, use_b), max(use_a, use_b))],
               int(use_a > use_b), def_a, def_b, use_a, use_b)
        instances[key].append((def_a, def_b, use_a, use_b, value, use))
    boxes = sorted(instances)
    rows = [row for key in boxes for row in instances[key]]
    crossed_rows = iter(graph.crossed(rows, names))
    crossed = [any([next(crossed_rows) for _ in instances[key]]) for key in boxes]
    return boxes, crossed


def _compatibility_sets(conflicts: Sequence[Conflict], boxes: Sequence[tuple[int, ...]], crossed: Sequence[bool]
                        ) -> tuple[list[CompatibilitySet], list[int], int]:
    """The closure of the uncrossed boxes with orientation (a union-find whose parity says whether a conflict's
    endpoint 0 goes with its root's 0): the compatibility sets, each conflict's set, and how many boxes
    contradicted the orientation found before them."""
    parent = list(range(len(conflicts)))
    parity = [0] * len(conflicts)

    def find(c: int) -> tuple[int, int]:
        path = []
        while parent[c] != c:
            path.append(c)
            c = parent[c]
        root, acc = c, 0
        for node in reversed(path):  # compress, accumulating parity from the root down
            acc ^= parity[node]
            parity[node], parent[node] = acc, root
        return root, (parity[path[0]] if path else 0)

    contradicting = 0
    for (first, second, flipped, *_), is_crossed in zip(boxes, crossed, strict=True):
        if is_crossed or first == second:
            continue
        root_a, parity_a = find(first)
        root_b, parity_b = find(second)
        if root_a == root_b:
            contradicting += (parity_a ^ parity_b) != flipped
            continue
        low, high = sorted((root_a, root_b))
        parent[high] = low
        parity[high] = parity_a ^ parity_b ^ flipped

    members: dict[int, list[int]] = defaultdict(list)
    orientation = [0] * len(conflicts)
    for c in range(len(conflicts)):
        root, orientation[c] = find(c)
        members[root].append(c)
    sets = []
    set_of = [0] * len(conflicts)
    for set_id, root in enumerate(sorted(members)):
        ids = members[root]
        first_site = conflicts[ids[0]].sites[0]
        # Resolution 0 shards the first conflict's endpoint holding its smaller dim there.
        pick_first = 0 if first_site.dims[0] < first_site.dims[1] else 1
        sharded_by_0 = tuple(pick_first ^ orientation[c] ^ orientation[ids[0]] for c in ids)
        sets.append(CompatibilitySet(set_id, tuple(ids), sharded_by_0))
        for c in ids:
            set_of[c] = set_id
    return sets, set_of, contradicting
