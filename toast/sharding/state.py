"""Sharding states: which mesh axes shard which dimension names, set by actions.

An action (section 4.2) is ``(color, resolution bits, axis)``: shard every dimension name of
the color along the mesh axis, except, in each conflict of that color, the endpoint the
resolution does not pick (``Conflicts.unsharded_nodes``). The state (section 4.3) is the
map from every dimension name to the axes sharding it, kept as one byte per name (bit k is
mesh axis k), so two action orders that give the same sharding give the same state.

From the state follow the sharding of every definition and every use (the names of their
dims), and its validity: an axis may shard at most one dim of a tensor, and every sharded dim
(and every reshape factor a dim is identified through) must be divisible by the number of
devices it is split over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from toast.analysis.named_dimensions import Analysis
from toast.errors import ToastError
from toast.sharding.mesh import Mesh

POPCOUNT = np.array([bin(m).count("1") for m in range(256)], dtype=np.int64)


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D integer array, by a sort: numpy 2's unique hashes, several times slower on
    the hundreds of thousands of distinct keys of a big program's names."""
    ordered = np.sort(values, kind="stable")
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


@dataclass(frozen=True, slots=True)
class Action:
    """Shard ``color`` along mesh ``axis``; ``resolution`` has one bit per resolution group
    (``Conflicts.groups``; empty means all zeros)."""

    color: int
    axis: str
    resolution: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ShardNodes:
    """An action on nodes: shard these dimension-graph nodes (I-classes) along ``axis`` (a manual
    strategy's FSDP, a search's stored action). ``label`` says what they are (``"params['wte']:0 update chain"``)."""

    nodes: tuple[int, ...]
    axis: str
    label: str


class InvalidState(ToastError):
    """A state no SPMD program can have (an axis twice in a tensor, a dim not divisible)."""


@dataclass(frozen=True, eq=False, slots=True)
class NamePartition:
    """Dimension names grouped into parts whose names share one mask in every state built on the partition
    (a search's atoms: names that start alike and that the same actions shard). A cost model computes such
    a state per part where it can: as much work at 24 repeated layers as at 6.

    Attributes:
      part_of_name: ``int64[names]``, each name's part.
      first_name: ``int64[parts]``, each part's first name (its mask is the part's).
    """

    part_of_name: np.ndarray
    first_name: np.ndarray


@dataclass(frozen=True, eq=False, slots=True)
class ShardingState:
    """Axes sharding every dimension name.

    Attributes:
      mesh: the logical mesh.
      masks: ``uint8[names]``; bit k set when mesh axis k shards the name.
      actions: the actions applied, in order.
      partition: where given, every name has its part's mask
        (``masks == masks[partition.first_name][partition.part_of_name]``).
    """

    mesh: Mesh
    masks: np.ndarray
    actions: tuple[Action | ShardNodes, ...]
    partition: NamePartition | None = None
    # ``uint8[parts]``, each part's mask, where the state was built from them (``of_parts``).
    parts: np.ndarray | None = field(default=None, repr=False)

    @staticmethod
    def of_parts(mesh: Mesh, parts: np.ndarray, actions: tuple[Action | ShardNodes, ...],
                 partition: NamePartition) -> ShardingState:
        """The state whose every name takes its part's mask (``parts``: ``uint8[parts]``); ``masks`` is made
        from them when first read. A search costs thousands of states, and a cost model reads a state built on
        its partition per part (``part_masks``): expanding every state to its names (330k on a 70B step) would
        cost more than some of the pricing."""
        state = object.__new__(ShardingState)
        for name, value in (("mesh", mesh), ("actions", actions), ("partition", partition), ("parts", parts)):
            object.__setattr__(state, name, value)
        return state

    if not TYPE_CHECKING:  # for the type checker ``masks`` is a plain field
        def __getattr__(self, name: str):
            # Called only where the attribute is unset: ``masks`` of a state built by ``of_parts``.
            if name != "masks" or self.parts is None:
                raise AttributeError(name)
            masks = self.parts[self.partition.part_of_name]
            object.__setattr__(self, "masks", masks)
            return masks

    def part_masks(self) -> np.ndarray:
        """``uint8[parts]``: each part's mask (the state must have a partition)."""
        assert self.partition is not None
        return self.parts if self.parts is not None else self.masks[self.partition.first_name]

    def key(self) -> bytes:
        """A hashable key: equal for states that shard alike, whatever the action order."""
        return self.masks.tobytes()


def spec_entries(dim_axes: Sequence[tuple[str, ...]]) -> tuple:
    """``jax.sharding.PartitionSpec`` entries of per-dim axes: ``None``, an axis name, or a tuple
    of axis names (major to minor) per dim."""
    return tuple(None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in dim_axes)


