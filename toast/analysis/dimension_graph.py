"""The dimension graph (TOAST section 3.4) restricted to the colors with conflicts: its nodes
are classes of dimension names under I, its edges the M edges between them. The crossing
check of the box heuristic (section 3.5) walks it.

Loops. The paper's reasoning assumes the graph of straight-line code, which is acyclic. A
``stablehlo.while`` is not: its rules (``rules/ops/control_flow.dl``) identify operand I,
block argument I, the body's returned value I and result I, so one node C stands for the
carried value at every iteration boundary, and the body's returned dims flow back into its
block arguments through C. Read naively, the body's nodes of a color share a strongly
connected component, and most boxes of the body look crossed, while the same model unrolled
has no crossed box at all. The crossing check therefore reads the loop the way the unrolled
program reads: the names of C get *roles* (the operand uses ``entry``, the block arguments
``in``, the body's returned uses ``exit``, the results ``result``), each role its own graph
node, joined as data flows through the loop: ``entry -> in`` (the first iteration),
``exit -> in`` (the back edge: iteration k's output is iteration k+1's input),
``exit -> result`` (the last) and ``entry -> result`` (no iteration). These edges join only
names the rules identified; the nodes, colors and conflicts do not change.

A box of a value defined inside a loop body relates a definition and a use of one iteration
(the unrolled program's layer k); no path can leave layer k and come back (it can only go
on to layer k+1), so the box is checked in the graph of that body alone, without its back
edges. A box outside the loop is checked in the graph with the back edges, where a path
through the loop may take any number of iterations, as in the unrolled program; its corners
on the loop's operands (``entry``) and results (``result``) are the values before the first
iteration and after the last. Nested loops nest the same way: each loop body with a box is
one reachability pass over the edges inside it, so the work is linear in the program times
the loop depth.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toast.facts.numbering import DimensionNames
from toast.frontend.ir import TERMINATORS, Program
from toast.frontend.loops import loop_nest

# Roles of the names of a while loop's carried values (see the module docstring). A name
# with role r lies in graph node ``node + r * names``; block arguments keep role 0 (``in``).
PLAIN, ENTRY, RESULT, EXIT = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Loops:
    """Where each dimension name sits with respect to ``stablehlo.while`` loops.

    Attributes:
      enclosing: ``while op id -> the while op whose body holds it`` (``-1`` at top level).
      scope: ``int64[names.count]``, the innermost while op whose regions hold the name's
        definition or use (``-1`` outside every loop); a loop's operands and results lie
        outside it, its block arguments and returned values inside.
      role: ``int8[names.count]``: ``ENTRY`` for a while operand, ``RESULT`` for a while
        result, ``EXIT`` for a value a while region returns, else ``PLAIN``.
    """

    enclosing: dict[int, int]
    scope: np.ndarray
    role: np.ndarray

    @staticmethod
    def of(program: Program, names: DimensionNames) -> Loops:
        """The loops of ``program`` (linear in the program)."""
        nest = loop_nest(program)
        enclosing = {loop.op: loop.enclosing for loop in nest.loops.values()}
        value_scope = nest.loop_of_value
        value_role = np.zeros(len(program.values), dtype=np.int8)
        for loop in nest.loops:
            value_role[list(program.ops[loop].results)] = RESULT
        sites = names.use_sites
        site_ops = np.fromiter(map(_SITE_OP, sites), dtype=np.int64, count=len(sites))
        use_scope = nest.loop_of_op[site_ops]
        # A use's role is its op's: ENTRY for a while, EXIT for a return of a while's region, else PLAIN.
        op_role = np.full(len(program.ops), PLAIN, dtype=np.int8)
        op_role[list(nest.loops)] = ENTRY
        for op in program.ops:
            if op.parent is not None and op.kind in TERMINATORS and op.parent[0] in nest.loops:
                op_role[op.id] = EXIT
        use_role = op_role[site_ops]
        def_ranks = np.fromiter(map(len, map(_SHAPE, program.values)), dtype=np.int64, count=len(program.values))
        use_ranks = def_ranks[np.fromiter(map(_SITE_VALUE, sites), dtype=np.int64, count=len(sites))]
        scope = np.concatenate([np.repeat(value_scope, def_ranks), np.repeat(use_scope, use_ranks)])
        role = np.concatenate([np.repeat(value_role, def_ranks), np.repeat(use_role, use_ranks)])
        return Loops(enclosing, scope, role)

    def chain(self, loop: int) -> list[int]:
        """``loop`` and the loops around it, innermost first, ending with ``-1``."""
        chain = [loop]
        while chain[-1] != -1:
            chain.append(self.enclosing[chain[-1]])
        return chain


_SITE_OP, _SITE_VALUE, _SHAPE = operator.itemgetter(0), operator.itemgetter(2), operator.attrgetter("shape")


@dataclass(frozen=True, slots=True)
class NodeGraph:
    """The dimension graph restricted to some colors: nodes (I-classes) and M edges between them.

    Attributes:
      successors: ``node -> sorted successor nodes`` (deduplicated edges, self-loops dropped).
      flow: the same edges with loop roles, for the crossing check: ``home -> (sources,
        targets)``, nodes offset by role (``node + role * names``), ``home`` the innermost
        loop whose body holds the edge (``-1`` for none); a loop's role edges are at home
        where the loop is.
      loops: the program's loops, ``None`` when built without them (no loop is then special).
    """

    successors: dict[int, tuple[int, ...]]
    flow: dict[int, tuple[np.ndarray, np.ndarray]]
    loops: Loops | None = None

    @staticmethod
    def of(color_of: np.ndarray, node_of: np.ndarray, m_edges: Sequence[tuple[int, int]] | np.ndarray, *,
           colors: set[int], loops: Loops | None = None) -> NodeGraph:
        """The nodes and M edges of ``colors`` (an M edge never leaves its color)."""
        if not colors or not len(m_edges):
            return NodeGraph({}, {}, loops)
        edges = np.asarray(m_edges, dtype=np.int64)
        edges = edges[np.isin(color_of[edges[:, 0]], np.fromiter(colors, dtype=np.int64))]
        pairs = np.unique(np.stack([node_of[edges[:, 0]], node_of[edges[:, 1]]], axis=1), axis=0)
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        successors: dict[int, list[int]] = defaultdict(list)
        for source, target in pairs.tolist():
            successors[source].append(target)
        plain = {k: tuple(v) for k, v in successors.items()}
        if loops is None:
            return NodeGraph(plain, {-1: (pairs[:, 0], pairs[:, 1])})
        count = len(node_of)
        defs, uses = edges[:, 0], edges[:, 1]
        sources = node_of[defs] + loops.role[defs].astype(np.int64) * count
        targets = node_of[uses] + loops.role[uses].astype(np.int64) * count
        homes = loops.scope[defs]  # a use lies in its definition's scope or deeper (SSA)
        # The while's identities read as data flow, for each carried node of a color kept, at
        # home where the loop is (outside its body: a body's own graph has no back edges).
        carried = np.flatnonzero(loops.role != PLAIN)
        carried = carried[np.isin(color_of[carried], np.fromiter(colors, dtype=np.int64))]
        outside = np.where(loops.role[carried] == EXIT,
                           np.array([loops.enclosing.get(int(s), -1) for s in loops.scope[carried]], dtype=np.int64),
                           loops.scope[carried])
        nodes = np.unique(np.stack([node_of[carried], outside], axis=1), axis=0)
        if len(nodes):
            c, home = nodes[:, 0], nodes[:, 1]
            entry, result, exit_ = c + ENTRY * count, c + RESULT * count, c + EXIT * count
            sources = np.concatenate([sources, entry, exit_, exit_, entry])
            targets = np.concatenate([targets, c, c, result, result])
            homes = np.concatenate([homes, home, home, home, home])
        flow = np.unique(np.stack([homes, sources, targets], axis=1), axis=0)  # sorted by home
        flow = flow[flow[:, 1] != flow[:, 2]]
        keys, starts = np.unique(flow[:, 0], return_index=True)
        ends = [*starts[1:].tolist(), len(flow)]
        by_home = {int(h): (flow[a:b, 1], flow[a:b, 2])
                   for h, a, b in zip(keys.tolist(), starts.tolist(), ends, strict=True)}
        return NodeGraph(plain, by_home, loops)

    def crossed(self, boxes: Sequence[tuple[int, int, int, int, int, int]], names: DimensionNames | None = None,
                ) -> list[bool]:
        """For each box ``(DefA, DefB, UseA, UseB, Value, Use)``: is there a path DefA -> UseB
        or DefB -> UseA (in the loop body that defines ``Value``, see the module docstring)?

        One pass per loop body with boxes (and one for the rest) over the strongly connected
        components in topological order, carrying a bitset of the box corners (DefA, DefB)
        that reach each component: time linear in the graph times the number of words of the
        bitset.
        """
        if not boxes:
            return []
        loops = self.loops
        queries: dict[int, list[tuple[int, tuple[int, int, int, int]]]] = defaultdict(list)
        for k, (def_a, def_b, use_a, use_b, value, use) in enumerate(boxes):
            if loops is None or names is None:
                queries[-1].append((k, (def_a, def_b, use_a, use_b)))
                continue
            def_name, use_name = names.def_base[value], names.use_sites[use].first_name
            offset = len(loops.role)
            def_shift = int(loops.role[def_name]) * offset
            use_shift = int(loops.role[use_name]) * offset
            queries[int(loops.scope[def_name])].append(
                (k, (def_a + def_shift, def_b + def_shift, use_a + use_shift, use_b + use_shift)))
        # Each loop's body holds the edges at home there and in the loops inside it.
        inside: dict[int, list[int]] = defaultdict(list)
        for home in self.flow:
            for scope in loops.chain(home) if loops is not None else [-1]:
                inside[scope].append(home)
        result = [False] * len(boxes)
        for scope, asked in queries.items():
            homes = inside.get(scope, [])
            sources = [s for h in homes for s in self.flow[h][0].tolist()]
            targets = [t for h in homes for t in self.flow[h][1].tolist()]
            answers = _crossed(sources, targets, [box for _, box in asked])
            for (k, _), answer in zip(asked, answers, strict=True):
                result[k] = answer
        return result


def _crossed(sources: list[int], targets: list[int], boxes: Sequence[tuple[int, int, int, int]]) -> list[bool]:
    """Box crossing on the graph of edges ``sources[k] -> targets[k]`` (see ``crossed``)."""
    # Imported here: scipy.sparse takes 0.2 s to import, which a cached analysis never needs.
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    # In arrays (tens of thousands of edges): the nodes numbered in sorted order, the edges by those numbers.
    corners = np.asarray(boxes, dtype=np.int64).reshape(len(boxes), 4)
    source_nodes, target_nodes = np.asarray(sources, dtype=np.int64), np.asarray(targets, dtype=np.int64)
    nodes = np.unique(np.concatenate([source_nodes, target_nodes, corners.ravel()]))
    source_ids, target_ids = np.searchsorted(nodes, source_nodes), np.searchsorted(nodes, target_nodes)
    matrix = coo_matrix((np.ones(len(source_ids), dtype=np.int8), (source_ids, target_ids)), shape=(len(nodes),) * 2)
    count, component = connected_components(matrix.tocsr(), directed=True, connection="strong")
    # Condensed DAG (each edge between components once) and a topological order (Kahn).
    ends = np.stack([component[source_ids], component[target_ids]], axis=1).astype(np.int64)
    between = np.unique(ends[ends[:, 0] != ends[:, 1]], axis=0)
    condensed: dict[int, list[int]] = defaultdict(list)
    for source, target in between.tolist():
        condensed[source].append(target)
    indegree = np.bincount(between[:, 1], minlength=count).tolist()
    corner_component = component[np.searchsorted(nodes, corners)].tolist()  # [box][corner]
    starts = sorted({node for box in boxes for node in box[:2]})
    bit = {node: 1 << k for k, node in enumerate(starts)}
    reach = [0] * count
    for node, node_component in zip(starts, component[np.searchsorted(nodes, starts)].tolist(), strict=True):
        reach[node_component] |= bit[node]
    ready = [c for c in range(count) if indegree[c] == 0]
    while ready:
        current = ready.pop()
        for following in condensed.get(current, ()):
            reach[following] |= reach[current]
            indegree[following] -= 1
            if indegree[following] == 0:
                ready.append(following)
    return [bool(reach[use_b] & bit[def_a]) or bool(reach[use_a] & bit[def_b])
            for (def_a, def_b, _, _), (_, _, use_a, use_b) in zip(boxes, corner_component, strict=True)]
