"""The whole ``toast autoshard`` on frontier-size programs: CPU seconds, wall seconds, peak memory, seconds per stage.

    python benchmarks/bench_frontier.py [--case 70b 405b 405b-4axis] [--rollouts N] [--workers N]
                                        [--profile DIR] [-- EXTRA AUTOSHARD OPTIONS]

Cases (``benchmarks/programs/frontier.py``; hardware ``h100``, the analysis cache off: ``--no-cache`` and
``TOAST_NO_CACHE=1``, so every run analyzes afresh):

* ``70b``: Llama-3-70B-shaped step (80 layers, remat per layer, 57,525 ops) on ``data=128,model=8``: 1024 devices.
* ``405b``: Llama-3.1-405B-shaped step (126 layers, 90,415 ops) on ``data=64,seq=8,model=8``: 4096 devices over
  three axes.
* ``405b-4axis``: the same step on ``data=16,fsdp=32,seq=2,model=8``: 8192 devices over four axes.

Each case runs in a child process: ``toast``'s command line (``toast.cli.main``, ``toast autoshard SPEC --mesh MESH
--hardware h100 --no-cache``) with probes around the stages, ended as the ``toast`` command ends (``toast.cli.run``).
The parent reads the child's CPU seconds (user + system of it and its own children: Soufflé, the search's workers)
from ``resource.getrusage(RUSAGE_CHILDREN)``, and wall seconds; the child, its peak resident memory (``ru_maxrss`` of
itself and of its children: the largest process of the tree). The probes time each stage in CPU seconds of the child
and its children (inclusive: a stage's row counts the stages it calls, shown indented below it); ``other`` is what no
top-level probe covers in toast's ``main`` (argument parsing, the table printed), ``start-up and exit`` the Python
start, the imports before it and the process's end. ``lower with JAX`` includes importing JAX and the program's
module (their first use); the summary's ``search CPU s`` is ``find_strategy``'s seconds less those of its other rows.
``--profile DIR`` also writes each child's cProfile statistics to ``DIR/<case>.prof``.

Prints one Markdown table per case, then a summary row per case for BENCHMARKS.md. The CPU seconds do not depend
on other processes on the machine (wall seconds do); the search's seconds depend on ``--rollouts``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

CASES = {
    "70b": ("benchmarks.programs.frontier:llama3_70b", "data=128,model=8"),
    "405b": ("benchmarks.programs.frontier:llama31_405b", "data=64,seq=8,model=8"),
    "405b-4axis": ("benchmarks.programs.frontier:llama31_405b", "data=16,fsdp=32,seq=2,model=8"),
}
# (module, attribute or Class.method, stage, depth): the functions a stage is; depth 1 rows are parts of the depth 0
# row above. A name the code no longer has is skipped (its row is absent).
PROBES = (
    ("toast.analysis.named_dimensions", "analyze", "analysis", 0),
    ("toast.analysis.named_dimensions", "load_program_text", "lower with JAX", 1),
    ("toast.analysis.named_dimensions", "read_text", "read the MLIR text", 1),
    ("toast.analysis.named_dimensions", "program_facts", "facts", 1),
    ("toast.analysis.named_dimensions", "evaluate", "Datalog (both programs)", 1),
    ("toast.analysis.named_dimensions", "_classes", "classes", 1),
    ("toast.analysis.named_dimensions", "conflict_facts", "conflict facts", 1),
    ("toast.analysis.named_dimensions", "build_conflicts", "conflicts", 1),
    ("toast.analysis.named_dimensions", "_build", "build the Analysis", 1),
    ("toast.search.find", "find_strategy", "find_strategy", 0),
    ("toast.sharding.state", "ShardingModel.__init__", "ShardingModel", 1),
    ("toast.search.actions", "ActionSpace.__init__", "ActionSpace", 1),
    ("toast.cost.model", "CostModel.__init__", "CostModel (cost_plan)", 1),
    ("toast.cost.model", "CostModel.prepare", "CostModel.prepare", 1),
    ("toast.search.find", "roles_or_proposed", "roles", 1),
    ("toast.search.find", "price_manual_strategies", "manual strategies priced", 1),
    ("toast.evaluation.compare", "compare_manual", "comparison table", 0),
    ("toast.output.autoshard", "strategy_document", "strategy document", 0),
    ("toast.output.files", "write_outputs", "files written", 0),
)


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _install_probes(totals: dict[str, float]) -> None:
    """Wrap every function of ``PROBES`` the code has so that its CPU seconds add up in ``totals``."""
    import importlib

    for module_name, path, stage, _ in PROBES:
        *owners, attribute = path.split(".")
        try:
            owner: Any = importlib.import_module(module_name)
            for name in owners:  # a method: its class
                owner = getattr(owner, name)
            original = getattr(owner, attribute)
        except (ImportError, AttributeError):
            continue
        setattr(owner, attribute, _timed(original, stage, totals))


def _timed(original: Callable[..., Any], stage: str, totals: dict[str, float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = cpu_seconds()
        try:
            return original(*args, **kwargs)
        finally:
            totals[stage] = totals.get(stage, 0.0) + cpu_seconds() - start

    return timed


def child(argv: list[str], stages_path: str, profile_path: str | None) -> NoReturn:
    """In the child: toast's command line with the probes; the stages' seconds written to ``stages_path``."""
    from toast.cli import main
    from toast.processes import exit_at_once

    totals: dict[str, float] = {}
    _install_probes(totals)
    start = cpu_seconds()
    if profile_path:
        import cProfile

        profiler = cProfile.Profile()
        status = profiler.runcall(main, argv)
        profiler.dump_stats(profile_path)
    else:
        status = main(argv)
    totals["total (in process)"] = cpu_seconds() - start
    # Peak RSS here, not in the parent: RUSAGE_CHILDREN's ru_maxrss is the largest over every case run so far.
    peak_kib = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    Path(stages_path).write_text(json.dumps({"stages": totals, "peak_rss_bytes": peak_kib * 1024}))
    exit_at_once(status)  # as the ``toast`` command ends (``toast.cli.run``): its exit is part of its seconds


def run_case(name: str, *, rollouts: int | None, workers: int | None, extra: list[str],
             profile_dir: str | None) -> dict[str, Any]:
    """One case in a child process: its CPU and wall seconds, peak RSS, stages and the output's first line."""
    spec, mesh = CASES[name]
    argv = ["autoshard", spec, "--mesh", mesh, "--hardware", "h100", "--no-cache"]
    if rollouts is not None:
        argv += ["--rollouts", str(rollouts)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    argv += extra
    with tempfile.TemporaryDirectory() as folder:
        stages_path = str(Path(folder) / "stages.json")
        command = [sys.executable, __file__, "--child", stages_path]
        if profile_dir:
            command += ["--child-profile", str(Path(profile_dir) / f"{name}.prof")]
        command += ["--", *argv]
        env = {**os.environ, "TOAST_NO_CACHE": "1"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        measured = json.loads(Path(stages_path).read_text()) if Path(stages_path).exists() else {}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stdout.splitlines()
    return {"case": name, "spec": spec, "mesh": mesh, "status": done.returncode, "cpu_s": cpu, "wall_s": wall,
            "peak_rss_bytes": measured.get("peak_rss_bytes", 0), "stages": measured.get("stages", {}),
            "summary": lines[0] if lines else done.stderr.strip().splitlines()[-1:],
            "table": [line for line in lines if line.startswith("|")], "stderr": done.stderr.strip()[-2000:]}


def stage_rows(stages: dict[str, float]) -> list[tuple[str, float]]:
    """The stages in ``PROBES``' order (parts indented), then ``other``."""
    rows, top = [], 0.0
    for _, _, stage, depth in PROBES:
        if stage in stages:
            rows.append(("  " * depth + stage, stages[stage]))
            top += stages[stage] if depth == 0 else 0.0
    if "total (in process)" in stages:
        rows.append(("other", stages["total (in process)"] - top))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--rollouts", type=int, help="the search's rollouts (default: toast autoshard's)")
    parser.add_argument("--workers", type=int, help="the search's worker processes (default: toast autoshard's)")
    parser.add_argument("--profile", metavar="DIR", help="write each case's cProfile statistics to DIR/<case>.prof")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-profile", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="more toast autoshard options, after --")
    options = parser.parse_args()
    if options.child:
        child(options.extra, options.child, options.child_profile)
    if options.profile:
        Path(options.profile).mkdir(parents=True, exist_ok=True)
    results = []
    for name in options.case:
        result = run_case(name, rollouts=options.rollouts, workers=options.workers, extra=options.extra,
                          profile_dir=options.profile)
        results.append(result)
        print(f"\n{name}: {result['spec']} on {result['mesh']} (exit {result['status']})")
        print(f"  {result['summary']}")
        for line in result["table"]:
            print(f"  {line}")
        if result["status"] not in (0, 3):
            print(result["stderr"])
        print("| stage | CPU s |\n|---|---|")
        for stage, seconds in stage_rows(result["stages"]):
            print(f"| {stage} | {seconds:.1f} |")
        if "total (in process)" in result["stages"]:
            print(f"| start-up and exit (Python, imports before toast's main, the process's end) | "
                  f"{result['cpu_s'] - result['stages']['total (in process)']:.1f} |")
        print(f"| **whole toast autoshard** (process tree) | **{result['cpu_s']:.1f}** |")
        print(f"wall {result['wall_s']:.1f} s, peak RSS {result['peak_rss_bytes'] / 2 ** 30:.2f} GiB")
    print("\n| case | mesh | devices | CPU s | wall s | peak RSS GiB | search CPU s | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        devices = 1
        for entry in result["mesh"].split(","):
            devices *= int(entry.partition("=")[2])
        stages = result["stages"]
        inner = sum(stages.get(s, 0.0) for s in ("ShardingModel", "ActionSpace", "CostModel (cost_plan)",
                                                  "CostModel.prepare", "roles", "manual strategies priced"))
        search = stages.get("find_strategy", 0.0) - inner
        print(f"| {result['case']} | {result['mesh']} | {devices} | {result['cpu_s']:.1f} | {result['wall_s']:.1f} "
              f"| {result['peak_rss_bytes'] / 2 ** 30:.2f} | {search:.1f} | {result['status']} |")
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
