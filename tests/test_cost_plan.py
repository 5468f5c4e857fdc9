"""The cost stage as a frozen plan and pure functions: ``toast.cost.plan.cost_plan`` fixes what a program, mesh and
hardware fix, once; ``toast.cost.pricing``, ``toast.cost.schedule`` and ``toast.cost.memory`` price a state on it;
``toast.cost.model.CostModel`` is the facade holding one plan.

Expected numbers are worked out by hand on the round-numbers profile of ``tests/conftest.py`` (1e12 FLOP/s, 1e12
B/s of HBM, NVLink 1e11 B/s with 1 us per step, 1 us per kernel, 10 us per step).
"""

from __future__ import annotations

import dataclasses
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ONE_LEVEL, round_numbers_profile

from toast import Action, CostModel, ShardingModel, analyze, load_hardware, parse_mesh
from toast.cost.memory import memory_timeline
from toast.cost.model import absolute_cost, priced_rows, scheduled_cost, step_time_bound
from toast.cost.plan import CostPlan, cost_plan
from toast.cost.pricing import kernel_times

F32 = 4  # bytes per element
SHARD = 256 * 256 * F32  # one device's [256, 256] f32 block: 262144 bytes
MATMUL = 2 * 256**3 / 1e12 + 1e-6  # each device's [256,256]x[256,256], FLOP-bound, plus the call: 3.4554432e-5 s
TANH = 2 * SHARD / 1e12 + 1e-6  # reads and writes one block: 1.524288e-6 s
ALL_REDUCE = 2 * (1e-6 + SHARD / 2 / 1e11)  # ring over 2 devices: 4.62144e-6 s
STEP = 1e-5


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """``tanh(x @ w)``, x [256, 512] and w [512, 256] with the contracting dim over model=2: each device multiplies
    its halves, the partial product is all-reduced, then tanh reads it."""
    path = tmp_path_factory.mktemp("hw") / "unit.toml"
    path.write_text(round_numbers_profile("unit", ONE_LEVEL))
    unit = load_hardware(str(path))
    analysis = analyze("split", fn=lambda x, w: jnp.tanh(x @ w),
                       args=[jax.ShapeDtypeStruct((256, 512), jnp.float32),
                             jax.ShapeDtypeStruct((512, 256), jnp.float32)])
    model = ShardingModel(analysis, parse_mesh("model=2"))
    name = analysis.names.def_base[analysis.program.arguments[0]] + 1
    state = model.apply(model.initial(), Action(int(analysis.color_of[name]), "model"))
    return model, unit, state


def test_a_state_is_priced_by_pure_functions_of_the_plan(split):
    model, unit, state = split
    plan = cost_plan(model, unit)
    seconds, _, _ = kernel_times(plan, state)
    assert seconds.tolist() == pytest.approx([MATMUL, TANH])
    # The all-reduce runs between the matmul and tanh, which waits for it.
    assert absolute_cost(plan, state).step_time_s == pytest.approx(MATMUL + ALL_REDUCE + TANH + STEP)
    # Positions: the arguments (x's and w's halves); during the matmul, its partial product and the all-reduce's
    # result besides; during tanh, the product (read there) and tanh's result; then the result alone with the
    # arguments; nothing after.
    assert memory_timeline(plan, state).tolist() == [2 * SHARD, 4 * SHARD, 4 * SHARD, 3 * SHARD, 0]


