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

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from toast.analysis.named_dimensions import Analysis
from toast.frontend.loops import loop_nest
from toast.sharding.state import distinct

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
    """Every step the walks can take, found for the whole program at once (arrays over the M edges): a program's
    FSDP strategies and a search's stored actions walk from every parameter, a 100k-op program's thousands of
    them, several times. Steps are grouped by the node they leave (``forward_start[node]`` to
    ``forward_start[node + 1]``), and each start's answer is kept."""

    # Lists, not arrays: a walk reads a few steps at a time, where a list's slice is several times faster.
    forward_start: list[int]  # [nodes + 1]
    forward_target: list[int]  # [steps]: the node a forward step reaches
    forward_summed: list[bool]  # [steps]: a reduce sums the dim: the target is reached, not walked from
    backward_start: list[int]  # [nodes + 1]
    backward_target: list[int]  # [steps]
    # (forward_from, backward_from) -> carried_nodes' answer.
    answers: dict[tuple[frozenset[int], frozenset[int]], frozenset[int]] = field(default_factory=dict)
    # The same steps as int64 arrays, made on first use: many walks taken together (``carried_nodes_many``).
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


_LAST: list[tuple[Analysis, _Index]] = []


def _index(analysis: Analysis) -> _Index:
    if _LAST and _LAST[0][0] is analysis:
        return _LAST[0][1]
    index = _steps(analysis)
    _LAST[:] = [(analysis, index)]
    return index


def _steps(analysis: Analysis) -> _Index:
    """The walks' steps, as the module docstring says: forward along each M edge (a definition name to a use
    name) whose op passes the dim on, backward along each M edge from the use to its definition's producer."""
    program, names = analysis.program, analysis.names
    definitions, count = len(names.defs), names.count
    nodes = int(analysis.node_of.max()) + 1 if count else 0
    node_of = analysis.node_of
    keeps = analysis.kernel_semantics.keeps_elements
    kinds = [op.kind for op in program.ops]
    in_loop = loop_nest(program).loop_of_op >= 0
    # Per op: whether a forward (backward) step may go through it. Into a loop anywhere; within a loop body, on
    # through the ops that hand the dim on (outside loops the use at hand is where XLA gathers: a call used twice
    # would gather twice); forward, through elementwise ops anywhere (XLA computes them on the split, as on the
    # gradient clipping's square); backward, through the broadcast that initializes an accumulator.
    is_while = np.array([kind == "stablehlo.while" for kind in kinds], dtype=bool)
    hands_on = in_loop & np.array([kind in _PASS_ON or kind in keeps for kind in kinds], dtype=bool)
    elementwise = np.zeros(len(kinds), dtype=bool)
    elementwise[list(analysis.elementwise_ops)] = True
    forward_op = is_while | hands_on | elementwise
    backward_op = is_while | hands_on | np.array([kind in _INITIAL for kind in kinds], dtype=bool)
    # The op whose results a use flows to: a call's (or a loop's) for its region's return.
    passed_to = np.arange(len(kinds))
    for op in program.ops:
        if op.kind in _RETURNS and op.parent is not None and kinds[op.parent[0]] in _PASS_ON:
            passed_to[op.id] = op.parent[0]
    producer = np.asarray(program.producer, dtype=np.int64)
    def_value = np.fromiter((value for value, _ in names.defs), dtype=np.int64, count=definitions)
    def_op = producer[def_value] if definitions else np.zeros(0, dtype=np.int64)  # -1: an entry argument
    use_op = np.fromiter((op for op, _, _ in names.uses), dtype=np.int64, count=len(names.uses))
    summed_use = np.zeros(len(names.uses), dtype=bool)  # a reduce sums over the use's dim
    for op_id, operand, dim in analysis.summed_dims:
        if kinds[op_id] == "stablehlo.reduce":
            summed_use[names.use_name(op_id, operand, dim) - definitions] = True
    edges = np.fromiter(itertools.chain.from_iterable(analysis.m_edges), dtype=np.int64).reshape(-1, 2)
    definition, use = edges[:, 0], edges[:, 1]

    # Forward, from the definition's node to the use's: where a reduce sums the dim (reached, not walked from),
    # or where the op the use flows to passes the dim on and the use's node holds a definition of that op's
    # results or block arguments (the dim goes through).
    source, target = node_of[definition], node_of[use]
    summed = summed_use[use - definitions]
    into = passed_to[use_op[use - definitions]]
    defined = def_op >= 0
    held = np.sort(node_of[:definitions][defined] * len(kinds) + def_op[defined])  # node x op of each definition
    wanted = target * len(kinds) + into
    through = held[np.minimum(np.searchsorted(held, wanted), max(len(held) - 1, 0))] == wanted if len(held) else \
        np.zeros(len(wanted), dtype=bool)
    step = summed | (forward_op[into] & through)
    forward_start, forward_target, forward_summed = _grouped(source[step], nodes, target[step], summed[step])
    # Backward, from the use's node to the definition's, through the definition's producer.
    made_by = def_op[definition]
    step = made_by >= 0
    step[step] = backward_op[made_by[step]]
    backward_start, backward_target = _grouped(node_of[use][step], nodes, node_of[definition][step])
    return _Index(forward_start, forward_target, forward_summed, backward_start, backward_target)


