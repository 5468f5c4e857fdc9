"""The loop structure of a program: its ``stablehlo.while`` loops, how they nest and what they hold.

Every stage that reasons about loops reads this one structure (``loop_nest``, computed once per ``Program``): the
analysis's dimension graph (a loop body's names), the stored split through loops (``toast.sharding.carry``), the
kernel plan (trip counts, kernels' repeats) and the pricing of loop-body collectives (``toast.cost.loops``).

- **Where.** Each op lies in the innermost while whose regions (condition or body, through inlined calls and
  branches) hold it; a value is defined where its op is, a while's block arguments inside that while, its
  results outside it.
- **Trip count.** A while counting from a constant to a constant by a constant (what ``lax.scan`` and
  ``fori_loop`` emit) runs that many iterations; any other runs once as far as the cost model knows
  (``Loop.trip_count_known`` says which).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from toast.frontend.ir import TERMINATORS, Op, Program

WHILE = "stablehlo.while"


@dataclass(frozen=True, slots=True)
class Loop:
    """A ``stablehlo.while``.

    Attributes:
      op: the while op's id.
      trip_count: iterations per entry (1 when not known).
      trip_count_known: whether the count was read from the loop.
      enclosing: the while whose regions hold it (op id), ``-1`` at top level.
      body_args: value ids of its body's block arguments (the carried values, as an iteration sees them).
    """

    op: int
    trip_count: int
    trip_count_known: bool
    enclosing: int = -1
    body_args: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LoopNest:
    """The ``stablehlo.while`` loops of one program (``loop_nest``).

    Attributes:
      loops: ``while op id -> Loop``, in program order.
      loop_of_op: ``int64[ops]``, the innermost while holding each op, ``-1`` at top level.
      loop_of_value: ``int64[values]``, the innermost while holding each value's definition (a while's block
        arguments: that while; its results: the one around it), ``-1`` at top level and for the arguments.
      repeats_of_op: ``int64[ops]``, how many times one run of the program runs each op: the product of the
        trip counts of the loops holding it.
    """

    loops: Mapping[int, Loop]
    loop_of_op: np.ndarray
    loop_of_value: np.ndarray
    repeats_of_op: np.ndarray

    def enclosing_loop(self, op_id: int) -> int:
        """The innermost while holding op ``op_id`` (op id), ``-1`` at top level."""
        return int(self.loop_of_op[op_id])

    def outermost_loop(self, op_id: int) -> int:
        """The top-level while holding op ``op_id`` (op id), ``-1`` at top level."""
        outer = loop = int(self.loop_of_op[op_id])
        while loop >= 0:
            outer, loop = loop, self.loops[loop].enclosing
        return outer

    def repeats_in(self, loop: int) -> int:
        """How many times one run of the program runs the body of ``loop`` (``-1``: the top level, once): the
        product of the trip counts of ``loop`` and the loops around it."""
        repeats = 1
        while loop >= 0:
            repeats *= self.loops[loop].trip_count
            loop = self.loops[loop].enclosing
        return repeats

    def chain(self, loop: int) -> list[int]:
        """``loop`` and the loops around it, innermost first, ending with ``-1``."""
        chain = [loop]
        while chain[-1] != -1:
            chain.append(self.loops[chain[-1]].enclosing)
        return chain


# The programs whose loop nests were asked for last (by identity: a Program is immutable), most recent first.
_RECENT: list[tuple[Program, LoopNest]] = []
_KEPT = 4


def loop_nest(program: Program) -> LoopNest:
    """The loops of ``program``, computed once (linear in the program, but for the trip counts: linear per loop)."""
    for index, (known, nest) in enumerate(_RECENT):
        if known is program:
            if index:
                _RECENT.insert(0, _RECENT.pop(index))
            return nest
    nest = _loop_nest(program)
    _RECENT.insert(0, (program, nest))
    del _RECENT[_KEPT:]
    return nest


def _loop_nest(program: Program) -> LoopNest:
    ops = program.ops
    # In lists, then arrays (an element store into an array per op was most of the time).
    loop_of_op = [-1] * len(ops)
    for op in ops:  # parents come first
        if op.parent is not None:
            parent = op.parent[0]
            loop_of_op[op.id] = parent if ops[parent].kind == WHILE else loop_of_op[parent]
    # The ops of each region of each while (condition, body), in program order: what a trip count reads.
    regions: dict[tuple[int, int], list[Op]] = {}
    for op in ops:
        if op.parent is not None and loop_of_op[op.id] == op.parent[0]:
            regions.setdefault(op.parent, []).append(op)
    loops: dict[int, Loop] = {}
    loop_of_value = [-1] * len(program.values)
    for op in ops:
        outer = inner = loop_of_op[op.id]
        if op.kind == WHILE:
            trips = _trip_count(program, op, regions.get((op.id, 0), []), regions.get((op.id, 1), []))
            loops[op.id] = Loop(op.id, trips or 1, trips is not None, inner,
                                op.regions[1] if len(op.regions) >= 2 else ())
            inner = op.id
        for args in op.regions:
            for value_id in args:
                loop_of_value[value_id] = inner
        for value_id in op.results:
            loop_of_value[value_id] = outer
    repeats = {-1: 1}
    for loop in loops.values():  # program order: the loop around one comes before it
        repeats[loop.op] = repeats[loop.enclosing] * loop.trip_count
    arrays = (np.asarray(loop_of_op, dtype=np.int64).reshape(len(ops)),
              np.asarray(loop_of_value, dtype=np.int64).reshape(len(program.values)),
              np.asarray([repeats[loop] for loop in loop_of_op], dtype=np.int64).reshape(len(ops)))
    for array in arrays:
        array.setflags(write=False)  # shared by every stage reading the program's loops
    return LoopNest(loops, *arrays)


def _trip_count(program: Program, loop: Op, cond_ops: list[Op], body_ops: list[Op]) -> int | None:
    """Iterations of a counted while loop (``for i in range(a, b, s)`` as ``lax.scan``/``fori_loop`` lower
    it): the condition compares a carried counter against a constant, the body adds a constant to it, and
    the counter starts from a constant. ``None`` when the loop is not of that form. ``cond_ops``, ``body_ops``:
    the ops of its condition and body regions (not of regions inside them), in program order."""
    ops, producer = program.ops, program.producer
    if len(loop.regions) < 2:
        return None
    cond_args, body_args = loop.regions[0], loop.regions[1]
    if not cond_ops or cond_ops[-1].kind not in TERMINATORS:
        return None
    condition = cond_ops[-1].operands[0]
    compare = ops[producer[condition]] if producer[condition] >= 0 else None
    if compare is None or compare.kind != "stablehlo.compare" or compare.parent != (loop.id, 0):
        return None
    direction = compare.attr("comparison_direction", "LT")
    lhs, rhs = compare.operands
    if direction == "GT":
        lhs, rhs, direction = rhs, lhs, "LT"
    if direction != "LT" or lhs not in cond_args:
        return None
    bound = _constant(program, rhs)
    index = cond_args.index(lhs)
    start = _constant(program, loop.operands[index]) if index < len(loop.operands) else None
    if bound is None or start is None or not body_ops or body_ops[-1].kind not in TERMINATORS:
        return None
    next_value = body_ops[-1].operands[index]
    add = ops[producer[next_value]] if producer[next_value] >= 0 else None
    if add is None or add.kind != "stablehlo.add" or body_args[index] not in add.operands:
        return None
    other = add.operands[1] if add.operands[0] == body_args[index] else add.operands[0]
    step = _constant(program, other)
    if step is None or step <= 0:
        return None
    return max(0, -(-(bound - start) // step))


def _constant(program: Program, value_id: int) -> int | None:
    """The integer a scalar constant holds (through converts and reshapes), else ``None``."""
    seen = 0
    while seen < 4:
        p = program.producer[value_id]
        if p < 0:
            return None
        op = program.ops[p]
        if op.kind == "stablehlo.constant":
            scalar = op.attr("scalar")
            return int(scalar) if scalar is not None else None
        if op.kind not in ("stablehlo.convert", "stablehlo.reshape", "stablehlo.broadcast_in_dim") or not op.operands:
            return None
        value_id = op.operands[0]
        seen += 1
    return None
