"""Frontier-size programs through the pipeline (issue 38, item 2): the Llama-3-70B and Llama-3.1-405B factories
at tiny sizes, and the stages that had a cost per parameter, per action or per op made linear and exact.

The whole pipeline at full size is ``benchmarks/bench_frontier.py``'s (minutes); here every check takes seconds.
"""

from __future__ import annotations

import gc
import math
import random

import jax
import numpy as np
import pytest
from conftest import analysis_of

import toast.analysis.named_dimensions as named_dimensions
import toast.frontend.stablehlo as stablehlo
import toast.sharding.carry as carry
from toast.analysis.classes import union_find
from toast.analysis.conflict_types import CompatibilitySet, Conflict, Conflicts, ResolutionGroup
from toast.cli import main
from toast.datalog.souffle import read_outputs, write_relations
from toast.errors import EngineError
from toast.frontend.loading import load_program, load_program_text
from toast.processes import collector_paused
from toast.sharding.mesh import parse_mesh
from toast.sharding.roles import roles_for_input
from toast.sharding.state import Action, ShardingModel
from toast.sharding.strategies import manual_strategy

LLAMA_70B = "benchmarks.programs.frontier:llama3_70b"
LLAMA_405B = "benchmarks.programs.frontier:llama31_405b"
# Every width shrunk (heads | d_model, kv_heads | heads, an even head width); the layers are given per test.
TINY = {"d_model": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256, "seq": 32, "batch": 8}
GPT = "toast.examples.gpt:gpt_train_step"


@pytest.mark.parametrize("spec", [LLAMA_70B, LLAMA_405B])
@pytest.mark.parametrize("layers", [1, 2])
def test_frontier_factories_lower_at_tiny_sizes(spec, layers):
    """llama3's step unrolled: 715 ops a layer and 325 besides; arguments: 9 parameters a layer and 3 besides,
    each with its two Adam moments, plus the step count, the tokens and the targets (27 L + 12)."""
    pytest.importorskip("optax")
    program = load_program(spec, factory_arguments={**TINY, "layers": layers})
    assert len(program.ops) == 715 * layers + 325
    assert len(program.arguments) == 27 * layers + 12
    names = {program.values[v].name for v in program.arguments}
    assert f"params['layers'][{layers - 1}]['w_gate']" in names


@pytest.mark.parametrize("spec, parameters", [
    # Model cards' shapes: embedding and LM head V x D each; a layer: wq and wo D x H x 128, wk and wv
    # D x 8 x 128, three D x F MLP matrices, two norms of D; the final norm D.
    (LLAMA_70B, 2 * 128256 * 8192 + 8192 + 80 * (2 * 8192 * 64 * 128 + 2 * 8192 * 8 * 128 + 3 * 8192 * 28672
                                                 + 2 * 8192)),
    (LLAMA_405B, 2 * 128256 * 16384 + 16384 + 126 * (2 * 16384 * 128 * 128 + 2 * 16384 * 8 * 128
                                                     + 3 * 16384 * 53248 + 2 * 16384)),
])
def test_frontier_factories_default_to_the_model_cards_shapes(spec, parameters):
    """70,553,706,496 and 405,853,388,800 parameters (abstract arguments: nothing is allocated)."""
    pytest.importorskip("optax")
    from toast.frontend.loading import resolve_factory

    _, (params, _, tokens, _) = resolve_factory(spec)()
    assert sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params)) == parameters
    assert tokens.shape == ((256, 2048) if spec == LLAMA_70B else (1024, 2048))


def test_frontier_roles_file_names_the_layers_weights():
    roles = roles_for_input(LLAMA_405B)
    assert list(roles.get("heads")) == [("params['layers'][*]['wq']", 1), ("params['layers'][*]['wo']", 0)]
    assert list(roles.get("batch")) == [("tokens", 0), ("targets", 0)]


