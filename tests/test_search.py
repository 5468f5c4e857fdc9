"""The partitioner (``toast.search``, ``toast autoshard``, ``toast.autoshard``).

Expected shardings come from the TOAST paper (Figure 2c: batch + Megatron for the MLP; Figure 5b:
the sequence sharding of the attention, an all-gather of ``k`` and a reduce-scatter of the output), not
from the search itself; the memory limits that make them the answer are worked out in the comments.
"""

from __future__ import annotations

import dataclasses
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import analysis_of
from jax.sharding import PartitionSpec as P

import toast
from toast import ShardingModel, ToastError, load_hardware, parse_mesh
from toast.cli import main
from toast.evaluation.compare import compare_manual
from toast.examples.attention import attention
from toast.examples.gpt import gpt_train_step
from toast.examples.mlp import mlp
from toast.output.autoshard import strategy_document
from toast.search import (
    ActionSpace,
    Budget,
    MctsSettings,
    Search,
    SearchResult,
    argument_groups,
    parse_pins,
    search,
)
from toast.search.exhaustive import enumerate_states
from toast.search.find import find_strategy
from toast.xla.validate import validate

A100 = load_hardware("a100_80gb")
MiB = 2 ** 20
GPT = "toast.examples.gpt:gpt_small"
MLP = "toast.examples.mlp:mlp"
FAST = Budget(rollouts=300, workers=1)
CRIPPLED = MctsSettings(lanes=1, polish=False)  # with one rollout: a search that cannot find much


def _found(analysis, mesh, *, memory_gib=None, pinned=None, budget=FAST, settings=None):
    """MCTS's own strategy: no manual candidates, so these tests judge the search."""
    return find_strategy(analysis, parse_mesh(mesh), A100, pinned=pinned, budget=budget, settings=settings,
                         memory_gib=memory_gib, manual_candidates=False)


def _specs(found):
    return {t["name"]: t["partition_spec"] for t in strategy_document(found, source="test")["arguments"]}


@pytest.fixture(scope="module")
def big_mlp():
    """x [8192, 4096], w1 [4096, 16384], w2 [16384, 4096] in bf16: the weights are 128 MiB each."""
    fn, args = mlp(batch=8192, d_in=4096, d_hidden=16384, d_out=4096, dtype=jnp.bfloat16)
    return toast.analyze("mlp", fn=fn, args=args, engine="embedded")


def test_mlp_finds_batch_and_megatron(big_mlp):
    """Figure 2c. With 300 MiB per device, 8-way data parallelism (both weights whole, 256 MiB, plus the
    activations) does not fit; batch on ``batch`` and the hidden dim on ``model`` halves the weights."""
    found = _found(big_mlp, "batch=4,model=2", memory_gib=300 / 1024)
    assert _specs(found) == {"x": ["batch", None], "w1": [None, "model"], "w2": ["model", None]}
    assert not found.over_memory
    assert [(c.kind, c.axes) for c in found.result.cost.collectives] == [("all-reduce", ("model",))]


def test_attention_finds_the_sequence_sharding_of_figure_5b():
    """S=8192: the f32 scores [S, S] are 256 MiB whole; with 200 MiB per device they must be split."""
    fn, args = attention(seq=8192, d_model=1024, h1=512, h2=512)
    analysis = toast.analyze("attention", fn=fn, args=args, engine="embedded")
    found = _found(analysis, "seq=8", memory_gib=200 / 1024)
    assert _specs(found)["x"] == ["seq", None]
    program = analysis.program
    k = program.ops[0].results[0]  # k = x @ wk, the first op
    kinds = sorted((c.kind, c.value) for c in found.result.cost.collectives)
    assert kinds == sorted([("all-gather", k), ("reduce-scatter", program.results[0])])
    assert found.result.cost.peak_bytes <= 200 * MiB


def test_repeated_layers_share_one_action_space():
    """Section 4.4: the parameters of every block are grouped, so 2 and 3 layers have the same actions."""
    from toast.examples.gpt import gpt_small

    spaces = []
    for layers in (2, 3):
        if layers == 2:
            analysis = analysis_of(GPT)  # gpt_small, cached
        else:
            fn, args = gpt_small(layers=layers)
            analysis = toast.analyze("gpt", fn=fn, args=args, engine="embedded")
        model = ShardingModel(analysis, parse_mesh("a=2,b=2"))
        groups = argument_groups(model)
        assert max(len(g) for g in groups) >= layers  # e.g. every block's w_fc
        space = ActionSpace(model)
        spaces.append((len(space), len(space.partition.first_name)))
    # The same actions, and the same atoms: a state is as large, and a step as cheap, at any depth.
    assert spaces[0] == spaces[1]


def _random_states(space, rng, *, walks=25, steps=6):
    """States reached by random walks over the space's actions (atom masks)."""
    states = []
    for _ in range(walks):
        atoms = space.initial_atoms
        for index in rng.integers(0, len(space), size=steps).tolist():
            following = space.step(atoms, int(index))
            if following is not None:
                atoms = following
        states.append(atoms)
    return states


def test_costing_by_atoms_equals_costing_every_name():
    """A search's states carry their atoms (``NamePartition``), and the cost model then computes bytes per
    class of values and kernels. On random states of the GPT step, every number equals the cost of the same
    masks without the partition (computed name by name), to the last bit."""
    import numpy as np

    analysis = analysis_of(GPT)
    rng = np.random.default_rng(3)
    for mesh in ("batch=2,model=4", "a=2,b=2,c=2"):
        model = ShardingModel(analysis, parse_mesh(mesh))
        space = ActionSpace(model, min_names=1)
        costs = toast.CostModel(model, A100)
        sharded = 0
        for atoms in _random_states(space, rng):
            by_atoms = space.state(atoms)
            by_names = toast.ShardingState(model.mesh, by_atoms.masks.copy(), ())
            assert by_atoms.partition is not None and by_names.partition is None
            assert np.array_equal(costs.communication.value_bytes(by_atoms), costs.communication.value_bytes(by_names))
            for ours, theirs in zip(costs.kernel_work(by_atoms), costs.kernel_work(by_names), strict=True):
                assert np.array_equal(ours, theirs)
            first, second = costs.evaluate(by_atoms), costs.evaluate(by_names)
            assert (first.step_time_s, first.peak_bytes, first.relative, first.breakdown, first.collectives) == (
                second.step_time_s, second.peak_bytes, second.relative, second.breakdown, second.collectives)
            sharded += bool(by_atoms.masks.any())
        assert sharded > 10


