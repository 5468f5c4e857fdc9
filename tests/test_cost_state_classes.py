"""One state's cost with its work done per class (issue 38): kernels' times once per class of alike kernels
(``toast.cost.pricing.kernel_seconds``), buffers' bytes per cell of alike ones (``KernelMoves.buffer_cells``), no
value's bytes where only classes are read, collectives' durations a candidate at a time, the combiners' order from
one packed sort, the per-label sums in one pass: the numbers the per-kernel, per-buffer, per-row computation gives,
bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import walk_atoms

import toast
from toast.cost import class_table, schedule
from toast.cost.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, CommunicationModel
from toast.cost.memory import peak_memory
from toast.cost.model import CostModel, absolute_cost
from toast.cost.plan import MASKS, CollectivePricing
from toast.cost.pricing import collective_durations, kernel_moves, kernel_seconds, kernel_times
from toast.cost.schedule import by_labels, combine_groups, combine_groups_fast
from toast.search.actions import ActionSpace
from toast.sharding.state import ShardingModel, ShardingState

_analyses: dict = {}


def gpt(layers: int) -> tuple[ShardingModel, ActionSpace]:
    spec = f"toast.examples.gpt:gpt_small?layers={layers}"
    analysis = _analyses.get(spec) or _analyses.setdefault(spec, toast.analyze(spec, engine="embedded"))
    model = ShardingModel(analysis, toast.parse_mesh("batch=2,model=2"))
    return model, ActionSpace(model)


def walks(space: ActionSpace, count: int, *, seed: int = 0) -> list[ShardingState]:
    """The initial state and ``count`` seeded random walks of 1 to 6 valid actions, on the space's partition."""
    rng = np.random.default_rng(seed)
    return [space.state(space.initial_atoms)] + [space.state(walk_atoms(space, rng)) for _ in range(count)]


@pytest.mark.parametrize("microbatches", [1, 3])
def test_kernel_seconds_are_the_kernels_times_and_their_sums(microbatches):
    model, space = gpt(4)
    plan = CostModel(model, toast.load_hardware("h100"), microbatches=microbatches).cost_plan
    moves = kernel_moves(plan, space.partition)
    classes = moves.kernels
    assert len(classes.group) < len(classes.kernel_class)  # alike kernels share a class
    assert len(classes.flop_class) and len(classes.scatter_class)  # matmuls and the embedding's scatter-add
    pricing, runs = plan.pricing, plan.schedule
    step_repeats = pricing.repeats if microbatches == 1 else pricing.repeats * runs.kernel_runs
    for state in walks(space, 8):
        value_bytes, class_bytes = plan.communication.value_and_class_bytes(state)
        seconds, compute, memory = kernel_times(plan, state, value_bytes, class_bytes=class_bytes, moves=moves)
        found = kernel_seconds(plan, state, class_bytes, moves)
        bound = compute >= memory
        assert np.array_equal(found.seconds, seconds)
        assert np.array_equal(found.item_time, np.bincount(runs.top_of_kernel, weights=seconds * pricing.repeats,
                                                           minlength=runs.item_count))
        assert found.busy_compute == float((np.where(bound, compute, 0.0) * step_repeats).sum())
        assert found.busy_memory == float((np.where(bound, 0.0, memory) * step_repeats).sum())


def test_kernel_classes_do_not_grow_with_the_layers():
    """As many kernel classes at 8 layers as at 4 (the layers' kernels fall into the first layer's classes), and as
    many buffer cells per layer added as the layers add buffers at most."""
    found = []
    for layers in (4, 8):
        model, space = gpt(layers)
        moves = kernel_moves(CostModel(model, toast.load_hardware("h100")).cost_plan, space.partition)
        found.append((len(moves.kernels.group), len(moves.kernels.kernel_class), len(moves.buffer_cells[0])))
    (classes_4, kernels_4, cells_4), (classes_8, kernels_8, cells_8) = found
    assert classes_4 == classes_8
    assert kernels_8 > kernels_4 > classes_4
    assert cells_8 > cells_4


