"""The paper's evaluation (section 5, Figure 8) on the bundled model zoo: ``toast compare`` at full sizes.

    python benchmarks/bench_zoo.py [--case t2b:batch=2,model=4:a100_80gb ...] [--rollouts 2000]

Each case is MODEL:MESH:HARDWARE (MODEL an EXAMPLES name). For each: lowers the model from shapes, analyzes
it (embedded engine), searches (default settings, one worker per core) and prices every manual strategy
that applies. Prints Markdown rows for BENCHMARKS.md: every strategy's estimated step time, peak per device
and whether it is over the profile's HBM; on toast's row the program's ops (and how many have no rule), the
lowering and analysis seconds and the search seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import toast
from toast.evaluation.compare import compare
from toast.examples import EXAMPLES
from toast.output.report import human_bytes, human_seconds
from toast.search import Budget
from toast.sharding.roles import roles_for_input

DEFAULT_CASES = ["t2b:batch=2,model=4:a100_80gb", "t2b:batch=8,model=8:a100_80gb", "t2b:batch=2,model=4:tpu_v3",
                 "t2b:batch=8,model=8:tpu_v3", "gns:batch=4,model=2:a100_80gb", "unet:batch=4,model=2:a100_80gb",
                 "itx:batch=4,model=2:a100_80gb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", default=DEFAULT_CASES, help="MODEL:MESH:HARDWARE")
    parser.add_argument("--rollouts", type=int, default=2000)
    options = parser.parse_args()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
          f"rollouts {options.rollouts}, seed 0")
    print("| model | mesh | hardware | strategy | step time | peak per device | over memory | ops (unruled) | "
          "analysis s | search s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    analyses: dict[str, tuple[object, float]] = {}
    for case in options.case:
        model, mesh, hardware = case.split(":")
        spec = EXAMPLES[model]
        if spec not in analyses:
            analyses.clear()
            start = time.perf_counter()
            analyses[spec] = (toast.analyze(spec, engine="embedded"), time.perf_counter() - start)
        analysis, analysis_seconds = analyses[spec]
        result = compare(analysis, toast.parse_mesh(mesh), toast.load_hardware(hardware), source=spec,
                         roles=roles_for_input(spec), budget=Budget(rollouts=options.rollouts))
        for row in result.rows:
            if row.cost is None:
                continue
            name = "**toast**" if row.name == "toast" else row.name
            ops = f"{len(analysis.program.ops)} ({len(analysis.unruled_ops)})"
            seconds = (f"{ops} | {analysis_seconds:.1f} | {row.search_seconds:.2f}" if row.name == "toast"
                       else " | | ")
            print(f"| {model} | {mesh} | {hardware} | {name} | {human_seconds(row.cost.step_time_s)} | "
                  f"{human_bytes(row.cost.peak_bytes)} | {'yes' if row.over_memory else 'no'} | {seconds} |",
                  flush=True)


if __name__ == "__main__":
    main()