def test_a_search_state_is_costed_without_expanding_it_to_every_name(monkeypatch):
    """The search's states are built from their atoms' masks (``ShardingState.of_parts``): the cost model reads
    them per atom where it finds collectives per class (on programs of ``MIN_SITES`` use sites and more; the GPT
    step has fewer, so the bar is lowered), so costing one (without its collectives listed) leaves every name's
    mask unbuilt; read, the masks are each name's atom's, and the cost is the one of the same masks given name
    by name."""
    from toast.cost import class_table
    from toast.sharding.state import ShardingState

    monkeypatch.setattr(class_table, "MIN_SITES", 0)
    analysis = analysis_of(GPT)
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    space = ActionSpace(model)
    costs = toast.CostModel(model, A100)
    costs.prepare(space.partition)
    atoms = next(a for a in _random_states(space, np.random.default_rng(5)) if a.any())
    state = space.state(atoms)
    cost = costs.evaluate(state, collectives=False)
    with pytest.raises(AttributeError):
        ShardingState.masks.__get__(state)  # the slot is still unset: nothing read every name's mask
    assert np.array_equal(state.masks, atoms[space.partition.part_of_name])
    assert np.array_equal(state.part_masks(), atoms)
    by_names = costs.evaluate(toast.ShardingState(model.mesh, state.masks.copy(), ()), collectives=False)
    assert (cost.step_time_s, cost.peak_bytes) == (by_names.step_time_s, by_names.peak_bytes)


def test_an_action_dropped_from_the_space_is_invalid_everywhere():
    """Actions that change a pinned argument whatever the state are left out of the space: pinned whole, the
    tokens' names keep mask 0, and every dropped action would set a bit on one of them."""
    model = ShardingModel(analysis_of(GPT), parse_mesh("batch=2,model=4"))
    space = ActionSpace(model, min_names=1, pinned={"tokens": P(None, None)})
    assert space.dropped
    for action in space.dropped:
        state = model.initial()
        for single in action.as_actions():
            state = model.apply(state, single, check=False)
        assert state.masks[space.pin_names].any()
        assert action not in space.actions


def test_mirrored_classes_never_hold_two_dims_of_one_tensor():
    """A U-Net block's two norm scales are used alike (same shape, same ops) but scale different channel dims
    (the block's input and its first convolution's output), and the second convolution's kernel holds both.
    One class of both would be an action no state can take; the classes keep them apart, so Megatron's
    channel split (the first convolution's output channels along ``model``) is an action of the space."""
    from toast.search import mirror_classes
    from toast.search.actions import colors_sharing_a_tensor
    from toast.sharding.strategies import role_colors

    analysis = analysis_of("toast.examples.unet:unet_small")
    model = ShardingModel(analysis, parse_mesh("batch=2,model=2"))
    sharing = colors_sharing_a_tensor(model)
    for colors in mirror_classes(model):
        assert not any(sharing[c] & set(colors) for c in colors)
    space = ActionSpace(model, min_names=1)
    roles = toast.roles_for_input("toast.examples.unet:unet_small")
    channels = role_colors(analysis, roles, "mlp")
    taken = {c for action in space.actions if action.axis == "model" and not action.stored for c in action.colors}
    assert set(channels) <= taken


def test_a_stored_action_splits_the_parameters_not_the_activations():
    """A stored action (FSDP in the search's terms) splits a class's parameter dims and their update chains
    along its axis, and leaves the activations of the same colors whole: the batch may hold that axis."""
    analysis = analysis_of(GPT)
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    space = ActionSpace(model)
    program, names = analysis.program, analysis.names
    w_fc = next(v for v in program.arguments if program.values[v].name == "params['blocks'][0]['w_fc']")
    hidden = int(analysis.color_of[names.def_base[w_fc] + 1])
    stored = next(i for i, a in enumerate(space.actions) if a.stored and a.axis == "batch" and hidden in a.colors)
    state = space.apply(space.state(space.initial_atoms), stored)
    assert state is not None and not model.problem(state)
    assert state.masks[names.def_base[w_fc] + 1] == 1  # the parameter's hidden dim, along batch
    hidden_names = model.names_of_color(hidden)
    assert 0 < int(np.count_nonzero(state.masks[hidden_names])) < len(hidden_names)  # activations stay whole
    tokens = next(v for v in program.arguments if program.values[v].name == "tokens")
    batch_first = next(i for i, a in enumerate(space.actions) if not a.stored and a.axis == "batch"
                       and int(analysis.color_of[names.def_base[tokens]]) in a.colors)
    assert space.apply(state, batch_first) is not None  # the batch can still take the axis


def test_polish_undoes_an_action_that_holds_the_axis_the_batch_needs():
    """A committed trajectory that splits the MLP's hidden dim along ``batch`` leaves the tokens' batch dim no
    axis to take there (the activations hold both dims). The polish takes that action back, ends cheaper,
    and where it ends no single action lowers the cost. (On h200, whose measured NVLink rings are the
    fastest of the profiles: on A100 the gradient all-reduces of this small step are latency-bound enough
    that keeping the action and adding others is cheaper.)"""
    from toast.cost.model import CostModel
    from toast.search.mcts import _Memo, _polish, _replay

    fn, args = gpt_train_step(layers=1, batch=8, seq=128, d_model=512, heads=8, vocab=1024, d_ff=2048)
    analysis = toast.analyze("gpt", fn=fn, args=args, engine="embedded")
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    space = ActionSpace(model)
    costs = CostModel(model, load_hardware("h200"))
    costs.prepare(space.partition)
    memo = _Memo(costs, space)
    program, names = analysis.program, analysis.names
    w_fc = next(v for v in program.arguments if program.values[v].name == "params['blocks'][0]['w_fc']")
    tokens = next(v for v in program.arguments if program.values[v].name == "tokens")
    hidden = int(analysis.color_of[names.def_base[w_fc] + 1])
    blocking = next(i for i, a in enumerate(space.actions) if not a.stored and a.axis == "batch"
                    and hidden in a.colors)
    batch_first = next(i for i, a in enumerate(space.actions) if not a.stored and a.axis == "batch"
                       and int(analysis.color_of[names.def_base[tokens]]) in a.colors)
    start = _replay(space, [blocking])
    assert start is not None and space.step(start, batch_first) is None  # the batch is blocked
    score = memo.score(memo.key(start), "runtime")
    actions, polished, _ = _polish(space, memo, [blocking], keep=0, allowed=tuple(range(len(space))),
                                   goal="runtime", score=score, chunk=8, pool=None, deadline=None)
    assert polished < score and blocking not in actions
    final = _replay(space, actions)
    assert final is not None and polished == costs.evaluate(space.state(final)).relative
    for index in range(len(space)):
        following = space.step(final, index)
        if following is not None:
            assert costs.evaluate(space.state(following), collectives=False).relative >= polished


