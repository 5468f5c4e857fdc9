"""How close the search gets to the optimum of its own cost model, on programs small enough to enumerate.

    python benchmarks/bench_optimality.py [--programs mlp attention gpt_small gemma_small unet_small gns_small]
        [--meshes batch=4,model=2 batch=2,model=2,seq=2] [--hardware h100 tpu_v3] [--seeds 10]
        [--rollouts 2000] [--jobs 2] [--searches mcts random greedy] [--set name=value ...]

For each program, mesh and profile: enumerates every state the action space reaches
(``toast.search.exhaustive.enumerate_states``) and costs each; then, without a memory limit (the profile's
HBM) and with one that rules out data parallelism (halfway between the smallest peak of any state and data
parallelism's, from the program's roles; without roles, the unconstrained optimum's, or where the space is not
enumerated, the fastest state the searches found without a limit), runs every search of ``--searches``
through the search contract (``toast.search.registry.SEARCHES``: ``Search.run`` with a ``Budget``) for
``--seeds`` seeds: the first (default MCTS) with ``--rollouts``, each other with as many rollouts as the
first's ``SearchResult.evaluations`` (random search and greedy descent count a rollout per state costed for
the first time, ``Budget.rollouts``: so they cost as many distinct states as the first did). The gap is a
strategy's step time over the optimum's, less 1 (over memory where a state fits: counted as a miss). Prints
Markdown rows for BENCHMARKS.md. ``--set`` overrides a field of the first search's settings (``--set
lanes=4``: ``MctsSettings``) or of ``SpaceSettings`` (``--set min_names=1``) to compare variants;
``TOAST_ENUMERATION_CACHE=DIR`` keeps the enumerations between runs. A space of more than ``ENUMERATION_LIMIT``
states is not enumerated: its gaps are against the best state any run found (and a search with 10 times the
rollouts), lower bounds of the gaps to the optimum.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import toast
from toast.cost.model import CostModel
from toast.errors import ToastError
from toast.examples import EXAMPLES, resolve
from toast.search.actions import ActionSpace
from toast.search.base import Budget, Phase, Search, SpaceSettings
from toast.search.exhaustive import StateSpace, enumerate_states
from toast.search.registry import SEARCHES, search_by_name
from toast.sharding import roles_for_input
from toast.sharding.state import ShardingModel
from toast.sharding.strategies import manual_strategy

ENUMERATION_LIMIT = 3_000_000  # more states than this: gaps against the best state known instead
PROGRAMS = ["mlp", "attention", "gpt_small", "gemma_small", "unet_small", "gns_small"]


def _setting(text: str, settings_type: type) -> tuple[str, Any]:
    """``name=value`` as a field of ``settings_type`` or of ``SpaceSettings`` (its default's type says how to
    read the value)."""
    name, _, value = text.partition("=")
    owner = next((kind for kind in (settings_type, SpaceSettings)
                  if name in {f.name for f in dataclasses.fields(kind)}), None)
    if owner is None:
        raise SystemExit(f"--set {text}: neither {settings_type.__name__} nor SpaceSettings has a field {name!r}")
    default = getattr(owner(), name)
    if isinstance(default, bool):
        return name, value.lower() in ("1", "true", "yes")
    if default is None or isinstance(default, (int, float)):
        return name, None if value == "none" else (int(value) if value.lstrip("-").isdigit() else float(value))
    raise SystemExit(f"--set {text}: not a number or flag")


def _enumerated(program: str, mesh: str, hardware: str, space: ActionSpace, costs: CostModel) -> StateSpace:
    """The enumeration, cached under ``$TOAST_ENUMERATION_CACHE`` (default: none) between runs."""
    folder = os.environ.get("TOAST_ENUMERATION_CACHE")
    path = Path(folder, f"{program}-{mesh}-{hardware}.npz") if folder else None
    too_many = path.with_suffix(".too-many") if path is not None else None
    if too_many is not None and too_many.is_file():
        raise ToastError(too_many.read_text())
    if path is not None and path.is_file():
        with np.load(path) as saved:
            return StateSpace(saved["atoms"], saved["depth"], saved["step_time_s"], saved["peak_bytes"],
                              float(saved["seconds"]))
    try:
        states = enumerate_states(space, costs, limit=ENUMERATION_LIMIT)
    except ToastError as error:
        if too_many is not None:
            too_many.parent.mkdir(parents=True, exist_ok=True)
            too_many.write_text(str(error))
        raise
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, atoms=states.atoms, depth=states.depth, step_time_s=states.step_time_s,
                 peak_bytes=states.peak_bytes, seconds=states.seconds)
    return states


def _pct(values: list[float]) -> str:
    """The mean of the gaps that fit, as a percentage, and how many did not."""
    finite = [v for v in values if v != math.inf]
    misses = len(values) - len(finite)
    text = f"{100 * statistics.mean(finite):.2f}%" if finite else "-"
    return text + (f" ({misses} over)" if misses else "")


def run_case(case: tuple[str, str, str, int, dict[str, Any], int, tuple[str, ...]]) -> list[str]:
    program, mesh_text, hardware_name, seeds, overrides, rollouts, names = case
    fn, args = resolve(program)()
    analysis = toast.analyze(program, fn=fn, args=args)
    model = ShardingModel(analysis, toast.parse_mesh(mesh_text))
    hardware = toast.load_hardware(hardware_name)
    searches: list[Search] = [search_by_name(name) for name in names]
    first = searches[0]
    space_fields = {f.name for f in dataclasses.fields(SpaceSettings)}
    settings = first.settings_type(**{k: v for k, v in overrides.items() if k not in space_fields})
    space = SpaceSettings(**{k: v for k, v in overrides.items() if k in space_fields}).action_space(model)
    base = Budget(rollouts=rollouts, workers=1)
    hbm = float(hardware.hbm_bytes)
    states: StateSpace | None
    try:
        states = _enumerated(program, mesh_text, hardware_name, space, CostModel(model, hardware))
        smallest_peak = float(states.peak_bytes.min())
        free = states.optimum(hbm)
        assert free is not None
        ruled_out = float(states.peak_bytes[free])
        size = str(len(states))
    except ToastError:
        # Too many states: the reference is the best state any run below finds (and a search 10 times as
        # long), so the gaps are lower bounds; the smallest peak is a memory-goal search's.
        states = None
        memory_search = first.run(space, CostModel(model, hardware), settings=settings,
                                  budget=dataclasses.replace(base, phases=(Phase(goal="memory"),)))
        smallest_peak = float(memory_search.cost.peak_bytes)
        ruled_out = math.inf
        size = f"> {ENUMERATION_LIMIT:,}"
    # The limit rules out data parallelism (batch on every axis) where the program has roles, else the
    # unconstrained optimum: halfway between its peak and the smallest peak of any state.
    try:
        data_parallel, _ = manual_strategy(model, "data_parallel", roles_for_input(EXAMPLES.get(program, program)))
        ruled_out = float(CostModel(model, hardware).evaluate(data_parallel, collectives=False).peak_bytes)
    except ToastError:
        pass
    rows = []
    blank = " |" * (len(searches) + 4)  # a row's cells after the optimum's
    fastest = (math.inf, math.inf)  # the HBM row's fastest search result: (step time, peak bytes)
    for label in ("HBM", "limited"):
        if label == "limited" and ruled_out == math.inf:
            # Not enumerable and no data parallelism (a batch smaller than the devices): the fastest state the
            # searches found without a limit is the one ruled out.
            ruled_out = fastest[1]
        memory = hbm if label == "HBM" else (smallest_peak + ruled_out) / 2
        costs = CostModel(model, hardware, device_memory=memory)
        best = states.optimum(memory) if states is not None else None
        if label == "limited" and (memory >= ruled_out or (states is not None and best is None)):
            rows.append(f"| {program} | {mesh_text} | {hardware_name} | {label} | {size} | (limit does not "
                        f"bind) |{blank}")
            continue
        # Per seed: each search's step time (inf: over the memory limit), then the first's evaluations and seconds.
        runs: list[tuple[list[float], int, float]] = []
        for seed in range(seeds):
            result = first.run(space, costs, budget=dataclasses.replace(base, seed=seed), settings=settings)
            if label == "HBM" and result.cost.step_time_s < fastest[0]:
                fastest = (result.cost.step_time_s, float(result.cost.peak_bytes))
            steps = [result.cost.step_time_s if result.cost.peak_bytes <= memory else math.inf]
            for other in searches[1:]:  # as many rollouts as the first's evaluations (Budget.rollouts)
                found = other.run(space, costs, budget=Budget(seed=seed, rollouts=result.evaluations, workers=1))
                steps.append(found.cost.step_time_s if found.cost.peak_bytes <= memory else math.inf)
            runs.append((steps, result.evaluations, result.seconds))
        if states is not None:
            assert best is not None
            optimum, shown = float(states.step_time_s[best]), ""
        else:
            long = first.run(space, costs, settings=settings,
                             budget=dataclasses.replace(base, seed=seeds, rollouts=10 * rollouts))
            known = [long.cost.step_time_s if long.cost.peak_bytes <= memory else math.inf]
            optimum, shown = min(known + [step for run in runs for step in run[0]]), "best known "
        if optimum == math.inf:
            rows.append(f"| {program} | {mesh_text} | {hardware_name} | {label} | {size} | (nothing found fits) "
                        f"|{blank}")
            continue

        gaps = [[run[0][column] / optimum - 1 for run in runs] for column in range(len(searches))]
        wins = sum(run[0][0] <= min(run[0][1:], default=math.inf) * (1 + 1e-12) for run in runs)
        others = "".join(f"{_pct(gap)} | " for gap in gaps[1:])
        rows.append(f"| {program} | {mesh_text} | {hardware_name} | {label} | {size} | {shown}"
                    f"{optimum * 1e6:.1f} us | {_pct(gaps[0])} | {100 * max(gaps[0]):.2f}% | {others}"
                    f"{wins}/{seeds} | {statistics.mean(run[1] for run in runs):.0f} | "
                    f"{statistics.mean(run[2] for run in runs):.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=PROGRAMS)
    parser.add_argument("--meshes", nargs="+", default=["batch=4,model=2", "batch=2,model=2,seq=2"])
    parser.add_argument("--hardware", nargs="+", default=["h100", "tpu_v3"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rollouts", type=int, default=Budget().rollouts)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--searches", nargs="+", choices=tuple(SEARCHES), default=list(SEARCHES),
                        help="the searches, the first the reference (its rollouts: --rollouts; the others': its "
                        "evaluations)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE")
    options = parser.parse_args()
    names = tuple(options.searches)
    first = names[0]
    overrides = dict(_setting(text, SEARCHES[first].settings_type) for text in options.overrides)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}; rollouts {options.rollouts}, seeds 0-{options.seeds - 1}; "
          f"searches {', '.join(names)}; settings {overrides or 'default'}")
    others = "".join(f" {name} (mean) |" for name in names[1:])
    print(f"| program | mesh | hardware | memory | states | optimum | {first} gap (mean) | worst |{others} "
          f"{first} best | evaluations | {first} s |")
    print("|---|---|---|---|---|---|---|---|" + "---|" * (len(names) - 1) + "---|---|---|")
    cases = [(program, mesh, hardware, options.seeds, overrides, options.rollouts, names)
             for program in options.programs for mesh in options.meshes for hardware in options.hardware]
    with multiprocessing.get_context("fork").Pool(options.jobs) as pool:
        for rows in pool.imap(run_case, cases):
            for row in rows:
                print(row, flush=True)


if __name__ == "__main__":
    main()
