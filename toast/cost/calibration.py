"""Fit a profile's collective parameters to measured collectives (nccl-tests outputs).

``read_nccl_tests`` reads what ``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf`` and
``alltoall_perf`` print: the ``#  Rank`` lines give the ranks and, by their host names, the nodes; each data
row gives a size in bytes and the out-of-place time in microseconds. It reads a line at a time within fixed
limits (``MAX_LOG_BYTES``, ...) and refuses what no run prints: sizes, times or rates no hardware gives, a rank
listed twice, ranks spread unevenly over the hosts. ``fit_collectives`` then fits the efficiencies and
latencies of the levels those runs crossed (``toast.cost.network``) by least squares on the logarithm of
predicted over measured time, keeping the bandwidths, device counts and everything else of the base profile;
rows the model cannot explain within ``OUTLIER_RATIO`` are reported and left out rather than bending the fit.
``toast calibrate`` writes the result as a profile.
"""

from __future__ import annotations

import errno
import itertools
import json
import math
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator, Sequence
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
# A data row starts with a number (a size); other lines (MPI's, NCCL's INFO lines, "10-0-0-1:123:..." host
# prefixes) are skipped.
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

MAX_LOG_BYTES = 64 << 20
"""The largest nccl-tests output read, bytes (a run with ``NCCL_DEBUG=INFO`` on a thousand ranks is a few MiB)."""
MAX_LOG_LINES = 1 << 20
"""The most lines read from one nccl-tests output."""
MAX_LINE_BYTES = 1 << 16
"""The longest line read, bytes (nccl-tests' rows are about 120)."""
MAX_ROWS = 1 << 12
"""The most data rows in one output (a run from 1 byte to 2^48 doubling has 49)."""
MAX_RANKS = 1 << 16
"""The most ranks one output may list."""
MAX_SIZE = 1 << 48
"""The largest message size believed, bytes (256 TiB: more than any cluster's memory holds in one buffer)."""
MIN_SECONDS = 1e-9
"""The shortest collective time believed, seconds (nccl-tests prints microseconds to 2 decimals)."""
MAX_SECONDS = 1e4
"""The longest collective time believed, seconds."""
MAX_RATE = 1e15
"""The highest size / time believed, bytes/s (a thousand times an NVLink 4 port; no link is near it)."""
OUTLIER_RATIO = 2.0
"""A row whose measured time the fit to the other rows misses by more than this factor (either way) is an
outlier: reported and left out of the fit."""
# The scale of a robust fit's residuals (log of predicted / measured): within it a row counts fully, beyond it
# less and less (``least_squares``' soft_l1 loss), so a few wild rows cannot drag the fit to themselves.
_ROBUST_SCALE = 0.1
# Fits again after leaving out outliers at most this many times (each round leaves out at least one row).
_OUTLIER_ROUNDS = 4