def test_same_seed_same_strategy_on_one_two_and_three_workers():
    analysis = analysis_of(GPT)
    strategies = []
    for workers in (1, 2, 3):
        found = _found(analysis, "batch=2,model=4", budget=Budget(seed=7, rollouts=96, workers=workers),
                       settings=MctsSettings(lanes=4, patience=10))
        strategies.append((strategy_document(found, source="test")["state"]["masks"], found.result.rollouts,
                           found.result.evaluations, found.result.cost.step_time_s))
    assert strategies[0] == strategies[1] == strategies[2]


def test_a_worker_scores_what_another_costed_without_costing_it_again(monkeypatch):
    """The polish's moves carry the states the previous round's workers costed (their step time and peak):
    a memo that learned them scores them as costing them would, under both goals, and costs nothing."""
    from toast.search.mcts import _Memo

    analysis = analysis_of(GPT)
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    space, costs = ActionSpace(model), toast.CostModel(model, A100, device_memory=0.5 * 2**30)
    costing = _Memo(costs, space)
    costing.sharing = True  # as a worker of the polish: it keeps what it costs, to send
    states = [space.initial_atoms] + [s for a in range(len(space.actions))
                                      if (s := space.step(space.initial_atoms, a)) is not None][:5]
    expected = [(costing.score(costing.key(s), "runtime"), costing.score(costing.key(s), "memory")) for s in states]
    learning = _Memo(costs, space)
    learning.learn(costing.take_fresh())
    monkeypatch.setattr(costs, "evaluate", None)  # costing a state would fail
    with learning.recording() as scored:
        found = [(learning.score(learning.key(s), "runtime"), learning.score(learning.key(s), "memory"))
                 for s in states]
    assert found == expected and len(scored) == len(states) == 6
    assert len(set(expected)) > 1  # states of different scores


def _gpt_descents():
    """The GPT step on batch=2,model=4 under a 0.5 GiB limit: its action space, cost model, and three descents from
    the start (the runtime goal, the memory goal, the runtime goal with the limit relaxed)."""
    from toast.search.mcts import _RefillTask

    analysis = analysis_of(GPT)
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    space, costs = ActionSpace(model), toast.CostModel(model, A100, device_memory=0.5 * 2**30)
    allowed = tuple(range(len(space)))
    tasks = [_RefillTask((), allowed, "runtime", None), _RefillTask((), allowed, "memory", None),
             _RefillTask((), allowed, "runtime", None, penalties=(0.25, 4.0))]
    return space, costs, tasks


def test_a_memo_costs_a_state_from_the_rows_it_priced_while_it_keeps_them(monkeypatch):
    """The rows of the last ``ROWS_KEPT`` states priced are kept: a state priced several states before is costed
    from them (the same cost as from scratch, and nothing priced again); one priced ``ROWS_KEPT`` states before its
    costing is priced again."""
    from toast.search import mcts

    space, costs, _ = _gpt_descents()
    monkeypatch.setattr(mcts, "ROWS_KEPT", 3)
    memo = mcts._Memo(costs, space)
    states = [s for a in range(len(space.actions)) if (s := space.step(space.initial_atoms, a)) is not None][:5]
    keys = [memo.key(s) for s in states]
    expected = [costs.evaluate(space.state(s), collectives=False) for s in states]
    for key in keys[:3]:
        memo._bound(key)
    evaluate = costs.evaluate
    monkeypatch.setattr(costs, "evaluate", None)  # costing from scratch would fail
    assert memo.cost_of(keys[0]) == expected[0]
    for key in keys[3:]:
        memo._bound(key)  # three kept: keys[1], the least recent, is dropped
    assert memo.cost_of(keys[2]) == expected[2]
    with pytest.raises(TypeError):
        memo.cost_of(keys[1])
    monkeypatch.setattr(costs, "evaluate", evaluate)
    assert memo.cost_of(keys[1]) == expected[1]


def test_a_worker_prices_no_state_another_priced_through_the_shared_table(monkeypatch):
    """Two memos on one ``SharedStates`` table (as two forked workers): the second's descents take the same steps
    as the first's, and price none of the states the first costed or bounded; without the table it prices them
    again."""
    import multiprocessing

    from toast.search.mcts import _Memo, _refill
    from toast.search.shared_states import SharedStates

    space, costs, tasks = _gpt_descents()
    priced: list[str] = []
    for name in ("evaluate", "priced_rows"):
        original = getattr(costs, name)
        monkeypatch.setattr(costs, name, lambda *args, _original=original, **kwargs: priced.append("x") or
                            _original(*args, **kwargs))
    table = SharedStates(context=multiprocessing.get_context("fork"))
    first = _Memo(costs, space)
    first.shared = table
    found = [_refill(space, first, task) for task in tasks]
    assert priced and len(table) > 0
    del priced[:]
    second = _Memo(costs, space)
    second.shared = table
    assert [_refill(space, second, task) for task in tasks] == found
    assert priced == []
    alone = [_refill(space, _Memo(costs, space), task) for task in tasks]
    assert alone == found and priced


