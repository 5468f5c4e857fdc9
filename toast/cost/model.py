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
  body run there, exposed. The step time is the makespan, plus ``step_overhead`` (launching the program):
  never less than the compute stream's busy time.
- **Collective times.** Alpha-beta ring times over the interconnect level the mesh axes span
  (``../shared/reference/hardware.md`` section 3.1): all-gather and reduce-scatter
  ``(n-1)·alpha + (n-1)/n · S / B`` with S the full bytes; all-reduce twice that; all-to-all
  ``(n-1)·alpha + (n-1)/n · S_local / B``.
- **Peak memory.** Only buffers exist: arguments and results for the whole step (XLA's argument and output
  allocations), every kernel output from its kernel to its last reader, loop-carried values once; a value
  resharded for its uses is a second copy from its collective to its last such use. With donated arguments
  an output reuses an argument's buffer of the same size (``jax.jit(..., donate_argnums=...)``).

The relative cost is ``C(s) = RT(s) + MP(s)`` with ``RT = step time / initial step time`` and
``MP = penalty · (peak − device memory) / initial peak`` when the peak exceeds the device memory, else 0.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from toast.cost.collectives import Collective, CommunicationModel
from toast.cost.hardware import Hardware, InterconnectLevel, axis_levels
from toast.cost.kernels import KernelPlan
from toast.errors import ToastError
from toast.sharding.state import ShardingModel, ShardingState

BREAKDOWN_KEYS = ("compute_bound_s", "memory_bound_s", "launch_overhead_s", "exposed_communication_s",
                  "hidden_communication_s")


