"""Equivalence classes of dimension names, in space linear in the number of names.

Colors are the classes of names identified by I and M together; the nodes of the dimension
graph are the classes of I alone. Both come from one union-find over the edge lists the
rules derive (never from an enumerated equivalence relation, which is quadratic in class
size).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np


def union_find(count: int, edges: Iterable[tuple[int, int]] | np.ndarray) -> np.ndarray:
    """Class labels of ``count`` elements joined by ``edges`` (pairs, or an ``int[n, 2]`` array).

    Returns an ``int64[count]`` array; ``labels[x]`` is the smallest element of x's class, so
    labels are canonical (independent of edge order). The classes are the connected components
    of the undirected graph of the edges (``scipy.sparse.csgraph``: a 90k-op program has half a
    million names and as many edges, seconds for a union-find in Python).
    """
    # Imported here: scipy.sparse takes 0.2 s to import, which a cached analysis never needs.
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    pairs = edges if isinstance(edges, np.ndarray) else np.fromiter(
        itertools.chain.from_iterable(edges), dtype=np.int64)
    pairs = pairs.reshape(-1, 2)
    graph = coo_matrix((np.ones(len(pairs), dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(count, count))
    _, component = connected_components(graph, directed=False)
    # Each component's smallest element: its first in element order.
    _, first = np.unique(component, return_index=True)
    return first[component].astype(np.int64)
