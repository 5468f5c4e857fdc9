"""Expert strategies as one declaration each (``toast.sharding.strategies.EXPERT_STRATEGIES``, issue 38 item 3).

Each new row of the table on a small program, its PartitionSpecs worked out by hand from the shapes: a GPT
step (``tokens [8, 16]``, ``wte [128, 64]``, ``w_fc [64, 256]`` whose dim 1 is the MLP hidden dim, ``wq [64,
64]`` whose dim 1 holds the 4 heads) on 2- and 3-axis meshes, MaxText's rules on a MaxText-named mesh, expert
parallelism on benchmarks/programs/moe at its default size (``w_in [E=4, D=64, F=128]``, ``inputs [8, 32]``).
FSDP stores a parameter on its largest dim that the color actions left whole and the storage axes divide
(``fsdp_actions``). A strategy that cannot place its roles on a mesh does not apply, with a reason; toast's
gain over the best expert strategy and over FSDP over all devices is their step time over toast's.
"""

from __future__ import annotations

import functools
import re

import pytest

import toast
from toast.cli import main
from toast.cost.model import Cost
from toast.errors import ToastError
from toast.evaluation.compare import StrategyRow, gains, gains_line
from toast.examples.gpt import gpt_train_step
from toast.search.find import price_manual_strategies
from toast.sharding.roles import Roles, load_roles, roles_for_input
from toast.sharding.strategies import (
    COMPOSITES,
    EXPERT_STRATEGIES,
    STRATEGIES,
    STRATEGY_NAMES,
    expert_strategy,
    manual_strategy,
    placed_axes,
)

GPT_ROLES = roles_for_input("toast.examples.gpt:gpt_train_step")  # batch, sequence, heads, mlp
MOE = "benchmarks.programs.moe:moe"
WTE, W_FC, WQ = "params['wte']", "params['blocks'][0]['w_fc']", "params['blocks'][0]['wq']"
W_IN, W_OUT = "params['blocks'][0]['w_in']", "params['blocks'][0]['w_out']"


@functools.cache
def gpt():
    fn, args = gpt_train_step(layers=1, batch=8, seq=16, d_model=64, heads=4, vocab=128, d_ff=256)
    return toast.analyze("toast.examples.gpt:gpt_train_step", fn=fn, args=args, engine="embedded")


@functools.cache
def moe():
    return toast.analyze(MOE, engine="embedded")


def specs(analysis, mesh: str, strategy: str, roles: Roles, names: tuple[str, ...]) -> dict[str, tuple]:
    """PartitionSpec entries of arguments ``names`` under ``strategy`` on ``mesh``."""
    model = toast.ShardingModel(analysis, toast.parse_mesh(mesh))
    state, _ = manual_strategy(model, strategy, roles)
    assert model.problem(state) == ""
    program = analysis.program
    return {program.values[v].name: model.partition_spec(state, v) for v in program.arguments
            if program.values[v].name in names}


# --- the table ------------------------------------------------------------------------------------------------------


def test_one_table_keeps_the_papers_names():
    assert STRATEGY_NAMES == tuple(s.name for s in EXPERT_STRATEGIES) and len(set(STRATEGY_NAMES)) == 13
    assert STRATEGIES == ("data_parallel", "megatron", "fsdp", "sequence")
    assert COMPOSITES == ("fsdp+megatron", "fsdp+sequence", "megatron+sequence", "fsdp+megatron+sequence")
    assert {"data_parallel_all", "fsdp_all", "fsdp_data_axes+megatron", "maxtext", "expert_parallel"} < set(
        STRATEGY_NAMES)
    assert expert_strategy("sequence + megatron+fsdp").name == "fsdp+megatron+sequence"
    assert expert_strategy("megatron+fsdp_data_axes").name == "fsdp_data_axes+megatron"
    with pytest.raises(ToastError, match=r"^unknown strategy 'fsdp_al' \(known: data_parallel, .*fsdp_all, "
                                         r"fsdp_data_axes\+megatron, maxtext, expert_parallel;"):
        expert_strategy("fsdp_al")


# --- the batch and FSDP over several axes ---------------------------------------------------------------------------


@pytest.mark.parametrize("mesh, strategy, expected", [
    # 4 devices: the tokens' batch (8) over both axes; w_fc stored on its largest dim (256), wte on its (128).
    ("batch=2,model=2", "data_parallel_all", {"tokens": (("batch", "model"), None), W_FC: (None, None)}),
    ("batch=2,model=2", "fsdp_all", {"tokens": (("batch", "model"), None), W_FC: (None, ("batch", "model")),
                                     WTE: (("batch", "model"), None)}),
    # 8 devices: the same over all three axes.
    ("data=2,fsdp=2,model=2", "data_parallel_all", {"tokens": (("data", "fsdp", "model"), None)}),
    ("data=2,fsdp=2,model=2", "fsdp_all", {"tokens": (("data", "fsdp", "model"), None),
                                           W_FC: (None, ("data", "fsdp", "model")),
                                           WTE: (("data", "fsdp", "model"), None)}),
    # Megatron on model (w_fc's hidden dim, wq's heads dim); the batch and the parameters over data x fsdp, each
    # parameter on its largest dim Megatron left whole (64 of w_fc and wq, 128 of wte).
    ("data=2,fsdp=2,model=2", "fsdp_data_axes+megatron", {"tokens": (("data", "fsdp"), None),
                                                          W_FC: (("data", "fsdp"), "model"),
                                                          WQ: (("data", "fsdp"), "model"),
                                                          WTE: (("data", "fsdp"), None)}),
])
def test_batch_and_fsdp_over_several_axes(mesh, strategy, expected):
    assert specs(gpt(), mesh, strategy, GPT_ROLES, tuple(expected)) == expected


