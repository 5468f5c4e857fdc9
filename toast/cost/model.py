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
  and must land before the kernel reading it (``CostModel._host_transfers``).

The relative cost is ``C(s) = RT(s) + MP(s)`` with ``RT = step time / initial step time`` and
``MP = penalty · (peak − device memory) / initial peak`` when the peak exceeds the device memory, else 0.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from toast.cost.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    COLLECTIVE_PERMUTE,
    KINDS,
    REDUCE_SCATTER,
    Collective,
    CollectiveTable,
    CommunicationModel,
)
from toast.cost.hardware import Hardware
from toast.cost.kernels import KernelPlan
from toast.cost.loops import LoopOverlap
from toast.cost.network import Algorithm, algorithms, collective_seconds, mesh_group_span
from toast.cost.overlap import CollectiveMatmul, exposed_seconds, folds, slack
from toast.errors import ToastError
from toast.sharding.state import NamePartition, ShardingModel, ShardingState

# Kernel classes of the ops that hand their operands on to a region or the caller (no kernel of their own).
_HANDS_ON = frozenset({"terminator", "loop", "branch"})


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


@dataclass(frozen=True, slots=True)
class LiveBuffer:
    """One buffer live at the peak: the value, its bytes per device, where it is made."""

    value: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    loc: str