def test_a_four_axis_mesh_end_to_end(capsys):
    """A tiny 405B-shaped step on 16 devices over four axes: toast autoshard runs through, and its table has a
    row for toast and the expert strategies."""
    pytest.importorskip("optax")
    status = main(["autoshard", LLAMA_405B, *[f"--arg={k}={v}" for k, v in {**TINY, "layers": 1}.items()],
                   "--mesh", "data=2,fsdp=2,seq=2,model=2", "--hardware", "h100", "--engine", "embedded",
                   "--rollouts", "5", "--workers", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "on mesh data=2,fsdp=2,seq=2,model=2" in out
    assert "| toast |" in out and "| fsdp |" in out


# Sharding states: a state one action away from a valid one is checked on the names the action changed.


@pytest.fixture(scope="module")
def gpt_model():
    return ShardingModel(analysis_of(GPT), parse_mesh("a=2,b=4,c=2"))


def test_problem_after_one_action_reads_the_changed_names_only(gpt_model, monkeypatch):
    model = ShardingModel(gpt_model.analysis, gpt_model.mesh)
    initial = model.initial()
    assert model.problem(initial) == ""
    # A color of a few names (a change of most names is checked whole).
    color = next(c for c in range(len(model.analysis.colors)) if 10 <= len(model.names_of_color(c)) < 100)
    following = model.apply(initial, Action(color, "a"), check=False)
    read = []
    original = ShardingModel._problem_of
    monkeypatch.setattr(ShardingModel, "_problem_of",
                        lambda self, masks, changed: read.append(changed) or original(self, masks, changed))
    model.problem(following)
    assert read[0] is not None
    assert read[0].tolist() == np.flatnonzero(following.masks != initial.masks).tolist()


def test_problem_is_the_full_checks_answer(gpt_model):
    """Random actions on random earlier states, valid or not, on three axes (2, 4, 2 devices: some dims are
    not divisible by 4): each state's answer is a fresh model's (whose first check reads every name)."""
    analysis, mesh = gpt_model.analysis, gpt_model.mesh
    model = ShardingModel(analysis, mesh)
    bits = analysis.conflicts.resolution_bits
    rng = random.Random(0)
    states, answers = [model.initial()], []
    for _ in range(150):
        action = Action(rng.randrange(len(analysis.colors)), rng.choice(mesh.names),
                        tuple(rng.randrange(2) for _ in range(bits)))
        state = model.apply(rng.choice(states), action, check=False)
        answer = model.problem(state)
        assert answer == ShardingModel(analysis, mesh).problem(state)
        states.append(state)
        answers.append(answer)
    kinds = {a.split(": ")[-1].split(" ")[0] if a else "" for a in answers}
    assert "" in kinds and len(kinds) >= 3, kinds  # valid states, and invalid ones of at least two kinds


# Stored splits through loops: one index of the walks' steps for every parameter.


def test_every_parameters_stored_split_walks_one_step_index(monkeypatch):
    analysis = analysis_of(GPT)
    built = []
    original = carry._steps
    monkeypatch.setattr(carry, "_steps", lambda a: built.append(a) or original(a))
    monkeypatch.setattr(carry, "_LAST", [])
    model = ShardingModel(analysis, parse_mesh("batch=4,model=2"))
    roles = roles_for_input(GPT)
    for name in ("fsdp", "fsdp+megatron"):
        manual_strategy(model, name, roles)
    assert built == [analysis]


# Conflicts: the endpoints an action leaves unsharded, per color.


def _conflicts(color_of_third: int) -> Conflicts:
    """Three conflicts: 0 and 1 of color 5 in one set (resolution 0 shards endpoint 0 of conflict 0 and endpoint 1
    of conflict 1), conflict 2 in a set of its own (resolution 0 shards its endpoint 1), each set its own bit."""
    return Conflicts(
        color_conflicts=(),
        conflicts=(Conflict(0, 5, (10, 11), ()), Conflict(1, 5, (12, 13), ()),
                   Conflict(2, color_of_third, (14, 15), ())),
        sets=(CompatibilitySet(0, (0, 1), (0, 1)), CompatibilitySet(1, (2,), (1,))),
        groups=(ResolutionGroup(0, (0,)), ResolutionGroup(1, (1,))),
        boxes=(), set_of=(0, 0, 1), group_of=(0, 1), invalid=())


def test_unsharded_nodes_by_hand():
    first, second = _conflicts(6), _conflicts(5)
    assert first.unsharded_nodes(5, (0, 0)) == {11, 12}  # conflict 0 shards 10, conflict 1 shards 13
    assert first.unsharded_nodes(5, (1, 0)) == {10, 13}
    assert first.unsharded_nodes(6, (0, 0)) == {14}
    assert first.unsharded_nodes(6, (0, 1)) == {15}
    assert first.unsharded_nodes(7, (1, 1)) == frozenset()
    assert second.unsharded_nodes(5, (0, 0)) == {11, 12, 14}  # another Conflicts: its own colors
    assert first.unsharded_nodes(5, (0, 0)) == {11, 12}
    with pytest.raises(ValueError, match="expected 2 resolution bits, got 1"):
        first.unsharded_nodes(5, (0,))


def test_union_find_labels_by_hand():
    # Classes {0, 1}, {2, 4, 5}, {3}; each labeled by its smallest member.
    assert union_find(6, [(4, 2), (5, 4), (1, 0)]).tolist() == [0, 0, 2, 3, 2, 2]
    assert union_find(3, []).tolist() == [0, 1, 2]
    assert union_find(0, []).tolist() == []


# Soufflé's files: written and read whole.


def test_souffle_relations_round_trip(tmp_path):
    rows = {"edge": [(3, 1), (1, 2)], "named": [(7, "x%sy", "a b")], "none": []}
    write_relations(rows, tmp_path, suffix=".csv")
    assert (tmp_path / "named.csv").read_text() == "7\tx%sy\ta b\n"
    read = read_outputs(tmp_path, {"edge": ["number", "number"], "named": ["unsigned", "symbol", "symbol"],
                                   "none": ["number"]})
    assert read == {"edge": [(1, 2), (3, 1)], "named": [(7, "x%sy", "a b")], "none": []}


def test_souffle_output_row_of_other_width(tmp_path):
    (tmp_path / "edge.csv").write_text("1\t2\n3\n4\t5\t6\n")
    with pytest.raises(EngineError, match=r"edge.csv: row of 1 columns, expected 2"):
        read_outputs(tmp_path, {"edge": ["number", "number"]})


# Reading MLIR: attributes and locations are uniqued by MLIR; each distinct one is decoded once.


def test_each_distinct_attribute_and_location_is_decoded_once(monkeypatch):
    pytest.importorskip("optax")
    text, _ = load_program_text(LLAMA_70B, factory_arguments={**TINY, "layers": 2})
    decoded, located = [], []
    original_decode, original_location = stablehlo.decode_attribute, stablehlo.python_location
    monkeypatch.setattr(stablehlo, "decode_attribute", lambda attr: decoded.append(attr) or original_decode(attr))
    monkeypatch.setattr(stablehlo, "python_location", lambda loc: located.append(loc) or original_location(loc))
    program = stablehlo.read_text(text)
    # 1755 ops (read one by one before: a location each, and each of their attributes): a few dozen distinct
    # attributes, a few hundred distinct locations (a location names the op's kind and the user's line).
    assert len(program.ops) == 1755
    assert len(decoded) == len({str(attr) for attr in decoded}) < 100
    assert len(located) == len({str(loc) for loc in located}) < len(program.ops) / 4


# The cyclic garbage collector: paused while toast builds millions of acyclic objects.


def test_the_analysis_runs_with_the_collector_paused(monkeypatch):
    enabled = []
    original = named_dimensions.program_facts
    monkeypatch.setattr(named_dimensions, "program_facts", lambda p: enabled.append(gc.isenabled()) or original(p))
    named_dimensions.analyze("toast.examples.mlp:mlp", engine="embedded", cache=False)
    assert enabled == [False]
    assert gc.isenabled()


def test_collector_paused_restores_what_was():
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
