"""The search contract (``toast.search.base``): every search in ``SEARCHES`` runs through ``find_strategy``,
the CLI (``--search``), ``compare``, sweeps and ``toast.autoshard`` alike, honours its ``Budget`` (rollouts,
phases, seed), returns a valid state that fits where one does, and the strategy file records which search ran
with which settings. Expected optima come from ``enumerate_states`` (every state costed, no search)."""

from __future__ import annotations

import csv
import dataclasses
import json
import re

import jax.numpy as jnp
import pytest
from conftest import analysis_of

import toast
from toast.cli import main
from toast.errors import InputError, ToastError
from toast.evaluation.sweep import load_sweep, sweep
from toast.examples.mlp import mlp
from toast.output.autoshard import strategy_document
from toast.search import SEARCHES, Budget, GreedySettings, MctsSettings, Phase, RandomSettings, search_by_name
from toast.search.exhaustive import enumerate_states
from toast.search.find import find_strategy

A100 = toast.load_hardware("a100_80gb")
MLP = "toast.examples.mlp:mlp"
ATTENTION = "toast.examples.attention:attention"
GPT = "toast.examples.gpt:gpt_small"
NAMES = ["mcts", "random", "greedy"]
KNOWN = "the searches are mcts, random, greedy"


def test_the_registry_holds_the_three_searches_mcts_first():
    assert list(SEARCHES) == NAMES
    assert [SEARCHES[name].settings_type for name in NAMES] == [MctsSettings, RandomSettings, GreedySettings]


@pytest.mark.parametrize("name", NAMES)
def test_every_search_reaches_the_optimum_of_a_small_space_under_a_limit_that_binds(name):
    """The attention at batch=4,model=2 has 25 states. Under a limit halfway between the smallest peak of any
    state and the fastest state's peak, the fastest does not fit; each search, with a budget of more rollouts
    than there are states, returns the enumeration's best state that fits (a valid state: no problem)."""
    model = toast.ShardingModel(analysis_of(ATTENTION), toast.parse_mesh("batch=4,model=2"))
    states = enumerate_states(toast.ActionSpace(model), toast.CostModel(model, A100))
    fastest = states.optimum(float(A100.hbm_bytes))
    assert fastest is not None and len(states) == 25
    limit = (float(states.peak_bytes.min()) + float(states.peak_bytes[fastest])) / 2
    best = states.optimum(limit)
    assert best is not None and states.step_time_s[best] > states.step_time_s[fastest]
    found = find_strategy(analysis_of(ATTENTION), toast.parse_mesh("batch=4,model=2"), A100, search=name,
                          budget=Budget(seed=0, rollouts=200, workers=1), memory_gib=limit / 2**30,
                          manual_candidates=False)
    assert found.result.algorithm == name and found.origin == "search"
    assert found.model.problem(found.result.state) == ""
    assert not found.over_memory and found.result.cost.peak_bytes <= limit
    assert found.result.cost.step_time_s == pytest.approx(float(states.step_time_s[best]))
    assert found.result.evaluations <= 25  # distinct states costed: no more than there are


@pytest.mark.parametrize("name", ["random", "greedy"])
def test_the_simple_searches_cost_exactly_their_rollouts_and_repeat_for_a_seed(name):
    """Random search and greedy descent count a rollout per state costed for the first time: on a space far
    bigger than the budget they cost exactly that many (greedy's last step is cut where the budget ends), and
    the same seed gives the same strategy."""
    analysis = analysis_of(GPT)
    runs = [find_strategy(analysis, toast.parse_mesh("batch=2,model=4"), A100, search=name,
                          budget=Budget(seed=seed, rollouts=150, workers=1), manual_candidates=False)
            for seed in (3, 3)]
    first, again = (run.result for run in runs)
    assert first.evaluations == first.rollouts == 150
    assert again.state.masks.tobytes() == first.state.masks.tobytes() and again.evaluations == 150
    assert [r.rollouts for r in first.rounds] == [149]  # the start state was costed before the phase
    assert runs[0].model.problem(first.state) == ""


@pytest.mark.parametrize("name", ["random", "greedy"])
def test_the_simple_searches_keep_the_phases_in_order(name):
    """``Budget.phases``: ``model`` first for memory, then ``batch`` for runtime; each phase takes actions on
    its own axes only, so the model actions come first. The MLP's weights (128 MiB each in bf16) go to
    ``model``, and the result's peak is under half the unsharded one."""
    fn, args = mlp(batch=8192, d_in=4096, d_hidden=16384, d_out=4096, dtype=jnp.bfloat16)
    analysis = toast.analyze("mlp", fn=fn, args=args, engine="embedded")
    budget = Budget(rollouts=200, workers=1, phases=(Phase(("model",), "memory"), Phase(("batch",))))
    seen = []
    found = find_strategy(analysis, toast.parse_mesh("batch=4,model=2"), A100, search=name, budget=budget,
                          manual_candidates=False, progress=lambda r, done, seconds: seen.append((r.phase, done)))
    axes = [action.axis for action in found.result.actions]
    assert "model" in axes and axes == sorted(axes, key=lambda a: a != "model"), axes
    assert [r.phase for r in found.result.rounds] == [0, 1]
    assert found.result.cost.peak_bytes < found.costs.evaluate(found.model.initial()).peak_bytes / 2
    # progress: at the end of each phase at least, with the states costed so far, never fewer
    assert {phase for phase, _ in seen} == {0, 1} and [d for _, d in seen] == sorted(d for _, d in seen)