def test_the_plan_is_frozen_and_serves_states_in_any_order(split):
    model, unit, state = split
    plan = cost_plan(model, unit)
    assert isinstance(plan, CostPlan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.overlap = False  # type: ignore[misc]
    unsharded = model.initial()
    first = absolute_cost(plan, state)
    absolute_cost(plan, unsharded)
    assert absolute_cost(plan, state) == first
    copy = pickle.loads(pickle.dumps(plan))  # a search's workers get it so
    assert absolute_cost(copy, state) == first
    # The facade evaluates with the same functions on its own plan.
    costs = CostModel(model, unit)
    assert costs.evaluate(state).step_time_s == first.step_time_s
    assert costs.initial == absolute_cost(plan, unsharded)
    assert np.array_equal(costs.memory_timeline(state), memory_timeline(plan, state))


def _contracted_split(k: int):
    """``tanh(x @ w)``, x [256, k] and w [k, 256], the contracting dim over model=2, on the round-numbers profile."""
    analysis = analyze(f"split{k}", fn=lambda x, w: jnp.tanh(x @ w),
                       args=[jax.ShapeDtypeStruct((256, k), jnp.float32), jax.ShapeDtypeStruct((k, 256), jnp.float32)])
    model = ShardingModel(analysis, parse_mesh("model=2"))
    name = analysis.names.def_base[analysis.program.arguments[0]] + 1
    return model, model.apply(model.initial(), Action(int(analysis.color_of[name]), "model"))


def test_the_step_time_bound_is_the_busier_stream(split):
    """``step_time_bound``: the step overhead plus the larger of the compute stream's busy time and the communication
    stream's, without scheduling them; ``scheduled_cost`` of ``priced_rows`` is ``absolute_cost``. With a 512-long
    contraction the kernels are the busier (the all-reduce hides nothing: tanh waits for it, so the step is longer);
    with a 2-long one (each device's matmul [256, 1] x [1, 256]: 131072 FLOPs, 264192 bytes, bound by bytes:
    2.64192e-7 s + the call) the all-reduce of the [256, 256] product is."""
    model, unit, state = split
    plan = cost_plan(model, unit)
    rows = priced_rows(plan, state)
    assert step_time_bound(plan, rows) == pytest.approx(STEP + MATMUL + TANH)
    assert scheduled_cost(plan, rows) == absolute_cost(plan, state)
    assert rows.peak == absolute_cost(plan, state).peak_bytes
    thin_model, thin_state = _contracted_split(2)
    thin_plan = cost_plan(thin_model, unit)
    thin_matmul = 264192 / 1e12 + 1e-6
    assert step_time_bound(thin_plan, priced_rows(thin_plan, thin_state)) == pytest.approx(STEP + ALL_REDUCE)
    assert absolute_cost(thin_plan, thin_state).step_time_s == pytest.approx(STEP + thin_matmul + ALL_REDUCE + TANH)


@pytest.mark.parametrize("spec", ["toast.examples.gpt:gpt_small?layers=4", "toast.examples.convnet:convnet",
                                  "benchmarks.programs.llama3:llama3?layers=4"])
def test_the_step_time_bound_never_exceeds_the_step_time(spec):
    """On bundled programs' random search states (reuse path: the makespan jumping over layers, to 1e-12), the bound
    is at most the step time, the floor of the peak at most the peak, and the two halves give ``absolute_cost``."""
    from conftest import walk_atoms

    from toast.search.actions import ActionSpace

    model = ShardingModel(analyze(spec, engine="embedded"), parse_mesh("batch=2,model=2" if "gpt" in spec else
                                                                       "data=2,model=2"))
    space = ActionSpace(model)
    costs = CostModel(model, load_hardware("h100"))
    rng = np.random.default_rng(3)
    below = 0
    for _ in range(12):
        state = space.state(walk_atoms(space, rng))
        rows = costs.priced_rows(state)
        bound, cost = costs.step_time_bound(rows), costs.evaluate(state, collectives=False)
        assert bound <= cost.step_time_s * (1 + 1e-12)
        assert 0 < costs.peak_floor(state) <= cost.peak_bytes
        assert costs.evaluate_rows(rows, collectives=False) == cost
        below += bound < cost.step_time_s * (1 - 1e-9)
    assert below  # a bound, not the step time itself


def test_the_peak_floor_is_the_arguments(split):
    """``CostModel.peak_floor``: the buffers live at the memory timeline's first position, from the state's byte
    classes alone: unsharded, x [256, 512] and w [512, 256] in f32 (4 blocks of 256 x 256); with the contracting dim
    over model=2, each device's halves (2 blocks, the first position of the timeline worked out above)."""
    from toast.search.actions import ActionSpace

    model, unit, state = split
    space = ActionSpace(model, min_names=0)
    costs = CostModel(model, unit)
    assert costs.peak_floor(space.state(space.initial_atoms)) == 4 * SHARD
    color = int(state.actions[0].color)
    index = next(k for k, action in enumerate(space.actions) if action.colors == (color,) and action.axis == "model"
                 and not action.stored)
    split_state = space.state(space.step(space.initial_atoms, index))
    assert costs.peak_floor(split_state) == 2 * SHARD
    assert costs.evaluate(split_state).step_time_s == pytest.approx(MATMUL + ALL_REDUCE + TANH + STEP)
    assert costs.peak_floor(state) == 0  # not built on a partition: no floor