class CostModel:
    """Static arrays for evaluating states of one program, mesh and hardware quickly.

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
    """

    def __init__(self, model: ShardingModel, hardware: Hardware, *, memory_penalty: float = 10.0,
                 device_memory: float | None = None, overlap: bool = True, donate: Iterable[int] = (),
                 microbatches: int = 1):
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise ToastError(f"micro-batches {microbatches!r}: give a whole number, 1 or more")
        self.model = model
        self.microbatches = microbatches
        self.hardware = hardware
        self.memory_penalty = memory_penalty
        self.device_memory = float(device_memory if device_memory is not None else hardware.hbm_bytes)
        if not (math.isfinite(self.device_memory) and self.device_memory > 0):  # NaN: every peak would fit
            raise ToastError(f"device memory {device_memory!r}: give the memory per device in bytes, a finite number "
                             "above 0")
        self.overlap = overlap
        self.communication = CommunicationModel(model)
        self._init_collective_algorithms()
        analysis = model.analysis
        program = analysis.program
        self.plan = KernelPlan(program, semantics=analysis.kernel_semantics)
        self.loop_overlap = LoopOverlap(self.plan, keeps_elements=analysis.kernel_semantics.keeps_elements)
        # The matmuls collectives fold into where the compiler runs collective matmuls (toast.cost.overlap).
        self.collective_matmul = CollectiveMatmul(self.plan, analysis.flop_names) \
            if hardware.collective_matmul else None
        self.donate = tuple(sorted(set(donate)))
        for index in self.donate:
            if not 0 <= index < len(program.arguments):
                raise ToastError(f"donated argument {index}: the program has arguments 0..{len(program.arguments) - 1}")
        self._init_kernel_pricing()
        next_kernel = self._init_schedule()
        self._init_readers()
        self._init_memory_positions(next_kernel)
        self._kernel_class_cache: tuple[NamePartition, tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                                 int]]] | None = None
        self._moves = np.asarray([span is not None and span.devices > 1 for span in self._mask_spans], dtype=bool)
        self._init_microbatches()
        self._init_host_transfers()
        self.initial = self._absolute(model.initial())

    def _init_collective_algorithms(self) -> None:
        """Per mesh axes mask: its span and, per collective kind, its algorithms' latency and seconds per byte."""
        mesh, hardware = self.model.mesh, self.hardware
        # Every axes mask's span, and per (kind, mask) its algorithms as affine candidates (latency, seconds per
        # byte), padded with (inf, 0); masks of at most one device move nothing (one candidate of 0 s).
        self._mask_spans = [mesh_group_span(list(mesh.axes), mesh.mask_axes(mask), hardware, slices=mesh.slices)
                            if mask < 1 << len(mesh.axes) else None for mask in range(256)]
        candidates: list[list[list[Algorithm]]] = [
            [list(algorithms(kind, span, hardware)) if span is not None else [] for span in self._mask_spans]
            for kind in KINDS]
        width = max(1, max(len(found) for per_kind in candidates for found in per_kind))
        self._candidate_latency = np.full((len(KINDS), 256, width), np.inf)
        self._candidate_per_byte = np.zeros((len(KINDS), 256, width))
        for kind_code, per_kind in enumerate(candidates):
            for mask, found in enumerate(per_kind):
                if not found:
                    self._candidate_latency[kind_code, mask, 0] = 0.0
                for column, algorithm in enumerate(found):
                    self._candidate_latency[kind_code, mask, column] = algorithm.latency
                    self._candidate_per_byte[kind_code, mask, column] = algorithm.seconds_per_byte
        self._mask_devices = np.asarray([span.devices if span is not None else 1 for span in self._mask_spans],
                                        dtype=np.int64)
        self._levels_label = [span.levels(hardware) if span is not None and span.devices > 1 else ""
                              for span in self._mask_spans]
        self._axes_label = ["+".join(mesh.mask_axes(mask)) for mask in range(256)]

    def _init_kernel_pricing(self) -> None:
        """Per kernel: its repeats and launch overhead; the FLOP names, peaks and scatter rates it is priced by."""
        analysis, hardware, plan = self.model.analysis, self.hardware, self.plan
        program = analysis.program
        self.repeats = np.asarray([k.repeats for k in plan.kernels], dtype=np.float64)
        is_library = np.asarray([k.kind in ("matmul", "library") for k in plan.kernels], dtype=bool)
        self.overhead = np.where(is_library, hardware.matmul_overhead, hardware.kernel_overhead)
        self.bandwidth = hardware.hbm_bandwidth * hardware.hbm_efficiency
        # The names whose local sizes multiply into each op's FLOPs: the rules' flop_name (contractions,
        # and any op a user's rules declare one), priced at the peak of the type of the operand the rules name
        # (flop_operand: a kernel's query, not its int8 mask), else of its first.
        # Each op's FLOPs are its scale (2, a multiply-add; a kernel's own: Analysis.flop_scales) x that product.
        flop_names: list[int] = []
        starts: list[int] = []
        peaks: list[float] = []
        scales: list[float] = []
        matmul_kernels: list[int] = []
        # An op with a scale and no flop name (a kernel that splits none of its flop dims): the same FLOPs
        # on every device, seconds at peak per kernel.
        self.fixed_at_peak = np.zeros(len(plan.kernels), dtype=np.float64)
        for op_id in sorted(set(analysis.flop_names) | set(analysis.flop_scales)):
            op = program.ops[op_id]
            kernel_index = int(plan.kernel_of_op[op_id])
            if kernel_index < 0 or not op.operands:
                continue
            members = analysis.flop_names.get(op_id, ())
            peak = hardware.matmul_flops(program.values[op.operands[analysis.flop_operands.get(op_id, 0)]].dtype)
            scale = analysis.flop_scales.get(op_id, 2.0)
            if not members:
                self.fixed_at_peak[kernel_index] += scale / peak
                continue
            starts.append(len(flop_names))
            flop_names.extend(members)
            peaks.append(peak)
            scales.append(scale)
            matmul_kernels.append(kernel_index)
        self.flop_names = np.asarray(flop_names, dtype=np.int64)
        self.flop_starts = np.asarray(starts, dtype=np.int64)
        self.flop_peaks = np.asarray(peaks, dtype=np.float64)
        self.flop_scales = np.asarray(scales, dtype=np.float64)
        self.matmul_kernels = np.asarray(matmul_kernels, dtype=np.int64)
        # Scatter-add rate per update element, by element width.
        scatter_kernels, scatter_values = plan.scatter_updates
        self.scatter_kernels = scatter_kernels
        self.scatter_values = scatter_values
        self.scatter_rates = np.asarray(
            [hardware.scatter_rate(program.values[v].bits) for v in scatter_values.tolist()], dtype=np.float64)
        self.kernel_count = int(self.repeats.sum())

    def _init_schedule(self) -> np.ndarray:
        """The top-level items (kernels outside loops, whole top-level loops) and each op's item; returns
        ``int64[ops]``, the index of the first kernel at or after each op."""
        program, plan = self.model.analysis.program, self.plan
        kernel_count = len(plan.kernels)
        # Top-level schedule: each kernel outside loops is an item; a top-level loop is one item.
        ops = program.ops
        top_of_kernel = np.empty(kernel_count, dtype=np.int64)
        item_keys: list[tuple[str, int]] = []
        item_index: dict[tuple[str, int], int] = {}
        for k, kernel in enumerate(plan.kernels):
            outer = plan.outermost_loop(kernel.ops[-1])
            key = ("loop", outer) if outer >= 0 else ("kernel", k)
            if key not in item_index:
                item_index[key] = len(item_keys)
                item_keys.append(key)
            top_of_kernel[k] = item_index[key]
        self.top_of_kernel = top_of_kernel
        self.item_count = len(item_keys)
        # The item an op's work belongs to (ops without a kernel: the next kernel's item).
        last_ops = np.asarray([k.ops[-1] for k in plan.kernels], dtype=np.int64)
        next_kernel = np.searchsorted(last_ops, np.arange(len(ops)))
        kernel_of_op = plan.kernel_of_op
        after = top_of_kernel[np.minimum(next_kernel, kernel_count - 1)] if kernel_count else next_kernel
        after = np.where(next_kernel < kernel_count, after, self.item_count)
        self.item_of_op = np.where(kernel_of_op >= 0, top_of_kernel[np.maximum(kernel_of_op, 0)] if kernel_count
                                   else -1, after)
        self.op_in_loop = np.asarray([plan.enclosing_loop(op.id) >= 0 for op in ops], dtype=bool)
        self.op_repeats = np.asarray([plan.repeats_in(plan.enclosing_loop(op.id)) for op in ops], dtype=np.float64)
        return next_kernel

    def _init_readers(self) -> None:
        """Per buffer and per op: the item that first reads it, that needs what it reads, that makes it."""
        program, plan = self.model.analysis.program, self.plan
        ops, kernel_of_op, top_of_kernel = program.ops, plan.kernel_of_op, self.top_of_kernel
        # The item that first reads each buffer (partial results wait there for their all-reduce): the first
        # kernel that loads it (a transpose or reshape of a weight gradient has no kernel of its own: the kernel
        # reading through it is the reader), or a loop, branch or terminator that hands it on.
        first_reader = np.full(len(program.values), self.item_count, dtype=np.int64)
        read_kernel, read_value, _ = plan.reads
        readers = [(int(top_of_kernel[k]), int(plan.root[v])) for k, v in zip(read_kernel.tolist(),
                                                                             read_value.tolist(), strict=True)]
        readers.extend((int(self.item_of_op[op.id]), int(plan.root[value_id])) for op in ops
                       if kernel_of_op[op.id] < 0 and plan.op_class[op.id] in _HANDS_ON for value_id in op.operands)
        reader_items: dict[int, list[int]] = {}
        for item, r in readers:
            if item > self._producer_item(r):
                first_reader[r] = min(first_reader[r], item)
                reader_items.setdefault(r, []).append(item)
        # The item that needs what an op reads: its own; for an op without a kernel (a view, or a cheap op
        # recomputed in its readers) the first kernel from there on that reads its results' or its operands'
        # buffers (use collectives are due there, not at the next kernel).
        self.consumer_item_of_op = self.item_of_op.copy()
        sorted_readers = {r: sorted(set(items)) for r, items in reader_items.items()}
        for op in ops:
            if kernel_of_op[op.id] >= 0 or plan.op_class[op.id] in _HANDS_ON:
                continue
            earliest = int(self.item_of_op[op.id])
            due = self.item_count
            for value_id in (*op.results, *op.operands):
                items = sorted_readers.get(int(plan.root[value_id]), [])
                at = bisect.bisect_left(items, earliest)
                if at < len(items):
                    due = min(due, items[at])
            self.consumer_item_of_op[op.id] = due
        self.first_reader = first_reader
        # Per value (through its buffer's root): the item that makes it (-1: an argument), the first reader.
        root = np.asarray(plan.root, dtype=np.int64)
        made_by = np.asarray(program.producer, dtype=np.int64)[root]
        self.ready_item = np.where(made_by >= 0, self.item_of_op[np.maximum(made_by, 0)], -1)
        self.first_reader_of_value = first_reader[root]

    def _init_memory_positions(self, next_kernel: np.ndarray) -> None:
        """Buffer lives and each op's position in the memory timeline (kernel index + 1; 0: the arguments)."""
        plan = self.plan
        kernel_of_op, kernel_count = plan.kernel_of_op, len(plan.kernels)
        # Peak memory: buffer positions shifted by one (arguments at -1).
        self.buffer_born = plan.buffer_born + 1
        self.buffer_dies = plan.buffer_dies + 2
        self._buffer_index = {int(v): i for i, v in enumerate(plan.buffers.tolist())}
        self.kernel_position_of_op = np.where(kernel_of_op >= 0, kernel_of_op,
                                              np.minimum(next_kernel, max(kernel_count - 1, 0)))

    def _init_microbatches(self) -> None:
        """What runs once per step however many micro-batches: the optimizer's kernels (those of the
        parameters' update chains, ``toast.sharding.strategies.update_chains``) and the reduction of the
        gradients they read (``_update_items``: ``bool[items]``; ``_kernel_runs``: ``float64[kernels]``, runs
        per step; ``_gradient_value``: ``bool[values]``, a partial result an update reads, directly or through
        reshapes, transposes and converts)."""
        program = self.model.analysis.program
        self._update_items = np.zeros(self.item_count, dtype=bool)
        self._kernel_runs = np.full(len(self.plan.kernels), float(self.microbatches))
        self._gradient_value = np.zeros(len(program.values), dtype=bool)
        if self.microbatches == 1:
            return
        from toast.sharding.strategies import update_chains

        update_values = {v for chain in update_chains(self.model.analysis).values() for v in chain.values}
        update_ops = {program.producer[v] for v in update_values if program.producer[v] >= 0}
        for op_id in update_ops:
            kernel = int(self.plan.kernel_of_op[op_id])
            if kernel >= 0:
                self._kernel_runs[kernel] = 1.0
                self._update_items[self.top_of_kernel[kernel]] = True
            frontier = [v for v in program.ops[op_id].operands if v not in update_values]
            while frontier:
                value_id = frontier.pop()
                if self._gradient_value[value_id]:
                    continue
                self._gradient_value[value_id] = True
                producer = program.producer[value_id]
                # Ops between a gradient's matmul and the optimizer that pass it on whole (the rules'
                # keeps_elements: reshape, transpose, convert, ...).
                if producer >= 0 and program.ops[producer].kind in self.plan.semantics.keeps_elements:
                    frontier.extend(program.ops[producer].operands[:1])

    def _producer_item(self, value_id: int) -> int:
        p = self.model.analysis.program.producer[value_id]
        return int(self.item_of_op[p]) if p >= 0 else -1

    def evaluate(self, state: ShardingState, *, collectives: bool = True) -> Cost:
        """The cost of ``state``, relative to the unsharded program; ``collectives=False`` leaves
        ``Cost.collectives`` empty (a search needs only the numbers, and listing them costs time)."""
        absolute = self._absolute(state, collectives=collectives)
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
        span = mesh_group_span(list(self.model.mesh.axes), collective.axes, self.hardware,
                               slices=self.model.mesh.slices)
        nbytes = collective.bytes_out if collective.kind == "all-gather" else collective.bytes_in
        return collective_seconds(collective.kind, nbytes, span, self.hardware)

    def kernel_work(self, state: ShardingState, value_bytes: np.ndarray | None = None, *,
                    class_bytes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per kernel (one launch): ``(FLOPs over the peak of their type, bytes moved, atomic-update
        seconds)``; the first in seconds at 100% of peak, the second in bytes."""
        plan = self.plan
        kernel_count = len(plan.kernels)
        if value_bytes is None:
            value_bytes = self.communication.value_bytes(state)
        if state.partition is not None:
            # Per class of kernels that move alike (repeated layers' kernels are one class); the sums are of
            # whole bytes (halves at most), so exact in any order.
            kernel_class, (move_row, move_class, move_count, rows) = self._kernel_classes(state.partition)
            if class_bytes is None:
                class_bytes = self.communication.class_bytes(state)
            # A sparse product (no BLAS: its threads would oversubscribe the search's worker processes).
            moved = np.bincount(move_row, weights=move_count * class_bytes[move_class], minlength=rows
                                ).take(kernel_class)
        else:
            bytes_of = value_bytes.astype(np.float64)
            read_kernel, _, read_weight = plan.reads
            write_kernel, _, write_weight = plan.writes
            scratch_kernel, scratch_value, scratch_scale = plan.scratch
            moved = (np.bincount(read_kernel, weights=bytes_of[read_weight], minlength=kernel_count)
                     + np.bincount(write_kernel, weights=bytes_of[write_weight], minlength=kernel_count)
                     + np.bincount(scratch_kernel, weights=2.0 * bytes_of[scratch_value] * scratch_scale,
                                   minlength=kernel_count))  # scratch: written, then read back
        # bincount adds each bin's terms in order, as a loop (and np.add.at) would.
        at_peak: np.ndarray = self.fixed_at_peak.copy()
        if len(self.flop_names):
            devices = self.model.devices_of_mask[state.masks[self.flop_names]]
            local = (self.model.name_size[self.flop_names] // devices).astype(np.float64)
            flops = self.flop_scales * np.multiply.reduceat(local, self.flop_starts)
            at_peak += np.bincount(self.matmul_kernels, weights=flops / self.flop_peaks, minlength=kernel_count)
        atomics: np.ndarray = np.zeros(kernel_count, dtype=np.float64)
        if len(self.scatter_values):
            elements = value_bytes[self.scatter_values] * 8 / np.maximum(
                self.communication.element_bits[self.scatter_values], 1)
            atomics = np.bincount(self.scatter_kernels, weights=elements / self.scatter_rates, minlength=kernel_count)
        return at_peak, moved, atomics

    def prepare(self, partition: NamePartition) -> None:
        """Build the per-class arrays for states on ``partition`` now (linear in the program; otherwise the
        first such state builds them): a search calls this before its workers fork, so they share them."""
        self._kernel_classes(partition)

    def _kernel_classes(self, partition: NamePartition
                        ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
        """Kernels grouped by the bytes they move in states built on ``partition``: ``(int64[kernels], each
        kernel's class; (row, byte class, count, rows))``, the sparse matrix of how many of each byte class
        (``CommunicationModel.byte_classes``) a kernel of a class (row) moves, as ``int64[entries]``,
        ``int64[entries]``, ``float64[entries]`` and the number of kernel classes. Kept for the last partition
        asked for."""
        cached = self._kernel_class_cache
        if cached is not None and cached[0] is partition:
            return cached[1]
        plan = self.plan
        value_class = self.communication.byte_classes(partition).value_class
        class_count = int(value_class.max()) + 1 if len(value_class) else 0
        read_kernel, _, read_value = plan.reads
        write_kernel, _, write_value = plan.writes
        scratch_kernel, scratch_value, scratch_scale = plan.scratch
        kernels = np.concatenate((read_kernel, write_kernel, scratch_kernel)).astype(np.int64)
        classes = value_class[np.concatenate((read_value, write_value, scratch_value)).astype(np.int64)]
        weights = np.concatenate((np.ones(len(read_kernel) + len(write_kernel)), 2.0 * scratch_scale))
        cells, inverse = np.unique(kernels * class_count + classes, return_inverse=True)
        sums = np.bincount(inverse.ravel(), weights=weights, minlength=len(cells))
        cell_kernel, cell_class = cells // max(class_count, 1), cells % max(class_count, 1)
        bounds = np.searchsorted(cell_kernel, np.arange(len(plan.kernels) + 1))
        kernel_class = np.empty(len(plan.kernels), dtype=np.int64)
        rows: dict[tuple, int] = {}
        classes_list, sums_list = cell_class.tolist(), sums.tolist()
        for k in range(len(plan.kernels)):
            start, end = int(bounds[k]), int(bounds[k + 1])
            key = (tuple(classes_list[start:end]), tuple(sums_list[start:end]))
            kernel_class[k] = rows.setdefault(key, len(rows))
        move_row, move_class, move_count = [], [], []
        for (row_classes, row_sums), index in rows.items():
            move_row += [index] * len(row_classes)
            move_class += row_classes
            move_count += row_sums
        moves = (np.asarray(move_row, dtype=np.int64), np.asarray(move_class, dtype=np.int64),
                 np.asarray(move_count, dtype=np.float64), len(rows))
        self._kernel_class_cache = (partition, (kernel_class, moves))
        return kernel_class, moves

    def kernel_times(self, state: ShardingState, value_bytes: np.ndarray | None = None, *,
                     class_bytes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per kernel (one launch): ``(seconds, seconds bound by FLOPs or atomics, seconds bound by bytes)``;
        seconds = the larger bound + the kernel's overhead."""
        at_peak, moved, atomics = self.kernel_work(state, value_bytes, class_bytes=class_bytes)
        compute_time = at_peak / self.hardware.matmul_efficiency + atomics
        memory_time = moved / self.bandwidth
        return np.maximum(compute_time, memory_time) + self.overhead, compute_time, memory_time

    def _absolute(self, state: ShardingState, *, collectives: bool = True) -> AbsoluteCost:
        value_bytes, class_bytes = self.communication.value_and_class_bytes(state)
        seconds, compute_time, memory_time = self.kernel_times(state, value_bytes, class_bytes=class_bytes)
        # With micro-batches, every kernel but the optimizer's runs once per micro-batch.
        repeats = self.repeats if self.microbatches == 1 else self.repeats * self._kernel_runs
        compute_bound = compute_time >= memory_time
        busy_compute = float((np.where(compute_bound, compute_time, 0.0) * repeats).sum())
        busy_memory = float((np.where(compute_bound, 0.0, memory_time) * repeats).sum())
        overheads = float((self.overhead * repeats).sum()) + self.hardware.step_overhead
        item_time = np.bincount(self.top_of_kernel, weights=seconds * self.repeats, minlength=self.item_count)
        table = self.communication.table(state, value_bytes)
        # Collectives over a single device move nothing (an axis of size 1): XLA emits none.
        moving = self._moves[table.axes_mask]
        kind, axes_mask, value, op, operand = (table.kind[moving], table.axes_mask[moving], table.value[moving],
                                               table.op[moving], table.operand[moving])
        nbytes = np.where(kind == ALL_GATHER, table.bytes_out[moving], table.bytes_in[moving]).astype(np.float64)
        # Collectives inside a loop body run there (their exposed part on the loop's item); the others go on the
        # communication stream, combined as XLA's combiners combine them.
        in_loop = self.op_in_loop[op]
        loop_durations = self._durations(kind[in_loop], axes_mask[in_loop], nbytes[in_loop])
        repeated = loop_durations * self.op_repeats[op[in_loop]]
        # What the loop bodies' collectives leave exposed (toast.cost.loops: prefetched, deferred, overlapped in
        # the iteration); without overlap, all of it.
        loop_exposed = self.loop_overlap.exposed(
            seconds, op[in_loop], value[in_loop], operand[in_loop], loop_durations, self._makespan, axes_mask[in_loop],
            folded=self._matmul_folds(seconds, kind[in_loop], axes_mask[in_loop], op[in_loop], operand[in_loop],
                                      loop_durations)) if self.overlap and in_loop.any() else repeated
        np.add.at(item_time, self.item_of_op[op[in_loop]], loop_exposed)  # in order, as a loop adds
        in_loops = _sequential_sum(loop_exposed)
        loop_hidden = max(0.0, _sequential_sum(repeated) - in_loops) * self.microbatches
        loop_masks = axes_mask[in_loop]
        streamed = ~in_loop
        values, ops, is_use = value[streamed], op[streamed], operand[streamed] >= 0
        # A use: ready when the value is, needed by the op using it. A partial result: ready after its producer,
        # needed by its first reader.
        ready = np.where(is_use, self.ready_item[values], self.item_of_op[ops])
        consumer = np.where(is_use, self.consumer_item_of_op[ops], self.first_reader_of_value[values])
        # Collectives folded into the matmul they feed or follow (collective matmul, toast.cost.overlap): the
        # matmul's item takes their exposed part, and they leave the stream.
        folded = np.zeros(len(kind), dtype=bool)
        folded_seconds = folded_exposed = np.zeros(0)
        top_durations = self._durations(kind[streamed], axes_mask[streamed], nbytes[streamed]) \
            if self.collective_matmul is not None else np.zeros(0)
        found = self._matmul_folds(seconds, kind[streamed], axes_mask[streamed], ops, operand[streamed],
                                   top_durations)
        if found is not None:
            kernel, exposed_if = found
            if self.microbatches > 1:  # a gradient's reduction runs in the last micro-batch only: on the stream
                kernel = np.where(self._gradient_value[values] & ~is_use, -1, kernel)
            chosen = folds(kernel, exposed_if, top_durations, slack(item_time, ready, consumer))
            if chosen.any():
                np.add.at(item_time, self.top_of_kernel[kernel[chosen]], exposed_if[chosen])
                folded[np.flatnonzero(streamed)[chosen]] = True
                folded_seconds, folded_exposed = top_durations[chosen], exposed_if[chosen]
                streamed &= ~folded
                values, ops, is_use, ready, consumer = (values[~chosen], ops[~chosen], is_use[~chosen],
                                                        ready[~chosen], consumer[~chosen])
        group = self._combine_groups(kind[streamed], axes_mask[streamed], nbytes[streamed], ready, consumer)
        streams = [self._stream(item_time, kind[streamed], axes_mask[streamed], nbytes[streamed], ready, consumer,
                                group)]
        # The same groups for the memory of the reductions combined (each row its own group where none combine).
        group_of_row = np.full(len(table), -1, dtype=np.int64)
        group_of_row[np.flatnonzero(moving)[streamed]] = group if group is not None else np.arange(streamed.sum())
        if folded.any():  # each its own group
            group_of_row[np.flatnonzero(moving)[folded]] = np.arange(folded.sum()) + int(group_of_row.max()) + 1
        runs = [1.0]
        if self.microbatches > 1:
            # The micro-batches before the last: no optimizer, no gradient reduction (gradients accumulate).
            accumulating = ~(self._gradient_value[values] & ~is_use)
            mb_time = np.where(self._update_items, 0.0, item_time)
            mb_rows = (kind[streamed][accumulating], axes_mask[streamed][accumulating],
                       nbytes[streamed][accumulating], ready[accumulating], consumer[accumulating])
            streams.append(self._stream(mb_time, *mb_rows, self._combine_groups(*mb_rows)))
            runs.append(float(self.microbatches - 1))
        step = compute_busy = self.hardware.step_overhead
        total_comm = 0.0
        # The collectives exposed on the compute stream (loop bodies', folded ones'), every micro-batch.
        in_loops += _sequential_sum(folded_exposed)
        loop_hidden += max(0.0, _sequential_sum(folded_seconds) - _sequential_sum(folded_exposed)) * self.microbatches
        # Per label: the loop bodies' collectives and the folded ones (exposed, every micro-batch), then each
        # stream's.
        label_masks = [loop_masks, axes_mask[folded]]
        label_seconds = [repeated * self.microbatches, folded_seconds * self.microbatches]
        label_late = [loop_exposed * self.microbatches, folded_exposed * self.microbatches]
        on_compute = len(label_late)
        for (makespan, busy, masks, durations, late), times in zip(streams, runs, strict=True):
            step += times * makespan
            compute_busy += times * busy
            total_comm += times * _sequential_sum(durations)
            label_masks.append(masks)
            label_seconds.append(times * durations)
            label_late.append(times * late)
        exposed = step - compute_busy
        if exposed < 1e-12 * max(step, 1.0):  # rounding of the same sums taken in two orders
            exposed, step = 0.0, compute_busy
            label_late = label_late[:on_compute] + [late * 0.0 for late in label_late[on_compute:]]
        all_masks = np.concatenate(label_masks)
        communication = self._by_label(all_masks, np.concatenate(label_seconds), self._axes_label)
        by_level = self._by_label(all_masks, np.concatenate(label_seconds), self._levels_label)
        exposed_by_axes = self._by_label(all_masks, np.concatenate(label_late), self._axes_label)
        in_loops *= self.microbatches
        breakdown = {
            "compute_bound_s": busy_compute,
            "memory_bound_s": busy_memory,
            "launch_overhead_s": overheads,
            "exposed_communication_s": exposed + in_loops,
            "hidden_communication_s": (max(0.0, total_comm - exposed) if total_comm - exposed > 1e-12 * step else 0.0)
            + loop_hidden,
        }
        step = self._host_transfers(step, breakdown, seconds, item_time, value_bytes)
        peak = self._peak_memory(table, value_bytes, group_of_row)
        listed = self.communication.to_list(table) if collectives else []
        launched = len(streams[0][2]) + int(in_loop.sum()) + int(folded.sum())
        return AbsoluteCost(step, compute_busy - in_loops, breakdown, communication, peak, listed, by_level,
                            exposed_by_axes, launched)

    def _matmul_folds(self, seconds: np.ndarray, kind: np.ndarray, axes_mask: np.ndarray, op: np.ndarray,
                      operand: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Per collective: the matmul kernel it can fold into (``-1``: none) and the seconds it then leaves exposed
        (``toast.cost.overlap``); ``None`` where none can (no collective matmul on the profile, or no overlap).

        Args:
          seconds: ``float64[kernels]``, one launch of each kernel.
          kind, axes_mask, op, operand: ``int64[rows]``, the collectives' (``CollectiveTable``).
          durations: ``float64[rows]``, one run of each, seconds.
        """
        if self.collective_matmul is None or not self.overlap or not len(op):
            return None
        kernel = self.collective_matmul.kernels(kind, op, operand)
        if not (kernel >= 0).any():
            return None
        at = np.maximum(kernel, 0)
        return kernel, exposed_seconds(durations, seconds[at] - self.overhead[at], self._mask_devices[axes_mask])

    def _stream(self, item_time: np.ndarray, kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray,
                ready: np.ndarray, consumer: np.ndarray, group: np.ndarray | None,
                ) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray]:
        """One run of the items with the collectives on the communication stream after combining:
        ``(makespan, compute busy seconds, axes masks, durations, exposed seconds)`` (per combined collective;
        the step overhead not included). Without overlap the collectives run on the compute stream. ``group``:
        the rows' ``_combine_groups``."""
        kind, masks, sizes, ready, consumer = self._combine(kind, axes_mask, nbytes, ready, consumer, group)
        durations = self._durations(kind, masks, sizes)
        busy = float(item_time.sum())
        if not self.overlap:
            return busy + _sequential_sum(durations), busy, masks, durations, durations
        makespan, late = self._makespan(item_time, consumer, ready, durations, masks)
        return makespan, busy, masks, durations, late

    @staticmethod
    def _by_label(axes_mask: np.ndarray, seconds: np.ndarray, labels: list[str]) -> dict[str, float]:
        """Seconds per label of the axes masks (``labels[mask]``: an axis set ``"batch+model"`` or the levels
        ``"nvlink+infiniband"``), in order of first appearance, each sum taken in row order. ``axes_mask``:
        ``int64[collectives]``; ``seconds``: ``float64[collectives]``."""
        if not len(axes_mask):
            return {}
        sums = np.bincount(axes_mask, weights=seconds, minlength=256).tolist()  # adds in row order
        present = np.flatnonzero(np.bincount(axes_mask, minlength=256)).tolist()  # a few axis sets
        if len(present) > 1:
            present.sort(key=lambda mask: int(np.argmax(axes_mask == mask)))  # by first row
        found: dict[str, float] = {}
        for mask in present:
            found[labels[mask]] = found.get(labels[mask], 0.0) + sums[mask]
        return found

    def _durations(self, kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """``float64[rows]``: seconds of collectives of kinds ``kind`` (codes of ``KINDS``) over ``axes_mask``
        moving ``nbytes`` (nccl-tests' size) each: the fastest algorithm of each."""
        latency = self._candidate_latency[kind, axes_mask]  # [rows, candidates]
        per_byte = self._candidate_per_byte[kind, axes_mask]
        return (latency + per_byte * nbytes[:, None]).min(axis=1)

    def _combine(self, kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray, ready: np.ndarray,
                 consumer: np.ndarray, group: np.ndarray | None,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The collectives as XLA's combiners leave them, ``group`` being their ``_combine_groups``: a group is one
        collective of the summed size, ready with its last member and due at its first consumer.

        Returns ``(kind, axes_mask, nbytes, ready, consumer)`` of the collectives after combining."""
        if group is None:
            return kind, axes_mask, nbytes, ready, consumer
        count = int(group.max()) + 1
        first = np.full(count, len(group), dtype=np.int64)
        np.minimum.at(first, group, np.arange(len(group)))
        combined_ready = np.full(count, -2, dtype=np.int64)
        np.maximum.at(combined_ready, group, ready)
        combined_due = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(combined_due, group, consumer)
        return (kind[first], axes_mask[first], np.bincount(group, weights=nbytes, minlength=count), combined_ready,
                combined_due)

    def _combine_groups(self, kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray, ready: np.ndarray,
                        consumer: np.ndarray) -> np.ndarray | None:
        """``int64[rows]``: the group of each collective as XLA's all-reduce, all-gather and reduce-scatter
        combiners combine them: of one kind over one axis set, taken in the order their operands are ready, each
        joins the one before while neither depends on the other (it is ready before the group's first consumer)
        and the group stays within the profile's ``combine_threshold`` bytes. All-to-alls and collective-permutes
        stay alone. None when no two combine."""
        threshold = self.hardware.combine_threshold
        if len(kind) < 2 or threshold <= 0:
            return None
        order = np.lexsort((consumer, ready, axes_mask, kind))
        group = np.empty(len(order), dtype=np.int64)
        current, group_kind, group_mask, group_bytes, group_due = -1, -1, -1, 0.0, 0
        combinable = (kind != ALL_TO_ALL) & (kind != COLLECTIVE_PERMUTE)
        for row, row_kind, row_mask, row_bytes, row_ready, row_due, can in zip(
                order.tolist(), kind[order].tolist(), axes_mask[order].tolist(), nbytes[order].tolist(),
                ready[order].tolist(), consumer[order].tolist(), combinable[order].tolist(), strict=True):
            if (can and row_kind == group_kind and row_mask == group_mask and row_ready < group_due
                    and group_bytes + row_bytes <= threshold):
                group_bytes += row_bytes
                if row_due < group_due:
                    group_due = row_due
            else:
                current += 1
                group_kind, group_mask, group_bytes, group_due = (row_kind, row_mask, row_bytes, row_due) if can \
                    else (-1, -1, 0.0, 0)
            group[row] = current
        return None if current + 1 == len(order) else group

    @staticmethod
    def _makespan(item_time: np.ndarray, consumer: np.ndarray, ready: np.ndarray, duration: np.ndarray,
                  axes_mask: np.ndarray) -> tuple[float, np.ndarray]:
        """Both streams' makespan: items back to back on the compute stream, each collective on the
        communication stream from max(its operand ready, stream free), its consumer waiting for it.

        Args:
          item_time: ``float64[items]``, seconds of each top-level item on the compute stream.
          consumer: ``int64[collectives]``, the item that needs each collective's result.
          ready: ``int64[collectives]``, the item after which its operand is ready (-1: at the start).
          duration: ``float64[collectives]``, seconds.
          axes_mask: ``int64[collectives]``, each one's mesh axes.

        Returns:
          ``(seconds, exposed)``: the makespan, and ``float64[collectives]``, the part of the step each
          collective adds (the waits it causes, and for the last, the stream running past the compute). The
          stream takes collectives in ready order, then consumer order (XLA's latency-hiding scheduler starts
          each as soon as its operand is ready, and the stream runs them in the order they start); a wait of
          the compute stream for a collective delays every item from its consumer on, and so the operands
          made there.
        """
        starts = np.concatenate(([0.0], np.cumsum(item_time)))
        total = float(starts[-1])
        exposed = np.zeros(len(duration))
        if not len(duration):
            return total, exposed
        order = np.lexsort((axes_mask, consumer, ready))
        consumer, ready, duration = consumer[order], ready[order], duration[order]
        # Collectives with one ready item, one consumer and one axis set run back to back as one: the stream
        # starts the first at the same time either way, and the consumer waits for the last.
        first = np.flatnonzero(np.concatenate(([True], (consumer[1:] != consumer[:-1]) | (ready[1:] != ready[:-1])
                                               | (axes_mask[order][1:] != axes_mask[order][:-1]))))
        rows = order[first]  # the collective each merged row is reported as
        if len(first) < len(duration):
            consumer, ready, duration = consumer[first], ready[first], np.add.reduceat(duration, first)
        # Items counted from 1 (0: before the first item, when arguments are ready).
        consumer, ready = consumer + 1, ready + 1
        made_at = starts[ready]  # before any wait of the compute stream
        # When the consumer starts without waits; never waits (inf) if it makes the operand too (a loop).
        needed_at = np.where(ready < consumer, starts[np.minimum(consumer - 1, len(item_time))], np.inf)
        # The compute stream's delay at an item is the largest lateness of the collectives consumed at or
        # before it (waits shift one timeline, so they do not add up): known here once their consumer is at or
        # before the ready item of the collective at hand.
        pending: list[tuple[int, float, int]] = []  # (consumer, lateness, row) of collectives consumed ahead
        delay = 0.0
        comm_free = 0.0
        added = [0.0] * len(rows)
        for index, (row_ready, row_consumer, ready_time, needed, seconds) in enumerate(zip(
                ready.tolist(), consumer.tolist(), made_at.tolist(), needed_at.tolist(), duration.tolist(),
                strict=True)):
            while pending and pending[0][0] <= row_ready:
                _, late, late_row = heapq.heappop(pending)
                if late > delay:
                    added[late_row] += late - delay
                    delay = late
            ready_time += delay
            if ready_time > comm_free:
                comm_free = ready_time
            comm_free += seconds
            if comm_free > needed:
                heapq.heappush(pending, (row_consumer, comm_free - needed, index))
        for _, late, late_row in sorted(pending):
            if late > delay:
                added[late_row] += late - delay
                delay = late
        if comm_free > total + delay:  # the stream runs on after the last item
            added[-1] += comm_free - (total + delay)
        exposed[rows] = added
        return max(total + delay, comm_free), exposed

    def _init_host_transfers(self) -> None:
        """What the host link's streams need, once per program: which buffers take device memory, and per top-level
        loop holding copies between device and host memory (``KernelPlan.transfers``) its item, its trip count and
        its body's kernels in order."""
        plan = self.plan
        self._on_device = ~plan.host_value[plan.buffers]
        self._outer_loop_of_kernel = np.asarray([plan.outermost_loop(k.ops[-1]) for k in plan.kernels],
                                                dtype=np.int64)
        self._transfer_loops: dict[int, tuple[int, int, np.ndarray]] = {}
        for transfer in plan.transfers:
            if transfer.loop >= 0 and transfer.loop not in self._transfer_loops:
                body = np.flatnonzero(self._outer_loop_of_kernel == transfer.loop)
                item = int(self.top_of_kernel[body[0]]) if len(body) else -1
                self._transfer_loops[transfer.loop] = (item, plan.loops[transfer.loop].trip_count, body)

    def _host_transfers(self, step: float, breakdown: dict[str, float], seconds: np.ndarray, item_time: np.ndarray,
                        value_bytes: np.ndarray) -> float:
        """The step time with the copies between device and host memory (``KernelPlan.transfers``) added where the
        step waits for them; sets ``breakdown``'s ``exposed_host_transfer_s`` and ``hidden_host_transfer_s``.

        Each copy moves its value's local bytes at the profile's ``host_bandwidth`` x ``host_efficiency``, once per
        run of its loop body, as an async copy on the host link, one stream per direction (PCIe is full duplex),
        each taking copies in the order they become ready. A copy to the host starts once its value is made and only
        the step's end waits for it. A copy back starts where the program reaches it (after the kernel before it: a
        remat fetch follows the optimization barrier that waits for the backward pass; XLA's scheduler hoists it no
        further) once its data is on the host (the copies to the host of that data done), overlaps the kernels up to
        its first reader, and that kernel waits for it, delaying the compute stream from there on. In a loop body
        the copies run iteration by iteration, placed by the body's kernel times. The compute stream's timeline here
        is its kernels' (``item_time``) without the waits for collectives: the two waits add. ``overlap=False`` runs
        the copies on the compute stream.

        Args:
          step: the step time without the copies, seconds.
          seconds: ``float64[kernels]``, each kernel's seconds per launch.
          item_time: ``float64[items]``, each top-level item's seconds on the compute stream.
          value_bytes: ``int64[values]``, each value's bytes on one device.
        """
        exposed, busy = self._host_link(seconds, item_time, value_bytes) if self.plan.transfers else (0.0, 0.0)
        runs = float(self.microbatches)  # every micro-batch offloads and fetches its own activations
        breakdown["exposed_host_transfer_s"] = exposed * runs
        breakdown["hidden_host_transfer_s"] = (busy - exposed) * runs
        return step + exposed * runs

    def _host_link(self, seconds: np.ndarray, item_time: np.ndarray, value_bytes: np.ndarray) -> tuple[float, float]:
        """``(exposed, busy)``: the seconds one run of the program waits for its host copies, and their total."""
        plan, bandwidth = self.plan, self.hardware.host_bandwidth * self.hardware.host_efficiency
        starts = np.concatenate(([0.0], np.cumsum(item_time)))
        total = float(starts[-1])
        # Per loop holding copies: its iteration's length and each body kernel's start and end within it.
        within: dict[int, tuple[float, dict[int, tuple[float, float]]]] = {}
        for loop, (item, trips, body) in self._transfer_loops.items():
            per_iteration = seconds[body] * self.repeats[body] / trips
            ends = np.cumsum(per_iteration)
            length = float(item_time[item]) / trips if item >= 0 else 0.0
            scale = length / float(ends[-1]) if len(ends) and ends[-1] > 0 else 0.0
            within[loop] = (length, {k: (float((end - t) * scale), float(end * scale))
                                     for k, end, t in zip(body.tolist(), ends.tolist(), per_iteration.tolist(),
                                                          strict=True)})

        def at(kernel: int, loop: int, iteration: int, end: bool) -> float:
            """When ``kernel`` starts (ends) in ``iteration`` of ``loop``, or as a whole (a kernel outside it)."""
            item = int(self.top_of_kernel[kernel])
            if loop >= 0 and self._outer_loop_of_kernel[kernel] == loop:
                length, offsets = within[loop]
                return float(starts[item]) + iteration * length + offsets[kernel][1 if end else 0]
            return float(starts[item + 1] if end else starts[item])

        events: list[tuple[float, int, float, float, bool, int]] = []  # (ready, order, due, seconds, to_host, data)
        offloaded: dict[int, float] = {}  # host data -> when the last offload into it so far is ready
        for transfer in plan.transfers:
            loop = transfer.loop
            item, trips, _ = self._transfer_loops[loop] if loop >= 0 else (-1, 1, np.empty(0))
            duration = float(value_bytes[transfer.value]) * transfer.repeats / trips / bandwidth
            for iteration in range(trips):
                begins = float(starts[item]) + iteration * within[loop][0] if item >= 0 else 0.0
                due = math.inf
                ready = max(begins, at(transfer.ready_kernel, loop, iteration, True)
                            if transfer.ready_kernel >= 0 else 0.0)
                if transfer.to_host:
                    offloaded[transfer.host_data] = max(offloaded.get(transfer.host_data, 0.0), ready)
                else:  # after the offloads of its data (taken first: ``landed`` then knows when they end)
                    ready = max(ready, offloaded.get(transfer.host_data, 0.0))
                    if transfer.reader_kernel >= 0:
                        due = at(transfer.reader_kernel, loop, iteration, False)
                events.append((ready, len(events), due, duration, transfer.to_host, transfer.host_data))
        busy = _sequential_sum(np.asarray([e[3] for e in events]))
        if not self.overlap:
            return busy, busy
        events.sort()
        free = {True: 0.0, False: 0.0}  # each direction's stream
        landed: dict[int, float] = {}  # host data -> when the offloads into it so far are done
        pending: list[tuple[float, float]] = []  # (due, lateness) of copies the compute stream waits for
        delay = 0.0
        for ready, _, due, duration, to_host, data in events:
            while pending and pending[0][0] <= ready:
                delay = max(delay, heapq.heappop(pending)[1])
            begin = max(ready + delay, free[to_host], 0.0 if to_host else landed.get(data, 0.0))
            free[to_host] = end = begin + duration
            if to_host:
                landed[data] = max(landed.get(data, 0.0), end)
            elif end > due:
                heapq.heappush(pending, (due, end - due))
        for _, late in pending:
            delay = max(delay, late)
        return max(total + delay, free[True], free[False]) - total, busy

    def live_at_peak(self, state: ShardingState, *, top: int = 5) -> list[LiveBuffer]:
        """The ``top`` largest buffers live when the peak is reached (largest first)."""
        value_bytes = self.communication.value_bytes(state)
        sizes = value_bytes[self.plan.buffers] * self._on_device
        delta = self._live_delta(sizes, self.communication.table(state, value_bytes),
                                 value_bytes=value_bytes) + self._scratch_delta(value_bytes)
        at = int(np.argmax(np.cumsum(delta)))
        born, dies = self.buffer_born, self.buffer_dies
        live = np.flatnonzero((born <= at) & (dies > at) & self._on_device)
        order = live[np.argsort(-sizes[live], kind="stable")][:top]
        program = self.model.analysis.program
        found = []
        for index in order.tolist():
            value = program.values[int(self.plan.buffers[index])]
            found.append(LiveBuffer(value.id, value.name, value.shape, value.dtype, int(sizes[index]), value.loc))
        return found

    def _live_delta(self, sizes: np.ndarray, collectives: CollectiveTable,
                    group_of_row: np.ndarray | None = None, *, value_bytes: np.ndarray | None = None) -> np.ndarray:
        """Bytes allocated (+) and freed (-) at each position (kernel index + 1; 0 before the first): every
        buffer over its live range, every value resharded for its uses (gathered parameters, Figure 5b's
        k) as a second copy from its first such use to its last, and the results of reductions while they run
        (``_reduction_delta``). A halo exchange's rows live while their op runs, and with them (given
        ``value_bytes``) the operand's local shard once more: XLA concatenates the two into a buffer of its own."""
        positions = len(self.plan.kernels) + 3
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
        delta = (np.bincount(self.buffer_born, weights=sizes, minlength=positions)
                 - np.bincount(self.buffer_dies, weights=sizes, minlength=positions)
                 + np.bincount(self.kernel_position_of_op[used_by] + 1, weights=copy_bytes, minlength=positions)
                 - np.bincount(self.kernel_position_of_op[last_user] + 2, weights=copy_bytes, minlength=positions)
                 + self._reduction_delta(collectives, positions, group_of_row))
        return delta.astype(np.int64)

    def _reduction_delta(self, collectives: CollectiveTable, positions: int,
                         group_of_row: np.ndarray | None = None) -> np.ndarray:
        """``float64[positions]``: bytes allocated (+) and freed (-) by the reductions of partial results
        (all-reduce, reduce-scatter). XLA writes a reduction's result into a buffer of its own, so while it runs
        its input and its result are both live (a value keeps one buffer here, which the result then takes over);
        reductions a combiner joins (``_combine_groups``) run as one, after their last member's producer, with
        all their results live at once. Each is counted during the kernel that makes its (last) input.
        ``group_of_row``: each streamed row's combining group, as the step time found them (else found here)."""
        rows = self._moves[collectives.axes_mask] & (collectives.operand < 0) & (
            (collectives.kind == ALL_REDUCE) | (collectives.kind == REDUCE_SCATTER))
        if not rows.any():
            return np.zeros(positions)
        op, result_bytes = collectives.op[rows], collectives.bytes_out[rows]
        position = self.kernel_position_of_op[op] + 1
        streamed = ~self.op_in_loop[op]  # a loop body's reductions run there, one at a time
        if streamed.sum() > 1:
            group = group_of_row[np.flatnonzero(rows)[streamed]] if group_of_row is not None else self._combine_groups(
                collectives.kind[rows][streamed], collectives.axes_mask[rows][streamed],
                collectives.bytes_in[rows][streamed].astype(np.float64), self.item_of_op[op[streamed]],
                self.first_reader_of_value[collectives.value[rows][streamed]])
            if group is not None:
                last = np.zeros(int(group.max()) + 1, dtype=np.int64)
                np.maximum.at(last, group, position[streamed])
                position[streamed] = last[group]
        return (np.bincount(position, weights=result_bytes, minlength=positions)
                - np.bincount(position + 1, weights=result_bytes, minlength=positions))

    def _scratch_delta(self, value_bytes: np.ndarray) -> np.ndarray:
        """Bytes allocated (+) and freed (-) at each position, as ``_live_delta``, by the kernels' scratch
        buffers (live during their kernel only)."""
        positions = len(self.plan.kernels) + 3
        kernel, value, scale = self.plan.scratch
        if not len(kernel):
            return np.zeros(positions, dtype=np.int64)
        sizes = (value_bytes[value] * scale).astype(np.int64)
        return (np.bincount(kernel + 1, weights=sizes, minlength=positions)
                - np.bincount(kernel + 2, weights=sizes, minlength=positions)).astype(np.int64)

    def memory_timeline(self, state: ShardingState) -> np.ndarray:
        """``int64[kernels + 3]``: bytes live on one device at each position (0: the arguments, before the
        first kernel; k + 1: during kernel k; then the outputs), before donated buffers are reused."""
        value_bytes = self.communication.value_bytes(state)
        return self._timeline(self.communication.table(state, value_bytes), value_bytes)

    def _timeline(self, collectives: CollectiveTable, value_bytes: np.ndarray, donated: Sequence[int] = (),
                  group_of_row: np.ndarray | None = None) -> np.ndarray:
        sizes = value_bytes[self.plan.buffers] * self._on_device  # a buffer in host memory takes no device memory
        if donated:
            sizes = sizes.copy()
            sizes[[self._buffer_index[v] for v in donated]] = 0
        return np.cumsum(self._live_delta(sizes, collectives, group_of_row, value_bytes=value_bytes)
                         + self._scratch_delta(value_bytes))

    def _peak_memory(self, collectives: CollectiveTable, value_bytes: np.ndarray,
                     group_of_row: np.ndarray | None = None) -> int:
        donated = self._donated_outputs(value_bytes) if self.donate else []
        return int(self._timeline(collectives, value_bytes, donated, group_of_row).max())

    def _donated_outputs(self, value_bytes: np.ndarray) -> list[int]:
        """The outputs (buffer roots) written into a donated argument's buffer, which so take no memory of their
        own: each donated argument serves at most one output of the same size (XLA's input-output aliasing)."""
        program = self.model.analysis.program
        free: dict[int, int] = {}
        for index in self.donate:
            size = int(value_bytes[program.arguments[index]])
            free[size] = free.get(size, 0) + 1
        donated = []
        arguments = {int(self.plan.root[v]) for v in program.arguments}
        for value_id in dict.fromkeys(int(self.plan.root[v]) for v in program.results):
            if value_id in arguments or value_id not in self._buffer_index:
                continue
            size = int(value_bytes[value_id])
            if free.get(size, 0) > 0:
                free[size] -= 1
                donated.append(value_id)
        return donated


def _sequential_sum(values: np.ndarray) -> float:
    """The sum of ``float64[n]`` added left to right (as a Python loop adds; ``np.sum`` pairs terms)."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0
