"""Fit the TPU profiles' matmul efficiency to the published MaxText runs, with leave-one-out errors.

    python benchmarks/fit_tpu_kernels.py [--json FILE]

The TPU profiles' kernel numbers were the H100's (``matmul_efficiency = 0.70``, "assumed"). The published TPU
rows of ``../shared/reference/published/maxtext.json`` (T6 on v5e, T15 on v4, T11 on v6e) are full training
steps whose time is mostly their matmuls (``benchmarks/bench_maxtext.py``), so they pin down one physical number:
the fraction of the MXU's bf16 peak XLA's matmuls reach on a TPU. One number for every TPU generation (a
per-row or per-generation number would be a per-program fit: one row each), chosen to minimise the squared
log error of toast's step against the published one over the rows; the leave-one-out error of a row is toast's
step with the number fitted on the other rows, against that row's published step. The other kernel numbers
(HBM efficiency, overheads) stay assumed: the rows' memory-bound and overhead seconds are under a tenth of
their steps, too little to fit them.

Prints the fit and a Markdown table (row, toast / published at the old number, at the fit, leave-one-out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import bench_maxtext  # noqa: E402
from benchmarks.programs import maxtext  # noqa: E402

GRID = np.round(np.arange(0.50, 1.0001, 0.005), 3)  # candidate efficiencies


def _priced_rows() -> list[dict[str, Any]]:
    """Per TPU row: its id, published step, and a function pricing its step at a matmul efficiency."""
    import toast

    rows = []
    for entry in json.loads(maxtext.PUBLISHED.read_text())["rows"]:
        if not entry["accelerator"].startswith("TPU"):
            continue
        row = bench_maxtext.row_model(entry, engine="auto", published=maxtext.PUBLISHED)
        model, state, hardware, donate = row.model, row.state, row.hardware, row.donate

        def step(efficiency: float, *, model=model, state=state, hardware=hardware, donate=donate) -> float:
            profile = dataclasses.replace(hardware, matmul_efficiency=float(efficiency))
            return toast.CostModel(model, profile, donate=donate).evaluate(state, collectives=False).step_time_s

        rows.append({"row": entry["id"], "hardware": hardware.name, "published_s": entry["published_step_s"],
                     "old_efficiency": hardware.matmul_efficiency, "step": step})
    return rows


def _fit(errors: np.ndarray) -> float:
    """The grid efficiency minimising the summed squared log errors (``errors``: ``[rows, grid]``)."""
    return float(GRID[int(np.argmin((errors ** 2).sum(axis=0)))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the fit to this JSON file")
    options = parser.parse_args()
    rows = _priced_rows()
    # log(toast / published) per row and grid point.
    errors = np.asarray([[math.log(row["step"](e) / row["published_s"]) for e in GRID] for row in rows])
    fitted = _fit(errors)
    at = {float(e): i for i, e in enumerate(GRID)}
    results = []
    for index, row in enumerate(rows):
        others = np.delete(errors, index, axis=0)
        held_out = _fit(others)
        results.append({
            "row": row["row"], "hardware": row["hardware"], "published_s": row["published_s"],
            "old_ratio": row["step"](row["old_efficiency"]) / row["published_s"],
            "fit_ratio": math.exp(errors[index, at[fitted]]),
            "leave_one_out_efficiency": held_out,
            "leave_one_out_ratio": math.exp(errors[index, at[held_out]]),
        })
    print(f"matmul_efficiency fitted on {', '.join(r['row'] for r in rows)}: {fitted:.3f}")
    print("\n| row | profile | published s | toast / published at 0.70 | at the fit | leave-one-out (its fit) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['row']} | {r['hardware']} | {r['published_s']:.2f} | {r['old_ratio']:.3f} | "
              f"{r['fit_ratio']:.3f} | {r['leave_one_out_ratio']:.3f} ({r['leave_one_out_efficiency']:.3f}) |")
    if options.json:
        Path(options.json).write_text(json.dumps({"matmul_efficiency": fitted, "rows": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
