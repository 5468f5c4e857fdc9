"""Fit a profile's collective parameters to measured collectives (nccl-tests outputs).

``read_nccl_tests`` reads what ``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf`` and
``alltoall_perf`` print: the ``#  Rank`` lines give the ranks and, by their host names, the nodes; each data
row gives a size in bytes and the out-of-place time in microseconds. ``fit_collectives`` then fits the
efficiencies and latencies of the levels those runs crossed (``toast.cost.network``) by least squares on the
logarithm of predicted over measured time, keeping the bandwidths, device counts and everything else of the
base profile. ``toast calibrate`` writes the result as a profile.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
from scipy.optimize import least_squares

from toast.cost.hardware import Hardware, InterconnectLevel
from toast.cost.network import GroupSpan, algorithms, group_span
from toast.errors import ToastError

# nccl-tests binaries by the collective they run.
_BINARIES = {"all_reduce_perf": "all-reduce", "all_gather_perf": "all-gather", "reduce_scatter_perf": "reduce-scatter",
             "alltoall_perf": "all-to-all"}
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")

FITTED_FIELDS = ("efficiency", "latency", "small_efficiency", "small_latency")
"""The ``InterconnectLevel`` fields of a level's rings, which a fit changes (``measured_parameters``)."""
SWITCH_FIELDS = ("switch_efficiency", "switch_latency")
"""The fields of a level's switch reduction."""
MAX_EFFICIENCY = 0.9
"""The largest fraction of line rate a fit may give: no NCCL algorithm measured on these systems goes past 0.84
(``benchmarks/fit_collectives.py``), and with none the fit could explain a switch all-reduce by a perfect ring."""
"""The fields a fit changes too on a level whose switches reduce, when an all-reduce stayed inside it."""


@dataclass(frozen=True, slots=True)
class CollectiveCurve:
    """One collective measured at several sizes (one nccl-tests run).

    Attributes:
      kind: ``all-reduce``, ``all-gather``, ``reduce-scatter`` or ``all-to-all``.
      ranks: devices taking part.
      nodes: nodes they are on (the same number of ranks on each).
      sizes: message sizes in bytes, as nccl-tests counts them (``toast.cost.network``).
      seconds: the time of one collective at each size, seconds.
      source: where it was read (file, or an id).
    """

    kind: str
    ranks: int
    nodes: int
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str


def read_nccl_tests(path: str | Path, *, kind: str | None = None) -> CollectiveCurve:
    """The curve of one nccl-tests output file.

    The collective is the binary named in the file (its command line, as ``mpirun ... all_reduce_perf``
    prints), else in the file's name, else ``kind``.

    Raises:
      ToastError: an unreadable file, a data row that does not parse (``file:line``), no rank lines or no
        data rows, or no way to tell the collective.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ToastError(f"{path}: cannot read the nccl-tests output ({error.__class__.__name__})") from None
    found_kind = kind
    for binary, name in _BINARIES.items():
        if binary in text or binary in path.name:
            found_kind = name
            break
    if found_kind is None:
        raise ToastError(f"{path}: cannot tell which collective this nccl-tests output measured; name the file "
                         f"after its binary ({', '.join(_BINARIES)})")
    hosts: dict[int, str] = {}
    sizes: list[int] = []
    seconds: list[float] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        rank = _RANK_LINE.match(stripped)
        if rank:
            hosts[int(rank.group(1))] = rank.group(2)
            continue
        if not stripped or stripped.startswith("#") or not stripped[0].isdigit():
            continue  # comments, headers, and what MPI or NCCL print between the rows
        fields = stripped.split()
        try:
            size, time_us = int(fields[0]), float(fields[5])
        except (IndexError, ValueError):
            raise ToastError(f"{path}:{number}: not an nccl-tests data row (size count type redop root time "
                             f"algbw busbw ...): {stripped[:60]!r}") from None
        if size <= 0 or not math.isfinite(time_us) or time_us <= 0:
            raise ToastError(f"{path}:{number}: a data row needs a positive size and time")
        sizes.append(size)
        seconds.append(time_us * 1e-6)
    if not hosts:
        raise ToastError(f"{path}: no '#  Rank N Group N Pid N on HOST device N' lines, so the ranks and nodes "
                         f"are unknown; keep nccl-tests' header in the file")
    if not sizes:
        raise ToastError(f"{path}: no nccl-tests data rows")
    nodes = len(set(hosts.values()))
    if len(hosts) % nodes:
        raise ToastError(f"{path}: {len(hosts)} ranks on {nodes} hosts: toast needs the same number on each")
    return CollectiveCurve(kind=found_kind, ranks=len(hosts), nodes=nodes, sizes=tuple(sizes),
                           seconds=tuple(seconds), source=str(path))


@dataclass(frozen=True, slots=True)
class PublishedCurve:
    """One entry of a published-measurements file (``../shared/reference/published/published.json``).

    Attributes:
      id: the entry's id.
      curve: its measurements.
      profile: the toast profile of the system measured.
      network_bandwidth: the network's bytes/s per device on the system measured, where it differs from the
        profile's (``toast_profile_matched``), else ``None``.
    """

    id: str
    curve: CollectiveCurve
    profile: str
    network_bandwidth: float | None


def read_published(path: str | Path) -> list[PublishedCurve]:
    """The ``collectives`` of a published-measurements JSON file: each entry's ``points`` map bytes to the
    value its ``column`` names (``busbw GB/s``, ``algbw GB/s`` or ``time us``); nccl-tests' conventions turn
    bus and algorithm bandwidths into times (busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n otherwise;
    time = size / algbw)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        found = []
        for entry in data["collectives"]:
            kind, ranks, column = entry["collective"], int(entry["ranks"]), entry["column"]
            bus = 2 * (ranks - 1) / ranks if kind == "all-reduce" else (ranks - 1) / ranks
            sizes, seconds = [], []
            for size_text, value in sorted(entry["points"].items(), key=lambda item: int(item[0])):
                size = int(size_text)
                if column.startswith("time us"):
                    time = value * 1e-6
                elif column.startswith("algbw GB/s"):
                    time = size / (value * 1e9)
                elif column.startswith("busbw GB/s"):
                    time = size * bus / (value * 1e9)
                else:
                    raise ToastError(f"{path}: entry {entry['id']}: unknown column {column!r}")
                sizes.append(size)
                seconds.append(time)
            matched = entry.get("toast_profile_matched", {}).get("infiniband_bandwidth")
            curve = CollectiveCurve(kind=kind, ranks=ranks, nodes=int(entry["nodes"]), sizes=tuple(sizes),
                                    seconds=tuple(seconds), source=entry["id"])
            found.append(PublishedCurve(id=entry["id"], curve=curve, profile=entry["toast_profile"],
                                        network_bandwidth=float(matched) if matched else None))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ToastError(f"{path}: not a published-measurements file ({error.__class__.__name__}: {error})") from None
    return found


