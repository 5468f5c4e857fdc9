"""Megatron-LM's SC'21 Table 1 (the rows without pipeline parallelism) in toast's cost model: TFLOP/s per GPU
against the published numbers.

    python benchmarks/bench_megatron.py [--sizes 1.7B 3.6B 7.5B 18B] [--hardware a100_80gb]

For each row: ``../shared/reference/published/megatron_gpt.py`` writes the step (one micro-batch per
data-parallel rank, mixed precision, full recomputation), ``toast cost`` prices Megatron's strategy on
mesh ``data=DP,model=TP`` (TP inside a node, as Selene ran it) with the row's micro-batches per gradient
all-reduce, and the throughput is the paper's FLOP count (eq. 3) over the step time and the GPUs. Prints a
Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE.parent.parent / "shared" / "reference" / "published"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1.7B", "3.6B", "7.5B", "18B"])
    parser.add_argument("--hardware", default="a100_80gb")
    parser.add_argument("--published", default=str(PUBLISHED))
    options = parser.parse_args()
    published = Path(options.published)
    table = json.loads((published / "published.json").read_text())["training"][0]
    rows = {f"{row['params_b']:g}B": row for row in table["rows"]}
    rows["18B"] = rows.pop("18.4B")  # megatron_gpt.py names the 18.4B row 18B
    vocab, seq = 51200, 2048
    print(f"hardware {options.hardware}; flop formula: {table['flop_formula']}")
    print("| row | GPUs | mesh | micro-batches | step s | compute s | memory s | exposed comm s | hidden comm s "
          "| toast TFLOP/s | published | toast / published |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in options.sizes:
        row = rows[size]
        tp, gpus, batch, mbs = row["tp"], row["gpus"], row["batch"], row["mbs"]
        dp = gpus // tp
        microbatches = batch // (dp * mbs)
        with tempfile.TemporaryDirectory() as folder:
            program = Path(folder) / f"{size}.mlir"
            subprocess.run([sys.executable, str(published / "megatron_gpt.py"), "--size", size, "-o", str(program)],
                           check=True, capture_output=True)
            out = Path(folder) / "cost.json"
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "toast.cli", "cost", str(program), "--hardware", options.hardware,
                            "--mesh", f"data={dp},model={tp}", "--strategy", "megatron", "--roles",
                            str(published / "megatron_gpt.roles.toml"), "--microbatches", str(microbatches),
                            "--json", str(out)], check=True, capture_output=True)
            seconds = time.perf_counter() - start
            cost = json.loads(out.read_text())
        h, layers = row["hidden"], row["layers"]
        flops = 96 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
        step = cost["step_time_s"]
        tflops = flops / step / gpus / 1e12
        b = cost["breakdown"]
        print(f"| {size} | {gpus} | data={dp},model={tp} | {microbatches} | {step:.2f} | {b['compute_bound_s']:.2f} | "
              f"{b['memory_bound_s']:.2f} | {b['exposed_communication_s']:.3f} | {b['hidden_communication_s']:.3f} | "
              f"{tflops:.0f} | {row['tflops_per_gpu']} | {tflops / row['tflops_per_gpu']:.2f} |", flush=True)
        print(f"<!-- {size}: toast cost took {seconds:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