def test_a_descent_step_costs_only_the_moves_that_could_be_best(monkeypatch):
    """A descent's step (``_Memo.best_step``) takes the move of least score, as scoring every move would, under the
    limit, a relaxed limit and the memory goal, and records every move as scored; but moves whose lower bound
    (``CostModel.step_time_bound``) is worse than a move costed are not costed in full."""
    from toast.search.mcts import _Memo, _refill

    space, costs, tasks = _gpt_descents()
    costed: list[str] = []

    def counting(original):
        return lambda *args, **kwargs: costed.append("x") or original(*args, **kwargs)

    for name in ("evaluate", "evaluate_rows"):
        monkeypatch.setattr(costs, name, counting(getattr(costs, name)))
    bounding = [_refill(space, _Memo(costs, space), task) for task in tasks]
    costed_bounding = len(costed)
    monkeypatch.setattr(_Memo, "best_step", lambda self, following, goal, penalty: min(
        (self.penalized(key, goal, penalty), action) for action, key in following))
    del costed[:]
    scoring_each = [_refill(space, _Memo(costs, space), task) for task in tasks]
    assert bounding == scoring_each
    assert all(len(actions) >= 2 for _, actions, _, _ in bounding)
    assert costed_bounding < len(costed)  # some moves were only bounded


def test_a_search_that_bounds_states_finds_what_costing_each_finds(monkeypatch):
    """The search asks whether a rollout's state fits from its peak alone (``_Memo.fits``: a floor of the peak, or
    the state priced up to its schedule, not scheduled) and bounds descents' moves (``_Memo.best_step``): the same
    result, states scored and step time as costing every state it asks about, with fewer states costed in full."""
    from toast.search.exhaustive import OVER_MEMORY
    from toast.search.mcts import _Memo

    analysis = analysis_of(GPT)
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    # A limit at 30% of the unsharded peak (973,060 bytes): below the arguments of many states the rollouts pass.
    space, costs = ActionSpace(model), toast.CostModel(model, A100, device_memory=0.3 * 973_060)
    assert costs.initial.peak_bytes == 973_060
    floors_over: list[int] = []
    monkeypatch.setattr(costs, "peak_floor", lambda state, _f=costs.peak_floor: floors_over.append(
        _f(state) > costs.device_memory) or _f(state))
    scheduled: list[str] = []
    monkeypatch.setattr(toast.cost.model, "scheduled_cost",
                        lambda *a, _f=toast.cost.model.scheduled_cost, **k: scheduled.append("x") or _f(*a, **k))
    budget, settings = Budget(rollouts=120, workers=1), MctsSettings(patience=20)
    bounding = search(space, costs, budget=budget, settings=settings)
    scheduled_bounding = len(scheduled)
    monkeypatch.setattr(_Memo, "fits", lambda self, key: self.score(key, "runtime") < OVER_MEMORY)
    monkeypatch.setattr(_Memo, "best_step", lambda self, following, goal, penalty: min(
        (self.penalized(key, goal, penalty), action) for action, key in following))
    del scheduled[:]
    costing = search(space, costs, budget=budget, settings=settings)
    assert (bounding.actions, bounding.evaluations, bounding.rollouts, bounding.cost) == \
        (costing.actions, costing.evaluations, costing.rollouts, costing.cost)
    # Costing each schedules each state scored once (and the result's once more, listing its collectives).
    assert len(scheduled) == costing.evaluations + 1
    assert scheduled_bounding < len(scheduled)
    assert any(floors_over)  # states left at the floor of their peak


def test_the_rollout_budget_is_spent_unless_the_space_is_exhausted():
    """``rollouts=N`` runs N rollouts on a space bigger than N states, however little the lanes improve
    (``patience`` restarts them instead of stopping); on the MLP's 9 states the search stops once it has
    scored all of them, with the best."""
    analysis = analysis_of(GPT)
    found = _found(analysis, "batch=2,model=4", settings=MctsSettings(patience=5))
    assert found.result.rollouts == 300
    mlp_analysis = analysis_of(MLP)
    model = ShardingModel(mlp_analysis, parse_mesh("batch=4,model=2"))
    space = ActionSpace(model)
    costs = toast.CostModel(model, load_hardware("h100"))
    result = search(space, costs, budget=Budget(rollouts=2000, workers=1), settings=MctsSettings(polish=False))
    states = enumerate_states(space, costs)
    assert len(states) == 9 and 9 <= result.rollouts < 2000
    best = states.optimum(costs.device_memory)
    assert best is not None
    assert result.cost.step_time_s == pytest.approx(float(states.step_time_s[best]))


def test_a_polish_descent_stops_at_its_limit():
    """The polish's descents (``_refill``) score every allowed action at each step; one with a limit takes no
    step past it (the first step always), so a polish move in a big action space cannot overrun the budget.
    From the unsharded state, gpt_small's greedy descent takes several steps; limited to one step's worth of
    states, it takes one."""
    from toast.search.mcts import _Memo, _refill, _RefillTask

    analysis = analysis_of(GPT)
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    space = ActionSpace(model)
    memo = _Memo(toast.CostModel(model, load_hardware("h100")), space)
    allowed = tuple(range(len(space)))
    _, free_actions, _, free_scored = _refill(space, memo, _RefillTask((), allowed, "runtime", None))
    _, one_step, _, scored = _refill(space, memo, _RefillTask((), allowed, "runtime", None, limit=len(allowed) + 1))
    assert len(free_actions) >= 2 and free_scored > len(allowed) + 1
    assert one_step == free_actions[:1] and scored <= len(allowed) + 1


def _action_on(space, analysis, argument, dim, axis):
    """The index of the (not stored) action that splits ``argument``'s dim ``dim`` along ``axis``."""
    program, names = analysis.program, analysis.names
    value = next(v for v in program.arguments if program.values[v].name == argument)
    color = int(analysis.color_of[names.def_base[value] + dim])
    return next(i for i, a in enumerate(space.actions) if not a.stored and a.axis == axis and color in a.colors)