def curve_span(curve: CollectiveCurve, hardware: Hardware) -> GroupSpan:
    """Where the curve's ranks lie on ``hardware``: ``ranks / nodes`` devices in each of ``nodes`` nodes.

    Raises:
      ToastError: more ranks per node than the profile's node holds.
    """
    per_node = curve.ranks // curve.nodes
    node = hardware.interconnect[0].devices
    if per_node > node:
        raise ToastError(f"{curve.source}: {per_node} ranks per node, but a node of profile '{hardware.name}' "
                         f"holds {node} devices; start from a profile with that node (--base)")
    stride = node if curve.nodes > 1 else 1
    return group_span([j * stride + i for j in range(curve.nodes) for i in range(per_node)], hardware)


def predict(curve: CollectiveCurve, hardware: Hardware) -> np.ndarray:
    """``float64[sizes]``: the model's seconds for each size of ``curve``."""
    return _seconds(curve, hardware, curve.sizes)


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """The result of ``fit_collectives``.

    Attributes:
      hardware: the profiles with the fitted parameters, one per curve (the same object for curves that
        started from the same profile).
      parameters: ``{(level index, field): value}`` fitted.
      ratios: per curve, predicted / measured seconds at each size.
    """

    hardware: tuple[Hardware, ...]
    parameters: dict[tuple[int, str], float]
    ratios: tuple[np.ndarray, ...]


