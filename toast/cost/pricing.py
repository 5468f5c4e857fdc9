"""Pricing one state's kernels and collectives on a ``CostPlan`` (pure functions; ``toast.cost.model`` has the
model they implement).

A kernel costs ``max(FLOPs / (peak x matmul_efficiency) + atomic updates / scatter rate, bytes / (HBM bandwidth x
hbm_efficiency)) + overhead``; a collective the fastest of its algorithms over its axes' span
(``toast.cost.network``); a collective folded into a matmul (``toast.cost.overlap``) what the matmul leaves of it
exposed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from toast.cost.collectives import Collective
from toast.cost.network import collective_seconds, mesh_group_span
from toast.cost.overlap import exposed_seconds
from toast.cost.plan import MASKS, CollectivePricing, CostPlan
from toast.sharding.state import NamePartition, ShardingState


class FlopClasses(NamedTuple):
    """The FLOP-counted ops (``KernelPricing.flop_names``) grouped by what their FLOPs depend on in states built on
    one partition: the parts and sizes of their FLOP names, their scale and peak. A class's ops have the same FLOPs
    over peak in every such state; a representative per class is priced.

    Attributes:
      op_class: ``int64[ops counted]``, each op's class.
      parts, sizes: ``int64[entries]``, the parts and sizes of each class's representative's FLOP names, class
        after class; ``starts``: ``int64[classes]``, where each class's start.
      scales, peaks: ``float64[classes]``, FLOPs per product of the names' sizes, FLOP/s at peak.
    """

    op_class: np.ndarray
    parts: np.ndarray
    sizes: np.ndarray
    starts: np.ndarray
    scales: np.ndarray
    peaks: np.ndarray


class KernelClasses(NamedTuple):
    """The kernels grouped by everything their seconds depend on in states built on one partition: their group of
    kernels that move alike, their FLOP-counted ops' classes (in op order), their fixed FLOPs, their scatter updates'
    byte classes, widths and rates (in order), their overhead and runs. A class's kernels take the same seconds in
    every such state; ``kernel_seconds`` prices a representative per class (the same numbers, the same sums).

    Attributes:
      kernel_class: ``int64[kernels]``, each kernel's class.
      group: ``int64[classes]``, each class's group of kernels that move alike (``KernelMoves.kernel_group``).
      fixed_at_peak, overhead: ``float64[classes]``, as ``KernelPricing``'s (seconds).
      repeats: ``float64[classes]``, runs per step (``KernelPricing.repeats``); ``step_repeats``: with micro-batches
        (``Schedule.kernel_runs``), else the same.
      flop_class, flop_op_class: ``int64[entries]``, the representatives' FLOP-counted ops in op order: each one's
        kernel class and FLOP class (``FlopClasses.op_class``).
      scatter_class, scatter_value_class: ``int64[updates]``, the representatives' scatter updates in order: each
        one's kernel class and its value's byte class; ``scatter_bits``: ``int64[updates]``, element widths;
        ``scatter_rates``: ``float64[updates]``, atomic updates per second.
      own_items: every kernel is its own top-level item, in order (no loops): a kernel's item time is its own.
    """

    kernel_class: np.ndarray
    group: np.ndarray
    fixed_at_peak: np.ndarray
    overhead: np.ndarray
    repeats: np.ndarray
    step_repeats: np.ndarray
    flop_class: np.ndarray
    flop_op_class: np.ndarray
    scatter_class: np.ndarray
    scatter_value_class: np.ndarray
    scatter_bits: np.ndarray
    scatter_rates: np.ndarray
    own_items: bool


class KernelMoves(NamedTuple):
    """What ``kernel_work`` prices per class in states built on one partition (``kernel_moves``).

    Attributes:
      kernel_group: ``int64[kernels]``, each kernel's group of kernels that move alike.
      moves: ``(row, byte class, count, rows)``, the sparse matrix of how many of each byte class
        (``CommunicationModel.byte_classes``) a kernel of a group (row) moves, as ``int64[entries]``,
        ``int64[entries]``, ``float64[entries]`` and the number of groups.
      flops: the FLOP-counted ops' classes.
      kernels: the kernels' classes (``kernel_seconds``).
      buffer_cells: ``(position, byte class, count)``, ``int64[cells]`` each: how many buffers of a byte class on the
        device are allocated (+) and freed (-) at a memory timeline position (``toast.cost.memory``; buffers alike
        at one position are one cell), for a state's buffer bytes in fewer terms than buffers.
    """

    kernel_group: np.ndarray
    moves: tuple[np.ndarray, np.ndarray, np.ndarray, int]
    flops: FlopClasses
    kernels: KernelClasses
    buffer_cells: tuple[np.ndarray, np.ndarray, np.ndarray]


def kernel_moves(plan: CostPlan, partition: NamePartition) -> KernelMoves:
    """Kernels grouped by the bytes they move, and FLOP-counted ops by what their FLOPs depend on, in states built on
    ``partition`` (``KernelMoves``; linear in the program)."""
    kernel_plan = plan.kernel_plan
    value_class = plan.communication.byte_classes(partition).value_class
    class_count = int(value_class.max()) + 1 if len(value_class) else 0
    read_kernel, _, read_value = kernel_plan.reads
    write_kernel, _, write_value = kernel_plan.writes
    scratch_kernel, scratch_value, scratch_scale = kernel_plan.scratch
    kernels = np.concatenate((read_kernel, write_kernel, scratch_kernel)).astype(np.int64)
    classes = value_class[np.concatenate((read_value, write_value, scratch_value)).astype(np.int64)]
    weights = np.concatenate((np.ones(len(read_kernel) + len(write_kernel)), 2.0 * scratch_scale))
    cells, inverse = np.unique(kernels * class_count + classes, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=weights, minlength=len(cells))
    cell_kernel, cell_class = cells // max(class_count, 1), cells % max(class_count, 1)
    bounds = np.searchsorted(cell_kernel, np.arange(len(kernel_plan.kernels) + 1))
    kernel_group = np.empty(len(kernel_plan.kernels), dtype=np.int64)
    rows: dict[tuple, int] = {}
    classes_list, sums_list = cell_class.tolist(), sums.tolist()
    for k in range(len(kernel_plan.kernels)):
        start, end = int(bounds[k]), int(bounds[k + 1])
        key = (tuple(classes_list[start:end]), tuple(sums_list[start:end]))
        kernel_group[k] = rows.setdefault(key, len(rows))
    move_row, move_class, move_count = [], [], []
    for (row_classes, row_sums), index in rows.items():
        move_row += [index] * len(row_classes)
        move_class += row_classes
        move_count += row_sums
    moves = (np.asarray(move_row, dtype=np.int64), np.asarray(move_class, dtype=np.int64),
             np.asarray(move_count, dtype=np.float64), len(rows))
    flops = _flop_classes(plan, partition)
    return KernelMoves(kernel_group, moves, flops, _kernel_classes(plan, kernel_group, flops, value_class),
                       _buffer_cells(plan, value_class))


def _buffer_cells(plan: CostPlan, value_class: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``KernelMoves.buffer_cells``: the device buffers' allocations and frees per position and byte class."""
    memory = plan.memory
    on_device = memory.on_device  # a buffer in host memory takes no device memory
    buffer_class = value_class[plan.kernel_plan.buffers[on_device]]
    width = int(value_class.max()) + 1 if len(value_class) else 1
    keys = np.concatenate((memory.buffer_born[on_device] * width + buffer_class,
                           memory.buffer_dies[on_device] * width + buffer_class))
    cells, inverse = np.unique(keys, return_inverse=True)
    counts = np.bincount(inverse.ravel(), weights=np.repeat([1.0, -1.0], len(buffer_class)), minlength=len(cells))
    kept = counts != 0
    cells = cells[kept]
    return cells // width, cells % width, counts[kept].astype(np.int64)


