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
from toast.cost.model import absolute_cost
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
