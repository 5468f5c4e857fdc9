"""The collectives a sharding state needs (the communication of the partitioned program).

Rules, per op of the program:

- **Partial results.** A dot_general or convolution whose contracting dims, or a reduce whose
  reduced dims, are sharded along axes A computes partial results on each device: the result
  needs an all-reduce over A, or a reduce-scatter over A when a use of the result wants it
  sharded along A (e.g. the output of Figure 5b). The all-reduces go as XLA's partitioned module
  has them: one per reduced dim, over the axes that split it (one replica group of all their
  devices, which NCCL runs hierarchically where it spans nodes: ``toast.cost.network``), the
  most minor axes first.
- **Uses.** A use whose sharding differs from its definition's needs, per axis: an
  all-gather (the definition is split along the axis, the use is not), an all-to-all (both
  are split along it, on different dims), or a local slice (only the use is split: free).
  Uses of one value with one sharding share the collective (as XLA's CSE merges them).
- **Halos.** An operand dim the op reads with a window wider than one row yet maps to its result's (the
  rules' ``halo_dim``: a causal or SAME convolution), split along axes A, needs each device's neighbours'
  edge rows: a collective-permute over A per side with rows to move (low, then high), of the halo's rows
  times the operand's other dims as the op uses them, as XLA's partitioner exchanges halos.
- **Dims an op cannot split.** An operand dim that the op's rules do not identify with a
  result dim (a concatenated, padded or sliced dim, ...) and that is not a reduction is used
  whole: if its definition is split, the use all-gathers it.

Sizes are bytes per device. A conflict resolution shows up as uses whose names are the
unsharded endpoint: the all-gather/reduce-scatter pairs of Figure 5b.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from itertools import chain
from typing import cast

import numpy as np

from toast.errors import ToastError
from toast.frontend.ir import TERMINATORS, Value
from toast.sharding.state import NamePartition, ShardingModel, ShardingState


def storage_bits(value: Value) -> int:
    """Bits one element of ``value`` occupies in device memory: its MLIR width (``Value.bits``:
    4 for ``i4``, 8 for ``f8E4M3FN``), except that a boolean (``i1``) takes a byte, as XLA stores
    ``pred``. Sub-byte types are packed (two ``i4`` per byte), as XLA packs them on GPU and TPU.

    Raises:
      ToastError: an element type without a width (quantized or opaque), which the cost
        model cannot price.
    """
    if not value.dtype:
        return 0  # a token: no data
    if value.bits <= 0:
        raise ToastError(f"{value.name}{' at ' + value.loc if value.loc else ''}: the cost model cannot price element "
                         f"type {value.dtype} (no bit width); give the program plain integer or float types")
    return 8 if value.bits == 1 else value.bits


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of the partitioned program.

    Attributes:
      kind: ``all-reduce``, ``reduce-scatter``, ``all-gather``, ``all-to-all`` or ``collective-permute`` (a
        halo exchange: ``bytes_in`` sent to a neighbour, as many received).
      axes: mesh axes it runs over (major to minor).
      value: the value id it moves (the result reduced, or the value gathered for a use).
      op: the op it belongs to (the producer for partial results, the user for uses).
      operand: the operand index for a use, ``-1`` for a result.
      bytes_in: bytes per device going in.
      bytes_out: bytes per device coming out.
      last_op: for a use, the last op that uses the value with this sharding (the resharded
        copy lives until then); ``op`` otherwise.
    """

    kind: str
    axes: tuple[str, ...]
    value: int
    op: int
    operand: int
    bytes_in: int
    bytes_out: int
    last_op: int = -1


def _collective_factory() -> Callable[[str, tuple[str, ...], int, int, int, int, int, int], Collective]:
    """``Collective(...)`` in half the time: the frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``; this sets the slots directly (the same object, as ``==`` and ``hash`` see it)."""
    make = object.__new__
    (set_kind, set_axes, set_value, set_op, set_operand, set_bytes_in, set_bytes_out,
     set_last_op) = (getattr(Collective, field.name).__set__ for field in fields(Collective))

    def new_collective(kind: str, axes: tuple[str, ...], value: int, op: int, operand: int, bytes_in: int,
                       bytes_out: int, last_op: int) -> Collective:
        collective = make(Collective)
        set_kind(collective, kind)
        set_axes(collective, axes)
        set_value(collective, value)
        set_op(collective, op)
        set_operand(collective, operand)
        set_bytes_in(collective, bytes_in)
        set_bytes_out(collective, bytes_out)
        set_last_op(collective, last_op)
        return collective

    return new_collective


_new_collective = _collective_factory()

KINDS: tuple[str, ...] = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
"""``Collective.kind`` by the codes of ``CollectiveTable.kind``."""
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, COLLECTIVE_PERMUTE = range(len(KINDS))