def _kernel_classes(plan: CostPlan, kernel_group: np.ndarray, flops: FlopClasses, value_class: np.ndarray
                    ) -> KernelClasses:
    """The kernels' classes (``KernelClasses``): kernels alike in all their seconds depend on."""
    pricing, schedule = plan.pricing, plan.schedule
    kernel_count = len(kernel_group)
    step_repeats = pricing.repeats if plan.microbatches == 1 else pricing.repeats * schedule.kernel_runs
    # Each kernel's FLOP-counted ops' classes and scatter updates, in order.
    flop_ops: list[list[int]] = [[] for _ in range(kernel_count)]
    for kernel, op_class in zip(pricing.matmul_kernels.tolist(), flops.op_class.tolist(), strict=True):
        flop_ops[kernel].append(op_class)
    scatter_bits = plan.communication.element_bits[pricing.scatter_values]
    scatter_value_class = value_class[pricing.scatter_values]
    updates: list[list[tuple[int, int, float]]] = [[] for _ in range(kernel_count)]
    for kernel, byte_class, bits, rate in zip(pricing.scatter_kernels.tolist(), scatter_value_class.tolist(),
                                              scatter_bits.tolist(), pricing.scatter_rates.tolist(), strict=True):
        updates[kernel].append((byte_class, bits, rate))
    classes: dict[tuple, int] = {}
    kernel_class = np.empty(kernel_count, dtype=np.int64)
    representatives: list[int] = []
    for kernel, key in enumerate(zip(kernel_group.tolist(), pricing.fixed_at_peak.tolist(), pricing.overhead.tolist(),
                                     pricing.repeats.tolist(), step_repeats.tolist(), map(tuple, flop_ops),
                                     map(tuple, updates), strict=True)):
        found = classes.setdefault(key, len(classes))
        if found == len(representatives):
            representatives.append(kernel)
        kernel_class[kernel] = found
    rep = np.asarray(representatives, dtype=np.int64)
    is_rep = np.zeros(kernel_count, dtype=bool)
    is_rep[rep] = True
    # The representatives' entries, in the order kernel_work adds them.
    flop_rows = np.flatnonzero(is_rep[pricing.matmul_kernels])
    scatter_rows = np.flatnonzero(is_rep[pricing.scatter_kernels])
    top_of_kernel = schedule.top_of_kernel
    return KernelClasses(
        kernel_class=kernel_class, group=kernel_group[rep], fixed_at_peak=pricing.fixed_at_peak[rep],
        overhead=pricing.overhead[rep], repeats=pricing.repeats[rep], step_repeats=step_repeats[rep],
        flop_class=kernel_class[pricing.matmul_kernels[flop_rows]], flop_op_class=flops.op_class[flop_rows],
        scatter_class=kernel_class[pricing.scatter_kernels[scatter_rows]],
        scatter_value_class=scatter_value_class[scatter_rows], scatter_bits=scatter_bits[scatter_rows],
        scatter_rates=pricing.scatter_rates[scatter_rows],
        own_items=schedule.item_count == kernel_count and bool((top_of_kernel == np.arange(kernel_count)).all()))