FITTED_FIELDS = ("efficiency", "latency", "small_efficiency", "small_latency")
"""The ``InterconnectLevel`` fields of a level's rings, which a fit changes (``measured_parameters``)."""
SWITCH_FIELDS = ("switch_efficiency", "switch_latency")
"""The fields a fit changes too on a level whose switches reduce, when an all-reduce stayed inside it."""
MAX_EFFICIENCY = 0.9
"""The largest fraction of line rate a fit may give: no NCCL algorithm measured on these systems goes past 0.84
(``benchmarks/fit_collectives.py``), and with none the fit could explain a switch all-reduce by a perfect ring."""


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
      lines: the line of ``source`` each size was read from, or ``()`` when it was not read from a file.
    """

    kind: str
    ranks: int
    nodes: int
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str
    lines: tuple[int, ...] = ()

    def where(self, row: int) -> str:
        """Where row ``row`` was read: ``file:line``, else the source and the size."""
        if self.lines:
            return f"{self.source}:{self.lines[row]}"
        return f"{self.source} ({self.sizes[row]} bytes)"


def shown(path: str | Path) -> str:
    """``path`` as a message shows it: as it is when printable, else quoted with escapes (a newline or an
    undecodable byte in a file name must not break a one-line message or the terminal's encoding)."""
    text = str(path)
    return text if text.isprintable() else ascii(text)


def _open_bounded(path: Path, *, what: str) -> tuple[Any, int | None]:
    """``(binary stream, size)`` of ``path``: size is ``None`` unless it is a regular file. A FIFO is opened
    without waiting for a writer (with none, it reads as empty)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise ToastError(f"{shown(path)}: cannot read the {what}: {error.strerror}") from None
    try:
        os.set_blocking(descriptor, True)
        status = os.fstat(descriptor)
        if stat.S_ISDIR(status.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        return os.fdopen(descriptor, "rb"), status.st_size if stat.S_ISREG(status.st_mode) else None
    except OSError as error:
        os.close(descriptor)
        raise ToastError(f"{shown(path)}: cannot read the {what}: {error.strerror}") from None


def read_bounded(path: str | Path, *, what: str, max_bytes: int) -> bytes:
    """The bytes of ``path``, at most ``max_bytes`` of them read whatever the file is (a device such as
    ``/dev/zero``, a FIFO).

    Raises:
      ToastError: it cannot be read, or it holds more than ``max_bytes`` bytes.
    """
    path = Path(path)
    stream, size = _open_bounded(path, what=what)
    with stream:
        if size is not None and size > max_bytes:
            raise ToastError(f"{shown(path)}: {size} bytes, more than the {max_bytes} a {what} may have")
        try:
            data = stream.read(max_bytes + 1)
        except OSError as error:
            raise ToastError(f"{shown(path)}: cannot read the {what}: {error.strerror}") from None
    if len(data) > max_bytes:
        raise ToastError(f"{shown(path)}: more than the {max_bytes} bytes a {what} may have")
    return data


def read_lines(path: str | Path, *, what: str, max_bytes: int | None = None, max_lines: int | None = None,
               max_line_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the UTF-8 text file ``path``, one at a time, within the limits: no more than
    ``max_bytes`` bytes and ``max_lines`` lines are read whatever the file is (a device such as ``/dev/zero``,
    a FIFO), nor more than ``max_line_bytes`` for one line (defaults: ``MAX_LOG_BYTES``, ``MAX_LOG_LINES``,
    ``MAX_LINE_BYTES``).

    Raises:
      ToastError: it cannot be read; it goes past a limit; a line is not UTF-8 or holds a NUL byte
        (``file:line``).
    """
    max_bytes = MAX_LOG_BYTES if max_bytes is None else max_bytes
    max_lines = MAX_LOG_LINES if max_lines is None else max_lines
    max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    path = Path(path)
    where = shown(path)
    stream, size = _open_bounded(path, what=what)
    with stream:
        if size is not None and size > max_bytes:
            raise ToastError(f"{where}: {size} bytes, more than the {max_bytes} a {what} may have")
        read = 0
        for number in itertools.count(1):
            try:
                raw = stream.readline(max_line_bytes + 1)
            except OSError as error:
                raise ToastError(f"{where}: cannot read the {what}: {error.strerror}") from None
            if not raw:
                return
            read += len(raw)
            if read > max_bytes:
                raise ToastError(f"{where}: more than the {max_bytes} bytes a {what} may have")
            if number > max_lines:
                raise ToastError(f"{where}: more than the {max_lines} lines a {what} may have")
            if len(raw) > max_line_bytes:
                raise ToastError(f"{where}:{number}: a line longer than {max_line_bytes} bytes: not a {what}")
            if b"\0" in raw:
                raise ToastError(f"{where}:{number}: a NUL byte: not a text file")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ToastError(f"{where}:{number}: not UTF-8 text") from None
            yield number, line


def _clipped(text: str, limit: int = 24) -> str:
    """``text`` cut to about ``limit`` characters, for a message."""
    return ascii(text if len(text) <= limit else text[:limit - 3] + "...")


def read_nccl_tests(path: str | Path, *, kind: str | None = None) -> CollectiveCurve:
    """The curve of one nccl-tests output file.

    The collective is the binary named in the file (its command line, as ``mpirun ... all_reduce_perf``
    prints), else in the file's name, else ``kind``.

    Raises:
      ToastError: an unreadable file or one past ``read_lines``' limits; a data row that does not parse, or
        whose size, time or rate is not believable (``MAX_SIZE``, ``MIN_SECONDS``, ``MAX_SECONDS``,
        ``MAX_RATE``), or a rank listed twice (``file:line``); no rank lines, fewer than 2 ranks, ranks not
        numbered 0 to n-1 or not the same number on each host; no data rows; no way to tell the collective,
        or two collectives named.
    """
    path = Path(path)
    where = shown(path)
    named: dict[str, tuple[str, int]] = {}  # collective -> (binary, first line naming it)
    hosts: dict[int, tuple[str, int]] = {}  # rank -> (host, line)
    sizes: list[int] = []
    seconds: list[float] = []
    lines: list[int] = []
    for number, line in read_lines(path, what="nccl-tests output"):
        stripped = line.strip()
        for binary, name in _BINARIES.items():
            if binary in stripped:
                named.setdefault(name, (binary, number))
        rank = _RANK_LINE.match(stripped)
        if rank:
            _add_rank(hosts, rank.group(1), rank.group(2), f"{where}:{number}", number)
            continue
        fields = stripped.split()
        if not fields or stripped.startswith("#") or not _NUMBER.fullmatch(fields[0]):
            continue  # comments, headers, and what MPI or NCCL print between the rows
        size, time_s = _data_row(fields, f"{where}:{number}")
        if len(sizes) == MAX_ROWS:
            raise ToastError(f"{where}:{number}: more than {MAX_ROWS} data rows: one nccl-tests run per file")
        sizes.append(size)
        seconds.append(time_s)
        lines.append(number)
    found_kind = _collective(path, named, kind)
    ranks, nodes = _layout(where, hosts)
    if not sizes:
        raise ToastError(f"{where}: no nccl-tests data rows")
    return CollectiveCurve(kind=found_kind, ranks=ranks, nodes=nodes, sizes=tuple(sizes), seconds=tuple(seconds),
                           source=where, lines=tuple(lines))


def _data_row(fields: list[str], where: str) -> tuple[int, float]:
    """``(bytes, seconds)`` of a data row's fields (size count type redop root time ...), checked."""
    try:
        size = int(fields[0])
    except ValueError:
        raise ToastError(f"{where}: the size {_clipped(fields[0])} is not a whole number of bytes") from None
    if not 0 < size <= MAX_SIZE:
        raise ToastError(f"{where}: a size of {_clipped(fields[0])} bytes: a size must be 1 to 2^48 bytes")
    try:
        time_us = float(fields[5])
    except (IndexError, ValueError):
        raise ToastError(f"{where}: not an nccl-tests data row (size count type redop root time algbw busbw "
                         f"...): {_clipped(' '.join(fields), 60)}") from None
    time_s = time_us * 1e-6
    if not MIN_SECONDS <= time_s <= MAX_SECONDS:  # NaN too
        raise ToastError(f"{where}: a time of {_clipped(fields[5])} us: a time must be {MIN_SECONDS * 1e6:g} to "
                         f"{MAX_SECONDS * 1e6:g} us")
    if size / time_s > MAX_RATE:
        raise ToastError(f"{where}: {size} bytes in {time_us:g} us is {size / time_s:.3g} bytes/s, faster than "
                         f"any link ({MAX_RATE:g})")
    return size, time_s


def _add_rank(hosts: dict[int, tuple[str, int]], rank_text: str, host: str, where: str, number: int) -> None:
    """Record a ``#  Rank`` line's rank and host, refusing a rank listed before or past ``MAX_RANKS``."""
    rank = int(rank_text) if len(rank_text) <= 9 else MAX_RANKS
    if rank >= MAX_RANKS:
        raise ToastError(f"{where}: rank {_clipped(rank_text)}: toast reads up to {MAX_RANKS} ranks")
    if rank in hosts:
        raise ToastError(f"{where}: rank {rank} listed again (first at line {hosts[rank][1]}): one nccl-tests run "
                         f"per file")
    hosts[rank] = (host, number)


def _collective(path: Path, named: dict[str, tuple[str, int]], kind: str | None) -> str:
    """The collective of a file whose lines name ``named``, else its file name's, else ``kind``."""
    where = shown(path)
    if len(named) > 1:
        (first, line), (second, other) = sorted(named.values(), key=lambda item: item[1])[:2]
        raise ToastError(f"{where}: names {first} (line {line}) and {second} (line {other}): one nccl-tests run "
                         f"per file")
    if named:
        return next(iter(named))
    for binary, name in _BINARIES.items():
        if binary in path.name:
            return name
    if kind is not None and kind in _BINARIES.values():
        return kind
    raise ToastError(f"{where}: cannot tell which collective this nccl-tests output measured; name the file "
                     f"after its binary ({', '.join(_BINARIES)})")


def _layout(where: str, hosts: dict[int, tuple[str, int]]) -> tuple[int, int]:
    """``(ranks, nodes)`` of the ``#  Rank`` lines read, checked: ranks 0 to n-1, at least 2, the same number
    on each host."""
    if not hosts:
        raise ToastError(f"{where}: no '#  Rank N Group N Pid N on HOST device N' lines, so the ranks and nodes "
                         f"are unknown; keep nccl-tests' header in the file")
    ranks = len(hosts)
    if ranks < 2:
        raise ToastError(f"{where}: one rank: a collective needs at least 2 (one '#  Rank' line each)")
    missing = next((rank for rank in range(ranks) if rank not in hosts), None)
    if missing is not None:
        raise ToastError(f"{where}: {ranks} '#  Rank' lines, but no rank {missing}: ranks are numbered 0 to "
                         f"{ranks - 1}")
    per_host = Counter(host for host, _ in (hosts[rank] for rank in range(ranks)))
    if len(set(per_host.values())) > 1:
        listed = ", ".join(f"{shown(host)}: {count}" for host, count in itertools.islice(per_host.items(), 6))
        more = ", ..." if len(per_host) > 6 else ""
        raise ToastError(f"{where}: {ranks} ranks spread unevenly over {len(per_host)} hosts (ranks per host: "
                         f"{listed}{more}); toast needs the same number on each")
    return ranks, len(per_host)


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
      ToastError: more ranks per node than the profile's node holds, or several nodes on a profile with no
        level between nodes.
    """
    per_node = curve.ranks // curve.nodes
    node = hardware.interconnect[0].devices
    if per_node > node:
        raise ToastError(f"{curve.source}: {per_node} ranks per node, but a node of profile '{hardware.name}' "
                         f"holds {node} devices; start from a profile with that node (--base)")
    stride = node if curve.nodes > 1 else 1
    span = group_span([j * stride + i for j in range(curve.nodes) for i in range(per_node)], hardware)
    if span.nodes != curve.nodes:
        raise ToastError(f"{curve.source}: ranks on {curve.nodes} nodes, but profile '{hardware.name}' has no "
                         f"level between nodes; start from a profile with one (--base)")
    return span


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
      outliers: the rows left out of the fit (``OUTLIER_RATIO``), in the order of the curves and their rows.
    """

    hardware: tuple[Hardware, ...]
    parameters: dict[tuple[int, str], float]
    ratios: tuple[np.ndarray, ...]
    outliers: tuple[Outlier, ...] = ()


@dataclass(frozen=True, slots=True)
class Outlier:
    """A measured row the fit left out: a fit that a few wild rows cannot drag (a robust loss) misses it by
    more than ``OUTLIER_RATIO``.

    Attributes:
      curve: the index of its curve in ``fit_collectives``' ``curves``.
      row: its index in that curve's sizes.
      where: ``file:line`` (``CollectiveCurve.where``).
      size: its size, bytes.
      seconds: its measured time, seconds.
      fitted: the fitted model's time at that size, seconds.
    """

    curve: int
    row: int
    where: str
    size: int
    seconds: float
    fitted: float


def fit_collectives(curves: Sequence[CollectiveCurve], hardware: Sequence[Hardware], *,
                    min_bytes: int = 1 << 16, starts_count: int = 8, prior_weight: float = 0.3,
                    outlier_ratio: float | None = OUTLIER_RATIO) -> CollectiveFit:
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
      outlier_ratio: when the fit misses a row by more than this factor, the rows a robust fit (soft_l1 loss)
        misses by more than it are left out and the rest fitted again (``CollectiveFit.outliers``); ``None``:
        every row counts.

    Returns:
      The fit. Parameters no curve depends on keep the first profile's values.

    Raises:
      ToastError: no curve has a size of at least ``min_bytes``, or the robust fit misses more than half a
        curve's rows by more than ``outlier_ratio``.
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
    spans = [curve_span(curve, profile) for curve, profile in zip(curves, hardware, strict=True)]
    measured = [np.asarray(curve.seconds, dtype=np.float64) for curve in curves]
    masks = [np.asarray(curve.sizes, dtype=np.float64) >= min_bytes for curve in curves]
    if not any(mask.any() for mask in masks):
        raise ToastError(f"no measured size of at least {min_bytes} bytes to fit")

    def values(x: np.ndarray) -> dict[tuple[int, str], float]:
        found = dict(zip(names, x.tolist(), strict=True))
        for name, large in relative.items():
            found[name] *= found[large]
        return found

    def log_ratios(x: np.ndarray) -> list[np.ndarray]:
        """Per curve, log of predicted / measured seconds at every size."""
        parameters = values(x)
        profiles = {id(profile): with_parameters(profile, parameters) for profile in hardware}
        return [np.log(_seconds(curve, profiles[id(profile)], curve.sizes, span) / seconds)
                for curve, profile, span, seconds in zip(curves, hardware, spans, measured, strict=True)]

    def best(kept: list[np.ndarray], loss: str) -> np.ndarray:
        """The parameters of the best of the local fits to the rows ``kept``."""
        def residuals(x: np.ndarray) -> np.ndarray:
            found = [ratios[mask] for ratios, mask in zip(log_ratios(x), kept, strict=True)]
            # A weak pull towards the profile's values keeps what the measurements cannot tell apart (a regime
            # no size uses, a ring where only the switch ran) where the profile had it.
            found.append(prior_weights * np.log(x / start))
            return np.concatenate(found)

        # Times are piecewise affine in the parameters (the fastest algorithm wins), so a local fit can stall
        # where the winner changes: start from the profile and from seeded random points, keep the best.
        rng = np.random.default_rng(0)
        starts = [start] + [np.exp(rng.uniform(np.log(lower), np.log(upper))) for _ in range(starts_count - 1)]
        result = min((least_squares(residuals, x0, bounds=(lower, upper), x_scale=x0, method="trf", loss=loss,
                                    f_scale=_ROBUST_SCALE) for x0 in starts), key=lambda fit: fit.cost)
        return np.asarray(result.x)

    x = best(masks, "linear")
    left_out = [np.zeros_like(mask) for mask in masks]
    if outlier_ratio is not None:
        limit = math.log(outlier_ratio)
        fitted_rows = [int(mask.sum()) for mask in masks]
        for round_ in itertools.count():
            off = [mask & (np.abs(ratios) > limit) for ratios, mask in zip(log_ratios(x), masks, strict=True)]
            if not any(rows.any() for rows in off):
                break
            if round_ == _OUTLIER_ROUNDS:
                index = next(index for index, rows in enumerate(off) if rows.any())
                raise ToastError(f"{curves[index].where(int(np.flatnonzero(off[index])[0]))}: the fit still misses "
                                 f"this row by more than {outlier_ratio:g}x after leaving out "
                                 f"{sum(int(rows.sum()) for rows in left_out)} outliers: the measurements disagree "
                                 f"too much to fit")
            # Some row is far off: leave out the rows that a fit wild rows cannot drag misses (else the rows
            # this fit misses) and fit the rest again.
            far = [mask & (np.abs(ratios) > limit) for ratios, mask in zip(log_ratios(best(masks, "soft_l1")),
                                                                             masks, strict=True)]
            if not any(rows.any() for rows in far):
                far = off
            for curve, rows, mask, count in zip(curves, far, masks, fitted_rows, strict=True):
                left = int((mask & ~rows).sum())
                if 2 * left < count:
                    raise ToastError(f"{curve.source}: the model misses {count - left} of its {count} rows of at "
                                     f"least {min_bytes} bytes by more than {outlier_ratio:g}x: not a run on this "
                                     f"profile's system (--base), or not nccl-tests' times")
            left_out = [before | rows for before, rows in zip(left_out, far, strict=True)]
            masks = [mask & ~rows for mask, rows in zip(masks, far, strict=True)]
            x = best(masks, "linear")
    parameters = values(x)
    fitted_profiles: dict[int, Hardware] = {}
    for profile in hardware:
        fitted_profiles.setdefault(id(profile), with_parameters(profile, parameters))
    fitted = tuple(fitted_profiles[id(profile)] for profile in hardware)
    ratios = tuple(_seconds(curve, profile, curve.sizes, span) / seconds
                   for curve, profile, span, seconds in zip(curves, fitted, spans, measured, strict=True))
    outliers = [Outlier(curve=index, row=row, where=curve.where(row), size=curve.sizes[row],
                        seconds=curve.seconds[row], fitted=curve.seconds[row] * float(ratios[index][row]))
                for index, (curve, rows) in enumerate(zip(curves, left_out, strict=True))
                for row in np.flatnonzero(rows).tolist()]
    return CollectiveFit(hardware=fitted, parameters=parameters, ratios=ratios, outliers=tuple(outliers))


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


def _seconds(curve: CollectiveCurve, hardware: Hardware, sizes: Sequence[int],
             span: GroupSpan | None = None) -> np.ndarray:
    """``collective_seconds`` at every size at once (``span``: the curve's ``curve_span``, when known)."""
    found = algorithms(curve.kind, span or curve_span(curve, hardware), hardware)
    nbytes = np.asarray(sizes, dtype=np.float64)
    if not found:
        return np.zeros(len(nbytes))
    return np.min([algorithm.latency + nbytes * algorithm.seconds_per_byte for algorithm in found], axis=0)


def with_parameters(hardware: Hardware, parameters: dict[tuple[int, str], float]) -> Hardware:
    """``hardware`` with ``{(level index, field): value}`` set on its levels (switch fields only on levels
    whose switches reduce)."""
    levels = list(hardware.interconnect)
    changes: dict[int, dict[str, Any]] = {}  # one replace per level: a fit calls this thousands of times
    for (index, field), value in parameters.items():
        if index >= len(levels) or (field in SWITCH_FIELDS and not levels[index].switch_reduction):
            continue
        changes.setdefault(index, {})[field] = float(value)
    for index, fields in changes.items():
        levels[index] = replace(levels[index], **fields)
    return replace(hardware, interconnect=tuple(levels), text="")  # no longer the file's profile


def with_level(hardware: Hardware, index: int, **fields: float) -> Hardware:
    """``hardware`` with some fields of one level replaced (e.g. another network's ``bandwidth``)."""
    levels = list(hardware.interconnect)
    level: InterconnectLevel = levels[index]
    levels[index] = replace(level, **cast(dict[str, Any], fields))
    return replace(hardware, interconnect=tuple(levels), text="")  # no longer the file's profile
