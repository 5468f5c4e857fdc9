"""The collectives a sharding state needs (the communication of the partitioned program).

Rules, per op of the program:

- **Partial results.** A dot_general or convolution whose contracting dims, or a reduce whose
  reduced dims, are sharded along axes A computes partial results on each device: the result
  needs an all-reduce over A, or a reduce-scatter over A when a use of the result wants it
  sharded along A (e.g. the output of Figure 5b). An all-reduce over several axes is one
  all-reduce per axis, minor axis first: a hierarchical reduction, which is also how XLA's
  partitioned modules carry it out.
- **Uses.** A use whose sharding differs from its definition's needs, per axis: an
  all-gather (the definition is split along the axis, the use is not), an all-to-all (both
  are split along it, on different dims), or a local slice (only the use is split: free).
  Uses of one value with one sharding share the collective (as XLA's CSE merges them).
- **Dims an op cannot split.** An operand dim that the op's rules do not identify with a
  result dim (a concatenated, padded or sliced dim, ...) and that is not a reduction is used
  whole: if its definition is split, the use all-gathers it.

Sizes are bytes per device. A conflict resolution shows up as uses whose names are the
unsharded endpoint: the all-gather/reduce-scatter pairs of Figure 5b.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from toast.errors import ToastError
from toast.frontend.ir import TERMINATORS, Value
from toast.sharding.state import ShardingModel, ShardingState


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
      kind: ``all-reduce``, ``reduce-scatter``, ``all-gather`` or ``all-to-all``.
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


class CommunicationModel:
    """Static structure for deriving collectives quickly (built once per analysis and mesh)."""

    def __init__(self, model: ShardingModel):
        self.model = model
        analysis = model.analysis
        program, names = analysis.program, analysis.names
        defs = len(names.defs)
        producer = program.producer
        self.producer = producer
        # (node, op) pairs of definition names: a use dim in such a node maps to a dim the op makes.
        made = {(int(analysis.node_of[name]), producer[value_id]) for name, (value_id, _) in enumerate(names.defs)}
        use_count = len(names.uses)
        self.use_def = np.empty(use_count, dtype=np.int64)
        splittable = np.zeros(use_count, dtype=bool)
        reducing = np.zeros(use_count, dtype=bool)
        reduced_dims: dict[int, set[tuple[int, int]]] = {op.id: set() for op in program.ops}
        for op_id, operand, dim in analysis.summed_dims:  # the rules' summed_dim (partial sums)
            reduced_dims[op_id].add((operand, dim))
        terminators = {op.id for op in program.ops if op.kind in TERMINATORS}
        for offset, (op_id, operand, dim) in enumerate(names.uses):
            value_id = program.ops[op_id].operands[operand]
            self.use_def[offset] = names.def_base[value_id] + dim
            if (operand, dim) in reduced_dims[op_id]:
                reducing[offset] = True
            elif op_id in terminators or (int(analysis.node_of[defs + offset]), op_id) in made:
                # A terminator passes its operands on as they are (a region's or the program's results).
                splittable[offset] = True
        # Dims a use keeps whatever the state: a mask of 0xFF (keep) or 0 (must be whole).
        self.keep_mask = np.where(splittable | reducing, 0xFF, 0).astype(np.uint8)
        self.reducing_names = np.flatnonzero(reducing) + defs
        self.reducing_ops = np.asarray([names.uses[n - defs][0] for n in self.reducing_names.tolist()], dtype=np.int64)
        # Use sites with dims: (op, operand, value, first name, rank) in name order.
        self.use_sites = [(site.op, site.operand, site.value, site.first_name, len(program.values[site.value].shape))
                          for site in names.use_sites if program.values[site.value].shape]
        self.uses_of_value: dict[int, list[tuple[int, int, int]]] = {}
        for op_id, _, value_id, first, rank in self.use_sites:
            self.uses_of_value.setdefault(value_id, []).append((op_id, first, rank))
        self.use_site_starts = np.asarray([s[3] - defs for s in self.use_sites], dtype=np.int64)
        self.element_bits = np.asarray([storage_bits(v) for v in program.values], dtype=np.int64)
        self._axes_of_mask = [model.mesh.mask_axes(mask) for mask in range(256)]
        self._keep_bytes = self.keep_mask.tobytes()
        self._devices_of_mask = model.devices_of_mask.tolist()
        self._site_values = np.asarray([site[2] for site in self.use_sites], dtype=np.int64)
        self._defs = defs
        self._value_starts = np.asarray([names.def_base[v.id] for v in program.values if v.shape], dtype=np.int64)
        self._ranked_values = np.asarray([v.id for v in program.values if v.shape], dtype=np.int64)

    def value_bytes(self, state: ShardingState) -> np.ndarray:
        """``int64[values]``: bytes per device of every value's definition under ``state``."""
        model = self.model
        defs = len(model.analysis.names.defs)
        local = model.name_size[:defs] // model.devices_of_mask[state.masks[:defs]]
        elements = np.ones(len(self.element_bits), dtype=np.int64)
        if len(self._value_starts):
            elements[self._ranked_values] = np.multiply.reduceat(local, self._value_starts)
        return (elements * self.element_bits + 7) // 8  # whole bytes: packed sub-byte elements

    def collectives(self, state: ShardingState, value_bytes: np.ndarray | None = None) -> list[Collective]:
        """Every collective the state needs: partial results first, then uses, each in op order."""
        model, analysis = self.model, self.model.analysis
        program, names = analysis.program, analysis.names
        defs = len(names.defs)
        masks = state.masks
        mask_bytes = masks.tobytes()
        devices = model.devices_of_mask
        axes_of = self._axes_of_mask.__getitem__
        value_bytes = (self.value_bytes(state) if value_bytes is None else value_bytes).copy()
        found: list[Collective] = []
        # Partial results of reductions, resolved at the producer.
        partial_by_op = self.partial_results(state)
        def_masks_at_use = masks[self.use_def]
        for op_id in sorted(partial_by_op):
            axes_mask = partial_by_op[op_id]
            for value_id in program.ops[op_id].results:
                size = int(value_bytes[value_id])
                wanted = self.scatter_dim(state, value_id, axes_mask, mask_bytes)
                if wanted is None:
                    # Over several axes, one all-reduce per axis, minor first (as XLA's module has it).
                    for axis in reversed(axes_of(axes_mask)):
                        found.append(Collective("all-reduce", (axis,), value_id, op_id, -1, size, size))
                    continue
                # Reduce-scatter: the value is split along the axes on that dim from now on.
                def_name = names.def_base[value_id] + wanted
                new_mask = int(masks[def_name]) | axes_mask
                def_masks_at_use[self._uses_of_def_name(def_name)] = new_mask
                out = size // int(devices[axes_mask])
                value_bytes[value_id] = out
                found.append(Collective("reduce-scatter", axes_of(axes_mask), value_id, op_id, -1, size, out))
        # Uses whose sharding differs from their definition's.
        use_masks = masks[defs:] & self.keep_mask
        extra = def_masks_at_use & ~use_masks
        if not extra.any():
            return found
        starts = self.use_site_starts
        moved = np.bitwise_or.reduceat(extra, starts)
        use_or = np.bitwise_or.reduceat(use_masks, starts)
        seen: dict[tuple[int, bytes], list[int]] = {}
        last_user: dict[tuple[int, bytes], int] = {}
        hits = np.flatnonzero(moved)
        use_mask_bytes = use_masks.tobytes()
        devices_of = self._devices_of_mask
        use_sites = self.use_sites
        for site, site_moved, site_use_or, site_bytes in zip(
                hits.tolist(), moved[hits].tolist(), use_or[hits].tolist(),
                value_bytes[self._site_values[hits]].tolist(), strict=True):
            op_id, operand, value_id, first, rank = use_sites[site]
            # One value resharded alike for several uses moves once (XLA's CSE merges the copies).
            layout = (value_id, use_mask_bytes[first - defs:first - defs + rank])
            if layout in seen:
                last_user[layout] = op_id
                continue
            seen[layout] = []
            in_bytes = site_bytes
            to_all = site_moved & site_use_or
            gathered = site_moved & ~to_all
            if gathered:
                out_bytes = in_bytes * devices_of[gathered]
                seen[layout].append(len(found))
                found.append(Collective("all-gather", axes_of(gathered), value_id, op_id, operand, in_bytes, out_bytes,
                                        op_id))
                in_bytes = out_bytes
            if to_all:
                seen[layout].append(len(found))
                found.append(Collective("all-to-all", axes_of(to_all), value_id, op_id, operand, in_bytes, in_bytes,
                                        op_id))
        for layout, op_id in last_user.items():  # once per shared layout, not per use
            for index in seen[layout]:
                found[index] = replace(found[index], last_op=op_id)
        return found

    def _uses_of_def_name(self, def_name: int) -> np.ndarray:
        """Indices (into use names) of the uses of one definition name."""
        order = getattr(self, "_use_order", None)
        if order is None:
            order = np.argsort(self.use_def, kind="stable")
            self._use_order = order
            self._sorted_use_def = self.use_def[order]
        low, high = np.searchsorted(self._sorted_use_def, [def_name, def_name + 1])
        return order[low:high]

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