def _flop_classes(plan: CostPlan, partition: NamePartition) -> FlopClasses:
    """The FLOP-counted ops' classes on ``partition``: ops whose FLOP names have the same parts and sizes, in
    order, and the same scale and peak."""
    pricing, name_size = plan.pricing, plan.model.name_size
    names = pricing.flop_names
    bounds = np.append(pricing.flop_starts, len(names)).tolist()
    parts, sizes = partition.part_of_name[names].tolist(), name_size[names].tolist()
    scales, peaks = pricing.flop_scales.tolist(), pricing.flop_peaks.tolist()
    classes: dict[tuple, int] = {}
    op_class = np.empty(len(scales), dtype=np.int64)
    representatives: list[int] = []
    for op in range(len(scales)):
        begin, end = bounds[op], bounds[op + 1]
        key = (tuple(parts[begin:end]), tuple(sizes[begin:end]), scales[op], peaks[op])
        found = classes.setdefault(key, len(classes))
        if found == len(representatives):
            representatives.append(op)
        op_class[op] = found
    entries = [np.arange(bounds[op], bounds[op + 1]) for op in representatives]
    flat = np.concatenate(entries) if entries else np.zeros(0, dtype=np.int64)
    starts = np.cumsum([0] + [len(entry) for entry in entries[:-1]]).astype(np.int64)
    rep = np.asarray(representatives, dtype=np.int64)
    return FlopClasses(op_class, partition.part_of_name[names[flat]], name_size[names[flat]], starts,
                       pricing.flop_scales[rep], pricing.flop_peaks[rep])


