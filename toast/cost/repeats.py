"""Repeated layers in the cost model: the compute stream's items that repeat, found once per program
(``item_runs``), and the streams' makespan run through such repeats in time independent of their number
(``periodic_makespan``).

An unrolled model's layers are identical op sequences: the forward layers, the backward layers, the optimizer's
per-parameter updates in ``tree_map`` order. Their kernels, so their top-level items, repeat with a period. Under a
state that splits every layer alike (the search's actions are mirrored across layers, and so are the manual
strategies) the collectives of repeat ``r`` of a run are those of repeat 0 shifted by ``r`` periods, and the items
take the same seconds. The makespan's scan over them then reaches, after a transient of a repeat or two, a state equal
to the one a repeat before once shifted (by the repeat's items, the time it takes and the delay it adds to the
compute stream): from there every repeat does what the last one did, and the scan jumps to the run's end, adding the
last repeat's effects (the delays it credits, the collectives it leaves late for consumers past the run) once per
repeat jumped, in closed form.

Nothing here is assumed of a state: per state the scan checks that a run's rows and item times repeat (exactly: same
axes and durations, items shifted by whole periods; a run's first or last repeats may differ and are scanned) and
that its own state does, and otherwise scans row by row, as ``toast.cost.schedule.makespan`` does. Where the rows
repeat only every few periods (XLA's combiner groups collectives across layer boundaries), a few repeats are taken
as one. What is equal: the
makespan and the per-axes sums of the exposed seconds, to within rounding. The states are compared to within
``_ULPS`` units in the last place of ``scale`` (the items' and collectives' seconds summed, at most twice the step
time): in exact arithmetic they are equal, the tolerance only absorbs the rounding of sums taken at other times. A
jump over ``n`` repeats then moves the results by at most ``n * (_ULPS + 1)`` such units, below 1e-12 relative for
``n`` up to 130: a jump skips at most ``_MAX_JUMP`` repeats, and the scan checks the state again by a repeat scanned
after it before jumping on (the tests find 1e-14 and less). Which row of an axes set is credited with an exposed
wait may differ where two of its rows tie.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from toast.cost.kernels import KernelPlan
from toast.frontend.ir import Program

# Fewer repeats than this are not worth a run: a jump needs two repeats scanned and one to skip.
MIN_REPEATS = 4
# Candidate periods tried (the most frequent gaps between equal items).
_CANDIDATE_PERIODS = 24


@dataclass(frozen=True, slots=True)
class ItemRuns:
    """Runs of top-level items (``toast.cost.plan.Schedule``) whose kernels repeat: run ``k`` is items
    ``starts[k] .. starts[k] + periods[k] * repeats[k] - 1``, item ``i`` of it like item ``i + periods[k]``.
    Runs are disjoint and in item order. A hint for the scans: they check each state's rows and times.

    Attributes:
      starts: ``int64[runs]``, each run's first item.
      periods: ``int64[runs]``, items per repeat.
      repeats: ``int64[runs]``, repeats (at least ``MIN_REPEATS``).
      boundaries: ``int64[runs + sum(repeats)]``, derived: the items where each run's repeats begin and where it
        ends, counted from 1 (as the scans count them), run after run (found among a state's collectives at once).
      edges: ``int64[2 * runs]``, derived: each run's first item and the item after it, run after run.
    """

    starts: np.ndarray
    periods: np.ndarray
    repeats: np.ndarray
    boundaries: np.ndarray = field(init=False, repr=False, compare=False)
    edges: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ends = self.starts + self.periods * self.repeats
        object.__setattr__(self, "edges", np.stack((self.starts, ends), axis=1).ravel().astype(np.int64))
        object.__setattr__(self, "boundaries", np.concatenate(
            [np.zeros(0, dtype=np.int64)] + [start + 1 + period * np.arange(repeats + 1, dtype=np.int64) for
                                             start, period, repeats in zip(self.starts.tolist(), self.periods.tolist(),
                                                                           self.repeats.tolist(), strict=True)]))

    def __len__(self) -> int:
        return len(self.starts)

    @staticmethod
    def none() -> ItemRuns:
        """No runs."""
        empty = np.zeros(0, dtype=np.int64)
        return ItemRuns(empty, empty, empty)


def item_runs(program: Program, plan: KernelPlan, top_of_kernel: np.ndarray, item_count: int) -> ItemRuns:
    """The runs of repeated items: items are alike when their kernels run alike ops (kind, operand and result
    types, attributes) in the same order; a run is a stretch of items equal to the item a period later, over at
    least ``MIN_REPEATS`` periods (linear in the program, times the candidate periods tried)."""
    if item_count < 2 * MIN_REPEATS:
        return ItemRuns.none()
    item_key = _item_signatures(program, plan, top_of_kernel, item_count)
    # Candidate periods: the most frequent gaps between an item and the previous one alike.
    order = np.lexsort((np.arange(item_count), item_key))
    same = item_key[order[1:]] == item_key[order[:-1]]
    gaps = (order[1:] - order[:-1])[same]
    if not len(gaps):
        return ItemRuns.none()
    counts = np.bincount(gaps)
    candidates = np.argsort(-counts, kind="stable")[:_CANDIDATE_PERIODS]
    found: list[tuple[int, int, int, int]] = []  # (-covered, start, period, repeats)
    for period in candidates[counts[candidates] > 0].tolist():
        if period <= 0 or period * MIN_REPEATS > item_count:
            continue
        equal = np.concatenate(([False], item_key[period:] == item_key[:-period], [False]))
        edges = np.flatnonzero(equal[1:] != equal[:-1])
        for begin, end in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            repeats = (end - begin) // period + 1
            if repeats >= MIN_REPEATS:
                found.append((-(repeats * period), begin, period, repeats))
    found.sort()
    taken = np.zeros(item_count, dtype=bool)
    runs = []
    for _, start, period, repeats in found:
        if not taken[start:start + period * repeats].any():
            taken[start:start + period * repeats] = True
            runs.append((start, period, repeats))
    runs.sort()
    if not runs:
        return ItemRuns.none()
    starts, periods, repeats = (np.asarray(column, dtype=np.int64) for column in zip(*runs, strict=True))
    return ItemRuns(starts, periods, repeats)


def _item_signatures(program: Program, plan: KernelPlan, top_of_kernel: np.ndarray, item_count: int) -> np.ndarray:
    """``int64[items]``: equal numbers for items whose kernels run alike ops."""
    value_keys = [(value.shape, value.dtype) for value in program.values]
    op_ids: dict[tuple, int] = {}
    op_key = []
    for op in program.ops:
        try:
            attrs = hash(op.attrs)
        except TypeError:  # a dict among the attributes
            attrs = hash(repr(op.attrs))
        key = (op.kind, tuple(value_keys[v] for v in op.operands), tuple(value_keys[v] for v in op.results), attrs,
               len(op.regions))
        op_key.append(op_ids.setdefault(key, len(op_ids)))
    item_parts: list[list[tuple]] = [[] for _ in range(item_count)]
    for k, kernel in enumerate(plan.kernels):
        item_parts[int(top_of_kernel[k])].append((kernel.kind, tuple(op_key[o] for o in kernel.ops)))
    item_ids: dict[tuple, int] = {}
    return np.asarray([item_ids.setdefault(tuple(parts), len(item_ids)) for parts in item_parts], dtype=np.int64)


# A run's states are compared to within this many units in the last place of the scan's scale; a jump skips at most
# ``_MAX_JUMP`` repeats (so that it moves results by at most 1e-12 relative; the next is checked again).
_ULPS = 16
_MAX_JUMP = 128
# Same-ready stretches of at least this many collectives are scanned with numpy (no waits change inside one).
_VECTOR_ROWS = 16
# The makespan jumps where some run holds this many collectives (below, checking runs costs more than it saves),
# and then over every run of at least ``_MIN_SEGMENT_ROWS``.
_MIN_RUN_ROWS = 400
_MIN_SEGMENT_ROWS = 48
# A run whose rows repeat only every few of its periods is tried as repeats of up to this many periods.
_MAX_MULTIPLE = 8
# Pops of at most this many collectives of the sorted arrays are done in Python (numpy's calls cost more).
_FEW_POPS = 16
# An item after every other (no collective pending).
_NEVER = 1 << 62
# Bits of each of a collective's ready item + 1, consumer + 1 and axes mask in one sort key (three fit in an int64).
_KEY_BITS = 21


def jumps_pay(ready: np.ndarray, runs: ItemRuns) -> bool:
    """Whether some run holds enough of the collectives ready at items ``ready`` for ``periodic_makespan`` to pay
    (below that, checking the runs costs more than scanning them)."""
    if not len(runs):
        return False
    # Odd positions among the edges fall in runs (run ``k`` at ``2k + 1``): collectives per run in one pass.
    inside = np.bincount(np.searchsorted(runs.edges, ready, side="right"), minlength=2 * len(runs) + 1)[1::2]
    return int(inside.max()) >= _MIN_RUN_ROWS


def periodic_makespan(item_time: np.ndarray, consumer: np.ndarray, ready: np.ndarray, duration: np.ndarray,
                      axes_mask: np.ndarray, runs: ItemRuns) -> tuple[float, np.ndarray]:
    """``toast.cost.schedule.makespan`` (same arguments and results), jumping over the repeats of ``runs`` once the
    streams' state repeats (the module docstring says what is equal)."""
    starts = np.empty(len(item_time) + 1)
    starts[0] = 0.0
    np.cumsum(item_time, out=starts[1:])
    total = float(starts[-1])
    exposed = np.zeros(len(duration))
    if not len(duration):
        return total, exposed
    rows, consumer, ready, duration, masks = merged_rows(consumer, ready, duration, axes_mask)
    # As ``makespan`` (items counted from 1 there): made after the item ready, needed when the consumer starts.
    needed_at = np.where(ready < consumer, starts[np.minimum(consumer, len(item_time))], np.inf)
    consumer, ready = consumer + 1, ready + 1
    made_at = starts[ready]
    scan = _Streams(starts, consumer, ready, made_at, needed_at, duration, masks,
                    forward=not len(item_time) or bool(item_time.min() >= 0.0))
    done = 0
    for lo, hi, segment in _segments(scan, item_time, runs):
        scan.plain(done, lo)
        scan.run(lo, segment)
        done = hi
    scan.plain(done, len(duration))
    added, delay, comm_free = scan.finish()
    if comm_free > total + delay:  # the stream runs on after the last item
        added[-1] += comm_free - (total + delay)
    exposed[rows] = added
    return max(total + delay, comm_free), exposed


@dataclass(frozen=True, slots=True)
class _Segment:
    """A run's collectives in the makespan's order: ``repeats`` repeats of ``width`` rows each, repeat ``r``'s
    items ``first + r * period ..`` (counted from 1, as the scan counts them). ``far``: ``bool[width]``, the rows
    consumed after the stretch (never waited for inside it); the others are consumed a fixed number of items after
    they are ready. ``clean``: the repeats whose consumers all lie within the stretch or at the item right after
    it (so that their due times repeat too). ``far_due``: per row consumed after the stretch (in order), its
    earliest consumer over the repeats."""

    first: int
    period: int
    repeats: int
    width: int
    far: np.ndarray
    clean: int
    far_due: tuple[int, ...]


def _segments(scan: _Streams, item_time: np.ndarray, runs: ItemRuns) -> list[tuple[int, int, _Segment]]:
    """The stretches of runs whose rows and item times repeat in this state: ``(first row, end row, segment)``, in
    row order. A run's first or last repeats may differ (the first layer reads the embedding): the stretch is the
    longest one around the run's middle repeat where every repeat equals it (each repeat equal to the next: rows
    shifted by one period, same durations and axes). Where the rows repeat only every few periods (XLA's combiner
    groups collectives across layer boundaries: a layer's combined collectives equal those ``k`` layers on), ``k``
    repeats are taken as one (``k`` up to ``_MAX_MULTIPLE``, while ``MIN_REPEATS`` such remain), the longest
    stretch found kept. Few numpy calls per run: each costs more than its work."""
    found = []
    ready_array = scan.ready_array
    fields: list[np.ndarray] = []  # ready item, duration's bits, axes: one row each (made once, when needed)
    located = np.searchsorted(ready_array, runs.boundaries)  # the first row ready at each boundary or later
    listed = located.tolist()
    offset = 0
    for start, period, repeats in zip(runs.starts.tolist(), runs.periods.tolist(), runs.repeats.tolist(),
                                      strict=True):
        offset += repeats + 1
        if listed[offset - 1] - listed[offset - repeats - 1] < min(_MIN_SEGMENT_ROWS, _MIN_RUN_ROWS):
            continue
        bounds = located[offset - repeats - 1:offset]
        best, covered = None, 0  # the stretch and how many of the run's repeats it covers
        multiple = 1
        while multiple <= _MAX_MULTIPLE and repeats // multiple >= MIN_REPEATS and 2 * covered < repeats:
            count = repeats // multiple
            segment = _segment(scan, item_time, fields, start, period * multiple, count,
                               bounds[:count * multiple + 1:multiple])
            if segment is not None and segment[2].repeats * multiple > covered:
                best, covered = segment, segment[2].repeats * multiple
            multiple += 1
        if best is not None:
            found.append(best)
    return found


def _segment(scan: _Streams, item_time: np.ndarray, fields: list[np.ndarray], start: int, period: int,
             repeats: int, bounds: np.ndarray) -> tuple[int, int, _Segment] | None:
    """``_segments``' stretch of one run taken as ``repeats`` repeats of ``period`` items from item ``start``
    (``bounds``: the first row of each repeat and the end), or ``None`` where none repeats long enough to jump."""
    ready_array = scan.ready_array
    counts = bounds[1:] - bounds[:-1]
    middle = repeats // 2
    width = int(counts[middle])
    if not width:  # no rows to jump over
        return None
    # The repeats of ``width`` rows around the middle one (mostly all): their rows lie ``width`` apart.
    uniform = counts == width
    first, last = (0, repeats) if uniform.all() else _stretch_around(uniform, middle)
    if last - first < 3:  # a jump compares two repeats and skips at least one
        return None
    lo, hi = int(bounds[first]), int(bounds[last])
    # Where neighbours (repeat ``first + k`` and the next: pair ``k``) differ, in item times or in rows (ready
    # items one period on, the same durations' bits and axes; the differences wrap, so zero or not as the bits):
    # element ``e`` of pair ``e // unit``.
    times = item_time[start + first * period:start + last * period]
    differ = [(np.flatnonzero(times[period:] != times[:-period]), period)]
    if not fields:
        rows = np.empty((3, len(ready_array)), dtype=np.int64)
        rows[0], rows[1], rows[2] = ready_array, scan.duration_array.view(np.int64), scan.mask_array
        fields.append(rows)
    shifted = fields[0][:, lo + width:hi] - fields[0][:, lo:hi - width]
    shifted[0] -= period
    if shifted.any():
        differ.append((np.flatnonzero(shifted.any(axis=0)), width))
    # The repeats around the middle one linked to it by equal neighbours: up to the last pair before it that
    # differs, from the first at or after it.
    middle_pair, before, after = middle - first, 0, last - first
    for elements, unit in differ:
        cut = int(np.searchsorted(elements, middle_pair * unit))
        if cut:
            before = max(before, int(elements[cut - 1]) // unit + 1)
        if cut < len(elements):
            after = min(after, int(elements[cut]) // unit + 1)
    first, last = first + before, first + after
    if last - first < 3:  # a jump compares two repeats and skips at least one
        return None
    lo, hi = int(bounds[first]), int(bounds[last])
    end = start + 1 + last * period  # items counted from 1, as the scan counts them
    count = last - first
    consumer = scan.consumer_array[lo:hi].reshape(count, width)
    periodic = (consumer[1:] - consumer[:-1] == period).all(axis=0)
    if periodic.all():
        far, far_due = ~periodic, ()
    else:
        earliest = consumer.min(axis=0)
        far = (earliest >= end) & ~periodic
        if not (periodic | far).all():
            return None
        far_due = tuple(earliest[far].tolist())
    # Repeats whose periodic consumers lie at most one item past the stretch (their due times repeat): repeat
    # ``r``'s latest periodic consumer is repeat 0's plus ``r`` periods.
    latest = max((item for item, alike in zip(consumer[0].tolist(), periodic.tolist(), strict=True) if alike),
                 default=None)
    clean = count if latest is None else min(count, max(0, (end - latest) // period + 1))
    return lo, hi, _Segment(start + 1 + first * period, period, count, width, far, clean, far_due)


def _stretch_around(alike: np.ndarray, middle: int) -> tuple[int, int]:
    """The longest stretch ``first .. last - 1`` of ``alike`` holding ``middle`` (empty when it is not alike)."""
    if not alike[middle]:
        return middle, middle
    before = np.flatnonzero(~alike[:middle])
    after = np.flatnonzero(~alike[middle:])
    return (int(before[-1]) + 1 if len(before) else 0), (middle + int(after[0]) if len(after) else len(alike))


class _Streams:
    """The makespan's scan (``toast.cost.schedule.makespan``'s loop), row range by row range, with its state kept
    between calls: the compute stream's delay, when the communication stream is free, the collectives late for
    consumers not yet reached and the delay each row caused. The late collectives are a heap of ``(consumer,
    lateness, row)`` for those pushed one by one and sorted arrays for those pushed by numpy (``bulk``, pending from
    ``bulk_at`` on; ``bulk_lists`` the same as lists, for bisection and short pops); both are popped in ``(consumer,
    lateness, row)`` order, as ``makespan``'s heap pops them, so which of the two holds a collective does not
    matter."""

    def __init__(self, starts: np.ndarray, consumer: np.ndarray, ready: np.ndarray, made_at: np.ndarray,
                 needed_at: np.ndarray, duration: np.ndarray, masks: np.ndarray, *, forward: bool):
        self.starts = starts
        self.forward = forward  # the items' starts never decrease (no item takes negative time)
        self.ready_array, self.consumer_array, self.duration_array, self.mask_array = ready, consumer, duration, masks
        self.needed_array, self.made_array = needed_at, made_at
        self.delay = 0.0
        self.comm_free = 0.0
        self.heap: list[tuple[int, float, int]] = []
        self.bulk = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
        self.bulk_lists: tuple[list[int], list[float], list[int]] = ([], [], [])
        self.bulk_at = 0
        self.bulk_first = _NEVER
        # Delays credited in Python (rows and seconds, in order) and by numpy (pops in bulk, jumps).
        self.credit_rows: list[int] = []
        self.credit_seconds: list[float] = []
        self.credited = np.zeros(len(duration))
        self.scale = float(starts[-1] + duration.sum())
        # The same-ready stretches long enough for numpy: where each starts and ends.
        bounds = np.concatenate(([0], np.flatnonzero(ready[1:] != ready[:-1]) + 1, [len(ready)]))
        long = np.flatnonzero(bounds[1:] - bounds[:-1] >= _VECTOR_ROWS)
        self.long_starts, self.long_ends = bounds[long].tolist(), bounds[long + 1].tolist()

    # Pending collectives.

    def add_bulk(self, consumer: np.ndarray, late: np.ndarray, row: np.ndarray, floor: float, *,
                 ordered: bool = False) -> None:
        """Push late collectives given as arrays, dropping those (and the pending ones) no later than ``floor``, a
        delay the compute stream has reached: they can raise it no more (popped, they are credited nothing; the
        jumps' checks and replays count those later than the delay only). ``ordered``: they come in pop order."""
        old_consumer, old_late, old_row = self.bulk
        at = self.bulk_at
        merged = at < len(old_consumer)
        if merged:
            consumer, late, row = (np.concatenate((old_consumer[at:], consumer)),
                                   np.concatenate((old_late[at:], late)), np.concatenate((old_row[at:], row)))
        order = np.flatnonzero(late > floor)
        if merged or not ordered:
            order = order[np.lexsort((row[order], late[order], consumer[order]))]
        self.bulk = (consumer[order], late[order], row[order])
        self.bulk_lists = (self.bulk[0].tolist(), self.bulk[1].tolist(), self.bulk[2].tolist())
        self.bulk_at = 0
        self.bulk_first = self.bulk_lists[0][0] if len(order) else _NEVER

    def drop_bulk(self, cut: int) -> None:
        """Drop the bulk's pending collectives before index ``cut``."""
        self.bulk_at = cut
        consumers = self.bulk_lists[0]
        self.bulk_first = consumers[cut] if cut < len(consumers) else _NEVER

    def bulk_to_heap(self, ready: int) -> bool:
        """Move the bulk's collectives due at or before item ``ready`` to the heap if they are few (popped there in
        the same order); ``False`` (nothing moved) if they are many."""
        at = self.bulk_at
        consumers, lates, rows = self.bulk_lists
        cut = bisect.bisect_right(consumers, ready, at)
        if cut - at > _FEW_POPS:
            return False
        heap = self.heap
        for entry in zip(consumers[at:cut], lates[at:cut], rows[at:cut], strict=True):
            heapq.heappush(heap, entry)
        self.drop_bulk(cut)
        return True

    def pop(self, ready: int, log: list | None = None) -> None:
        """Pop the collectives due at or before item ``ready``: the delay grows to the largest lateness, each
        credited with what it adds; ``log`` collects ``(consumer, lateness, row, credit)`` per pop."""
        heap = self.heap
        popped = []
        while heap and heap[0][0] <= ready:
            popped.append(heapq.heappop(heap))
        if self.bulk_first <= ready:
            at = self.bulk_at
            consumers, lates, rows = self.bulk_lists
            cut = bisect.bisect_right(consumers, ready, at)
            self.bulk_at = cut
            self.bulk_first = consumers[cut] if cut < len(consumers) else _NEVER
            if cut - at + len(popped) <= _FEW_POPS:  # merged in Python, in the heap's order
                popped = sorted(popped + list(zip(consumers[at:cut], lates[at:cut], rows[at:cut], strict=True)))
            else:
                bulk_consumer, bulk_late, bulk_row = self.bulk
                consumer, late, row = bulk_consumer[at:cut], bulk_late[at:cut], bulk_row[at:cut]
                if popped:
                    consumer, late, row = (np.concatenate((consumer, [entry[0] for entry in popped])),
                                           np.concatenate((late, [entry[1] for entry in popped])),
                                           np.concatenate((row, [entry[2] for entry in popped])).astype(np.int64))
                    order = np.lexsort((row, late, consumer))
                    consumer, late, row = consumer[order], late[order], row[order]
                credits = self._credit(late, row)
                if log is not None:
                    log.extend(zip(consumer.tolist(), late.tolist(), row.tolist(), credits.tolist(), strict=True))
                return
        delay = self.delay
        for consumer_item, late_value, late_row in popped:
            credit = late_value - delay if late_value > delay else 0.0
            if credit:
                self.credit_rows.append(late_row)
                self.credit_seconds.append(credit)
                delay = late_value
            if log is not None:
                log.append((consumer_item, late_value, late_row, credit))
        self.delay = delay

    def _credit(self, late: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Pops of ``late`` (in pop order) from the current delay: each one above the delay so far raises it and is
        credited with the difference (as ``makespan``'s loop does, the same numbers); the credits."""
        running = np.maximum.accumulate(np.concatenate(([self.delay], late)))
        credits = np.where(late > running[:-1], late - running[:-1], 0.0)
        raised = np.flatnonzero(credits)
        if len(raised):
            np.add.at(self.credited, row[raised], credits[raised])
        self.delay = float(running[-1])
        return credits

    # Scanning.

    def plain(self, begin: int, end: int) -> None:
        """Scan rows ``begin .. end - 1``: long same-ready stretches with numpy, the rest row by row."""
        row = begin
        at = bisect.bisect_left(self.long_starts, row)
        while row < end:
            long = min(self.long_starts[at], end) if at < len(self.long_starts) else end
            if long > row:
                self.step(row, long, drop_dead=True)
                row = long
            else:
                stop = min(self.long_ends[at], end)
                self.stretch(row, stop)
                row = stop
                at += 1

    def stretch(self, begin: int, end: int) -> None:
        """Rows ``begin .. end - 1``, all ready at one item: the delay changes at the first only (the collectives
        pushed meanwhile are due after that item), and the stream runs them back to back from
        ``max(free, ready + delay)``: the same sums as the row-by-row loop, added in the same order."""
        self.pop(int(self.ready_array[begin]))
        ready_time = float(self.made_array[begin]) + self.delay
        free = ready_time if ready_time > self.comm_free else self.comm_free
        ends = np.cumsum(np.concatenate(([free], self.duration_array[begin:end])))[1:]
        self.comm_free = float(ends[-1])
        needed = self.needed_array[begin:end]
        late = np.flatnonzero(ends > needed)
        if len(late):
            # In pop order as they come: by consumer (the rows' order), then lateness (the ends grow, for
            # durations of no less than zero), then row.
            self.add_bulk(self.consumer_array[begin:end][late], ends[late] - needed[late], late + begin, self.delay,
                          ordered=bool(self.duration_array[begin:end].min() >= 0.0))

    def step(self, begin: int, end: int, log: list | None = None, *, drop_dead: bool = False) -> None:
        """Rows ``begin .. end - 1`` one by one (``makespan``'s loop); ``log`` collects each pop ``(consumer,
        lateness, row, credit)`` and the stream's free time after each row, ``("row", free)``. ``drop_dead``: push
        no collective late by no more than the delay (popped, it would be credited nothing; and no jump's check
        counts it: rows outside runs only)."""
        heap, heappop, heappush = self.heap, heapq.heappop, heapq.heappush
        credit_row, credit_seconds = self.credit_rows.append, self.credit_seconds.append
        delay, comm_free = self.delay, self.comm_free
        floor = delay if drop_dead else 0.0  # pushed when later than this
        # The earliest consumer pending (heap or bulk): below it a row pops nothing.
        due = heap[0][0] if heap and heap[0][0] < self.bulk_first else self.bulk_first
        rows = slice(begin, end)
        consumer, ready, made = (self.consumer_array[rows].tolist(), self.ready_array[rows].tolist(),
                                 self.made_array[rows].tolist())
        needed, duration = self.needed_array[rows].tolist(), self.duration_array[rows].tolist()
        for index, row_ready, row_made, row_needed, seconds, row_consumer in zip(
                range(begin, end), ready, made, needed, duration, consumer, strict=True):
            if due <= row_ready:
                if self.bulk_first <= row_ready and not self.bulk_to_heap(row_ready):
                    self.delay = delay
                    self.pop(row_ready, log)
                    delay = self.delay
                while heap and heap[0][0] <= row_ready:  # ``pop``'s loop, inline
                    consumer_item, late, late_row = heappop(heap)
                    credit = late - delay if late > delay else 0.0
                    if credit:
                        credit_row(late_row)
                        credit_seconds(credit)
                        delay = late
                    if log is not None:
                        log.append((consumer_item, late, late_row, credit))
                due = heap[0][0] if heap and heap[0][0] < self.bulk_first else self.bulk_first
                if drop_dead:
                    floor = delay
            ready_time = row_made + delay
            if ready_time > comm_free:
                comm_free = ready_time
            comm_free += seconds
            late = comm_free - row_needed
            if late > floor:
                heappush(heap, (row_consumer, late, index))
                if row_consumer < due:
                    due = row_consumer
            if log is not None:
                log.append(("row", comm_free))
        self.delay, self.comm_free = delay, comm_free

    def finish(self) -> tuple[np.ndarray, float, float]:
        """The waits of the collectives still pending at the end: ``(delay per row, delay, free)``."""
        # Those no later than the delay are credited nothing, whatever their order: only the others are sorted.
        delay = self.delay
        self.heap = [entry for entry in self.heap if entry[1] > delay]
        heapq.heapify(self.heap)
        if self.bulk_first < _NEVER:
            consumer, late, row = self.bulk
            self.add_bulk(consumer[:0], late[:0], row[:0], delay)
        self.pop(_NEVER)
        # Each row's credits summed in order from zero, as ``makespan`` adds them.
        added = (np.bincount(self.credit_rows, weights=self.credit_seconds, minlength=len(self.credited))
                 if self.credit_rows else np.zeros(len(self.credited)))
        return added + self.credited, self.delay, self.comm_free

    # The jump over a run's repeats.

    def run(self, lo: int, segment: _Segment) -> None:
        """A run's rows (from row ``lo``): scanned repeat by repeat until the state at a repeat's start equals the
        one a repeat before (shifted by a period, the delay by what that repeat added), then jumped to the last
        clean repeat; the rest scanned."""
        width, repeats, clean = segment.width, segment.repeats, segment.clean
        keys: dict[int, tuple] = {}
        logs: dict[int, list] = {}
        tries = _tries(clean)
        repeat = 0
        while repeat < repeats:
            if repeat in tries and repeat < clean:  # from the last clean repeat on there is nothing to jump to
                keys[repeat] = self._key(lo, segment, repeat)
                target = self._jump(lo, segment, repeat, keys, logs) if repeat - 1 in logs else None
                if target is not None:
                    # A long run is jumped in parts, each checked again by a repeat scanned after it.
                    tries |= {target, target + 1}
                    repeat = target
                    continue
            log: list | None = [] if repeat + 1 in tries and repeat + 1 < clean else None
            self.step(lo + repeat * width, lo + (repeat + 1) * width, log)
            if log is not None:
                logs[repeat] = log
            repeat += 1

    def _key(self, lo: int, segment: _Segment, repeat: int) -> tuple:
        """The state at the start of ``repeat`` relative to it: ``(delay, free - start - delay, that at least the
        first row's ready time, entries)``; entries ``(consumer - the repeat's first item, lateness - delay, from the
        run, axes)`` of the pending collectives that can still delay the compute stream (lateness above the delay)
        and are due inside the run, sorted (a few: found in the heap by Python, in the sorted bulk by numpy)."""
        item = segment.first + repeat * segment.period
        begins = float(self.starts[item - 1])
        delay = self.delay
        relative_free = self.comm_free - begins - delay
        floor = float(self.made_array[lo + repeat * segment.width]) - begins
        run_end = segment.first + segment.repeats * segment.period
        live = [entry for entry in self.heap if entry[1] > delay and entry[0] < run_end]
        at = self.bulk_at
        cut = bisect.bisect_left(self.bulk_lists[0], run_end, at)
        if cut > at:
            bulk_consumer, bulk_late, bulk_row = self.bulk
            index = np.flatnonzero(bulk_late[at:cut] > delay) + at
            if len(index):
                live += zip(bulk_consumer[index].tolist(), bulk_late[index].tolist(), bulk_row[index].tolist(),
                            strict=True)
        masks = self.mask_array
        entries = sorted((consumer - item, late - delay, row >= lo, int(masks[row])) for consumer, late, row in live)
        return delay, relative_free, max(relative_free, floor), entries

    def _jump(self, lo: int, segment: _Segment, repeat: int, keys: dict[int, tuple], logs: dict[int, list]
              ) -> int | None:
        """Jump from the start of ``repeat`` to the start of ``segment.clean`` (at most ``_MAX_JUMP`` repeats on) if
        the state there equals the one a repeat before (then every repeat between does what the last one did): the
        repeat jumped to, or ``None`` (nothing changed)."""
        width, period = segment.width, segment.period
        target = min(segment.clean, repeat + _MAX_JUMP)
        skipped = target - repeat
        if skipped < 1 or repeat - 1 not in keys:
            return None
        previous, current = keys[repeat - 1], keys[repeat]
        tolerance = _ULPS * math.ulp(max(self.scale, 1e-300))
        limit = skipped * period
        old = [entry for entry in previous[3] if entry[0] < limit]
        new = [entry for entry in current[3] if entry[0] < limit]
        if abs(current[2] - previous[2]) > tolerance or len(old) != len(new):
            return None
        for (old_consumer, old_late, old_origin, old_mask), (consumer, late, origin, mask) in zip(old, new,
                                                                                                  strict=True):
            if (old_consumer != consumer or old_origin != origin or old_mask != mask
                    or abs(old_late - late) > tolerance):
                return None
        # Repeat 0's last row's item: repeat r pops the collectives due up to it + r periods.
        last_ready = int(self.ready_array[lo + width - 1])
        window_end = last_ready + (target - 1) * period  # the last item popped in the jumped repeats
        delay, before = self.delay, previous[0]
        step = delay - before  # the delay one repeat adds
        # The pending collectives: those pushed from the run (consumed within the jump, pushed again later), those
        # from before it due within the jump (replayed from the last repeat's pops, by rank), the rest (kept).
        far = segment.far.tolist()
        from_run: list[tuple[int, float, int]] = []
        before_run: list[tuple[int, float, int]] = []
        kept: list[tuple[int, float, int]] = []
        for entry in self.heap:
            if entry[2] >= lo:
                (kept if far[(entry[2] - lo) % width] else from_run).append(entry)
            else:
                (before_run if entry[0] <= window_end else kept).append(entry)
        # The bulk's: those due within the jump (``at .. cut - 1``) and after it (kept; none may be from the run).
        at = self.bulk_at
        cut = bisect.bisect_right(self.bulk_lists[0], window_end, at)
        bulk_consumer, bulk_late, bulk_row = self.bulk
        later = bulk_row[cut:]
        later = later[later >= lo]
        if len(later) and not segment.far[(later - lo) % width].all():
            return None
        # Those from before the run can delay a jumped repeat only if later than its delay, at least the delay
        # ``repeat`` repeats back (a first cut, before ``_replay_before``'s exact one).
        floor = delay - repeat * step
        due_consumer, due_late, due_row = bulk_consumer[at:cut], bulk_late[at:cut], bulk_row[at:cut]
        if len(due_row):
            ours = due_row >= lo
            if ours.any():
                for entry in zip(due_consumer[ours].tolist(), due_late[ours].tolist(), due_row[ours].tolist(),
                                 strict=True):
                    (kept if far[(entry[2] - lo) % width] else from_run).append(entry)
            maybe = np.flatnonzero(~ours & (due_late > floor))
            due_consumer, due_late, due_row = due_consumer[maybe], due_late[maybe], due_row[maybe]
        # Each pending one from the run must be consumed within the jump, and come from a repeat that the jump's
        # repeats push again once moved on by it.
        if from_run and (max(entry[0] for entry in from_run) > window_end
                         or min(entry[2] - lo for entry in from_run) // width + skipped < repeat):
            return None
        template = logs[repeat - 1]
        pops = [entry for entry in template if entry[0] != "row"]
        # The last repeat's pops of collectives from before the run that could delay (lateness above the delay
        # then), in pop order, and their credits.
        before_credits = np.asarray([entry[3] for entry in pops if entry[2] < lo and entry[1] > before])
        before_run = [entry for entry in before_run if entry[1] > floor]
        if before_run:
            due_consumer, due_late, due_row = (
                np.concatenate((due_consumer, [entry[0] for entry in before_run])).astype(np.int64),
                np.concatenate((due_late, [entry[1] for entry in before_run])),
                np.concatenate((due_row, [entry[2] for entry in before_run])).astype(np.int64))
        replay = self._replay_before(due_consumer, due_late, due_row, lo, segment, repeat, target, step,
                                     len(before_credits))
        if replay is None:
            return None
        # Credits of the run's own pops, moved to each jumped repeat.
        run_pops = [entry for entry in pops if entry[2] >= lo and entry[3]]
        if run_pops:  # repeat ``repeat - 1 + k`` credits the rows ``k`` repeats on, for ``k`` from 1
            credit_rows = [entry[2] for entry in run_pops]
            index = np.asarray(credit_rows)[None, :] + np.arange(width, (skipped + 1) * width, width)[:, None]
            credits = np.asarray([entry[3] for entry in run_pops])
            if len({(row - lo) % width for row in credit_rows}) == len(credit_rows):  # no row twice
                self.credited[index] += credits
            else:
                np.add.at(self.credited, index.ravel(), np.tile(credits, skipped))
        replay_rows, replay_rank = replay
        if len(replay_rows):
            np.add.at(self.credited, replay_rows, before_credits[replay_rank])
        # The state at the target repeat: the run's pending collectives moved on, the others kept, and the rows
        # consumed after the stretch pushed when late, from the last repeat's stream times.
        moved = skipped * step
        self.delay = delay + moved
        self.heap = kept + [(consumer + skipped * period, late + moved, row + skipped * width)
                            for consumer, late, row in from_run]
        heapq.heapify(self.heap)
        self.drop_bulk(cut)
        if segment.far_due:
            self._push_far(lo, segment, repeat, target, template, before, delay, step)
        self.comm_free = float(self.starts[segment.first - 1 + target * period]) + self.delay + current[1]
        return target

    def _push_far(self, lo: int, segment: _Segment, repeat: int, target: int, template: list, before: float,
                  delay: float, step: float) -> None:
        """Push the jumped repeats' rows consumed after the stretch that are late by more than the compute stream's
        delay after the jump (``self.delay``; the others could raise it no more), their stream times the last
        repeat's (``template``, that began with the delay ``before``) moved on by whole repeats (``delay`` at the
        start of ``repeat``, ``step`` more per repeat)."""
        width, period = segment.width, segment.period
        frees = [entry[1] for entry in template if entry[0] == "row"]
        base = float(self.starts[segment.first + (repeat - 1) * period - 1]) + before
        last_begins = float(self.starts[segment.first - 1 + (target - 1) * period]) + (
            delay + (target - 1 - repeat) * step)
        columns, offsets = [], []
        for column, due in zip(np.flatnonzero(segment.far).tolist(), segment.far_due, strict=True):
            offset = frees[column] - base
            # None of a column is late enough if its last jumped row, needed at its earliest consumer, is not: each
            # jumped repeat begins no later (item times of no less than zero; rounding is monotone, so the bound
            # holds for the sums below as well).
            earliest = float(self.starts[min(due - 1, len(self.starts) - 1)])
            if not self.forward or last_begins + offset - earliest > self.delay:
                columns.append(column)
                offsets.append(offset)
        if not columns:
            return
        jumped = np.arange(repeat, target, dtype=np.int64)
        row_index = (lo + jumped[:, None] * width + np.asarray(columns)[None, :]).ravel()
        begins = self.starts[segment.first - 1 + jumped * period] + (delay + (jumped - repeat) * step)
        late = (begins[:, None] + np.asarray(offsets)[None, :]).ravel() - self.needed_array[row_index]
        pushed = np.flatnonzero(late > self.delay)
        if len(pushed):
            self.add_bulk(self.consumer_array[row_index[pushed]], late[pushed], row_index[pushed], self.delay)

    def _replay_before(self, consumer: np.ndarray, late: np.ndarray, row: np.ndarray, lo: int, segment: _Segment,
                       repeat: int, target: int, step: float, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The collectives from before the run due within the jump: per jumped repeat those that could delay it
        (lateness above its delay then), ranked in pop order: ``(rows, rank)``, each to take the credit of the last
        repeat's pop of that rank; ``None`` unless every jumped repeat has ``count`` of them."""
        skipped = target - repeat
        if not len(consumer):
            return None if count else (row, row)
        last_ready = int(self.ready_array[lo + segment.width - 1])
        which = np.maximum(-((last_ready - consumer) // segment.period), 0) - repeat  # the jumped repeat popping it
        live = late > self.delay + which * step
        late, row, which, consumer = late[live], row[live], which[live], consumer[live]
        if len(which) != count * skipped or (len(which) and (which.min() < 0 or which.max() >= skipped)):
            return None
        order = np.lexsort((row, late, consumer, which))
        if count and not np.array_equal(np.bincount(which, minlength=skipped), np.full(skipped, count)):
            return None
        return row[order], np.tile(np.arange(count), skipped)


def _tries(clean: int) -> set[int]:
    """The repeats at whose start a run's state is compared with the one before: the first few after the first
    (which rarely repeats the state it starts from), then around powers of two (each comparison costs a pass over
    the pending collectives)."""
    tries = set(range(1, min(clean, 6)))
    power = 8
    while power < clean:
        tries |= {power - 1, power}
        power *= 2
    return tries


def merged_rows(consumer: np.ndarray, ready: np.ndarray, duration: np.ndarray, axes_mask: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The collectives as the stream takes them (``toast.cost.schedule.makespan``): in ready order, then consumer
    order, those with one ready item, one consumer and one axis set merged into one row (they run back to back:
    the stream starts the first at the same time either way, and the consumer waits for the last).

    Returns ``(rows, consumer, ready, duration, axes_mask)`` per merged row, ``rows`` the collective each is
    reported as, ``duration`` the members' seconds summed."""
    # One stable sort of the three packed into an int64 where each fits in ``_KEY_BITS`` bits (lexsort's three
    # passes cost more); the same order.
    shifted_ready, shifted_consumer = ready + 1, consumer + 1
    if (ready.dtype == consumer.dtype == axes_mask.dtype == np.int64
            and int(np.bitwise_or.reduce(shifted_ready | shifted_consumer | axes_mask)) >> _KEY_BITS == 0):
        key = shifted_ready << 2 * _KEY_BITS
        key |= shifted_consumer << _KEY_BITS
        key |= axes_mask
        order = np.argsort(key, kind="stable")
        key = key[order]
        opens = np.empty(len(key), dtype=bool)  # a row opening a group of equal keys
        opens[:1] = True
        np.not_equal(key[1:], key[:-1], out=opens[1:])
        first = np.flatnonzero(opens)
    else:
        order = np.lexsort((axes_mask, consumer, ready))
        sorted_consumer, sorted_ready, sorted_masks = consumer[order], ready[order], axes_mask[order]
        first = np.flatnonzero(np.concatenate(([True], (sorted_consumer[1:] != sorted_consumer[:-1])
                                               | (sorted_ready[1:] != sorted_ready[:-1])
                                               | (sorted_masks[1:] != sorted_masks[:-1]))))
    duration = duration[order]
    if len(first) < len(duration):
        duration = np.add.reduceat(duration, first)
        order = order[first]
    return order, consumer[order], ready[order], duration, axes_mask[order]