def test_a_relaxed_descent_that_ends_over_the_limit_descends_again_under_it(big_mlp):
    """With 300 MiB per device, 8-way data parallelism does not fit (``test_mlp_finds_batch_and_megatron``). A
    descent that relaxes the limit first (a small penalty per byte over it) takes the batch on both axes, the
    fastest steps, and ends there: no action is left (the hidden dim has no axis the batch does not hold), so no
    penalty brings it under the limit. The descent is then made again under the limit itself, and ends where
    the state fits, where the plain descent ends."""
    from toast.search.mcts import LIMIT_PENALTIES, OVER_MEMORY, _Memo, _refill, _RefillTask, _stages

    model = ShardingModel(big_mlp, parse_mesh("batch=4,model=2"))
    space = ActionSpace(model)
    memo = _Memo(toast.CostModel(model, A100, device_memory=300 * MiB), space)
    allowed = tuple(range(len(space)))
    task = _RefillTask((), allowed, "runtime", None, penalties=LIMIT_PENALTIES)
    key, relaxed_only, _ = _stages(memo, task, memo.key(space.initial_atoms), LIMIT_PENALTIES, 1)
    data_parallel = {_action_on(space, big_mlp, "x", 0, "batch"), _action_on(space, big_mlp, "x", 0, "model")}
    assert set(relaxed_only) == data_parallel and memo.score(key, "runtime") >= OVER_MEMORY
    relaxed = _refill(space, memo, task)
    plain = _refill(space, memo, _RefillTask((), allowed, "runtime", None))
    assert relaxed[0] < OVER_MEMORY and relaxed[:2] == plain[:2]


def test_candidates_that_trim_to_one_state_are_polished_once(big_mlp, monkeypatch):
    """Two lanes' best trajectories, batch then Megatron and Megatron then batch, are one state: the polish
    (its budget shared by its candidates) works on it once, with the whole budget."""
    from toast.search import mcts

    model = ShardingModel(big_mlp, parse_mesh("batch=4,model=2"))
    space = ActionSpace(model)
    memo = mcts._Memo(toast.CostModel(model, A100, device_memory=300 * MiB), space)
    batch, megatron = _action_on(space, big_mlp, "x", 0, "batch"), _action_on(space, big_mlp, "w1", 1, "model")
    state = mcts._replay(space, [batch, megatron])
    assert state is not None and mcts._replay(space, [megatron, batch]) is not None
    score = memo.score(memo.key(state), "runtime")
    found = [mcts._LaneResult(score, (batch, megatron), 10, frozenset(), False),
             mcts._LaneResult(score, (megatron, batch), 10, frozenset(), False)]
    budgets = []

    def polish(*args, budget, **kwargs):
        budgets.append(budget)
        return list(args[2]), kwargs["score"], 0

    monkeypatch.setattr(mcts, "_polish", polish)
    settings = MctsSettings(kicks=0)
    mcts._refine(space, memo, settings, found, [], 1.0, toast.Phase(), allowed=tuple(range(len(space))), keep=0,
                 budget=10, deadline=None, pool=None)
    assert budgets == [settings.polish_budget * 10]


def test_a_polish_stops_where_an_earlier_one_went_on():
    """Polished twice from one start, the second polish stops at the first state the first one moved to (the
    rest of the way is the first one's), so it scores fewer states."""
    from toast.cost.model import CostModel
    from toast.search.mcts import _Memo, _polish, _replay

    fn, args = gpt_train_step(layers=1, batch=8, seq=128, d_model=512, heads=8, vocab=1024, d_ff=2048)
    analysis = toast.analyze("gpt", fn=fn, args=args, engine="embedded")
    model = ShardingModel(analysis, parse_mesh("batch=2,model=4"))
    space = ActionSpace(model)
    memo = _Memo(CostModel(model, load_hardware("h200")), space)
    start = [_action_on(space, analysis, "params['blocks'][0]['w_fc']", 1, "batch")]
    atoms = _replay(space, start)
    assert atoms is not None
    score = memo.score(memo.key(atoms), "runtime")
    reached: set[bytes] = set()
    kwargs = dict(keep=0, allowed=tuple(range(len(space))), goal="runtime", score=score, chunk=8, pool=None,
                  deadline=None, reached=reached)
    first, first_score, first_scored = _polish(space, memo, list(start), **kwargs)
    assert first_score < score and len(reached) >= 2  # it moved more than once
    second, second_score, second_scored = _polish(space, memo, list(start), **kwargs)
    assert first_score <= second_score < score and second_scored < first_scored
    atoms = _replay(space, second)
    assert atoms is not None and memo.key(atoms) in reached


@pytest.mark.slow
def test_a_kick_leaves_the_basin_where_the_edges_hold_the_model_axis():
    """gns_small at batch=4,model=2, with two thirds of data parallelism's peak per device (the edges split
    8 ways do not fit, so parameters must be stored split). Splitting the edges (the roles' batch: senders,
    receivers, edge features) on ``model`` and descending leads the polish to a state it cannot leave: it keeps
    the edges on ``model`` and stores the parameters that then do not fit (BENCHMARKS.md, issue 22's third
    session: leaving it takes four coordinated changes). A kick, the ``model`` axis's actions removed and
    rebuilt by a descent that relaxes the limit first, reaches a faster state, where the edges are not on
    ``model``."""
    from toast.examples import EXAMPLES
    from toast.search.mcts import _kick, _Memo, _polish, _refill, _RefillTask
    from toast.sharding import roles_for_input
    from toast.sharding.strategies import manual_strategy

    analysis = analysis_of("toast.examples.gns:gns_small")
    model = ShardingModel(analysis, parse_mesh("batch=4,model=2"))
    space = ActionSpace(model)
    h100 = load_hardware("h100")
    data_parallel, _ = manual_strategy(model, "data_parallel", roles_for_input(EXAMPLES["gns_small"]))
    limit = 2 / 3 * toast.CostModel(model, h100).evaluate(data_parallel, collectives=False).peak_bytes
    memo = _Memo(toast.CostModel(model, h100, device_memory=limit), space)
    allowed = tuple(range(len(space)))
    edges = _action_on(space, analysis, "senders", 0, "model")
    score, descended, _, _ = _refill(space, memo, _RefillTask((edges,), allowed, "runtime", None))
    stuck, stuck_score, _ = _polish(space, memo, list(descended), keep=0, allowed=allowed, goal="runtime",
                                    score=score, chunk=8, pool=None, deadline=None, swaps=True)
    assert edges in stuck and stuck_score < 2  # it fits
    refined = [(stuck_score, len(stuck), stuck)]
    _kick(space, memo, MctsSettings(), refined, toast.Phase(), allowed=allowed, keep=0, total=20_000, spent=0,
          deadline=None, pool=None, reached=set())
    kicked_score, _, kicked = min(refined)
    assert kicked_score < stuck_score and edges not in kicked


