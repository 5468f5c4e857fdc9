"""Equivalence classes of dimension names, in space linear in the number of names.

Colors are the classes of names identified by I and M together; the nodes of the dimension
graph are the classes of I alone. Both come from one union-find over the edge lists the
rules derive (never from an enumerated equivalence relation, which is quadratic in class
size).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def union_find(count: int, edges: Iterable[tuple[int, int]]) -> np.ndarray:
    """Class labels of ``count`` elements joined by ``edges``.

    Returns an ``int64[count]`` array; ``labels[x]`` is the smallest element of x's class, so
    labels are canonical (independent of edge order).
    """
    parent = list(range(count))

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            if ra < rb:
                parent[rb] = ra
            else:
                parent[ra] = rb
    return np.fromiter((find(x) for x in range(count)), dtype=np.int64, count=count)
