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
from toast.cost.plan import CollectivePricing, CostPlan
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


class KernelMoves(NamedTuple):
    """What ``kernel_work`` prices per class in states built on one partition (``kernel_moves``).

    Attributes:
      kernel_group: ``int64[kernels]``, each kernel's group of kernels that move alike.
      moves: ``(row, byte class, count, rows)``, the sparse matrix of how many of each byte class
        (``CommunicationModel.byte_classes``) a kernel of a group (row) moves, as ``int64[entries]``,
        ``int64[entries]``, ``float64[entries]`` and the number of groups.
      flops: the FLOP-counted ops' classes.
    """

    kernel_group: np.ndarray
    moves: tuple[np.ndarray, np.ndarray, np.ndarray, int]
    flops: FlopClasses


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
    return KernelMoves(kernel_group, moves, _flop_classes(plan, partition))


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
        devices = plan.model.devices_of_mask[state.masks[state.partition.first_name][flop_classes.parts]]
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


def collective_durations(collectives: CollectivePricing, kind: np.ndarray, axes_mask: np.ndarray,
                         nbytes: np.ndarray) -> np.ndarray:
    """``float64[rows]``: seconds of collectives of kinds ``kind`` (codes of ``KINDS``) over ``axes_mask``
    moving ``nbytes`` (nccl-tests' size) each: the fastest algorithm of each."""
    latency = collectives.latency[kind, axes_mask]  # [rows, candidates]
    per_byte = collectives.per_byte[kind, axes_mask]
    return (latency + per_byte * nbytes[:, None]).min(axis=1)


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
