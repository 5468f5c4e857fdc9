"""Time to evaluate one sharding state of the GPT-style training step (the search's inner loop).

    python benchmarks/bench_cost.py [--layers 12] [--repeat 200]

Evaluates each manual strategy's state of the GPT-2-small-sized step on mesh batch=4,model=2
with the A100 80GB profile, one core (numpy single-threaded), and prints a Markdown table of
milliseconds per evaluation (mean over --repeat runs) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import platform  # noqa: E402
import time  # noqa: E402

import toast  # noqa: E402
from toast.examples.gpt import gpt_train_step  # noqa: E402
from toast.sharding import roles_for_input  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=200)
    options = parser.parse_args()
    fn, args = gpt_train_step(layers=options.layers)
    analysis = toast.analyze("toast.examples.gpt:gpt_train_step", fn=fn, args=args)
    start = time.perf_counter()
    model = toast.ShardingModel(analysis, toast.parse_mesh("batch=4,model=2"))
    costs = toast.CostModel(model, toast.load_hardware("a100_80gb"))
    setup = time.perf_counter() - start
    print(f"machine: {platform.machine()}, python {platform.python_version()}; L={options.layers}, "
          f"{len(analysis.program.ops)} ops, {analysis.names.count} names; setup {setup * 1e3:.0f} ms")
    print("| strategy | collectives | ms per evaluation |")
    print("|---|---|---|")
    roles = roles_for_input("toast.examples.gpt:gpt_train_step")  # toast/examples/gpt.roles.toml
    for name in toast.STRATEGIES:
        state, _ = toast.manual_strategy(model, name, roles)
        cost = costs.evaluate(state)
        start = time.perf_counter()
        for _ in range(options.repeat):
            costs.evaluate(state)
        seconds = (time.perf_counter() - start) / options.repeat
        print(f"| {name} | {len(cost.collectives)} | {seconds * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
