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

from typing import NamedTuple

import numpy as np

from toast.cost.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    CollectiveTable,
    CommunicationModel,
)
from toast.sharding.state import NamePartition, ShardingState

# Programs with fewer use sites than this are read name by name (``CommunicationModel.table``): a class table's
# fixed cost per state is then about what it saves.
MIN_SITES = 4096

# A scan's code (``ClassTable._scan_code``): its distance from its segment's end x _DIM_CODE + its dim + 1.
_DIM_CODE = 1 << 16


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
        # The rows' members in one index space: the partial results (``CommunicationModel._entry_*``), then the use
        # sites (``_site_*``), then none (op -1: a partial result's last op); a table is written with one take each.
        entries, sites = len(communication._entry_values), len(communication._site_values)
        self._member_op = np.concatenate((communication._entry_ops, communication._site_ops, [-1])).astype(np.int64)
        # ``int64[3, members]``: each member's value, op and operand (-1: a partial result), taken at once.
        self._member_columns = np.array((np.concatenate((communication._entry_values, communication._site_values)),
                                         self._member_op[:-1],
                                         np.concatenate((np.full(entries, -1), communication._site_operands))),
                                        dtype=np.int64)
        self._no_member = entries + sites
        self._no_last = np.full(entries, self._no_member, dtype=np.int64)  # partial results' (one row each)
        # The live sites' member sites (``_site_members``) as members (after the partial results).
        self._site_members += entries
        live = self._live_sites
        self._live_member_starts = self._site_member_starts[live]
        self._live_member_counts = self._site_member_starts[live + 1] - self._live_member_starts

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
        # Each rep entry's scans then a pad (part ``pad``, of mask 0, code 0), so that every rep entry has a segment
        # (``_scan_starts``) for ``np.maximum.reduceat``: the largest code (``_DIM_CODE``) of the scans that fit is
        # the first one's, and 0 none.
        pad = len(self.partition.first_name)
        lengths = np.asarray([len(index) for index in scan_index], dtype=np.int64) + 1
        self._scan_starts = (np.cumsum(lengths) - lengths).astype(np.int64)
        is_scan = np.ones(int(lengths.sum()), dtype=bool)
        is_scan[self._scan_starts + lengths - 1] = False
        self._scan_entry = np.repeat(np.arange(len(rep_entries)), lengths)
        self._scan_atoms = np.full(len(is_scan), pad, dtype=np.int64)
        self._scan_atoms[is_scan] = atom[cm._scan_names[flat]]
        self._scan_keep = np.zeros(len(is_scan), dtype=np.uint8)
        self._scan_keep[is_scan] = cm._scan_keep[flat]
        assert not len(flat) or int(cm._scan_dims[flat].max()) < _DIM_CODE - 1
        scan_rank = np.arange(len(is_scan)) - np.repeat(self._scan_starts, lengths)
        self._scan_code = np.zeros(len(is_scan), dtype=np.int64)
        self._scan_code[is_scan] = (len(is_scan) - scan_rank[is_scan]) * _DIM_CODE + cm._scan_dims[flat] + 1
        # Each value a member result makes -> (rep entry), for the values' classes.
        self._entry_rep = np.empty(len(entry_owner), dtype=np.int64)
        self._entry_rep[self._entry_members] = np.repeat(np.arange(len(rep_entries)),
                                                         np.diff(self._entry_member_starts))

    def _partial(self, masks: np.ndarray, class_bytes: np.ndarray
                 ) -> tuple[_Rows | None, np.ndarray, np.ndarray, np.ndarray]:
        """The rows of partial results (as ``CommunicationModel._partial_table``), given the parts' masks (``masks``,
        with a padding part of mask 0 last), and per rep entry its reduce-scatter's axes (``uint8``, 0: none), dim
        (0 where none) and bytes out (a value it makes is split so from then on)."""
        count = len(self._rep_entry_class)
        if not len(self._red_atoms):
            nothing = np.zeros(count, dtype=np.int64)
            return None, nothing.astype(np.uint8), nothing, nothing
        reducing = masks.take(self._red_atoms)
        class_masks = np.bitwise_or.reduceat(reducing, self._red_starts)
        entry_masks = class_masks.take(self._rep_entry_class)
        # The first scanned use name (in order) split along all the entry's axes: its dim + 1 (0: none).
        scan_masks = entry_masks.take(self._scan_entry)
        fits = (masks.take(self._scan_atoms) & self._scan_keep & scan_masks) == scan_masks
        wanted = np.maximum.reduceat(fits * self._scan_code, self._scan_starts) % _DIM_CODE
        scattered = np.where(wanted, entry_masks, 0)  # the reduce-scatters' axes (mask 0: one device)
        sizes = class_bytes.take(self._rep_entry_bytes_class)
        out = sizes // self.communication.model.devices_of_mask.take(scattered)
        dims = np.where(scattered, wanted, 1) - 1
        # Rows per rep entry with axes: a reduce-scatter, or one all-reduce per distinct reduced mask of its class,
        # the most minor axes first (as CommunicationModel._partial_table). Where no class has two distinct ones
        # (the common case), that mask is the class's: one row per such rep entry, its axes the entry's.
        mixed = (reducing != class_masks.take(self._red_class)) & (reducing != 0)
        if mixed.any():
            return self._partial_rows(reducing, entry_masks, scattered, sizes, out), scattered, dims, out
        entry = entry_masks.take(self._entry_rep).nonzero()[0]
        if not len(entry):
            return None, scattered, dims, out
        columns = np.array((np.where(scattered, REDUCE_SCATTER, ALL_REDUCE), entry_masks, sizes, out), dtype=np.int64)
        return _Rows(columns, self._entry_rep.take(entry), entry, None), scattered, dims, out

    def _partial_rows(self, reducing: np.ndarray, entry_masks: np.ndarray, scattered_masks: np.ndarray,
                      sizes: np.ndarray, out: np.ndarray) -> _Rows | None:
        """``_partial``'s rows where a class has reducing names of distinct masks."""
        count = len(self._rep_entry_class)
        axes = entry_masks.astype(np.int64)
        scattered = scattered_masks != 0
        selected = axes.nonzero()[0]
        if not len(selected):
            return None
        nonzero = reducing.nonzero()[0]
        class_dims = _unique(self._red_class.take(nonzero) * 256 + (255 - reducing.take(nonzero).astype(np.int64)))
        classes, dim_masks = class_dims // 256, 255 - class_dims % 256
        cls = self._rep_entry_class.take(selected)
        first_of_class = classes.searchsorted(cls)
        selected_scattered = scattered.take(selected)
        counts = np.where(selected_scattered, 1, classes.searchsorted(cls, side="right") - first_of_class)
        total = int(counts.sum())
        row_start = counts.cumsum() - counts
        template = np.arange(len(selected)).repeat(counts)  # each template row's selected rep entry
        position = np.arange(total) - row_start.repeat(counts)
        dim_of_row = dim_masks.take(first_of_class.take(template) + position, mode="clip")
        row_scattered = selected_scattered.take(template)
        rep_entry = selected.take(template)
        row_axes = np.where(row_scattered, axes.take(rep_entry), dim_of_row)
        # Written out per member result, in result order (every result's rep entry: ``_entry_rep``), each result's
        # rows in template order.
        rows_of_rep = np.zeros(count, dtype=np.int64)
        rows_of_rep[selected] = counts
        rows_of_entry = rows_of_rep.take(self._entry_rep)
        template_of_rep = np.zeros(count, dtype=np.int64)  # each selected rep entry's first template row
        template_of_rep[selected] = row_start
        entry = np.arange(len(rows_of_entry)).repeat(rows_of_entry)
        offset = np.arange(len(entry)) - (rows_of_entry.cumsum() - rows_of_entry).repeat(rows_of_entry)
        row_template = template_of_rep.take(self._entry_rep.take(entry)) + offset
        kind = np.where(row_scattered, REDUCE_SCATTER, ALL_REDUCE)
        columns = np.array((kind, row_axes, sizes.take(rep_entry), out.take(rep_entry)), dtype=np.int64)
        return _Rows(columns, row_template, entry, None)

    # Uses.

    def _init_uses(self) -> None:
        """The values' classes (over their use sites with dims): per class the representative's sites, of which the
        live ones (``_live_sites``: those that may need a collective) with their padded rows of use-name parts, keeps
        and definition-name parts, byte class and partial source; per representative site the members' sites
        (``_site_members``)."""
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
        use_atoms = np.where(inside, atom[defs + use_names], pad)
        use_keep = np.where(inside, cm.keep_mask[use_names], 0).astype(np.uint8)
        def_names = np.asarray([def_base[v] for v in values.tolist()], dtype=np.int64)[:, None] + dim
        def_atoms = np.where(inside, atom[np.where(inside, def_names, 0)], pad)
        source = entry_rep[values]  # the rep entry whose reduce-scatter may split the value, or -1
        # A rep site whose every dim is used in its definition's part and kept whole (or is padding), and whose value
        # no reduce-scatter splits, never needs a collective: a state reads only the others ("live" sites).
        quiet = (def_atoms == pad) | ((use_atoms == def_atoms) & (use_keep == 0xFF))
        live = np.flatnonzero(~quiet.all(axis=1) | (source >= 0))
        self._live_sites = live
        self._use_atoms, self._use_keep, self._def_atoms = use_atoms[live], use_keep[live], def_atoms[live]
        self._site_class = np.asarray(site_class, dtype=np.int64)[live]
        self._site_bytes_class = value_class[values[live]]
        source = source[live]
        self._split_sites = np.flatnonzero(source >= 0)  # live sites a reduce-scatter may split
        self._split_source = source[self._split_sites]
        self._split_cells = self._split_sites * width  # each one's first cell in a flattened [live sites, width]
        # Each live site's bytes as an index into the rep entries' bytes out, then the byte classes' bytes: a split
        # site's value is one its source rep entry makes (of that entry's byte class, a part of the op classes' key),
        # so its bytes are the entry's out, reduce-scattered or not.
        assert (self._site_bytes_class[self._split_sites] == self._rep_entry_bytes_class[self._split_source]).all()
        self._site_bytes_at = self._site_bytes_class + len(self._rep_entry_class)
        self._site_bytes_at[self._split_sites] = self._split_source
        self._gathers = np.full(len(live) * width, ALL_GATHER, dtype=np.int64)  # a kind column of all-gathers
        # The pairs of live sites (in site order) of one class, which XLA's CSE merges where both are resharded
        # alike (``cse_groups``): the live sites are class by class.
        bounds = np.flatnonzero(np.diff(self._site_class, prepend=-1, append=-1)).tolist()
        pairs = [(first, second) for start, end in zip(bounds[:-1], bounds[1:], strict=True)
                 for first in range(start, end) for second in range(first + 1, end)]
        self._pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2).T.copy()  # [2, pairs]
        self._width = width
        self._site_member_starts = np.cumsum([0] + [len(m) for m in site_members]).astype(np.int64)
        self._site_members = np.concatenate(site_members) if site_members else np.zeros(0, dtype=np.int64)

    def _uses(self, masks: np.ndarray, class_bytes: np.ndarray, scattered: np.ndarray, dims: np.ndarray,
              out: np.ndarray, template_base: int) -> _Rows | None:
        """The rows of use sites (as ``CommunicationModel._use_table``), given the parts' masks (``masks``, with a
        padding part of mask 0 last) and the partial results' reduce-scatters per rep entry (``_partial``'s
        ``scattered``, ``dims``, ``out``); its template rows numbered from ``template_base``."""
        if not len(self._live_sites):
            return None
        use_masks = masks.take(self._use_atoms) & self._use_keep  # [live sites, width]
        def_masks = masks.take(self._def_atoms)
        source = self._split_source
        if len(source):
            # Values a reduce-scatter splits (on the dim it scatters; the others take mask 0 on dim 0).
            def_masks.reshape(-1)[self._split_cells + dims.take(source)] |= scattered.take(source)
        extra = def_masks & ~use_masks
        moved = np.bitwise_or.reduce(extra, axis=1)
        hit = moved != 0  # among the live sites
        if not hit.any():
            return None
        # XLA's CSE: a value's sites resharded alike share the collective (the first carries it, the last one's
        # op frees it), as CommunicationModel._use_table groups them (``cse_groups``): a pair of one class's sites,
        # both hit and of one layout, merges; the first carries, and the last site merged with it frees.
        local = last_local = None
        first, second = self._pairs
        if len(first):
            words = use_masks.view(np.uint64)  # 8 dims a word
            if words.shape[1] == 1:
                words = words.reshape(-1)
                alike = words.take(first) == words.take(second)
            else:
                alike = (words.take(first, axis=0) == words.take(second, axis=0)).all(axis=1)
            merged = (alike & hit.take(first) & hit.take(second)).nonzero()[0]
            if len(merged):
                first, second = first.take(merged), second.take(merged)
                carries = hit.copy()
                carries[second] = False
                last_of = np.arange(len(hit))
                np.maximum.at(last_of, first, second)
                local = carries.nonzero()[0]
                last_local = last_of.take(local)
        if local is None or last_local is None:
            local = last_local = hit.nonzero()[0]  # the live sites carrying collectives
        moved = moved.take(local)
        to_all = moved & np.bitwise_or.reduce(use_masks.take(local, axis=0), axis=1)
        gathered = moved & ~to_all
        site_bytes = np.concatenate((out, class_bytes)).take(self._site_bytes_at.take(local))
        devices = self.communication.model.devices_of_mask
        # Gathers one dim at a time, the last dim first; then the all-to-all (as _use_table).
        width = self._width
        per_dim = (extra.take(local, axis=0)[:, ::-1] & gathered[:, None]).reshape(-1)
        steps = per_dim.nonzero()[0]
        gather_site = steps // width  # site by site, steps in order
        step_axes = per_dim.take(steps)
        step_devices = devices.take(step_axes)
        step_in = site_bytes.take(gather_site)
        later = (gather_site[1:] == gather_site[:-1]).nonzero()[0] + 1
        if len(later):  # a site gathering several dims: each step's input the one before's output
            grown = step_devices.copy()
            while len(later):
                grown[later] = grown[later - 1] * step_devices[later]
                later = later[np.isin(later - 1, later)]
            step_out = step_in * grown
            step_in = step_out // step_devices
        else:
            step_out = step_in * step_devices
        all_to_alls = to_all.nonzero()[0]
        if len(all_to_alls):
            gathered_bytes = site_bytes * devices.take(gathered)
            template_site = np.concatenate((gather_site, all_to_alls))
            step_order = template_site.argsort(kind="stable")
            template_site = template_site.take(step_order)
            columns = np.array((np.concatenate((self._gathers[:len(gather_site)],
                                                np.full(len(all_to_alls), ALL_TO_ALL, dtype=np.int64))),
                                np.concatenate((step_axes, to_all.take(all_to_alls))),
                                np.concatenate((step_in, gathered_bytes.take(all_to_alls))),
                                np.concatenate((step_out, gathered_bytes.take(all_to_alls)))),
                               dtype=np.int64).take(step_order, axis=1)
        else:  # gathers only: already site by site
            template_site = gather_site
            columns = np.array((self._gathers[:len(gather_site)], step_axes, step_in, step_out), dtype=np.int64)
        # Written out per member site, in site order (each site one member of one carrying rep site), each site's
        # rows in template order; a member's last site: the member of the last hit's rep site at its rank (every rep
        # site of a class lists the class's values in one order).
        starts = self._live_member_starts.take(local)
        counts = self._live_member_counts.take(local)
        carrier = np.arange(len(local)).repeat(counts)
        at = np.arange(len(carrier)) + (starts - (counts.cumsum() - counts)).take(carrier)  # into _site_members
        order = self._site_members.take(at).argsort()  # member sites are distinct
        at, carrier = at.take(order), carrier.take(order)
        member = self._site_members.take(at)
        last = self._site_members.take(at + (self._live_member_starts.take(last_local) - starts).take(carrier))
        if len(template_site) == len(local):  # a row per carrying site: its template row is its own
            return _Rows(columns, carrier + template_base, member, last)
        steps = np.bincount(template_site, minlength=len(local)).take(carrier)
        row_of = np.arange(len(carrier)).repeat(steps)
        first_step = template_site.searchsorted(carrier)  # each site's first template row
        row_template = (first_step - (steps.cumsum() - steps)).repeat(steps) + np.arange(int(steps.sum()))
        return _Rows(columns, row_template + template_base, member.take(row_of), last.take(row_of))

    def table(self, state: ShardingState, *, class_bytes: np.ndarray | None = None) -> CollectiveTable:
        """``CommunicationModel.table(state)``, the same rows in the same order (``state`` built on the
        partition; ``class_bytes``: ``CommunicationModel.class_bytes(state)`` when the caller has it)."""
        cm = self.communication
        if class_bytes is None:
            class_bytes = cm.class_bytes(state)
        masks = np.concatenate((state.part_masks(), _NO_AXES))
        partial, scattered, dims, out = self._partial(masks, class_bytes)
        uses = self._uses(masks, class_bytes, scattered, dims, out,
                          partial.columns.shape[1] if partial is not None else 0)
        table = self._write(partial, uses)
        # Halo exchanges are rare: without any windowed dim, the names' masks are left unread.
        halos = cm._halo_table(state.masks) if len(cm._halo_ops) else None
        if halos is not None:
            return CollectiveTable.concatenate([table, halos]) if table is not None else halos
        return table if table is not None else CollectiveTable.empty()

    def _write(self, partial: _Rows | None, uses: _Rows | None) -> CollectiveTable | None:
        """The table of rows (partial results', then uses'): a take of the template rows' columns, one of the
        members' and one of the last members' ops."""
        if partial is None and uses is None:
            return None
        if partial is not None and uses is not None and uses.last is not None:
            columns = np.concatenate((partial.columns, uses.columns), axis=1)
            template = np.concatenate((partial.template, uses.template))
            member = np.concatenate((partial.member, uses.member))
            last = np.concatenate((self._no_last[:len(partial.member)] if len(partial.member) <= len(self._no_last)
                                   else np.full(len(partial.member), self._no_member), uses.last))
        else:
            rows = partial if partial is not None else uses
            assert rows is not None
            columns, template, member = rows.columns, rows.template, rows.member
            last = rows.last if rows.last is not None else np.full(len(member), self._no_member, dtype=np.int64)
        kind, axes, bytes_in, bytes_out = columns.take(template, axis=1)
        value, op, operand = self._member_columns.take(member, axis=1)
        return CollectiveTable(kind=kind, axes_mask=axes, value=value, op=op, operand=operand, bytes_in=bytes_in,
                               bytes_out=bytes_out, last_op=self._member_op.take(last))


_NO_AXES = np.zeros(1, dtype=np.uint8)  # the padding part's mask


class _Rows(NamedTuple):
    """Rows of a table as ``ClassTable`` finds them: per template row its kind, axes, bytes in and bytes out (the
    rows of ``columns``, ``int64[4, templates]``); per row its template row and member (``ClassTable._member_*``),
    and the member whose op is its last op (``None``: none, a partial result)."""

    columns: np.ndarray
    template: np.ndarray
    member: np.ndarray
    last: np.ndarray | None


def _starts(keys: np.ndarray) -> np.ndarray:
    """``bool[n]``: where each run of equal keys (``keys`` grouped) starts."""
    starts = np.empty(len(keys), dtype=bool)
    starts[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=starts[1:])
    return starts


def _unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a small ``int64`` array (sorted, distinct), with less of its overhead."""
    values = np.sort(values)
    return values[_starts(values)]
