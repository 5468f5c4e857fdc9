"""Analysis time of the GPT-style training step for L layers, per engine.

    python benchmarks/bench_analysis.py [--layers 2 6 12 24] [--engines embedded souffle]

Prints a Markdown table (ops, dimension names, conflicts, resolution bits, seconds per phase)
for BENCHMARKS.md. Sizes are GPT-2 small's (B=8, S=128, D=768, H=12, V=50304); the op count
does not depend on them. CPU s: the process's CPU seconds for the analysis after reading (the cache
left out). The conflicts phase is the second stage: conflict facts, the
conflicts rules, the crossing-path check, the closure and the layer grouping.
"""

from __future__ import annotations

import argparse
import platform
import time

import toast
from toast.datalog.souffle import souffle_binary
from toast.examples.gpt import gpt_train_step
from toast.frontend.stablehlo import read_callable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 6, 12, 24])
    parser.add_argument("--engines", nargs="+", default=["embedded", "souffle"])
    parser.add_argument("--repeat", type=int, default=1, help="runs per point; the best is reported")
    options = parser.parse_args()
    engines = [e for e in options.engines if e != "souffle" or souffle_binary()]
    print(f"machine: {platform.machine()}, {platform.processor() or '?'}, python {platform.python_version()}")
    print("| engine | L | ops | dimension names | conflicts | boxes | sets | bits | read s | facts s | datalog s "
          "| classes s | conflicts s | total s | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for layers in options.layers:
        fn, args = gpt_train_step(layers=layers)
        start = time.perf_counter()
        program = read_callable(fn, args, name=f"gpt L={layers}")
        read_s = time.perf_counter() - start
        for engine in engines:
            best = None
            for _ in range(options.repeat):
                cpu = time.process_time()
                analysis = toast.analyze(program, engine=engine, cache=False)  # the analysis itself, every run
                seconds = dict(analysis.stats["seconds"], cpu=time.process_time() - cpu)
                if best is None or seconds["cpu"] < best["cpu"]:
                    best = seconds
            total = read_s + best["facts"] + best["datalog"] + best["classes"] + best["conflicts"]
            stats = analysis.stats
            print(f"| {engine} | {layers} | {stats['ops']} | {stats['dimension_names']} | {stats['conflicts']} | "
                  f"{stats['boxes']} | {stats['compatibility_sets']} | {stats['resolution_bits']} | "
                  f"{read_s:.2f} | {best['facts']:.2f} | {best['datalog']:.2f} | {best['classes']:.2f} | "
                  f"{best['conflicts']:.2f} | {total:.2f} | {best['cpu']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
