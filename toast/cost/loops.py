"""Collectives in loop bodies, overlapped as XLA's collective pipeliner and latency-hiding scheduler overlap them.

A model whose layers run under ``jax.lax.scan`` with FSDP gathers each layer's weight slice in the loop body and
reduce-scatters each layer's gradient there (``toast.sharding.carry``). XLA does not wait for them where they
are issued:

- **prefetched**: a collective whose operand the iteration does not compute from the loop's varying carry (a
  slice of a carried, unchanged parameter stack at the loop counter) is started one iteration early (XLA's
  ``CollectivePipeliner`` moves it forward; the next layer's gather runs under this layer's compute). Only the
  first iteration's waits for it.
- **deferred**: a reduction whose result the iteration only writes into a slot of its carry that the body never
  reads (a gradient ``dynamic_update_slice``-d into the accumulator stack, through reshapes and converts, or
  added to a carried sum) finishes during the next iteration (the pipeliner moves it backward); only the last
  one's is exposed. A result added to the residual stream is read by the next iteration at once: in the
  iteration.
- **in the iteration**: the others (a tensor-parallel all-reduce between two layers' matmuls) run on the
  communication stream from when their operand is made to where it is read, within the iteration
  (``toast.cost.schedule.makespan`` over the body's kernels), or folded into the matmul they feed or follow where the
  profile runs collective matmuls and that exposes less (``toast.cost.overlap``).

One iteration then takes ``max(its compute with the in-iteration waits, all its collectives back to back)``
(both streams in steady state): the exposed part per iteration is that minus its compute; each entry into the
loop adds its first prefetch and its last deferred reduction once. ``LoopOverlap.exposed`` gives each loop
collective's exposed seconds for a step; the rest is hidden.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toast.cost.kernels import KernelPlan
from toast.cost.overlap import folds, slack
from toast.frontend.ir import TERMINATORS
from toast.frontend.loops import WHILE, LoopNest

# Ops through which a reduced gradient is only stored into a loop's carry (besides the rules' keeps_elements).
_STORES = frozenset({"stablehlo.dynamic_update_slice", "stablehlo.add", "func.return", "stablehlo.return"})

Makespan = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[float, np.ndarray]]


@dataclass(frozen=True, slots=True)
class _Body:
    """One loop body: its kernels (all depths, program order), their runs per iteration, entries per step."""

    kernels: np.ndarray  # int64[k]
    per_iteration: np.ndarray  # float64[k]: runs of each kernel per iteration of this loop
    iterations: float  # iterations per step (all entries)
    entries: float  # entries per step (the trip counts of the loops around it)


class LoopOverlap:
    """Static facts about a program's loops for pricing the collectives in their bodies.

    Args:
      plan: the kernel plan (kernels, loops, scopes, reads).
      keeps_elements: the rules' kinds whose result holds operand 0's elements (reshape, convert, ...).
    """

    def __init__(self, plan: KernelPlan, *, keeps_elements: frozenset[str]):
        program, nest = plan.program, plan.nest
        values = program.values
        self.plan = plan
        # The loop whose body holds each op, and each value's definition (-1: top level; a while's body block
        # arguments: it).
        self.loop_of_op = loop_of_op = nest.loop_of_op
        self.loop_of_value = nest.loop_of_value
        self.varying = self._varying(program, nest)
        self.feeds_carry = self._feeds_carry(program, nest, loop_of_op, keeps_elements)
        # Each kernel's first reader per value (through buffers): where a reduction's result is needed.
        read_kernel, read_value, _ = plan.reads
        first_read = np.full(len(values), len(plan.kernels), dtype=np.int64)
        np.minimum.at(first_read, np.asarray(plan.root, dtype=np.int64)[read_value], read_kernel)
        self.first_read_kernel = first_read[np.asarray(plan.root, dtype=np.int64)]
        self.bodies: dict[int, _Body] = {}
        kernel_loops = [int(loop_of_op[k.ops[-1]]) for k in plan.kernels]
        members: dict[int, list[int]] = {}
        for index, loop in enumerate(kernel_loops):
            while loop >= 0:
                members.setdefault(loop, []).append(index)
                loop = nest.loops[loop].enclosing
        repeats = np.asarray([k.repeats for k in plan.kernels], dtype=np.float64)
        for loop, kernels in members.items():
            iterations = float(plan.repeats_in(loop))
            chosen = np.asarray(kernels, dtype=np.int64)
            self.bodies[loop] = _Body(chosen, repeats[chosen] / iterations, iterations,
                                      iterations / plan.loops[loop].trip_count)

    @staticmethod
    def _varying(program, nest: LoopNest) -> np.ndarray:
        """``bool[values]``: made, in its loop's body, from what the loop changes from one iteration to the next
        (a carried tensor the body returns changed; not the scalar counter, not a passed-through stack)."""
        ops, values = program.ops, program.values
        loop_of_value = nest.loop_of_value.tolist()  # a list: looked up per operand below
        varying = [False] * len(values)
        returned: dict[tuple[int, int], tuple[int, ...]] = {}
        for op in ops:
            if op.kind in TERMINATORS and op.parent is not None:
                returned[op.parent] = op.operands
        for op in ops:
            if op.id in nest.loops and len(op.regions) >= 2:
                body = nest.loops[op.id].body_args
                out = returned.get((op.id, 1), ())
                for index, arg in enumerate(body):
                    changed = index < len(out) and out[index] != arg
                    varying[arg] = changed and bool(values[arg].shape)
            elif op.regions:  # a call's (or a branch's) arguments: as its operands, within the same loop
                for args in op.regions:
                    for arg, operand in zip(args, op.operands, strict=False):
                        varying[arg] = varying[operand] and loop_of_value[operand] == loop_of_value[arg]
            if op.results and op.operands:
                # From a varying operand of the same loop's body (one made outside it is invariant here).
                here = loop_of_value[op.results[0]]
                if any(varying[v] and loop_of_value[v] == here for v in op.operands) or (
                        op.id in nest.loops and any(varying[v] for v in op.operands)):
                    for value_id in op.results:
                        varying[value_id] = True
        return np.asarray(varying, dtype=bool).reshape(-1)

    @staticmethod
    def _feeds_carry(program, nest: LoopNest, loop_of_op: np.ndarray, keeps_elements: frozenset[str]) -> np.ndarray:
        """``bool[values]``: in a loop body, every use of the value (through reshapes, converts, calls' returns)
        only stores it into a slot of the loop's carry that the body never reads (``_accumulators``): through a
        ``dynamic_update_slice``, an add, the body's return."""
        ops, values = program.ops, program.values
        users: dict[int, list[int]] = {}
        for op in ops:
            for value_id in op.operands:
                users.setdefault(value_id, []).append(op.id)
        accumulator = LoopOverlap._accumulators(program, nest, users)
        feeds = np.zeros(len(values), dtype=bool)
        # Backwards in program order, a value's users come first (a call's arguments after its body); a call's
        # results come before its return, so the pass repeats (once per level of nested calls) until nothing
        # changes. Only the ops in loops (and the loops) take part.
        in_loop = loop_of_op.tolist()
        looped = [op for op in reversed(ops) if in_loop[op.id] >= 0 or op.id in nest.loops]
        for _ in range(8):
            before = feeds.copy()
            for op in looped:
                for value_id in (*op.results, *(v for args in op.regions for v in args)):
                    found = users.get(value_id, [])
                    feeds[value_id] = bool(found) and all(
                        _stores(ops[u], value_id, ops, values, keeps_elements, feeds, accumulator) for u in found)
            if np.array_equal(before, feeds):
                break
        return feeds

    @staticmethod
    def _accumulators(program, nest: LoopNest, users: dict[int, list[int]]) -> np.ndarray:
        """``bool[values]``: a value the loop body only writes into (a gradient accumulator: its uses are
        ``dynamic_update_slice`` into it, adds to it, the body's return, and calls passing it to such a use),
        never reads: the carry of a ``jax.lax.scan``'s stacked outputs, not its residual stream."""
        ops = program.ops
        accumulator = np.zeros(len(program.values), dtype=bool)

        def only_written(value_id: int, depth: int = 0) -> bool:
            for user_id in users.get(value_id, ()):
                user = ops[user_id]
                positions = [index for index, operand in enumerate(user.operands) if operand == value_id]
                if user.kind == "stablehlo.dynamic_update_slice" and positions == [0]:
                    continue
                if user.kind in ("stablehlo.add", "stablehlo.return", "func.return"):
                    continue
                if user.kind == "func.call" and user.regions and depth < 8 and all(
                        index < len(user.regions[0]) and only_written(user.regions[0][index], depth + 1)
                        for index in positions):
                    continue
                return False
            return True

        for loop in nest.loops.values():
            for arg in loop.body_args:
                accumulator[arg] = bool(program.values[arg].shape) and only_written(arg)
        return accumulator

    def exposed(self, kernel_seconds: np.ndarray, op: np.ndarray, value: np.ndarray, operand: np.ndarray,
                durations: np.ndarray, makespan: Makespan, axes_mask: np.ndarray,
                folded: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """``float64[rows]``: the seconds of one step each loop-body collective leaves exposed.

        Args:
          kernel_seconds: ``float64[kernels]``, one launch of each kernel.
          op, value, operand: ``int64[rows]``, each collective's op, value and operand (``-1``: a reduction of the
            op's result).
          durations: ``float64[rows]``, one run of each.
          makespan: ``toast.cost.schedule.makespan``.
          axes_mask: ``int64[rows]``.
          folded: ``(int64[rows], float64[rows])``, the matmul kernel each can fold into (``-1``: none) and the
            seconds it then leaves exposed per run (``toast.cost.pricing.matmul_folds``): an in-iteration one folds
            where that exposes less than the iteration's communication stream would (``toast.cost.overlap``), its
            exposed part on its matmul.
        """
        exposed = np.zeros(len(op))
        loops = self.loop_of_op[op]
        for loop in np.unique(loops).tolist():
            rows = np.flatnonzero(loops == loop)
            body = self.bodies.get(loop)
            if body is None:  # a loop without kernels: its collectives wait, as before
                exposed[rows] = durations[rows] * self.plan.repeats_in(loop)
                continue
            is_use = operand[rows] >= 0
            row_values = value[rows]
            prefetched = is_use & ~(self.varying[row_values] & (self.loop_of_value[row_values] >= 0))
            deferred = ~is_use & self.feeds_carry[row_values]
            inside = ~(prefetched | deferred)
            item_time = kernel_seconds[body.kernels] * body.per_iteration
            compute = float(item_time.sum())
            if inside.any():
                position = np.searchsorted(body.kernels, self.plan.kernel_of_op[op[rows[inside]]])
                producer = np.asarray(self.plan.program.producer, dtype=np.int64)[row_values[inside]]
                made = np.where(producer >= 0, self.plan.kernel_of_op[np.maximum(producer, 0)], -1)
                ready = np.where(self.loop_of_value[row_values[inside]] == loop,
                                 np.searchsorted(body.kernels, made, side="right") - 1, -1)
                reads = np.searchsorted(body.kernels, self.first_read_kernel[row_values[inside]])
                consumer = np.where(is_use[inside], position, reads)
                consumer = np.minimum(np.maximum(consumer, ready + 1), len(body.kernels))
                streamed = rows[inside]
                if folded is not None:
                    kernel, exposed_if = folded[0][streamed], folded[1][streamed]
                    into = np.minimum(np.searchsorted(body.kernels, kernel), len(body.kernels) - 1)
                    kernel = np.where(body.kernels[into] == kernel, kernel, -1)  # a matmul of this body
                    chosen = folds(kernel, exposed_if, durations[streamed], slack(item_time, ready, consumer))
                    if chosen.any():
                        item_time = item_time.copy()
                        np.add.at(item_time, into[chosen], exposed_if[chosen])
                        ready, consumer, streamed = ready[~chosen], consumer[~chosen], streamed[~chosen]
                span, _ = makespan(item_time, consumer, ready, durations[streamed], axes_mask[streamed])
            else:
                span = compute
            total = float(durations[rows].sum())
            iteration = max(span, total, compute)
            per_iteration = iteration - compute
            # Spread the exposed time over the body's collectives by their share of its communication; each entry
            # adds its first prefetch and its last deferred reduction once.
            share = durations[rows] / total if total > 0 else np.zeros(len(rows))
            once = np.where(prefetched | deferred, durations[rows], 0.0) * body.entries
            exposed[rows] = share * per_iteration * body.iterations + once
        return exposed


def _stores(user, value_id: int, ops, values, keeps_elements: frozenset[str], feeds: np.ndarray,
            accumulator: np.ndarray) -> bool:
    """``user`` only stores ``value_id`` into a loop's carry, a slot the body never reads (see
    ``LoopOverlap._feeds_carry``): a value carried on to the next iteration's compute (the residual stream) is
    needed there at once."""
    if user.kind == "stablehlo.return":
        if user.parent is None or ops[user.parent[0]].kind != WHILE:
            return False
        args = ops[user.parent[0]].regions[user.parent[1]]
        return all(index < len(args) and accumulator[args[index]]
                   for index, operand in enumerate(user.operands) if operand == value_id)
    if user.kind == "func.return":  # a call's return: on to the call's results where it is returned
        if user.parent is None:
            return False
        results = ops[user.parent[0]].results
        return all(index < len(results) and feeds[results[index]]
                   for index, operand in enumerate(user.operands) if operand == value_id)
    if user.kind == "func.call" and user.regions:  # into a call: on to the callee's arguments
        args = user.regions[0]
        return all(index < len(args) and feeds[args[index]]
                   for index, operand in enumerate(user.operands) if operand == value_id)
    if user.kind == "stablehlo.broadcast_in_dim" and user.results and math.prod(
            values[user.results[0]].shape) == math.prod(values[value_id].shape):  # a unit dim added: a reshape
        return all(feeds[r] for r in user.results)
    if user.kind in _STORES or user.kind in keeps_elements:
        return bool(user.results) and all(feeds[r] for r in user.results)
    return False
