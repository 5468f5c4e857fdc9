"""Fuzz the readers a user feeds (issue 11) for longer than the default test run does.

    python benchmarks/bench_fuzz.py --inputs 10000 [--readers stablehlo bytecode ...] [--cli-every 20]
                                    [--save fuzz-failures] [--seed 0]

The inputs are split over the readers by ``SHARE``; the generators and checks are those of
``tests/test_fuzz.py`` (``tests/fuzz_inputs.py``). Prints per reader: inputs tried (distinct),
accepted, refused with one error line, command line runs, failures (tracebacks, hangs, stray
files) and seconds; failing inputs are saved under ``--save`` with why they failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import fuzz_inputs  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

# Share of the inputs per reader (the bytecode and rules checks cost the most per input).
SHARE = {"stablehlo": 0.3, "bytecode": 0.1, "strategy": 0.25, "hardware": 0.25, "rules": 0.1}


def run(reader: str, count: int, *, cli_every: int, save: Path, random_seed: int) -> fuzz_inputs.Fuzzer:
    fuzzer = fuzz_inputs.Fuzzer(reader, cli_every=cli_every, save_dir=save)

    @seed(random_seed)
    @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(fuzz_inputs.STRATEGIES[reader]())
    def fuzz(case):
        fuzzer(case)

    try:
        fuzz()
    finally:
        fuzzer.close()
    return fuzzer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=10000, help="inputs in all, split by SHARE")
    parser.add_argument("--readers", nargs="*", default=list(fuzz_inputs.READERS), choices=fuzz_inputs.READERS)
    parser.add_argument("--cli-every", type=int, default=20,
                        help="also run the command line on every N-th input the reader accepts")
    parser.add_argument("--save", default="fuzz-failures", help="directory for failing inputs")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    share = sum(SHARE[r] for r in options.readers)
    print("| reader | inputs tried | distinct | accepted | refused (one line) | command line runs | "
          "failures | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    totals = [0, 0, 0, 0, 0, 0, 0.0]
    start = time.monotonic()
    for reader in options.readers:
        count = max(1, round(options.inputs * SHARE[reader] / share))
        fuzzer = run(reader, count, cli_every=options.cli_every, save=Path(options.save), random_seed=options.seed)
        t = fuzzer.tally
        extra = f" ({fuzzer.worker.crashes} crashed or hung the MLIR reader)" if fuzzer.worker else ""
        row = [t.tried, len(t.distinct), t.accepted, t.refused, t.cli_runs, len(t.failures), t.seconds]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        print(f"| {reader} | {t.tried} | {len(t.distinct)} | {t.accepted} | {t.refused}{extra} | {t.cli_runs} | "
              f"{len(t.failures)} | {t.seconds:.0f} |", flush=True)
        for failure in t.failures[:3]:
            print("    " + failure.replace("\n", "\n    ")[:2000], file=sys.stderr)
    print(f"| all | {totals[0]} | {totals[1]} | {totals[2]} | {totals[3]} | {totals[4]} | {totals[5]} | "
          f"{totals[6]:.0f} |")
    print(f"wall time {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
