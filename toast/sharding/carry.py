"""Where a parameter stored split (FSDP, ZeRO-3) stays split: through loops, as XLA's SPMD partitioner keeps it.

A model whose layers run under ``jax.lax.scan`` hands its layer-stacked parameters (``[L, ...]``) to a
``stablehlo.while``; the body takes one layer's slice per iteration (``dynamic_slice`` at the loop counter),
reshapes and converts it, and uses it in a matmul. Stored split, the stack stays split in the loop's carry, and
so does each iteration's slice: XLA gathers the slice where the matmul needs it whole, inside the body, one
layer at a time (not the whole stack before the loop). The backward loop accumulates each layer's gradient into
a carried stack (``dynamic_update_slice``), which XLA also keeps split: each iteration reduce-scatters its
layer's gradient into its shard.

``carried_nodes`` finds the dimension-graph nodes (classes of names under I) along those paths, so that a
stored split covers them:

- **forward**, from the parameter: into a ``while`` (the node of the carried value: operand, block argument,
  returned value and result), then, inside the loop body, through the uses that hand the dim on unchanged: a
  ``func.call`` (the inlined callee's argument: jax wraps a scan's and a remat's body in one), a
  ``dynamic_slice`` or ``dynamic_update_slice`` whose result keeps the dim, an ``optimization_barrier``, the
  rules' ``keeps_elements`` kinds (reshape, transpose, convert: XLA propagates the split through them and
  gathers the converted slice); and anywhere through elementwise ops (a cast of the parameters before the loop).
  It stops at the first use that computes with the dim (a matmul's operand; a ``reduce`` summing over it is
  split too: its result is a partial sum, all-reduced). Outside loops a parameter is gathered at its first
  use that is not elementwise.
- **backward**, from the update chain (the values the optimizer computes the new parameter from): through the
  producers that hand a dim on unchanged: a ``while`` result, then inside the loop body a ``func.call`` result,
  a ``dynamic_update_slice`` (its accumulator and the update written into it), the ``keeps_elements`` kinds;
  and the broadcast that initializes an accumulator. It stops at the op that makes the gradient (a matmul whose
  result is a partial sum, reduce-scattered where it enters the split path). From every node it reaches, it
  also goes forward as above (the gradient's other uses: the square and sum of a global-norm clipping).

A step is taken only where the dim goes through: the node reached holds a definition of that op's results or
block arguments (a ``dynamic_slice`` that slices the dim itself is not a way through). Linear in the program.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from toast.analysis.named_dimensions import Analysis
from toast.frontend.loops import loop_nest

# Ops that hand an operand's dims on to their result (a call: to its callee's arguments) in a loop body.
_PASS_ON = frozenset({"stablehlo.while", "func.call", "stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice",
                      "stablehlo.optimization_barrier"})
# Producers a backward walk may go through anywhere: besides _PASS_ON, the broadcast of an accumulator's
# initial scalar (its result's dims are its own).
_INITIAL = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.constant"})
# A region's return hands its operands on to the results of the op holding the region (a call's, a loop's).
_RETURNS = frozenset({"func.return", "stablehlo.return"})


@dataclass(frozen=True, slots=True)
class _Index:
    """The analysis's names grouped for the walks."""

    node_names: tuple[np.ndarray, ...]  # node -> its names
    uses_of_def: dict[int, list[int]]  # definition name -> use names (M edges)
    def_of_use: dict[int, int]  # use name -> definition name
    in_loop: np.ndarray  # bool[ops]: the op lies in a while's regions


_LAST: list[tuple[Analysis, _Index]] = []