def test_buffer_cells_give_every_buffers_bytes():
    """A state's buffers per cell (position and byte class) add up to the bytes per buffer at every position, and
    the peak is the same."""
    model, space = gpt(4)
    costs = CostModel(model, toast.load_hardware("h100"))
    plan = costs.cost_plan
    moves = kernel_moves(plan, space.partition)
    position, byte_class, count = moves.buffer_cells
    memory, positions = plan.memory, len(plan.kernel_plan.kernels) + 3
    assert np.count_nonzero(count) == len(count) and len(count) < 2 * len(plan.kernel_plan.buffers)
    for state in walks(space, 6):
        value_bytes, class_bytes = plan.communication.value_and_class_bytes(state)
        sizes = value_bytes[plan.kernel_plan.buffers] * memory.on_device
        by_buffer = (np.bincount(memory.buffer_born, weights=sizes, minlength=positions)
                     - np.bincount(memory.buffer_dies, weights=sizes, minlength=positions))
        by_cell = np.bincount(position, weights=class_bytes[byte_class] * count, minlength=positions)
        assert np.array_equal(by_cell, by_buffer)
        table = plan.communication.table(state, value_bytes)
        assert peak_memory(plan, table, value_bytes, buffers=([position], [class_bytes[byte_class] * count])) \
            == peak_memory(plan, table, value_bytes)


def test_the_class_path_reads_no_values_bytes(monkeypatch):
    """On a program with no host copies, donated arguments, halos or scratch, a state on the classes' partition is
    priced from its byte classes' bytes alone (a take per value of the program saved), and costs what the full path
    makes of it."""
    monkeypatch.setattr(class_table, "MIN_SITES", 0)  # a class table for a program this small too
    model, space = gpt(4)
    profile = toast.load_hardware("h100")
    fast, full = CostModel(model, profile), CostModel(model, profile, reuse=False)
    states = walks(space, 4)
    expected = [full.evaluate(state) for state in states]
    fast.prepare(space.partition)
    classes = fast.classes(space.partition)

    def refused(*args, **kwargs):
        raise AssertionError("every value's bytes read")

    monkeypatch.setattr(CommunicationModel, "value_and_class_bytes", refused)
    monkeypatch.setattr(CommunicationModel, "value_bytes", refused)
    for state, reference in zip(states, expected, strict=True):
        found = absolute_cost(fast.cost_plan, state, moves=fast._moves_of(state), classes=classes)
        assert found.peak_bytes == reference.peak_bytes
        assert abs(found.step_time_s - reference.step_time_s) <= 1e-12 * reference.step_time_s


def pricing_of(latency: list[list[float]], per_byte: list[list[float]]) -> CollectivePricing:
    """A ``CollectivePricing`` whose all-reduces and all-gathers over mask 1 have the given candidates (one list per
    kind), every other (kind, mask) one candidate of 0 s."""
    width = len(latency[0])
    lat, slope = np.full((5, MASKS, width), np.inf), np.zeros((5, MASKS, width))
    lat[:, :, 0] = 0.0
    for kind, (row_latency, row_per_byte) in zip((ALL_REDUCE, ALL_GATHER), zip(latency, per_byte, strict=True),
                                                 strict=True):
        lat[kind, 1], slope[kind, 1] = row_latency, row_per_byte
    ones = np.ones(MASKS, dtype=np.int64)
    return CollectivePricing((None,) * MASKS, lat, slope, np.ascontiguousarray(lat.reshape(-1, width).T),
                             np.ascontiguousarray(slope.reshape(-1, width).T), ones, ones.astype(bool),
                             ("",) * MASKS, ("",) * MASKS)


