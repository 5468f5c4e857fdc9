"""Predicted peak memory against XLA's live peak, across strategies, on programs written as users write them.

    python benchmarks/bench_peak.py [--programs nnx_lm moe ...] [--mesh batch=4,model=2]

For each program of ``benchmarks/programs`` (with its roles file): the program on one device, then every
manual strategy that applies on the mesh (8 host CPU devices), each checked by ``toast.validate`` (h100 profile).
Per row: the predicted peak, XLA's live peak (the bytes live at once under its schedule, from its live-range
report), the error, and what of XLA's peak is its CPU backend's layout copies and collective results, and XLA's
footprint (what it allocates: the live peak plus its heap packing's fragmentation). Per program, the spread of
the error over its strategies (largest less smallest): the search ranks strategies by the prediction, so an
error that changes with the strategy misranks them where a constant one does not. Prints Markdown for
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import toast
from toast.sharding import roles_for_input

PROGRAMS = ("nnx_lm", "equinox_vit", "moe", "scan_llama", "hf_whisper", "dit", "flax_t5", "mamba_moe")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=PROGRAMS)
    parser.add_argument("--mesh", default="batch=4,model=2")
    options = parser.parse_args()
    hardware = toast.load_hardware("h100")
    print(f"mesh {options.mesh}, h100 profile, {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| program | strategy | predicted B | XLA live peak B | error | of it layout copies | collective results "
          "| XLA footprint B |")
    print("|---|---|---|---|---|---|---|---|")
    spreads, errors = [], []
    for name in options.programs:
        source = f"benchmarks.programs.{name}:{name}"
        analysis = toast.analyze(source)
        roles = roles_for_input(source)
        cases: list[tuple[str, toast.ShardingModel, toast.ShardingState]] = []
        single = toast.ShardingModel(analysis, toast.parse_mesh("batch=1"))
        cases.append(("one device", single, single.initial()))
        model = toast.ShardingModel(analysis, toast.parse_mesh(options.mesh))
        for strategy in toast.STRATEGIES:
            try:
                state, _ = toast.manual_strategy(model, strategy, roles)
            except (toast.ToastError, toast.InvalidState):
                continue
            cases.append((strategy, model, state))
        program_errors = []
        for label, case_model, state in cases:
            result = toast.validate(case_model, state, hardware)
            program_errors.append(result.peak_error)
            print(f"| {name} | {label} | {result.predicted_peak_bytes:,} | {result.xla_peak_bytes:,} | "
                  f"{result.peak_error:+.1%} | {result.xla_layout_copy_bytes:,} | {result.xla_collective_bytes:,} | "
                  f"{result.xla_footprint_bytes:,} |", flush=True)
        spreads.append((name, max(program_errors) - min(program_errors)))
        errors.extend(program_errors)
    print("\n| program | error spread over its strategies |")
    print("|---|---|")
    for name, spread in spreads:
        print(f"| {name} | {spread:.1%} |")
    print(f"\nmean error {statistics.mean(errors):+.1%}, mean |error| {statistics.mean(abs(e) for e in errors):.1%}, "
          f"mean spread {statistics.mean(s for _, s in spreads):.1%} over {len(errors)} rows")


if __name__ == "__main__":
    main()