@dataclass(frozen=True, slots=True)
class Cost:
    """The estimated cost of one state on one device.

    Attributes:
      step_time_s: simulated step time (the makespan of both streams), seconds.
      compute_s: the compute stream's busy time (kernels, overheads, exposed loop collectives), seconds.
      breakdown: the step time split (seconds): ``compute_bound_s`` (kernels limited by FLOPs or atomics),
        ``memory_bound_s`` (kernels limited by HBM bytes), ``launch_overhead_s`` (per-kernel and per-step
        overheads), ``exposed_communication_s`` (collective time the compute stream waits for); and
        ``hidden_communication_s``, collective time overlapped with compute (not part of the step time).
      communication_s: collective time per mesh axis set (``"model"``, ``"batch+model"``), seconds.
      peak_bytes: peak memory per device, bytes.
      kernels: kernels launched per step (loop bodies once per iteration).
      relative: ``C(s) = RT(s) + MP(s)`` against the unsharded state.
      collectives: the collectives counted.
    """

    step_time_s: float
    compute_s: float
    breakdown: dict[str, float]
    communication_s: dict[str, float]
    peak_bytes: int
    kernels: int
    relative: float
    collectives: tuple[Collective, ...]


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
    """

    def __init__(self, model: ShardingModel, hardware: Hardware, *, memory_penalty: float = 10.0,
                 device_memory: float | None = None, overlap: bool = True, donate: Iterable[int] = ()):
        self.model = model
        self.hardware = hardware
        self.memory_penalty = memory_penalty
        self.device_memory = float(device_memory if device_memory is not None else hardware.hbm_bytes)
        self.overlap = overlap
        self.communication = CommunicationModel(model)
        self.levels: dict[str, InterconnectLevel] = axis_levels(list(model.mesh.axes), hardware)
        self._rings: dict[tuple[str, ...], tuple[int, float, float]] = {}
        analysis = model.analysis
        program = analysis.program
        self.plan = plan = KernelPlan(program, elementwise_ops=analysis.elementwise_ops)
        self.donate = tuple(sorted(set(donate)))
        for index in self.donate:
            if not 0 <= index < len(program.arguments):
                raise ToastError(f"donated argument {index}: the program has arguments 0..{len(program.arguments) - 1}")
        kernel_count = len(plan.kernels)
        self.repeats = np.asarray([k.repeats for k in plan.kernels], dtype=np.float64)
        is_library = np.asarray([k.kind in ("matmul", "library") for k in plan.kernels], dtype=bool)
        self.overhead = np.where(is_library, hardware.matmul_overhead, hardware.kernel_overhead)
        self.bandwidth = hardware.hbm_bandwidth * hardware.hbm_efficiency
        # The names whose local sizes multiply into each op's FLOPs: the rules' flop_name (contractions,
        # and any op a user's rules declare one), priced at the peak of the op's first operand's type.
        flop_names: list[int] = []
        starts: list[int] = []
        peaks: list[float] = []
        matmul_kernels: list[int] = []
        for op_id, members in sorted(analysis.flop_names.items()):
            op = program.ops[op_id]
            kernel_index = int(plan.kernel_of_op[op_id])
            if kernel_index < 0 or not op.operands:
                continue
            starts.append(len(flop_names))
            flop_names.extend(members)
            peaks.append(hardware.matmul_flops(program.values[op.operands[0]].dtype))
            matmul_kernels.append(kernel_index)
        self.flop_names = np.asarray(flop_names, dtype=np.int64)
        self.flop_starts = np.asarray(starts, dtype=np.int64)
        self.flop_peaks = np.asarray(peaks, dtype=np.float64)
        self.matmul_kernels = np.asarray(matmul_kernels, dtype=np.int64)
        # Scatter-add rate per update element, by element width.
        scatter_kernels, scatter_values = plan.scatter_updates
        self.scatter_kernels = scatter_kernels
        self.scatter_values = scatter_values
        self.scatter_rates = np.asarray(
            [hardware.scatter_rate(program.values[v].bits) for v in scatter_values.tolist()], dtype=np.float64)
        self.kernel_count = int(self.repeats.sum())
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
        # The item that first reads each buffer (partial results wait there for their all-reduce).
        first_reader = np.full(len(program.values), self.item_count, dtype=np.int64)
        for op in ops:
            item = int(self.item_of_op[op.id])
            for value_id in op.operands:
                r = int(plan.root[value_id])
                if item > self._producer_item(r):
                    first_reader[r] = min(first_reader[r], item)
        self.first_reader = first_reader
        # The same as Python lists, for the per-collective loop of ``_absolute``.
        self._static_lists = (self.item_of_op.tolist(), self.op_in_loop.tolist(), self.op_repeats.tolist(),
                              plan.root.tolist(), first_reader.tolist())
        # Peak memory: buffer positions shifted by one (arguments at -1).
        self.buffer_born = plan.buffer_born + 1
        self.buffer_dies = plan.buffer_dies + 2
        self.kernel_position_of_op = np.where(kernel_of_op >= 0, kernel_of_op,
                                              np.minimum(next_kernel, max(kernel_count - 1, 0)))
        self.initial = self._absolute(model.initial())

    def _producer_item(self, value_id: int) -> int:
        p = self.model.analysis.program.producer[value_id]
        return int(self.item_of_op[p]) if p >= 0 else -1

    def evaluate(self, state: ShardingState) -> Cost:
        """The cost of ``state``, relative to the unsharded program."""
        absolute = self._absolute(state)
        initial_time, initial_peak = self.initial[0], self.initial[4]
        step, peak = absolute[0], absolute[4]
        relative = step / initial_time if initial_time > 0 else 1.0
        if peak > self.device_memory and initial_peak > 0:
            relative += self.memory_penalty * (peak - self.device_memory) / initial_peak
        return Cost(step_time_s=step, compute_s=absolute[1], breakdown=absolute[2], communication_s=absolute[3],
                    peak_bytes=peak, kernels=self.kernel_count, relative=relative, collectives=tuple(absolute[5]))

    def collective_time(self, collective: Collective) -> float:
        """Alpha-beta ring time of one collective, seconds."""
        return self._collective_seconds(collective.kind, collective.axes, collective.bytes_in, collective.bytes_out)

    def _collective_seconds(self, kind: str, axes: tuple[str, ...], bytes_in: int, bytes_out: int) -> float:
        ring = self._rings.get(axes)
        if ring is None:
            n = math.prod(self.model.mesh.size(a) for a in axes)
            levels = [self.levels[a] for a in axes]
            ring = (n, max(level.latency for level in levels), min(level.bandwidth for level in levels))
            self._rings[axes] = ring
        n, alpha, bandwidth = ring
        if n <= 1:
            return 0.0
        steps = n - 1
        if kind == "all-reduce":
            return 2 * (steps * alpha + steps / n * bytes_in / bandwidth)
        full = bytes_out if kind == "all-gather" else bytes_in  # reduce-scatter: the full input; all-to-all: local
        return steps * alpha + steps / n * full / bandwidth

    def kernel_work(self, state: ShardingState, value_bytes: np.ndarray | None = None,
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per kernel (one launch): ``(FLOPs over the peak of their type, bytes moved, atomic-update
        seconds)``; the first in seconds at 100% of peak, the second in bytes."""
        plan = self.plan
        kernel_count = len(plan.kernels)
        if value_bytes is None:
            value_bytes = self.communication.value_bytes(state)
        value_bytes = value_bytes.astype(np.float64)
        read_kernel, _, read_weight = plan.reads
        write_kernel, _, write_weight = plan.writes
        moved = (np.bincount(read_kernel, weights=value_bytes[read_weight], minlength=kernel_count)
                 + np.bincount(write_kernel, weights=value_bytes[write_weight], minlength=kernel_count))
        at_peak = np.zeros(kernel_count, dtype=np.float64)
        if len(self.flop_names):
            devices = self.model.devices_of_mask[state.masks[self.flop_names]]
            local = (self.model.name_size[self.flop_names] // devices).astype(np.float64)
            flops = 2.0 * np.multiply.reduceat(local, self.flop_starts)
            np.add.at(at_peak, self.matmul_kernels, flops / self.flop_peaks)
        atomics = np.zeros(kernel_count, dtype=np.float64)
        if len(self.scatter_values):
            elements = value_bytes[self.scatter_values] * 8 / np.maximum(
                self.communication.element_bits[self.scatter_values], 1)
            np.add.at(atomics, self.scatter_kernels, elements / self.scatter_rates)
        return at_peak, moved, atomics

    def kernel_times(self, state: ShardingState, value_bytes: np.ndarray | None = None,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per kernel (one launch): ``(seconds, seconds bound by FLOPs or atomics, seconds bound by bytes)``;
        seconds = the larger bound + the kernel's overhead."""
        at_peak, moved, atomics = self.kernel_work(state, value_bytes)
        compute_time = at_peak / self.hardware.matmul_efficiency + atomics
        memory_time = moved / self.bandwidth
        return np.maximum(compute_time, memory_time) + self.overhead, compute_time, memory_time

    def _absolute(self, state: ShardingState):
        value_bytes = self.communication.value_bytes(state)
        seconds, compute_time, memory_time = self.kernel_times(state, value_bytes)
        repeats = self.repeats
        compute_bound = compute_time >= memory_time
        busy_compute = float((np.where(compute_bound, compute_time, 0.0) * repeats).sum())
        busy_memory = float((np.where(compute_bound, 0.0, memory_time) * repeats).sum())
        overheads = float((self.overhead * repeats).sum()) + self.hardware.step_overhead
        item_time = np.bincount(self.top_of_kernel, weights=seconds * repeats, minlength=self.item_count)
        collectives = self.communication.collectives(state, value_bytes)
        communication: dict[str, float] = {}
        timed: list[tuple[int, int, float]] = []  # (consumer item, ready item, seconds) on the comm stream
        in_loops = 0.0
        seconds_of = self._collective_seconds
        item_of_op, op_in_loop, op_repeats, root_of, first_reader = self._static_lists
        producer = self.model.analysis.program.producer
        by_axes: dict[tuple[str, ...], float] = {}
        for collective in collectives:
            op = collective.op
            axes = collective.axes
            duration = seconds_of(collective.kind, axes, collective.bytes_in, collective.bytes_out)
            repeated = duration * op_repeats[op]
            by_axes[axes] = by_axes.get(axes, 0.0) + repeated
            if op_in_loop[op]:
                item_time[item_of_op[op]] += repeated
                in_loops += repeated
                continue
            root = root_of[collective.value]
            if collective.operand >= 0:  # a use: ready when the value is, needed by the op using it
                made_by = producer[root]
                ready, consumer = (item_of_op[made_by] if made_by >= 0 else -1), item_of_op[op]
            else:  # a partial result: ready after its producer, needed by its first reader
                ready, consumer = item_of_op[op], first_reader[root]
            timed.append((consumer, ready, duration))
        for axes, axis_seconds in by_axes.items():
            communication["+".join(axes)] = axis_seconds
        compute_busy = float(item_time.sum()) + self.hardware.step_overhead
        total_comm = sum(d for _, _, d in timed)
        if not self.overlap:
            step = compute_busy + total_comm
            exposed = total_comm
        else:
            step = self._makespan(item_time, timed) + self.hardware.step_overhead
            exposed = step - compute_busy
            if exposed < 1e-12 * max(step, 1.0):  # rounding of the same sums taken in two orders
                exposed, step = 0.0, compute_busy
        breakdown = {
            "compute_bound_s": busy_compute,
            "memory_bound_s": busy_memory,
            "launch_overhead_s": overheads,
            "exposed_communication_s": exposed + in_loops,
            "hidden_communication_s": max(0.0, total_comm - exposed) if total_comm - exposed > 1e-12 * step else 0.0,
        }
        peak = self._peak_memory(collectives, value_bytes)
        return step, compute_busy - in_loops, breakdown, communication, peak, collectives

    @staticmethod
    def _makespan(item_time: np.ndarray, timed: list[tuple[int, int, float]]) -> float:
        """Both streams' makespan: items back to back on the compute stream, each collective on the
        communication stream from max(its operand ready, stream free), its consumer waiting for it."""
        starts: list[float] = np.concatenate(([0.0], np.cumsum(item_time))).tolist()
        total = starts[-1]
        if not timed:
            return total
        delay_at: list[int] = []  # items where the compute stream waited, ascending
        delay_sum: list[float] = []  # cumulative wait from that item on
        delay = 0.0
        comm_free = 0.0
        for consumer, ready, duration in sorted(timed):
            if ready >= 0:
                index = bisect.bisect_right(delay_at, ready) - 1
                ready_time = starts[ready + 1] + (delay_sum[index] if index >= 0 else 0.0)
            else:
                ready_time = 0.0
            comm_free = max(comm_free, ready_time) + duration
            consumer_start = starts[min(consumer, len(item_time))] + delay
            if ready >= consumer:  # made and needed by the same item (a loop): no overlap
                consumer_start = max(consumer_start, comm_free)
            if comm_free > consumer_start:
                delay += comm_free - consumer_start
                delay_at.append(consumer)
                delay_sum.append(delay)
        return max(total + delay, comm_free)

    def live_at_peak(self, state: ShardingState, *, top: int = 5) -> list[LiveBuffer]:
        """The ``top`` largest buffers live when the peak is reached (largest first)."""
        value_bytes = self.communication.value_bytes(state)
        sizes = value_bytes[self.plan.buffers]
        delta = self._live_delta(sizes, self.communication.collectives(state, value_bytes))
        at = int(np.argmax(np.cumsum(delta)))
        born, dies = self.buffer_born, self.buffer_dies
        live = np.flatnonzero((born <= at) & (dies > at))
        order = live[np.argsort(-sizes[live], kind="stable")][:top]
        program = self.model.analysis.program
        found = []
        for index in order.tolist():
            value = program.values[int(self.plan.buffers[index])]
            found.append(LiveBuffer(value.id, value.name, value.shape, value.dtype, int(sizes[index]), value.loc))
        return found

    def _live_delta(self, sizes: np.ndarray, collectives: list[Collective]) -> np.ndarray:
        """Bytes allocated (+) and freed (-) at each position (kernel index + 1; 0 before the first): every
        buffer over its live range, and every value resharded for its uses (gathered parameters, Figure 5b's
        k) as a second copy from its first such use to its last."""
        delta = np.zeros(len(self.plan.kernels) + 3, dtype=np.int64)
        np.add.at(delta, self.buffer_born, sizes)
        np.add.at(delta, self.buffer_dies, -sizes)
        for collective in collectives:
            if collective.operand >= 0:
                first = int(self.kernel_position_of_op[collective.op]) + 1
                last = int(self.kernel_position_of_op[max(collective.last_op, collective.op)]) + 2
                delta[first] += collective.bytes_out
                delta[last] -= collective.bytes_out
        return delta

    def _peak_memory(self, collectives: list[Collective], value_bytes: np.ndarray) -> int:
        peak = int(np.cumsum(self._live_delta(value_bytes[self.plan.buffers], collectives)).max())
        if self.donate:
            peak -= self._donated_bytes(value_bytes)
        return peak

    def _donated_bytes(self, value_bytes: np.ndarray) -> int:
        """Bytes of outputs that reuse a donated argument's buffer: each donated argument serves at most one
        output of the same size (XLA's input-output aliasing)."""
        program = self.model.analysis.program
        free: dict[int, int] = {}
        for index in self.donate:
            size = int(value_bytes[program.arguments[index]])
            free[size] = free.get(size, 0) + 1
        saved = 0
        arguments = {int(self.plan.root[v]) for v in program.arguments}
        for value_id in dict.fromkeys(int(self.plan.root[v]) for v in program.results):
            if value_id in arguments:
                continue
            size = int(value_bytes[value_id])
            if free.get(size, 0) > 0:
                free[size] -= 1
                saved += size
        return saved