def test_pins_are_kept():
    """Pin the tokens' sequence dim to ``model`` and their batch dim whole (as a data loader might hand them
    over); the result keeps both, whatever else it shards."""
    analysis = analysis_of(GPT)
    pins = {"tokens": P(None, "model")}
    found = _found(analysis, "batch=2,model=4", pinned=pins)
    specs = _specs(found)
    assert specs["tokens"] == [None, "model"]
    assert specs["targets"] == [None, "model"]  # the same colors as the tokens' dims
    assert found.result.rollouts > 0  # it searched on from the pins


def test_contradictory_pins_name_both():
    analysis = analysis_of(GPT)
    with pytest.raises(ToastError, match=r"contradictory pins: targets dim 0 and tokens dim 0|contradictory pins: "
                                         r"tokens dim 0 and targets dim 0"):
        _found(analysis, "batch=2,model=4", pinned={"tokens": ("batch", None), "targets": ("model", None)})


def test_pin_text():
    assert parse_pins("tokens=batch,") == {"tokens": ("batch", None)}
    assert parse_pins("x=batch+model,;w=,model") == {"x": (("batch", "model"), None), "w": (None, "model")}


@pytest.mark.parametrize("spec, mesh", [
    ("toast.examples.mlp:mlp", "batch=4,model=2"),
    ("toast.examples.attention:attention", "seq=8"),
    pytest.param(GPT, "batch=2,model=4", marks=pytest.mark.slow),  # 16 s
])
def test_found_strategies_agree_with_xla(spec, mesh):
    """What the search returns runs under XLA on 8 host devices with the unsharded program's numerics."""
    analysis = analysis_of(spec)
    found = _found(analysis, mesh, budget=Budget(rollouts=200, workers=1))
    agreement = validate(found.model, found.result.state, A100)
    assert agreement.numerics.match, agreement.numerics


def test_python_api_round_trip(tmp_path):
    fn, args = mlp()
    strategy = toast.autoshard(fn, *args, mesh="batch=4,model=2", hardware="a100_80gb", seed=3, rollouts=100)
    assert set(strategy.partition_specs) == {"x", "w1", "w2"}
    assert strategy.document["search"]["seed"] == 3
    assert strategy.cost["step_time_s"] > 0 and strategy.cost["peak_bytes"] > 0
    path = tmp_path / "mlp.json"
    strategy.save(path)
    loaded = toast.load_strategy(path)
    assert loaded.document == strategy.document
    assert loaded.partition_specs == strategy.partition_specs


def test_python_api_takes_rules_and_a_variant(tmp_path):
    """``toast.autoshard(..., variant=, rules=)`` analyzes as ``toast analyze --variant --rules`` does: the file
    records the variant, and a rules folder's own file is read (a broken one is its one-line error)."""
    fn, args = mlp()
    strategy = toast.autoshard(fn, *args, mesh="batch=8", rollouts=10, engine="embedded", variant="no_box")
    assert strategy.document["variant"] == "no_box"
    rules = tmp_path / "my_rules"
    rules.mkdir()
    (rules / "broken.dl").write_text("this is not datalog\n")
    with pytest.raises(ToastError, match="broken.dl"):
        toast.autoshard(fn, *args, mesh="batch=8", rollouts=10, engine="embedded", rules=rules)


# ---- toast autoshard ----------------------------------------------------------------------------------------


