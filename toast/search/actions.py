"""The search's action space (TOAST sections 4.2 and 4.4), computed once ahead of the search.

An action is ``(colors, resolution, axis)``: shard every dimension name of the colors along the mesh
axis, except, in each conflict, the endpoint the resolution bits do not pick (``Conflicts.unsharded_nodes``).
``colors`` is one color, or a **mirror class**: the colors of corresponding dims of repeated layers.

- **Repeated layers** (section 4.4). Function arguments are grouped by a key built from all their uses (each
  use's op kind, operand position, result types and attributes, with the argument's own type): the
  parameters of repeated layers are used alike. Dim ``d`` of every member of a group is one decision, so
  the colors of those dims form one class (union-find). Colors of intermediates alone (no argument dim) are
  mirrored when their names are made and used alike (same ops, dims, shapes, element types): a per-layer
  activation dim. A 24-layer model then has the action space of a 1-layer one. Where arguments are named,
  the group key also holds the name with list indices as ``[*]`` (``layer_pattern``), and two colors that
  share a tensor never join one class (``colors_sharing_a_tensor``): a block's two norm scales are used
  alike but scale different channel dims, and a class holding both would be an action no state can take.
- **Stored actions** (``SearchAction.stored``): per class and axis, split only the class's parameter dims
  and their update chains (ZeRO-3 / FSDP); a parameter is then gathered where it is used. No color action
  can do that once the batch holds the axis, since the activations carry the same colors.
- **Pruning.** Classes whose colors hold fewer than ``min_names`` distinct dimension names are dropped (the
  paper's threshold is 10): sharding them cannot pay. So are actions on an axis that does not divide one of
  their dims (unit dims of broadcasts and reshapes): never valid.
- **Resolution orders.** Only the resolution bits of the class's own conflicts vary; the others stay 0, so
  no two actions are the same decision.
- **Atoms.** Names that start alike (mask, pin) and that the same actions shard have one mask in every state
  the search reaches; the search keeps a state as its atoms' masks (``NamePartition``). Mirrored layers'
  names share atoms, so a GPT step has as many atoms at 24 layers as at 6 (ten at batch=4,model=2), and so
  do a step's work and a state's key. The cost model reads the partition too (bytes per class of values).
- **Validity** depends on the state and is checked when an action is taken (``ActionSpace.step``): an action
  that changes nothing, shards a tensor twice along one axis (one of its atoms and another atom of that
  tensor), or splits a dim (or a reshape factor) its axis does not divide is invalid there. Actions invalid in
  every state (two of their own names in one tensor, or changing a pinned argument) are dropped up front.

Pins (``pinned``) are argument shardings the search must keep: they form the initial state, and a pin that
contradicts the program's colors (two pins giving one color different axes) is an error naming both.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from toast.errors import ToastError
from toast.sharding.state import Action, InvalidState, NamePartition, ShardingModel, ShardingState, ShardNodes, distinct
from toast.sharding.strategies import parameter_nodes, store_parameter_nodes, update_chains

# More resolution bits than this on one class: only all-0 and all-1 orders are offered (2^bits would explode).
MAX_ENUMERATED_BITS = 4
# A space of at most this many atoms steps on Python ints (``ActionSpace.step``); more: on arrays.
FEW_ATOMS = 256


def distinct_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(values, return_index=True, return_inverse=True)`` of a 1-D integer array, by a stable argsort
    (as ``distinct``): the distinct values ascending, each one's first index, each value's index among them."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.concatenate(([True], ordered[1:] != ordered[:-1])) if len(ordered) else np.zeros(0, dtype=bool)
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], order[new], inverse


@dataclass(frozen=True, slots=True)
class SearchAction:
    """One action of the search.

    Attributes:
      colors: the colors it shards (one, or a mirror class of repeated layers), ascending.
      axis: the mesh axis.
      resolution: one bit per resolution group (``Conflicts.groups``).
      stored: empty for an action that shards the colors everywhere; else the dimension-graph nodes (ascending)
        of a **stored** action: only the parameters' dims of these colors, with their update chains
        (``toast.sharding.strategies.update_chains``), are split; where a parameter is used it is gathered
        (ZeRO-3 / FSDP: what no color action can do once the activations' batch takes the axis).
    """

    colors: tuple[int, ...]
    axis: str
    resolution: tuple[int, ...]
    stored: tuple[int, ...] = ()

    def as_actions(self) -> tuple[Action | ShardNodes, ...]:
        """The same as ``toast.Action``s, one per color (what ``ShardingModel.apply`` takes), or, for a
        stored action, one ``ShardNodes``."""
        if self.stored:
            return (ShardNodes(self.stored, self.axis, f"parameters of colors {list(self.colors)} stored split"),)
        return tuple(Action(color, self.axis, self.resolution) for color in self.colors)


def layer_pattern(name: str) -> str:
    """An argument's name with its list indices as ``[*]`` (``params['down'][3]['conv1_kernel']`` ->
    ``params['down'][*]['conv1_kernel']``): the same parameter of every repeated layer. SSA names (``%arg3``,
    a ``.mlir`` file's arguments) say nothing: ``""``."""
    return "" if name.startswith("%") else re.sub(r"\[\d+\]", "[*]", name)


def argument_groups(model: ShardingModel) -> list[list[int]]:
    """Indices of ``@main``'s arguments grouped by their use key (section 4.4) and, where arguments are named,
    by ``layer_pattern``: a layer's two norm scales are used alike but scale different dims. Groups of two or
    more, each ascending, ordered by first member."""
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
        key = (value.shape, value.dtype, layer_pattern(value.name), tuple(sorted(uses[value_id])))
        groups.setdefault(key, []).append(index)
    return sorted(g for g in groups.values() if len(g) > 1)


def colors_sharing_a_tensor(model: ShardingModel) -> list[set[int]]:
    """For each color, the other colors whose names sit in one tensor with one of its names (at a definition
    or a use): one action can never shard both along one axis."""
    color_of = np.asarray(model.analysis.color_of, dtype=np.int64)
    colors = len(model.analysis.colors)
    site_of = np.searchsorted(model.site_starts, np.arange(len(color_of)), side="right") - 1
    keep = site_of >= 0
    # Distinct (site, color) pairs as one int64 each (site * colors + color), sorted by site then color: a site's
    # colors are then contiguous (a 1-D unique: several times faster than a unique of rows).
    pairs = distinct(site_of[keep] * colors + color_of[keep])
    sites, site_colors = np.divmod(pairs, colors)
    found = []
    for offset in range(1, len(pairs)):
        same = sites[offset:] == sites[:-offset]
        if not same.any():
            break
        found.append(site_colors[:-offset][same] * colors + site_colors[offset:][same])
    sharing: list[set[int]] = [set() for _ in range(colors)]
    if found:  # each pair of colors once, however many tensors they share
        first, second = np.divmod(distinct(np.concatenate(found)), colors)
        for a, b in zip(first.tolist(), second.tolist(), strict=True):
            sharing[a].add(b)
            sharing[b].add(a)
    return sharing


class _ColorClasses:
    """Union-find over colors that never joins two colors sharing a tensor: a class is one action, and an
    action holding two dims of one tensor is invalid in every state."""

    def __init__(self, sharing: list[set[int]]):
        self.parent = list(range(len(sharing)))
        self.members = [{c} for c in range(len(sharing))]  # by root
        self.forbidden = [set(s) for s in sharing]  # by root: colors sharing a tensor with a member

    def find(self, color: int) -> int:
        parent = self.parent
        while parent[color] != color:
            parent[color] = parent[parent[color]]
            color = parent[color]
        return color

    def join(self, a: int, b: int) -> bool:
        """Join the classes of ``a`` and ``b`` unless they share a tensor; whether they are one class now."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return True
        if not self.members[b].isdisjoint(self.forbidden[a]):
            return False
        keep, gone = min(a, b), max(a, b)
        self.parent[gone] = keep
        self.members[keep] |= self.members[gone]
        self.forbidden[keep] |= self.forbidden[gone]
        self.members[gone], self.forbidden[gone] = set(), set()
        return True

    def join_alike(self, colors: Sequence[int]) -> None:
        """Colors that the evidence says are alike: each joins the first class of them it can join (so
        parameters used alike within one layer, e.g. the scales of two norms over different channel dims,
        split into one class per dim instead of one class no action can take)."""
        clusters: list[int] = []
        for color in colors:
            if not any(self.join(cluster, color) for cluster in clusters):
                clusters.append(color)


def mirror_classes(model: ShardingModel, *, mirror_layers: bool = True) -> list[tuple[int, ...]]:
    """The colors grouped by repeated layers (each class ascending, classes by first color); every color is in
    exactly one class, and no class holds two colors that share a tensor."""
    analysis = model.analysis
    color_count = len(analysis.colors)
    if not mirror_layers:
        return [(color,) for color in range(color_count)]
    classes = _ColorClasses(colors_sharing_a_tensor(model))
    program, names = analysis.program, analysis.names
    for group in argument_groups(model):
        values = [program.arguments[i] for i in group]
        for dim in range(len(program.values[values[0]].shape)):
            classes.join_alike([int(analysis.color_of[names.def_base[v] + dim]) for v in values])
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
    alike: dict[tuple, list[int]] = {}
    for color, signature in sorted(signatures.items()):
        key = tuple(sorted(signature))
        alike.setdefault(key, []).append(color)
    for colors in alike.values():
        classes.join_alike(colors)
    by_root: dict[int, list[int]] = {}
    for color in range(color_count):
        by_root.setdefault(classes.find(color), []).append(color)
    return sorted(tuple(c) for c in by_root.values())


def parse_pins(text: str) -> dict[str, tuple]:
    """``--pin`` text as ``{argument name: PartitionSpec entries}``: ``'tokens=batch,'`` pins dim 0 of
    ``tokens`` to ``batch`` and dim 1 to nothing; ``'x=batch+model,'`` splits dim 0 over both axes; several
    pins are separated by ``;``.

    Raises:
      ToastError: a pin without ``=``, or one argument pinned twice.
    """
    pins: dict[str, tuple] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, spec = part.partition("=")
        if not sep or not name.strip():
            raise ToastError(f"--pin '{part}': expected NAME=AXES,AXES,... (e.g. 'tokens=batch,')")
        if name.strip() in pins:
            raise ToastError(f"--pin: argument '{name.strip()}' is pinned twice; pin each argument once")
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
                 stored_parameters: bool = True, pinned: Mapping[str, Sequence] | None = None):
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
        if stored_parameters:
            for action, selected, bit in self._stored_actions(min_names=min_names):
                actions.append(action)
                names_of.append(selected)
                bits.append(bit)
        self.pin_names, self.pin_masks = self._pins(pinned or {})
        self.initial = self._pinned_state()
        self._build_atoms(actions, names_of, bits)

    def _stored_actions(self, *, min_names: int) -> list[tuple[SearchAction, np.ndarray, int]]:
        """The stored actions: per class and axis, the class's parameter dims and their update chains split
        (``SearchAction.stored``); none where that is every name of the class (the color action does it)."""
        model = self.model
        analysis = model.analysis
        names = analysis.names
        dims_of_color: dict[int, list[tuple[int, int]]] = {}
        chains = update_chains(analysis)
        for value_id in chains:
            for dim in range(len(analysis.program.values[value_id].shape)):
                dims_of_color.setdefault(int(analysis.color_of[names.def_base[value_id] + dim]), []).append(
                    (value_id, dim))
        if not len(analysis.node_of):  # no dimension names: nothing to store split
            return []
        store_parameter_nodes(analysis, [pair for colors in self.classes for color in colors
                                         for pair in dims_of_color.get(color, ())])
        stored = []
        for colors in self.classes:
            nodes: set[int] = set()
            for color in colors:
                for value_id, dim in dims_of_color.get(color, ()):
                    nodes.update(parameter_nodes(analysis, value_id, dim))
            if not nodes:
                continue
            node_list = sorted(nodes)
            selected = model.names_of_nodes(node_list)
            if len(selected) < min_names or len(selected) == sum(len(model.names_of_color(c)) for c in colors):
                continue
            for axis_index, (axis, size) in enumerate(model.mesh.axes):
                if np.any(model.name_size[selected] % size):
                    continue
                action = SearchAction(tuple(colors), axis, (0,) * analysis.conflicts.resolution_bits,
                                      tuple(node_list))
                stored.append((action, selected, 1 << axis_index))
        return stored

    def _build_atoms(self, actions: list[SearchAction], names_of: list[np.ndarray], bits: list[int]) -> None:
        """Group the dimension names into **atoms**: names that start alike (mask, pin) and that the same
        actions shard. In every state the search reaches, an atom's names have one mask, so a state is its
        atoms' masks (``uint8[atoms]``), and taking an action reads and writes only its atoms: as many at 24
        layers as at 6, since mirrored layers' names fall into the same atoms. Also drops the actions that are
        invalid in every state (two of their names in one tensor, or a pinned name they would change)."""
        model = self.model
        count = len(model.name_size)
        pinned = np.zeros(count, dtype=np.int64)
        pinned[self.pin_names] = self.pin_masks.astype(np.int64) + 1
        atom = distinct_inverse(self.initial.masks.astype(np.int64) * 257 + pinned)[2]
        refined: set[int] = set()
        for names in names_of:  # partition refinement, once per distinct name set
            if id(names) in refined:
                continue
            refined.add(id(names))
            inside = distinct_inverse(atom[names])[2]
            atom[names] = int(atom.max()) + 1 + inside
        _, first, atom = distinct_inverse(atom)
        # Renumber atoms by their first name, so the numbering is the names' order.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        self.partition = NamePartition(rank[atom], first[order])
        atom_of_name = self.partition.part_of_name
        atom_count = len(order)
        # What an atom's mask must divide: every name's size and every reshape factor through it.
        divisor = model.name_size.copy()
        if len(model.factor_names):
            divisor[model.factor_names] = np.gcd(divisor[model.factor_names], model.factor_sizes)
        by_atom = np.argsort(atom_of_name, kind="stable")
        starts = np.searchsorted(atom_of_name[by_atom], np.arange(atom_count))
        self._atom_divisor = np.gcd.reduceat(divisor[by_atom], starts) if atom_count else divisor[:0]
        # Axes an atom may not take: a manual region's (shard_map's) axes on its operands' other dims.
        self._atom_excluded = np.zeros(atom_count, dtype=np.uint8)
        excluded_names, excluded_masks = model.manual_exclusions()
        np.bitwise_or.at(self._atom_excluded, atom_of_name[excluded_names], excluded_masks)
        # Atoms that share a tensor (site): at most one of them may carry an axis. An atom twice in one tensor
        # may carry none.
        starts_of_site = model.site_starts
        site_of = np.searchsorted(starts_of_site, np.arange(count), side="right") - 1
        pairs = []
        for offset in range(1, count):
            same = site_of[offset:] == site_of[:-offset]
            same &= site_of[offset:] >= 0
            if not same.any():
                break
            first_atoms = atom_of_name[:-offset][same]
            second_atoms = atom_of_name[offset:][same]
            pairs.append(first_atoms * atom_count + second_atoms)
        # Pairs of atoms as one int64 each (first * atoms + second): a 1-D unique sorts them as rows would be.
        keys = distinct(np.concatenate(pairs)) if pairs else np.zeros(0, dtype=np.int64)
        first_of, second_of = np.divmod(keys, max(atom_count, 1))
        twice_in_a_tensor = set(first_of[first_of == second_of].tolist())
        apart = first_of != second_of
        both_ways = distinct(np.concatenate([keys[apart], second_of[apart] * atom_count + first_of[apart]]))
        neighbour_of = both_ways % max(atom_count, 1)
        neighbour_starts = np.searchsorted(both_ways // max(atom_count, 1), np.arange(atom_count + 1))
        pin_of_atom = pinned[self.partition.first_name]  # 0: not pinned, else the pinned mask + 1
        kept_actions: list[SearchAction] = []
        self._atoms_of: list[np.ndarray] = []
        self._neighbours: list[np.ndarray] = []
        kept_bits: list[int] = []
        dropped: list[SearchAction] = []
        for action, names, bit in zip(actions, names_of, bits, strict=True):
            atoms = np.unique(atom_of_name[names])
            neighbours = np.unique(np.concatenate(
                [neighbour_of[neighbour_starts[a]:neighbour_starts[a + 1]] for a in atoms.tolist()]
                + [np.zeros(0, dtype=np.int64)]))
            pins = pin_of_atom[atoms]
            if (twice_in_a_tensor.intersection(atoms.tolist()) or np.isin(neighbours, atoms).any()
                    or np.any((pins > 0) & (((pins - 1) & bit) == 0))):
                dropped.append(action)
                continue
            kept_actions.append(action)
            self._atoms_of.append(atoms)
            self._neighbours.append(neighbours)
            kept_bits.append(bit)
        self.actions = tuple(kept_actions)
        self.dropped: tuple[SearchAction, ...] = tuple(dropped)
        self._bits = np.asarray(kept_bits, dtype=np.uint8)
        self.initial_atoms = self.initial.masks[self.partition.first_name]
        # What ``step`` reads per action, looked up once: its bit, its atoms' divisors, and whether a manual
        # region excludes its axis from one of its atoms (invalid in every state).
        self._bit_of = [int(bit) for bit in kept_bits]
        self._divisors_of = [self._atom_divisor[atoms] for atoms in self._atoms_of]
        self._excluded_of = [bool((self._atom_excluded[atoms] & bit).any())
                             for atoms, bit in zip(self._atoms_of, kept_bits, strict=True)]
        # A few atoms (mirrored layers: a 70B step has 32): ``step`` reads them as Python ints, several times faster
        # than numpy's calls on arrays this small.
        self._few_atoms = atom_count <= FEW_ATOMS
        self._atom_lists = [atoms.tolist() for atoms in self._atoms_of]
        self._neighbour_lists = [neighbours.tolist() for neighbours in self._neighbours]
        self._divisor_lists = [divisors.tolist() for divisors in self._divisors_of]
        self._devices_of_mask = model.devices_of_mask.tolist()

    def __len__(self) -> int:
        return len(self.actions)

    def names(self, index: int) -> np.ndarray:
        """The dimension names action ``index`` shards (``int64``, ascending)."""
        return np.flatnonzero(np.isin(self.partition.part_of_name, self._atoms_of[index]))

    def step(self, atom_masks: np.ndarray, index: int) -> np.ndarray | None:
        """The atoms' masks after action ``index``, or ``None`` where it is invalid there (``atom_masks``: a
        valid state's, ``uint8[atoms]``). Reads only the action's atoms and their neighbours (on a space of a few
        atoms, every atom: as Python ints, which is faster there), and writes the action's atoms."""
        if self._excluded_of[index]:
            return None  # a manual region's axes on another dim of its operand
        if self._few_atoms:
            return self._step_few(atom_masks, index)
        atoms, bit = self._atoms_of[index], self._bit_of[index]
        before = atom_masks[atoms]
        if (before & bit).all():
            return None  # changes nothing: every atom has the axis already
        after = before | bit
        neighbours = self._neighbours[index]
        if len(neighbours) and (atom_masks[neighbours] & bit).any():
            return None  # one axis on two dims of a tensor
        if (self._divisors_of[index] % self.model.devices_of_mask[after]).any():
            return None  # a dim or reshape factor the axes do not divide
        following = atom_masks.copy()
        following[atoms] = after
        return following

    def _step_few(self, atom_masks: np.ndarray, index: int) -> np.ndarray | None:
        """``step`` on a space of a few atoms, the state read as Python ints: the same checks in the same order."""
        masks, bit = atom_masks.tolist(), self._bit_of[index]
        atoms = self._atom_lists[index]
        if all(masks[atom] & bit for atom in atoms):
            return None  # changes nothing
        for neighbour in self._neighbour_lists[index]:
            if masks[neighbour] & bit:
                return None  # one axis on two dims of a tensor
        devices_of_mask = self._devices_of_mask
        after = [masks[atom] | bit for atom in atoms]
        for divisor, mask in zip(self._divisor_lists[index], after, strict=True):
            if divisor % devices_of_mask[mask]:
                return None  # a dim or reshape factor the axes do not divide
        following = atom_masks.copy()
        following[self._atoms_of[index]] = after
        return following

    def state(self, atom_masks: np.ndarray, actions: tuple[Action | ShardNodes, ...] = ()) -> ShardingState:
        """The sharding state of atom masks (every name takes its atom's mask; ``atom_masks`` is kept, not
        copied: it must not change)."""
        return ShardingState.of_parts(self.model.mesh, atom_masks, actions, self.partition)

    def keeps_pins(self, state: ShardingState) -> bool:
        """Whether ``state`` shards every pinned dimension name as its pin says."""
        return bool(np.array_equal(state.masks[self.pin_names], self.pin_masks))

    def apply(self, state: ShardingState, index: int) -> ShardingState | None:
        """The state after action ``index``, or ``None`` where the action is invalid in ``state``.

        Raises:
          ToastError: ``state`` is not one this space reaches (a name's mask differs from its atom's).
        """
        atom_masks = state.masks[self.partition.first_name]
        if not np.array_equal(atom_masks[self.partition.part_of_name], state.masks):
            raise ToastError("the state is not one this action space reaches from its initial state")
        following = self.step(atom_masks, index)
        if following is None:
            return None
        return self.state(following, state.actions + self.actions[index].as_actions())

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
            used = 0
            for dim in range(len(shape)):
                entry = entries[dim] if dim < len(entries) else None
                axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
                mask = 0
                for axis in axes:
                    bit = 1 << model.mesh.index(axis)
                    if used & bit:  # as jax.sharding.PartitionSpec: a mesh axis splits one dim, once
                        raise ToastError(f"pin '{argument}': mesh axis '{axis}' appears twice; an axis splits at "
                                         "most one dim of a tensor, once")
                    used |= bit
                    mask |= bit
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
