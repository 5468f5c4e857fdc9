"""Repeated layers priced once (issue 38, item 1): the fast path (``CostModel(reuse=True)``, the default: collectives
per class of alike ops and values, ``toast.cost.class_table``; the combiners' groups found with numpy; the makespan
jumping over repeats, ``toast.cost.repeats``) gives the cost the full path (``reuse=False``) gives, on the bundled
programs, for the manual strategies' states and seeded random states of the search's action space; and the reuse
happens (runs found, classes independent of the depth, jumps taken)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import walk_atoms

import toast
from toast.cost import class_table, repeats, schedule
from toast.cost.model import Cost, CostModel
from toast.cost.repeats import item_runs, periodic_makespan
from toast.cost.schedule import combine_groups, combine_groups_fast, makespan
from toast.errors import ToastError
from toast.search.actions import ActionSpace
from toast.sharding.propose import roles_or_proposed
from toast.sharding.state import ShardingModel, ShardingState
from toast.sharding.strategies import COMPOSITES, STRATEGIES, manual_strategy

# Bundled programs at their test sizes, each with a mesh its dims divide.
PROGRAMS = {
    "toast.examples.mlp:mlp": "data=2,model=2",
    "toast.examples.attention:attention": "data=2,model=2",
    "toast.examples.gpt:gpt_small?layers=4": "batch=2,model=2",
    "toast.examples.convnet:convnet": "data=2,model=2",
    "toast.examples.gnn:gnn": "data=2,model=2",
    "benchmarks.programs.llama3:llama3?layers=4": "data=4,model=2",
}
SLOW_PROGRAMS = {
    "toast.examples.gpt:gpt_scan": "batch=2,model=2",
    "toast.examples.gemma:gemma_small": "data=2,model=2",
    "toast.examples.itx:itx_small": "data=2,model=2",
    "toast.examples.gns:gns_small": "data=2,model=2",
    "toast.examples.unet:unet_small": "data=2,model=2",
    "benchmarks.programs.scan_llama:scan_llama": "data=4,model=2",
    "benchmarks.programs.moe:moe": "data=4,model=2",
}
WALKS = 12


@pytest.fixture(autouse=True)
def small_programs_take_the_fast_path(monkeypatch):
    """The class table, the combiners' numpy and the makespan's jumps serve programs of any size here (each is
    skipped where it would cost more than it saves), so that the test programs' few layers take the path a deep
    program takes."""
    monkeypatch.setattr(repeats, "_MIN_RUN_ROWS", 1)
    monkeypatch.setattr(class_table, "MIN_SITES", 0)
    monkeypatch.setattr(schedule, "_SCAN_ALL", 2)


def analysis_of(spec: str):
    return _analyses.get(spec) or _analyses.setdefault(spec, toast.analyze(spec, engine="embedded"))


_analyses: dict = {}


def states_of(model: ShardingModel, space: ActionSpace, *, seed: int = 0) -> list[tuple[str, ShardingState]]:
    """The manual strategies' states (no partition: the full table) and ``WALKS`` seeded random walks of the
    action space (on its partition: the class table), each of 1 to 6 valid actions."""
    found = []
    roles = roles_or_proposed(None, model.analysis)
    for name in STRATEGIES + COMPOSITES:
        try:
            found.append((name, manual_strategy(model, name, roles)[0]))
        except ToastError:
            continue
    rng = np.random.default_rng(seed)
    for walk in range(WALKS):
        found.append((f"walk {walk}", space.state(walk_atoms(space, rng))))
    return found


def assert_same_cost(fast: Cost, full: Cost, label: str) -> None:
    """Every field of the two costs equal, the numbers to within 1e-12 relative (sums taken in another order)."""
    scale = max(abs(full.step_time_s), 1e-300)
    for name in ("step_time_s", "compute_s", "relative"):
        a, b = getattr(fast, name), getattr(full, name)
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0), f"{label}: {name} {a!r} != {b!r}"
    for name in ("peak_bytes", "kernels", "collectives", "collectives_launched"):
        assert getattr(fast, name) == getattr(full, name), f"{label}: {name} differs"
    for name in ("breakdown", "communication_s", "communication_by_level_s", "exposed_communication_by_axes_s"):
        a, b = getattr(fast, name), getattr(full, name)
        assert list(a) == list(b), f"{label}: {name} keys {list(a)} != {list(b)}"
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-12 * max(abs(a[key]), abs(b[key]), scale), \
                f"{label}: {name}[{key}] {a[key]!r} != {b[key]!r}"


def check_program(spec: str, mesh: str, *, hardware: str = "h100", mirror_layers: bool = True, **settings) -> int:
    """The fast path's cost equals the full path's on ``spec``'s states (``settings``: ``CostModel``'s); the number
    of states compared."""
    analysis = analysis_of(spec)
    model = ShardingModel(analysis, toast.parse_mesh(mesh))
    space = ActionSpace(model, mirror_layers=mirror_layers)
    profile = toast.load_hardware(hardware)
    fast = CostModel(model, profile, **settings)
    full = CostModel(model, profile, reuse=False, **settings)
    fast.prepare(space.partition)
    full.prepare(space.partition)
    assert fast.cost_plan.reuse and not full.cost_plan.reuse
    states = states_of(model, space)
    for label, state in states:
        assert_same_cost(fast.evaluate(state), full.evaluate(state), f"{spec} {hardware} {label}")
    return len(states)


@pytest.mark.parametrize("spec", sorted(PROGRAMS))
def test_fast_path_costs_what_the_full_path_costs(spec):
    assert check_program(spec, PROGRAMS[spec]) > WALKS


@pytest.mark.slow
@pytest.mark.parametrize("spec", sorted(SLOW_PROGRAMS))
def test_fast_path_costs_what_the_full_path_costs_on_more_programs(spec):
    assert check_program(spec, SLOW_PROGRAMS[spec]) > WALKS


@pytest.mark.parametrize("spec, hardware, settings", [
    ("toast.examples.gpt:gpt_small?layers=4", "tpu_v3", {}),  # collective matmuls fold collectives away
    ("toast.examples.gpt:gpt_small?layers=4", "h100", {"microbatches": 2}),  # a second stream
    ("toast.examples.gpt:gpt_small?layers=4", "h100", {"overlap": False, "donate": (0,)}),
    ("benchmarks.programs.llama3:llama3?layers=4", "tpu_v3", {}),
])
def test_fast_path_on_other_hardware_and_settings(spec, hardware, settings):
    check_program(spec, PROGRAMS[spec], hardware=hardware, **settings)


def test_layers_sharded_unalike_take_the_full_scans_and_still_match():
    """Without mirrored actions each layer's dims are atoms of their own: random states split layers unalike, so a
    run's repeats differ and the makespan scans them (its check finds them unequal); the costs still match."""
    spec = "toast.examples.gpt:gpt_small?layers=4"
    check_program(spec, PROGRAMS[spec], mirror_layers=False)


