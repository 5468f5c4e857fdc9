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

import numpy as np

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
    values, ops = program.values, program.ops
    ranks = np.fromiter(map(len, map(_SHAPE, values)), dtype=np.int64, count=len(values))
    def_base = np.cumsum(ranks) - ranks
    def_count = int(ranks.sum())
    # In arrays (a 90k-op program has half a million names): each name's value (use) and dim, by name.
    def_dims = np.arange(def_count, dtype=np.int64) - np.repeat(def_base, ranks)
    defs = zip(np.repeat(np.arange(len(values), dtype=np.int64), ranks).tolist(), def_dims.tolist(), strict=True)
    operand_counts = np.fromiter(map(len, map(_OPERANDS, ops)), dtype=np.int64, count=len(ops))
    used = np.fromiter(itertools.chain.from_iterable(map(_OPERANDS, ops)), dtype=np.int64,
                       count=int(operand_counts.sum()))
    site_ops = np.repeat(np.fromiter(map(_ID, ops), dtype=np.int64, count=len(ops)), operand_counts)
    site_operands = np.arange(len(used), dtype=np.int64) - np.repeat(np.cumsum(operand_counts) - operand_counts,
                                                                      operand_counts)
    use_ranks = ranks[used]
    firsts = def_count + np.cumsum(use_ranks) - use_ranks
    sites = map(tuple.__new__, itertools.repeat(UseSite),
                zip(site_ops.tolist(), site_operands.tolist(), used.tolist(), firsts.tolist(), strict=True))
    use_dims = np.arange(int(use_ranks.sum()), dtype=np.int64) - np.repeat(firsts - def_count, use_ranks)
    uses = zip(np.repeat(site_ops, use_ranks).tolist(), np.repeat(site_operands, use_ranks).tolist(),
               use_dims.tolist(), strict=True)
    return DimensionNames(tuple(defs), tuple(uses), tuple(def_base.tolist()), tuple(sites))


_SHAPE, _OPERANDS, _ID = operator.attrgetter("shape"), operator.attrgetter("operands"), operator.attrgetter("id")
