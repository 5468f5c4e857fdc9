"""The dimension graph (TOAST section 3.4) restricted to the colors with conflicts: its nodes
are classes of dimension names under I, its edges the M edges between them. The crossing
check of the box heuristic (section 3.5) walks it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components


@dataclass(frozen=True, slots=True)
class NodeGraph:
    """The dimension graph restricted to some colors: nodes (I-classes) and M edges between them.

    Attributes:
      successors: ``node -> sorted successor nodes`` (deduplicated edges, self-loops dropped).
    """

    successors: dict[int, tuple[int, ...]]

    @staticmethod
    def of(color_of: np.ndarray, node_of: np.ndarray, m_edges: Sequence[tuple[int, int]], *,
           colors: set[int]) -> NodeGraph:
        """The nodes and M edges of ``colors`` (an M edge never leaves its color)."""
        if not colors or not m_edges:
            return NodeGraph({})
        edges = np.asarray(m_edges, dtype=np.int64)
        keep = np.isin(color_of[edges[:, 0]], np.fromiter(colors, dtype=np.int64))
        pairs = np.unique(np.stack([node_of[edges[keep, 0]], node_of[edges[keep, 1]]], axis=1), axis=0)
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        successors: dict[int, list[int]] = defaultdict(list)
        for source, target in pairs.tolist():
            successors[source].append(target)
        return NodeGraph({k: tuple(v) for k, v in successors.items()})

    def crossed(self, boxes: Sequence[tuple[int, int, int, int]]) -> list[bool]:
        """For each box ``(DefA, DefB, UseA, UseB)``: is there a path DefA -> UseB or DefB -> UseA?

        One pass over the strongly connected components in topological order, carrying a
        bitset of the box corners (DefA, DefB) that reach each component: time linear in the
        graph times the number of words of the bitset.
        """
        if not boxes:
            return []
        nodes = sorted(set(self.successors) | {t for ts in self.successors.values() for t in ts}
                       | {n for box in boxes for n in box})
        index = {node: k for k, node in enumerate(nodes)}
        sources = [index[s] for s, ts in self.successors.items() for _ in ts]
        targets = [index[t] for ts in self.successors.values() for t in ts]
        matrix = coo_matrix((np.ones(len(sources), dtype=np.int8), (sources, targets)), shape=(len(nodes),) * 2)
        count, component = connected_components(matrix.tocsr(), directed=True, connection="strong")
        # Condensed DAG and a topological order (Kahn).
        condensed: dict[int, set[int]] = defaultdict(set)
        indegree = [0] * count
        for s, t in zip(sources, targets, strict=True):
            cs, ct = int(component[s]), int(component[t])
            if cs != ct and ct not in condensed[cs]:
                condensed[cs].add(ct)
                indegree[ct] += 1
        corners = sorted({n for box in boxes for n in box[:2]})
        bit = {node: 1 << k for k, node in enumerate(corners)}
        reach = [0] * count
        for node in corners:
            reach[int(component[index[node]])] |= bit[node]
        ready = [c for c in range(count) if indegree[c] == 0]
        while ready:
            current = ready.pop()
            for following in condensed.get(current, ()):
                reach[following] |= reach[current]
                indegree[following] -= 1
                if indegree[following] == 0:
                    ready.append(following)

        def reaches(source: int, target: int) -> bool:
            return bool(reach[int(component[index[target]])] & bit[source])

        return [reaches(def_a, use_b) or reaches(def_b, use_a) for def_a, def_b, use_a, use_b in boxes]
