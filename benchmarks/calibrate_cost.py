"""Calibrate and check the kernel cost model against the H100 measurements.

    python benchmarks/calibrate_cost.py [--programs DIR] [--reference ../shared/reference/gpu-h100]

Lowers the ten reference programs with the reference's ``programs.py`` (or reads ``DIR/NAME.mlir``), prices
each unsharded on one device with the ``h100`` profile, and prints Markdown tables for BENCHMARKS.md:

- step time: measured median, predicted, ratio, and the leave-one-out ratio: the one fitted parameter
  (``matmul_overhead``; every other ``[kernels]`` number is measured by ``benchmarks/gpu_microbench.py``) is
  refitted on the other nine programs (least squares on log time ratios, over a grid) and the left-out
  program predicted with it;
- the Spearman rank correlation of predicted and measured times;
- peak memory: XLA's ``peak_memory`` against the prediction, without and with donated parameters.

The GNN's reference time (119.6 ms) was taken with every edge index equal (all edges into one node: the
scatter-add's atomics collide); ``benchmarks/data/h100_programs.json`` has it again with uniform random
indices (11.3 ms) and with all-zero ones (117.4 ms). The model prices uniform indices (it cannot see the
data); both rows are shown and the fit uses the uniform one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import toast
from toast.cost.model import CostModel

HERE = Path(__file__).resolve().parent
DEFAULT_REFERENCE = HERE.parent.parent / "shared" / "reference" / "gpu-h100"
GRID = np.array([0.5, 1, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20]) * 1e-6  # matmul_overhead candidates, seconds


def _features(path: Path, hardware: toast.Hardware, donate: bool) -> dict:
    analysis = toast.analyze(str(path))
    model = toast.ShardingModel(analysis, toast.parse_mesh("device=1"))
    arguments = range(len(analysis.program.arguments)) if donate else ()
    costs = CostModel(model, hardware)
    state = model.initial()
    at_peak, moved, atomics = costs.kernel_work(state)
    cost = costs.evaluate(state)
    # The parameters' donation: jax.jit(fn, donate_argnums=(0,)) in the measurement, the first argument's
    # leaves (every argument but the data) here.
    params = [i for i, v in enumerate(analysis.program.arguments)
              if analysis.program.values[v].name.startswith("params")]
    donated = CostModel(model, hardware, donate=params or arguments).evaluate(state)
    library = np.asarray([k.kind in ("matmul", "library") for k in costs.plan.kernels])
    return {"at_peak": at_peak, "moved": moved, "atomics": atomics, "repeats": costs.repeats, "library": library,
            "predicted_s": cost.step_time_s, "peak": cost.peak_bytes, "donated_peak": donated.peak_bytes,
            "kernels": cost.kernels}


def _time(features: dict, hardware: toast.Hardware, matmul_overhead: float) -> float:
    compute = features["at_peak"] / hardware.matmul_efficiency + features["atomics"]
    memory = features["moved"] / (hardware.hbm_bandwidth * hardware.hbm_efficiency)
    overhead = np.where(features["library"], matmul_overhead, hardware.kernel_overhead)
    return float(((np.maximum(compute, memory) + overhead) * features["repeats"]).sum()) + hardware.step_overhead


def _fit(rows: dict, names: list[str], hardware: toast.Hardware) -> float:
    losses = [sum(np.log(_time(rows[n], hardware, g) / rows[n]["measured_s"]) ** 2 for n in names) for g in GRID]
    return float(GRID[int(np.argmin(losses))])


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=Path, help="directory of NAME.mlir (default: lower them now)")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    options = parser.parse_args()
    reference = json.loads((options.reference / "measurements.json").read_text())["programs"]
    ours = json.loads((HERE / "data" / "h100_programs.json").read_text())["programs"]
    hardware = toast.load_hardware("h100")
    with tempfile.TemporaryDirectory() as scratch:
        programs = options.programs
        if programs is None:
            programs = Path(scratch)
            subprocess.run([sys.executable, str(options.reference / "programs.py"), str(programs)], check=True,
                           stdout=subprocess.DEVNULL)
        rows = {}
        for name in sorted(reference):
            rows[name] = _features(programs / f"{name}.mlir", hardware, donate=True)
            measured = reference[name]["step_ms_median"] * 1e-3
            rows[name]["reference_s"] = measured
            rows[name]["measured_s"] = ours[name]["step_ms_median"] * 1e-3 if name.startswith("gnn") else measured
            print(f"priced {name}", file=sys.stderr, flush=True)
    names = sorted(rows)
    fitted = _fit(rows, names, hardware)
    print(f"matmul_overhead fitted on all ten: {fitted * 1e6:g} us (profile: {hardware.matmul_overhead * 1e6:g} us)")
    print()
    print("| program | measured ms | predicted ms | ratio | leave-one-out ratio | kernels |")
    print("|---|---|---|---|---|---|")
    predicted, measured_times = [], []
    for name in names:
        row = rows[name]
        loo = _fit(rows, [n for n in names if n != name], hardware)
        loo_ratio = _time(row, hardware, loo) / row["measured_s"]
        ratio = row["predicted_s"] / row["measured_s"]
        label = name + (" (uniform indices)" if name.startswith("gnn") else "")
        print(f"| {label} | {row['measured_s'] * 1e3:.2f} | {row['predicted_s'] * 1e3:.2f} | {ratio:.2f} | "
              f"{loo_ratio:.2f} | {row['kernels']} |")
        if name.startswith("gnn"):
            print(f"| {name} (reference: equal indices) | {row['reference_s'] * 1e3:.2f} | "
                  f"{row['predicted_s'] * 1e3:.2f} | {row['predicted_s'] / row['reference_s']:.2f} | | |")
        predicted.append(row["predicted_s"])
        measured_times.append(row["measured_s"])
    print()
    with_reference = [rows[n]["reference_s"] for n in names]
    print(f"Spearman rank correlation, predicted vs measured: {_spearman(predicted, measured_times):.3f} "
          f"(against the reference's GNN time: {_spearman(predicted, with_reference):.3f})")
    print()
    print("| program | XLA peak MiB | predicted MiB | ratio | donated: XLA MiB | predicted MiB | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        row = rows[name]
        xla = reference[name]["memory_bytes"]["peak_memory_in_bytes"]
        donated = ours[name].get("donated_memory_bytes", {}).get("peak_memory_in_bytes")
        donated_cells = (f"{donated / 2**20:,.0f} | {row['donated_peak'] / 2**20:,.0f} | "
                         f"{row['donated_peak'] / donated:.2f}") if donated else "| |"
        print(f"| {name} | {xla / 2**20:,.0f} | {row['peak'] / 2**20:,.0f} | {row['peak'] / xla:.2f} | "
              f"{donated_cells} |")


if __name__ == "__main__":
    main()