def test_autoshard_command_writes_the_strategy_and_the_table(tmp_path, capsys):
    out = tmp_path / "mlp.json"
    assert main(["autoshard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "--rollouts", "100", "--workers", "1", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| toast |" in printed and "| megatron |" in printed and "| data_parallel |" in printed
    document = toast.load_strategy(out).document
    # The MLP's 9 states are all scored in fewer than 100 rollouts (then the search stops).
    assert 9 <= document["search"]["rollouts"] < 100 and document["search"]["over_memory"] is False
    assert main(["cost", "toast.examples.mlp:mlp", "--hardware", "a100_80gb", "--strategy", str(out),
                 "--engine", "embedded"]) == 0
    assert main(["validate", "toast.examples.mlp:mlp", str(out), "--engine", "embedded", "--devices", "8"]) == 0
    assert "numerics: match" in capsys.readouterr().out


APPLY_SCRIPT = '''
import json, sys
import jax, numpy as np
import toast
from toast.examples.mlp import mlp
fn, args = mlp()
strategy = toast.autoshard(fn, *args, mesh="batch=4,model=2", seed=0, rollouts=60, engine="embedded")
sharded = strategy.apply(fn)
rng = np.random.default_rng(0)
real = [rng.standard_normal(a.shape).astype(np.float32) for a in args]
out = sharded(*real)
print(json.dumps({"close": bool(np.allclose(out, jax.jit(fn)(*real), rtol=1e-4, atol=1e-3)),
                  "devices": len(out.sharding.device_set),
                  "x": [e if not isinstance(e, tuple) else list(e) for e in strategy.partition_specs["x"]]}))
'''


def test_strategy_apply_runs_with_jax():
    """``Strategy.apply(fn)`` is ``jax.jit`` with the strategy's shardings: it runs on 8 host devices and gives
    the unsharded function's result."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", APPLY_SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["close"] and result["devices"] == 8
    assert result["x"][0] is not None  # the batch dim is split (the MLP's only worthwhile choice)


def test_autoshard_over_memory_is_flagged(tmp_path, capsys):
    out = tmp_path / "mlp.json"
    code = main(["autoshard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "--rollouts", "50", "--workers", "1", "--memory", "0.000001", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 3
    assert "no strategy found fits" in err and "Traceback" not in err
    # 0.000001 GiB is 1073 bytes; the MLP's unsharded peak split over 8 devices is more: nothing can fit.
    assert "no sharding over 8 devices can fit" in err
    document = json.loads(out.read_text())
    assert document["search"]["over_memory"] is True and document["search"]["floor_bytes"] > 1073


def test_patience_and_restarts_options_reach_the_search(tmp_path):
    out = tmp_path / "mlp.json"
    code = main(["autoshard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "--rollouts", "40", "--patience", "7", "--restarts", "2", "--workers", "1", "-o", str(out)])
    assert code == 0
    recorded = json.loads(out.read_text())["search"]
    assert (recorded["settings"]["patience"], recorded["settings"]["restarts"], recorded["budget"]["rollouts"]) == (
        7, 2, 40)


def test_memory_is_a_constraint_the_result_honours():
    """The attention at batch=4,model=2 has 25 states (enumerated and costed independently of the search).
    Under a limit halfway between the smallest peak of any state and the peak of the fastest, the fastest does
    not fit; the search returns the fastest state that does, however much faster an over-limit state is."""
    model = ShardingModel(analysis_of("toast.examples.attention:attention"), parse_mesh("batch=4,model=2"))
    space = ActionSpace(model)
    states = enumerate_states(space, toast.CostModel(model, A100))
    fastest = states.optimum(float(A100.hbm_bytes))
    assert fastest is not None
    limit = (float(states.peak_bytes.min()) + float(states.peak_bytes[fastest])) / 2
    best = states.optimum(limit)
    assert best is not None and states.step_time_s[best] > states.step_time_s[fastest]
    costs = toast.CostModel(model, A100, device_memory=limit)
    result = search(space, costs, budget=Budget(rollouts=100, workers=1))
    assert result.cost.peak_bytes <= limit
    assert result.cost.step_time_s == pytest.approx(float(states.step_time_s[best]))


def test_a_manual_strategy_that_beats_the_search_is_returned(big_mlp):
    """With one rollout and no polish the search cannot find batch + Megatron; with the roles, the manual
    strategies are candidates and the best of them (priced by ``compare_manual``) is what comes back."""
    roles = toast.roles_for_input(MLP)
    budget = Budget(rollouts=1, workers=1)
    mesh = parse_mesh("batch=4,model=2")
    alone = find_strategy(big_mlp, mesh, A100, budget=budget, settings=CRIPPLED, manual_candidates=False)
    found = find_strategy(big_mlp, mesh, A100, budget=budget, settings=CRIPPLED, roles=roles)
    manual = [row for row in compare_manual(found, roles) if row.cost is not None and not row.over_memory]
    fastest = min(manual, key=lambda row: row.cost.step_time_s)
    assert fastest.cost.step_time_s < alone.result.cost.step_time_s
    assert found.origin == fastest.name and strategy_document(found, source="test")["search"]["origin"] == fastest.name
    assert found.result.cost.step_time_s == fastest.cost.step_time_s and found.result.actions == ()


def test_the_manual_strategies_are_priced_once(big_mlp, monkeypatch):
    """``compare_manual`` gives the rows the search weighed (autoshard and compare print them) without pricing
    them again: the same costs as pricing them afresh."""
    import importlib

    from toast.search.find import price_manual_strategies

    compare = importlib.import_module("toast.evaluation.compare")  # the package's `compare` is the function

    roles = toast.roles_for_input(MLP)
    found = find_strategy(big_mlp, parse_mesh("batch=4,model=2"), A100, roles=roles,
                          budget=Budget(rollouts=1, workers=1), settings=CRIPPLED)
    afresh = price_manual_strategies(found.model, found.costs, found.roles)
    monkeypatch.setattr(compare, "price_manual_strategies", None)  # calling it again would fail
    rows = compare_manual(found)
    assert [(row.name, row.cost, row.reason) for row in rows] == [(row.name, row.cost, row.reason) for row in afresh]
    assert sum(row.cost is not None for row in rows) >= 2


def test_without_roles_the_proposed_roles_give_the_manual_candidates(big_mlp):
    """No roles given: the roles proposed from the analysis (x:0 batch, w1:1 mlp) make Megatron a candidate,
    so a crippled search still returns batch + Megatron, the Figure 2c sharding."""
    from toast.sharding.propose import PROPOSED_SOURCE

    found = find_strategy(big_mlp, parse_mesh("batch=4,model=2"), A100, budget=Budget(rollouts=1, workers=1),
                          settings=CRIPPLED, memory_gib=300 / 1024)
    assert found.roles is not None and found.roles.source == PROPOSED_SOURCE
    assert found.origin != "search" and not found.over_memory
    assert _specs(found) == {"x": ["batch", None], "w1": [None, "model"], "w2": ["model", None]}


@pytest.mark.parametrize("extra, message", [
    (["--budget", "0"], "argument --budget: '0': give a finite number of seconds above 0"),
    (["--rollouts", "0"], "argument --rollouts: 0: give 1 or more rollouts"),
    (["--patience", "0"], "argument --patience: 0: give 1 or more rollouts"),
    (["--restarts", "-1"], "argument --restarts: -1: give 0 or more restarts"),
    (["--roles", "missing.roles.toml"], "missing.roles.toml: no such roles file"),
    (["--memory", "-1"], "argument --memory: '-1': give the memory per device in GiB"),
    (["--pin", "x=nope,"], "nope"),
    (["--pin", "x"], "expected NAME=AXES"),
    (["--pin", "nothing=batch,"], "pin 'nothing': no such argument"),
    (["--pin", "x=batch,;w1=,batch"], "the pins make an invalid sharding: %0: one mesh axis shards two of its dims"),
    (["--pin", "x=batch,;w1=,model"], None),  # valid: Figure 2c
])
def test_autoshard_bad_input(extra, message, tmp_path, capsys):
    out = tmp_path / "s.json"
    code = main(["autoshard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "--workers", "1", "-o", str(out)] + (extra if "--rollouts" in extra or "--budget" in extra
                                                       else extra + ["--rollouts", "20"]))
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
        return
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_incremental_validity_agrees_with_the_full_check():
    """``ActionSpace.apply`` checks only what an action touches; ``ShardingModel.problem`` checks everything.
    On random walks over the GPT step's actions (both meshes), they agree on every step."""
    import numpy as np

    analysis = analysis_of(GPT)
    rng = np.random.default_rng(0)
    for mesh in ("batch=2,model=4", "a=2,b=2,c=2"):
        model = ShardingModel(analysis, parse_mesh(mesh))
        space = ActionSpace(model, min_names=1)
        checked = invalid = 0
        for _ in range(30):
            state = space.initial
            for index in rng.permutation(len(space))[:8].tolist():
                names = space.names(index)
                bit = np.uint8(1 << model.mesh.index(space.actions[index].axis))
                if np.all(state.masks[names] & bit):
                    continue
                masks = state.masks.copy()
                masks[names] |= bit
                full = model.problem(toast.ShardingState(model.mesh, masks, ()))
                following = space.apply(state, index)
                assert (following is None) == bool(full), (mesh, index, full)
                checked += 1
                invalid += following is None
                if following is not None:
                    state = following
        assert checked > 50 and 0 < invalid < checked


def test_three_axis_mesh():
    """A 3-axis mesh on the GPT step at GPT-2-small widths (2 layers): the search shards along more than one
    axis and beats the unsharded step."""
    fn, args = gpt_train_step(layers=2)
    analysis = toast.analyze("gpt", fn=fn, args=args, engine="embedded")
    found = _found(analysis, "data=2,seq=2,model=2")
    axes_used = {action.axis for action in found.result.actions}
    assert len(axes_used) >= 2, found.result.actions
    assert found.result.cost.relative < 1.0
    assert found.model.problem(found.result.state) == ""


def test_phases_search_one_axis_for_memory_then_one_for_runtime(big_mlp):
    """PartIR's composite strategies: ``model`` first, for memory (it shards the weights: the MLP's biggest
    buffers), then ``batch`` for runtime. Each phase only takes actions on its own axes."""
    from toast.search import Phase

    budget = Budget(rollouts=400, workers=1, phases=(Phase(("model",), "memory"), Phase(("batch",))))
    found = _found(big_mlp, "batch=4,model=2", budget=budget)
    axes = [action.axis for action in found.result.actions]
    assert axes and axes == sorted(axes, key=lambda a: a != "model"), axes  # model actions first, then batch
    assert {r.phase for r in found.result.rounds} == {0, 1}
    specs = _specs(found)
    assert "model" in (specs["w1"] + specs["w2"])  # the weights are split along model
    whole = found.costs.evaluate(found.model.initial()).peak_bytes
    assert found.result.cost.peak_bytes < whole / 2


def test_phase_option(tmp_path, capsys):
    assert main(["autoshard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "--rollouts", "60", "--workers", "1", "--phase", "model:memory", "--phase", "batch:runtime",
                 "-o", str(tmp_path / "s.json")]) == 0
    document = json.loads((tmp_path / "s.json").read_text())
    assert document["search"]["budget"]["phases"] == [{"axes": ["model"], "goal": "memory"},
                                                      {"axes": ["batch"], "goal": "runtime"}]
    assert main(["autoshard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "--phase", "model:speed"]) == 2
    assert "--phase model:speed: expected AXES:GOAL" in capsys.readouterr().err


def test_find_strategy_runs_any_search_that_keeps_the_contract():
    """``find_strategy(..., search=)`` takes any ``Search``: here one that keeps the space's initial state.
    With no manual candidates its state is what comes back, and the strategy document records it (its name and
    settings); with the manual strategies as candidates, the MLP's best one beats it (the unsharded MLP is the
    slowest)."""
    calls = []

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class KeepSettings:
        note: str = "kept"

    def keep_initial(space, costs, *, budget, settings, progress=None):
        calls.append((budget.seed, settings.note))
        state = space.initial
        return SearchResult(state, (), costs.evaluate(state), (), 0, 1, 0.0, budget, "keep", settings)

    keep = Search("keep", KeepSettings, keep_initial)
    analysis = analysis_of(MLP)
    budget = Budget(seed=5, rollouts=10, workers=1)
    alone = find_strategy(analysis, parse_mesh("batch=4,model=2"), A100, budget=budget,
                          manual_candidates=False, search=keep)
    assert calls == [(5, "kept")] and alone.origin == "search" and alone.result.actions == ()
    assert alone.result.cost.relative == pytest.approx(1.0)  # the unsharded program's own cost
    document = strategy_document(alone, source="test")
    assert all(entry is None for tensor in document["arguments"] for entry in tensor["partition_spec"])
    assert (document["search"]["algorithm"], document["search"]["settings"]) == ("keep", {"note": "kept"})
    found = find_strategy(analysis, parse_mesh("batch=4,model=2"), A100, budget=budget,
                          roles=toast.roles_for_input(MLP), search=keep)
    assert found.origin != "search" and found.result.cost.step_time_s < alone.result.cost.step_time_s


@pytest.mark.parametrize("kind, knobs, message", [
    (Budget, {"rollouts": 0}, "a rollout budget of 0: give at least 1"),
    (Budget, {"rollouts": None, "seconds": 0.0}, "a time budget of 0 s: give more than 0 seconds"),
    (Budget, {"rollouts": None, "seconds": float("nan")}, "a time budget of nan s"),
    (Budget, {"rollouts": None}, "no budget: give a number of rollouts or seconds"),
    (MctsSettings, {"lanes": 0}, "lanes and patience must be at least 1"),
    (MctsSettings, {"kicks": -1}, "kicks -1: give 0 or more"),
    (MctsSettings, {"kick_share": 1.0}, "kick share 1: give at least 0 and less than 1"),
    (Budget, {"seed": -1}, "seed -1 and workers 0: give 0 or more"),
    (Budget, {"phases": ()}, "no phase"),
    (Budget, {"phases": (toast.Phase(goal="speed"),)}, "search phase goal 'speed': expected 'runtime' or 'memory'"),
])
def test_budget_and_settings_check_their_knobs_when_made(kind, knobs, message):
    """One place checks the search's knobs: ``Budget`` and each search's settings themselves, for the API, the
    CLI and sweeps alike (before, a zero budget reached the search and a NaN time budget passed)."""
    with pytest.raises(ToastError, match=re.escape(message)):
        kind(**knobs)
