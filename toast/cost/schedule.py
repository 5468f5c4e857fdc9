"""Scheduling one state's kernels and collectives on a ``CostPlan`` (pure functions): the compute stream runs the
kernels in program order, a communication stream the collectives (combined as XLA's combiners combine them), the
host link the copies between device and host memory; the step is their makespan (``toast.cost.model`` has the
model).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from toast.cost.collectives import ALL_TO_ALL, COLLECTIVE_PERMUTE, KINDS
from toast.cost.plan import MASKS, CostPlan
from toast.cost.pricing import collective_durations
from toast.cost.repeats import jumps_pay, merged_rows, periodic_makespan


def sequential_sum(values: np.ndarray) -> float:
    """The sum of ``float64[n]`` added left to right (as a Python loop adds; ``np.sum`` pairs terms)."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


def stream(plan: CostPlan, item_time: np.ndarray, kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray,
           ready: np.ndarray, consumer: np.ndarray, group: np.ndarray | None,
           ) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray]:
    """One run of the items with the collectives on the communication stream after combining:
    ``(makespan, compute busy seconds, axes masks, durations, exposed seconds)`` (per combined collective;
    the step overhead not included). Without overlap the collectives run on the compute stream. ``group``:
    the rows' ``combine_groups``."""
    kind, masks, sizes, ready, consumer = combine(kind, axes_mask, nbytes, ready, consumer, group)
    durations = collective_durations(plan.collectives, kind, masks, sizes)
    busy = float(item_time.sum())
    if not plan.overlap:
        return busy + sequential_sum(durations), busy, masks, durations, durations
    if plan.reuse and jumps_pay(ready, plan.schedule.runs):  # the same, jumping over repeated layers
        span, late = periodic_makespan(item_time, consumer, ready, durations, masks, plan.schedule.runs)
    else:
        span, late = makespan(item_time, consumer, ready, durations, masks)
    return span, busy, masks, durations, late


def makespan(item_time: np.ndarray, consumer: np.ndarray, ready: np.ndarray, duration: np.ndarray,
             axes_mask: np.ndarray) -> tuple[float, np.ndarray]:
    """Both streams' makespan: items back to back on the compute stream, each collective on the
    communication stream from max(its operand ready, stream free), its consumer waiting for it.

    Args:
      item_time: ``float64[items]``, seconds of each top-level item on the compute stream.
      consumer: ``int64[collectives]``, the item that needs each collective's result.
      ready: ``int64[collectives]``, the item after which its operand is ready (-1: at the start).
      duration: ``float64[collectives]``, seconds.
      axes_mask: ``int64[collectives]``, each one's mesh axes.

    Returns:
      ``(seconds, exposed)``: the makespan, and ``float64[collectives]``, the part of the step each
      collective adds (the waits it causes, and for the last, the stream running past the compute). The
      stream takes collectives in ready order, then consumer order (XLA's latency-hiding scheduler starts
      each as soon as its operand is ready, and the stream runs them in the order they start); a wait of
      the compute stream for a collective delays every item from its consumer on, and so the operands
      made there.
    """
    starts = np.concatenate(([0.0], np.cumsum(item_time)))
    total = float(starts[-1])
    exposed = np.zeros(len(duration))
    if not len(duration):
        return total, exposed
    # Collectives with one ready item, one consumer and one axis set run back to back as one row.
    rows, consumer, ready, duration, _ = merged_rows(consumer, ready, duration, axes_mask)
    # Items counted from 1 (0: before the first item, when arguments are ready).
    consumer, ready = consumer + 1, ready + 1
    made_at = starts[ready]  # before any wait of the compute stream
    # When the consumer starts without waits; never waits (inf) if it makes the operand too (a loop).
    needed_at = np.where(ready < consumer, starts[np.minimum(consumer - 1, len(item_time))], np.inf)
    # The compute stream's delay at an item is the largest lateness of the collectives consumed at or
    # before it (waits shift one timeline, so they do not add up): known here once their consumer is at or
    # before the ready item of the collective at hand.
    pending: list[tuple[int, float, int]] = []  # (consumer, lateness, row) of collectives consumed ahead
    delay = 0.0
    comm_free = 0.0
    added = [0.0] * len(rows)
    for index, (row_ready, row_consumer, ready_time, needed, seconds) in enumerate(zip(
            ready.tolist(), consumer.tolist(), made_at.tolist(), needed_at.tolist(), duration.tolist(),
            strict=True)):
        while pending and pending[0][0] <= row_ready:
            _, late, late_row = heapq.heappop(pending)
            if late > delay:
                added[late_row] += late - delay
                delay = late
        ready_time += delay
        if ready_time > comm_free:
            comm_free = ready_time
        comm_free += seconds
        if comm_free > needed:
            heapq.heappush(pending, (row_consumer, comm_free - needed, index))
    for _, late, late_row in sorted(pending):
        if late > delay:
            added[late_row] += late - delay
            delay = late
    if comm_free > total + delay:  # the stream runs on after the last item
        added[-1] += comm_free - (total + delay)
    exposed[rows] = added
    return max(total + delay, comm_free), exposed