def _grouped(source: np.ndarray, nodes: int, *columns: np.ndarray) -> tuple[list, ...]:
    """Rows grouped by ``source`` node: where each node's rows start (``nodes + 1``), then each column."""
    order = np.argsort(source, kind="stable")
    starts = np.searchsorted(source[order], np.arange(nodes + 1))
    return (starts.tolist(), *(column[order].tolist() for column in columns))


def carried_nodes(analysis: Analysis, *, forward_from: Iterable[int], backward_from: Iterable[int]) -> set[int]:
    """The nodes a stored split reaches beyond ``forward_from`` (a parameter's dim nodes) and ``backward_from``
    (its update chain's), found as the module docstring says; the start nodes are not included."""
    index = _index(analysis)
    start_forward = frozenset(int(n) for n in forward_from)
    start_backward = frozenset(int(n) for n in backward_from)
    key = (start_forward, start_backward)
    answer = index.answers.get(key)
    if answer is None:
        answer = index.answers[key] = frozenset(_walk(index, start_forward, start_backward))
    return set(answer)


def carried_nodes_many(analysis: Analysis, starts: Sequence[tuple[Iterable[int], Iterable[int]]]) -> list[set[int]]:
    """``carried_nodes`` of each ``(forward_from, backward_from)`` of ``starts``: the walks not taken before are
    taken together, in arrays (a search's stored actions walk from every dim of thousands of parameters: one walk
    at a time in Python was most of building its action space)."""
    index = _index(analysis)
    keys = [(frozenset(int(n) for n in forward), frozenset(int(n) for n in backward)) for forward, backward in starts]
    missing = [key for key in dict.fromkeys(keys) if key not in index.answers]
    if missing:
        for key, answer in zip(missing, _walk_many(index, missing), strict=True):
            index.answers[key] = answer
    return [set(index.answers[key]) for key in keys]


def _arrays(index: _Index) -> dict[str, np.ndarray]:
    if not index.arrays:
        for name in ("forward_start", "forward_target", "backward_start", "backward_target"):
            index.arrays[name] = np.asarray(getattr(index, name), dtype=np.int64)
        index.arrays["forward_summed"] = np.asarray(index.forward_summed, dtype=bool)
    return index.arrays


