"""The kernels one device launches for a program: XLA-style fusion of StableHLO ops, loops, buffers.

An accelerator does not run StableHLO ops one by one: XLA groups them into kernels, and a kernel's cost is
the bytes it reads and writes at its boundary (plus its FLOPs, for library calls), not the sum over its ops.
This module builds, once per program, the static plan the cost model prices per sharding state. Which ops are
views, library calls, reductions, ... is not decided here: each op family's rule file gives its kinds a
``kernel_class`` and the mechanics rows (``Analysis.kernel_semantics``); the ops named below are the bundled
rows. An op of no class (an ``unpriced_op``) runs as a library call.

- **Views.** ``reshape``, ``get_tuple_element``, ``tuple``, ``optimization_barrier``, sharding annotations and
  inlined calls move no data: a value they make is the same buffer as their operand (its *root*). A loop's
  carried values, its results and its body's arguments share one buffer too (XLA runs ``while`` in place).
- **Library calls.** ``dot_general`` and ``convolution`` (cuBLAS/cuDNN on GPU), ``sort``, ``fft`` and other
  custom calls are kernels of their own.
- **Loop fusion.** An elementwise-like op (elementwise, ``convert``, ``transpose``, ``slice``,
  ``concatenate``, ``pad``, ``gather``, ...) whose users are all fusible (or reductions, scatters) fuses into
  all of them: a chain becomes one kernel whose intermediates never exist in memory. When its users land in
  several kernels, each recomputes it, reading its inputs, only where that moves no more bytes than storing it
  once and reading it in each (XLA's priority fusion prices the same choice); otherwise one kernel writes it
  and the others read it. So a value many kernels read, such as the residual stream, is stored, and kernel
  bytes grow linearly with depth.
- **Input fusion.** A ``reduce`` ends its kernel: its single-user elementwise producers fuse into it, its
  users start a new kernel. A ``scatter`` likewise takes its update computation.
- **Cheap producers.** ``broadcast_in_dim``, ``iota`` and constants are recomputed inside every kernel that
  reads them (XLA duplicates them): such a kernel reads the broadcast's operand, not its result. They are
  materialized only for a library call, a loop or a program result.
- **Bytes touched.** ``gather``, ``slice`` and ``dynamic_slice`` read what they return, not their whole
  operand; ``dynamic_update_slice`` writes its update in place.
- **Select-and-scatter** (a max pool's gradient) runs as XLA's GPU pipeline expands it: a window reduction
  that writes, per source element, the selected value and its index in every dimension (32 bits each), then a
  scatter-add of the source at those indices. The selection is a scratch buffer, written and read once and
  live only during the op (the reference's optimized HLO: ``fused_reduce_window`` then ``fused_scatter``).
- **Loops.** A ``stablehlo.while`` runs its body's kernels once per iteration: the trip count is read from
  the loop when it counts from a constant to a constant by a constant (what ``lax.scan`` and ``fori_loop``
  emit), else taken as 1 (``Loop.trip_count_known`` says which; ``toast.frontend.loops``). ``if``/``case`` run
  one branch.
- **Memory kinds.** A placement (``jax.device_put`` to ``jax.memory.Space.Host``, an offloading remat policy:
  ``Value.memory_kind``) into the memory its operand is not in is a copy (``Transfer``), not a view: an offload's
  result is a buffer in host memory, a fetch's a device buffer of its own. Host data stays host data through views,
  loops, slices and updates in place (a scan's stack of offloaded residuals lies on the host), as XLA's host
  offloader keeps it; a host buffer takes no device memory (``host_value``).

Order: kernels are numbered in program order (by the last op they contain), which is also the order one
device's compute stream runs them in.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from toast.analysis.kernel_semantics import UNPRICED_CLASS, KernelClass, KernelSemantics
from toast.frontend.ir import HOST_MEMORY_KINDS, TERMINATORS, Program
from toast.frontend.loops import Loop, LoopNest, loop_nest

# The kernel classes as module constants: looking a member up on its enum costs about 0.4 us on Python 3.11,
# and the passes below compare every op's class several times.
_VIEW, _INLINE, _LOOP, _BRANCH, _TERMINATOR, _MATMUL, _LIBRARY, _REDUCTION, _SCATTER, _CHEAP, _FUSIBLE = (
    KernelClass.VIEW, KernelClass.INLINE, KernelClass.LOOP, KernelClass.BRANCH, KernelClass.TERMINATOR,
    KernelClass.MATMUL, KernelClass.LIBRARY, KernelClass.REDUCTION, KernelClass.SCATTER, KernelClass.CHEAP,
    KernelClass.FUSIBLE)
# Bits per component of a select-and-scatter's selection (the selected value and its index per dimension).
SELECTION_BITS = 32
# A producer read by several kernels is duplicated into them only if its fusion has at most this many inputs and
# outputs (XLA's GPU fusions: ``MaxOperandsAndOutputsPerFusion()`` in xla/service/gpu/gpu_fusible.h) and holds at
# most this many ops (a bound of ours, which keeps building the plan linear in the program).
MAX_FUSION_OPERANDS_AND_OUTPUTS = 96
MAX_DUPLICATED_OPS = 256
# The plan's categories beside the rules' kernel classes: an op in the scalar computation of a reduce (scatter,
# sort, ...), a fusible op recomputed in the kernels of its readers, an update written in place by the kernel
# making it; and the kind of a loop fusion's kernel.
COMPUTATION, RECOMPUTED, IN_PLACE, FUSION = "computation", "recomputed", "in_place", "fusion"
# Classes whose ops hand their operands on to a region or the caller (no kernel of their own).
HANDS_ON = frozenset({_TERMINATOR, _LOOP, _BRANCH})
# Classes whose ops hold regions that run as scheduling scopes of their own.
_SCOPES = frozenset({_LOOP, _BRANCH})
# Classes whose ops' regions are not a scalar computation of theirs.
_CONTROL = frozenset({_INLINE, _LOOP, _BRANCH})
# Categories of the kernels a kernel's ops are, most telling first: the kernel's kind (else a loop fusion).
_KERNEL_KINDS = (_MATMUL, _LIBRARY, _SCATTER, _REDUCTION)
# Categories that root a kernel of their own (a cheap producer where stored).
_FORMS_KERNEL = frozenset({_FUSIBLE, _REDUCTION, _SCATTER, _LIBRARY,
                           _MATMUL})
# Readers a fusible producer may fuse into.
_FUSES_INTO = frozenset({_FUSIBLE, _REDUCTION, _SCATTER})
# Library calls (their own kernel, whose operands are stored).
_CALLS = frozenset({_MATMUL, _LIBRARY})


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel launch.

    Attributes:
      kind: ``KernelClass.MATMUL`` (dot_general/convolution), ``LIBRARY`` (other library calls), ``REDUCTION``,
        ``SCATTER`` or ``FUSION`` (a loop fusion).
      ops: op ids it runs, in program order.
      loop: the innermost ``stablehlo.while`` holding it (op id), ``-1`` at top level.
      repeats: how many times one step runs it (the product of the enclosing loops' trip counts).
    """

    kind: str
    ops: tuple[int, ...]
    loop: int
    repeats: int


