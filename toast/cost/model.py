"""Analytical cost of a sharding state (TOAST section 4.5): runtime, peak memory, C(s).

Runtime is an abstract interpretation of the partitioned program: every dot_general and
convolution costs its per-device FLOPs over the device's peak for its element type (roofline
compute bound); every collective costs an alpha-beta ring time over the interconnect level its
mesh axes span (``../shared/reference/hardware.md`` section 3.1):

- all-gather, reduce-scatter: ``(n-1)·alpha + (n-1)/n · S / B`` with S the gathered (full) bytes;
- all-reduce: twice that; all-to-all: ``(n-1)·alpha + (n-1)/n · S_local / B``.

Times accumulate along the critical path of the op graph (an op starts when all its operands
are ready). Other ops are free, as in the paper. Loop bodies count once (trip counts are not
known statically).

Peak memory per device is a live-range analysis: each value's shard occupies its bytes from
the op that defines it to its last use; arguments and results occupy theirs for the whole
step (XLA's buffer assignment gives entry parameters and outputs their own allocations, and
the runtime allocates outputs before it runs the step). The peak is the largest sum over
program points.

The relative cost is ``C(s) = RT(s) + MP(s)`` with ``RT = runtime / initial runtime`` and
``MP = penalty · (peak − device memory) / initial peak`` when the peak exceeds the device
memory, else 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toast.cost.collectives import Collective, CommunicationModel
from toast.cost.hardware import Hardware, InterconnectLevel, axis_levels
from toast.sharding.state import ShardingModel, ShardingState


@dataclass(frozen=True, slots=True)
class Cost:
    """The estimated cost of one state.

    Attributes:
      runtime_s: critical-path time of one step, seconds.
      compute_s: sum of dot_general/convolution times, seconds.
      communication_s: collective time per mesh axis set (``"model"``, ``"batch+model"``), seconds.
      peak_bytes: peak memory per device, bytes.
      relative: ``C(s) = RT(s) + MP(s)`` against the unsharded state.
      collectives: the collectives counted.
    """

    runtime_s: float
    compute_s: float
    communication_s: dict[str, float]
    peak_bytes: int
    relative: float
    collectives: tuple[Collective, ...]


class CostModel:
    """Static arrays for evaluating states of one program, mesh and hardware quickly.

    Args:
      model: the sharding model (analysis and mesh).
      hardware: the accelerator profile.
      memory_penalty: the constant C of MP(s).
      device_memory: DM, bytes per device (default: the profile's HBM).
    """

    def __init__(self, model: ShardingModel, hardware: Hardware, *, memory_penalty: float = 10.0,
                 device_memory: float | None = None):
        self.model = model
        self.hardware = hardware
        self.memory_penalty = memory_penalty
        self.device_memory = float(device_memory if device_memory is not None else hardware.hbm_bytes)
        self.communication = CommunicationModel(model)
        self.levels: dict[str, InterconnectLevel] = axis_levels(list(model.mesh.axes), hardware)
        analysis = model.analysis
        program, names = analysis.program, analysis.names
        # Matmul-like ops: the names whose local sizes multiply into the FLOPs.
        flop_names: list[int] = []
        starts: list[int] = []
        peaks: list[float] = []
        self.matmul_ops: list[int] = []
        for op in program.ops:
            kind = op.kind.removeprefix("stablehlo.")
            if kind not in ("dot_general", "convolution") or not op.results:
                continue
            result = op.results[0]
            base = names.def_base[result]
            members = list(range(base, base + len(program.values[result].shape)))
            rhs_shape = program.values[op.operands[1]].shape
            if kind == "dot_general":
                numbers = op.attr("dot_dimension_numbers", {}) or {}
                members += [names.use_name(op.id, 0, d) for d in numbers.get("lhs_contracting_dimensions", ())]
            else:
                numbers = op.attr("dimension_numbers", {}) or {}
                out_feature = numbers.get("kernel_output_feature_dimension", len(rhs_shape) - 1)
                members += [names.use_name(op.id, 1, d) for d in range(len(rhs_shape)) if d != out_feature]
            starts.append(len(flop_names))
            flop_names.extend(members)
            peaks.append(hardware.flops(program.values[result].dtype))
            self.matmul_ops.append(op.id)
        self.flop_names = np.asarray(flop_names, dtype=np.int64)
        self.flop_starts = np.asarray(starts, dtype=np.int64)
        self.peaks = np.asarray(peaks, dtype=np.float64)
        # Critical path over the ops that can cost anything in some state (matmuls, reductions,
        # ops with a use that can differ from its definition); each waits for the nearest such
        # ops upstream. Computed once, so evaluating a state walks only these.
        producer = self.communication.producer
        self.costly = self._costly_ops()
        self.waits_for = self._costly_predecessors(producer)
        # Live ranges: defined at its producer (arguments at -1), last used at its last user.
        last_use = np.full(len(program.values), -1, dtype=np.int64)
        for op in program.ops:
            for value_id in op.operands:
                last_use[value_id] = max(last_use[value_id], op.id)
        end = len(program.ops)
        for value_id in program.results:
            last_use[value_id] = end
        born = np.asarray([producer[v] + 1 if producer[v] >= 0 else 0 for v in range(len(program.values))])
        born[list(program.results)] = 0  # output buffers are allocated before the step runs
        self.born = born
        self.dies = np.maximum(last_use + 1, born + 1)
        self.initial = self._absolute(model.initial())

    def evaluate(self, state: ShardingState) -> Cost:
        """The cost of ``state``, relative to the unsharded program."""
        runtime, compute, communication, peak, collectives = self._absolute(state)
        initial_runtime, _, _, initial_peak, _ = self.initial
        relative = runtime / initial_runtime if initial_runtime > 0 else 1.0
        if peak > self.device_memory and initial_peak > 0:
            relative += self.memory_penalty * (peak - self.device_memory) / initial_peak
        return Cost(runtime, compute, communication, peak, relative, tuple(collectives))

    def collective_time(self, collective: Collective) -> float:
        """Alpha-beta ring time of one collective, seconds."""
        n = math.prod(self.model.mesh.size(a) for a in collective.axes)
        if n <= 1:
            return 0.0
        levels = [self.levels[a] for a in collective.axes]
        alpha = max(level.latency for level in levels)
        bandwidth = min(level.bandwidth for level in levels)
        steps = n - 1
        if collective.kind == "all-gather":
            full = collective.bytes_out
        elif collective.kind == "reduce-scatter":
            full = collective.bytes_in
        elif collective.kind == "all-reduce":
            return 2 * (steps * alpha + steps / n * collective.bytes_in / bandwidth)
        else:  # all-to-all: each device sends (n-1)/n of its local buffer
            full = collective.bytes_in
        return steps * alpha + steps / n * full / bandwidth

    def _absolute(self, state: ShardingState):
        model = self.model
        masks = state.masks
        op_count = len(model.analysis.program.ops)
        op_time = np.zeros(op_count, dtype=np.float64)
        compute = 0.0
        if len(self.flop_names):
            devices = model.devices_of_mask[masks[self.flop_names]]
            local = (model.name_size[self.flop_names] // devices).astype(np.float64)
            flops = 2.0 * np.multiply.reduceat(local, self.flop_starts)
            matmul_seconds = flops / self.peaks
            op_time[self.matmul_ops] += matmul_seconds
            compute = float(matmul_seconds.sum())
        collectives = self.communication.collectives(state)
        communication: dict[str, float] = {}
        for collective in collectives:
            seconds = self.collective_time(collective)
            op_time[collective.op] += seconds
            key = "+".join(collective.axes)
            communication[key] = communication.get(key, 0.0) + seconds
        runtime = self._critical_path(op_time)
        peak = self._peak_memory(state, collectives)
        return runtime, compute, communication, peak, collectives

    def _costly_ops(self) -> list[int]:
        """Ops that can have a cost: matmuls, reductions, users of reduction results, and
        users whose use can be sharded unlike the definition (a dim the op cannot split, or
        a conflict endpoint, which a resolution can leave unsharded)."""
        communication = self.communication
        analysis = self.model.analysis
        names, program = analysis.names, analysis.program
        defs = len(names.defs)
        costly = set(self.matmul_ops) | set(communication.reducing_ops.tolist())
        endpoints = np.asarray(sorted({n for c in analysis.conflicts.conflicts for n in c.nodes}), dtype=np.int64)
        use_nodes = analysis.node_of[defs:]
        def_nodes = analysis.node_of[communication.use_def]
        maybe = (communication.keep_mask == 0) | (
            (use_nodes != def_nodes) & (np.isin(use_nodes, endpoints) | np.isin(def_nodes, endpoints)))
        costly |= {names.uses[k][0] for k in np.flatnonzero(maybe).tolist()}
        reduced_values = {v for op_id in costly & set(communication.reducing_ops.tolist())
                          for v in program.ops[op_id].results}
        costly |= {op.id for op in program.ops if reduced_values.intersection(op.operands)}
        return sorted(costly)

    def _costly_predecessors(self, producer: Sequence[int]) -> list[tuple[int, ...]]:
        """For each costly op, the nearest costly ops upstream (through free ops)."""
        costly = set(self.costly)
        frontier: list[frozenset[int]] = []
        empty: frozenset[int] = frozenset()
        for op in self.model.analysis.program.ops:
            upstream = empty
            for value_id in op.operands:
                p = producer[value_id]
                if p >= 0:
                    upstream = upstream | (frozenset((p,)) if p in costly else frontier[p])
            frontier.append(upstream)
        return [tuple(sorted(frontier[op_id])) for op_id in self.costly]

    def _critical_path(self, op_time: np.ndarray) -> float:
        finish: dict[int, float] = {}
        times = op_time[self.costly].tolist()
        best = 0.0
        for op_id, waits, seconds in zip(self.costly, self.waits_for, times, strict=True):
            done = max([finish[p] for p in waits], default=0.0) + seconds
            finish[op_id] = done
            best = max(best, done)
        return best

    def _peak_memory(self, state: ShardingState, collectives: Sequence[Collective]) -> int:
        sizes = self.communication.value_bytes(state)
        delta = np.zeros(len(self.model.analysis.program.ops) + 2, dtype=np.int64)
        np.add.at(delta, self.born, sizes)
        np.add.at(delta, self.dies, -sizes)
        # A value resharded for its uses (gathered parameters, Figure 5b's k) is a second copy
        # that lives from its first such use to its last.
        for collective in collectives:
            if collective.operand >= 0:
                delta[collective.op] += collective.bytes_out
                delta[max(collective.last_op, collective.op) + 1] -= collective.bytes_out
        return int(np.cumsum(delta).max())