class ShardingModel:
    """The static structure of an analysis that states are read against (built once, linear).

    Attributes:
      analysis: the named-dimension analysis with its conflicts.
      mesh: the logical mesh.
      name_size: ``int64[names]``, elements along each name's dim.
      site_starts: start index of each site (definition or use with at least one dim) in
        name order; a site's names are contiguous.
      value_sites: ``value id -> site index`` of its definition (``-1`` for scalars).
    """

    def __init__(self, analysis: Analysis, mesh: Mesh):
        self.analysis = analysis
        self.mesh = mesh
        program, names = analysis.program, analysis.names
        sizes = [program.values[v].shape[d] for v, d in names.defs]
        sizes += [program.values[program.ops[op].operands[k]].shape[d] for op, k, d in names.uses]
        self.name_size = np.asarray(sizes, dtype=np.int64)
        starts = [base for value, base in zip(program.values, names.def_base, strict=True) if value.shape]
        previous = None
        for offset, (op, k, _) in enumerate(names.uses):
            if (op, k) != previous:
                starts.append(len(names.defs) + offset)
                previous = (op, k)
        self.site_starts = np.asarray(starts, dtype=np.int64)
        self._site_ends = np.append(self.site_starts[1:], names.count).astype(np.int64)
        # The masks of the last state ``problem`` found valid (replaced, never written into: a reader holding the
        # old one still holds a valid state's masks).
        self._valid_masks: np.ndarray | None = None
        order = np.argsort(analysis.color_of, kind="stable")
        bounds = np.searchsorted(analysis.color_of[order], np.arange(len(analysis.colors) + 1))
        self._names_of_color = [order[bounds[c]:bounds[c + 1]] for c in range(len(analysis.colors))]
        self._node_order: np.ndarray | None = None  # names sorted by node, and where each node's start
        self._node_bounds: np.ndarray | None = None
        self.factor_names = np.asarray(sorted(analysis.major_factors), dtype=np.int64)
        self.factor_sizes = np.asarray([analysis.major_factors[n] for n in self.factor_names.tolist()],
                                       dtype=np.int64)
        self.devices_of_mask = np.asarray([mesh.mask_size(m) for m in range(256)], dtype=np.int64)
        # First use name of each returned operand of @main's func.return (-1 for scalars).
        returns = [op for op in program.ops if op.kind == "func.return" and op.parent is None]
        self.result_first_names = tuple(
            names.use_name(returns[-1].id, k, 0) if program.values[v].shape else -1
            for k, v in enumerate(returns[-1].operands)) if returns else ()
        self._manual_sites = self._init_manual_sites()

    def _init_manual_sites(self) -> tuple[tuple[int, int, tuple[int, ...], tuple[int, ...], str], ...]:
        """The operands entering a manual region (shard_map) with dims its manual axes split (``Analysis.manual_dims``):
        ``(first use name, rank, the dims, the devices each is split over, the op's label)``, per operand."""
        analysis = self.analysis
        program, names = analysis.program, analysis.names
        dims_of: dict[tuple[int, int], list[int]] = {}
        for op_id, operand, dim in sorted(analysis.manual_dims):
            dims_of.setdefault((op_id, operand), []).append(dim)
        sites = []
        for (op_id, operand), dims in dims_of.items():
            op = program.ops[op_id]
            inside = op.regions[0][operand] if op.regions else op.results[0]  # the local (per-device) value
            outside = program.values[op.operands[operand]].shape
            local = program.values[inside].shape
            sites.append((names.use_name(op_id, operand, 0), len(outside), tuple(dims),
                          tuple(outside[d] // max(local[d], 1) for d in dims), f"{op.kind} {program.op_label(op_id)}"))
        return tuple(sites)

    @property
    def has_manual_regions(self) -> bool:
        """Whether an operand enters a manual region (shard_map) split by its manual axes: then a state's validity
        is not monotone (a manual dim split over some of its manual axes is invalid, over all of them valid);
        elsewhere every state made of a valid state's axes, or of fewer, is valid."""
        return bool(self._manual_sites)

    def initial(self) -> ShardingState:
        """The unsharded state (every name replicated)."""
        return ShardingState(self.mesh, np.zeros(self.analysis.names.count, dtype=np.uint8), ())

    def names_of_color(self, color: int) -> np.ndarray:
        if not 0 <= color < len(self._names_of_color):
            raise ToastError(f"no color {color} (this program has colors 0..{len(self._names_of_color) - 1})")
        return self._names_of_color[color]

    def names_of_nodes(self, nodes: Sequence[int]) -> np.ndarray:
        """The names of dimension-graph ``nodes`` (I-classes), ascending."""
        if self._node_order is None or self._node_bounds is None:
            node_of = self.analysis.node_of
            self._node_order = np.argsort(node_of, kind="stable")
            self._node_bounds = np.searchsorted(node_of[self._node_order], np.arange(int(node_of.max(initial=-1)) + 2))
        order, bounds = self._node_order, self._node_bounds
        # Each node's run of ``order``, laid end to end in arrays (an FSDP strategy asks for thousands of
        # parameters' nodes, dozens each).
        wanted = distinct(np.fromiter(nodes, dtype=np.int64))
        wanted = wanted[(wanted >= 0) & (wanted < len(bounds) - 1)]
        starts, lengths = bounds[wanted], bounds[wanted + 1] - bounds[wanted]
        offsets = np.cumsum(lengths) - lengths
        return np.sort(order[np.arange(int(lengths.sum())) + np.repeat(starts - offsets, lengths)])

    def apply(self, state: ShardingState, action: Action, *, check: bool = True) -> ShardingState:
        """The state after ``action``; ``InvalidState`` when the result is invalid and ``check``."""
        conflicts = self.analysis.conflicts
        bits = action.resolution or (0,) * conflicts.resolution_bits
        if len(bits) != conflicts.resolution_bits:
            raise ToastError(f"action on color {action.color}: {len(bits)} resolution bits given, the program has "
                             f"{conflicts.resolution_bits}")
        bit = np.uint8(1 << self.mesh.index(action.axis))
        names = self.names_of_color(action.color)
        unsharded = conflicts.unsharded_nodes(action.color, bits)
        if unsharded:
            names = names[~np.isin(self.analysis.node_of[names], np.fromiter(unsharded, dtype=np.int64))]
        masks = state.masks.copy()
        masks[names] |= bit
        result = ShardingState(self.mesh, masks, state.actions + (action,))
        if check:
            problem = self.problem(result)
            if problem:
                raise InvalidState(f"action (color {action.color}, axis {action.axis}): {problem}")
        return result

    def problem(self, state: ShardingState) -> str:
        """The first reason ``state`` is invalid, or ``""``.

        A state a few actions away from the last one found valid (a strategy's actions applied one at a time,
        each checked) is checked on the names that differ alone: every reason names a site, a name or a
        reshape factor whose masks changed, so the answer is the full check's, at the cost of the change."""
        masks = state.masks
        valid = self._valid_masks
        changed = None
        if valid is not None and len(valid) == len(masks):
            changed = np.flatnonzero(masks != valid)
            if len(changed) * 8 > len(masks):  # most names changed: the full check is as fast
                changed = None
        found = self._problem_of(masks, changed)
        if not found:
            self._valid_masks = masks.copy()
        return found

    def _problem_of(self, masks: np.ndarray, changed: np.ndarray | None) -> str:
        """``problem`` of ``masks``, checking only the sites, names and factors of the ``changed`` names (ascending;
        the other names' masks are a valid state's) or, ``None``, all of them."""
        starts = self.site_starts
        if changed is not None and len(starts):
            # The sites holding a changed name, and their names laid end to end.
            starts = starts[np.unique(np.searchsorted(self.site_starts, changed, side="right") - 1)]
            lengths = self._site_ends[np.searchsorted(self.site_starts, starts)] - starts
            offsets = np.cumsum(lengths) - lengths
            site_names = np.arange(int(lengths.sum())) + np.repeat(starts - offsets, lengths)
            sites, site_masks = offsets, masks[site_names]
        else:
            sites, site_masks = starts, masks
        if len(sites):
            combined = np.bitwise_or.reduceat(site_masks, sites)
            counted = np.add.reduceat(POPCOUNT[site_masks], sites)
            twice = np.flatnonzero(POPCOUNT[combined] != counted)
            if len(twice):
                name = int(starts[twice[0]])
                return f"{self._site_label(name)}: one mesh axis shards two of its dims"
        if changed is None:
            bad = np.flatnonzero(self.name_size % self.devices_of_mask[masks])
        else:
            bad = changed[np.flatnonzero(self.name_size[changed] % self.devices_of_mask[masks[changed]])]
        if len(bad):
            name = int(bad[0])
            return (f"{self._name_label(name)} has {self.name_size[name]} elements, not divisible by the "
                    f"{self.devices_of_mask[masks[name]]} devices of {'x'.join(self.mesh.mask_axes(int(masks[name])))}")
        factors = np.flatnonzero(np.isin(self.factor_names, changed)) if changed is not None else \
            np.arange(len(self.factor_names))
        if len(factors):
            devices = self.devices_of_mask[masks[self.factor_names[factors]]]
            bad = np.flatnonzero(self.factor_sizes[factors] % devices)
            if len(bad):
                name = int(self.factor_names[factors[bad[0]]])
                return (f"{self._name_label(name)} is reshaped through a factor of "
                        f"{self.factor_sizes[factors[bad[0]]]}, not divisible by {devices[bad[0]]} devices")
        return self._manual_problem(masks)

    def _manual_problem(self, masks: np.ndarray) -> str:
        """A manual region (shard_map) splits its operands' manual dims over devices of its own: such a dim is
        split over that many devices or none, and the mesh axes doing it split no other dim of the operand (inside,
        the region's shapes are already each device's)."""
        for first, rank, dims, factors, label in self._manual_sites:
            taken = 0
            for dim, factor in zip(dims, factors, strict=True):
                mask = int(masks[first + dim])
                if mask and self.devices_of_mask[mask] != factor:
                    return (f"{label}: its manual axes split dim {dim} over {factor} devices, the state over "
                            f"{self.devices_of_mask[mask]} ({'x'.join(self.mesh.mask_axes(mask))})")
                taken |= mask or self._mask_of_devices(factor)
            for dim in range(rank):
                if dim not in dims and int(masks[first + dim]) & taken:
                    axes = "x".join(self.mesh.mask_axes(int(masks[first + dim]) & taken))
                    return (f"{label}: mesh axes {axes} are its manual axes (they split dim {dims[0]}); they cannot "
                            f"also split dim {dim}")
        return ""

    def manual_exclusions(self) -> tuple[np.ndarray, np.ndarray]:
        """``(int64[n], uint8[n])``: dimension names a manual region's operands hold beside its manual dims, and the
        mesh axes (a mask: the first axes whose devices multiply to the manual split) that may not split them, as
        ``problem`` says; for a search that checks states incrementally."""
        names: list[int] = []
        masks: list[int] = []
        for first, rank, dims, factors, _ in self._manual_sites:
            taken = 0
            for factor in factors:
                taken |= self._mask_of_devices(factor)
            if taken:
                others = [first + dim for dim in range(rank) if dim not in dims]
                names += others
                masks += [taken] * len(others)
        return np.asarray(names, dtype=np.int64), np.asarray(masks, dtype=np.uint8)

    def _mask_of_devices(self, devices: int) -> int:
        """The mesh axes (a mask, the first in mask order) whose devices multiply to ``devices``; 0 where none do."""
        found = np.flatnonzero(self.devices_of_mask[:1 << len(self.mesh.axes)] == devices)
        return int(found[0]) if devices > 1 and len(found) else 0

    def dim_axes(self, state: ShardingState, names: Sequence[int]) -> tuple[tuple[str, ...], ...]:
        """Axes sharding each of ``names`` (major to minor)."""
        return tuple(self.mesh.mask_axes(int(state.masks[n])) for n in names)

    def value_axes(self, state: ShardingState, value_id: int) -> tuple[tuple[str, ...], ...]:
        """Axes sharding each dim of the value's definition."""
        base = self.analysis.names.def_base[value_id]
        return self.dim_axes(state, range(base, base + len(self.analysis.program.values[value_id].shape)))

    def result_axes(self, state: ShardingState, index: int) -> tuple[tuple[str, ...], ...]:
        """Axes sharding each dim of result ``index`` as ``@main`` returns it (its use by
        ``func.return``, which a conflict resolution may shard unlike the definition)."""
        value_id = self.analysis.program.results[index]
        first = self.result_first_names[index]
        rank = len(self.analysis.program.values[value_id].shape)
        return self.dim_axes(state, range(first, first + rank)) if first >= 0 else ()

    def partition_spec(self, state: ShardingState, value_id: int) -> tuple:
        """The value's definition sharding as ``jax.sharding.PartitionSpec`` entries."""
        return spec_entries(self.value_axes(state, value_id))

    def _name_label(self, name: int) -> str:
        from toast.analysis.naming import describe_name

        return describe_name(self.analysis, name)

    def _site_label(self, first_name: int) -> str:
        """The definition or use whose dim 0 is ``first_name``, in words."""
        program, names = self.analysis.program, self.analysis.names
        if first_name < len(names.defs):
            return program.values[names.defs[first_name][0]].name
        op_id, operand, _ = names.uses[first_name - len(names.defs)]
        op = program.ops[op_id]
        return f"{program.values[op.operands[operand]].name} as operand {operand} of {op.kind}"
