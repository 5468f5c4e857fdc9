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
that its own state does, and otherwise scans row by row, as ``toast.cost.schedule.makespan`` does. What is equal: the
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
from dataclasses import dataclass

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
    """

    starts: np.ndarray
    periods: np.ndarray
    repeats: np.ndarray

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
# Pops of at most this many collectives of the sorted arrays are done in Python (numpy's calls cost more).
_FEW_POPS = 16
# An item after every other (no collective pending).
_NEVER = 1 << 62


def jumps_pay(ready: np.ndarray, runs: ItemRuns) -> bool:
    """Whether some run holds enough of the collectives ready at items ``ready`` for ``periodic_makespan`` to pay
    (below that, checking the runs costs more than scanning them)."""
    return any(np.count_nonzero((ready >= start) & (ready < start + period * repeats)) >= _MIN_RUN_ROWS
               for start, period, repeats in zip(runs.starts.tolist(), runs.periods.tolist(), runs.repeats.tolist(),
                                                 strict=True))


def periodic_makespan(item_time: np.ndarray, consumer: np.ndarray, ready: np.ndarray, duration: np.ndarray,
                      axes_mask: np.ndarray, runs: ItemRuns) -> tuple[float, np.ndarray]:
    """``toast.cost.schedule.makespan`` (same arguments and results), jumping over the repeats of ``runs`` once the
    streams' state repeats (the module docstring says what is equal)."""
    starts = np.concatenate(([0.0], np.cumsum(item_time)))
    total = float(starts[-1])
    exposed = np.zeros(len(duration))
    if not len(duration):
        return total, exposed
    rows, consumer, ready, duration, masks = merged_rows(consumer, ready, duration, axes_mask)
    consumer, ready = consumer + 1, ready + 1
    made_at = starts[ready]
    needed_at = np.where(ready < consumer, starts[np.minimum(consumer - 1, len(item_time))], np.inf)
    scan = _Streams(starts, consumer, ready, made_at, needed_at, duration, masks)
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
    it (so that their due times repeat too)."""

    first: int
    period: int
    repeats: int
    width: int
    far: np.ndarray
    clean: int


def _segments(scan: _Streams, item_time: np.ndarray, runs: ItemRuns) -> list[tuple[int, int, _Segment]]:
    """The stretches of runs whose rows and item times repeat in this state: ``(first row, end row, segment)``, in
    row order. A run's first or last repeats may differ (the first layer reads the embedding): the stretch is the
    longest one around the run's middle repeat where every repeat equals it."""
    found = []
    ready_array = scan.ready_array
    for start, period, repeats in zip(runs.starts.tolist(), runs.periods.tolist(), runs.repeats.tolist(),
                                      strict=True):
        bounds = np.searchsorted(ready_array, start + 1 + period * np.arange(repeats + 1))
        if bounds[-1] - bounds[0] < min(_MIN_SEGMENT_ROWS, _MIN_RUN_ROWS):
            continue
        counts = np.diff(bounds)
        middle = repeats // 2
        width = int(counts[middle])
        times = item_time[start:start + period * repeats].reshape(repeats, period)
        index = np.minimum(bounds[:-1, None] + np.arange(width), len(ready_array) - 1)
        fields = scan.fields[index]  # [repeats, width, 3]: ready, duration's bits, axes
        fields[:, :, 0] -= (np.arange(repeats, dtype=np.int64) - middle)[:, None] * period
        alike = ((counts == width) & np.all(times == times[middle], axis=1)
                 & np.all(fields == fields[middle], axis=(1, 2)))
        first, last = _stretch_around(alike, middle)
        if last - first < 3:  # a jump compares two repeats and skips at least one
            continue
        lo, hi = int(bounds[first]), int(bounds[last])
        end = start + 1 + last * period  # items counted from 1, as the scan counts them
        count = last - first
        consumer = scan.consumer_array[lo:hi].reshape(count, width)
        periodic = np.all(consumer - (np.arange(count, dtype=np.int64) * period)[:, None] == consumer[0], axis=0)
        far = np.all(consumer >= end, axis=0) & ~periodic
        if not np.all(periodic | far):
            continue
        # Repeats whose periodic consumers lie at most one item past the stretch: their due times repeat.
        latest = consumer[:, periodic].max(axis=1) if periodic.any() else np.zeros(count, dtype=np.int64)
        clean = int(np.searchsorted(latest > end, True))
        found.append((lo, hi, _Segment(start + 1 + first * period, period, count, width, far, clean)))
    return found


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
    lateness, row)`` for those pushed one by one and sorted arrays for those pushed by numpy (``bulk``); both are
    popped in ``(consumer, lateness, row)`` order, as ``makespan``'s heap pops them."""

    def __init__(self, starts: np.ndarray, consumer: np.ndarray, ready: np.ndarray, made_at: np.ndarray,
                 needed_at: np.ndarray, duration: np.ndarray, masks: np.ndarray):
        self.starts = starts
        self.ready_array, self.consumer_array, self.duration_array, self.mask_array = ready, consumer, duration, masks
        self.needed_array, self.made_array = needed_at, made_at
        self.fields = np.stack((ready, duration.view(np.int64), masks), axis=1)
        self.delay = 0.0
        self.comm_free = 0.0
        self.heap: list[tuple[int, float, int]] = []
        self.bulk = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
        self.bulk_first = _NEVER
        self.added = [0.0] * len(duration)
        self.credited = np.zeros(len(duration))  # delays credited by numpy (pops in bulk, jumps)
        self.scale = float(starts[-1] + duration.sum())
        # The same-ready stretches long enough for numpy: where each starts and ends.
        bounds = np.concatenate(([0], np.flatnonzero(ready[1:] != ready[:-1]) + 1, [len(ready)]))
        long = np.flatnonzero(np.diff(bounds) >= _VECTOR_ROWS)
        self.long_starts, self.long_ends = bounds[long].tolist(), bounds[long + 1].tolist()

    # Pending collectives.

    def add_bulk(self, consumer: np.ndarray, late: np.ndarray, row: np.ndarray) -> None:
        """Push late collectives given as arrays."""
        if not len(consumer):
            return
        old_consumer, old_late, old_row = self.bulk
        if len(old_consumer):
            consumer, late, row = (np.concatenate((old_consumer, consumer)), np.concatenate((old_late, late)),
                                   np.concatenate((old_row, row)))
        order = np.lexsort((row, late, consumer))
        self.bulk = (consumer[order], late[order], row[order])
        self.bulk_first = int(self.bulk[0][0])

    def pop(self, ready: int, log: list | None = None) -> None:
        """Pop the collectives due at or before item ``ready``: the delay grows to the largest lateness, each
        credited with what it adds; ``log`` collects ``(consumer, lateness, row, credit)`` per pop."""
        heap = self.heap
        popped = []
        while heap and heap[0][0] <= ready:
            popped.append(heapq.heappop(heap))
        if self.bulk_first <= ready:
            bulk_consumer, bulk_late, bulk_row = self.bulk
            cut = int(np.searchsorted(bulk_consumer, ready, side="right"))
            consumer, late, row = bulk_consumer[:cut], bulk_late[:cut], bulk_row[:cut]
            self.bulk = (bulk_consumer[cut:], bulk_late[cut:], bulk_row[cut:])
            self.bulk_first = int(bulk_consumer[cut]) if cut < len(bulk_consumer) else _NEVER
            if cut + len(popped) <= _FEW_POPS:  # merged in Python, in the heap's order
                popped = sorted(popped + list(zip(consumer.tolist(), late.tolist(), row.tolist(), strict=True)))
            else:
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
        added, delay = self.added, self.delay
        for consumer_item, late_value, late_row in popped:
            credit = late_value - delay if late_value > delay else 0.0
            if credit:
                added[late_row] += credit
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
                self.step(row, long)
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
        self.add_bulk(self.consumer_array[begin:end][late], ends[late] - needed[late], late + begin)

    def step(self, begin: int, end: int, log: list | None = None) -> None:
        """Rows ``begin .. end - 1`` one by one (``makespan``'s loop); ``log`` collects each pop ``(consumer,
        lateness, row, credit)`` and the stream's free time after each row, ``("row", free)``."""
        heap, added = self.heap, self.added
        delay, comm_free = self.delay, self.comm_free
        rows = slice(begin, end)
        consumer, ready, made = (self.consumer_array[rows].tolist(), self.ready_array[rows].tolist(),
                                 self.made_array[rows].tolist())
        needed, duration = self.needed_array[rows].tolist(), self.duration_array[rows].tolist()
        for index, row_ready, row_made, row_needed, seconds, row_consumer in zip(
                range(begin, end), ready, made, needed, duration, consumer, strict=True):
            if self.bulk_first <= row_ready or (log is not None and heap and heap[0][0] <= row_ready):
                self.delay = delay
                self.pop(row_ready, log)
                delay = self.delay
            else:
                while heap and heap[0][0] <= row_ready:
                    _, late, late_row = heapq.heappop(heap)
                    if late > delay:
                        added[late_row] += late - delay
                        delay = late
            ready_time = row_made + delay
            if ready_time > comm_free:
                comm_free = ready_time
            comm_free += seconds
            if comm_free > row_needed:
                heapq.heappush(heap, (row_consumer, comm_free - row_needed, index))
            if log is not None:
                log.append(("row", comm_free))
        self.delay, self.comm_free = delay, comm_free

    def finish(self) -> tuple[np.ndarray, float, float]:
        """The waits of the collectives still pending at the end: ``(delay per row, delay, free)``."""
        self.pop(_NEVER)
        return np.asarray(self.added) + self.credited, self.delay, self.comm_free

    # The jump over a run's repeats.

    def run(self, lo: int, segment: _Segment) -> None:
        """A run's rows (from row ``lo``): scanned repeat by repeat until the state at a repeat's start equals the
        one a repeat before (shifted by a period, the delay by what that repeat added), then jumped to the last
        clean repeat; the rest scanned."""
        width, repeats = segment.width, segment.repeats
        keys: dict[int, tuple] = {}
        logs: dict[int, list] = {}
        tries = _tries(segment.clean)
        repeat = 0
        while repeat < repeats:
            if repeat in tries:
                keys[repeat] = self._key(lo, segment, repeat)
                target = self._jump(lo, segment, repeat, keys, logs) if repeat - 1 in logs else None
                if target is not None:
                    # A long run is jumped in parts, each checked again by a repeat scanned after it.
                    tries |= {target, target + 1}
                    repeat = target
                    continue
            log: list | None = [] if repeat + 1 in tries else None
            self.step(lo + repeat * width, lo + (repeat + 1) * width, log)
            if log is not None:
                logs[repeat] = log
            repeat += 1

    def _pending(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every pending collective, ``(consumer, lateness, row)`` arrays in no order."""
        heap, (consumer, late, row) = self.heap, self.bulk
        if not heap:
            return consumer, late, row
        return (np.concatenate((consumer, [entry[0] for entry in heap])).astype(np.int64),
                np.concatenate((late, [entry[1] for entry in heap])),
                np.concatenate((row, [entry[2] for entry in heap])).astype(np.int64))

    def _key(self, lo: int, segment: _Segment, repeat: int) -> tuple:
        """The state at the start of ``repeat`` relative to it: ``(delay, free - start - delay, that at least the
        first row's ready time, entries)``; entries ``(consumer - the repeat's first item, lateness - delay, from the
        run, axes)`` of the pending collectives that can still delay the compute stream (lateness above the delay)
        and are due inside the run, sorted (four arrays)."""
        item = segment.first + repeat * segment.period
        begins = float(self.starts[item - 1])
        delay = self.delay
        relative_free = self.comm_free - begins - delay
        floor = float(self.made_array[lo + repeat * segment.width]) - begins
        consumer, late, row = self._pending()
        live = (late > delay) & (consumer < segment.first + segment.repeats * segment.period)
        consumer, late, row = consumer[live] - item, late[live] - delay, row[live]
        origin, masks = row >= lo, self.mask_array[row]
        order = np.lexsort((masks, origin, late, consumer))
        return delay, relative_free, max(relative_free, floor), (consumer[order], late[order], origin[order],
                                                                 masks[order])

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
        old = [column[previous[3][0] < limit] for column in previous[3]]
        new = [column[current[3][0] < limit] for column in current[3]]
        if (abs(current[2] - previous[2]) > tolerance or len(old[0]) != len(new[0])
                or not (np.array_equal(old[0], new[0]) and np.array_equal(old[2], new[2])
                        and np.array_equal(old[3], new[3]))
                or (len(old[1]) and float(np.max(np.abs(old[1] - new[1]))) > tolerance)):
            return None
        # Repeat 0's last row's item: repeat r pops the collectives due up to it + r periods.
        last_ready = int(self.ready_array[lo + width - 1])
        window_end = last_ready + (target - 1) * period  # the last item popped in the jumped repeats
        delay, before = self.delay, previous[0]
        step = delay - before  # the delay one repeat adds
        # The pending collectives: those pushed from the run (consumed within the jump, pushed again later), those
        # from before it due within the jump (replayed from the last repeat's pops, by rank), the rest (kept).
        consumer, late, row = self._pending()
        from_run = (row >= lo) & ~segment.far[np.maximum(row - lo, 0) % width]
        before_run = (row < lo) & (consumer <= window_end)
        kept = ~from_run & ~before_run
        # Each pending one from the run must be consumed within the jump, and come from a repeat that the jump's
        # repeats push again once moved on by it.
        if from_run.any() and (consumer[from_run].max() > window_end
                               or ((row[from_run] - lo) // width).min() + skipped < repeat):
            return None
        template = logs[repeat - 1]
        pops = [entry for entry in template if entry[0] != "row"]
        # The last repeat's pops of collectives from before the run that could delay (lateness above the delay
        # then), in pop order, and their credits.
        before_credits = np.asarray([entry[3] for entry in pops if entry[2] < lo and entry[1] > before])
        replay = self._replay_before(consumer[before_run], late[before_run], row[before_run], lo, segment, repeat,
                                     target, step, len(before_credits))
        if replay is None:
            return None
        # Credits of the run's own pops, moved to each jumped repeat.
        run_pops = [entry for entry in pops if entry[2] >= lo and entry[3]]
        if run_pops:
            credit_rows = np.asarray([entry[2] for entry in run_pops], dtype=np.int64)
            shifts = (np.arange(repeat, target, dtype=np.int64) - (repeat - 1)) * width
            np.add.at(self.credited, (credit_rows[None, :] + shifts[:, None]).ravel(),
                      np.tile([entry[3] for entry in run_pops], skipped))
        replay_rows, replay_rank = replay
        if len(replay_rows):
            np.add.at(self.credited, replay_rows, before_credits[replay_rank])
        # The rows consumed after the stretch: pushed when late, from the last repeat's stream times.
        far = np.flatnonzero(segment.far)
        far_consumer, far_late, far_row = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
        if len(far):
            frees = np.asarray([entry[1] for entry in template if entry[0] == "row"])
            base = float(self.starts[segment.first + (repeat - 1) * period - 1]) + before
            jumped = np.arange(repeat, target, dtype=np.int64)
            row_index = (lo + jumped[:, None] * width + far[None, :]).ravel()
            begins = self.starts[segment.first - 1 + jumped * period] + (delay + (jumped - repeat) * step)
            ends = (begins[:, None] + (frees[far] - base)[None, :]).ravel()
            pushed = np.flatnonzero(ends > self.needed_array[row_index])
            far_row = row_index[pushed]
            far_consumer, far_late = self.consumer_array[far_row], ends[pushed] - self.needed_array[far_row]
        # The state at the target repeat: the run's pending collectives moved on, the others kept.
        moved = skipped * step
        self.heap = list(zip((consumer[from_run] + skipped * period).tolist(), (late[from_run] + moved).tolist(),
                             (row[from_run] + skipped * width).tolist(), strict=True))
        heapq.heapify(self.heap)
        self.bulk = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
        self.bulk_first = _NEVER
        self.add_bulk(np.concatenate((consumer[kept], far_consumer)), np.concatenate((late[kept], far_late)),
                      np.concatenate((row[kept], far_row)))
        self.delay = delay + moved
        self.comm_free = float(self.starts[segment.first - 1 + target * period]) + self.delay + current[1]
        return target

    def _replay_before(self, consumer: np.ndarray, late: np.ndarray, row: np.ndarray, lo: int, segment: _Segment,
                       repeat: int, target: int, step: float, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The collectives from before the run due within the jump: per jumped repeat those that could delay it
        (lateness above its delay then), ranked in pop order: ``(rows, rank)``, each to take the credit of the last
        repeat's pop of that rank; ``None`` unless every jumped repeat has ``count`` of them."""
        skipped = target - repeat
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
    order = np.lexsort((axes_mask, consumer, ready))
    consumer, ready, duration, masks = consumer[order], ready[order], duration[order], axes_mask[order]
    first = np.flatnonzero(np.concatenate(([True], (consumer[1:] != consumer[:-1]) | (ready[1:] != ready[:-1])
                                           | (masks[1:] != masks[:-1]))))
    if len(first) < len(duration):
        consumer, ready, duration, masks = (consumer[first], ready[first], np.add.reduceat(duration, first),
                                            masks[first])
    return order[first], consumer, ready, duration, masks
