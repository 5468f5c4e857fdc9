"""Fit the collective parameters of the GPU profiles to the published nccl-tests measurements, and report
the fit's ratios and leave-one-out ratios (BENCHMARKS.md, "Collectives against published measurements").

    python benchmarks/fit_collectives.py [--published ../shared/reference/published/published.json]

Per profile: the parameters of ``toast.cost.network`` fitted to that system's curves (what the profiles in
``hardware/`` carry). Leave-one-out: for each curve, one pooled set of parameters (each level's efficiencies and
latencies shared by every system) fitted to all the other curves, then the left-out curve predicted with its
own system's bandwidths and topology: how well the parameters carry to a system they were not fitted on.
Ratios are predicted / measured time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from toast.cost.calibration import (
    PublishedCurve,
    fit_collectives,
    predict,
    read_published,
    with_level,
    with_parameters,
)
from toast.cost.hardware import Hardware, load_hardware

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE.parent.parent / "shared" / "reference" / "published" / "published.json"
SIZES = (1 << 20, 16 << 20, 256 << 20, 1 << 30)


# Where every fit starts, and what it is pulled towards where the measurements say nothing (sources below).
FABRIC_PRIOR = {"efficiency": 0.82, "latency": 3.4e-6, "small_efficiency": 0.82, "small_latency": 3.4e-6}
NETWORK_PRIOR = {"efficiency": 0.94, "latency": 9.6e-6, "small_efficiency": 0.94, "small_latency": 9.6e-6}
SWITCH_PRIOR = {"switch_efficiency": 0.61, "switch_latency": 14 * 3.4e-6}
PRIOR_SOURCES = (
    "Priors: ring bus bandwidth 0.82 of NVLink (~370 of 450 GB/s, NVIDIA in nccl-tests issue 212); NVLS all-reduce\n"
    """algorithm bandwidth 0.61 of NVLink (~480 GB/s busbw = ~275 GB/s algbw, same source); 0.94 of a NIC (46-48 of
50 GB/s, nccl-tests issue 290); per-step latencies 3.4 us (NVLink) and 9.6 us (network), NCCL's Simple protocol
(src/graph/tuning.cc); the switch's latency as a ring's 14 steps on 8 GPUs; no small-message regime (the same
numbers) until the measurements show one.""")


def system(entry: PublishedCurve) -> Hardware:
    """The profile of the system measured (with its own network where the entry says it differs), its
    collective parameters set to the priors."""
    hardware = load_hardware(entry.profile)
    if entry.network_bandwidth is not None:
        hardware = with_level(hardware, 1, bandwidth=entry.network_bandwidth)
    prior = {(0, field): value for field, value in FABRIC_PRIOR.items()}
    prior.update({(0, field): value for field, value in SWITCH_PRIOR.items()})
    prior.update({(1, field): value for field, value in NETWORK_PRIOR.items()})
    return with_parameters(hardware, prior)


def at_sizes(entry: PublishedCurve, ratios: np.ndarray) -> list[str]:
    by_size = dict(zip(entry.curve.sizes, ratios.tolist(), strict=True))
    return [f"{by_size[s]:.2f}" if s in by_size else "-" for s in SIZES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--published", default=str(PUBLISHED))
    parser.add_argument("--min-bytes", type=int, default=1 << 16)
    args = parser.parse_args()
    entries = read_published(args.published)
    print(PRIOR_SOURCES + "\n")
    systems = [system(entry) for entry in entries]
    print("## Per-profile fit (the values in hardware/*.toml)\n")
    print("| curve | profile | 1 MiB | 16 MiB | 256 MiB | 1 GiB | worst >= 16 MiB |")
    print("|---|---|---|---|---|---|---|")
    for profile in sorted({entry.profile for entry in entries}):
        chosen = [i for i, entry in enumerate(entries) if entry.profile == profile]
        fit = fit_collectives([entries[i].curve for i in chosen], [systems[i] for i in chosen],
                              min_bytes=args.min_bytes)
        for i, ratios in zip(chosen, fit.ratios, strict=True):
            big = [r for s, r in zip(entries[i].curve.sizes, ratios.tolist(), strict=True) if s >= 16 << 20]
            worst = max(big, key=lambda r: abs(np.log(r)))
            print(f"| {entries[i].id} | {profile} | " + " | ".join(at_sizes(entries[i], ratios)) + f" | {worst:.2f} |")
        for (index, field), value in sorted(fit.parameters.items()):
            print(f"<!-- {profile} interconnect[{index}].{field} = {value:.4g} -->")
    print("\n## The bundled profiles as written (rounded values)\n")
    print("| curve | profile | 1 MiB | 16 MiB | 256 MiB | 1 GiB |")
    print("|---|---|---|---|---|---|")
    for entry in entries:
        bundled = load_hardware(entry.profile)
        if entry.network_bandwidth is not None:
            bundled = with_level(bundled, 1, bandwidth=entry.network_bandwidth)
        ratios = predict(entry.curve, bundled) / np.asarray(entry.curve.seconds)
        print(f"| {entry.id} | {entry.profile} | " + " | ".join(at_sizes(entry, ratios)) + " |")
    print("\n## Leave-one-out (pooled parameters fitted to the other curves)\n")
    print("| left out | profile | 1 MiB | 16 MiB | 256 MiB | 1 GiB |")
    print("|---|---|---|---|---|---|")
    for i, entry in enumerate(entries):
        rest = [j for j in range(len(entries)) if j != i]
        fit = fit_collectives([entries[j].curve for j in rest], [systems[j] for j in rest], min_bytes=args.min_bytes)
        ratios = predict(entry.curve, with_parameters(systems[i], fit.parameters)) / np.asarray(entry.curve.seconds)
        print(f"| {entry.id} | {entry.profile} | " + " | ".join(at_sizes(entry, ratios)) + " |")


if __name__ == "__main__":
    main()