def fit_collectives(curves: Sequence[CollectiveCurve], hardware: Sequence[Hardware], *,
                    min_bytes: int = 1 << 16, starts_count: int = 8, prior_weight: float = 0.3) -> CollectiveFit:
    """Fit the collective parameters of the levels the curves cross.

    Args:
      curves: the measurements.
      hardware: each curve's profile (bandwidths, node size); one value of each fitted parameter is shared by
        all of them (a pooled fit when they differ).
      min_bytes: sizes below this are left out of the fit (their time is the host's, not the network's).
      starts_count: local fits tried (the first from the profile's values, the others from seeded random
        points); the best is kept.
      prior_weight: the weight of each efficiency's log-distance from the profile's value, against a weight of
        1 for each measurement's log-ratio (a latency's, and the small-message regime's, weigh 30 times less).

    Returns:
      The fit. Parameters no curve depends on keep the first profile's values.

    Raises:
      ToastError: no curve has a size of at least ``min_bytes``.
    """
    if len(curves) != len(hardware) or not curves:
        raise ValueError("one profile per curve, and at least one curve")
    keys: dict[tuple[int, str], float] = {}
    for curve, profile in zip(curves, hardware, strict=True):
        for index, field in measured_parameters(curve, profile):
            keys.setdefault((index, field), getattr(profile.interconnect[index], field))
    # The small-message regime is fitted as fractions of the large one's efficiency and latency (it is the
    # lower-latency, lower-bandwidth protocol), so the two cannot swap roles.
    names = sorted(keys)
    relative = {name: (name[0], name[1].removeprefix("small_")) for name in names if name[1].startswith("small_")}
    start = np.asarray([keys[name] / keys[relative[name]] if name in relative else keys[name] for name in names])
    lower = np.asarray([0.02 if "efficiency" in field else 1e-8 for _, field in names])
    upper = np.asarray([1.0 if (index, field) in relative else MAX_EFFICIENCY if "efficiency" in field else 1e-2
                        for index, field in names])
    start = np.clip(start, lower, upper)
    # Efficiencies are known to within tens of percent before any measurement, latencies hardly at all.
    # The small-message regime's fractions of the large one's are the measurements' to say.
    prior_weights = np.asarray([prior_weight if "efficiency" in field and name not in relative else prior_weight / 30
                                for name in names for _, field in [name]])
    used = [(curve, profile, np.asarray(curve.sizes, dtype=np.float64) >= min_bytes)
            for curve, profile in zip(curves, hardware, strict=True)]
    if not any(mask.any() for _, _, mask in used):
        raise ToastError(f"no measured size of at least {min_bytes} bytes to fit")

    def values(x: np.ndarray) -> dict[tuple[int, str], float]:
        found = dict(zip(names, x.tolist(), strict=True))
        for name, large in relative.items():
            found[name] *= found[large]
        return found

    def residuals(x: np.ndarray) -> np.ndarray:
        found = []
        parameters = values(x)
        for curve, profile, mask in used:
            fitted = with_parameters(profile, parameters)
            measured = np.asarray(curve.seconds)[mask]
            sizes = [s for s, keep in zip(curve.sizes, mask.tolist(), strict=True) if keep]
            found.append(np.log(_seconds(curve, fitted, sizes) / measured))
        # A weak pull towards the profile's values keeps what the measurements cannot tell apart (a regime no
        # size uses, a ring where only the switch ran) where the profile had it.
        found.append(prior_weights * np.log(x / start))
        return np.concatenate(found)

    # Times are piecewise affine in the parameters (the fastest algorithm wins), so a local fit can stall
    # where the winner changes: start from the profile and from seeded random points, keep the best.
    rng = np.random.default_rng(0)
    starts = [start] + [np.exp(rng.uniform(np.log(lower), np.log(upper))) for _ in range(starts_count - 1)]
    result = min((least_squares(residuals, x0, bounds=(lower, upper), x_scale=x0, method="trf") for x0 in starts),
                 key=lambda fit: fit.cost)
    parameters = values(result.x)
    fitted_profiles: dict[int, Hardware] = {}
    for profile in hardware:
        fitted_profiles.setdefault(id(profile), with_parameters(profile, parameters))
    fitted = tuple(fitted_profiles[id(profile)] for profile in hardware)
    ratios = tuple(predict(curve, profile) / np.asarray(curve.seconds) for curve, profile in zip(curves, fitted,
                                                                                                strict=True))
    return CollectiveFit(hardware=fitted, parameters=parameters, ratios=ratios)


def measured_parameters(curve: CollectiveCurve, hardware: Hardware) -> list[tuple[int, str]]:
    """``(level index, field)`` of the parameters a curve measures: a run across nodes those of the network;
    a run inside a node those of the node's fabric, and an all-reduce on a fabric whose switches reduce only
    the switch's (NCCL runs it there, so it says nothing of the fabric's rings)."""
    span = curve_span(curve, hardware)
    if span.nodes > 1:
        return [(span.outer, field) for field in FITTED_FIELDS]
    if curve.kind == "all-reduce" and hardware.interconnect[span.inner].switch_reduction:
        return [(span.inner, field) for field in SWITCH_FIELDS]
    return [(span.inner, field) for field in FITTED_FIELDS]


def _seconds(curve: CollectiveCurve, hardware: Hardware, sizes: Sequence[int]) -> np.ndarray:
    """``collective_seconds`` at every size at once."""
    found = algorithms(curve.kind, curve_span(curve, hardware), hardware)
    nbytes = np.asarray(sizes, dtype=np.float64)
    if not found:
        return np.zeros(len(nbytes))
    return np.min([algorithm.latency + nbytes * algorithm.seconds_per_byte for algorithm in found], axis=0)


def with_parameters(hardware: Hardware, parameters: dict[tuple[int, str], float]) -> Hardware:
    """``hardware`` with ``{(level index, field): value}`` set on its levels (switch fields only on levels
    whose switches reduce)."""
    levels = list(hardware.interconnect)
    for (index, field), value in parameters.items():
        if index >= len(levels) or (field in SWITCH_FIELDS and not levels[index].switch_reduction):
            continue
        levels[index] = replace(levels[index], **cast(dict[str, Any], {field: float(value)}))
    return replace(hardware, interconnect=tuple(levels), text="")  # no longer the file's profile


def with_level(hardware: Hardware, index: int, **fields: float) -> Hardware:
    """``hardware`` with some fields of one level replaced (e.g. another network's ``bandwidth``)."""
    levels = list(hardware.interconnect)
    level: InterconnectLevel = levels[index]
    levels[index] = replace(level, **cast(dict[str, Any], fields))
    return replace(hardware, interconnect=tuple(levels), text="")  # no longer the file's profile
