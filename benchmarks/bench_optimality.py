"""How close the search gets to the optimum of its own cost model, on programs small enough to enumerate.

    python benchmarks/bench_optimality.py [--programs mlp attention gpt_small gemma_small unet_small gns_small]
        [--meshes batch=4,model=2 batch=2,model=2,seq=2] [--hardware h100 tpu_v3] [--seeds 10]
        [--rollouts 2000] [--jobs 2] [--set name=value ...]

For each program, mesh and profile: enumerates every state the action space reaches
(``toast.search.exhaustive.enumerate_states``) and costs each; then, without a memory limit (the
profile's HBM) and with one that rules out data parallelism (halfway between the smallest peak of any state
and data parallelism's, from the program's roles; without roles, the unconstrained optimum's), runs the
default search for ``--seeds`` seeds, and random search and greedy descent (``random_search``,
``greedy_search``) with the same number of cost evaluations as each search. The gap is a strategy's step
time over the optimum's, less 1 (over memory where a state fits: counted as a miss). Prints Markdown rows
for BENCHMARKS.md. ``--set`` overrides a ``SearchSettings`` field (``--set lanes=4``) to compare variants;
``TOAST_ENUMERATION_CACHE=DIR`` keeps the enumerations between runs.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from toast.search import SearchSettings
from toast.search.actions import ActionSpace
from toast.search.exhaustive import StateSpace, enumerate_states, greedy_search, random_search
from toast.search.mcts import search
from toast.sharding import roles_for_input
from toast.sharding.state import ShardingModel
from toast.sharding.strategies import manual_strategy

PROGRAMS = ["mlp", "attention", "gpt_small", "gemma_small", "unet_small", "gns_small"]


def _setting(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    fields = {f.name: f for f in dataclasses.fields(SearchSettings)}
    if name not in fields:
        raise SystemExit(f"--set {text}: SearchSettings has no field {name!r}")
    default = getattr(SearchSettings(), name)
    if isinstance(default, bool):
        return name, value.lower() in ("1", "true", "yes")
    if default is None or isinstance(default, (int, float)):
        return name, None if value == "none" else (int(value) if value.lstrip("-").isdigit() else float(value))
    raise SystemExit(f"--set {text}: not a number or flag")


def _enumerated(program: str, mesh: str, hardware: str, space: ActionSpace, costs: CostModel) -> StateSpace:
    """The enumeration, cached under ``$TOAST_ENUMERATION_CACHE`` (default: none) between runs."""
    folder = os.environ.get("TOAST_ENUMERATION_CACHE")
    path = Path(folder, f"{program}-{mesh}-{hardware}.npz") if folder else None
    if path is not None and path.is_file():
        with np.load(path) as saved:
            return StateSpace(saved["atoms"], saved["depth"], saved["step_time_s"], saved["peak_bytes"],
                              float(saved["seconds"]))
    states = enumerate_states(space, costs, limit=3_000_000)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, atoms=states.atoms, depth=states.depth, step_time_s=states.step_time_s,
                 peak_bytes=states.peak_bytes, seconds=states.seconds)
    return states


def run_case(case: tuple[str, str, str, int, dict[str, Any], int]) -> list[str]:
    program, mesh_text, hardware_name, seeds, overrides, rollouts = case
    fn, args = resolve(program)()
    analysis = toast.analyze(program, fn=fn, args=args)
    model = ShardingModel(analysis, toast.parse_mesh(mesh_text))
    hardware = toast.load_hardware(hardware_name)
    base = SearchSettings(rollouts=rollouts, workers=1, **overrides)
    space = ActionSpace(model, min_names=base.min_names, mirror_layers=base.mirror_layers,
                        stored_parameters=base.stored_parameters)
    states = _enumerated(program, mesh_text, hardware_name, space, CostModel(model, hardware))
    free = states.optimum(float(hardware.hbm_bytes))
    assert free is not None
    # The limit rules out data parallelism (batch on every axis) where the program has roles, else the
    # unconstrained optimum: halfway between its peak and the smallest peak of any state.
    ruled_out = float(states.peak_bytes[free])
    try:
        data_parallel, _ = manual_strategy(model, "data_parallel", roles_for_input(EXAMPLES.get(program, program)))
        ruled_out = float(CostModel(model, hardware).evaluate(data_parallel, collectives=False).peak_bytes)
    except ToastError:
        pass
    limit = (float(states.peak_bytes.min()) + ruled_out) / 2
    rows = []
    for label, memory in (("HBM", float(hardware.hbm_bytes)), ("limited", limit)):
        best = states.optimum(memory)
        if label == "limited" and (best is None or limit >= ruled_out):
            rows.append(f"| {program} | {mesh_text} | {hardware_name} | {label} | {len(states)} | (limit does not "
                        "bind) | | | | | | |")
            continue
        assert best is not None
        optimum = float(states.step_time_s[best])
        costs = CostModel(model, hardware, device_memory=memory)
        gaps, random_gaps, greedy_gaps, evaluations, seconds, wins = [], [], [], [], [], 0
        for seed in range(seeds):
            settings = dataclasses.replace(base, seed=seed)
            result = search(space, costs, settings=settings)
            fits = result.cost.peak_bytes <= memory
            gap = result.cost.step_time_s / optimum - 1 if fits else float("inf")
            gaps.append(gap)
            evaluations.append(result.evaluations)
            seconds.append(result.seconds)
            baselines = []
            for baseline in (random_search, greedy_search):
                found = baseline(space, costs, evaluations=result.evaluations, seed=seed)
                cost = costs.evaluate(space.state(found.atoms), collectives=False)
                baselines.append(cost.step_time_s / optimum - 1 if cost.peak_bytes <= memory else float("inf"))
            random_gaps.append(baselines[0])
            greedy_gaps.append(baselines[1])
            wins += gap <= min(baselines) + 1e-12

        def pct(values: list[float]) -> str:
            finite = [v for v in values if v != float("inf")]
            misses = len(values) - len(finite)
            text = f"{100 * statistics.mean(finite):.2f}%" if finite else "-"
            return text + (f" ({misses} over)" if misses else "")

        rows.append(f"| {program} | {mesh_text} | {hardware_name} | {label} | {len(states)} | "
                    f"{optimum * 1e6:.1f} us | {pct(gaps)} | {100 * max(gaps):.2f}% | {pct(random_gaps)} | "
                    f"{pct(greedy_gaps)} | {wins}/{seeds} | {statistics.mean(evaluations):.0f} | "
                    f"{statistics.mean(seconds):.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=PROGRAMS)
    parser.add_argument("--meshes", nargs="+", default=["batch=4,model=2", "batch=2,model=2,seq=2"])
    parser.add_argument("--hardware", nargs="+", default=["h100", "tpu_v3"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rollouts", type=int, default=SearchSettings().rollouts)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--set", dest="overrides", action="append", default=[], type=_setting)
    options = parser.parse_args()
    overrides = dict(options.overrides)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d')}; rollouts {options.rollouts}, seeds 0-{options.seeds - 1}; "
          f"settings {overrides or 'default'}")
    print("| program | mesh | hardware | memory | states | optimum | search gap (mean) | worst | random (mean) "
          "| greedy (mean) | search best | evaluations | search s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [(program, mesh, hardware, options.seeds, overrides, options.rollouts)
             for program in options.programs for mesh in options.meshes for hardware in options.hardware]
    with multiprocessing.get_context("fork").Pool(options.jobs) as pool:
        for rows in pool.imap(run_case, cases):
            for row in rows:
                print(row, flush=True)


if __name__ == "__main__":
    main()
