"""The one numbering of dimension names and uses that every later stage reads.

Dimension names are dense integers: first one per dimension of every definition, in value
order; then one per dimension of every use, in program order of the ops and operand order
within an op. A *use* is one operand position of one op; uses are numbered in the same order.
``number_names`` is the only place this numbering is computed; the fact writer
(``toast.facts.writer``) writes it as facts, and the analysis, sharding, cost and output stages
look names and uses up in the ``DimensionNames`` it returns.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import NamedTuple

from toast.frontend.ir import Program


class UseSite(NamedTuple):
    """One use: operand ``operand`` of op ``op`` is a use of ``value``; its dim d has the
    dimension name ``first_name + d``. (A named tuple: there is one per operand of the
    program, and it is built faster than a frozen dataclass.)"""

    op: int
    operand: int
    value: int
    first_name: int


@dataclass(frozen=True, slots=True)
class DimensionNames:
    """Where each dimension name and each use comes from.

    Attributes:
      defs: ``defs[name] = (value id, dim)`` for definition names ``0 .. len(defs)-1``.
      uses: ``uses[name - len(defs)] = (op id, operand index, dim)`` for use names.
      def_base: ``def_base[value id]`` is the name of the value's dim 0; dim d is that + d.
      use_sites: ``use_sites[use id]``: the op, operand, value and first name of each use.
    """

    defs: tuple[tuple[int, int], ...]
    uses: tuple[tuple[int, int, int], ...]
    def_base: tuple[int, ...]
    use_sites: tuple[UseSite, ...]
    _use_of: dict[tuple[int, int], int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def count(self) -> int:
        """All dimension names, definitions and uses."""
        return len(self.defs) + len(self.uses)

    def use_id(self, op: int, operand: int) -> int:
        """The use id of operand ``operand`` of op ``op``."""
        if not self._use_of and self.use_sites:  # built on first lookup: the analysis needs none
            # In C loops (a 90k-op program has 280k uses): each site's (op, operand), numbered.
            self._use_of.update(zip(map(_OP_AND_OPERAND, self.use_sites), itertools.count()))
        return self._use_of[(op, operand)]

    def use_name(self, op: int, operand: int, dim: int) -> int:
        """The dimension name of dim ``dim`` of operand ``operand`` of op ``op``."""
        return self.use_sites[self.use_id(op, operand)].first_name + dim


_OP_AND_OPERAND = operator.itemgetter(0, 1)  # a UseSite's (op, operand)


def number_names(program: Program) -> DimensionNames:
    """Number the dimension names and uses of ``program`` (see the module docstring)."""
    ranks = [len(value.shape) for value in program.values]
    def_base = list(itertools.accumulate(ranks, initial=0))
    defs = [(value_id, dim) for value_id, rank in enumerate(ranks) for dim in range(rank)]
    uses: list[tuple[int, int, int]] = []
    sites: list[UseSite] = []
    name = def_base.pop()  # the first use name: one past the last definition name
    for op in program.ops:
        op_id = op.id
        for index, value_id in enumerate(op.operands):
            sites.append(UseSite(op_id, index, value_id, name))
            rank = ranks[value_id]
            if rank:
                uses += [(op_id, index, dim) for dim in range(rank)]
                name += rank
    return DimensionNames(tuple(defs), tuple(uses), tuple(def_base), tuple(sites))
