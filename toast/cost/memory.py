"""Memory one device holds over a step, on a ``CostPlan`` (pure functions; ``toast.cost.model`` has the model):
buffers over their live ranges, resharded copies from their first use to their last, reductions' results while
they run, kernels' scratch while they run; outputs written into donated arguments' buffers take none of their own.
Positions: 0, the arguments before the first kernel; k + 1, during kernel k; then the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toast.cost.collectives import ALL_REDUCE, COLLECTIVE_PERMUTE, REDUCE_SCATTER, CollectiveTable
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
                group_of_row: np.ndarray | None = None) -> int:
    """The peak of the memory timeline, bytes, with donated arguments' buffers reused by outputs."""
    donated = donated_outputs(plan, value_bytes) if plan.donate else []
    return int(timeline(plan, collectives, value_bytes, donated, group_of_row).max())


def timeline(plan: CostPlan, collectives: CollectiveTable, value_bytes: np.ndarray, donated: Sequence[int] = (),
             group_of_row: np.ndarray | None = None) -> np.ndarray:
    """``int64[kernels + 3]``: bytes live on one device at each position, with the buffers of ``donated``
    outputs (``donated_outputs``) taking none of their own."""
    # A buffer in host memory takes no device memory.
    sizes = value_bytes[plan.kernel_plan.buffers] * plan.memory.on_device
    if donated:
        sizes = sizes.copy()
        sizes[[plan.memory.buffer_index[v] for v in donated]] = 0
    return np.cumsum(live_delta(plan, sizes, collectives, group_of_row, value_bytes=value_bytes)
                     + scratch_delta(plan, value_bytes))


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
    (``reduction_delta``). A halo exchange's rows live while their op runs, and with them (given
    ``value_bytes``) the operand's local shard once more: XLA concatenates the two into a buffer of its own."""
    memory = plan.memory
    positions = len(plan.kernel_plan.kernels) + 3
    # A use's steps (an all-gather per dim, then an all-to-all) leave one copy: its last step's output (the
    # ones before are consumed by the next step at once). Each halo is a buffer of its own.
    op, operand, value = collectives.op, collectives.operand, collectives.value
    halo = collectives.kind == COLLECTIVE_PERMUTE
    last_step = halo.copy()
    last_step[-1:] = True
    last_step[:-1] |= (op[1:] != op[:-1]) | (operand[1:] != operand[:-1]) | (value[1:] != value[:-1]) | halo[1:]
    uses = (collectives.operand >= 0) & last_step
    used_by, copy_bytes = collectives.op[uses], collectives.bytes_out[uses]
    last_user = np.maximum(collectives.last_op[uses], used_by)
    if value_bytes is not None and halo.any():
        # The widened operand: once per op and operand exchanging halos (its low and high rows are adjacent).
        first_halo = halo.copy()
        first_halo[1:] &= ~(halo[:-1] & (op[1:] == op[:-1]) & (operand[1:] == operand[:-1]))
        used_by = np.concatenate((used_by, op[first_halo]))
        last_user = np.concatenate((last_user, op[first_halo]))
        copy_bytes = np.concatenate((copy_bytes, value_bytes[value[first_halo]]))
    # Sums of whole bytes (below 2**53) in float64: exact, as int64 sums would be.
    delta = (np.bincount(memory.buffer_born, weights=sizes, minlength=positions)
             - np.bincount(memory.buffer_dies, weights=sizes, minlength=positions)
             + np.bincount(memory.kernel_position_of_op[used_by] + 1, weights=copy_bytes, minlength=positions)
             - np.bincount(memory.kernel_position_of_op[last_user] + 2, weights=copy_bytes, minlength=positions)
             + reduction_delta(plan, collectives, positions, group_of_row))
    return delta.astype(np.int64)


def reduction_delta(plan: CostPlan, collectives: CollectiveTable, positions: int,
                    group_of_row: np.ndarray | None = None) -> np.ndarray:
    """``float64[positions]``: bytes allocated (+) and freed (-) by the reductions of partial results
    (all-reduce, reduce-scatter). XLA writes a reduction's result into a buffer of its own, so while it runs
    its input and its result are both live (a value keeps one buffer here, which the result then takes over);
    reductions a combiner joins (``combine_groups``) run as one, after their last member's producer, with
    all their results live at once. Each is counted during the kernel that makes its (last) input.
    ``group_of_row``: each streamed row's combining group, as the step time found them (else found here)."""
    schedule = plan.schedule
    rows = plan.collectives.moves[collectives.axes_mask] & (collectives.operand < 0) & (
        (collectives.kind == ALL_REDUCE) | (collectives.kind == REDUCE_SCATTER))
    if not rows.any():
        return np.zeros(positions)
    op, result_bytes = collectives.op[rows], collectives.bytes_out[rows]
    position = plan.memory.kernel_position_of_op[op] + 1
    streamed = ~schedule.op_in_loop[op]  # a loop body's reductions run there, one at a time
    if streamed.sum() > 1:
        group = group_of_row[np.flatnonzero(rows)[streamed]] if group_of_row is not None else combine_groups(
            plan.hardware.combine_threshold, collectives.kind[rows][streamed], collectives.axes_mask[rows][streamed],
            collectives.bytes_in[rows][streamed].astype(np.float64), schedule.item_of_op[op[streamed]],
            schedule.first_reader_of_value[collectives.value[rows][streamed]])
        if group is not None:
            last = np.zeros(int(group.max()) + 1, dtype=np.int64)
            np.maximum.at(last, group, position[streamed])
            position[streamed] = last[group]
    return (np.bincount(position, weights=result_bytes, minlength=positions)
            - np.bincount(position + 1, weights=result_bytes, minlength=positions))


def scratch_delta(plan: CostPlan, value_bytes: np.ndarray) -> np.ndarray:
    """Bytes allocated (+) and freed (-) at each position, as ``live_delta``, by the kernels' scratch
    buffers (live during their kernel only)."""
    positions = len(plan.kernel_plan.kernels) + 3
    kernel, value, scale = plan.kernel_plan.scratch
    if not len(kernel):
        return np.zeros(positions, dtype=np.int64)
    sizes = (value_bytes[value] * scale).astype(np.int64)
    return (np.bincount(kernel + 1, weights=sizes, minlength=positions)
            - np.bincount(kernel + 2, weights=sizes, minlength=positions)).astype(np.int64)