@dataclass(frozen=True, slots=True)
class Transfer:
    """A copy between device and host memory: a placement (``Value.memory_kind``) of a value held in the other.

    Attributes:
      op: the placement op's id.
      value: its result (the bytes copied).
      to_host: device to host (an offload), else host to device (a fetch).
      host_data: which host data it writes or reads (``KernelPlan.host_data`` of its host side): a fetch reads what
        the offloads of the same host data wrote (a scan's stack and the slices of it).
      ready_kernel: the kernel after which it may start (``-1``: from the start): an offload's, the one making its
        value; a fetch's, the last one before it in program order (its data is there once, besides, the offloads of
        its host data have landed).
      reader_kernel: the first kernel reading a fetched value (``-1``: none, or an offload).
      loop: the outermost ``stablehlo.while`` holding it (op id), ``-1`` at top level.
      repeats: how many times one step runs it (the product of the enclosing loops' trip counts).
    """

    op: int
    value: int
    to_host: bool
    host_data: int
    ready_kernel: int
    reader_kernel: int
    loop: int
    repeats: int


class KernelPlan:
    """The kernels, buffers and loops of one program (built once, linear in its size).

    Args:
      program: the program.
      semantics: what each op kind runs as (``Analysis.kernel_semantics``: the rules' ``kernel_class`` and
        mechanics tables); an op of no class runs as a library call.

    Attributes:
      program: the program.
      op_class: per op id, its kernel class (rules/nda.dl's ``known_kernel_class``; ``LIBRARY`` for an unpriced
        op).
      root: ``int64[values]``, the value whose buffer each value is (itself unless a view).
      kernels: every kernel, in launch order.
      kernel_of_op: ``int64[ops]``, the kernel running each op (``-1``: views, control, cheap producers
        recomputed in their consumers).
      nest: the program's loops (``toast.frontend.loops.loop_nest``).
      loops: ``op id -> Loop`` for every ``stablehlo.while`` (``nest.loops``).
      reads: ``(kernel, value, weight value)`` rows as three ``int64`` arrays: the kernel reads the buffer of
        ``value`` and moves as many bytes as ``weight value`` holds (itself, or the result of a gather/slice).
      writes: ``(kernel, value, weight value)`` rows likewise for the values a kernel writes for others.
      scatter_updates: ``(kernel, value)`` rows: the update operands of scatters (elements added atomically).
      scratch: ``(kernel, value, scale)`` rows: a temporary the kernel writes and reads back, of
        ``scale`` times the bytes of ``value`` (``float64``), live only during the kernel.
      buffers: value ids that occupy memory (arguments, kernel outputs, loop carries), each once.
      buffer_born, buffer_dies: ``int64`` positions (kernel indices; ``-1`` before the first) between which
        each buffer is live; arguments live for the whole step, program results from the kernel that makes them
        to its end.
      host_value: ``bool[values]``, whether each value's buffer lies in host memory (``_memory_spaces``): it takes
        no device memory.
      host_data: ``int64[values]``, for a value in host memory the host data it belongs to (a value naming the
        buffers joined by the ops host data passes through: a scan's stack, its updates and slices), else ``-1``.
      transfers: the copies between device and host memory (``Transfer``), in program order.
    """

    def __init__(self, program: Program, *, semantics: KernelSemantics):
        self.program = program
        self.semantics = semantics
        self.nest: LoopNest = loop_nest(program)
        self.loops: Mapping[int, Loop] = self.nest.loops
        # An op's class is its kind's but for custom calls (by their target): looked up once per kind.
        by_kind: dict[str, KernelClass] = {}
        op_class: list[KernelClass] = []
        for op in program.ops:
            cls = by_kind.get(op.kind)
            if cls is None:
                cls = semantics.class_of(op) or UNPRICED_CLASS
                if op.kind != "stablehlo.custom_call":
                    by_kind[op.kind] = cls
            op_class.append(cls)
        self.op_class = op_class
        # The passes, in order; each reads what the ones before made.
        root = self._memory_spaces(self._view_roots())
        self._scopes()
        category = self._categories()
        users, escapes = self._users_and_escapes(root, category)
        materialized_cheap = self._materialized_cheap(category, escapes)
        root = self._share_select_and_scatter_init(root, users, escapes, materialized_cheap)
        self.root = root
        fuses_into = self._fusion(root, category, users, escapes, materialized_cheap)
        in_place_writes = self._in_place_writes(root, category, users, materialized_cheap, fuses_into)
        group = self._sibling_groups(root, category, materialized_cheap, fuses_into)
        self._form_kernels(category, materialized_cheap, fuses_into, group)
        self._boundaries(root, category, users, escapes, materialized_cheap, fuses_into, in_place_writes)
        # Buffers and live ranges in kernel positions.
        self.buffers, self.buffer_born, self.buffer_dies = self._live_ranges(
            users, escapes, materialized_cheap, category)
        self.transfers = self._transfers()

    def _view_roots(self) -> np.ndarray:
        """``int64[values]``: the value whose buffer each value is (views, inlined calls, loops in place)."""
        ops, op_class, values = self.program.ops, self.op_class, self.program.values
        in_place_update = self.semantics.in_place_update
        value_count = len(self.program.values)
        # Views: the buffer each value is (result k of a view is its operand k, or its last operand).
        source = list(range(value_count))
        for op in ops:
            cls = op_class[op.id]
            if cls == _VIEW and op.operands:
                for k, value_id in enumerate(op.results):
                    if not values[value_id].memory_kind:  # a placement: its own buffer here (_memory_spaces)
                        source[value_id] = op.operands[min(k, len(op.operands) - 1)]
            elif cls in (_INLINE, _LOOP):
                for args in op.regions[-1:] if cls == _LOOP else op.regions[:1]:
                    for value_id, operand in zip(args, op.operands, strict=False):
                        source[value_id] = operand
                if cls == _LOOP:
                    for value_id, operand in zip(op.results, op.operands, strict=False):
                        source[value_id] = operand
                    if op.regions:
                        for value_id, operand in zip(op.regions[0], op.operands, strict=False):
                            source[value_id] = operand
            elif op.kind in in_place_update and op.results:
                source[op.results[0]] = op.operands[in_place_update[op.kind][0]]  # in place
        returns: dict[tuple[int, int], int] = {}
        for op in ops:
            if op.kind in TERMINATORS and op.parent is not None:
                returns[op.parent] = op.id
        for op in ops:
            if op_class[op.id] == _INLINE and (op.id, 0) in returns:
                inner = ops[returns[(op.id, 0)]]
                for value_id, returned in zip(op.results, inner.operands, strict=False):
                    source[value_id] = returned
        roots = list(range(value_count))
        for value_id in range(value_count):
            r = value_id
            while source[r] != r:
                r = source[r]
            roots[value_id] = r
            step = value_id
            while source[step] != r:  # path compression: every chain is walked once
                source[step], step = r, source[step]
        return np.asarray(roots, dtype=np.int64).reshape(-1)

    def _memory_spaces(self, root: np.ndarray) -> np.ndarray:
        """Sets ``host_value``, ``host_data`` and ``_placements`` (``(op, operand, result, to_host)`` of each placement
        that copies); returns ``root`` with the placements that move nothing made views again.

        A buffer lies in host memory when the program places a value of it there (a placement's result, an
        argument of a host memory kind) or writes host data into it in place (the stack of a ``lax.scan``'s
        offloaded residuals: XLA's host offloader allocates the whole stack on the host). A slice of host data, and
        a broadcast that only adds unit dims to it, are host data too: the ops XLA lets a value pass through on its
        way to or from a placement. A placement into the other memory is a copy into a buffer of its own; one into
        the memory its operand lies in already is a view, as XLA drops it; so are both of a copy straight back.
        """
        values, op_class = self.program.values, self.op_class
        host = np.zeros(len(values), dtype=bool)  # per root
        self._placements: list[tuple[int, int, int, bool]] = []
        if not any(v.memory_kind for v in values):
            self.host_value, self.host_data = host, np.full(len(values), -1, dtype=np.int64)
            return root
        # A copy straight back of a copy read by nothing else is no copy at all: XLA drops the pair (measured on an
        # H100 with jax 0.11: benchmarks/gpu_host_offload.py); a remat fetch reads through an optimization barrier.
        ops, producer = self.program.ops, self.program.producer
        uses = np.bincount([v for op in ops for v in op.operands], minlength=len(values))
        dropped: set[int] = set()
        hosted = [v.memory_kind in HOST_MEMORY_KINDS for v in values]
        for op in ops:
            if op_class[op.id] != _VIEW or len(op.operands) != 1 or len(op.results) != 1:
                continue
            (first,), (second,) = op.operands, op.results
            if values[second].memory_kind and values[first].memory_kind and uses[first] == 1 and \
                    producer[first] >= 0 and op_class[producer[first]] == _VIEW and \
                    hosted[first] != hosted[second]:
                dropped.update((first, second))
        for value in values:
            if value.memory_kind in HOST_MEMORY_KINDS and value.id not in dropped:
                host[root[value.id]] = True
        in_place_update, touched = self.semantics.in_place_update, self.semantics.touched_operand
        passes: list[tuple[int, int]] = []  # (operand, result): host data in the operand makes the result host data
        for op in ops:
            if not op.results or not op.operands:
                continue
            if op.kind in in_place_update and len(op.operands) > max(in_place_update[op.kind]):
                passes.append((op.operands[in_place_update[op.kind][1]], op.results[0]))
            elif (op.kind, 0) in touched:
                passes.append((op.operands[0], op.results[0]))
            elif op_class[op.id] == _CHEAP and len(op.operands) == 1 and values[op.operands[0]].bits == \
                    values[op.results[0]].bits and math.prod(values[op.operands[0]].shape) == \
                    math.prod(values[op.results[0]].shape):
                passes.append((op.operands[0], op.results[0]))
        changed = True
        while changed:  # host data flows on through loops and calls (their buffers are shared: ``root``)
            changed = False
            for source, result in passes:
                r = int(root[result])
                if host[root[source]] and not host[r] and not values[r].memory_kind:
                    host[r] = changed = True
        merged: dict[int, int] = {}
        for op in ops:
            if op_class[op.id] != _VIEW or not op.operands:
                continue
            for k, value_id in enumerate(op.results):
                if not values[value_id].memory_kind:
                    continue
                operand = op.operands[min(k, len(op.operands) - 1)]
                to_host = values[value_id].memory_kind in HOST_MEMORY_KINDS
                if to_host == bool(host[root[operand]]) or value_id in dropped:
                    merged[value_id] = operand
                else:
                    self._placements.append((op.id, operand, value_id, to_host))
        for value_id in merged:
            final = value_id
            while final in merged:
                final = int(root[merged[final]])
            root[root == value_id] = final
        self.host_value = host[root]
        # Host data joined by the ops it passes through is one: ``host_data`` names each value's by a root value.
        group = {int(r): int(r) for r in np.flatnonzero(host)}

        def find(r: int) -> int:
            while group[r] != r:
                group[r] = r = group[group[r]]
            return r

        for source, result in passes:
            a, b = int(root[source]), int(root[result])
            if a in group and b in group:
                group[find(a)] = find(b)
        self.host_data = np.full(len(values), -1, dtype=np.int64)
        for value in values:
            r = int(root[value.id])
            if r in group:
                self.host_data[value.id] = find(r)
        return root

    def _scopes(self) -> None:
        """Sets ``scope`` (per op)."""
        ops, op_class = self.program.ops, self.op_class
        # Scheduling scope of each op: the innermost loop or branch op holding it (inline regions are
        # transparent), -1 at top level.
        scope = [-1] * len(ops)
        for op in ops:
            if op.parent is not None:
                parent = op.parent[0]
                scope[op.id] = parent if op_class[parent] in _SCOPES else scope[parent]
        self.scope = scope

    def _categories(self) -> list[str]:
        """Each op's category: its kernel class (``view`` for an inline call too), or ``computation`` inside a
        reduce's (scatter's, sort's) region."""
        ops, op_class = self.program.ops, self.op_class
        # Ops in the computation region of a reduce, scatter, sort, ... are that op's scalar function, not
        # kernels of their own.
        category: list[str] = []
        for op in ops:
            in_computation = op.parent is not None and (
                category[op.parent[0]] == COMPUTATION or op_class[op.parent[0]] not in _CONTROL)
            cls = op_class[op.id]
            category.append(COMPUTATION if in_computation else _VIEW if cls == _INLINE else cls)
        return category

    def _users_and_escapes(self, root: np.ndarray, category: list[str]) -> tuple[list[list[int]], np.ndarray]:
        """Per buffer: the ops reading it, and whether a terminator, loop, branch or library call reads it."""
        program, ops = self.program, self.program.ops
        value_count = len(self.program.values)
        # Users of each buffer (through views), by op: the real readers.
        users: list[list[int]] = [[] for _ in range(value_count)]
        escapes = [False] * value_count  # read by a terminator, a loop, a branch or a library call
        op_class = self.op_class
        root_of = root.tolist()  # Python ints: a list lookup, not a numpy scalar, per operand
        for op in ops:
            if op_class[op.id] in (_VIEW, _INLINE) or category[op.id] == COMPUTATION:
                continue
            if op.kind in TERMINATORS and op.parent is not None and op_class[op.parent[0]] == _INLINE:
                continue  # a call's results are views of what its body returns: their readers read it
            for value_id in op.operands:
                users[root_of[value_id]].append(op.id)
        for value_id in program.results:
            escapes[root_of[value_id]] = True
        for _, operand, _, to_host in self._placements:
            if to_host:  # the copy to the host reads it where it lies: it is stored
                escapes[root_of[operand]] = True
        for op in ops:
            cat = category[op.id]
            if cat in HANDS_ON or cat in _CALLS:
                if cat == _TERMINATOR and op.parent is not None and op_class[op.parent[0]] == \
                        _INLINE:
                    continue  # a call's results are views of what its body returns
                for value_id in op.operands:
                    escapes[root_of[value_id]] = True

        return users, np.asarray(escapes, dtype=bool).reshape(-1)

    def _materialized_cheap(self, category: list[str], escapes: np.ndarray) -> np.ndarray:
        """Per op: a cheap producer that is stored (something other than a fusible op reads it)."""
        ops = self.program.ops
        # Cheap producers are materialized only when something other than a fusible op reads them.
        materialized_cheap = np.zeros(len(ops), dtype=bool)
        escaped = escapes.tolist()
        for op in ops:
            if category[op.id] == _CHEAP:
                for value_id in op.results:
                    if escaped[value_id]:
                        materialized_cheap[op.id] = True
        return materialized_cheap

    def _fusion(self, root: np.ndarray, category: list[str], users: list[list[int]], escapes: np.ndarray,
                materialized_cheap: np.ndarray) -> list[str]:
        """Per op: its category, or ``recomputed`` where it fuses into its readers."""
        program, ops, producer = self.program, self.program.ops, self.program.producer
        scope = self.scope
        # Fusion: a fusible op whose results only fusible ops, reductions and scatters of its scope read fuses
        # into all of them or none (XLA's GPU priority fusion, priority_fusion.cc: ``CanFuseWithAllNonBitcastUsers``).
        # Fused, it is recomputed in every kernel its readers land in (sibling reductions counted apart) and never
        # stored. Fusing into one kernel always pays. Into n > 1, each of them reads its inputs (I bytes) in place
        # of its result (O bytes); storing it instead costs a kernel reading I and writing O, and n reads of O.
        # XLA fuses when time_unfused - time_fused (GpuPerformanceModel::EstimateRunTimes) is not negative; in
        # bytes: n·I <= I + O + n·O (the launch term is left out, so that the plan does not depend on sizes).
        # Producers are decided consumers first, with I the inputs of the producers that may still fuse with it
        # (an upper bound). XLA's optimized GPT-2 (the reference's HLO) recomputes
        # x1 = x0 + attention in its three readers (n = 3, I = 2·O: a tie) and stores x2 = x1 + mlp
        # (``loop_add_fusion``); here the bias's bytes break the tie and every residual is stored, for the
        # same bytes. Either way no reader re-adds all earlier layers, and kernel bytes are linear in depth.
        # Every other fusible op, reduction, scatter and library call roots a kernel.
        fuses_into = category.copy()
        touched = self.semantics.touched_operand
        # Python lists of the arrays: the passes below look them up per op and operand.
        root_of, escaped, cheap_stored = root.tolist(), escapes.tolist(), materialized_cheap.tolist()
        readers_of = [[u for value_id in op.results for u in users[root_of[value_id]]] for op in ops]
        candidate = [False] * len(ops)  # may fuse into its readers (if duplicating pays)
        for op in ops:
            if category[op.id] != _FUSIBLE or op.kind in self.semantics.in_place_update or not op.results:
                continue
            readers = readers_of[op.id]
            candidate[op.id] = bool(readers) and not any(escaped[root_of[v]] for v in op.results) and all(
                category[u] in _FUSES_INTO and scope[u] == scope[op.id] for u in readers)
        values = program.values
        byte_cache: dict[int, float] = {}

        def value_bytes(value_id: int) -> float:
            """Bytes of a value (pred: a byte); only the values near duplicated ops are asked for."""
            found = byte_cache.get(value_id)
            if found is None:
                value = values[value_id]
                found = byte_cache[value_id] = math.prod(value.shape) * (8 if value.bits == 1 else value.bits) / 8
            return found

        def duplication_pays(op_id: int, kernels: int) -> bool:
            """Whether recomputing op ``op_id`` in ``kernels`` kernels moves no more bytes than storing it once.
            Its inputs are those of the producers that may fuse with it: an upper bound, as they are decided
            later, and one that stores only replaces its inputs by its result, which is smaller."""
            budget = (kernels + 1) / (kernels - 1) * sum(value_bytes(v) for v in ops[op_id].results)
            inputs: dict[int, float] = {}
            total = 0.0
            stack, visited = [op_id], {op_id}
            while stack:
                q = ops[stack.pop()]
                for k, value_id in enumerate(q.operands):
                    r = root_of[value_id]
                    p = producer[r]
                    if p >= 0 and r in ops[p].results and (candidate[p] or (
                            category[p] == _CHEAP and not cheap_stored[p])):
                        if p not in visited:
                            visited.add(p)
                            stack.append(p)
                        continue
                    weight = value_bytes(q.results[0]) if (q.kind, k) in touched else value_bytes(r)
                    if weight > inputs.get(r, 0.0):
                        total += weight - inputs.get(r, 0.0)
                        inputs[r] = weight
                        if total > budget:
                            return False
                if len(inputs) + len(ops[op_id].results) > MAX_FUSION_OPERANDS_AND_OUTPUTS or \
                        len(visited) > MAX_DUPLICATED_OPS:
                    return False
            return True

        # The kernels computing each op fused into its readers (any other op: its own).
        landing: dict[int, set[int]] = {}

        def landed_in(op_id: int) -> set[int]:
            found: set[int] = set()
            for u in readers_of[op_id]:
                known = landing.get(u)
                if known is None:
                    found.add(u)
                else:
                    found |= known
            return found

        for op in reversed(ops):  # consumers before producers
            if candidate[op.id]:
                landed = landed_in(op.id)
                if len(landed) == 1 or duplication_pays(op.id, len(landed)):
                    fuses_into[op.id] = RECOMPUTED
                    landing[op.id] = landed
            elif op.kind in self.semantics.library_reads_in_place and category[op.id] == _FUSIBLE and \
                    readers_of[op.id] and not escaped[root_of[op.results[0]]] and all(
                    (category[u] in _FUSES_INTO or category[u] in _CALLS) and scope[u] == scope[op.id]
                    for u in readers_of[op.id]):
                fuses_into[op.id] = RECOMPUTED  # every reader reads the slice where it lies
                landing[op.id] = landed_in(op.id)
        return fuses_into

    def _in_place_writes(self, root: np.ndarray, category: list[str], users: list[list[int]],
                         materialized_cheap: np.ndarray, fuses_into: list[str]) -> list[tuple[int, int]]:
        """``(producer op, update op)`` pairs; marks those updates ``in_place`` in ``fuses_into``."""
        ops, producer = self.program.ops, self.program.producer
        scope, in_place_update = self.scope, self.semantics.in_place_update
        # An update in place (dynamic_update_slice) of a value another kernel makes: that kernel also writes
        # the update into the slice in place (XLA's dynamic-slice fusion for library calls, multi-output fusion
        # for the others), no kernel of its own.
        in_place_writes: list[tuple[int, int]] = []  # (producer op, update op)
        for op in ops:
            if op.kind in in_place_update and len(op.operands) > max(in_place_update[op.kind]):
                update = int(root[op.operands[in_place_update[op.kind][1]]])
                p = producer[update]
                # A broadcast adding the slice's unit dims: look through it.
                while p >= 0 and category[p] == _CHEAP and not materialized_cheap[p] and \
                        len(ops[p].operands) == 1 and len(users[update]) == 1:
                    update = int(root[ops[p].operands[0]])
                    p = producer[update]
                if p < 0 or update not in ops[p].results or scope[p] != scope[op.id]:
                    continue
                if category[p] in _CALLS and users[update] == [op.id]:
                    fuses_into[op.id] = IN_PLACE  # the call's result is written once, into the slice
                elif fuses_into[p] in (_FUSIBLE, _REDUCTION, _MATMUL,
                                       _LIBRARY):
                    fuses_into[op.id] = IN_PLACE
                    in_place_writes.append((p, op.id))
        return in_place_writes

    def _sibling_groups(self, root: np.ndarray, category: list[str], materialized_cheap: np.ndarray,
                        fuses_into: list[str]) -> np.ndarray:
        """``int64[ops]``: the kernel group of each op (its own id but for reductions fused as siblings)."""
        program, ops, producer = self.program, self.program.ops, self.program.producer
        scope = self.scope
        # Sibling (multi-output) fusion: reductions of one scope over the same shape and dims that read a
        # common buffer and do not depend on each other become one kernel (XLA's multi-output fusion, e.g.
        # the scale and bias gradients of a LayerNorm).
        inputs_memo: dict[int, frozenset[int]] = {}

        def inputs_of(op_id: int) -> frozenset[int]:
            if op_id in inputs_memo:
                return inputs_memo[op_id]
            found: set[int] = set()
            for value_id in ops[op_id].operands:
                r = int(root[value_id])
                p = producer[r]
                if p >= 0 and r in ops[p].results and (fuses_into[p] == RECOMPUTED or (
                        category[p] == _CHEAP and not materialized_cheap[p])):
                    found |= inputs_of(p)
                else:
                    found.add(r)
            inputs_memo[op_id] = frozenset(found)
            return inputs_memo[op_id]

        group = np.arange(len(ops), dtype=np.int64)
        group_inputs: dict[int, set[int]] = {}
        group_results: dict[int, set[int]] = {}
        buckets: dict[tuple, list[int]] = {}
        for op in ops:
            if category[op.id] != _REDUCTION or op.kind not in self.semantics.multi_output_fusible or \
                    not op.operands:
                continue
            mine = set(inputs_of(op.id))
            made = {int(root[v]) for v in op.results}
            signature = (scope[op.id], program.values[op.operands[0]].shape, op.attr("dimensions", ()))
            chosen = -1
            for r in sorted(mine):
                for g in buckets.get((signature, r), ()):
                    if not (group_results[g] & mine) and not (made & group_inputs[g]):
                        chosen = g
                        break
                if chosen >= 0:
                    break
            if chosen < 0:
                chosen = op.id
                group_inputs[chosen], group_results[chosen] = set(), set()
            group[op.id] = chosen
            group_inputs[chosen] |= mine
            group_results[chosen] |= made
            for r in mine:
                bucket = buckets.setdefault((signature, r), [])
                if chosen not in bucket:
                    bucket.append(chosen)

        return group

    def _form_kernels(self, category: list[str], materialized_cheap: np.ndarray, fuses_into: list[str],
                      group: np.ndarray) -> None:
        """Sets ``kernels`` and ``kernel_of_op``."""
        ops = self.program.ops
        cheap_stored, group_of = materialized_cheap.tolist(), group.tolist()
        members: dict[int, list[int]] = {}
        for op_id, cat in enumerate(fuses_into):
            if cat in _FORMS_KERNEL or (cat == _CHEAP and cheap_stored[op_id]):
                members.setdefault(group_of[op_id], []).append(op_id)
        ordered = sorted(members.values(), key=lambda m: m[-1])
        kernel_at = [-1] * len(ops)
        kernels: list[Kernel] = []
        for index, group_ops in enumerate(ordered):
            for o in group_ops:
                kernel_at[o] = index
            kinds = {category[o] for o in group_ops}
            kind: str = next((k for k in _KERNEL_KINDS if k in kinds), FUSION)
            loop = self.enclosing_loop(group_ops[-1])
            kernels.append(Kernel(kind, tuple(group_ops), loop, self.repeats_in(loop)))
        self.kernels = tuple(kernels)
        self.kernel_of_op = np.asarray(kernel_at, dtype=np.int64).reshape(-1)

    def _boundaries(self, root: np.ndarray, category: list[str], users: list[list[int]], escapes: np.ndarray,
                    materialized_cheap: np.ndarray, fuses_into: list[str],
                    in_place_writes: list[tuple[int, int]]) -> None:
        """Sets ``reads``, ``writes``, ``scatter_updates`` and ``scratch``: what crosses each kernel's boundary."""
        program, ops, producer = self.program, self.program.ops, self.program.producer
        kernels, kernel_of_op = self.kernels, self.kernel_of_op
        touched, in_place_update = self.semantics.touched_operand, self.semantics.in_place_update
        window_selection = self.semantics.window_selection
        # Python lists of the arrays: looked up per operand below.
        root_of, kernel_at, escaped = root.tolist(), kernel_of_op.tolist(), escapes.tolist()
        cheap_stored = materialized_cheap.tolist()
        # Reads and writes at kernel boundaries.
        read_rows: dict[tuple[int, int], int] = {}
        write_rows: dict[tuple[int, int], int] = {}
        scatter_rows: list[tuple[int, int]] = []
        scratch_rows: list[tuple[int, int, float]] = []

        def read(kernel: int, value_id: int, weight: int, seen: set[int]) -> None:
            r = root_of[value_id]
            p = producer[r]
            if p >= 0 and r in ops[p].results and (
                    (category[p] == _CHEAP and not cheap_stored[p]) or fuses_into[p] == RECOMPUTED):
                if p in seen:
                    return
                seen.add(p)
                for k, operand in enumerate(ops[p].operands):
                    sliced = (ops[p].kind, k) in touched
                    read(kernel, operand, ops[p].results[0] if sliced else operand, seen)
                return
            if p >= 0 and kernel_at[p] == kernel and r in ops[p].results:
                return  # made inside the kernel
            key = (kernel, r)
            full = root_of[weight] == r
            if key not in read_rows or full:
                read_rows[key] = r if full else weight

        for index, kernel in enumerate(kernels):
            seen: set[int] = set()
            for op_id in kernel.ops:
                op = ops[op_id]
                target, update = in_place_update.get(op.kind, (-1, -1))
                for k, value_id in enumerate(op.operands):
                    if k == target:
                        continue  # updated in place: not read
                    weight = op.results[0] if (op.kind, k) in touched else value_id
                    read(index, value_id, weight, seen)
                if target >= 0:
                    write_rows[(index, root_of[op.results[0]])] = op.operands[update]
                    continue
                for value_id in op.results:
                    outside = escaped[value_id] or any(kernel_at[u] != index for u in users[value_id])
                    if outside:
                        write_rows.setdefault((index, value_id), value_id)
                if self.op_class[op_id] == _SCATTER:
                    inputs = (len(op.operands) - 1) // 2
                    scatter_rows.extend((index, u) for u in op.operands[inputs + 1:])
                elif op.kind in window_selection and len(op.operands) > window_selection[op.kind][0]:
                    gradient = op.operands[window_selection[op.kind][0]]  # one element per window, scattered
                    scatter_rows.append((index, gradient))
                    rank = len(program.values[op.operands[0]].shape)
                    bits = max(program.values[gradient].bits, 1)
                    scratch_rows.append((index, gradient, (1 + rank) * SELECTION_BITS / bits))
        for maker, update_op in in_place_writes:
            writer = kernel_at[maker]
            if writer >= 0:
                update = in_place_update[ops[update_op].kind][1]
                write_rows[(writer, root_of[ops[update_op].results[0]])] = ops[update_op].operands[update]
        self.reads = _rows(read_rows)
        self.writes = _rows(write_rows)
        scatter = np.asarray(scatter_rows, dtype=np.int64).reshape(-1, 2)
        self.scatter_updates = (scatter[:, 0], scatter[:, 1])
        self.scratch = (np.asarray([r[0] for r in scratch_rows], dtype=np.int64),
                        np.asarray([r[1] for r in scratch_rows], dtype=np.int64),
                        np.asarray([r[2] for r in scratch_rows], dtype=np.float64))


    def _share_select_and_scatter_init(self, root: np.ndarray, users: list[list[int]], escapes: np.ndarray,
                                       materialized_cheap: np.ndarray) -> np.ndarray:
        """XLA expands a select-and-scatter into a scatter whose target is its init broadcast to the operand's
        shape, a stored buffer; CSE makes every broadcast of the same splat constant to the same type in the
        same scope (inlined calls included) that one value (a ReLU's zeros beside a max pool's gradient, in
        the reference's optimized convnet: ``fused_broadcast``). Such a broadcast is then stored once, by a
        kernel of its own, and its readers read it instead of recomputing it. Returns ``root`` with the equal
        broadcasts made views of the first; updates ``users``, ``escapes`` and ``materialized_cheap`` in
        place."""
        program, ops, op_class = self.program, self.program.ops, self.op_class
        window_selection = self.semantics.window_selection
        splat_of = {}  # value id -> splat text, for constants (cheap ops of no operand)
        for op in ops:
            cheap = op_class[op.id] == _CHEAP
            splat = op.attr("splat") if cheap and not op.operands and op.results else None
            if splat is not None:
                splat_of[op.results[0]] = splat
        wanted = set()  # (scope, splat, shape, dtype) of select-and-scatter targets
        for op in ops:
            init = window_selection[op.kind][1] if op.kind in window_selection else -1
            if 0 <= init < len(op.operands) and op.results:
                splat = splat_of.get(int(root[op.operands[init]]))
                result = program.values[op.results[0]]
                if splat is not None:
                    wanted.add((self.scope[op.id], splat, result.shape, result.dtype))
        if not wanted:
            return root
        first: dict[tuple, int] = {}  # key -> the first equal broadcast's result
        remap = np.arange(len(root), dtype=np.int64)
        for op in ops:
            if op_class[op.id] != _CHEAP or not op.operands:  # a broadcast
                continue
            result = program.values[op.results[0]]
            key = (self.scope[op.id], splat_of.get(int(root[op.operands[0]])), result.shape, result.dtype)
            if key not in wanted:
                continue
            if key not in first:
                first[key] = op.results[0]
                materialized_cheap[op.id] = True
                escapes[op.results[0]] = True
                continue
            shared = first[key]
            remap[op.results[0]] = shared
            materialized_cheap[op.id] = False  # a view of the first now
            users[shared].extend(users[op.results[0]])
            users[op.results[0]] = []
        return remap[root]

    def _transfers(self) -> tuple[Transfer, ...]:
        """The placements that copy between device and host memory, in program order."""
        producer, kernel_of_op = self.program.producer, self.kernel_of_op
        last_ops = [k.ops[-1] for k in self.kernels]
        first_read: dict[int, int] = {}
        for kernel, value_id in zip(self.reads[0].tolist(), self.reads[1].tolist(), strict=True):
            first_read[value_id] = min(first_read.get(value_id, kernel), kernel)
        found = []
        for op_id, operand, value_id, to_host in self._placements:
            # Ready after the last kernel before the copy in program order (what it reads is there by then: JAX puts
            # a remat fetch after the optimization barrier that waits for the backward pass to reach it); an offload
            # as soon as the kernel making its value ends.
            ready, reader = bisect.bisect_left(last_ops, op_id) - 1, -1
            if to_host:
                made_by = producer[int(self.root[operand])]
                if made_by < 0 or kernel_of_op[made_by] >= 0:
                    ready = int(kernel_of_op[made_by]) if made_by >= 0 else -1
            else:
                reader = first_read.get(int(self.root[value_id]), -1)
            found.append(Transfer(op_id, value_id, to_host, int(self.host_data[value_id if to_host else operand]),
                                  ready, reader, self.outermost_loop(op_id),
                                  self.repeats_in(self.enclosing_loop(op_id))))
        return tuple(found)

    def enclosing_loop(self, op_id: int) -> int:
        """The innermost ``stablehlo.while`` holding op ``op_id`` (op id), ``-1`` at top level (``LoopNest``)."""
        return self.nest.enclosing_loop(op_id)

    def outermost_loop(self, op_id: int) -> int:
        """The top-level ``stablehlo.while`` holding op ``op_id`` (op id), ``-1`` at top level."""
        return self.nest.outermost_loop(op_id)

    def repeats_in(self, loop: int) -> int:
        """How many times one step runs the body of ``loop`` (the product of the trip counts around it)."""
        return self.nest.repeats_in(loop)

    def _live_ranges(self, users, escapes, materialized_cheap, category):
        program, ops = self.program, self.program.ops
        # Python lists of the arrays: looked up per op below.
        kernel_at, root_of, cheap_stored = self.kernel_of_op.tolist(), self.root.tolist(), materialized_cheap.tolist()
        last = len(self.kernels)
        # The position an op reads its operands at: its kernel; a loop or branch reads them over its whole
        # body (the last kernel inside it); a view or terminator at the position of whatever uses it next.
        span_end = [-1] * len(ops)
        for op in reversed(ops):
            end = max(span_end[op.id], kernel_at[op.id])
            span_end[op.id] = end
            if op.parent is not None:
                parent = op.parent[0]
                span_end[parent] = max(span_end[parent], end)
        position = [k if k >= 0 else end for k, end in zip(kernel_at, span_end, strict=True)]
        # A region's terminator hands its operands on: they live to the end of the enclosing op.
        for op in ops:
            if op.kind in TERMINATORS and op.parent is not None:
                position[op.id] = span_end[op.parent[0]]
        born = {}
        dies = {}
        arguments = {root_of[v] for v in program.arguments}
        results = {root_of[v] for v in program.results}
        for op in ops:
            k = kernel_at[op.id]
            if k < 0 or (category[op.id] == _CHEAP and not cheap_stored[op.id]):
                continue
            for value_id in op.results:
                r = root_of[value_id]
                if r == value_id or r not in born:
                    born.setdefault(r, k)
        # A value fetched from the host is a buffer of its own from the first kernel after the fetch in program
        # order, which its copy overlaps (``Transfer``: a fetch starts where the program reaches it).
        last_ops = [k.ops[-1] for k in self.kernels]
        for op_id, _, value_id, to_host in self._placements:
            r = root_of[value_id]
            if not to_host and r not in born:
                born[r] = min(bisect.bisect_left(last_ops, op_id), max(last - 1, 0))
        for value_id in arguments:
            born[value_id] = -1
        # A buffer dies after the last kernel that reads it (a recomputed producer's reads happen in the
        # kernels it is fused into) or the end of the loop, branch or region that hands it on.
        last_read: dict[int, int] = {}
        for kernel, value_id in zip(self.reads[0].tolist(), self.reads[1].tolist(), strict=True):
            last_read[value_id] = max(last_read.get(value_id, -1), kernel)
        for r in list(born):
            end = max(born[r], last_read.get(r, -1))
            for u in users[r]:
                if kernel_at[u] < 0 and category[u] in HANDS_ON:
                    end = max(end, position[u])
            dies[r] = end
        # Arguments live for the whole step. A result lives from the kernel that makes it to the end: XLA's
        # buffer assignment (MaybeAssignBuffer) gives it the allocation of a temporary whose live range ended
        # before, so it takes no memory of its own earlier (its buffer-assignment dump shows the sharing).
        for r in arguments:
            if r in born:
                born[r] = -1
        for r in results | arguments:
            if r in born:
                dies[r] = last
        buffers = np.asarray(sorted(born), dtype=np.int64)
        return (buffers, np.asarray([born[b] for b in buffers.tolist()], dtype=np.int64),
                np.asarray([dies[b] for b in buffers.tolist()], dtype=np.int64))


def _rows(rows: dict[tuple[int, int], int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(kernel, value, weight)`` arrays of ``(kernel, value) -> weight`` rows, in ``(kernel, value)`` order."""
    table = np.asarray([(k, v, w) for (k, v), w in rows.items()], dtype=np.int64).reshape(-1, 3)
    table = table[np.lexsort((table[:, 1], table[:, 0]))]  # keys are distinct: the order sorted() gives
    return (np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1]),
            np.ascontiguousarray(table[:, 2]))


def kernel_counts(plan: KernelPlan) -> dict[str, int]:
    """Kernels launched per step by kind (loop bodies counted once per iteration)."""
    counts: dict[str, int] = {}
    for kernel in plan.kernels:
        counts[kernel.kind] = counts.get(kernel.kind, 0) + kernel.repeats
    return dict(sorted(counts.items()))
