"""The records of the conflicts stage (TOAST sections 3.3-3.6): conflicts, boxes,
compatibility sets and resolution groups, built by ``toast.analysis.conflicts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toast.frozen import pickled_by_constructor


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class ConflictSite:
    """A definition or a use that a conflict sits on.

    Attributes:
      kind: ``"def"`` (the definition of ``value``) or ``"use"`` (operand ``operand`` of op
        ``op``, a use of ``value``).
      value: the value id defined or used.
      op: the using op id (``-1`` for a definition).
      operand: operand index (``-1`` for a definition).
      dims: the two conflicting dims, in the order of the conflict's endpoints.
    """

    kind: str
    value: int
    op: int
    operand: int
    dims: tuple[int, int]


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class ColorConflict:
    """Section 3.3: ``color`` annotates both ``site.dims`` of one definition or use."""

    color: int
    site: ConflictSite


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class Conflict:
    """A conflict edge of the dimension graph (section 3.4).

    Attributes:
      id: index in ``Conflicts.conflicts`` (program order of the first site).
      color: the color both endpoints belong to.
      nodes: the endpoints, dimension-graph nodes ``nodes[0] < nodes[1]`` (each labeled by its
        smallest dimension name).
      sites: the definitions and uses the edge sits on, in program order.
    """

    id: int
    color: int
    nodes: tuple[int, int]
    sites: tuple[ConflictSite, ...]


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class Box:
    """Two conflicts forming a box (section 3.5): one on a definition, one on a use of it.

    Attributes:
      def_conflict, use_conflict: conflict ids.
      flipped: whether endpoint 0 of the definition's conflict flows (by M) to endpoint 1 of
        the use's conflict.
      crossed: a path of the dimension graph goes across the box: not compatible.
    """

    def_conflict: int
    use_conflict: int
    flipped: bool
    crossed: bool


@dataclass(frozen=True, slots=True)
class CompatibilitySet:
    """Conflicts resolved together (section 3.5), with their two resolutions.

    Attributes:
      id: index in ``Conflicts.sets``.
      conflicts: conflict ids, ascending.
      sharded_by_0: for each conflict (same order), the endpoint index (into
        ``Conflict.nodes``) that resolution 0 shards; resolution 1 shards the other one.
    """

    id: int
    conflicts: tuple[int, ...]
    sharded_by_0: tuple[int, ...]

    def sharded_endpoints(self, resolution: int) -> tuple[int, ...]:
        """Endpoint index sharded in each conflict under ``resolution`` (0 or 1)."""
        return tuple(side ^ resolution for side in self.sharded_by_0)


@dataclass(frozen=True, slots=True)
class ResolutionGroup:
    """Compatibility sets resolved by one bit of the action's ``resolution_order`` (section 3.6).

    Attributes:
      id: the bit's index.
      sets: compatibility set ids (isomorphic sub-graphs, oriented alike), ascending.
    """

    id: int
    sets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Conflicts:
    """Conflicts of a program and how they are resolved.

    Attributes:
      color_conflicts: colors occurring twice in one definition or use (section 3.3).
      conflicts: conflict edges of the dimension graph (section 3.4).
      sets: compatibility sets (section 3.5); without the box heuristic, one per conflict.
      groups: resolution groups (section 3.6); without the layer heuristic, one per set.
      boxes: the boxes found (crossed ones included); compatible ones joined the sets.
      set_of: ``set_of[conflict id]`` is its set id.
      group_of: ``group_of[set id]`` is its group id.
      invalid: rows of the conflicts stage's ``invalid`` output (empty when sound).
      stats: counts (boxes found, crossed, contradicting) for reports and benchmarks.
    """

    color_conflicts: tuple[ColorConflict, ...]
    conflicts: tuple[Conflict, ...]
    sets: tuple[CompatibilitySet, ...]
    groups: tuple[ResolutionGroup, ...]
    boxes: tuple[Box, ...]
    set_of: tuple[int, ...]
    group_of: tuple[int, ...]
    invalid: tuple[tuple, ...]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def resolution_bits(self) -> int:
        """Independent resolution bits: one per resolution group."""
        return len(self.groups)

    def unsharded_nodes(self, color: int, bits: Sequence[int]) -> frozenset[int]:
        """Nodes that sharding ``color`` under ``bits`` (one per group) leaves unsharded.

        Every node of the color is sharded except, in each of its conflicts, the endpoint the
        resolution does not pick. A node picked by one conflict and left by another stays
        unsharded (one axis cannot shard two dims of a tensor).
        """
        if len(bits) != len(self.groups):
            raise ValueError(f"expected {len(self.groups)} resolution bits, got {len(bits)}")
        return frozenset(nodes[1 - (sharded_by_0 ^ int(bits[group]))]
                         for nodes, sharded_by_0, group in _endpoints_by_color(self).get(color, ()))


# The last ``Conflicts``' conflicts by color: a search and every manual strategy ask ``unsharded_nodes`` once per
# action, and a 100k-op program has thousands of conflicts in sets of hundreds.
_LAST_BY_COLOR: list[tuple[Conflicts, dict[int, list[tuple[tuple[int, int], int, int]]]]] = []


def _endpoints_by_color(conflicts: Conflicts) -> dict[int, list[tuple[tuple[int, int], int, int]]]:
    """``color -> [(conflict nodes, endpoint resolution 0 shards, resolution group)]``, in conflict order."""
    if _LAST_BY_COLOR and _LAST_BY_COLOR[0][0] is conflicts:
        return _LAST_BY_COLOR[0][1]
    position: dict[tuple[int, int], int] = {}  # (set, conflict) -> the conflict's first place in the set
    for group_set in conflicts.sets:
        for k, conflict_id in enumerate(group_set.conflicts):
            position.setdefault((group_set.id, conflict_id), k)
    by_color: dict[int, list[tuple[tuple[int, int], int, int]]] = {}
    for conflict in conflicts.conflicts:
        group_set = conflicts.sets[conflicts.set_of[conflict.id]]
        by_color.setdefault(conflict.color, []).append(
            (conflict.nodes, group_set.sharded_by_0[position[(group_set.id, conflict.id)]],
             conflicts.group_of[group_set.id]))
    _LAST_BY_COLOR[:] = [(conflicts, by_color)]
    return by_color