def combine(kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray, ready: np.ndarray,
            consumer: np.ndarray, group: np.ndarray | None,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The collectives as XLA's combiners leave them, ``group`` being their ``combine_groups``: a group is one
    collective of the summed size, ready with its last member and due at its first consumer.

    Returns ``(kind, axes_mask, nbytes, ready, consumer)`` of the collectives after combining."""
    if group is None:
        return kind, axes_mask, nbytes, ready, consumer
    count = int(group.max()) + 1
    first = np.full(count, len(group), dtype=np.int64)
    np.minimum.at(first, group, np.arange(len(group)))
    combined_ready = np.full(count, -2, dtype=np.int64)
    np.maximum.at(combined_ready, group, ready)
    combined_due = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(combined_due, group, consumer)
    return (kind[first], axes_mask[first], np.bincount(group, weights=nbytes, minlength=count), combined_ready,
            combined_due)


def combine_groups(threshold: float, kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray, ready: np.ndarray,
                   consumer: np.ndarray) -> np.ndarray | None:
    """``int64[rows]``: the group of each collective as XLA's all-reduce, all-gather and reduce-scatter
    combiners combine them: of one kind over one axis set, taken in the order their operands are ready, each
    joins the one before while neither depends on the other (it is ready before the group's first consumer)
    and the group stays within ``threshold`` bytes (the profile's ``combine_threshold``). All-to-alls and
    collective-permutes stay alone. None when no two combine."""
    if len(kind) < 2 or threshold <= 0:
        return None
    order = np.lexsort((consumer, ready, axes_mask, kind))
    group = np.empty(len(order), dtype=np.int64)
    current, group_kind, group_mask, group_bytes, group_due = -1, -1, -1, 0.0, 0
    combinable = (kind != ALL_TO_ALL) & (kind != COLLECTIVE_PERMUTE)
    for row, row_kind, row_mask, row_bytes, row_ready, row_due, can in zip(
            order.tolist(), kind[order].tolist(), axes_mask[order].tolist(), nbytes[order].tolist(),
            ready[order].tolist(), consumer[order].tolist(), combinable[order].tolist(), strict=True):
        if (can and row_kind == group_kind and row_mask == group_mask and row_ready < group_due
                and group_bytes + row_bytes <= threshold):
            group_bytes += row_bytes
            if row_due < group_due:
                group_due = row_due
        else:
            current += 1
            group_kind, group_mask, group_bytes, group_due = (row_kind, row_mask, row_bytes, row_due) if can \
                else (-1, -1, 0.0, 0)
        group[row] = current
    return None if current + 1 == len(order) else group


# Fewer collectives than this are grouped by ``combine_groups``'s scan alone.
_SCAN_ALL = 256


def combine_groups_fast(threshold: float, kind: np.ndarray, axes_mask: np.ndarray, nbytes: np.ndarray,
                        ready: np.ndarray, consumer: np.ndarray) -> np.ndarray | None:
    """``combine_groups``, the same groups, scanning only the collectives that may join the group before: in
    their order, a collective starts a group whenever it cannot join the previous one's whatever that group holds
    (a different kind or axes, either not combinable, ready at or after the previous one's consumer, or the two
    together over ``threshold``), found with numpy; the others are scanned as ``combine_groups`` scans them. Most
    collectives of a layered program start a group of their own, so the scan is short."""
    if len(kind) < max(_SCAN_ALL, 2):  # numpy's calls cost more than the scan saves
        return combine_groups(threshold, kind, axes_mask, nbytes, ready, consumer)
    if threshold <= 0:
        return None
    order, kind_and_axes = _combine_order(kind, axes_mask, ready, consumer)
    nbytes, ready, consumer = nbytes.take(order), ready.take(order), consumer.take(order)
    # The group before holds the previous collective: its consumer bounds the group's, its bytes the group's. (Of
    # one kind, both are combinable or neither.)
    starts = np.empty(len(order), dtype=bool)
    starts[:1] = True
    starts[1:] = ((kind_and_axes[1:] != kind_and_axes[:-1]) | _ALONE.take(kind.take(order[1:]))
                  | (ready[1:] >= consumer[:-1]) | (nbytes[1:] + nbytes[:-1] > threshold))
    # The others, in order: each joins the group the one before is in, or starts one. One right after a collective
    # that starts a group for certain joins it (the two fit, as found above); the ones after it are scanned (a group
    # of that pair is the one they may join first).
    maybe = (~starts).nonzero()[0]
    deeper = maybe[~starts.take(maybe - 1)]
    after_pair = starts.take(deeper - 2).tolist()
    group_bytes, group_due = 0.0, 0
    for index, row_bytes, row_ready, row_due, pair, first_bytes, first_due, second_bytes, second_due in zip(
            deeper.tolist(), nbytes[deeper].tolist(), ready[deeper].tolist(), consumer[deeper].tolist(), after_pair,
            nbytes[deeper - 2].tolist(), consumer[deeper - 2].tolist(), nbytes[deeper - 1].tolist(),
            consumer[deeper - 1].tolist(), strict=True):
        if pair:
            group_bytes, group_due = first_bytes + second_bytes, min(first_due, second_due)
        if row_ready < group_due and group_bytes + row_bytes <= threshold:
            group_bytes += row_bytes
            if row_due < group_due:
                group_due = row_due
        else:
            starts[index] = True
            group_bytes, group_due = row_bytes, row_due
    if np.count_nonzero(starts) == len(starts):
        return None
    group = np.empty(len(order), dtype=np.int64)
    group[order] = starts.cumsum() - 1
    return group


# Kinds whose collectives stay alone (the combiners join all-reduces, all-gathers and reduce-scatters).
_ALONE = np.isin(np.arange(len(KINDS)), (ALL_TO_ALL, COLLECTIVE_PERMUTE))


def _combine_order(kind: np.ndarray, axes_mask: np.ndarray, ready: np.ndarray, consumer: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(np.lexsort((consumer, ready, axes_mask, kind)), kind * MASKS + axes_mask in that order)``: one sort of the
    four packed with the row number into an ``int64`` (kinds are codes of ``KINDS``, masks below ``MASKS``) where the
    items' range fits, else ``np.lexsort``."""
    count = len(kind)
    low = min(int(ready.min()), int(consumer.min()))
    item_bits = (max(int(ready.max()), int(consumer.max())) - low).bit_length()
    row_bits = max(count - 1, 0).bit_length()
    kind_and_axes = kind * MASKS + axes_mask
    if 11 + 2 * item_bits + row_bits > 62:
        order = np.lexsort((consumer, ready, axes_mask, kind))
        return order, kind_and_axes.take(order)
    key = (((kind_and_axes << item_bits | (ready - low)) << item_bits | (consumer - low)) << row_bits
           | np.arange(count))
    key.sort()  # distinct keys: the order is the stable one
    return key & ((1 << row_bits) - 1), key >> (2 * item_bits + row_bits)


def by_label(axes_mask: np.ndarray, seconds: np.ndarray, labels: Sequence[str]) -> dict[str, float]:
    """Seconds per label of the axes masks (``labels[mask]``: an axis set ``"batch+model"`` or the levels
    ``"nvlink+infiniband"``), in order of first appearance, each sum taken in row order. ``axes_mask``:
    ``int64[collectives]``; ``seconds``: ``float64[collectives]``."""
    return by_labels(axes_mask, [seconds], [labels])[0]


def by_labels(axes_mask: np.ndarray, seconds: Sequence[np.ndarray], labels: Sequence[Sequence[str]]
              ) -> list[dict[str, float]]:
    """``by_label(axes_mask, seconds[i], labels[i])`` for each ``i``, the masks' order found once and an array of
    seconds given twice (the same object) summed once."""
    if not len(axes_mask):
        return [{} for _ in labels]
    present = np.flatnonzero(np.bincount(axes_mask, minlength=256)).tolist()  # a few axis sets
    if len(present) > 1:
        present.sort(key=lambda mask: int(np.argmax(axes_mask == mask)))  # by first row
    sums_of: dict[int, list[float]] = {}
    found = []
    for column, names in zip(seconds, labels, strict=True):
        sums = sums_of.get(id(column))
        if sums is None:
            sums = sums_of[id(column)] = np.bincount(axes_mask, weights=column, minlength=256).tolist()  # row order
        sums_by_label: dict[str, float] = {}
        for mask in present:
            sums_by_label[names[mask]] = sums_by_label.get(names[mask], 0.0) + sums[mask]
        found.append(sums_by_label)
    return found


def host_transfers(plan: CostPlan, seconds: np.ndarray, item_time: np.ndarray, value_bytes: np.ndarray
                   ) -> tuple[float, float]:
    """``(exposed, hidden)``: the seconds of one step the copies between device and host memory
    (``KernelPlan.transfers``) add to the step where it waits for them, and the rest of their time.

    Each copy moves its value's local bytes at the profile's ``host_bandwidth`` x ``host_efficiency``, once per
    run of its loop body, as an async copy on the host link, one stream per direction (PCIe is full duplex),
    each taking copies in the order they become ready. A copy to the host starts once its value is made and only
    the step's end waits for it. A copy back starts where the program reaches it (after the kernel before it: a
    remat fetch follows the optimization barrier that waits for the backward pass; XLA's scheduler hoists it no
    further) once its data is on the host (the copies to the host of that data done), overlaps the kernels up to
    its first reader, and that kernel waits for it, delaying the compute stream from there on. In a loop body
    the copies run iteration by iteration, placed by the body's kernel times. The compute stream's timeline here
    is its kernels' (``item_time``) without the waits for collectives: the two waits add. ``overlap=False`` runs
    the copies on the compute stream.

    Args:
      plan: the cost plan.
      seconds: ``float64[kernels]``, each kernel's seconds per launch.
      item_time: ``float64[items]``, each top-level item's seconds on the compute stream.
      value_bytes: ``int64[values]``, each value's bytes on one device.
    """
    exposed, busy = _host_link(plan, seconds, item_time, value_bytes) if plan.kernel_plan.transfers else (0.0, 0.0)
    runs = float(plan.microbatches)  # every micro-batch offloads and fetches its own activations
    return exposed * runs, (busy - exposed) * runs


def _host_link(plan: CostPlan, seconds: np.ndarray, item_time: np.ndarray, value_bytes: np.ndarray
               ) -> tuple[float, float]:
    """``(exposed, busy)``: the seconds one run of the program waits for its host copies, and their total."""
    kernel_plan, schedule = plan.kernel_plan, plan.schedule
    bandwidth = plan.hardware.host_bandwidth * plan.hardware.host_efficiency
    starts = np.concatenate(([0.0], np.cumsum(item_time)))
    total = float(starts[-1])
    # Per loop holding copies: its iteration's length and each body kernel's start and end within it.
    within: dict[int, tuple[float, dict[int, tuple[float, float]]]] = {}
    for loop, (item, trips, body) in schedule.transfer_loops.items():
        per_iteration = seconds[body] * plan.pricing.repeats[body] / trips
        ends = np.cumsum(per_iteration)
        length = float(item_time[item]) / trips if item >= 0 else 0.0
        scale = length / float(ends[-1]) if len(ends) and ends[-1] > 0 else 0.0
        within[loop] = (length, {k: (float((end - t) * scale), float(end * scale))
                                 for k, end, t in zip(body.tolist(), ends.tolist(), per_iteration.tolist(),
                                                      strict=True)})

    def at(kernel: int, loop: int, iteration: int, end: bool) -> float:
        """When ``kernel`` starts (ends) in ``iteration`` of ``loop``, or as a whole (a kernel outside it)."""
        item = int(schedule.top_of_kernel[kernel])
        if loop >= 0 and schedule.outer_loop_of_kernel[kernel] == loop:
            length, offsets = within[loop]
            return float(starts[item]) + iteration * length + offsets[kernel][1 if end else 0]
        return float(starts[item + 1] if end else starts[item])

    events: list[tuple[float, int, float, float, bool, int]] = []  # (ready, order, due, seconds, to_host, data)
    offloaded: dict[int, float] = {}  # host data -> when the last offload into it so far is ready
    for transfer in kernel_plan.transfers:
        loop = transfer.loop
        item, trips, _ = schedule.transfer_loops[loop] if loop >= 0 else (-1, 1, np.empty(0))
        duration = float(value_bytes[transfer.value]) * transfer.repeats / trips / bandwidth
        for iteration in range(trips):
            begins = float(starts[item]) + iteration * within[loop][0] if item >= 0 else 0.0
            due = math.inf
            ready = max(begins, at(transfer.ready_kernel, loop, iteration, True)
                        if transfer.ready_kernel >= 0 else 0.0)
            if transfer.to_host:
                offloaded[transfer.host_data] = max(offloaded.get(transfer.host_data, 0.0), ready)
            else:  # after the offloads of its data (taken first: ``landed`` then knows when they end)
                ready = max(ready, offloaded.get(transfer.host_data, 0.0))
                if transfer.reader_kernel >= 0:
                    due = at(transfer.reader_kernel, loop, iteration, False)
            events.append((ready, len(events), due, duration, transfer.to_host, transfer.host_data))
    busy = sequential_sum(np.asarray([e[3] for e in events]))
    if not plan.overlap:
        return busy, busy
    events.sort()
    free = {True: 0.0, False: 0.0}  # each direction's stream
    landed: dict[int, float] = {}  # host data -> when the offloads into it so far are done
    pending: list[tuple[float, float]] = []  # (due, lateness) of copies the compute stream waits for
    delay = 0.0
    for ready, _, due, duration, to_host, data in events:
        while pending and pending[0][0] <= ready:
            delay = max(delay, heapq.heappop(pending)[1])
        begin = max(ready + delay, free[to_host], 0.0 if to_host else landed.get(data, 0.0))
        free[to_host] = end = begin + duration
        if to_host:
            landed[data] = max(landed.get(data, 0.0), end)
        elif end > due:
            heapq.heappush(pending, (due, end - due))
    for _, late in pending:
        delay = max(delay, late)
    return max(total + delay, free[True], free[False]) - total, busy
