"""The action space's and the expert strategies' set-up, made fast: tables built once, walks taken together, a
strategy checked once; each gives what the one-at-a-time way gives."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import analysis_of, walk_atoms

from toast import InvalidState, ShardingModel, parse_mesh, roles_for_input
from toast.search.actions import FEW_ATOMS, ActionSpace, distinct_inverse
from toast.sharding.carry import carried_nodes, carried_nodes_many
from toast.sharding.state import distinct
from toast.sharding.strategies import _chain_nodes, manual_strategy, update_chains

GPT_SCAN = "toast.examples.gpt:gpt_scan"
GPT_SMALL = "toast.examples.gpt:gpt_small"


def test_distinct_is_numpys_unique_by_a_sort():
    # [5, 2, 5, 7, 2]: distinct values 2, 5, 7; first seen at 1, 0, 3; each value's rank among them.
    values, first, inverse = distinct_inverse(np.array([5, 2, 5, 7, 2], dtype=np.int64))
    assert values.tolist() == [2, 5, 7]
    assert first.tolist() == [1, 0, 3]
    assert inverse.tolist() == [1, 0, 1, 2, 0]
    assert distinct(np.array([30_000_000_007, 3, 30_000_000_007, 1], dtype=np.int64)).tolist() == [1, 3, 30_000_000_007]
    assert distinct(np.zeros(0, dtype=np.int64)).tolist() == []
    assert [a.tolist() for a in distinct_inverse(np.zeros(0, dtype=np.int64))] == [[], [], []]


def test_stepping_on_python_ints_is_stepping_on_arrays():
    model = ShardingModel(analysis_of(GPT_SMALL), parse_mesh("batch=4,model=2"))
    space = ActionSpace(model, min_names=1)
    assert len(space.initial_atoms) <= FEW_ATOMS and space._few_atoms  # the default here: Python ints
    rng = np.random.default_rng(0)
    checked = {True: 0, False: 0}
    for _ in range(12):
        atoms = walk_atoms(space, rng)
        for index in range(len(space)):
            space._few_atoms = True
            few = space.step(atoms, index)
            space._few_atoms = False
            arrays = space.step(atoms, index)
            assert (few is None) == (arrays is None)
            if few is not None:
                assert few.dtype == arrays.dtype == np.uint8 and np.array_equal(few, arrays)
            checked[few is None] += 1
    assert checked[True] and checked[False]  # both valid and invalid steps were compared


def test_walks_through_loops_taken_together_are_the_walks_one_at_a_time():
    analysis = analysis_of(GPT_SCAN)  # the blocks under a scan: walks go into the loop and through its body
    starts = [_chain_nodes(analysis, value_id, dim, chain) for value_id, chain in update_chains(analysis).items()
              for dim in range(len(analysis.program.values[value_id].shape))]
    starts.append((starts[0][0] | starts[1][0], starts[0][1] | starts[2][1]))  # several starts in one walk
    starts.append((set(), set()))
    together = carried_nodes_many(analysis, starts)
    one_at_a_time = [carried_nodes(analysis, forward_from=forward, backward_from=backward)
                     for forward, backward in starts]
    assert together == one_at_a_time
    assert sum(map(len, together)) > len(starts)  # the walks reach nodes beyond their starts
    assert together[-1] == set()


def test_a_strategy_is_checked_once_and_is_its_actions_applied_in_turn(monkeypatch):
    model = ShardingModel(analysis_of(GPT_SMALL), parse_mesh("batch=2,model=2"))  # gpt_small's batch is 2
    roles = roles_for_input(GPT_SMALL)
    checks = []
    original = ShardingModel.problem
    monkeypatch.setattr(ShardingModel, "problem", lambda self, state: checks.append(1) or original(self, state))
    state, actions = manual_strategy(model, "megatron", roles)
    assert len(actions) >= 3 and len(checks) == 1  # before: one check per action
    monkeypatch.undo()
    expected = model.initial()
    for action in actions:
        expected = model.apply(expected, action)  # each checked
    assert np.array_equal(state.masks, expected.masks) and state.actions == expected.actions


def test_a_strategy_invalid_at_the_end_names_the_role_at_fault():
    # gpt_small's heads and sequence dims meet in one tensor (the attention scores): both on the model axis is
    # invalid, and the actions are then applied again one at a time to name the first at fault.
    model = ShardingModel(analysis_of(GPT_SMALL), parse_mesh("batch=2,model=2"))
    fault = r"^role 'sequence' on model: .*\(roles heads, mlp and sequence all want model\)$"
    with pytest.raises(InvalidState, match=fault):
        manual_strategy(model, "megatron+sequence", roles_for_input(GPT_SMALL))
