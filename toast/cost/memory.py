"""Memory one device holds over a step, on a ``CostPlan`` (pure functions; ``toast.cost.model`` has the model):
buffers over their live ranges, resharded copies from their first use to their last, reductions' results while
they run, kernels' scratch while they run; outputs written into donated arguments' buffers take none of their own.
Positions: 0, the arguments before the first kernel; k + 1, during kernel k; then the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toast.cost.collectives import ALL_REDUCE, COLLECTIVE_PERMUTE, KINDS, REDUCE_SCATTER, CollectiveTable
from toast.cost.plan import CostPlan
from toast.cost.schedule import combine_groups
from toast.sharding.state import ShardingState


@dataclass(frozen=True, slots=True)
class LiveBuffer:
    """One buffer live at the peak: the value, its bytes per device, where it is made."""

    value: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    loc: str


def memory_timeline(plan: CostPlan, state: ShardingState) -> np.ndarray:
    """``int64[kernels + 3]``: bytes live on one device at each position (0: the arguments, before the
    first kernel; k + 1: during kernel k; then the outputs), before donated buffers are reused."""
    value_bytes = plan.communication.value_bytes(state)
    return timeline(plan, plan.communication.table(state, value_bytes), value_bytes)


def live_at_peak(plan: CostPlan, state: ShardingState, *, top: int = 5) -> list[LiveBuffer]:
    """The ``top`` largest buffers live when the peak is reached (largest first)."""
    memory, communication, buffers = plan.memory, plan.communication, plan.kernel_plan.buffers
    value_bytes = communication.value_bytes(state)
    sizes = value_bytes[buffers] * memory.on_device
    delta = live_delta(plan, sizes, communication.table(state, value_bytes),
                       value_bytes=value_bytes) + scratch_delta(plan, value_bytes)
    at = int(np.argmax(np.cumsum(delta)))
    born, dies = memory.buffer_born, memory.buffer_dies
    live = np.flatnonzero((born <= at) & (dies > at) & memory.on_device)
    order = live[np.argsort(-sizes[live], kind="stable")][:top]
    program = plan.model.analysis.program
    found = []
    for index in order.tolist():
        value = program.values[int(buffers[index])]
        found.append(LiveBuffer(value.id, value.name, value.shape, value.dtype, int(sizes[index]), value.loc))
    return found


def peak_memory(plan: CostPlan, collectives: CollectiveTable, value_bytes: np.ndarray,
                group_of_row: np.ndarray | None = None, *, buffers: Events | None = None) -> int:
    """The peak of the memory timeline, bytes, with donated arguments' buffers reused by outputs. ``buffers``: the
    buffers' allocations and frees as ``_delta`` takes them, where the caller has them (``toast.cost.pricing.
    KernelMoves.buffer_cells``; else, and with donated arguments, found from ``value_bytes``)."""
    donated = donated_outputs(plan, value_bytes) if plan.donate else []
    if donated:
        buffers = None
    return int(timeline(plan, collectives, value_bytes, donated, group_of_row, buffers=buffers).max())


def timeline(plan: CostPlan, collectives: CollectiveTable, value_bytes: np.ndarray, donated: Sequence[int] = (),
             group_of_row: np.ndarray | None = None, *, buffers: Events | None = None) -> np.ndarray:
    """``int64[kernels + 3]``: bytes live on one device at each position, with the buffers of ``donated``
    outputs (``donated_outputs``) taking none of their own (``buffers``: as ``peak_memory`` takes them)."""
    if buffers is None:
        buffers = _buffer_events(plan, _buffer_sizes(plan, value_bytes, donated))
    positions, weights = _live_events(plan, collectives, group_of_row, value_bytes)
    scratch_positions, scratch_weights = _scratch_events(plan, value_bytes)
    return np.cumsum(_delta(plan, buffers[0] + positions + scratch_positions, buffers[1] + weights + scratch_weights))


def _buffer_sizes(plan: CostPlan, value_bytes: np.ndarray, donated: Sequence[int] = ()) -> np.ndarray:
    """``int64[buffers]``: each buffer's bytes on the device (``donated`` outputs': 0)."""
    # A buffer in host memory takes no device memory.
    sizes = value_bytes[plan.kernel_plan.buffers] * plan.memory.on_device
    if donated:
        sizes[[plan.memory.buffer_index[v] for v in donated]] = 0
    return sizes


def donated_outputs(plan: CostPlan, value_bytes: np.ndarray) -> list[int]:
    """The outputs (buffer roots) written into a donated argument's buffer, which so take no memory of their
    own: each donated argument serves at most one output of the same size (XLA's input-output aliasing)."""
    program, root = plan.model.analysis.program, plan.kernel_plan.root
    free: dict[int, int] = {}
    for index in plan.donate:
        size = int(value_bytes[program.arguments[index]])
        free[size] = free.get(size, 0) + 1
    donated = []
    arguments = {int(root[v]) for v in program.arguments}
    for value_id in dict.fromkeys(int(root[v]) for v in program.results):
        if value_id in arguments or value_id not in plan.memory.buffer_index:
            continue
        size = int(value_bytes[value_id])
        if free.get(size, 0) > 0:
            free[size] -= 1
            donated.append(value_id)
    return donated


def live_delta(plan: CostPlan, sizes: np.ndarray, collectives: CollectiveTable,
               group_of_row: np.ndarray | None = None, *, value_bytes: np.ndarray | None = None) -> np.ndarray:
    """Bytes allocated (+) and freed (-) at each position (kernel index + 1; 0 before the first): every
    buffer over its live range, every value resharded for its uses (gathered parameters, Figure 5b's
    k) as a second copy from its first such use to its last, and the results of reductions while they run
    (``reduction_events``). A halo exchange's rows live while their op runs, and with them (given
    ``value_bytes``) the operand's local shard once more: XLA concatenates the two into a buffer of its own."""
    buffer_positions, buffer_weights = _buffer_events(plan, sizes)
    positions, weights = _live_events(plan, collectives, group_of_row, value_bytes)
    return _delta(plan, buffer_positions + positions, buffer_weights + weights)


# Events: the positions bytes are allocated at (+) or freed at (-) and those bytes, as lists of arrays that
# ``_delta`` adds up in one ``np.bincount`` (a state's memory takes a few numpy calls, not one per kind of buffer).
Events = tuple[list[np.ndarray], list[np.ndarray]]


def _delta(plan: CostPlan, positions: list[np.ndarray], weights: list[np.ndarray]) -> np.ndarray:
    """``int64[kernels + 3]``: the bytes of the events at each position. Sums of whole bytes (below 2**53) in
    float64: exact, in any order, as int64 sums would be."""
    count = len(plan.kernel_plan.kernels) + 3
    if not positions:
        return np.zeros(count, dtype=np.int64)
    # The weights joined as float64 at once, not joined as int64 and copied to float64 by bincount.
    return np.bincount(np.concatenate(positions), weights=np.concatenate(weights, dtype=np.float64),
                       minlength=count).astype(np.int64)


def _buffer_events(plan: CostPlan, sizes: np.ndarray) -> Events:
    """The buffers' events: each one's ``sizes`` bytes from its allocation to its free."""
    return [plan.memory.buffer_born, plan.memory.buffer_dies], [sizes, -sizes]


def _live_events(plan: CostPlan, collectives: CollectiveTable, group_of_row: np.ndarray | None,
                 value_bytes: np.ndarray | None) -> Events:
    """``live_delta``'s events but the buffers'."""
    memory = plan.memory
    # A use's steps (an all-gather per dim, then an all-to-all) leave one copy: its last step's output (the
    # ones before are consumed by the next step at once): where the next row is another op's or operand's (an op's
    # operand is one value; a partial result's operand, -1, no use's). Each halo is a buffer of its own.
    op, operand, value = collectives.op, collectives.operand, collectives.value
    last_step = np.empty(len(op), dtype=bool)
    last_step[-1:] = True
    np.not_equal(op[1:], op[:-1], out=last_step[:-1])
    last_step[:-1] |= operand[1:] != operand[:-1]
    halo = collectives.kind == COLLECTIVE_PERMUTE
    halos = bool(halo.any())
    if halos:
        last_step |= halo
        last_step[:-1] |= halo[1:]
    uses = ((operand >= 0) & last_step).nonzero()[0]
    used_by, copy_bytes = op.take(uses), collectives.bytes_out.take(uses)
    last_user = np.maximum(collectives.last_op.take(uses), used_by)
    if value_bytes is not None and halos:
        # The widened operand: once per op and operand exchanging halos (its low and high rows are adjacent).
        first_halo = halo.copy()
        first_halo[1:] &= ~(halo[:-1] & (op[1:] == op[:-1]) & (operand[1:] == operand[:-1]))
        used_by = np.concatenate((used_by, op[first_halo]))
        last_user = np.concatenate((last_user, op[first_halo]))
        copy_bytes = np.concatenate((copy_bytes, value_bytes[value[first_halo]]))
    reduction_positions, reduction_weights = reduction_events(plan, collectives, group_of_row)
    return ([memory.kernel_position_of_op.take(used_by) + 1, memory.kernel_position_of_op.take(last_user) + 2,
             *reduction_positions], [copy_bytes, -copy_bytes, *reduction_weights])


def reduction_events(plan: CostPlan, collectives: CollectiveTable, group_of_row: np.ndarray | None = None) -> Events:
    """The bytes allocated (+) and freed (-) by the reductions of partial results (all-reduce, reduce-scatter), as
    ``_delta`` takes them. XLA writes a reduction's result into a buffer of its own, so while it runs
    its input and its result are both live (a value keeps one buffer here, which the result then takes over);
    reductions a combiner joins (``combine_groups``) run as one, after their last member's producer, with
    all their results live at once. Each is counted during the kernel that makes its (last) input.
    ``group_of_row``: each streamed row's combining group, as the step time found them (else found here)."""
    schedule = plan.schedule
    kind = collectives.kind
    rows = (_REDUCTION.take(kind) & (collectives.operand < 0)
            & plan.collectives.moves.take(collectives.axes_mask)).nonzero()[0]
    if not len(rows):
        return [], []
    op, result_bytes = collectives.op.take(rows), collectives.bytes_out.take(rows)
    position = plan.memory.kernel_position_of_op.take(op) + 1
    if group_of_row is not None:
        # The groups the step time found: -1 (none) on a loop body's rows, which run there, one at a time.
        group = group_of_row.take(rows)
        if len(group) > 1 and group.min() >= 0:  # every row in a group (no loop body's)
            last = np.zeros(int(group.max()) + 1, dtype=np.int64)
            np.maximum.at(last, group, position)
            position = last.take(group)
            return [position, position + 1], [result_bytes, -result_bytes]
        grouped = (group >= 0).nonzero()[0]
        if len(grouped) > 1:
            group = group.take(grouped)
            last = np.zeros(int(group.max()) + 1, dtype=np.int64)
            np.maximum.at(last, group, position.take(grouped))
            position[grouped] = last.take(group)
        return [position, position + 1], [result_bytes, -result_bytes]
    streamed = ~schedule.op_in_loop.take(op)  # a loop body's reductions run there, one at a time
    if streamed.sum() > 1:
        found = combine_groups(
            plan.hardware.combine_threshold, kind[rows][streamed], collectives.axes_mask[rows][streamed],
            collectives.bytes_in[rows][streamed].astype(np.float64), schedule.item_of_op[op[streamed]],
            schedule.first_reader_of_value[collectives.value[rows][streamed]])
        if found is not None:
            last = np.zeros(int(found.max()) + 1, dtype=np.int64)
            np.maximum.at(last, found, position[streamed])
            position[streamed] = last[found]
    return [position, position + 1], [result_bytes, -result_bytes]


# The kinds reducing partial results.
_REDUCTION = np.isin(np.arange(len(KINDS)), (ALL_REDUCE, REDUCE_SCATTER))


def scratch_delta(plan: CostPlan, value_bytes: np.ndarray) -> np.ndarray:
    """Bytes allocated (+) and freed (-) at each position, as ``live_delta``, by the kernels' scratch
    buffers (live during their kernel only)."""
    return _delta(plan, *_scratch_events(plan, value_bytes))


def _scratch_events(plan: CostPlan, value_bytes: np.ndarray) -> Events:
    """``scratch_delta``'s events."""
    kernel, value, scale = plan.kernel_plan.scratch
    if not len(kernel):
        return [], []
    sizes = (value_bytes[value] * scale).astype(np.int64)
    return [kernel + 1, kernel + 2], [sizes, -sizes]