def kernel_work(plan: CostPlan, state: ShardingState, value_bytes: np.ndarray | None = None, *,
                class_bytes: np.ndarray | None = None, moves: KernelMoves | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel (one launch): ``(FLOPs over the peak of their type, bytes moved, atomic-update seconds)``; the
    first in seconds at 100% of peak, the second in bytes. ``moves``: ``kernel_moves`` of ``state.partition``
    (made here when not given)."""
    kernel_plan, pricing, communication = plan.kernel_plan, plan.pricing, plan.communication
    kernel_count = len(kernel_plan.kernels)
    if value_bytes is None:
        value_bytes = communication.value_bytes(state)
    if state.partition is not None:
        # Per group of kernels that move alike (repeated layers' kernels are one group); the sums are of
        # whole bytes (halves at most), so exact in any order.
        if moves is None:
            moves = kernel_moves(plan, state.partition)
        kernel_group, (move_row, move_class, move_count, rows) = moves.kernel_group, moves.moves
        if class_bytes is None:
            class_bytes = communication.class_bytes(state)
        # A sparse product (no BLAS: its threads would oversubscribe the search's worker processes).
        moved = np.bincount(move_row, weights=move_count * class_bytes[move_class], minlength=rows
                            ).take(kernel_group)
    else:
        bytes_of = value_bytes.astype(np.float64)
        read_kernel, _, read_weight = kernel_plan.reads
        write_kernel, _, write_weight = kernel_plan.writes
        scratch_kernel, scratch_value, scratch_scale = kernel_plan.scratch
        moved = (np.bincount(read_kernel, weights=bytes_of[read_weight], minlength=kernel_count)
                 + np.bincount(write_kernel, weights=bytes_of[write_weight], minlength=kernel_count)
                 + np.bincount(scratch_kernel, weights=2.0 * bytes_of[scratch_value] * scratch_scale,
                               minlength=kernel_count))  # scratch: written, then read back
    # bincount adds each bin's terms in order, as a loop (and np.add.at) would.
    at_peak: np.ndarray = pricing.fixed_at_peak.copy()
    if len(pricing.flop_names) and plan.reuse and moves is not None and state.partition is not None:
        # One representative per class of alike ops (the same numbers, computed once per class).
        flop_classes = moves.flops
        devices = plan.model.devices_of_mask[state.part_masks()[flop_classes.parts]]
        local = (flop_classes.sizes // devices).astype(np.float64)
        flops = flop_classes.scales * np.multiply.reduceat(local, flop_classes.starts)
        at_peak += np.bincount(pricing.matmul_kernels, weights=(flops / flop_classes.peaks)[flop_classes.op_class],
                               minlength=kernel_count)
    elif len(pricing.flop_names):
        model = plan.model
        devices = model.devices_of_mask[state.masks[pricing.flop_names]]
        local = (model.name_size[pricing.flop_names] // devices).astype(np.float64)
        flops = pricing.flop_scales * np.multiply.reduceat(local, pricing.flop_starts)
        at_peak += np.bincount(pricing.matmul_kernels, weights=flops / pricing.flop_peaks, minlength=kernel_count)
    atomics: np.ndarray = np.zeros(kernel_count, dtype=np.float64)
    if len(pricing.scatter_values):
        elements = value_bytes[pricing.scatter_values] * 8 / np.maximum(
            communication.element_bits[pricing.scatter_values], 1)
        atomics = np.bincount(pricing.scatter_kernels, weights=elements / pricing.scatter_rates,
                              minlength=kernel_count)
    return at_peak, moved, atomics


def kernel_times(plan: CostPlan, state: ShardingState, value_bytes: np.ndarray | None = None, *,
                 class_bytes: np.ndarray | None = None, moves: KernelMoves | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel (one launch): ``(seconds, seconds bound by FLOPs or atomics, seconds bound by bytes)``;
    seconds = the larger bound + the kernel's overhead."""
    at_peak, moved, atomics = kernel_work(plan, state, value_bytes, class_bytes=class_bytes, moves=moves)
    compute_time = at_peak / plan.hardware.matmul_efficiency + atomics
    memory_time = moved / plan.pricing.bandwidth
    return np.maximum(compute_time, memory_time) + plan.pricing.overhead, compute_time, memory_time


class KernelSeconds(NamedTuple):
    """One state's kernel times (``kernel_seconds``).

    Attributes:
      seconds: ``float64[kernels]``, one launch of each kernel (``kernel_times``' first).
      item_time: ``float64[items]``, each top-level item's seconds per step (its kernels' seconds x repeats).
      busy_compute, busy_memory: seconds per step of the kernels bound by FLOPs or atomics, and by bytes (with
        micro-batches, every run).
    """

    seconds: np.ndarray
    item_time: np.ndarray
    busy_compute: float
    busy_memory: float


def kernel_seconds(plan: CostPlan, state: ShardingState, class_bytes: np.ndarray, moves: KernelMoves) -> KernelSeconds:
    """``kernel_times`` of a state built on ``moves``' partition, and the sums the step takes of them, priced once per
    class of alike kernels (``KernelClasses``; ``class_bytes``: ``CommunicationModel.class_bytes(state)``): the same
    numbers as per kernel, summed over the same arrays."""
    assert state.partition is not None
    classes, pricing, hardware = moves.kernels, plan.pricing, plan.hardware
    count = len(classes.group)
    move_row, move_class, move_count, rows = moves.moves
    moved = np.bincount(move_row, weights=move_count * class_bytes[move_class], minlength=rows).take(classes.group)
    at_peak = classes.fixed_at_peak
    if len(classes.flop_class):
        flop_classes = moves.flops
        devices = plan.model.devices_of_mask[state.part_masks()[flop_classes.parts]]
        local = (flop_classes.sizes // devices).astype(np.float64)
        flops = flop_classes.scales * np.multiply.reduceat(local, flop_classes.starts)
        # As kernel_work adds them: a kernel's fixed seconds plus its ops' (added in order from 0).
        at_peak = at_peak + np.bincount(classes.flop_class, weights=(flops / flop_classes.peaks)[classes.flop_op_class],
                                        minlength=count)
    compute_time = at_peak / hardware.matmul_efficiency
    if len(classes.scatter_class):
        elements = class_bytes[classes.scatter_value_class] * 8 / np.maximum(classes.scatter_bits, 1)
        compute_time = compute_time + np.bincount(classes.scatter_class, weights=elements / classes.scatter_rates,
                                                  minlength=count)
    else:
        compute_time = compute_time + np.zeros(count)  # as kernel_times adds no atomics (-0.0 becomes 0.0)
    memory_time = moved / pricing.bandwidth
    seconds = np.maximum(compute_time, memory_time) + classes.overhead
    compute_bound = compute_time >= memory_time
    kernel_class = classes.kernel_class
    busy_compute = float((np.where(compute_bound, compute_time, 0.0) * classes.step_repeats).take(kernel_class).sum())
    busy_memory = float((np.where(compute_bound, 0.0, memory_time) * classes.step_repeats).take(kernel_class).sum())
    per_step = (seconds * classes.repeats).take(kernel_class)
    schedule = plan.schedule
    item_time = per_step if classes.own_items else np.bincount(schedule.top_of_kernel, weights=per_step,
                                                                minlength=schedule.item_count)
    return KernelSeconds(seconds.take(kernel_class), item_time, busy_compute, busy_memory)


def collective_durations(collectives: CollectivePricing, kind: np.ndarray, axes_mask: np.ndarray,
                         nbytes: np.ndarray) -> np.ndarray:
    """``float64[rows]``: seconds of collectives of kinds ``kind`` (codes of ``KINDS``) over ``axes_mask``
    moving ``nbytes`` (nccl-tests' size) each: the fastest algorithm of each."""
    # A candidate at a time (1-D takes of a row of a few hundred entries cost less than a 2-D gather).
    index = kind * MASKS + axes_mask
    latency, per_byte = collectives.latency_columns, collectives.per_byte_columns
    found = latency[0].take(index) + per_byte[0].take(index) * nbytes
    for column in range(1, len(latency)):
        np.minimum(found, latency[column].take(index) + per_byte[column].take(index) * nbytes, out=found)
    return found


def collective_time(plan: CostPlan, collective: Collective) -> float:
    """Seconds of one collective over its axes' span (``toast.cost.network``)."""
    mesh, hardware = plan.model.mesh, plan.hardware
    span = mesh_group_span(list(mesh.axes), collective.axes, hardware, slices=mesh.slices)
    nbytes = collective.bytes_out if collective.kind == "all-gather" else collective.bytes_in
    return collective_seconds(collective.kind, nbytes, span, hardware)


def matmul_folds(plan: CostPlan, seconds: np.ndarray, kind: np.ndarray, axes_mask: np.ndarray, op: np.ndarray,
                 operand: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Per collective: the matmul kernel it can fold into (``-1``: none) and the seconds it then leaves exposed
    (``toast.cost.overlap``); ``None`` where none can (no collective matmul on the profile, or no overlap).

    Args:
      plan: the cost plan.
      seconds: ``float64[kernels]``, one launch of each kernel.
      kind, axes_mask, op, operand: ``int64[rows]``, the collectives' (``CollectiveTable``).
      durations: ``float64[rows]``, one run of each, seconds.
    """
    if plan.collective_matmul is None or not plan.overlap or not len(op):
        return None
    kernel = plan.collective_matmul.kernels(kind, op, operand)
    if not (kernel >= 0).any():
        return None
    at = np.maximum(kernel, 0)
    return kernel, exposed_seconds(durations, seconds[at] - plan.pricing.overhead[at],
                                   plan.collectives.devices[axes_mask])