def _index(analysis: Analysis) -> _Index:
    if _LAST and _LAST[0][0] is analysis:
        return _LAST[0][1]
    node_of = analysis.node_of
    order = np.argsort(node_of, kind="stable")
    bounds = np.searchsorted(node_of[order], np.arange(int(node_of.max()) + 2 if len(node_of) else 1))
    node_names = tuple(order[bounds[n]:bounds[n + 1]] for n in range(len(bounds) - 1))
    uses_of_def: dict[int, list[int]] = {}
    def_of_use: dict[int, int] = {}
    for definition, use in analysis.m_edges:
        uses_of_def.setdefault(definition, []).append(use)
        def_of_use[use] = definition
    index = _Index(node_names, uses_of_def, def_of_use, loop_nest(analysis.program).loop_of_op >= 0)
    _LAST[:] = [(analysis, index)]
    return index


def carried_nodes(analysis: Analysis, *, forward_from: Iterable[int], backward_from: Iterable[int]) -> set[int]:
    """The nodes a stored split reaches beyond ``forward_from`` (a parameter's dim nodes) and ``backward_from``
    (its update chain's), found as the module docstring says; the start nodes are not included."""
    index = _index(analysis)
    program, names = analysis.program, analysis.names
    definitions = len(names.defs)
    node_of = analysis.node_of
    keeps = analysis.kernel_semantics.keeps_elements

    elementwise = analysis.elementwise_ops
    summed = analysis.summed_dims

    def passes(kind: str, op_id: int, *, backward: bool) -> bool:
        # Into a loop anywhere; within a loop body, on through the ops that hand the dim on (outside loops the
        # use at hand is where XLA gathers: a call used twice would gather twice); forward, through elementwise
        # ops anywhere (XLA computes them on the split, as on the gradient clipping's square).
        return kind == "stablehlo.while" or (backward and kind in _INITIAL) or (
            bool(index.in_loop[op_id]) and (kind in _PASS_ON or kind in keeps)) or (
            not backward and op_id in elementwise)

    def passed_to(op_id: int) -> int:
        """The op whose results a use in ``op_id`` flows to: a call's (or a loop's) for its region's return."""
        op = program.ops[op_id]
        if op.kind in _RETURNS and op.parent is not None and program.ops[op.parent[0]].kind in _PASS_ON:
            return op.parent[0]
        return op_id

    def through(node: int, op_id: int) -> bool:
        """The node holds a definition of ``op_id``'s results or block arguments: the dim goes through."""
        return any(name < definitions and program.producer[names.defs[name][0]] == op_id
                   for name in index.node_names[node].tolist())

    found: set[int] = set()
    start_forward = {int(n) for n in forward_from}
    start_backward = {int(n) for n in backward_from}
    frontier = [(n, True) for n in sorted(start_forward)] + [(n, False) for n in sorted(start_backward)]
    seen = {(n, forward) for n, forward in frontier}
    while frontier:
        node, forward = frontier.pop()
        for name in index.node_names[node].tolist():
            if forward and name < definitions:
                for use in index.uses_of_def.get(name, ()):
                    user, operand, dim = names.uses[use - definitions]
                    op_id = passed_to(user)
                    target = int(node_of[use])
                    if (target, True) in seen:
                        continue
                    if program.ops[user].kind == "stablehlo.reduce" and (user, operand, dim) in summed:
                        found.add(target)  # summed on the split: a partial sum, reduced over the axis (a scalar)
                        continue
                    if not passes(program.ops[op_id].kind, op_id, backward=False) or not through(target, op_id):
                        continue
                    seen.add((target, True))
                    found.add(target)
                    frontier.append((target, True))
            elif not forward and name >= definitions:
                definition = index.def_of_use.get(name)
                if definition is None:
                    continue
                op_id = program.producer[names.defs[definition][0]]
                target = int(node_of[definition])
                if op_id < 0 or (target, False) in seen or not passes(program.ops[op_id].kind, op_id, backward=True):
                    continue
                seen.add((target, False))
                found.add(target)
                frontier.append((target, False))
                if (target, True) not in seen:  # and on from it: the gradient's other uses (its clipping norm)
                    seen.add((target, True))
                    frontier.append((target, True))
    return found - start_forward - start_backward
