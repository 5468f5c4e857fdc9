"""Analysis time of the GPT-style training step for L layers, per engine.

    python benchmarks/bench_analysis.py [--layers 2 6 12 24] [--engines embedded souffle]

Prints a Markdown table (ops, dimension names, seconds per phase) for BENCHMARKS.md. Sizes are
GPT-2 small's (B=8, S=128, D=768, H=12, V=50304); the op count does not depend on them.
"""

from __future__ import annotations

import argparse
import platform
import time

import toast
from toast.datalog.souffle import souffle_binary
from toast.examples.gpt import gpt_train_step
from toast.stablehlo import read_callable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 6, 12, 24])
    parser.add_argument("--engines", nargs="+", default=["embedded", "souffle"])
    parser.add_argument("--repeat", type=int, default=1, help="runs per point; the best is reported")
    options = parser.parse_args()
    engines = [e for e in options.engines if e != "souffle" or souffle_binary()]
    print(f"machine: {platform.machine()}, {platform.processor() or '?'}, python {platform.python_version()}")
    print("| engine | L | ops | dimension names | read s | facts s | datalog s | classes s | total s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for layers in options.layers:
        fn, args = gpt_train_step(layers=layers)
        start = time.perf_counter()
        program = read_callable(fn, args, name=f"gpt L={layers}")
        read_s = time.perf_counter() - start
        for engine in engines:
            best = None
            for _ in range(options.repeat):
                analysis = toast.analyze(program, engine=engine)
                seconds = analysis.stats["seconds"]
                if best is None or sum(seconds.values()) < sum(best.values()):
                    best = seconds
            total = read_s + best["facts"] + best["datalog"] + best["classes"]
            print(f"| {engine} | {layers} | {analysis.stats['ops']} | {analysis.stats['dimension_names']} | "
                  f"{read_s:.2f} | {best['facts']:.2f} | {best['datalog']:.2f} | {best['classes']:.2f} | {total:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
