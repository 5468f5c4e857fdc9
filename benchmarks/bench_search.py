"""The partitioner on the GPT-style training step: toast's strategy against the manual ones, and search time.

    python benchmarks/bench_search.py [--layers 6 12 24] [--mesh batch=4,model=2] [--hardware a100_80gb h100 tpu_v3]
                                      [--memory GiB] [--rollouts 2000] [--seed 0] [--repeats 3] [--search mcts]

For each depth and profile: analyzes the GPT-2-small-sized step (D=768, 12 heads, vocab 50304, B=8, S=128),
searches a strategy (``--search``, MCTS by default, with its default settings; one worker per core), and
prints Markdown rows for BENCHMARKS.md:
toast and every manual strategy with estimated step time, peak per device and whether it is over the memory
limit, plus the search's wall-clock seconds, rollouts and states costed. ``--memory`` sets the limit (default:
the profile's HBM); a limit below data parallelism's peak shows the memory side. "setup s" builds the sharding
model, the action space and the cost model (linear in the program); "search s" is the search itself. Both are
medians of ``--repeats`` searches (each from scratch: new model, space, cost model and worker pool).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import toast
from toast.evaluation.compare import compare_manual
from toast.examples.gpt import gpt_train_step
from toast.output.report import human_bytes, human_seconds
from toast.search import SEARCHES, Budget
from toast.search.find import find_strategy
from toast.sharding import roles_for_input


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12])
    parser.add_argument("--mesh", default="batch=4,model=2")
    parser.add_argument("--hardware", nargs="+", default=["a100_80gb", "h100", "tpu_v3"])
    parser.add_argument("--memory", nargs="+", default=["hbm"], help="GiB per device, or hbm for the profile's "
                        "(several: one row group each)")
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--search", choices=tuple(SEARCHES), default="mcts")
    parser.add_argument("--repeats", type=int, default=3, help="searches per row; the seconds are their medians "
                        "(the strategy is the same every time)")
    options = parser.parse_args()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; mesh "
          f"{options.mesh}; search {options.search}, rollouts {options.rollouts}, seed {options.seed}")
    print("| L | hardware | memory limit | strategy | step time | peak per device | over memory | setup s | search s "
          "| rollouts | states costed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    roles = roles_for_input("toast.examples.gpt:gpt_train_step")
    for layers in options.layers:
        fn, args = gpt_train_step(layers=layers)
        analysis = toast.analyze("gpt", fn=fn, args=args)
        for name in options.hardware:
            hardware = toast.load_hardware(name)
            for memory_text in options.memory:
                memory = None if memory_text == "hbm" else float(memory_text)
                budget = Budget(seed=options.seed, rollouts=options.rollouts)
                setups, searches, masks = [], [], set()
                for _ in range(options.repeats):
                    start = time.perf_counter()
                    found = find_strategy(analysis, toast.parse_mesh(options.mesh), hardware,
                                          search=options.search, budget=budget, memory_gib=memory)
                    seconds = time.perf_counter() - start
                    setups.append(seconds - found.result.seconds)
                    searches.append(found.result.seconds)
                    masks.add(found.result.state.masks.tobytes())
                assert len(masks) == 1, "the same seed gave different strategies"
                limit = human_bytes(found.device_memory)
                result = found.result
                print(f"| {layers} | {name} | {limit} | **toast** | {human_seconds(result.cost.step_time_s)} | "
                      f"{human_bytes(result.cost.peak_bytes)} | {'yes' if found.over_memory else 'no'} | "
                      f"{statistics.median(setups):.2f} | {statistics.median(searches):.2f} | {result.rollouts} | "
                      f"{result.evaluations} |", flush=True)
                for row in compare_manual(found, roles):
                    if row.cost is None:
                        continue
                    print(f"| {layers} | {name} | {limit} | {row.name} | {human_seconds(row.cost.step_time_s)} | "
                          f"{human_bytes(row.cost.peak_bytes)} | {'yes' if row.over_memory else 'no'} | | | | |",
                          flush=True)


if __name__ == "__main__":
    main()
