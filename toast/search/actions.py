"""The search's action space (TOAST sections 4.2 and 4.4), computed once ahead of the search.

An action is ``(colors, resolution, axis)``: shard every dimension name of the colors along the mesh
axis, except, in each conflict, the endpoint the resolution bits do not pick (``Conflicts.unsharded_nodes``).
``colors`` is one color, or a **mirror class**: the colors of corresponding dims of repeated layers.

- **Repeated layers** (section 4.4). Function arguments are grouped by a key built from all their uses (each
  use's op kind, operand position, result types and attributes, with the argument's own type): the
  parameters of repeated layers are used alike. Dim ``d`` of every member of a group is one decision, so
  the colors of those dims form one class (union-find). Colors of intermediates alone (no argument dim) are
  mirrored when their names are made and used alike (same ops, dims, shapes, element types): a per-layer
  activation dim. A 24-layer model then has the action space of a 1-layer one.
- **Pruning.** Classes whose colors hold fewer than ``min_names`` distinct dimension names are dropped (the
  paper's threshold is 10): sharding them cannot pay. So are actions on an axis that does not divide one of
  their dims (unit dims of broadcasts and reshapes): never valid.
- **Resolution orders.** Only the resolution bits of the class's own conflicts vary; the others stay 0, so
  no two actions are the same decision.
- **Validity** depends on the state and is checked when an action is taken (``ActionSpace.apply``): an action
  that changes nothing, shards a tensor twice along one axis, splits a dim (or a reshape factor) its axis
  does not divide, or changes a pinned argument is invalid there.

Pins (``pinned``) are argument shardings the search must keep: they form the initial state, and a pin that
contradicts the program's colors (two pins giving one color different axes) is an error naming both.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from toast.errors import ToastError
from toast.sharding.state import POPCOUNT, Action, InvalidState, ShardingModel, ShardingState

# More resolution bits than this on one class: only all-0 and all-1 orders are offered (2^bits would explode).
MAX_ENUMERATED_BITS = 4


@dataclass(frozen=True, slots=True)
class SearchAction:
    """One action of the search.

    Attributes:
      colors: the colors it shards (one, or a mirror class of repeated layers), ascending.
      axis: the mesh axis.
      resolution: one bit per resolution group (``Conflicts.groups``).
    """

    colors: tuple[int, ...]
    axis: str
    resolution: tuple[int, ...]

    def as_actions(self) -> tuple[Action, ...]:
        """The same as ``toast.Action``s, one per color (what ``ShardingModel.apply`` takes)."""
        return tuple(Action(color, self.axis, self.resolution) for color in self.colors)


def argument_groups(model: ShardingModel) -> list[list[int]]:
    """Indices of ``@main``'s arguments grouped by their use key (section 4.4); groups of two or more, each
    ascending, ordered by first member."""
    program = model.analysis.program
    uses: dict[int, list[tuple]] = {v: [] for v in program.arguments}
    for op in program.ops:
        for position, value_id in enumerate(op.operands):
            if value_id in uses:
                results = tuple((program.values[r].shape, program.values[r].dtype) for r in op.results)
                uses[value_id].append((op.kind, position, results, repr(op.attrs)))
    groups: dict[tuple, list[int]] = {}
    for index, value_id in enumerate(program.arguments):
        value = program.values[value_id]
        if not value.shape:
            continue
        key = (value.shape, value.dtype, tuple(sorted(uses[value_id])))
        groups.setdefault(key, []).append(index)
    return sorted(g for g in groups.values() if len(g) > 1)


def mirror_classes(model: ShardingModel, *, mirror_layers: bool = True) -> list[tuple[int, ...]]:
    """The colors grouped by repeated layers (each class ascending, classes by first color); every color is in
    exactly one class."""
    analysis = model.analysis
    color_count = len(analysis.colors)
    parent = list(range(color_count))

    def find(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    if mirror_layers:
        program, names = analysis.program, analysis.names
        for group in argument_groups(model):
            values = [program.arguments[i] for i in group]
            for dim in range(len(program.values[values[0]].shape)):
                colors = [int(analysis.color_of[names.def_base[v] + dim]) for v in values]
                for other in colors[1:]:
                    a, b = find(colors[0]), find(other)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
        # Colors of intermediates only (no argument dim) are mirrored when they look alike: the same ops use
        # and make their names at the same dims of the same shapes (a per-layer activation dim).
        argument_colors = {int(analysis.color_of[names.def_base[v] + d]) for v in program.arguments
                           for d in range(len(program.values[v].shape))}
        signatures: dict[int, list[tuple]] = {}
        for name, (value_id, dim) in enumerate(names.defs):
            color = int(analysis.color_of[name])
            if color not in argument_colors:
                p = program.producer[value_id]
                value = program.values[value_id]
                signatures.setdefault(color, []).append(
                    ("def", program.ops[p].kind if p >= 0 else "arg", dim, value.shape, value.dtype))
        defs = len(names.defs)
        for offset, (op_id, operand, dim) in enumerate(names.uses):
            color = int(analysis.color_of[defs + offset])
            if color in signatures:
                value = program.values[program.ops[op_id].operands[operand]]
                signatures[color].append(("use", program.ops[op_id].kind, operand, dim, value.shape, value.dtype))
        alike: dict[tuple, int] = {}
        for color, signature in sorted(signatures.items()):
            key = tuple(sorted(signature))
            if key in alike:
                a, b = find(alike[key]), find(color)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                alike[key] = color
    classes: dict[int, list[int]] = {}
    for color in range(color_count):
        classes.setdefault(find(color), []).append(color)
    return sorted(tuple(c) for c in classes.values())


def parse_pins(text: str) -> dict[str, tuple]:
    """``--pin`` text as ``{argument name: PartitionSpec entries}``: ``'tokens=batch,'`` pins dim 0 of
    ``tokens`` to ``batch`` and dim 1 to nothing; ``'x=batch+model,'`` splits dim 0 over both axes; several
    pins are separated by ``;``.

    Raises:
      ToastError: a pin without ``=``.
    """
    pins: dict[str, tuple] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, spec = part.partition("=")
        if not sep or not name.strip():
            raise ToastError(f"--pin '{part}': expected NAME=AXES,AXES,... (e.g. 'tokens=batch,')")
        entries = []
        for entry in spec.split(","):
            axes = tuple(a.strip() for a in entry.split("+") if a.strip())
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        pins[name.strip()] = tuple(entries)
    return pins


class ActionSpace:
    """The actions of one program and mesh, and how they change states.

    Args:
      model: the sharding model.
      min_names: classes with fewer distinct dimension names are pruned.
      mirror_layers: group repeated layers' colors (section 4.4).
      pinned: argument name -> ``PartitionSpec`` entries (``None``, an axis, or a tuple of axes per dim; dims
        past the entries are replicated, as in JAX) that the search must keep.

    Attributes:
      actions: every action, in a fixed order (class, resolution, axis).
      initial: the pinned starting state.
    """

    def __init__(self, model: ShardingModel, *, min_names: int = 10, mirror_layers: bool = True,
                 pinned: Mapping[str, Sequence] | None = None):
        self.model = model
        analysis = model.analysis
        conflicts = analysis.conflicts
        bits_of_color: dict[int, set[int]] = {}
        for conflict in conflicts.conflicts:
            bits_of_color.setdefault(conflict.color, set()).add(conflicts.group_of[conflicts.set_of[conflict.id]])
        self.classes = mirror_classes(model, mirror_layers=mirror_layers)
        actions: list[SearchAction] = []
        names_of: list[np.ndarray] = []
        bits: list[int] = []
        width = conflicts.resolution_bits
        for colors in self.classes:
            all_names = np.concatenate([model.names_of_color(c) for c in colors])
            if len(all_names) < min_names:
                continue
            own = sorted(set().union(*(bits_of_color.get(c, set()) for c in colors)))
            if len(own) <= MAX_ENUMERATED_BITS:
                choices = list(itertools.product((0, 1), repeat=len(own)))
            else:
                choices = [(0,) * len(own), (1,) * len(own)]
            for choice in choices:
                resolution = [0] * width
                for bit, value in zip(own, choice, strict=True):
                    resolution[bit] = value
                kept = []
                for color in colors:
                    color_names = model.names_of_color(color)
                    unsharded = conflicts.unsharded_nodes(color, resolution) if own else frozenset()
                    if unsharded:
                        color_names = color_names[~np.isin(analysis.node_of[color_names],
                                                           np.fromiter(unsharded, dtype=np.int64))]
                    kept.append(color_names)
                selected = np.unique(np.concatenate(kept))
                for axis_index, (axis, size) in enumerate(model.mesh.axes):
                    if np.any(model.name_size[selected] % size):
                        continue  # a dim the axis does not divide (a unit dim, an odd size): never valid
                    actions.append(SearchAction(tuple(colors), axis, tuple(resolution)))
                    names_of.append(selected)
                    bits.append(1 << axis_index)
        self.actions = tuple(actions)
        self._names = names_of
        self._bits = np.asarray(bits, dtype=np.uint8)
        self._checks = self._incremental_checks()
        self.pin_names, self.pin_masks = self._pins(pinned or {})
        self.initial = self._pinned_state()

    def _incremental_checks(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per action, what can turn invalid when it is taken in a valid state: ``(names of the sites it
        touches, where each site starts in them, the positions of its names among the reshape factors)``."""
        model = self.model
        count = len(model.name_size)
        starts = model.site_starts
        ends = np.append(starts[1:], count) if len(starts) else starts
        site_of = np.searchsorted(starts, np.arange(count), side="right") - 1
        by_names: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        checks = []
        for names in self._names:
            found = by_names.get(id(names))
            if found is None:
                sites = np.unique(site_of[names])
                sites = sites[sites >= 0]
                lengths = ends[sites] - starts[sites]
                offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(sites) else lengths
                site_names = np.repeat(starts[sites] - offsets, lengths) + np.arange(int(lengths.sum()))
                factors = np.flatnonzero(np.isin(model.factor_names, names))
                found = by_names[id(names)] = (site_names, offsets, factors)
            checks.append(found)
        return checks

    def __len__(self) -> int:
        return len(self.actions)

    def names(self, index: int) -> np.ndarray:
        """The dimension names action ``index`` shards (``int64``, ascending)."""
        return self._names[index]

    def apply(self, state: ShardingState, index: int) -> ShardingState | None:
        """The state after action ``index``, or ``None`` where the action is invalid in ``state`` (which must be
        valid: the search only walks valid states)."""
        names, bit = self._names[index], self._bits[index]
        before = state.masks[names]
        if bool(np.all(before & bit)):
            return None  # changes nothing
        masks = state.masks.copy()
        masks[names] = before | bit
        if len(self.pin_names) and not np.array_equal(masks[self.pin_names], self.pin_masks):
            return None
        # Only the sites and names the action touches can turn a valid state invalid (ShardingModel.problem
        # checks all of them, linear in the program; this is linear in the action).
        model = self.model
        site_names, site_starts, factors = self._checks[index]
        if len(site_starts):
            touched = masks[site_names]
            combined = np.bitwise_or.reduceat(touched, site_starts)
            if np.any(POPCOUNT[combined] != np.add.reduceat(POPCOUNT[touched], site_starts)):
                return None  # one axis on two dims of a tensor
        if np.any(model.name_size[names] % model.devices_of_mask[masks[names]]):
            return None
        if len(factors) and np.any(model.factor_sizes[factors] % model.devices_of_mask[
                masks[model.factor_names[factors]]]):
            return None
        return ShardingState(state.mesh, masks, state.actions + self.actions[index].as_actions())

    def _pins(self, pinned: Mapping[str, Sequence]) -> tuple[np.ndarray, np.ndarray]:
        model = self.model
        program, names = model.analysis.program, model.analysis.names
        by_name = {program.values[v].name: v for v in program.arguments}
        pin_names: list[int] = []
        pin_masks: list[int] = []
        for argument, entries in sorted(pinned.items()):
            if argument not in by_name:
                known = ", ".join(sorted(by_name)[:12])
                raise ToastError(f"pin '{argument}': no such argument (the program's arguments: {known}"
                                 f"{', ...' if len(by_name) > 12 else ''})")
            value_id = by_name[argument]
            shape = program.values[value_id].shape
            entries = tuple(entries)
            if len(entries) > len(shape):
                raise ToastError(f"pin '{argument}': {len(entries)} entries for a tensor of rank {len(shape)}")
            for dim in range(len(shape)):
                entry = entries[dim] if dim < len(entries) else None
                axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
                mask = 0
                for axis in axes:
                    mask |= 1 << model.mesh.index(axis)
                pin_names.append(names.def_base[value_id] + dim)
                pin_masks.append(mask)
        order = np.argsort(pin_names, kind="stable")
        return (np.asarray(pin_names, dtype=np.int64)[order], np.asarray(pin_masks, dtype=np.uint8)[order])

    def _pinned_state(self) -> ShardingState:
        """The initial state: every pinned dim's color sharded as pinned (each color once)."""
        model = self.model
        state = model.initial()
        if not len(self.pin_names):
            return state
        analysis = model.analysis
        pinned_by_color: dict[int, tuple[int, int]] = {}
        for name, mask in zip(self.pin_names.tolist(), self.pin_masks.tolist(), strict=True):
            color = int(analysis.color_of[name])
            if color in pinned_by_color and pinned_by_color[color][1] != mask:
                other = pinned_by_color[color][0]
                raise ToastError(f"contradictory pins: {self._describe(other)} and {self._describe(name)} must be "
                                 f"sharded alike (same color {color}) but are pinned to "
                                 f"{self._axes(pinned_by_color[color][1])} and {self._axes(mask)}")
            pinned_by_color.setdefault(color, (name, mask))
        width = analysis.conflicts.resolution_bits
        for color, (name, mask) in sorted(pinned_by_color.items()):
            for axis in model.mesh.mask_axes(mask):
                applied = None
                for resolution in itertools.product((0, 1), repeat=min(width, MAX_ENUMERATED_BITS)):
                    candidate = model.apply(state, Action(color, axis, tuple(resolution) + (0,) * (
                        width - len(resolution))), check=False)
                    if candidate.masks[name] & (1 << model.mesh.index(axis)):
                        applied = candidate
                        break
                if applied is None:
                    raise ToastError(f"pin {self._describe(name)} = {axis}: no resolution of its color's conflicts "
                                     "shards it")
                state = applied
        if not np.array_equal(state.masks[self.pin_names], self.pin_masks):
            wrong = int(self.pin_names[np.flatnonzero(state.masks[self.pin_names] != self.pin_masks)[0]])
            raise ToastError(f"contradictory pins: {self._describe(wrong)} is pinned to "
                             f"{self._axes(int(self.pin_masks[np.searchsorted(self.pin_names, wrong)]))}, but another "
                             f"pin of its color makes it {self._axes(int(state.masks[wrong]))}")
        problem = model.problem(state)
        if problem:
            raise InvalidState(f"the pins make an invalid sharding: {problem}")
        return ShardingState(state.mesh, state.masks, ())

    def _describe(self, name: int) -> str:
        program, names = self.model.analysis.program, self.model.analysis.names
        value_id, dim = names.defs[name]
        return f"{program.values[value_id].name} dim {dim}"

    def _axes(self, mask: int) -> str:
        axes = self.model.mesh.mask_axes(mask)
        return "+".join(axes) if axes else "replicated"