def _walk_many(index: _Index, keys: Sequence[tuple[frozenset[int], frozenset[int]]]) -> list[frozenset[int]]:
    """``_walk`` of each key, all walks at once: a reached node of walk ``w`` is the int64 ``w * nodes + node``,
    and the walks go one step per round over every walk's frontier (arrays sorted and merged, as sets would be).
    The same sets as ``_walk``: what is reached does not depend on the order of the steps."""
    arrays = _arrays(index)
    width = max(len(index.forward_start) - 1, 1)  # nodes
    start_forward = _keys([forward for forward, _ in keys], width)
    start_backward = _keys([backward for _, backward in keys], width)
    # Backward: from the update chain's nodes, through the producers that hand the dim on.
    seen_backward = frontier = start_backward
    while len(frontier):
        reached = distinct(_steps_from(frontier, width, arrays["backward_start"], arrays["backward_target"])[0])
        frontier = reached[~_member(reached, seen_backward)]
        seen_backward = np.sort(np.concatenate([seen_backward, frontier]), kind="stable")
    # Forward: from the parameter's nodes and every node a backward step reached (not where a backward walk started).
    seen_forward = frontier = distinct(np.concatenate([start_forward,
                                                       seen_backward[~_member(seen_backward, start_backward)]]))
    summed_found = []
    while len(frontier):
        reached, step = _steps_from(frontier, width, arrays["forward_start"], arrays["forward_target"])
        summed = arrays["forward_summed"][step]
        summed_found.append(reached[summed])  # a partial sum, reduced over the axis: reached, not walked from
        reached = distinct(reached[~summed])
        frontier = reached[~_member(reached, seen_forward)]
        seen_forward = np.sort(np.concatenate([seen_forward, frontier]), kind="stable")
    found = distinct(np.concatenate([seen_backward, seen_forward, *summed_found]))
    found = found[~_member(found, start_forward) & ~_member(found, start_backward)]
    walk, node = np.divmod(found, width)
    bounds = np.searchsorted(walk, np.arange(len(keys) + 1)).tolist()
    nodes = node.tolist()
    return [frozenset(nodes[bounds[w]:bounds[w + 1]]) for w in range(len(keys))]


def _keys(node_sets: Sequence[frozenset[int]], width: int) -> np.ndarray:
    """``w * width + node`` of each node of each walk ``w``'s set, ascending."""
    counts = [len(nodes) for nodes in node_sets]
    nodes = np.fromiter(itertools.chain.from_iterable(node_sets), dtype=np.int64, count=sum(counts))
    return distinct(np.repeat(np.arange(len(node_sets), dtype=np.int64), counts) * width + nodes)


def _steps_from(frontier: np.ndarray, width: int, start: np.ndarray, target: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The keys every step from the ``frontier`` keys reaches (each walk's own), and the index of each step."""
    walk, node = np.divmod(frontier, width)
    first = start[node]
    counts = start[node + 1] - first
    offsets = np.cumsum(counts) - counts
    step = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(first - offsets, counts)
    return np.repeat(walk, counts) * width + target[step], step


def _member(values: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``ordered`` (ascending)."""
    if not len(ordered):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return ordered[at] == values


def _walk(index: _Index, start_forward: frozenset[int], start_backward: frozenset[int]) -> set[int]:
    """``carried_nodes``' walk: the nodes reached from the start nodes along ``index``'s steps, less the start
    nodes. A backward step reaches a node and walks on from it both ways (the gradient's other uses: its
    clipping norm), unless the node is where a backward walk started.

    What is reached does not depend on the order of the steps, so the backward walk goes first (a forward step
    never leads backward), then the forward walk from every node it reached; a node's two walks are kept in two
    sets of ints (a set of (node, direction) pairs hashes a tuple per step)."""
    forward_start, forward_target, forward_summed = index.forward_start, index.forward_target, index.forward_summed
    backward_start, backward_target = index.backward_start, index.backward_target
    found: set[int] = set()
    backward_seen = set(start_backward)
    forward_seen = set(start_forward)
    backward = sorted(start_backward)
    forward = sorted(start_forward)
    while backward:
        node = backward.pop()
        for target in backward_target[backward_start[node]:backward_start[node + 1]]:
            if target in backward_seen:
                continue
            backward_seen.add(target)
            found.add(target)
            backward.append(target)
            if target not in forward_seen:
                forward_seen.add(target)
                forward.append(target)
    while forward:
        node = forward.pop()
        start, end = forward_start[node], forward_start[node + 1]
        for target, summed in zip(forward_target[start:end], forward_summed[start:end], strict=True):
            if target in forward_seen:
                continue
            found.add(target)
            if not summed:  # summed on the split: a partial sum, reduced over the axis (a scalar)
                forward_seen.add(target)
                forward.append(target)
    return found - start_forward - start_backward