# Reuse happens.

def stack(layers: int):
    """``layers`` alike layers, ``x = tanh(x @ w[k])``, forward only: per layer a matmul and the tanh's fusion."""
    def fn(x, ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    return fn, (x, [jax.ShapeDtypeStruct((16, 16), jnp.float32)] * layers)


def test_runs_of_a_layer_stack_found_by_hand():
    """Worked by hand: each layer is two items (the matmul, a library call; the tanh, a fusion its reader, the next
    matmul, cannot take in), alike from the first layer to the last: one run from item 0, period 2, 6 repeats."""
    fn, args = stack(6)
    analysis = toast.analyze("stack", fn=fn, args=args, engine="embedded")
    plan = CostModel(ShardingModel(analysis, toast.parse_mesh("data=2")), toast.load_hardware("h100")).cost_plan
    assert plan.schedule.item_count == 12
    runs = plan.schedule.runs
    assert (runs.starts.tolist(), runs.periods.tolist(), runs.repeats.tolist()) == ([0], [2], [6])
    assert plan.schedule.runs == item_runs(analysis.program, plan.kernel_plan, plan.schedule.top_of_kernel, 12)


def test_too_few_repeats_make_no_run():
    fn, args = stack(repeats.MIN_REPEATS - 1)
    analysis = toast.analyze("stack", fn=fn, args=args, engine="embedded")
    plan = CostModel(ShardingModel(analysis, toast.parse_mesh("data=2")), toast.load_hardware("h100")).cost_plan
    assert len(plan.schedule.runs) == 0


def test_classes_do_not_grow_with_the_layers():
    """The class table prices as many classes at 8 layers as at 4: the layers' ops and values fall into the
    classes of the first layer's (under the search's partition, which mirrors them)."""
    sizes = []
    for layers in (4, 8):
        model = ShardingModel(analysis_of(f"toast.examples.gpt:gpt_small?layers={layers}"), toast.parse_mesh(
            "batch=2,model=2"))
        space = ActionSpace(model)
        table = CostModel(model, toast.load_hardware("h100")).classes(space.partition)
        assert table is not None
        sizes.append((table.op_classes, table.value_classes, len(table.communication.use_sites)))
    (ops_4, values_4, sites_4), (ops_8, values_8, sites_8) = sizes
    assert (ops_4, values_4) == (ops_8, values_8)
    assert sites_8 > sites_4 > values_4


def count_jumps(monkeypatch) -> list[bool]:
    """Whether each attempt of the makespan to jump over a run's repeats took the jump, as they happen."""
    jumps: list[bool] = []
    jump = repeats._Streams._jump

    def counted(self, *args):
        taken = jump(self, *args)
        jumps.append(taken is not None)
        return taken

    monkeypatch.setattr(repeats._Streams, "_jump", counted)
    return jumps


def test_the_makespan_jumps_over_repeated_layers(monkeypatch):
    """On the 4-layer step's states the makespan's check finds repeats alike and jumps (the costs match)."""
    jumps = count_jumps(monkeypatch)
    for spec in ("benchmarks.programs.llama3:llama3?layers=4", "toast.examples.gpt:gpt_small?layers=8"):
        check_program(spec, "batch=2,model=2" if "gpt" in spec else PROGRAMS[spec])
        assert any(jumps), spec
        jumps.clear()


# The scans alone, on inputs made here.

def test_combine_groups_fast_finds_the_same_groups():
    rng = np.random.default_rng(1)
    for case in range(300):
        count = int(rng.integers(0, 60))
        kind = rng.integers(0, 5, count)
        axes_mask = rng.integers(1, 4, count)
        nbytes = rng.integers(1, 8, count).astype(np.float64) * 1e6
        ready = rng.integers(-1, 20, count)
        consumer = ready + rng.integers(-2, 15, count)
        threshold = float(rng.choice([0.0, 3e6, 1e7, 31457287.0, 1e12]))
        expected = combine_groups(threshold, kind, axes_mask, nbytes, ready, consumer)
        found = combine_groups_fast(threshold, kind, axes_mask, nbytes, ready, consumer)
        assert (found is None) == (expected is None), case
        if expected is not None:
            assert np.array_equal(found, expected), case


def test_combine_groups_fast_worked_by_hand():
    """Three all-reduces over one axis, ready at items 0, 1, 5, due at 4, 9, 9: the second joins the first (ready
    before its consumer), the third starts a group (ready at 5, after the group's first consumer at 4); an
    all-to-all never combines."""
    kind = np.array([0, 0, 0, 3])
    found = combine_groups_fast(1e9, kind, np.array([1, 1, 1, 1]), np.array([1.0, 1.0, 1.0, 1.0]),
                                np.array([0, 1, 5, 1]), np.array([4, 9, 9, 9]))
    assert found.tolist() == [0, 0, 1, 2]


def assert_like_makespan(inputs: tuple, runs: repeats.ItemRuns, case: int) -> None:
    """``periodic_makespan`` of ``inputs`` over ``runs`` equals ``makespan``: the step to 1e-12 relative, the
    exposed seconds per axes set to 1e-12 of the step."""
    expected_span, expected_exposed = makespan(*inputs)
    span, exposed = periodic_makespan(*inputs, runs)
    assert math.isclose(span, expected_span, rel_tol=1e-12), case
    masks = inputs[4]
    assert np.allclose(np.bincount(masks, weights=exposed), np.bincount(masks, weights=expected_exposed),
                       rtol=0, atol=1e-12 * expected_span), case


def periodic_inputs(rng: np.random.Generator, *, repeats_count: int, period: int, width: int, before: int,
                    heavy: bool) -> tuple:
    """A makespan's inputs with one run: ``repeats_count`` repeats of ``period`` items, ``width`` collectives each
    (ready in the repeat, consumed a few items on or after the run), ``before`` collectives ready at the start
    and consumed in the run, 3 items before and after it. ``heavy``: collectives longer than the items."""
    lead, tail = 3, 3
    block = rng.uniform(1.0, 2.0, period)
    item_time = np.concatenate((rng.uniform(1.0, 2.0, lead), np.tile(block, repeats_count),
                                rng.uniform(1.0, 2.0, tail)))
    end = lead + period * repeats_count
    offsets = rng.integers(0, period, width)
    gaps = rng.integers(0, 2 * period, width)
    far = rng.random(width) < 0.2
    durations = rng.uniform(0.5, 4.0 if heavy else 1.0, width)
    masks = rng.integers(1, 4, width)
    ready, consumer, duration, axes = [], [], [], []
    for r in range(repeats_count):
        ready += (lead + r * period + offsets).tolist()
        consumer += np.where(far, end + 1 + (r % 2), lead + r * period + offsets + gaps).tolist()
        duration += durations.tolist()
        axes += masks.tolist()
    ready += [-1] * before
    consumer += rng.integers(lead, end, before).tolist()
    duration += rng.uniform(0.1, 3.0, before).tolist()
    axes += rng.integers(1, 4, before).tolist()
    ready += rng.integers(-1, end + tail, 5).tolist()
    consumer += rng.integers(0, end + tail + 1, 5).tolist()
    duration += rng.uniform(0.5, 2.0, 5).tolist()
    axes += rng.integers(1, 4, 5).tolist()
    runs = repeats.ItemRuns(np.array([lead]), np.array([period]), np.array([repeats_count]))
    return (item_time, np.asarray(consumer), np.asarray(ready), np.asarray(duration), np.asarray(axes)), runs


@pytest.mark.parametrize("heavy", [False, True])
def test_periodic_makespan_matches_the_scan(heavy, monkeypatch):
    jumps = count_jumps(monkeypatch)
    rng = np.random.default_rng(7 + heavy)
    for case in range(60):
        inputs, runs = periodic_inputs(rng, repeats_count=int(rng.integers(4, 40)), period=int(rng.integers(1, 6)),
                                       width=int(rng.integers(1, 6)), before=int(rng.integers(0, 12)), heavy=heavy)
        assert_like_makespan(inputs, runs, case)
    assert any(jumps)


def test_long_runs_are_jumped_in_checked_parts(monkeypatch):
    """A jump skips at most ``_MAX_JUMP`` repeats; the scan then checks the state again and jumps on."""
    monkeypatch.setattr(repeats, "_MAX_JUMP", 3)
    jumps = count_jumps(monkeypatch)
    rng = np.random.default_rng(11)
    most = 0
    for case in range(30):
        jumps.clear()
        inputs, runs = periodic_inputs(rng, repeats_count=40, period=2, width=3, before=int(rng.integers(0, 8)),
                                       heavy=bool(case % 2))
        span, exposed = periodic_makespan(*inputs, runs)
        expected_span, expected_exposed = makespan(*inputs)
        assert math.isclose(span, expected_span, rel_tol=1e-12), case
        masks = inputs[4]
        assert np.allclose(np.bincount(masks, weights=exposed), np.bincount(masks, weights=expected_exposed),
                           rtol=0, atol=1e-12 * expected_span), case
        most = max(most, sum(jumps))
    assert most >= 2


def test_periodic_makespan_worked_by_hand():
    """Items of 1 s; a run of 4 repeats of 1 item (items 0..3), then item 4. Repeat r's collective (2 s) is ready
    after item r and consumed by item r + 1, which therefore waits for all of it: collective 0 runs [1, 3], item 1
    [3, 4], collective 1 [4, 6], item 2 [6, 7], collective 2 [7, 9], item 3 [9, 10], collective 3 [10, 12], item 4
    [12, 13]. Makespan 13 s, each collective exposed 2 s. The state repeats from repeat 1 on (the stream free 2 s
    after the repeat's start plus the delay, one collective 2 s late pending), and the scan jumps from repeat 2."""
    inputs = (np.ones(5), np.array([1, 2, 3, 4]), np.array([0, 1, 2, 3]), np.full(4, 2.0), np.ones(4, dtype=np.int64))
    runs = repeats.ItemRuns(np.array([0]), np.array([1]), np.array([4]))
    assert makespan(*inputs) == (13.0, pytest.approx(np.full(4, 2.0), abs=0))
    span, exposed = periodic_makespan(*inputs, runs)
    assert span == 13.0
    assert exposed.tolist() == [2.0, 2.0, 2.0, 2.0]


def test_reuse_keyword_reaches_the_plan():
    fn, args = stack(2)
    analysis = toast.analyze("stack", fn=fn, args=args, engine="embedded")
    model = ShardingModel(analysis, toast.parse_mesh("data=2"))
    assert CostModel(model, toast.load_hardware("h100")).cost_plan.reuse
    plan = CostModel(model, toast.load_hardware("h100"), reuse=False).cost_plan
    assert not plan.reuse and dataclasses.replace(plan, reuse=True).reuse


def test_periodic_makespan_matches_the_scan_with_collectives_ready_together(monkeypatch):
    """Many collectives ready at the start (a same-ready stretch, scanned with numpy: pending as sorted arrays, not
    the heap) and consumed along the run: the jumps replay them, the pops take them few at a time or many."""
    jumps = count_jumps(monkeypatch)
    stretches = []
    stretch = repeats._Streams.stretch
    monkeypatch.setattr(repeats._Streams, "stretch", lambda self, begin, end: (stretches.append(end - begin),
                                                                               stretch(self, begin, end)))
    rng = np.random.default_rng(13)
    for case in range(40):
        inputs, runs = periodic_inputs(rng, repeats_count=int(rng.integers(8, 40)), period=int(rng.integers(1, 4)),
                                       width=int(rng.integers(1, 5)), before=int(rng.integers(20, 60)),
                                       heavy=bool(case % 2))
        assert_like_makespan(inputs, runs, case)
    assert any(jumps) and max(stretches) >= repeats._VECTOR_ROWS


def test_periodic_makespan_jumps_where_rows_repeat_every_other_period(monkeypatch):
    """Worked by hand: 41 items of 1 s; a run of 40 repeats of one item (items 0..39) whose collectives alternate
    (as XLA's combiner leaves them when it groups across layers): after an even item one of 2 s, after an odd one
    two of 0.25 s (axes apart, so not merged), each consumed by the next item, which waits for all of it. Every
    two items take 2 s of compute, 2 s and 0.5 s of waits: makespan 41 + 20 * 2 + 20 * 0.5 = 91 s, each collective
    exposed for its whole length. Repeats hold 1 and 2 rows in turn, so the rows repeat every 2 periods only: the
    scan takes 2 repeats as one and jumps, scanning far fewer than the 60 rows row by row."""
    ready, consumer, duration, axes = [], [], [], []
    for item in range(40):
        members = [(2.0, 1)] if item % 2 == 0 else [(0.25, 1), (0.25, 2)]
        for seconds, mask in members:
            ready.append(item)
            consumer.append(item + 1)
            duration.append(seconds)
            axes.append(mask)
    inputs = (np.ones(41), np.asarray(consumer), np.asarray(ready), np.asarray(duration), np.asarray(axes))
    runs = repeats.ItemRuns(np.array([0]), np.array([1]), np.array([40]))
    jumps = count_jumps(monkeypatch)
    scanned = []
    step = repeats._Streams.step
    monkeypatch.setattr(repeats._Streams, "step", lambda self, begin, end, *args, **kwargs: (
        scanned.append(end - begin), step(self, begin, end, *args, **kwargs)))
    span, exposed = periodic_makespan(*inputs, runs)
    assert math.isclose(span, 91.0, rel_tol=1e-12)
    assert np.allclose(exposed, inputs[3], rtol=0, atol=1e-12 * 91.0)
    expected_span, expected_exposed = makespan(*inputs)
    assert math.isclose(span, expected_span, rel_tol=1e-12)
    assert np.allclose(np.bincount(inputs[4], weights=exposed), np.bincount(inputs[4], weights=expected_exposed),
                       rtol=0, atol=1e-12 * expected_span)
    assert any(jumps)
    assert sum(scanned) <= 30  # of 60: a jump over most of the run's 20 double repeats


def test_periodic_makespan_matches_the_scan_where_rows_repeat_every_few_periods(monkeypatch):
    """Runs declared with a period whose multiple (2 to 4 of them) is what repeats: the scan takes the multiple as
    one repeat and jumps, and matches ``makespan``."""
    jumps = count_jumps(monkeypatch)
    rng = np.random.default_rng(17)
    for case in range(40):
        period, multiple = int(rng.integers(1, 4)), int(rng.integers(2, 5))
        inputs, runs = periodic_inputs(rng, repeats_count=int(rng.integers(4, 20)), period=period * multiple,
                                       width=int(rng.integers(1, 6)), before=int(rng.integers(0, 12)),
                                       heavy=bool(case % 2))
        runs = repeats.ItemRuns(runs.starts, runs.periods // multiple, runs.repeats * multiple)
        assert_like_makespan(inputs, runs, case)
    assert any(jumps)


def test_periodic_makespan_run_without_rows_in_its_middle():
    """Worked by hand: 20 items of 1 s; a run of 16 repeats of one item (items 2..17) whose collectives all lie in
    its first repeat: 60 of 0.1 s (axes apart, so not merged) ready after item 2, at 3 s, consumed by item 19 (at
    19 s): the stream runs them from 3 s to 9 s, nobody waits. Makespan 20 s, nothing exposed. The run's middle
    repeats hold no rows: nothing to jump over (the scan once read past its rows there)."""
    count = 60
    inputs = (np.ones(20), np.full(count, 19), np.full(count, 2), np.full(count, 0.1), np.arange(1, count + 1))
    runs = repeats.ItemRuns(np.array([2]), np.array([1]), np.array([16]))
    span, exposed = periodic_makespan(*inputs, runs)
    assert span == 20.0
    assert exposed.tolist() == [0.0] * count


@pytest.mark.parametrize("far", [7, 1 << 40])
def test_merged_rows_worked_by_hand(far):
    """Four collectives (consumer, ready, axes, seconds): (5, 0, 1, 1), (``far``, 0, 1, 2), (5, 0, 1, 3), (3, -1, 2,
    4). In ready, then consumer order: the last (ready at the start), then the first and the third merged (one
    ready item, consumer and axes set: 4 s, reported as the first), then the second; as well where a consumer lies
    past what the packed sort key holds (``far`` = 2**40: the three-key sort)."""
    rows, consumer, ready, duration, masks = repeats.merged_rows(
        np.array([5, far, 5, 3]), np.array([0, 0, 0, -1]), np.array([1.0, 2.0, 3.0, 4.0]), np.array([1, 1, 1, 2]))
    assert rows.tolist() == [3, 0, 1]
    assert consumer.tolist() == [3, 5, far]
    assert ready.tolist() == [-1, 0, 0]
    assert duration.tolist() == [4.0, 4.0, 2.0]
    assert masks.tolist() == [2, 1, 1]


@pytest.mark.parametrize("least, pays", [(2, True), (3, False)])
def test_jumps_pay_counts_the_collectives_in_each_run(monkeypatch, least, pays):
    """Runs over items 2..13 (period 3, 4 repeats) and 20..24 (period 1, 5 repeats); collectives ready at items 1,
    2, 13, 14, 20, 24, 25 and -1: two in each run (2 and 13; 20 and 24). Jumps pay when some run holds at least
    ``least``: 2, not 3."""
    monkeypatch.setattr(repeats, "_MIN_RUN_ROWS", least)
    runs = repeats.ItemRuns(np.array([2, 20]), np.array([3, 1]), np.array([4, 5]))
    assert repeats.jumps_pay(np.array([1, 2, 13, 14, 20, 24, 25, -1]), runs) is pays
