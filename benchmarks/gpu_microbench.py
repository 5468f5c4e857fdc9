"""Measure the physical numbers the kernel cost model needs on one accelerator (run on a GPU machine).

``python benchmarks/gpu_microbench.py OUT.json [--quick]`` runs ``toast.cost.microbench.measure_kernels`` (what
``toast calibrate --kernels`` runs) and writes its document: the device, jax version, date, and one row per case
(seconds, FLOPs, bytes, kernels). ``benchmarks/data/h100_microbench.json`` is one such run; the h100 profile's
measured ``[kernels]`` numbers come from it (``toast.cost.microbench.kernel_numbers``).
"""

from __future__ import annotations

import json
import sys

from toast.cost.microbench import measure_kernels


def main() -> None:
    result = measure_kernels(quick="--quick" in sys.argv[2:])
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
