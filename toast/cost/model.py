"""Analytical cost of a sharding state (TOAST section 4.5): step time, peak memory, C(s).

The model simulates what one device runs (every device of an SPMD program runs the same kernels on its
shard):

- **Kernels.** ``toast.cost.kernels.KernelPlan`` groups the program's ops into the kernels XLA launches
  (loop and input fusion, library calls). With local shapes from the state, each kernel costs
  ``max(FLOPs / (peak · matmul_efficiency), bytes / (HBM bandwidth · hbm_efficiency),
  atomic updates / scatter-add rate) + overhead``: FLOPs only for matmuls and convolutions (at the peak of
  their operands' element type; f32 at the profile's ``f32_matmul`` rate), bytes at the kernel's boundary,
  the overhead ``matmul_overhead`` for library calls and ``kernel_overhead`` for the others. Loop bodies run
  once per iteration.
- **Streams.** Kernels run one at a time, in program order, on the compute stream. Collectives
  (``toast.cost.collectives``) run on a communication stream: each starts when its operand is ready and the
  stream is free; the kernel that needs its result waits for its end (XLA's latency-hiding scheduler
  overlaps them so). ``overlap=False`` runs them on the compute stream instead. Collectives inside a loop
  body run there, overlapped as XLA's collective pipeliner overlaps them (``toast.cost.loops``: a layer's weight
  gather prefetched under the previous layer, its gradient's reduce-scatter finished under the next). With the
  profile's ``collective_matmul`` (TPUs), an all-gather feeding a matmul or a reduction of its partial result that
  the stream would leave exposed is folded into that matmul instead (``toast.cost.overlap``: XLA's windowed
  einsum), its exposed part on the compute stream. The step
  time is the makespan, plus ``step_overhead`` (launching the program): never less than the compute stream's
  busy time.
- **Collective times.** Alpha-beta ring times over the interconnect level the mesh axes span
  (``../shared/reference/hardware.md`` section 3.1): all-gather and reduce-scatter
  ``(n-1)·alpha + (n-1)/n · S / B`` with S the full bytes; all-reduce twice that; all-to-all
  ``(n-1)·alpha + (n-1)/n · S_local / B``.
- **Peak memory.** Only buffers exist: arguments for the whole step, results from the kernel that makes them
  to the end (XLA gives a result the allocation of a temporary that died before it), every other kernel output
  from its kernel to its last reader, loop-carried values once; a value resharded for its uses is a second
  copy from its collective to its last such use. With donated arguments an output is written into an
  argument's buffer of the same size and takes none of its own (``jax.jit(..., donate_argnums=...)``). A buffer in
  host memory (``KernelPlan.host_value``: offloaded activations, a scan's stack of them) takes none.
- **Host transfers.** A copy between device and host memory (``KernelPlan.transfers``) moves its bytes at the
  profile's ``host_bandwidth`` x ``host_efficiency`` on a host-link stream of its own per direction: an offload
  starts when its value is made and only the step's end waits for it; a fetch starts where the program reaches it
  and must land before the kernel reading it (``toast.cost.schedule.host_transfers``).

The relative cost is ``C(s) = RT(s) + MP(s)`` with ``RT = step time / initial step time`` and
``MP = penalty · (peak − device memory) / initial peak`` when the peak exceeds the device memory, else 0.

**Repeated layers.** With ``CostPlan.reuse`` (the default), a state built on a partition (the search's, whose actions
are mirrored across layers) has its collectives found once per class of alike ops and values
(``toast.cost.class_table``), its FLOPs once per class of alike matmuls (``toast.cost.pricing.FlopClasses``), its
kernels' times once per class of alike kernels (``toast.cost.pricing.KernelClasses``) and its buffers' bytes per
position and byte class (``KernelMoves.buffer_cells``); the combiners' groups are found scanning only the collectives
that may join one (``combine_groups_fast``), and the makespan jumps over a run of repeated layers once the streams'
state repeats (``toast.cost.repeats``): the work per state follows the program's distinct layers and its collectives,
not its depth. What ``reuse=False`` (every op priced, every collective scanned) gives is equal: the collectives row for
row, the kernels' times, the groups, the peak and the counts exactly; the step and compute times, the breakdown and
the per-label seconds to within 1e-12 relative (a jump adds a repeat's effect in closed form, the sums in another
order).

Layout: ``toast.cost.plan.cost_plan`` builds what a program, mesh and hardware fix (a frozen ``CostPlan``, once);
the pure functions of ``toast.cost.pricing`` (kernels, collectives), ``toast.cost.schedule`` (streams, combining,
host link) and ``toast.cost.memory`` (timeline, peak) price a state on it; ``absolute_cost`` puts them together and
``CostModel`` holds a plan and evaluates states against the unsharded program's cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from toast.cost import class_table
from toast.cost.class_table import ClassTable
from toast.cost.collectives import ALL_GATHER, Collective, CollectiveTable, CommunicationModel
from toast.cost.hardware import Hardware
from toast.cost.kernels import KernelPlan
from toast.cost.loops import LoopOverlap
from toast.cost.memory import LiveBuffer, live_at_peak, memory_timeline, peak_memory
from toast.cost.overlap import CollectiveMatmul, folds, slack
from toast.cost.plan import CostPlan, cost_plan
from toast.cost.pricing import (
    KernelMoves,
    collective_durations,
    collective_time,
    kernel_moves,
    kernel_seconds,
    kernel_times,
    kernel_work,
    matmul_folds,
)
from toast.cost.schedule import (
    by_labels,
    combine,
    combine_groups,
    combine_groups_fast,
    host_transfers,
    makespan,
    sequential_sum,
    stream,
)
from toast.sharding.state import NamePartition, ShardingModel, ShardingState

__all__ = ["BREAKDOWN_KEYS", "AbsoluteCost", "Cost", "CostModel", "LiveBuffer", "PricedRows", "absolute_cost",
           "priced_rows", "scheduled_cost", "step_time_bound"]

BREAKDOWN_KEYS = ("compute_bound_s", "memory_bound_s", "launch_overhead_s", "exposed_communication_s",
                  "hidden_communication_s", "exposed_host_transfer_s", "hidden_host_transfer_s")


@dataclass(frozen=True, slots=True)
class Cost:
    """The estimated cost of one state on one device.

    Attributes:
      step_time_s: simulated step time (the makespan of both streams), seconds.
      compute_s: the compute stream's busy time (kernels, overheads, exposed loop collectives), seconds.
      breakdown: the step time split (seconds): ``compute_bound_s`` (kernels limited by FLOPs or atomics),
        ``memory_bound_s`` (kernels limited by HBM bytes), ``launch_overhead_s`` (per-kernel and per-step
        overheads), ``exposed_communication_s`` (collective time the compute stream waits for); and
        ``hidden_communication_s``, collective time overlapped with compute (not part of the step time);
        ``exposed_host_transfer_s`` and ``hidden_host_transfer_s``, the same split of the copies between device and
        host memory (``CostModel._host_transfers``).
      communication_s: collective time per mesh axis set (``"model"``, ``"batch+model"``), seconds, after
        combining.
      peak_bytes: peak memory per device, bytes.
      kernels: kernels launched per step (loop bodies once per iteration).
      relative: ``C(s) = RT(s) + MP(s)`` against the unsharded state.
      collectives: the collectives counted (as the partitioner emits them, before combining).
      communication_by_level_s: collective time per interconnect level crossed (``"nvlink"``, ``"infiniband"``,
        ``"nvlink+infiniband"`` for a group spanning both), seconds.
      exposed_communication_by_axes_s: the part of ``communication_s`` the step waits for, per mesh axis set
        (the rest is hidden behind compute), seconds.
      collectives_launched: collectives launched per step after combining (loop bodies once).
    """

    step_time_s: float
    compute_s: float
    breakdown: dict[str, float]
    communication_s: dict[str, float]
    peak_bytes: int
    kernels: int
    relative: float
    collectives: tuple[Collective, ...]
    communication_by_level_s: dict[str, float] = field(default_factory=dict)
    exposed_communication_by_axes_s: dict[str, float] = field(default_factory=dict)
    collectives_launched: int = 0


class AbsoluteCost(NamedTuple):
    """A state's cost before it is set against the unsharded program's (``CostModel.evaluate`` makes a
    ``Cost`` of it; ``CostModel.initial`` is the unsharded program's)."""

    step_time_s: float
    compute_s: float
    breakdown: dict[str, float]
    communication_s: dict[str, float]
    peak_bytes: int
    collectives: list[Collective]
    by_level: dict[str, float]
    exposed_by_axes: dict[str, float]
    launched: int



def absolute_cost(plan: CostPlan, state: ShardingState, *, collectives: bool = True, moves: KernelMoves | None = None,
                  classes: ClassTable | None = None) -> AbsoluteCost:
    """The cost of ``state`` on ``plan`` (the module docstring has the model, and what ``plan.reuse`` changes:
    nothing beyond rounding). ``collectives=False`` leaves ``AbsoluteCost.collectives`` empty; ``moves``:
    ``toast.cost.pricing.kernel_moves`` of ``state.partition`` (made here when not given); ``classes``: the
    ``ClassTable`` of ``state.partition``, which finds the collectives with ``plan.reuse`` (else every name is
    read). The same as ``scheduled_cost`` of ``priced_rows``: the two halves, for a caller that may not need the
    second (``step_time_bound``)."""
    return scheduled_cost(plan, priced_rows(plan, state, moves=moves, classes=classes), collectives=collectives)


class PricedRows(NamedTuple):
    """A state priced up to its schedule (``priced_rows``): its kernels' seconds, its collectives (those in loop
    bodies and those folded into matmuls already on the compute stream's items), the combiners' groups of the
    others, and its peak. ``scheduled_cost`` runs the streams on them; ``step_time_bound`` bounds the step time
    from below without running them."""

    state: ShardingState
    seconds: np.ndarray  # float64[kernels]: one launch of each kernel, seconds
    item_time: np.ndarray  # float64[items]: each top-level item's seconds on the compute stream
    busy_compute: float  # seconds of the kernels bound by FLOPs or atomics, over the step
    busy_memory: float  # seconds of the kernels bound by bytes, over the step
    overheads: float  # launch overheads over the step, seconds
    table: CollectiveTable  # the state's collectives as the partitioner emits them
    value_bytes: np.ndarray  # int64[values]: each value's bytes on one device (``_UNREAD``: nothing reads them)
    axes_mask: np.ndarray  # int64[moving rows]: the mesh axes of each collective that moves bytes
    in_loop: np.ndarray  # bool[moving rows]: it runs in a loop body
    loop_masks: np.ndarray  # int64[loop rows]: the loop bodies' collectives' axes
    repeated: np.ndarray  # float64[loop rows]: their seconds over the step
    loop_exposed: np.ndarray  # float64[loop rows]: the part of those the compute stream waits for
    in_loops: float  # the loop bodies' exposed seconds (folded ones' added by ``scheduled_cost``), one micro-batch
    loop_hidden: float  # the loop bodies' hidden seconds, every micro-batch
    folded: np.ndarray | None  # bool[moving rows]: folded into a matmul (None: none is)
    folded_seconds: np.ndarray  # float64[folded]: their seconds
    folded_exposed: np.ndarray  # float64[folded]: the part of those exposed
    values: np.ndarray  # int64[streamed]: the value each collective on the communication stream moves
    is_use: np.ndarray  # bool[streamed]: a use's resharding (else the reduction of a partial result)
    kind: np.ndarray  # int64[streamed]: its kind
    masks: np.ndarray  # int64[streamed]: its mesh axes
    nbytes: np.ndarray  # float64[streamed]: its bytes
    ready: np.ndarray  # int64[streamed]: the item after which its operand is ready
    consumer: np.ndarray  # int64[streamed]: the item that needs its result
    group: np.ndarray | None  # int64[streamed]: its combiners' group (None: no two combine)
    peak: int  # peak memory per device, bytes


def priced_rows(plan: CostPlan, state: ShardingState, *, moves: KernelMoves | None = None,
                classes: ClassTable | None = None) -> PricedRows:
    """``absolute_cost``'s work before the streams are scheduled (its arguments as there): the kernels, the
    collectives and their combiners' groups, the peak memory."""
    pricing, schedule, hardware, microbatches = plan.pricing, plan.schedule, plan.hardware, plan.microbatches
    communication_model = plan.communication
    # Collectives found per class of alike ops and values where the state is built on the classes' partition;
    # kernels priced, and buffers sized, per class of alike ones where it is built on the moves' (``moves`` is made
    # for the state's partition).
    on_classes = plan.reuse and classes is not None and state.partition is classes.partition
    per_class = plan.reuse and moves is not None and state.partition is not None
    if state.partition is None:
        value_bytes, class_bytes = communication_model.value_and_class_bytes(state)
    else:
        class_bytes = communication_model.class_bytes(state)
        # Every value's bytes (a take per value of the program) only where something reads them beyond the classes'.
        value_bytes = class_bytes.take(communication_model.byte_classes(state.partition).value_class) \
            if not (on_classes and per_class) or _reads_value_bytes(plan) else _UNREAD
    # With micro-batches, every kernel but the optimizer's runs once per micro-batch.
    repeats = pricing.repeats if microbatches == 1 else pricing.repeats * schedule.kernel_runs
    if per_class and moves is not None and class_bytes is not None:
        seconds, item_time, busy_compute, busy_memory = kernel_seconds(plan, state, class_bytes, moves)
    else:
        seconds, compute_time, memory_time = kernel_times(plan, state, value_bytes, class_bytes=class_bytes,
                                                          moves=moves)
        compute_bound = compute_time >= memory_time
        busy_compute = float((np.where(compute_bound, compute_time, 0.0) * repeats).sum())
        busy_memory = float((np.where(compute_bound, 0.0, memory_time) * repeats).sum())
        item_time = np.bincount(schedule.top_of_kernel, weights=seconds * pricing.repeats,
                                minlength=schedule.item_count)
    overheads = float((pricing.overhead * repeats).sum()) + hardware.step_overhead
    table = classes.table(state, class_bytes=class_bytes) if on_classes and classes is not None \
        else communication_model.table(state, value_bytes)
    # Collectives over a single device move nothing (an axis of size 1): XLA emits none.
    moving = plan.collectives.moves.take(table.axes_mask)
    kind, axes_mask, value, op, operand, bytes_in, bytes_out = _select(
        moving, table.kind, table.axes_mask, table.value, table.op, table.operand, table.bytes_in, table.bytes_out)
    nbytes = np.where(kind == ALL_GATHER, bytes_out, bytes_in).astype(np.float64)
    # Collectives inside a loop body run there (their exposed part on the loop's item); the others go on the
    # communication stream, combined as XLA's combiners combine them.
    in_loop = schedule.op_in_loop.take(op)
    loop_masks, repeated, loop_exposed = np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    in_loops = loop_hidden = 0.0
    if np.count_nonzero(in_loop):
        loop_masks = axes_mask[in_loop]
        loop_durations = collective_durations(plan.collectives, kind[in_loop], loop_masks, nbytes[in_loop])
        repeated = loop_durations * schedule.op_repeats[op[in_loop]]
        # What the loop bodies' collectives leave exposed (toast.cost.loops: prefetched, deferred, overlapped in
        # the iteration); without overlap, all of it.
        loop_exposed = plan.loop_overlap.exposed(
            seconds, op[in_loop], value[in_loop], operand[in_loop], loop_durations, makespan, loop_masks,
            folded=matmul_folds(plan, seconds, kind[in_loop], loop_masks, op[in_loop], operand[in_loop],
                                loop_durations)) if plan.overlap else repeated
        np.add.at(item_time, schedule.item_of_op[op[in_loop]], loop_exposed)  # in order, as a loop adds
        in_loops = sequential_sum(loop_exposed)
        loop_hidden = max(0.0, sequential_sum(repeated) - in_loops) * microbatches
    streamed = ~in_loop
    values, ops, operands, streamed_kind, streamed_masks, streamed_bytes = _select(
        streamed, value, op, operand, kind, axes_mask, nbytes)
    is_use = operands >= 0
    # A use: ready when the value is, needed by the op using it. A partial result: ready after its producer,
    # needed by its first reader.
    ready = np.where(is_use, schedule.ready_item.take(values), schedule.item_of_op.take(ops))
    consumer = np.where(is_use, schedule.consumer_item_of_op.take(ops), schedule.first_reader_of_value.take(values))
    # Collectives folded into the matmul they feed or follow (collective matmul, toast.cost.overlap): the
    # matmul's item takes their exposed part, and they leave the stream.
    folded: np.ndarray | None = None
    folded_seconds = folded_exposed = np.zeros(0)
    if plan.collective_matmul is not None and plan.overlap:  # else matmul_folds finds none
        top_durations = collective_durations(plan.collectives, streamed_kind, streamed_masks, streamed_bytes)
        found = matmul_folds(plan, seconds, streamed_kind, streamed_masks, ops, operands, top_durations)
        if found is not None:
            kernel, exposed_if = found
            if microbatches > 1:  # a gradient's reduction runs in the last micro-batch only: on the stream
                kernel = np.where(schedule.gradient_value[values] & ~is_use, -1, kernel)
            chosen = folds(kernel, exposed_if, top_durations, slack(item_time, ready, consumer))
            if chosen.any():
                np.add.at(item_time, schedule.top_of_kernel[kernel[chosen]], exposed_if[chosen])
                folded = np.zeros(len(kind), dtype=bool)
                folded[np.flatnonzero(streamed)[chosen]] = True
                folded_seconds, folded_exposed = top_durations[chosen], exposed_if[chosen]
                streamed &= ~folded
                values, ops, is_use, ready, consumer, streamed_kind, streamed_masks, streamed_bytes = (
                    column[~chosen] for column in (values, ops, is_use, ready, consumer, streamed_kind,
                                                   streamed_masks, streamed_bytes))
    threshold = hardware.combine_threshold
    groups = combine_groups_fast if plan.reuse else combine_groups  # the same groups
    group = groups(threshold, streamed_kind, streamed_masks, streamed_bytes, ready, consumer)
    # The same groups for the memory of the reductions combined (each row its own group where none combine; -1
    # on the loop bodies' rows).
    streamed_group = group if group is not None else np.arange(len(streamed_kind))
    if len(streamed_kind) == len(table):  # every row moves, on the stream
        group_of_row = streamed_group
    else:
        group_of_row = np.full(len(table), -1, dtype=np.int64)
        group_of_row[np.flatnonzero(moving)[streamed]] = streamed_group
        if folded is not None:  # each its own group
            group_of_row[np.flatnonzero(moving)[folded]] = np.arange(folded.sum()) + int(group_of_row.max()) + 1
    buffers = None
    if per_class and moves is not None and class_bytes is not None:  # the buffers' bytes per cell of alike ones
        position, byte_class, count = moves.buffer_cells
        buffers = ([position], [class_bytes.take(byte_class) * count])
    peak = peak_memory(plan, table, value_bytes, group_of_row, buffers=buffers)
    return PricedRows(state, seconds, item_time, busy_compute, busy_memory, overheads, table, value_bytes, axes_mask,
                      in_loop, loop_masks, repeated, loop_exposed, in_loops, loop_hidden, folded, folded_seconds,
                      folded_exposed, values, is_use, streamed_kind, streamed_masks, streamed_bytes, ready, consumer,
                      group, peak)


def step_time_bound(plan: CostPlan, rows: PricedRows) -> float:
    """A lower bound of the step time ``scheduled_cost`` gives ``rows``, seconds, without scheduling the streams:
    each stream's makespan is at least the compute stream's busy time and at least the communication stream's
    (its combined collectives back to back); the host link's copies add nothing here. Within rounding (1e-12
    relative, ``absolute_cost``): a search compares it to scores with a margin."""
    microbatches, hardware = plan.microbatches, plan.hardware
    kind, masks, nbytes, _, _ = combine(rows.kind, rows.masks, rows.nbytes, rows.ready, rows.consumer, rows.group)
    communication = sequential_sum(collective_durations(plan.collectives, kind, masks, nbytes))
    bound = hardware.step_overhead + max(float(rows.item_time.sum()), communication)
    if microbatches > 1:  # the micro-batches before the last: at least their compute
        bound += (microbatches - 1) * float(np.where(plan.schedule.update_items, 0.0, rows.item_time).sum())
    return bound


def scheduled_cost(plan: CostPlan, rows: PricedRows, *, collectives: bool = True) -> AbsoluteCost:
    """``absolute_cost``'s second half: the streams scheduled on ``rows`` (``priced_rows``), the step time and the
    rest of the cost."""
    schedule, hardware, microbatches = plan.schedule, plan.hardware, plan.microbatches
    (_, seconds, item_time, busy_compute, busy_memory, overheads, table, value_bytes, axes_mask, in_loop, loop_masks,
     repeated, loop_exposed, in_loops, loop_hidden, folded, folded_seconds, folded_exposed, values, is_use,
     streamed_kind, streamed_masks, streamed_bytes, ready, consumer, group, peak) = rows
    streams = [stream(plan, item_time, streamed_kind, streamed_masks, streamed_bytes, ready, consumer, group)]
    runs = [1.0]
    if microbatches > 1:
        groups, threshold = combine_groups_fast if plan.reuse else combine_groups, hardware.combine_threshold
        # The micro-batches before the last: no optimizer, no gradient reduction (gradients accumulate).
        accumulating = ~(schedule.gradient_value[values] & ~is_use)
        mb_time = np.where(schedule.update_items, 0.0, item_time)
        mb_rows = (streamed_kind[accumulating], streamed_masks[accumulating], streamed_bytes[accumulating],
                   ready[accumulating], consumer[accumulating])
        streams.append(stream(plan, mb_time, *mb_rows, groups(threshold, *mb_rows)))
        runs.append(float(microbatches - 1))
    step = compute_busy = hardware.step_overhead
    total_comm = 0.0
    # The collectives exposed on the compute stream (loop bodies', folded ones'), every micro-batch.
    in_loops += sequential_sum(folded_exposed)
    loop_hidden += max(0.0, sequential_sum(folded_seconds) - sequential_sum(folded_exposed)) * microbatches
    # Per label: the loop bodies' collectives and the folded ones (exposed, every micro-batch), then each
    # stream's.
    label_masks = [loop_masks, axes_mask[folded] if folded is not None else np.zeros(0, dtype=np.int64)]
    label_seconds = [repeated * microbatches, folded_seconds * microbatches]
    label_late = [loop_exposed * microbatches, folded_exposed * microbatches]
    on_compute = len(label_late)
    for (span, busy, masks, durations, late), times in zip(streams, runs, strict=True):
        step += times * span
        compute_busy += times * busy
        total_comm += times * sequential_sum(durations)
        label_masks.append(masks)
        label_seconds.append(times * durations)
        label_late.append(times * late)
    exposed = step - compute_busy
    if exposed < 1e-12 * max(step, 1.0):  # rounding of the same sums taken in two orders
        exposed, step = 0.0, compute_busy
        label_late = label_late[:on_compute] + [late * 0.0 for late in label_late[on_compute:]]
    all_seconds, labels = np.concatenate(label_seconds), plan.collectives
    communication, by_level, exposed_by_axes = by_labels(
        np.concatenate(label_masks), [all_seconds, all_seconds, np.concatenate(label_late)],
        [labels.axes_label, labels.levels_label, labels.axes_label])
    in_loops *= microbatches
    breakdown = {
        "compute_bound_s": busy_compute,
        "memory_bound_s": busy_memory,
        "launch_overhead_s": overheads,
        "exposed_communication_s": exposed + in_loops,
        "hidden_communication_s": (max(0.0, total_comm - exposed) if total_comm - exposed > 1e-12 * step else 0.0)
        + loop_hidden,
    }
    # The copies between device and host memory, where the step waits for them (toast.cost.schedule).
    host_exposed, host_hidden = host_transfers(plan, seconds, item_time, value_bytes)
    breakdown["exposed_host_transfer_s"] = host_exposed
    breakdown["hidden_host_transfer_s"] = host_hidden
    step = step + host_exposed
    listed = plan.communication.to_list(table) if collectives else []
    folded_count = int(np.count_nonzero(folded)) if folded is not None else 0
    launched = len(streams[0][2]) + int(np.count_nonzero(in_loop)) + folded_count
    return AbsoluteCost(step, compute_busy - in_loops, breakdown, communication, peak, listed, by_level,
                        exposed_by_axes, launched)


# Values' bytes no part of the cost reads (``_reads_value_bytes``): empty, so that a read would fail, not mislead.
_UNREAD = np.zeros(0, dtype=np.int64)


def _reads_value_bytes(plan: CostPlan) -> bool:
    """Whether a state's cost on ``plan`` reads values' bytes beyond what the byte classes give the class table, the
    kernels' classes and the buffers' cells: the host copies', the donated arguments' and outputs', the halo exchanges'
    operands' and the kernels' scratch (``toast.cost.schedule.host_transfers``, ``toast.cost.memory``)."""
    kernel_plan = plan.kernel_plan
    return bool(kernel_plan.transfers) or bool(plan.donate) or bool(len(plan.communication._halo_ops)) \
        or bool(len(kernel_plan.scratch[0]))


def _select(keep: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """The rows of ``columns`` where ``keep`` holds: the columns themselves (no copies) where it keeps all."""
    if np.count_nonzero(keep) == len(keep):
        return columns
    rows = keep.nonzero()[0]
    return tuple(column.take(rows) for column in columns)


class CostModel:
    """Evaluates states of one program, mesh and hardware: a ``CostPlan`` built once (``toast.cost.plan``) and the
    pure functions pricing a state on it (``absolute_cost``).

    Args:
      model: the sharding model (analysis and mesh).
      hardware: the accelerator profile.
      memory_penalty: the constant C of MP(s).
      device_memory: DM, bytes per device (default: the profile's HBM).
      overlap: whether collectives overlap compute (a communication stream); ``False`` serializes them.
      donate: indices of ``@main``'s arguments whose buffers the outputs may reuse (``donate_argnums``).
      microbatches: micro-batches per step (gradient accumulation): the program is one micro-batch's step;
        every kernel but the optimizer's runs this many times, the gradients are reduced once, in the last
        micro-batch, as Megatron-LM and an accumulating JAX loop do.
      reuse: price repeated layers once (``CostPlan.reuse``; ``absolute_cost`` says what is equal); ``False``: the
        full path, every op priced and every collective scanned.

    Attributes:
      cost_plan: the frozen plan; its settings and parts are also read here under their own names (``plan``:
        the kernel plan, ``model``, ``hardware``, ``communication``, ``device_memory``, ``repeats``, ...).
      initial: the unsharded program's ``AbsoluteCost``.
    """

    def __init__(self, model: ShardingModel, hardware: Hardware, *, memory_penalty: float = 10.0,
                 device_memory: float | None = None, overlap: bool = True, donate: Iterable[int] = (),
                 microbatches: int = 1, reuse: bool = True):
        self.cost_plan = cost_plan(model, hardware, memory_penalty=memory_penalty, device_memory=device_memory,
                                   overlap=overlap, donate=donate, microbatches=microbatches, reuse=reuse)
        # The per-partition grouping of kernels (``kernel_moves``) and, with ``reuse``, the collectives' classes
        # (``ClassTable``), kept for the last partition asked for.
        self._moves: tuple[NamePartition, KernelMoves] | None = None
        # The buffer cells at the memory timeline's first position (``peak_floor``), for the last moves asked for.
        self._first_cells: tuple[KernelMoves, np.ndarray, np.ndarray] | None = None
        self._classes: tuple[NamePartition, ClassTable] | None = None
        self.initial = self._absolute(model.initial())

    @property
    def plan(self) -> KernelPlan:
        """The kernels, buffers and loops (``toast.cost.kernels.KernelPlan``)."""
        return self.cost_plan.kernel_plan

    @property
    def model(self) -> ShardingModel:
        return self.cost_plan.model

    @property
    def hardware(self) -> Hardware:
        return self.cost_plan.hardware

    @property
    def communication(self) -> CommunicationModel:
        return self.cost_plan.communication

    @property
    def loop_overlap(self) -> LoopOverlap:
        return self.cost_plan.loop_overlap

    @property
    def collective_matmul(self) -> CollectiveMatmul | None:
        return self.cost_plan.collective_matmul

    @property
    def memory_penalty(self) -> float:
        return self.cost_plan.memory_penalty

    @property
    def device_memory(self) -> float:
        """DM, bytes per device."""
        return self.cost_plan.device_memory

    @property
    def overlap(self) -> bool:
        return self.cost_plan.overlap

    @property
    def donate(self) -> tuple[int, ...]:
        return self.cost_plan.donate

    @property
    def microbatches(self) -> int:
        return self.cost_plan.microbatches

    @property
    def repeats(self) -> np.ndarray:
        """``float64[kernels]``, runs of each kernel per step."""
        return self.cost_plan.pricing.repeats

    @property
    def overhead(self) -> np.ndarray:
        """``float64[kernels]``, each kernel's launch overhead, seconds."""
        return self.cost_plan.pricing.overhead

    @property
    def kernel_count(self) -> int:
        """Kernels launched per step."""
        return self.cost_plan.pricing.kernel_count

    @property
    def op_in_loop(self) -> np.ndarray:
        """``bool[ops]``, the op lies in a loop body."""
        return self.cost_plan.schedule.op_in_loop

    def evaluate(self, state: ShardingState, *, collectives: bool = True) -> Cost:
        """The cost of ``state``, relative to the unsharded program; ``collectives=False`` leaves
        ``Cost.collectives`` empty (a search needs only the numbers, and listing them costs time)."""
        return self._relative(self._absolute(state, collectives=collectives))

    def priced_rows(self, state: ShardingState) -> PricedRows:
        """``state`` priced up to its schedule (``toast.cost.model.priced_rows``): its peak, and what
        ``step_time_bound`` and ``evaluate_rows`` need."""
        classes = self.classes(state.partition) if state.partition is not None else None
        return priced_rows(self.cost_plan, state, moves=self._moves_of(state), classes=classes)

    def peak_floor(self, state: ShardingState) -> int:
        """A lower bound of the state's peak, bytes, from a few of its numbers: the device buffers live at the
        memory timeline's first position (the arguments: a training step's parameters and optimizer state), which
        the other buffers and copies only add to. 0 where the state is not priced per class of alike buffers
        (built on no partition, without ``reuse``, with donated arguments)."""
        moves = self._moves_of(state)
        if moves is None or not self.cost_plan.reuse or self.cost_plan.donate:
            return 0
        cached = self._first_cells
        if cached is None or cached[0] is not moves:
            position, byte_class, count = moves.buffer_cells
            first = position == 0
            cached = self._first_cells = (moves, byte_class[first], count[first])
        _, byte_class, count = cached
        return int((self.communication.class_bytes(state).take(byte_class) * count).sum())

    def step_time_bound(self, rows: PricedRows) -> float:
        """A lower bound of the step time of ``rows``' state, seconds (``toast.cost.model.step_time_bound``):
        about half the work of ``evaluate``, for a search that only needs to know a state is worse than another."""
        return step_time_bound(self.cost_plan, rows)

    def evaluate_rows(self, rows: PricedRows, *, collectives: bool = True) -> Cost:
        """``evaluate`` of ``rows``' state, from its ``priced_rows`` (the same ``Cost``)."""
        return self._relative(scheduled_cost(self.cost_plan, rows, collectives=collectives))

    def _relative(self, absolute: AbsoluteCost) -> Cost:
        initial_time, initial_peak = self.initial.step_time_s, self.initial.peak_bytes
        step, peak = absolute.step_time_s, absolute.peak_bytes
        relative = step / initial_time if initial_time > 0 else 1.0
        if peak > self.device_memory and initial_peak > 0:
            relative += self.memory_penalty * (peak - self.device_memory) / initial_peak
        return Cost(step_time_s=step, compute_s=absolute.compute_s, breakdown=absolute.breakdown,
                    communication_s=absolute.communication_s, peak_bytes=peak, kernels=self.kernel_count,
                    relative=relative, collectives=tuple(absolute.collectives),
                    communication_by_level_s=absolute.by_level,
                    exposed_communication_by_axes_s=absolute.exposed_by_axes, collectives_launched=absolute.launched)

    def collective_time(self, collective: Collective) -> float:
        """Seconds of one collective over its axes' span (``toast.cost.network``)."""
        return collective_time(self.cost_plan, collective)

    def kernel_work(self, state: ShardingState, value_bytes: np.ndarray | None = None, *,
                    class_bytes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per kernel (one launch): ``(FLOPs over the peak of their type, bytes moved, atomic-update
        seconds)``; the first in seconds at 100% of peak, the second in bytes."""
        return kernel_work(self.cost_plan, state, value_bytes, class_bytes=class_bytes, moves=self._moves_of(state))

    def kernel_times(self, state: ShardingState, value_bytes: np.ndarray | None = None, *,
                     class_bytes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per kernel (one launch): ``(seconds, seconds bound by FLOPs or atomics, seconds bound by bytes)``;
        seconds = the larger bound + the kernel's overhead."""
        return kernel_times(self.cost_plan, state, value_bytes, class_bytes=class_bytes, moves=self._moves_of(state))

    def prepare(self, partition: NamePartition) -> None:
        """Build the per-class arrays for states on ``partition`` now (linear in the program; otherwise the
        first such state builds them): a search calls this before its workers fork, so they share them."""
        self._kernel_moves(partition)
        self.classes(partition)

    def memory_timeline(self, state: ShardingState) -> np.ndarray:
        """``int64[kernels + 3]``: bytes live on one device at each position (0: the arguments, before the
        first kernel; k + 1: during kernel k; then the outputs), before donated buffers are reused."""
        return memory_timeline(self.cost_plan, state)

    def live_at_peak(self, state: ShardingState, *, top: int = 5) -> list[LiveBuffer]:
        """The ``top`` largest buffers live when the peak is reached (largest first)."""
        return live_at_peak(self.cost_plan, state, top=top)

    def _absolute(self, state: ShardingState, *, collectives: bool = True) -> AbsoluteCost:
        classes = self.classes(state.partition) if state.partition is not None else None
        return absolute_cost(self.cost_plan, state, collectives=collectives, moves=self._moves_of(state),
                             classes=classes)

    def classes(self, partition: NamePartition) -> ClassTable | None:
        """The ``ClassTable`` finding the collectives of states built on ``partition`` (``None`` without ``reuse``,
        or for a program too small for one to pay: ``toast.cost.class_table.MIN_SITES``), kept for the last
        partition asked for."""
        if not self.cost_plan.reuse or len(self.communication.use_sites) < class_table.MIN_SITES:
            return None
        cached = self._classes
        if cached is not None and cached[0] is partition:
            return cached[1]
        classes = ClassTable(self.communication, partition)
        self._classes = (partition, classes)
        return classes

    def _moves_of(self, state: ShardingState) -> KernelMoves | None:
        return self._kernel_moves(state.partition) if state.partition is not None else None

    def _kernel_moves(self, partition: NamePartition) -> KernelMoves:
        """``kernel_moves`` of ``partition``, kept for the last partition asked for."""
        cached = self._moves
        if cached is not None and cached[0] is partition:
            return cached[1]
        moves = kernel_moves(self.cost_plan, partition)
        self._moves = (partition, moves)
        return moves