def test_collective_durations_take_the_fastest_candidate_by_hand():
    """All-reduce over mask 1: 1 us + 1 ns/B or 5 us + 0.5 ns/B; all-gather: 2 us + 2 ns/B only (padding inf).
    1 kB all-reduce: 2 us (not 5.5); 100 kB: 55 us (not 101); 1 kB all-gather: 4 us; a reduce-scatter: 0 s."""
    pricing = pricing_of([[1e-6, 5e-6], [2e-6, np.inf]], [[1e-9, 0.5e-9], [2e-9, 0.0]])
    found = collective_durations(pricing, np.array([ALL_REDUCE, ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER]),
                                 np.array([1, 1, 1, 1]), np.array([1e3, 1e5, 1e3, 1e3]))
    assert found.tolist() == pytest.approx([2e-6, 55e-6, 4e-6, 0.0], rel=1e-12)


def test_combine_order_is_lexsorts_by_hand():
    """Kinds (2, 0, 0), masks (1, 1, 2): the two all-reduces first, mask 1 before mask 2; ties keep row order; items
    far apart (a range past the packed key's bits) take np.lexsort, in the same order."""
    order, kind_and_axes = schedule._combine_order(np.array([2, 0, 0, 0]), np.array([1, 1, 2, 1]),
                                                   np.array([5, 3, 3, 3]), np.array([9, 4, 1, 4]))
    assert order.tolist() == [1, 3, 2, 0]
    assert kind_and_axes.tolist() == [1, 1, 2, 2 * MASKS + 1]
    far = np.array([0, 2**40, 7, 7])
    order, kind_and_axes = schedule._combine_order(np.array([0, 0, 0, 0]), np.array([1, 1, 1, 1]), far,
                                                   np.array([1, 1, 9, 8]))
    assert order.tolist() == [0, 3, 2, 1]
    assert kind_and_axes.tolist() == [1, 1, 1, 1]


def test_combine_groups_fast_on_long_chains(monkeypatch):
    """Runs of many collectives that may join one group, split by the threshold or an earlier consumer partway:
    the groups ``combine_groups`` scans."""
    monkeypatch.setattr(schedule, "_SCAN_ALL", 2)
    rng = np.random.default_rng(3)
    for case in range(200):
        count = int(rng.integers(2, 80))
        kind = rng.choice([ALL_REDUCE, ALL_GATHER], count, p=[0.9, 0.1])
        axes_mask = rng.choice([1, 2], count, p=[0.9, 0.1])
        nbytes = rng.integers(1, 6, count).astype(np.float64) * 1e6
        ready = np.sort(rng.integers(-1, 30, count))
        consumer = ready + rng.integers(1, 40, count)
        threshold = float(rng.choice([4e6, 9e6, 2e7, 1e12]))
        expected = combine_groups(threshold, kind, axes_mask, nbytes, ready, consumer)
        found = combine_groups_fast(threshold, kind, axes_mask, nbytes, ready, consumer)
        assert (found is None) == (expected is None), case
        if expected is not None:
            assert np.array_equal(found, expected), case


def test_by_labels_by_hand():
    """Masks 2, 1, 2, 3 with seconds 1, 2, 3, 4: by axes (first appearance) b 4, a 2, a+b 4; by levels where masks
    1 and 2 are one level: x 6 (1 + 2 + 3 in row order), y 4; the late seconds summed apart."""
    axes = [""] * MASKS
    axes[1], axes[2], axes[3] = "a", "b", "a+b"
    levels = [""] * MASKS
    levels[1], levels[2], levels[3] = "x", "x", "y"
    seconds = np.array([1.0, 2.0, 3.0, 4.0])
    late = np.array([0.0, 1.0, 0.5, 0.0])
    by_axes, by_level, late_by_axes = by_labels(np.array([2, 1, 2, 3]), [seconds, seconds, late],
                                                [axes, levels, axes])
    assert list(by_axes.items()) == [("b", 4.0), ("a", 2.0), ("a+b", 4.0)]
    assert list(by_level.items()) == [("x", 6.0), ("y", 4.0)]
    assert list(late_by_axes.items()) == [("b", 0.5), ("a", 1.0), ("a+b", 0.0)]
    assert by_labels(np.zeros(0, dtype=np.int64), [np.zeros(0)], [axes]) == [{}]