# --- MaxText's rules ------------------------------------------------------------------------------------------------


def test_maxtext_on_a_maxtext_mesh():
    """data x fsdp x tensor: the batch over data x fsdp, heads and MLP on tensor, the parameters stored over fsdp
    on their largest dim still whole (no sequence or context axis: the sequence stays whole)."""
    expected = {"tokens": (("data", "fsdp"), None), W_FC: ("fsdp", "tensor"), WQ: ("fsdp", "tensor"),
                WTE: ("fsdp", None)}
    assert specs(gpt(), "data=2,fsdp=2,tensor=2", "maxtext", GPT_ROLES, tuple(expected)) == expected


@pytest.mark.parametrize("mesh, roles, expected", [
    # toast's names count as MaxText's: batch is data, model is tensor, seq is sequence.
    ("batch=2,fsdp=2,model=2,seq=2", ("batch", "heads", "mlp", "sequence"),
     {"batch": ("batch", "fsdp"), "heads": ("model",), "mlp": ("model",), "sequence": ("seq",),
      "params": ("fsdp", "seq")}),
    # No experts role: the expert axis is one more batch axis (activation_batch) and stores parameters (embed).
    ("data=2,fsdp=2,expert=2,tensor=2", ("batch", "mlp"),
     {"batch": ("data", "fsdp", "expert"), "mlp": ("tensor",), "params": ("fsdp", "expert")}),
    # With one, the expert axis is the experts' and the batch leaves it.
    ("data=2,fsdp=2,expert=2,tensor=2", ("batch", "mlp", "experts"),
     {"batch": ("data", "fsdp"), "mlp": ("tensor",), "experts": ("expert",), "params": ("fsdp", "expert")}),
])
def test_maxtext_axes(mesh, roles, expected):
    named = Roles({role: [("x", 0)] for role in roles})
    assert placed_axes(expert_strategy("maxtext"), toast.parse_mesh(mesh), named) == expected


# --- expert parallelism ---------------------------------------------------------------------------------------------


def test_moe_roles_name_the_experts():
    roles = load_roles("benchmarks/programs/moe.roles.toml")
    assert roles.get("experts") == ((W_IN.replace("[0]", "[*]"), 0), (W_OUT.replace("[0]", "[*]"), 0))


@pytest.mark.parametrize("mesh, strategy, expected", [
    # The experts dim (4) on expert, with the router's experts dim (the same color); the batch (8) on data.
    ("data=4,expert=2", "expert_parallel", {"inputs": ("data", None), W_IN: ("expert", None, None),
                                            W_OUT: ("expert", None, None),
                                            "params['blocks'][0]['router']": (None, "expert")}),
    # No axis named expert: the first the batch leaves; the batch over every other axis.
    ("data=2,fsdp=2,model=2", "expert_parallel", {"inputs": (("data", "fsdp"), None), W_IN: ("model", None, None)}),
    # MaxText's rules: the experts on expert, the batch off it, the hidden dim F on tensor, the parameters stored
    # over expert (embed) where nothing splits them yet (wq's dim 0; w_in is split by expert already).
    ("data=2,expert=2,tensor=2", "maxtext", {"inputs": ("data", None), W_IN: ("expert", None, "tensor"),
                                             WQ: ("expert", "tensor")}),
])
def test_expert_parallel_on_moe(mesh, strategy, expected):
    assert specs(moe(), mesh, strategy, roles_for_input(MOE), tuple(expected)) == expected


# --- strategies that do not apply -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mesh, strategy, message", [
    ("batch=4", "fsdp_data_axes+megatron", "strategy 'fsdp_data_axes+megatron' needs a mesh with three axes"),
    ("batch=2,model=2", "fsdp_data_axes+megatron", "strategy 'fsdp_data_axes+megatron' needs a mesh with three "
                                                   "axes, e.g. data=2,fsdp=2,model=2"),
    ("x=2,y=2", "maxtext", "strategy 'maxtext' finds no axis of mesh x=2,y=2 for the batch (an axis named data, "
                           "fsdp, fsdp_transpose, expert)"),
    ("batch=4", "expert_parallel", "strategy 'expert_parallel' needs a mesh with two axes"),
])
def test_a_strategy_that_cannot_place_its_roles_says_why(mesh, strategy, message):
    model = toast.ShardingModel(gpt(), toast.parse_mesh(mesh))
    roles = Roles({**GPT_ROLES.dims, "experts": (("params['blocks'][*]['wq']", 1),)}, source="test roles")
    with pytest.raises(ToastError, match="^" + re.escape(message)):
        manual_strategy(model, strategy, roles)