_MEMO_LIMIT = 1 << 16
"""``Collective`` objects a ``CommunicationModel`` keeps for reuse before it starts over."""


@dataclass(frozen=True, slots=True, eq=False)
class CollectiveTable:
    """The collectives of one state as parallel arrays: row i is the i-th ``Collective`` of
    ``CommunicationModel.collectives`` (same fields and order), with the kind as a code and the
    axes as a bit mask. The cost model computes with it; ``CommunicationModel.to_list`` makes the
    ``Collective`` objects.

    Attributes:
      kind: ``int64[n]``, an index into ``KINDS``.
      axes_mask: ``int64[n]``, bit k set when the collective runs over mesh axis k
        (``Mesh.mask_axes`` gives ``Collective.axes``).
      value: ``int64[n]``, the value id moved.
      op: ``int64[n]``, the op it belongs to.
      operand: ``int64[n]``, the operand index for a use, ``-1`` for a partial result.
      bytes_in: ``int64[n]``, bytes per device going in.
      bytes_out: ``int64[n]``, bytes per device coming out.
      last_op: ``int64[n]``, the last op using a resharded copy; ``-1`` for a partial result.
    """

    kind: np.ndarray
    axes_mask: np.ndarray
    value: np.ndarray
    op: np.ndarray
    operand: np.ndarray
    bytes_in: np.ndarray
    bytes_out: np.ndarray
    last_op: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)

    @staticmethod
    def concatenate(parts: list[CollectiveTable]) -> CollectiveTable:
        """The rows of ``parts``, one after the other."""
        if len(parts) == 1:
            return parts[0]
        return CollectiveTable(*(np.concatenate([getattr(part, name) for part in parts]) for name in _TABLE_FIELDS))

    @staticmethod
    def empty() -> CollectiveTable:
        """No collectives."""
        return CollectiveTable(*(np.zeros(0, dtype=np.int64) for _ in _TABLE_FIELDS))


_TABLE_FIELDS = tuple(field.name for field in fields(CollectiveTable))  # as Collective's, in its order
_NO_MASK = np.zeros(1, dtype=np.uint8)  # the padding part's mask (one device)


@dataclass(frozen=True, slots=True)
class ByteClasses:
    """Values whose bytes per device are equal in every state built on one ``NamePartition``
    (``CommunicationModel.byte_classes``): ranked classes first, then one class per scalar width.

    Attributes:
      value_class: ``int64[values]``, each value's class.
      parts: ``int64[max rank, ranked classes]``, the part of each dim (-1 past the rank).
      sizes: ``float64[max rank, ranked classes]``, each dim's size (1 past the rank).
      bits: ``int64[ranked classes]``, storage bits per element.
      scalar_bytes: ``int64[scalar classes]``, bytes of each scalar class.
    """

    value_class: np.ndarray
    parts: np.ndarray
    sizes: np.ndarray
    bits: np.ndarray
    scalar_bytes: np.ndarray


