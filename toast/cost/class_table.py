"""The collectives of states built on one ``NamePartition``, computed once per class of alike ops and values.

``toast.cost.collectives.CommunicationModel.table`` reads every dimension name's mask: linear in the program. In a
state built on a partition (the search's: ``toast.search.actions``), a name's mask is its part's, and a repeated
layer's names fall into the same parts as the first layer's. So the collectives an op or a value needs follow from a
few parts' masks, and ops and values that read the same parts alike need the same collectives:

- **Partial results.** A reducing op's class: the parts of its reduced dims' names (in order) and, per result, its
  byte class and the parts, keeps and dims of the use names ``scatter_dim`` scans. The class fixes the axes its
  results are partial over, whether each is reduce-scattered and on which dim, and the rows (kinds, axes, bytes).
- **Uses.** A value's class: the parts of its definition names, its byte class, the reducing op's class and result
  position that makes it (a reduce-scatter splits it further), and per use site (in order) the parts and keeps of
  its names. The class fixes which sites need collectives, which of them XLA's CSE merges (and which site is the
  last of each merged group), and each one's rows.

``ClassTable.table`` prices one representative per class and writes the rows out for every member: the same
``CollectiveTable`` as ``CommunicationModel.table``, row for row and in the same order (it is the same computation
on fewer names), in time linear in the classes and the collectives found rather than in the names. Halo exchanges
(windowed dims, rare) are taken from ``CommunicationModel``.
"""

from __future__ import annotations

import numpy as np

from toast.cost.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    CollectiveTable,
    CommunicationModel,
    cse_groups,
)
from toast.sharding.state import NamePartition, ShardingState

# Programs with fewer use sites than this are read name by name (``CommunicationModel.table``): a class table's
# fixed cost per state is then about what it saves.
MIN_SITES = 4096