def test_every_row_is_priced_or_has_its_reason():
    """moe on data=2,fsdp=2: both axes are data axes, so expert parallelism finds none for the experts."""
    model = toast.ShardingModel(moe(), toast.parse_mesh("data=2,fsdp=2"))
    rows = price_manual_strategies(model, toast.CostModel(model, toast.load_hardware("h100")), roles_for_input(MOE))
    assert [row.name for row in rows] == list(STRATEGY_NAMES)
    reasons = {row.name: row.reason for row in rows if row.cost is None}
    assert reasons["expert_parallel"] == ("the batch takes every axis of mesh data=2,fsdp=2 (data, fsdp)")
    assert reasons["fsdp_data_axes+megatron"].startswith("strategy 'fsdp_data_axes+megatron' needs a mesh with three")
    assert set(reasons) == {"megatron+sequence", "fsdp+megatron+sequence", "fsdp_data_axes+megatron",
                            "expert_parallel"}


def test_strategies_that_shard_alike_are_priced_once():
    """On one axis, fsdp_all is fsdp and data_parallel_all is data_parallel: the same state, one evaluation; so is
    maxtext on a mesh of one batch axis (MaxText's data), data parallel (the others need two axes)."""
    model = toast.ShardingModel(moe(), toast.parse_mesh("batch=4"))
    costs = toast.CostModel(model, toast.load_hardware("h100"))
    evaluated = []
    evaluate = costs.evaluate
    costs.evaluate = lambda state: evaluated.append(state.key()) or evaluate(state)  # type: ignore[method-assign]
    by_name = {row.name: row for row in price_manual_strategies(model, costs, roles_for_input(MOE))}
    assert by_name["fsdp_all"].cost is by_name["fsdp"].cost is not None
    assert by_name["data_parallel_all"].cost is by_name["data_parallel"].cost is not None
    assert by_name["maxtext"].cost is by_name["data_parallel"].cost
    assert len(evaluated) == len(set(evaluated)) == 2  # data_parallel, fsdp


# --- toast compare's gains ------------------------------------------------------------------------------------------


def row(name: str, step_time_s: float | None, over_memory: bool = False) -> StrategyRow:
    cost = None if step_time_s is None else Cost(step_time_s, step_time_s, {}, {}, 0, 0, 1.0, ())
    return StrategyRow(name, cost, over_memory, "" if cost else "does not apply")


def test_gains_over_the_best_fitting_expert_strategy_and_fsdp_all():
    """toast 2.0 ms; data_parallel 1.8 ms is faster but over memory; the best that fits is fsdp+megatron, 2.14 ms:
    2.14 / 2.0 = 1.07; fsdp_all 2.24 ms: 2.24 / 2.0 = 1.12."""
    rows = [row("toast", 2.0e-3), row("data_parallel", 1.8e-3, over_memory=True), row("megatron", 2.5e-3),
            row("fsdp+megatron", 2.14e-3), row("fsdp_all", 2.24e-3), row("expert_parallel", None)]
    found = gains(rows)
    assert found.best == "fsdp+megatron"
    assert found.over_best == pytest.approx(1.07) and found.over_fsdp_all == pytest.approx(1.12)
    assert gains_line(rows) == ("gain over the best expert strategy (fsdp+megatron): 1.070x; over FSDP over all "
                                "devices (fsdp_all): 1.120x")


def test_gains_where_none_fits_or_none_applies():
    """Nothing fits: the fastest that applies (1.5 ms over toast's 3.0 ms: 0.5); fsdp_all does not apply."""
    rows = [row("toast", 3.0e-3), row("data_parallel", 1.5e-3, True), row("fsdp", 2.0e-3, True),
            row("fsdp_all", None)]
    assert gains_line(rows) == ("gain over the best expert strategy (data_parallel): 0.500x; FSDP over all devices "
                                "(fsdp_all) does not apply")
    rows = [row("toast", 3.0e-3), row("fsdp", 6.0e-3), row("fsdp_all", 4.5e-3, True)]
    assert gains_line(rows) == ("gain over the best expert strategy (fsdp): 2.000x; over FSDP over all devices "
                                "(fsdp_all): 1.500x (over memory)")
    assert gains_line([row("toast", 3.0e-3), row("fsdp", None)]) == (
        "gain over the best expert strategy: none applies; FSDP over all devices (fsdp_all) does not apply")


# --- the command line -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["fsdp_all", "megatron+fsdp", "maxtext"])
def test_shard_takes_every_name_of_the_table(strategy, capsys):
    assert main(["shard", "toast.examples.mlp:mlp", "--engine", "embedded", "--mesh", "batch=4,model=2",
                 "--strategy", strategy]) == 0
    assert f"strategy {strategy} on mesh" in capsys.readouterr().out
