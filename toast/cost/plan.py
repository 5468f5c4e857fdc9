"""What the cost model knows of one program, mesh and hardware before it sees a state: the frozen ``CostPlan``.

``cost_plan`` builds it once (linear in the program); pricing a state (``toast.cost.pricing``), scheduling its
kernels and collectives (``toast.cost.schedule``) and laying out its memory (``toast.cost.memory``) are pure
functions of the plan and the state. ``toast.cost.model.CostModel`` holds one and evaluates states with them.

The plan's parts, each a frozen dataclass of arrays:

- ``CollectivePricing``: per mesh axes mask, its group's span and its collective algorithms' costs.
- ``KernelPricing``: per kernel, its repeats and launch overhead, and what its FLOPs and atomics are priced by.
- ``Schedule``: the top-level items the compute stream runs (kernels outside loops, whole top-level loops), where
  each op's work and reads fall among them, what runs once however many micro-batches, and the loops holding
  copies between device and host memory.
- ``MemoryLayout``: each buffer's live range in kernel positions and each op's position.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from toast.analysis.kernel_semantics import KernelClass
from toast.cost.collectives import KINDS, CommunicationModel
from toast.cost.hardware import Hardware
from toast.cost.kernels import HANDS_ON, KernelPlan
from toast.cost.loops import LoopOverlap
from toast.cost.network import Algorithm, GroupSpan, algorithms, mesh_group_span
from toast.cost.overlap import CollectiveMatmul
from toast.cost.repeats import ItemRuns, item_runs
from toast.errors import ToastError
from toast.frontend.ir import Program
from toast.sharding.state import ShardingModel

# Axes masks are bytes: a mesh has at most 8 axes.
MASKS = 256


@dataclass(frozen=True, slots=True)
class CollectivePricing:
    """Per mesh axes mask (``int64`` bit k: mesh axis k; masks beyond the mesh's axes have no span).

    Attributes:
      spans: each mask's device group (``toast.cost.network.mesh_group_span``), ``None`` beyond the mesh.
      latency: ``float64[kinds, masks, candidates]``, per collective kind (codes of ``KINDS``) and mask, its
        algorithms' latency in seconds (padding: ``inf``; a mask of no span: one candidate of 0 s).
      per_byte: ``float64[kinds, masks, candidates]``, their seconds per byte (padding: 0).
      latency_columns, per_byte_columns: ``float64[candidates, kinds * masks]``, the same, a candidate a row (index
        ``kind * MASKS + mask``): a state's collectives are priced a candidate at a time, with 1-D takes.
      devices: ``int64[masks]``, the devices in each group (1 beyond the mesh).
      moves: ``bool[masks]``, whether a group spans more than one device (else XLA emits no collective).
      levels_label: per mask, the interconnect levels it crosses (``"nvlink+infiniband"``; ``""``: one device).
      axes_label: per mask, its axes joined by ``+`` (``"batch+model"``).
    """

    spans: tuple[GroupSpan | None, ...]
    latency: np.ndarray
    per_byte: np.ndarray
    latency_columns: np.ndarray
    per_byte_columns: np.ndarray
    devices: np.ndarray
    moves: np.ndarray
    levels_label: tuple[str, ...]
    axes_label: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KernelPricing:
    """Per kernel, what its time is made of.

    Attributes:
      repeats: ``float64[kernels]``, runs per step (loop bodies once per iteration).
      overhead: ``float64[kernels]``, launch overhead per run, seconds (``matmul_overhead`` for library calls).
      bandwidth: bytes per second a kernel moves (HBM bandwidth x efficiency).
      fixed_at_peak: ``float64[kernels]``, seconds at peak of FLOPs no split changes (a kernel's own estimate
        with no FLOP name).
      flop_names: ``int64[entries]``, the names whose local sizes multiply into each FLOP-counted op's FLOPs,
        op after op; ``flop_starts``: ``int64[ops counted]``, where each op's names start.
      flop_peaks: ``float64[ops counted]``, FLOP/s at peak for each op's operand type.
      flop_scales: ``float64[ops counted]``, each op's FLOPs per product of its names' sizes.
      matmul_kernels: ``int64[ops counted]``, the kernel each op runs in.
      scatter_kernels: ``int64[updates]``, the kernel of each scatter's update operand; ``scatter_values``:
        ``int64[updates]``, the update value; ``scatter_rates``: ``float64[updates]``, atomic updates per second
        at its element width.
      kernel_count: kernels launched per step.
    """

    repeats: np.ndarray
    overhead: np.ndarray
    bandwidth: float
    fixed_at_peak: np.ndarray
    flop_names: np.ndarray
    flop_starts: np.ndarray
    flop_peaks: np.ndarray
    flop_scales: np.ndarray
    matmul_kernels: np.ndarray
    scatter_kernels: np.ndarray
    scatter_values: np.ndarray
    scatter_rates: np.ndarray
    kernel_count: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """The compute stream's items and where the program's work and reads fall among them.

    Attributes:
      top_of_kernel: ``int64[kernels]``, each kernel's top-level item (a kernel outside loops, or the whole
        top-level loop holding it).
      item_count: top-level items.
      item_of_op: ``int64[ops]``, the item each op's work belongs to (an op without a kernel: the next
        kernel's; ``item_count`` after the last).
      op_in_loop: ``bool[ops]``, the op lies in a loop body.
      op_repeats: ``float64[ops]``, runs of each op per step (the trip counts of the loops around it).
      consumer_item_of_op: ``int64[ops]``, the item that needs what each op reads (its own; for an op without a
        kernel, the first item from there on reading its results' or operands' buffers).
      first_reader: ``int64[values]``, per buffer root, the first item after its producer's that reads it.
      ready_item: ``int64[values]``, the item making each value's buffer (``-1``: an argument).
      first_reader_of_value: ``int64[values]``, ``first_reader`` of each value's buffer.
      update_items: ``bool[items]``, the items running once per step however many micro-batches (the
        optimizer's).
      kernel_runs: ``float64[kernels]``, runs per step with micro-batches (1 for the optimizer's).
      gradient_value: ``bool[values]``, a partial result an update reads (directly or through reshapes,
        transposes and converts): reduced once, in the last micro-batch.
      outer_loop_of_kernel: ``int64[kernels]``, the top-level loop holding each kernel (``-1``: none).
      transfer_loops: per top-level loop holding copies between device and host memory, ``(item, trip count,
        int64[its kernels])``.
      runs: the runs of items whose kernels repeat (``toast.cost.repeats.item_runs``): repeated layers.
    """

    top_of_kernel: np.ndarray
    item_count: int
    item_of_op: np.ndarray
    op_in_loop: np.ndarray
    op_repeats: np.ndarray
    consumer_item_of_op: np.ndarray
    first_reader: np.ndarray
    ready_item: np.ndarray
    first_reader_of_value: np.ndarray
    update_items: np.ndarray
    kernel_runs: np.ndarray
    gradient_value: np.ndarray
    outer_loop_of_kernel: np.ndarray
    transfer_loops: Mapping[int, tuple[int, int, np.ndarray]]
    runs: ItemRuns


@dataclass(frozen=True, slots=True)
class MemoryLayout:
    """The buffers in memory timeline positions (0: the arguments, before the first kernel; k + 1: during kernel
    k; then the outputs).

    Attributes:
      buffer_born, buffer_dies: ``int64[buffers]``, the positions each buffer (``KernelPlan.buffers``) is
        allocated at and freed at.
      buffer_index: buffer root value id -> its index in ``KernelPlan.buffers``.
      kernel_position_of_op: ``int64[ops]``, the kernel each op runs in (an op without one: the next kernel).
      on_device: ``bool[buffers]``, the buffer takes device memory (not in host memory).
    """

    buffer_born: np.ndarray
    buffer_dies: np.ndarray
    buffer_index: Mapping[int, int]
    kernel_position_of_op: np.ndarray
    on_device: np.ndarray


@dataclass(frozen=True, slots=True)
class CostPlan:
    """Everything about one program, mesh, hardware and settings that no state changes (``cost_plan``).

    Attributes:
      model: the sharding model (analysis and mesh).
      hardware: the accelerator profile.
      memory_penalty: the constant C of MP(s).
      device_memory: DM, bytes per device.
      overlap: whether collectives overlap compute (a communication stream).
      donate: indices of ``@main``'s arguments whose buffers the outputs may reuse, sorted.
      microbatches: micro-batches per step.
      reuse: price alike ops once per class and jump over repeated layers where a state repeats them
        (``toast.cost.class_table``, ``toast.cost.repeats``): the same cost (``toast.cost.model.absolute_cost`` says
        how exactly) in time that grows with the program's distinct layers, not its depth; ``False``: every op
        priced and every collective scanned (the reference the fast path is tested against).
      communication: the collectives a state needs (``toast.cost.collectives``).
      kernel_plan: the kernels, buffers and loops (``toast.cost.kernels``).
      loop_overlap: the loops' facts for pricing their bodies' collectives (``toast.cost.loops``).
      collective_matmul: the matmuls collectives fold into (``toast.cost.overlap``), ``None`` where the profile
        runs no collective matmul.
      collectives: ``CollectivePricing``.
      pricing: ``KernelPricing``.
      schedule: ``Schedule``.
      memory: ``MemoryLayout``.
    """

    model: ShardingModel
    hardware: Hardware
    memory_penalty: float
    device_memory: float
    overlap: bool
    donate: tuple[int, ...]
    microbatches: int
    reuse: bool
    communication: CommunicationModel
    kernel_plan: KernelPlan
    loop_overlap: LoopOverlap
    collective_matmul: CollectiveMatmul | None
    collectives: CollectivePricing
    pricing: KernelPricing
    schedule: Schedule
    memory: MemoryLayout


def cost_plan(model: ShardingModel, hardware: Hardware, *, memory_penalty: float = 10.0,
              device_memory: float | None = None, overlap: bool = True, donate: Iterable[int] = (),
              microbatches: int = 1, reuse: bool = True) -> CostPlan:
    """The ``CostPlan`` of ``model`` on ``hardware`` (settings as ``toast.cost.model.CostModel`` takes them).

    Raises:
      ToastError: micro-batches not a whole number from 1, a device memory not finite and above 0, a donated
        argument the program does not have.
    """
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ToastError(f"micro-batches {microbatches!r}: give a whole number, 1 or more")
    memory_bytes = float(device_memory if device_memory is not None else hardware.hbm_bytes)
    if not (math.isfinite(memory_bytes) and memory_bytes > 0):  # NaN: every peak would fit
        raise ToastError(f"device memory {device_memory!r}: give the memory per device in bytes, a finite number "
                         "above 0")
    communication = CommunicationModel(model)
    collectives = _collective_pricing(model, hardware)
    analysis = model.analysis
    program = analysis.program
    plan = KernelPlan(program, semantics=analysis.kernel_semantics)
    loop_overlap = LoopOverlap(plan, keeps_elements=analysis.kernel_semantics.keeps_elements)
    # The matmuls collectives fold into where the compiler runs collective matmuls (toast.cost.overlap).
    collective_matmul = CollectiveMatmul(plan, analysis.flop_names) if hardware.collective_matmul else None
    donated = tuple(sorted(set(donate)))
    for index in donated:
        if not 0 <= index < len(program.arguments):
            raise ToastError(f"donated argument {index}: the program has arguments 0..{len(program.arguments) - 1}")
    pricing = _kernel_pricing(model, hardware, plan)
    schedule = _schedule(model, plan, microbatches)
    return CostPlan(model, hardware, memory_penalty, memory_bytes, overlap, donated, microbatches, reuse, communication,
                    plan, loop_overlap, collective_matmul, collectives, pricing, schedule, _memory_layout(plan))


def _collective_pricing(model: ShardingModel, hardware: Hardware) -> CollectivePricing:
    """Per mesh axes mask: its span and, per collective kind, its algorithms' latency and seconds per byte."""
    mesh = model.mesh
    # Every axes mask's span, and per (kind, mask) its algorithms as affine candidates (latency, seconds per
    # byte), padded with (inf, 0); masks of at most one device move nothing (one candidate of 0 s).
    spans = [mesh_group_span(list(mesh.axes), mesh.mask_axes(mask), hardware, slices=mesh.slices)
             if mask < 1 << len(mesh.axes) else None for mask in range(MASKS)]
    candidates: list[list[list[Algorithm]]] = [
        [list(algorithms(kind, span, hardware)) if span is not None else [] for span in spans]
        for kind in KINDS]
    width = max(1, max(len(found) for per_kind in candidates for found in per_kind))
    latency = np.full((len(KINDS), MASKS, width), np.inf)
    per_byte = np.zeros((len(KINDS), MASKS, width))
    for kind_code, per_kind in enumerate(candidates):
        for mask, found in enumerate(per_kind):
            if not found:
                latency[kind_code, mask, 0] = 0.0
            for column, algorithm in enumerate(found):
                latency[kind_code, mask, column] = algorithm.latency
                per_byte[kind_code, mask, column] = algorithm.seconds_per_byte
    devices = np.asarray([span.devices if span is not None else 1 for span in spans], dtype=np.int64)
    levels = tuple(span.levels(hardware) if span is not None and span.devices > 1 else "" for span in spans)
    axes = tuple("+".join(mesh.mask_axes(mask)) for mask in range(MASKS))
    moves = np.asarray([span is not None and span.devices > 1 for span in spans], dtype=bool)
    return CollectivePricing(tuple(spans), latency, per_byte, np.ascontiguousarray(latency.reshape(-1, width).T),
                             np.ascontiguousarray(per_byte.reshape(-1, width).T), devices, moves, levels, axes)


def _kernel_pricing(model: ShardingModel, hardware: Hardware, plan: KernelPlan) -> KernelPricing:
    """Per kernel: its repeats and launch overhead; the FLOP names, peaks and scatter rates it is priced by."""
    analysis = model.analysis
    program = analysis.program
    repeats = np.asarray([k.repeats for k in plan.kernels], dtype=np.float64)
    library = (KernelClass.MATMUL, KernelClass.LIBRARY)  # looked up once: an enum member lookup is slow
    is_library = np.asarray([k.kind in library for k in plan.kernels], dtype=bool)
    overhead = np.where(is_library, hardware.matmul_overhead, hardware.kernel_overhead)
    bandwidth = hardware.hbm_bandwidth * hardware.hbm_efficiency
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
    fixed_at_peak = np.zeros(len(plan.kernels), dtype=np.float64)
    for op_id in sorted(set(analysis.flop_names) | set(analysis.flop_scales)):
        op = program.ops[op_id]
        kernel_index = int(plan.kernel_of_op[op_id])
        if kernel_index < 0 or not op.operands:
            continue
        members = analysis.flop_names.get(op_id, ())
        peak = hardware.matmul_flops(program.values[op.operands[analysis.flop_operands.get(op_id, 0)]].dtype)
        scale = analysis.flop_scales.get(op_id, 2.0)
        if not members:
            fixed_at_peak[kernel_index] += scale / peak
            continue
        starts.append(len(flop_names))
        flop_names.extend(members)
        peaks.append(peak)
        scales.append(scale)
        matmul_kernels.append(kernel_index)
    # Scatter-add rate per update element, by element width.
    scatter_kernels, scatter_values = plan.scatter_updates
    scatter_rates = np.asarray(
        [hardware.scatter_rate(program.values[v].bits) for v in scatter_values.tolist()], dtype=np.float64)
    return KernelPricing(repeats, overhead, bandwidth, fixed_at_peak, np.asarray(flop_names, dtype=np.int64),
                         np.asarray(starts, dtype=np.int64), np.asarray(peaks, dtype=np.float64),
                         np.asarray(scales, dtype=np.float64), np.asarray(matmul_kernels, dtype=np.int64),
                         scatter_kernels, scatter_values, scatter_rates, int(repeats.sum()))


def _schedule(model: ShardingModel, plan: KernelPlan, microbatches: int) -> Schedule:
    """The top-level items (kernels outside loops, whole top-level loops) and where each op falls among them, what
    runs once per step, and the loops holding host copies."""
    program = model.analysis.program
    kernel_count = len(plan.kernels)
    # Top-level schedule: each kernel outside loops is an item; a top-level loop is one item.
    outer_of_kernel = [plan.outermost_loop(kernel.ops[-1]) for kernel in plan.kernels]
    top_of: list[int] = []
    item_keys: list[tuple[str, int]] = []
    item_index: dict[tuple[str, int], int] = {}
    for k, outer in enumerate(outer_of_kernel):
        key = ("loop", outer) if outer >= 0 else ("kernel", k)
        if key not in item_index:
            item_index[key] = len(item_keys)
            item_keys.append(key)
        top_of.append(item_index[key])
    top_of_kernel = np.asarray(top_of, dtype=np.int64).reshape(-1)
    item_count = len(item_keys)
    # The item an op's work belongs to (ops without a kernel: the next kernel's item).
    next_kernel = _next_kernel(plan)
    kernel_of_op = plan.kernel_of_op
    after = top_of_kernel[np.minimum(next_kernel, kernel_count - 1)] if kernel_count else next_kernel
    after = np.where(next_kernel < kernel_count, after, item_count)
    item_of_op = np.where(kernel_of_op >= 0, top_of_kernel[np.maximum(kernel_of_op, 0)] if kernel_count else -1,
                          after)
    op_in_loop = plan.nest.loop_of_op >= 0
    op_repeats = plan.nest.repeats_of_op.astype(np.float64)
    consumer_item_of_op, first_reader, ready_item, first_reader_of_value = _readers(
        program, plan, top_of_kernel, item_count, item_of_op)
    update_items, kernel_runs, gradient_value = _microbatches(model, plan, microbatches, top_of_kernel, item_count)
    outer_loop_of_kernel, transfer_loops = _host_transfer_loops(plan, top_of_kernel, outer_of_kernel)
    runs = item_runs(program, plan, top_of_kernel, item_count)
    return Schedule(top_of_kernel, item_count, item_of_op, op_in_loop, op_repeats, consumer_item_of_op, first_reader,
                    ready_item, first_reader_of_value, update_items, kernel_runs, gradient_value,
                    outer_loop_of_kernel, transfer_loops, runs)


def _readers(program: Program, plan: KernelPlan, top_of_kernel: np.ndarray, item_count: int, item_of_op: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per op and per buffer: the item that needs what it reads, that first reads it, that makes it, and the
    first reader per value: ``(consumer_item_of_op, first_reader, ready_item, first_reader_of_value)``."""
    ops, producer, op_class = program.ops, program.producer, plan.op_class
    # Python lists of the arrays: looked up per read and per op below.
    kernel_at, item_at, root_of = plan.kernel_of_op.tolist(), item_of_op.tolist(), plan.root.tolist()
    top_of = top_of_kernel.tolist()
    # The item that first reads each buffer (partial results wait there for their all-reduce): the first
    # kernel that loads it (a transpose or reshape of a weight gradient has no kernel of its own: the kernel
    # reading through it is the reader), or a loop, branch or terminator that hands it on.
    first_read = [item_count] * len(program.values)
    read_kernel, read_value, _ = plan.reads
    readers = [(top_of[k], root_of[v]) for k, v in zip(read_kernel.tolist(), read_value.tolist(), strict=True)]
    readers.extend((item_at[op.id], root_of[value_id]) for op in ops
                   if kernel_at[op.id] < 0 and op_class[op.id] in HANDS_ON for value_id in op.operands)
    reader_items: dict[int, list[int]] = {}
    for item, r in readers:
        p = producer[r]
        if item > (item_at[p] if p >= 0 else -1):  # after the item making it
            first_read[r] = min(first_read[r], item)
            reader_items.setdefault(r, []).append(item)
    first_reader = np.asarray(first_read, dtype=np.int64).reshape(-1)
    # The item that needs what an op reads: its own; for an op without a kernel (a view, or a cheap op
    # recomputed in its readers) the first kernel from there on that reads its results' or its operands'
    # buffers (use collectives are due there, not at the next kernel). In numpy: each (buffer, reader item) is a
    # key buffer x stride + item (items run to item_count), sorted; an op's buffer's first reader from its item on
    # is the first key at or after buffer x stride + its item, if that key is the buffer's.
    stride = item_count + 1
    keys = np.unique(np.fromiter((r * stride + item for r, items in reader_items.items() for item in items),
                                 dtype=np.int64))
    without_kernel = np.fromiter((k < 0 and c not in HANDS_ON for k, c in zip(kernel_at, op_class, strict=True)),
                                 dtype=bool, count=len(ops))
    chosen = [ops[o] for o in np.flatnonzero(without_kernel).tolist()]
    counts = np.fromiter((len(op.results) + len(op.operands) for op in chosen), dtype=np.int64, count=len(chosen))
    read = np.asarray(plan.root, dtype=np.int64)[np.fromiter(
        (v for op in chosen for v in (*op.results, *op.operands)), dtype=np.int64, count=int(counts.sum()))]
    asking = np.repeat(np.flatnonzero(without_kernel), counts)  # the op of each (op, buffer read) pair
    query = read * stride + item_of_op[asking]
    at = np.searchsorted(keys, query)
    found = keys[np.minimum(at, len(keys) - 1)] if len(keys) else np.full(len(query), -1, dtype=np.int64)
    due = np.where((at < len(keys)) & (found // stride == read), found % stride, item_count)
    consumer_item_of_op = item_of_op.copy()
    consumer_item_of_op[without_kernel] = item_count
    np.minimum.at(consumer_item_of_op, asking, due)
    # Per value (through its buffer's root): the item that makes it (-1: an argument), the first reader.
    root = np.asarray(plan.root, dtype=np.int64)
    made_by = np.asarray(program.producer, dtype=np.int64)[root]
    ready_item = np.where(made_by >= 0, item_of_op[np.maximum(made_by, 0)], -1)
    return consumer_item_of_op, first_reader, ready_item, first_reader[root]


def _microbatches(model: ShardingModel, plan: KernelPlan, microbatches: int, top_of_kernel: np.ndarray,
                  item_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What runs once per step however many micro-batches: the optimizer's kernels (those of the parameters'
    update chains, ``toast.sharding.strategies.update_chains``) and the reduction of the gradients they read
    (``Schedule``'s ``update_items``, ``kernel_runs`` and ``gradient_value``)."""
    program = model.analysis.program
    update_items = np.zeros(item_count, dtype=bool)
    kernel_runs = np.full(len(plan.kernels), float(microbatches))
    gradient_value = np.zeros(len(program.values), dtype=bool)
    if microbatches == 1:
        return update_items, kernel_runs, gradient_value
    from toast.sharding.strategies import update_chains

    update_values = {v for chain in update_chains(model.analysis).values() for v in chain.values}
    update_ops = {program.producer[v] for v in update_values if program.producer[v] >= 0}
    for op_id in update_ops:
        kernel = int(plan.kernel_of_op[op_id])
        if kernel >= 0:
            kernel_runs[kernel] = 1.0
            update_items[top_of_kernel[kernel]] = True
        frontier = [v for v in program.ops[op_id].operands if v not in update_values]
        while frontier:
            value_id = frontier.pop()
            if gradient_value[value_id]:
                continue
            gradient_value[value_id] = True
            producer = program.producer[value_id]
            # Ops between a gradient's matmul and the optimizer that pass it on whole (the rules'
            # keeps_elements: reshape, transpose, convert, ...).
            if producer >= 0 and program.ops[producer].kind in plan.semantics.keeps_elements:
                frontier.extend(program.ops[producer].operands[:1])
    return update_items, kernel_runs, gradient_value


def _host_transfer_loops(plan: KernelPlan, top_of_kernel: np.ndarray, outer_of_kernel: list[int]
                         ) -> tuple[np.ndarray, dict[int, tuple[int, int, np.ndarray]]]:
    """Each kernel's top-level loop (``outer_of_kernel``, as an array), and per top-level loop holding copies between
    device and host memory (``KernelPlan.transfers``) its item, its trip count and its body's kernels in order."""
    outer_loop_of_kernel = np.asarray(outer_of_kernel, dtype=np.int64).reshape(-1)
    transfer_loops: dict[int, tuple[int, int, np.ndarray]] = {}
    for transfer in plan.transfers:
        if transfer.loop >= 0 and transfer.loop not in transfer_loops:
            body = np.flatnonzero(outer_loop_of_kernel == transfer.loop)
            item = int(top_of_kernel[body[0]]) if len(body) else -1
            transfer_loops[transfer.loop] = (item, plan.loops[transfer.loop].trip_count, body)
    return outer_loop_of_kernel, transfer_loops


def _memory_layout(plan: KernelPlan) -> MemoryLayout:
    """Buffer lives and each op's position in the memory timeline (kernel index + 1; 0: the arguments)."""
    kernel_of_op, kernel_count = plan.kernel_of_op, len(plan.kernels)
    next_kernel = _next_kernel(plan)
    # Peak memory: buffer positions shifted by one (arguments at -1).
    return MemoryLayout(buffer_born=plan.buffer_born + 1, buffer_dies=plan.buffer_dies + 2,
                        buffer_index={int(v): i for i, v in enumerate(plan.buffers.tolist())},
                        kernel_position_of_op=np.where(kernel_of_op >= 0, kernel_of_op,
                                                       np.minimum(next_kernel, max(kernel_count - 1, 0))),
                        on_device=~plan.host_value[plan.buffers])


def _next_kernel(plan: KernelPlan) -> np.ndarray:
    """``int64[ops]``: the index of the first kernel at or after each op (``kernels`` after the last)."""
    last_ops = np.asarray([k.ops[-1] for k in plan.kernels], dtype=np.int64)
    return np.searchsorted(last_ops, np.arange(len(plan.program.ops)))