class ClassTable:
    """``CommunicationModel.table`` for the states built on ``partition`` (the module docstring says how).

    Built once per partition, linear in the program.

    Attributes:
      op_classes: classes of the reducing ops (one representative each priced per state).
      value_classes: classes of the values used with dims.
    """

    def __init__(self, communication: CommunicationModel, partition: NamePartition):
        self.communication = communication
        self.partition = partition
        self._init_partial()
        self._init_uses()

    # Partial results.

    def _init_partial(self) -> None:
        """The reducing ops' classes: per class its representative's reducing names' parts (``_red_atoms``,
        grouped by class from ``_red_starts``) and results ("rep entries": their class and byte class), with the
        parts, keeps and dims of the names each one's ``scatter_dim`` scans; per rep entry the members' results
        (``_entry_members``, from ``_entry_member_starts``); per result its rep entry (``_entry_rep``)."""
        cm = self.communication
        atom = self.partition.part_of_name
        value_class = cm.byte_classes(self.partition).value_class
        ops, op_starts = cm._partial_ops, cm._partial_op_starts
        red_atoms = atom[cm._reducing_names_by_op].tolist()
        bounds = np.append(op_starts, len(red_atoms)).tolist()
        entry_owner = cm._entry_owner.tolist()
        entry_values = cm._entry_values.tolist()
        entry_bounds = np.searchsorted(cm._entry_owner, np.arange(len(ops) + 1)).tolist()
        scan_bounds = np.searchsorted(cm._scan_entry, np.arange(len(entry_owner) + 1)).tolist()
        scan_atoms = atom[cm._scan_names].tolist()
        scan_keep, scan_dims = cm._scan_keep.tolist(), cm._scan_dims.tolist()
        classes: dict[tuple, int] = {}
        members: list[list[int]] = []  # per class, its ops (indices into _partial_ops)
        for owner in range(len(ops)):
            entries = []
            for entry in range(entry_bounds[owner], entry_bounds[owner + 1]):
                scans = tuple(zip(scan_atoms[scan_bounds[entry]:scan_bounds[entry + 1]],
                                  scan_keep[scan_bounds[entry]:scan_bounds[entry + 1]],
                                  scan_dims[scan_bounds[entry]:scan_bounds[entry + 1]], strict=True))
                entries.append((int(value_class[entry_values[entry]]), scans))
            key = (tuple(red_atoms[bounds[owner]:bounds[owner + 1]]), tuple(entries))
            found = classes.setdefault(key, len(classes))
            if found == len(members):
                members.append([])
            members[found].append(owner)
        self.op_classes = len(classes)
        representatives = [group[0] for group in members]
        # The representatives' reducing names' parts, class by class.
        red_index = [np.arange(bounds[owner], bounds[owner + 1]) for owner in representatives]
        self._red_atoms = atom[cm._reducing_names_by_op[np.concatenate(red_index)]] if red_index else \
            np.zeros(0, dtype=np.int64)
        self._red_class = np.repeat(np.arange(len(representatives)), [len(index) for index in red_index])
        self._red_starts = np.cumsum([0] + [len(index) for index in red_index[:-1]]).astype(np.int64)
        # The representatives' results ("rep entries"), class by class, and each one's members' results.
        rep_entries: list[int] = []
        entry_class: list[int] = []
        member_entries: list[np.ndarray] = []
        for cls, group in enumerate(members):
            first = entry_bounds[group[0]]
            for position in range(entry_bounds[group[0] + 1] - first):
                rep_entries.append(first + position)
                entry_class.append(cls)
                member_entries.append(np.asarray([entry_bounds[owner] + position for owner in group], dtype=np.int64))
        rep = np.asarray(rep_entries, dtype=np.int64)
        self._rep_entry_class = np.asarray(entry_class, dtype=np.int64)
        self._rep_entry_bytes_class = value_class[cm._entry_values[rep]] if len(rep) else np.zeros(0, np.int64)
        self._entry_member_starts = np.cumsum([0] + [len(m) for m in member_entries]).astype(np.int64)
        self._entry_members = np.concatenate(member_entries) if member_entries else np.zeros(0, dtype=np.int64)
        # The representatives' scans, rep entry by rep entry.
        scan_index = [np.arange(scan_bounds[entry], scan_bounds[entry + 1]) for entry in rep_entries]
        flat = np.concatenate(scan_index) if scan_index else np.zeros(0, dtype=np.int64)
        self._scan_atoms = atom[cm._scan_names[flat]]
        self._scan_keep = cm._scan_keep[flat]
        self._scan_dims = cm._scan_dims[flat]
        self._scan_entry = np.repeat(np.arange(len(rep_entries)), [len(index) for index in scan_index])
        # Each value a member result makes -> (rep entry), for the values' classes.
        self._entry_rep = np.empty(len(entry_owner), dtype=np.int64)
        self._entry_rep[self._entry_members] = np.repeat(np.arange(len(rep_entries)),
                                                         np.diff(self._entry_member_starts))

    def _partial(self, atom_masks: np.ndarray, class_bytes: np.ndarray
                 ) -> tuple[CollectiveTable | None, np.ndarray, np.ndarray, np.ndarray]:
        """The rows of partial results (as ``CommunicationModel._partial_table``), and per rep entry its reduce-
        scatter's dim (``-1``: none), axes and bytes out (a value it makes is split so from then on)."""
        cm = self.communication
        count = len(self._rep_entry_class)
        no_scatter = np.full(count, -1, dtype=np.int64)
        if not len(self._red_atoms):
            return None, no_scatter, np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
        reducing = atom_masks[self._red_atoms]
        class_masks = np.bitwise_or.reduceat(reducing, self._red_starts)
        entry_masks = class_masks[self._rep_entry_class]
        scan_masks = entry_masks[self._scan_entry]
        wanted_at = np.flatnonzero((atom_masks[self._scan_atoms] & self._scan_keep & scan_masks) == scan_masks)
        wanted = no_scatter.copy()
        if len(wanted_at):
            owners = self._scan_entry[wanted_at]
            first = np.ones(len(owners), dtype=bool)
            first[1:] = owners[1:] != owners[:-1]
            wanted[owners[first]] = self._scan_dims[wanted_at[first]]
        axes = entry_masks.astype(np.int64)
        sizes = class_bytes[self._rep_entry_bytes_class]
        scattered = (wanted >= 0) & (axes != 0)
        out = np.where(scattered, sizes // cm.model.devices_of_mask[axes], sizes)
        dims = np.where(scattered, wanted, -1)
        selected = np.flatnonzero(axes)
        if not len(selected):
            return None, dims, axes, out
        # Rows per selected rep entry: a reduce-scatter, or one all-reduce per distinct reduced mask of its
        # class, the most minor axes first (as CommunicationModel._partial_table).
        nonzero = np.flatnonzero(reducing)
        class_dims = np.unique(self._red_class[nonzero] * 256 + (255 - reducing[nonzero].astype(np.int64)))
        classes, dim_masks = class_dims // 256, 255 - class_dims % 256
        cls = self._rep_entry_class[selected]
        first_of_class = np.searchsorted(classes, cls)
        counts = np.where(scattered[selected], 1, np.searchsorted(classes, cls, side="right") - first_of_class)
        position = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        template = np.repeat(np.arange(len(selected)), counts)  # each template row's selected rep entry
        row_scattered = scattered[selected][template]
        row_axes = np.where(row_scattered, axes[selected][template],
                            dim_masks[np.minimum(first_of_class[template] + position, len(dim_masks) - 1)])
        # Written out per member result, in result order, each result's rows in template order.
        rep_entry = selected[template]
        starts, ends = self._entry_member_starts[rep_entry], self._entry_member_starts[rep_entry + 1]
        row_template, _, entry = _expand(starts, ends, self._entry_members)
        order = np.lexsort((row_template, entry))
        row_template, entry = row_template[order], entry[order]
        rep_of_row = rep_entry[row_template]
        kind = np.where(row_scattered[row_template], REDUCE_SCATTER, ALL_REDUCE).astype(np.int64)
        unused = np.full(len(entry), -1, dtype=np.int64)
        table = CollectiveTable(kind=kind, axes_mask=row_axes[row_template].astype(np.int64),
                                value=cm._entry_values[entry], op=cm._entry_ops[entry], operand=unused,
                                bytes_in=sizes[rep_of_row], bytes_out=out[rep_of_row], last_op=unused)
        return table, dims, axes, out

    # Uses.

    def _init_uses(self) -> None:
        """The values' classes (over their use sites with dims): per class the representative's sites (padded
        rows of use-name parts, keeps and definition-name parts), its byte class and partial source; per
        representative site the members' sites (``_site_members``)."""
        cm = self.communication
        atom = self.partition.part_of_name
        defs = cm._defs
        value_class = cm.byte_classes(self.partition).value_class
        program = cm.model.analysis.program
        def_base = cm.model.analysis.names.def_base
        entry_rep = np.full(len(program.values), -1, dtype=np.int64)
        entry_rep[cm._entry_values] = self._entry_rep
        site_values = cm._site_values
        sites_of: dict[int, list[int]] = {}
        for site, value in enumerate(site_values.tolist()):
            sites_of.setdefault(value, []).append(site)
        starts = cm.use_site_starts.tolist()
        use_atoms = atom[defs:].tolist()
        keep = cm.keep_mask.tolist()
        classes: dict[tuple, int] = {}
        members: list[list[int]] = []
        for value, sites in sites_of.items():
            rank = len(program.values[value].shape)
            base = def_base[value]
            key = (tuple(atom[base:base + rank].tolist()), int(value_class[value]), int(entry_rep[value]),
                   tuple(tuple((use_atoms[u], keep[u]) for u in range(starts[s], starts[s] + rank)) for s in sites))
            found = classes.setdefault(key, len(classes))
            if found == len(members):
                members.append([])
            members[found].append(value)
        self.value_classes = len(classes)
        # Representative sites, class by class in site order, and per one the members' sites at its position.
        width = max(8, -(-max((len(program.values[group[0]].shape) for group in members), default=1) // 8) * 8)
        pad = len(self.partition.first_name)  # an extra part, of mask 0
        rep_sites: list[int] = []
        site_class: list[int] = []
        site_members: list[np.ndarray] = []
        for cls, group in enumerate(members):
            table = np.asarray([sites_of[value] for value in group], dtype=np.int64)  # [members, sites]
            for position in range(table.shape[1]):
                rep_sites.append(int(table[0, position]))
                site_class.append(cls)
                site_members.append(table[:, position])
        rep = np.asarray(rep_sites, dtype=np.int64)
        values = site_values[rep]
        ranks = np.asarray([len(program.values[v].shape) for v in values.tolist()], dtype=np.int64)
        dim = np.arange(width)[None, :]
        inside = dim < ranks[:, None]
        use_names = np.where(inside, cm.use_site_starts[rep][:, None] + dim, 0)
        self._use_atoms = np.where(inside, atom[defs + use_names], pad)
        self._use_keep = np.where(inside, cm.keep_mask[use_names], 0).astype(np.uint8)
        def_names = np.asarray([def_base[v] for v in values.tolist()], dtype=np.int64)[:, None] + dim
        self._def_atoms = np.where(inside, atom[np.where(inside, def_names, 0)], pad)
        self._site_class = np.asarray(site_class, dtype=np.int64)
        self._site_bytes_class = value_class[values]
        self._site_source = entry_rep[values]  # the rep entry whose reduce-scatter may split the value, or -1
        self._width = width
        self._site_member_starts = np.cumsum([0] + [len(m) for m in site_members]).astype(np.int64)
        self._site_members = np.concatenate(site_members) if site_members else np.zeros(0, dtype=np.int64)

    def _uses(self, atom_masks: np.ndarray, class_bytes: np.ndarray, dims: np.ndarray, axes: np.ndarray,
              out: np.ndarray) -> CollectiveTable | None:
        """The rows of use sites (as ``CommunicationModel._use_table``), given the partial results' reduce-
        scatters per rep entry (``dims``, ``axes``, ``out``)."""
        cm = self.communication
        if not len(self._site_class):
            return None
        masks = np.append(atom_masks, np.uint8(0))
        use_masks = masks[self._use_atoms] & self._use_keep  # [rep sites, width]
        def_masks = masks[self._def_atoms]
        in_bytes = class_bytes[self._site_bytes_class]
        source = self._site_source
        split = np.flatnonzero(source >= 0)
        if len(split):
            split = split[dims[source[split]] >= 0]
        if len(split):
            def_masks[split, dims[source[split]]] |= axes[source[split]].astype(np.uint8)
            in_bytes = in_bytes.copy()
            in_bytes[split] = out[source[split]]
        extra = def_masks & ~use_masks
        moved = np.bitwise_or.reduce(extra, axis=1).astype(np.int64)
        hits = np.flatnonzero(moved)
        if not len(hits):
            return None
        layouts = use_masks[hits]
        use_or = np.bitwise_or.reduce(layouts, axis=1).astype(np.int64)
        moved = moved[hits]
        hit_class = self._site_class[hits]
        # XLA's CSE: a value's sites resharded alike share the collective (the first carries it, the last one's
        # op frees it), as CommunicationModel._use_table groups them.
        kept, last_hit = cse_groups(hit_class, layouts)
        sites = hits[kept]  # rep sites carrying collectives
        last_sites = hits[last_hit[kept]]
        moved, use_or = moved[kept], use_or[kept]
        to_all = moved & use_or
        gathered = moved & ~to_all
        site_bytes = in_bytes[sites]
        devices = cm.model.devices_of_mask
        gathered_bytes = site_bytes * devices[gathered]
        # Gathers one dim at a time, the last dim first; then the all-to-all (as _use_table).
        per_dim = extra[sites][:, ::-1] & gathered[:, None].astype(np.uint8)
        gather_site, gather_step = np.nonzero(per_dim)
        step_axes = per_dim[gather_site, gather_step].astype(np.int64)
        step_devices = devices[step_axes]
        later = np.flatnonzero(np.append(False, gather_site[1:] == gather_site[:-1]))
        grown = step_devices.copy()
        while len(later):
            grown[later] = grown[later - 1] * step_devices[later]
            later = later[np.isin(later - 1, later)]
        step_out = site_bytes[gather_site] * grown
        all_to_alls = np.flatnonzero(to_all)
        template_site = np.concatenate((gather_site, all_to_alls))
        step_order = np.argsort(template_site, kind="stable")
        template_site = template_site[step_order]
        kind = np.concatenate((np.full(len(gather_site), ALL_GATHER),
                               np.full(len(all_to_alls), ALL_TO_ALL)))[step_order]
        template_axes = np.concatenate((step_axes, to_all[all_to_alls]))[step_order]
        bytes_in = np.concatenate((step_out // step_devices, gathered_bytes[all_to_alls]))[step_order]
        bytes_out = np.concatenate((step_out, gathered_bytes[all_to_alls]))[step_order]
        step_index = np.arange(len(template_site))
        # Written out per member site, in site order, each site's rows in template order.
        rep_site = sites[template_site]
        row_template, rank, member = _expand(self._site_member_starts[rep_site],
                                             self._site_member_starts[rep_site + 1], self._site_members)
        # The last site of each member's group: the member's own site at the last hit's position (every rep site
        # of a class lists the class's values in one order).
        last_rep = last_sites[np.searchsorted(sites, rep_site)][row_template]
        last_member = self._site_members[self._site_member_starts[last_rep] + rank]
        order = np.lexsort((step_index[row_template], member))
        row_template, member, last_member = row_template[order], member[order], last_member[order]
        return CollectiveTable(kind=kind[row_template].astype(np.int64), axes_mask=template_axes[row_template],
                               value=cm._site_values[member], op=cm._site_ops[member],
                               operand=cm._site_operands[member], bytes_in=bytes_in[row_template],
                               bytes_out=bytes_out[row_template], last_op=cm._site_ops[last_member])

    def table(self, state: ShardingState, *, class_bytes: np.ndarray | None = None) -> CollectiveTable:
        """``CommunicationModel.table(state)``, the same rows in the same order (``state`` built on the
        partition; ``class_bytes``: ``CommunicationModel.class_bytes(state)`` when the caller has it)."""
        cm = self.communication
        if class_bytes is None:
            class_bytes = cm.class_bytes(state)
        atom_masks = state.masks[self.partition.first_name]
        partial, dims, axes, out = self._partial(atom_masks, class_bytes)
        uses = self._uses(atom_masks, class_bytes, dims, axes, out)
        halos = cm._halo_table(state.masks)
        parts = [part for part in (partial, uses, halos) if part is not None]
        return CollectiveTable.concatenate(parts) if parts else CollectiveTable.empty()


def _expand(starts: np.ndarray, ends: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows ``i`` with member lists ``members[starts[i]:ends[i]]``: ``(row, rank, member)`` of each member
    written out, row by row (``rank``: its index in its row's list)."""
    counts = ends - starts
    row = np.repeat(np.arange(len(starts)), counts)
    rank = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return row, rank, members[starts[row] + rank]