def test_unknown_search_and_other_settings_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ToastError, match=f"^unknown search 'nope': {KNOWN}$"):
        search_by_name("nope")
    analysis = analysis_of(MLP)
    mesh = toast.parse_mesh("batch=4,model=2")
    with pytest.raises(ToastError, match=f"^unknown search 'nope': {KNOWN}$"):
        find_strategy(analysis, mesh, A100, search="nope")
    with pytest.raises(ToastError, match="^search 'random' takes RandomSettings, not MctsSettings$"):
        find_strategy(analysis, mesh, A100, search="random", settings=MctsSettings())
    with pytest.raises(ToastError, match=f"^unknown search 'nope': {KNOWN}$"):  # before any analysis
        toast.autoshard(lambda: None, mesh="batch=4,model=2", search="nope")
    for extra, message in ((["--search", "nope"], f"unknown search 'nope': {KNOWN}"),
                           (["--search", "greedy", "--patience", "3"],
                            "--patience is a setting of --search mcts, not of --search greedy"),
                           (["--search", "random", "--restarts", "1"],
                            "--restarts is a setting of --search mcts, not of --search random")):
        out = tmp_path / "s.json"
        assert main(["autoshard", MLP, "--mesh", "batch=4,model=2", "--engine", "embedded", "-o", str(out),
                     *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"toast: error: {message}"] and not out.exists()


@pytest.mark.parametrize("name", NAMES)
def test_autoshard_search_option_writes_a_file_recording_the_search(name, tmp_path):
    out = tmp_path / f"{name}.json"
    assert main(["autoshard", MLP, "--mesh", "batch=4,model=2", "--engine", "embedded", "--rollouts", "40",
                 "--workers", "1", "--seed", "2", "--search", name, "-o", str(out)]) == 0
    recorded = toast.load_strategy(out).document["search"]  # checked against the schema
    settings_type = SEARCHES[name].settings_type
    assert recorded["algorithm"] == name
    assert recorded["settings"] == json.loads(json.dumps(dataclasses.asdict(settings_type())))
    assert recorded["budget"] == {"seed": 2, "rollouts": 40, "seconds": None,
                                  "phases": [{"axes": [], "goal": "runtime"}]}
    assert recorded["space"] == {"min_names": 10, "mirror_layers": True, "stored_parameters": True}
    assert recorded["seed"] == 2 and not recorded["over_memory"]


def test_compare_and_the_python_api_take_the_search(tmp_path):
    out = tmp_path / "compare.json"
    assert main(["compare", MLP, "--mesh", "batch=4,model=2", "--engine", "embedded", "--rollouts", "30",
                 "--search", "greedy", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["toast"]["search"]["algorithm"] == "greedy"
    fn, args = mlp()
    strategy = toast.autoshard(fn, *args, mesh="batch=4,model=2", search="random", rollouts=30, engine="embedded",
                               settings=RandomSettings(max_depth=3))
    assert strategy.document["search"]["algorithm"] == "random"
    assert strategy.document["search"]["settings"]["max_depth"] == 3


def test_a_strategy_file_from_before_the_contract_still_reads():
    """Files written before had no ``algorithm``, ``budget`` or ``space``: one ``settings`` with them all."""
    found = find_strategy(analysis_of(MLP), toast.parse_mesh("batch=4,model=2"), A100,
                          budget=Budget(rollouts=10, workers=1))
    document = json.loads(json.dumps(strategy_document(found, source="mlp")))
    search = document["search"]
    old = {**search["budget"], **search["settings"], **search["space"]}
    for key in ("algorithm", "budget", "space"):
        del search[key]
    search["settings"] = old
    strategy = toast.load_strategy(document)
    assert strategy.partition_specs == toast.load_strategy(
        json.loads(json.dumps(strategy_document(found, source="mlp")))).partition_specs
    assert strategy.over_memory is False


def test_sweep_files_take_a_search_axis(tmp_path, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nmodels = ["mlp"]\nmeshes = ["batch=4,model=2"]\nrollouts = 20\n'
                    'search = ["mcts", "random"]\n')
    jobs = load_sweep(path).jobs
    assert [job.search for job in jobs] == ["mcts", "random"]
    assert jobs[0].key == "mlp__batch-4-model-2__a100_80gb__hbm__s0__r20"  # the default's key as before
    assert jobs[1].key == jobs[0].key + "__random"
    with pytest.raises(InputError, match=re.escape("[sweep] search is given, and --search greedy")):
        load_sweep(path, search="greedy")
    records = sweep(jobs, tmp_path / "out", workers=1)
    assert [r["status"] for r in records] == ["ok", "ok"], [r.get("error") for r in records]
    assert [r["comparison"]["toast"]["search"]["algorithm"] for r in records] == ["mcts", "random"]
    with open(tmp_path / "out" / "summary.csv") as handle:
        assert [row["search"] for row in csv.DictReader(handle)] == ["mcts", "random"]
    assert "| default search random |" in (tmp_path / "out" / "summary.md").read_text()
    plain = tmp_path / "plain.toml"
    plain.write_text('[sweep]\nmodels = ["mlp"]\nmeshes = ["batch=4,model=2"]\nrollouts = 20\n')
    assert [job.search for job in load_sweep(plain, search="greedy").jobs] == ["greedy"]
    with pytest.raises(InputError, match=re.escape(f"--search 'nope': {KNOWN}")):
        load_sweep(plain, search="nope")
    assert main(["sweep", str(plain), "-o", str(tmp_path / "none"), "--search", "nope"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"toast: error: --search 'nope': {KNOWN}"]
    assert not (tmp_path / "none").exists()
    path.write_text(path.read_text().replace('"random"', '"annealing"'))
    with pytest.raises(InputError, match=re.escape(f"[sweep] search 'annealing': {KNOWN}")):
        load_sweep(path)