class CommunicationModel:
    """Static structure for deriving collectives quickly (built once per analysis and mesh)."""

    def __init__(self, model: ShardingModel):
        self.model = model
        analysis = model.analysis
        program, names = analysis.program, analysis.names
        defs = len(names.defs)
        producer = program.producer
        self.producer = producer
        ops, values = program.ops, program.values
        use_count = len(names.uses)
        # Each use name's op, operand and dim, and the value it reads (the op's operands flattened), as arrays: the
        # passes below are numpy over the names, not a Python loop per name.
        use_table = np.fromiter(chain.from_iterable(names.uses), dtype=np.int64, count=3 * use_count).reshape(-1, 3)
        use_op, use_operand, use_dim = use_table[:, 0], use_table[:, 1], use_table[:, 2]
        operand_counts = np.fromiter(map(len, (op.operands for op in ops)), dtype=np.int64, count=len(ops))
        flat_operands = np.fromiter(chain.from_iterable(op.operands for op in ops), dtype=np.int64,
                                    count=int(operand_counts.sum()))
        use_value = flat_operands[np.cumsum(operand_counts)[use_op] - operand_counts[use_op] + use_operand]
        def_base = np.asarray(names.def_base, dtype=np.int64).reshape(-1)
        self.use_def = def_base[use_value] + use_dim
        # The rules' summed_dim (partial sums): (op, operand, dim) rows, as a use name is.
        reducing = np.fromiter(map(analysis.summed_dims.__contains__, names.uses), dtype=bool, count=use_count)
        # (node, op) pairs of definition names: a use dim in such a node maps to a dim the op makes (one int64 key
        # per pair: node x (ops + 1) + op + 1, the op -1 for an argument).
        stride = len(ops) + 1
        node_of = np.asarray(analysis.node_of, dtype=np.int64)
        def_values = np.fromiter(chain.from_iterable(names.defs), dtype=np.int64, count=2 * defs)[::2]
        made = np.sort(node_of[:defs] * stride + np.asarray(producer, dtype=np.int64).reshape(-1)[def_values] + 1)
        use_keys = node_of[defs:defs + use_count] * stride + use_op + 1
        in_made = made[np.minimum(np.searchsorted(made, use_keys), len(made) - 1)] == use_keys if len(made) else \
            np.zeros(use_count, dtype=bool)
        terminator = np.fromiter((op.kind in TERMINATORS for op in ops), dtype=bool, count=len(ops))
        # A terminator passes its operands on as they are (a region's or the program's results); a manual region
        # (shard_map) takes each device's shard as it is.
        splittable = terminator[use_op] | in_made
        if analysis.manual_dims:
            splittable |= np.fromiter(map(analysis.manual_dims.__contains__, names.uses), dtype=bool, count=use_count)
        splittable &= ~reducing
        # Dims a use keeps whatever the state: a mask of 0xFF (keep) or 0 (must be whole).
        self.keep_mask = np.where(splittable | reducing, 0xFF, 0).astype(np.uint8)
        self.reducing_names = np.flatnonzero(reducing) + defs
        self.reducing_ops = np.ascontiguousarray(use_op[reducing])
        # Use sites with dims: (op, operand, value, first name, rank) in name order.
        rank_of_value = [len(v.shape) for v in values]
        self.use_sites = [(site.op, site.operand, site.value, site.first_name, rank_of_value[site.value])
                          for site in names.use_sites if rank_of_value[site.value]]
        self.uses_of_value: dict[int, list[tuple[int, int, int]]] = {}
        for op_id, _, value_id, first, rank in self.use_sites:
            self.uses_of_value.setdefault(value_id, []).append((op_id, first, rank))
        sites = np.fromiter(chain.from_iterable(self.use_sites), dtype=np.int64,
                            count=5 * len(self.use_sites)).reshape(-1, 5)  # the use sites' columns
        self.use_site_starts = sites[:, 3] - defs
        self.element_bits = np.asarray([storage_bits(v) for v in values], dtype=np.int64)
        self._axes_of_mask = [model.mesh.mask_axes(mask) for mask in range(256)]
        self._keep_bytes = self.keep_mask.tobytes()
        self._site_values = np.ascontiguousarray(sites[:, 2])
        self._defs = defs
        self._ranked_values = np.fromiter((v.id for v, rank in zip(values, rank_of_value, strict=True) if rank),
                                          dtype=np.int64)
        self._value_starts = def_base[self._ranked_values]
        self._init_value_bytes(defs)
        self._init_partial_results(defs)
        self._init_use_sites(sites)
        self._init_halos(defs)
        self._memo: dict[bytes, Collective] = {}  # a CollectiveTable row's bytes -> its Collective
        self._byte_classes: tuple[NamePartition, ByteClasses] | None = None

    def _init_value_bytes(self, defs: int) -> None:
        """Static arrays of ``value_bytes``: definition-name sizes as floats, and each ranked value's
        definition names as columns (``int64[max rank, ranked values]``, padded with ``defs``, where
        the local sizes hold a 1)."""
        model = self.model
        self._def_sizes = model.name_size[:defs].astype(np.float64)
        self._devices_float = model.devices_of_mask.astype(np.float64)
        ranks = np.diff(np.append(self._value_starts, defs)) if len(self._value_starts) else np.zeros(0, np.int64)
        max_rank = int(ranks.max()) if len(ranks) else 0
        columns = np.full((max_rank, len(ranks)), defs, dtype=np.int64)
        for dim in range(max_rank):
            has_dim = ranks > dim
            columns[dim, has_dim] = self._value_starts[has_dim] + dim
        self._dim_columns = columns
        self._ranked_bits = self.element_bits[self._ranked_values]
        self._scalar_bytes = (self.element_bits + 7) >> 3

    def _init_partial_results(self, defs: int) -> None:
        """Static arrays of the partial results: the reducing names grouped by op (ops ascending), the
        results of those ops ("entries", in op then result order), and, per entry, the use names
        ``scatter_dim`` scans (in its order) with their dims."""
        program, names = self.model.analysis.program, self.model.analysis.names
        order = np.argsort(self.reducing_ops, kind="stable")
        self._reducing_names_by_op = self.reducing_names[order]
        self._partial_ops, self._partial_op_starts = np.unique(self.reducing_ops[order], return_index=True)
        # The op (index into _partial_ops) of each reducing name in that order.
        self._reducing_owner = np.searchsorted(self._partial_op_starts, np.arange(len(order)), side="right") - 1
        entry_values: list[int] = []
        entry_owner: list[int] = []  # index into _partial_ops
        for owner, op_id in enumerate(self._partial_ops.tolist()):
            for value_id in program.ops[op_id].results:
                entry_values.append(value_id)
                entry_owner.append(owner)
        scan_names: list[int] = []
        scan_dims: list[int] = []
        scan_entry: list[int] = []
        for entry, value_id in enumerate(entry_values):
            for _, first, rank in self.uses_of_value.get(value_id, ()):
                scan_names.extend(range(first, first + rank))
                scan_dims.extend(range(rank))
                scan_entry.extend([entry] * rank)
        self._entry_values = np.asarray(entry_values, dtype=np.int64)
        self._entry_def_base = np.asarray([names.def_base[v] for v in entry_values], dtype=np.int64)
        self._entry_ops = self._partial_ops[np.asarray(entry_owner, dtype=np.int64)]
        self._entry_owner = np.asarray(entry_owner, dtype=np.int64)
        self._scan_names = np.asarray(scan_names, dtype=np.int64)
        self._scan_dims = np.asarray(scan_dims, dtype=np.int64)
        self._scan_entry = np.asarray(scan_entry, dtype=np.int64)
        self._scan_keep = self.keep_mask[self._scan_names - defs]

    def _init_use_sites(self, sites: np.ndarray) -> None:
        """Static arrays of the use sites (``sites``: ``use_sites`` as ``int64[sites, 5]``): op and operand, and
        each site's use names as a row of ``int64[sites, width]`` (offsets into use names; padded with
        ``len(uses)``, where the padded use masks hold a 0; width a multiple of 8 so that a row of masks reads as
        ``uint64`` words)."""
        self._site_ops = np.ascontiguousarray(sites[:, 0])
        self._site_operands = np.ascontiguousarray(sites[:, 1])
        ranks = np.ascontiguousarray(sites[:, 4])
        max_rank = int(ranks.max()) if len(ranks) else 0
        width = max(8, -(-max_rank // 8) * 8)
        rows = np.full((len(self.use_sites), width), len(self.use_def), dtype=np.int64)
        site = np.repeat(np.arange(len(ranks)), ranks)
        dim = np.arange(len(site)) - np.repeat(np.cumsum(ranks) - ranks, ranks)
        rows[site, dim] = self.use_site_starts[site] + dim
        self._site_use_names = rows
        self._max_use_rank = max(max_rank, 1)
        self._site_of_use = np.searchsorted(self.use_site_starts, np.arange(len(self.use_def)), side="right") - 1

    def _init_halos(self, defs: int) -> None:
        """Static arrays of the halo exchanges (``Analysis.halo_dims``), one row per side with rows to move
        (low, then high): op, operand, value, rows moved, the use name of the windowed dim, the use names of the
        operand's other dims (``int64[rows, max rank]``, padded with a name of a 1-element dim: ``defs + len(uses)``)
        and element bits."""
        analysis = self.model.analysis
        program, names = analysis.program, analysis.names
        rows: list[tuple[int, int, int, int, int, list[int]]] = []
        for op_id, operand, dim, low, high in analysis.halo_dims:
            value_id = program.ops[op_id].operands[operand]
            first = names.use_name(op_id, operand, 0)
            others = [first + d for d in range(len(program.values[value_id].shape)) if d != dim]
            rows.extend((op_id, operand, value_id, width, first + dim, others) for width in (low, high) if width > 0)
        pad = defs + len(self.use_def)
        width = max((len(row[5]) for row in rows), default=0)
        self._halo_ops = np.asarray([row[0] for row in rows], dtype=np.int64)
        self._halo_operands = np.asarray([row[1] for row in rows], dtype=np.int64)
        self._halo_values = np.asarray([row[2] for row in rows], dtype=np.int64)
        self._halo_rows = np.asarray([row[3] for row in rows], dtype=np.int64)
        self._halo_dim_names = np.asarray([row[4] for row in rows], dtype=np.int64)
        self._halo_other_names = np.asarray([row[5] + [pad] * (width - len(row[5])) for row in rows],
                                            dtype=np.int64).reshape(len(rows), width)
        self._halo_bits = self.element_bits[self._halo_values]

    def _halo_table(self, masks: np.ndarray) -> CollectiveTable | None:
        """The halo exchanges of ``masks``' state: a collective-permute per side of each windowed dim split along
        some axes (as the op uses it), of the side's rows times the local sizes of the operand's other dims as
        the op uses them; ``None`` when no windowed dim is split."""
        if not len(self._halo_ops):
            return None
        defs = self._defs
        keep = np.append(self.keep_mask, np.uint8(0))  # the padding name: never split
        use_masks = np.append(masks, np.uint8(0))
        axes = (use_masks[self._halo_dim_names] & keep[self._halo_dim_names - defs]).astype(np.int64)
        split = np.flatnonzero(axes)
        if not len(split):
            return None
        other = self._halo_other_names[split]
        sizes = np.append(self.model.name_size, 1)[other]
        devices = self.model.devices_of_mask[use_masks[other] & keep[other - defs]]
        elements = self._halo_rows[split] * np.prod(sizes // devices, axis=1, dtype=np.int64)
        nbytes = (elements * self._halo_bits[split] + 7) >> 3
        ops = self._halo_ops[split]
        return CollectiveTable(kind=np.full(len(split), COLLECTIVE_PERMUTE, dtype=np.int64), axes_mask=axes[split],
                               value=self._halo_values[split], op=ops, operand=self._halo_operands[split],
                               bytes_in=nbytes, bytes_out=nbytes, last_op=ops)

    def byte_classes(self, partition: NamePartition) -> ByteClasses:
        """The values grouped by what their bytes depend on in states built on ``partition``: element width
        and, per dim, size and part (values of repeated layers fall into one class). Kept for the last
        partition asked for."""
        cached = self._byte_classes
        if cached is not None and cached[0] is partition:
            return cached[1]
        defs = self._defs
        columns = self._dim_columns  # int64[max rank, ranked values], padded with ``defs``
        parts = np.append(partition.part_of_name[:defs], -1)[columns]
        sizes = np.append(self.model.name_size[:defs], 1)[columns]
        key = np.concatenate([parts, sizes, self._ranked_bits[None, :]]).T
        first, inverse = _unique_rows(key)
        scalars = np.ones(len(self._scalar_bytes), dtype=bool)
        scalars[self._ranked_values] = False
        scalar_bytes, scalar_inverse = np.unique(self._scalar_bytes[scalars], return_inverse=True)
        value_class = np.empty(len(self._scalar_bytes), dtype=np.int64)
        value_class[self._ranked_values] = inverse.ravel()
        value_class[scalars] = len(first) + scalar_inverse.ravel()
        classes = ByteClasses(value_class=value_class, parts=parts[:, first], sizes=sizes[:, first].astype(np.float64),
                              bits=self._ranked_bits[first], scalar_bytes=scalar_bytes)
        self._byte_classes = (partition, classes)
        return classes

    def class_bytes(self, state: ShardingState) -> np.ndarray:
        """``int64[classes]``: bytes per device of each of ``byte_classes(state.partition)``'s classes (the
        state must have a partition)."""
        assert state.partition is not None
        classes = self.byte_classes(state.partition)
        # The parts' masks; index -1 (padding) holds 0: one device, a local size of 1.
        part_masks = np.concatenate((state.part_masks(), _NO_MASK))
        local = np.floor(classes.sizes / self._devices_float.take(part_masks.take(classes.parts))).astype(np.int64)
        if len(local):
            # Elements: the product of the dims' local sizes (whole numbers: exact in any order).
            ranked = (np.multiply.reduce(local, axis=0) * classes.bits + 7) >> 3
        else:
            ranked = np.zeros(0, dtype=np.int64)
        return np.concatenate((ranked, classes.scalar_bytes))

    def value_and_class_bytes(self, state: ShardingState) -> tuple[np.ndarray, np.ndarray | None]:
        """``(value_bytes(state), class_bytes(state))``, the second ``None`` without a partition; each computed
        once."""
        if state.partition is None:
            return self.value_bytes(state), None
        class_bytes = self.class_bytes(state)
        return class_bytes.take(self.byte_classes(state.partition).value_class), class_bytes

    def value_bytes(self, state: ShardingState) -> np.ndarray:
        """``int64[values]``: bytes per device of every value's definition under ``state``."""
        if state.partition is not None:
            return self.value_and_class_bytes(state)[0]
        defs = self._defs
        # Local sizes: floor(size / devices) is exact in float64 (sizes below 2**53); index ``defs`` holds 1.
        local = np.ones(defs + 1, dtype=np.int64)
        np.floor(self._def_sizes / self._devices_float.take(state.masks[:defs]), out=local[:defs], casting="unsafe")
        found = self._scalar_bytes.copy()
        columns = self._dim_columns
        if len(columns):
            elements = local.take(columns[0])
            for column in columns[1:]:
                elements *= local.take(column)
            found[self._ranked_values] = (elements * self._ranked_bits + 7) >> 3  # whole bytes: packed sub-byte
        return found

    def collectives(self, state: ShardingState, value_bytes: np.ndarray | None = None) -> list[Collective]:
        """Every collective the state needs: partial results first, then uses, then halo exchanges, each in op
        order."""
        return self.to_list(self.table(state, value_bytes))

    def to_list(self, table: CollectiveTable) -> list[Collective]:
        """The ``Collective`` of each row of ``table``. Equal rows give the same (immutable) object:
        a search meets most collectives again and again, and making one costs more than looking it up."""
        rows = np.empty((len(table), len(_TABLE_FIELDS)), dtype=np.int64)
        for column, name in enumerate(_TABLE_FIELDS):
            rows[:, column] = getattr(table, name)
        # A row's bytes (a void scalar's ``tolist`` is its bytes).
        keys = cast(list[bytes], rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).ravel().tolist())
        memo = self._memo
        try:
            return [memo[key] for key in keys]
        except KeyError:
            pass
        if len(memo) + len(keys) > _MEMO_LIMIT:
            memo.clear()
        axes_of = self._axes_of_mask
        found = []
        for key, row in zip(keys, rows.tolist(), strict=True):
            collective = memo.get(key)
            if collective is None:
                kind, axes_mask, value, op, operand, bytes_in, bytes_out, last_op = row
                collective = _new_collective(KINDS[kind], axes_of[axes_mask], value, op, operand, bytes_in, bytes_out,
                                             last_op)
                memo[key] = collective
            found.append(collective)
        return found

    def table(self, state: ShardingState, value_bytes: np.ndarray | None = None) -> CollectiveTable:
        """The collectives of ``collectives`` as arrays (``value_bytes``: ``self.value_bytes(state)``, when
        the caller has it)."""
        if value_bytes is None:
            value_bytes = self.value_bytes(state)
        masks = state.masks
        # Partial results of reductions, resolved at the producer.
        partial, def_masks, value_bytes = self._partial_table(masks, value_bytes)
        # Uses whose sharding differs from their definition's.
        uses = self._use_table(masks, def_masks, value_bytes)
        # Halo exchanges of windowed dims split along some axes.
        halos = self._halo_table(masks)
        parts = [part for part in (partial, uses, halos) if part is not None]
        return CollectiveTable.concatenate(parts) if parts else CollectiveTable.empty()

    def _partial_table(self, masks: np.ndarray, value_bytes: np.ndarray,
                       ) -> tuple[CollectiveTable | None, np.ndarray, np.ndarray]:
        """The collectives of partial results (ops ascending, each op's results in order); the
        definition masks (``uint8[defs]``) and value bytes (``int64[values]``) after the reduce-scatters,
        which leave their values split along the reduced axes on the dim the first use wants."""
        defs = self._defs
        if not len(self._partial_ops):
            return None, masks[:defs], value_bytes
        reducing = masks[self._reducing_names_by_op]
        if not reducing.any():
            return None, masks[:defs], value_bytes
        op_masks = np.bitwise_or.reduceat(reducing, self._partial_op_starts)
        entry_masks = op_masks[self._entry_owner]  # uint8[entries]: the axes each result is partial over
        # scatter_dim for every entry at once: the first scanned use name that is split along all the axes
        # (read for the entries with axes only).
        scan_masks = entry_masks[self._scan_entry]
        wanted_at = np.flatnonzero((masks[self._scan_names] & self._scan_keep & scan_masks) == scan_masks)
        wanted = np.full(len(entry_masks), -1, dtype=np.int64)
        if len(wanted_at):
            owners = self._scan_entry[wanted_at]
            first = np.ones(len(owners), dtype=bool)
            first[1:] = owners[1:] != owners[:-1]
            wanted[owners[first]] = self._scan_dims[wanted_at[first]]
        selected = np.flatnonzero(entry_masks)
        axes = entry_masks[selected].astype(np.int64)
        values = self._entry_values[selected]
        dims = wanted[selected]
        scattered = dims >= 0
        sizes = value_bytes[values]
        out = sizes
        def_masks = masks[:defs]
        if scattered.any():
            # Reduce-scatter: the value is split along the axes on that dim from now on.
            scatter_axes = axes[scattered]
            out = sizes.copy()
            out[scattered] = sizes[scattered] // self.model.devices_of_mask[scatter_axes]
            def_masks = def_masks.copy()
            def_masks[self._entry_def_base[selected[scattered]] + dims[scattered]] |= scatter_axes.astype(np.uint8)
            value_bytes = value_bytes.copy()
            value_bytes[values[scattered]] = out[scattered]
        kind = np.where(scattered, REDUCE_SCATTER, ALL_REDUCE)
        ops = self._entry_ops[selected]
        # Otherwise one all-reduce per reduced dim's axes (a dim split over several axes is one all-reduce over
        # them all; dims split over different axes, one each), the most minor axes first: XLA's partitioner
        # reduces one contracting dim at a time.
        nonzero = np.flatnonzero(reducing)
        owner_masks = np.unique(self._reducing_owner[nonzero] * 256 + (255 - reducing[nonzero].astype(np.int64)))
        owners, dim_masks = owner_masks // 256, 255 - owner_masks % 256
        first_of_owner = np.searchsorted(owners, self._entry_owner[selected])
        counts = np.where(scattered, 1, np.searchsorted(owners, self._entry_owner[selected], side="right")
                          - first_of_owner)
        if counts.max() > 1:
            row_entry = np.repeat(np.arange(len(selected)), counts)
            position = np.arange(len(row_entry)) - np.repeat(np.cumsum(counts) - counts, counts)
            kind, axes, values, ops, sizes, out = (kind[row_entry], axes[row_entry], values[row_entry], ops[row_entry],
                                                   sizes[row_entry], out[row_entry])
            axes = np.where(kind == REDUCE_SCATTER, axes, dim_masks[first_of_owner[row_entry] + position])
        unused = np.full(len(kind), -1, dtype=np.int64)  # operand and last_op
        table = CollectiveTable(kind=kind, axes_mask=axes, value=values, op=ops, operand=unused, bytes_in=sizes,
                                bytes_out=out, last_op=unused)
        return table, def_masks, value_bytes

    def _use_table(self, masks: np.ndarray, def_masks: np.ndarray, value_bytes: np.ndarray,
                   ) -> CollectiveTable | None:
        """The collectives of use sites whose sharding differs from their definition's, in site order:
        per site an all-gather along the axes only the definition is split on, then an all-to-all along
        the axes both are split on (on different dims); ``None`` when no use needs one. ``def_masks``:
        ``uint8[defs]`` after the reduce-scatters; ``value_bytes``: ``int64[values]`` after them."""
        defs = self._defs
        padding = np.zeros(1, dtype=np.uint8)  # the use masks' entry at len(uses), for padded rows
        use_masks = np.concatenate((masks[defs:] & self.keep_mask, padding))
        extra = np.concatenate((def_masks.take(self.use_def) & ~use_masks[:-1], padding))
        moved_at = np.flatnonzero(extra != 0)
        if not len(moved_at):
            return None
        moved_sites = self._site_of_use[moved_at]
        hits = moved_sites[np.append(True, moved_sites[1:] != moved_sites[:-1])]
        names = self._site_use_names[hits]
        layouts = use_masks[names]  # uint8[hits, width]: each hit's use masks (zeros past its rank)
        moved_names = extra[names]
        moved = moved_names[:, 0].astype(np.int64)
        use_or = layouts[:, 0].astype(np.int64)
        for dim in range(1, self._max_use_rank):
            moved |= moved_names[:, dim]
            use_or |= layouts[:, dim]
        hit_values = self._site_values[hits]
        # One value resharded alike for several uses moves once (XLA's CSE merges the copies): group the hits
        # by (value, use masks); the first of a group carries the collectives, the last one's op frees the copy.
        kept, last_hit = cse_groups(hit_values, layouts)
        sites = hits[kept]
        last_op = self._site_ops[hits[last_hit[kept]]]
        moved, use_or = moved[kept], use_or[kept]
        to_all = moved & use_or
        gathered = moved & ~to_all
        in_bytes = value_bytes[hit_values[kept]]
        gathered_bytes = in_bytes * self.model.devices_of_mask[gathered]
        value, op, operand = self._site_values[sites], self._site_ops[sites], self._site_operands[sites]
        # XLA gathers one dim at a time, the last dim first: a value split on two dims (FSDP over one axis,
        # the layer's own split over another) is two all-gathers, each bytes_in -> bytes_in * its devices.
        per_dim = moved_names[kept][:, ::-1] & gathered[:, None].astype(np.uint8)  # [sites, dims last first]
        gather_site, gather_step = np.nonzero(per_dim)
        all_to_alls = to_all != 0
        if not all_to_alls.any() and len(gather_site) == len(sites):  # each site: one all-gather, of one dim
            return CollectiveTable(kind=np.full(len(sites), ALL_GATHER, dtype=np.int64), axes_mask=gathered,
                                   value=value, op=op, operand=operand, bytes_in=in_bytes, bytes_out=gathered_bytes,
                                   last_op=last_op)
        step_axes = per_dim[gather_site, gather_step].astype(np.int64)
        step_devices = self.model.devices_of_mask[step_axes]
        # Bytes out of each step: the site's bytes times the devices of its steps so far (steps in site order).
        later = np.flatnonzero(np.append(False, gather_site[1:] == gather_site[:-1]))  # a site's steps after its first
        grown = step_devices.copy()
        while len(later):  # a site has at most one step per dim: a few passes
            grown[later] = grown[later - 1] * step_devices[later]
            later = later[np.isin(later - 1, later)]
        step_out = in_bytes[gather_site] * grown
        step_in = step_out // step_devices
        # Rows: each site's gather steps, then its all-to-all.
        site_of_row = np.concatenate((gather_site, np.flatnonzero(all_to_alls)))
        order = np.argsort(site_of_row, kind="stable")
        kind = np.concatenate((np.full(len(gather_site), ALL_GATHER), np.full(int(all_to_alls.sum()), ALL_TO_ALL)))
        axes = np.concatenate((step_axes, to_all[all_to_alls]))
        bytes_in = np.concatenate((step_in, gathered_bytes[all_to_alls]))
        bytes_out = np.concatenate((step_out, gathered_bytes[all_to_alls]))
        rows = site_of_row[order]
        return CollectiveTable(kind=kind[order].astype(np.int64), axes_mask=axes[order], value=value[rows],
                               op=op[rows], operand=operand[rows], bytes_in=bytes_in[order],
                               bytes_out=bytes_out[order], last_op=last_op[rows])

    def use_axes(self, state: ShardingState, op_id: int, operand: int) -> tuple[tuple[str, ...], ...]:
        """Axes sharding each dim of an operand as the op uses it (a dim the op cannot split is
        whole)."""
        defs = len(self.model.analysis.names.defs)
        first = self.model.analysis.names.use_name(op_id, operand, 0)
        rank = len(self.model.analysis.program.values[self.model.analysis.program.ops[op_id].operands[operand]].shape)
        return tuple(self.model.mesh.mask_axes(int(state.masks[n]) & int(self.keep_mask[n - defs]))
                     for n in range(first, first + rank))

    def partial_results(self, state: ShardingState) -> dict[int, int]:
        """``op id -> axes mask`` of the ops whose results are partial sums over those axes."""
        partial_by_op: dict[int, int] = {}
        reducing_masks = state.masks[self.reducing_names]
        hits = np.flatnonzero(reducing_masks)
        for op_id, mask in zip(self.reducing_ops[hits].tolist(), reducing_masks[hits].tolist(), strict=True):
            partial_by_op[op_id] = partial_by_op.get(op_id, 0) | mask
        return partial_by_op

    def definition_axes(self, state: ShardingState) -> dict[int, tuple[tuple[str, ...], ...]]:
        """Shardings of the values a reduce-scatter leaves split on a dim their names are not:
        ``value id -> axes per dim`` (every other value is as ``ShardingModel.value_axes``)."""
        model = self.model
        found = {}
        for op_id, axes_mask in sorted(self.partial_results(state).items()):
            for value_id in model.analysis.program.ops[op_id].results:
                dim = self.scatter_dim(state, value_id, axes_mask)
                if dim is None:
                    continue
                base = model.analysis.names.def_base[value_id]
                rank = len(model.analysis.program.values[value_id].shape)
                masks = [int(state.masks[base + d]) | (axes_mask if d == dim else 0) for d in range(rank)]
                found[value_id] = tuple(model.mesh.mask_axes(m) for m in masks)
        return found

    def scatter_dim(self, state: ShardingState, value_id: int, axes_mask: int, masks: bytes | None = None,
                    ) -> int | None:
        """The dim the first use that shards the value along ``axes_mask`` wants it split on (``masks``:
        ``state.masks.tobytes()``, when the caller has it)."""
        if masks is None:
            masks = state.masks.tobytes()
        keep = self._keep_bytes
        defs = self._defs
        for _, first, rank in self.uses_of_value.get(value_id, ()):
            for dim in range(rank):
                if masks[first + dim] & keep[first + dim - defs] & axes_mask == axes_mask:
                    return dim
        return None


def _unique_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, axis=0, return_index=True, return_inverse=True)``'s index and inverse, ``int64[rows]`` each:
    the distinct rows in lexicographic order (column 0 first), each by its first occurrence, and each row's
    distinct row. A stable ``lexsort`` of the columns instead of numpy's sort of the rows as structured scalars,
    which took a tenth of a second per 50k rows."""
    if not len(key):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort(key.T[::-1])  # the last key sorts first: column 0 is the primary one
    ordered = key[order]
    starts = np.ones(len(key), dtype=bool)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    inverse = np.empty(len(key), dtype=np.int64)
    inverse[order] = np.cumsum(starts) - 1
    return order[starts].astype(np.int64, copy=False), inverse


def cse_groups(keys: np.ndarray, layouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """XLA's CSE of resharding copies: hits (in site order) with one key (the value, or its class) and one
    layout (``uint8[hits, width]`` use masks, ``width`` a multiple of 8) share one copy; the first hit of a group
    carries its collectives, the last one's op frees it.

    Returns ``(kept, last_hit)``: ``bool[hits]``, the first hit of each group; ``int64[hits]``, at each first hit
    the group's last hit (elsewhere undefined)."""
    words = np.ascontiguousarray(layouts).view(np.uint64)  # uint64[hits, width / 8]: 8 dims a word
    order = np.lexsort((*words.T, keys))  # stable: a group's hits stay in site order
    sorted_keys, sorted_words = keys[order], words[order]
    starts_group = np.empty(len(order), dtype=bool)
    starts_group[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=starts_group[1:])
    for word in range(words.shape[1]):
        starts_group[1:] |= sorted_words[1:, word] != sorted_words[:-1, word]
    first_hits = order[starts_group]
    kept = np.zeros(len(order), dtype=bool)
    kept[first_hits] = True
    last_hit = np.empty(len(order), dtype=np.int64)
    ends_group = np.empty(len(order), dtype=bool)
    ends_group[:-1] = starts_group[1:]
    ends_group[-1] = True
    last_hit[first_hits] = order[ends_group]
    return kept, last_hit
