"""Predictions against XLA: each manual strategy of the GPT-style step on 8 host CPU devices.

    python benchmarks/bench_validate.py [--size small|medium] [--mesh batch=2,model=4]

For each strategy: write the sharded module (``toast.output.sharded_stablehlo``), compile and run it with XLA's
SPMD partitioner on 8 host CPU devices next to the unsharded program, and compare collectives
(kind, mesh axes, bytes per device; 10% tolerance) and peak memory per device with XLA's
(arguments + outputs + temporaries). Prints a Markdown table for BENCHMARKS.md.

Sizes: ``small`` is ``gpt_small`` (B=2, S=16, D=64, H=4, V=128, L=2); ``medium`` is B=8, S=64,
D=256, H=8, V=1024, L=2.
"""

from __future__ import annotations

import argparse
import platform
import time

import toast
from toast.examples.gpt import gpt_train_step
from toast.sharding import roles_for_input

SIZES = {
    "small": dict(layers=2, batch=2, seq=16, d_model=64, heads=4, vocab=128),
    "medium": dict(layers=2, batch=8, seq=64, d_model=256, heads=8, vocab=1024),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--mesh", default="batch=2,model=4")
    options = parser.parse_args()
    fn, args = gpt_train_step(**SIZES[options.size])
    analysis = toast.analyze("toast.examples.gpt:gpt_train_step", fn=fn, args=args)
    model = toast.ShardingModel(analysis, toast.parse_mesh(options.mesh))
    hardware = toast.load_hardware("a100_80gb")
    roles = roles_for_input("toast.examples.gpt:gpt_train_step")  # toast/examples/gpt.roles.toml
    print(f"GPT step {options.size} {SIZES[options.size]}, {len(analysis.program.ops)} ops, mesh {options.mesh}, "
          f"{platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d')}\n")
    print("| strategy | numerics (max abs err) | collectives predicted / XLA | within 10% | agreement "
          "| peak predicted / XLA (MiB) | peak error | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for strategy in toast.STRATEGIES:
        state, _ = toast.manual_strategy(model, strategy, roles)
        start = time.perf_counter()
        result = toast.validate(model, state, hardware)
        seconds = time.perf_counter() - start
        numerics = "match" if result.numerics.match else "MISMATCH"
        print(f"| {strategy} | {numerics} ({result.numerics.max_abs_error:.1e}) | {result.predicted_count} / "
              f"{result.xla_count} | {result.matched} | {result.agreement:.0%} | "
              f"{result.predicted_peak_bytes / 2**20:.2f} / {result.xla_peak_bytes / 2**20:.2f} | "
              f"{result.peak_error:+.1%} | {seconds:.1f} |")
        for row in result.rows:
            if row.matched < max(row.predicted, row.xla):
                print(f"|  ↳ {row.kind} over {'+'.join(row.axes)} | | {row.predicted} / {row.xla} | {row.matched} "
                      f"| | {row.predicted_bytes} B / {row.xla_bytes} B | | |")


if __name__ == "__main__":
    main()
