"""Predictions against XLA: the collectives and peak memory of a strategy, checked on host devices.

``compare`` is pure: it matches predicted collectives (``toast.cost.collectives``) with the
collectives of XLA's partitioned module (``toast.xla.worker``) and sets the predicted peak
against XLA's memory analysis. ``validate`` writes the sharded module (``toast.output.sharded_stablehlo``), has
XLA compile and run it, and compares.

Matching. XLA's combiners merge collectives of one kind into one variadic instruction (the
gradient all-reduces of a data-parallel step become one tuple all-reduce); each operand of
such an instruction counts as one collective, as it would before combining. A predicted and
an XLA collective agree when kind and mesh axes are equal and the per-device bytes in and out
are each within ``tolerance`` (10%) of XLA's. Within one (kind, axes) both lists are sorted
by bytes and matched greedily, which pairs as many as any one-to-one matching can (each XLA
size accepts an interval of predicted sizes, and the intervals grow with the size).
``agreement`` is the matched count over the larger of the two counts, so both missed and
spurious collectives lower it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from toast.cost.collectives import Collective
from toast.cost.hardware import Hardware
from toast.cost.model import CostModel
from toast.output.report import human_bytes
from toast.output.sharded_stablehlo import sharded_module_text
from toast.sharding.state import ShardingModel, ShardingState
from toast.xla.worker import Numerics, XlaReport, check_sharded_module

DEFAULT_TOLERANCE = 0.10


@dataclass(frozen=True, slots=True)
class Transfer:
    """One collective reduced to what is compared: kind, mesh axes, per-device bytes in and out."""

    kind: str
    axes: tuple[str, ...]
    bytes_in: int
    bytes_out: int
    in_loop: bool = False


@dataclass(frozen=True, slots=True)
class KindRow:
    """One row of the agreement table: the collectives of one kind over one set of axes, in loop bodies or not.

    Attributes:
      kind, axes: the collective kind and its mesh axes.
      in_loop: the row's collectives run in a ``while`` body, once per iteration (both sides count each once).
      predicted, xla: how many each side has.
      predicted_bytes, xla_bytes: their total per-device output bytes.
      matched: pairs within the tolerance.
    """

    kind: str
    axes: tuple[str, ...]
    predicted: int
    xla: int
    predicted_bytes: int
    xla_bytes: int
    matched: int
    in_loop: bool = False


@dataclass(frozen=True, slots=True)
class Agreement:
    """A strategy's predictions against XLA.

    Attributes:
      numerics: the sharded run against the unsharded reference.
      rows: per (kind, axes, in a loop body or not), sorted.
      matched: matched pairs over all rows.
      predicted_count, xla_count: collectives on each side (XLA's combined ones split).
      predicted_peak_bytes: the cost model's peak memory per device.
      xla_peak_bytes: XLA's live peak per device: the most bytes live at once under its schedule
        (``toast.xla.live_range``), what the cost model predicts; XLA's footprint when the report has
        no live peak.
      tolerance: relative byte tolerance of a match.
      xla_footprint_bytes: what XLA allocates per device (``xla_footprint``): the live peak plus its heap
        packing's fragmentation.
      xla_layout_copy_bytes: of the live peak, the layout copies (values XLA's CPU backend only moves into
        another layout, such as a dot's operand).
      xla_collective_bytes: of the live peak, the results of collectives.
      worker_peaks: the check worker's peak resident bytes per stage (``XlaReport.worker_peaks``): what the
        check cost the host.
    """

    numerics: Numerics
    rows: tuple[KindRow, ...]
    matched: int
    predicted_count: int
    xla_count: int
    predicted_peak_bytes: int
    xla_peak_bytes: int
    tolerance: float
    xla_footprint_bytes: int = 0
    xla_layout_copy_bytes: int = 0
    xla_collective_bytes: int = 0
    worker_peaks: tuple[tuple[str, int], ...] = ()

    @property
    def agreement(self) -> float:
        """Matched collectives over the larger count (1.0 when neither side has any)."""
        total = max(self.predicted_count, self.xla_count)
        return self.matched / total if total else 1.0

    @property
    def peak_error(self) -> float:
        """``predicted / xla - 1`` of the peak memory against XLA's live peak (0.0 when XLA reports none)."""
        return self.predicted_peak_bytes / self.xla_peak_bytes - 1 if self.xla_peak_bytes else 0.0


def xla_footprint(memory: dict[str, int]) -> int:
    """Bytes XLA allocates per device for one run: arguments + outputs + temporaries − aliased.

    Temporaries share one allocation whose size is the peak of the temporaries live at once
    under XLA's schedule (buffer assignment); arguments and outputs have their own for the
    whole run. (The CPU client's ``peak_memory_in_bytes`` equals arguments + outputs in every
    module we compiled: it leaves the temporaries out, so it is not compared.)
    """
    return (memory.get("argument_size_in_bytes", 0) + memory.get("output_size_in_bytes", 0)
            + memory.get("temp_size_in_bytes", 0) - memory.get("alias_size_in_bytes", 0))


def xla_transfers(report: XlaReport) -> list[Transfer]:
    """XLA's collectives, one per operand of a combined instruction."""
    found: list[Transfer] = []
    for collective in report.collectives:
        parts = collective.parts or ((collective.bytes_in, collective.bytes_out),)
        found.extend(Transfer(collective.kind, collective.axes, i, o, collective.in_loop) for i, o in parts)
    return found


def predicted_transfers(collectives: Sequence[Collective], *, reduce_scatter: bool = False,
                        loop_ops: frozenset[int] = frozenset()) -> list[Transfer]:
    """The predicted collectives as compared; those of the ops in ``loop_ops`` run in a loop body. Unless
    ``reduce_scatter``, a reduce-scatter is compared as the all-reduce of its input that XLA's CPU pipeline leaves
    in its place (the partitioner writes all-reduce + dynamic-slice; only the GPU and TPU pipelines run the
    ``ReduceScatterCreator`` pass that fuses the two): toast prices the accelerators' reduce-scatter."""
    return [Transfer("all-reduce", c.axes, c.bytes_in, c.bytes_in, c.op in loop_ops)
            if c.kind == "reduce-scatter" and not reduce_scatter
            else Transfer(c.kind, c.axes, c.bytes_in, c.bytes_out, c.op in loop_ops) for c in collectives]


def _close(predicted: int, actual: int, tolerance: float) -> bool:
    return abs(predicted - actual) <= tolerance * actual


def match_count(predicted: Sequence[Transfer], actual: Sequence[Transfer], *, tolerance: float) -> int:
    """Pairs of one (kind, axes) group within ``tolerance``: a greedy pass over both sorted lists."""
    ours = sorted(predicted, key=lambda t: (t.bytes_out, t.bytes_in))
    theirs = sorted(actual, key=lambda t: (t.bytes_out, t.bytes_in))
    i = j = matched = 0
    while i < len(ours) and j < len(theirs):
        if _close(ours[i].bytes_out, theirs[j].bytes_out, tolerance) and _close(ours[i].bytes_in, theirs[j].bytes_in,
                                                                              tolerance):
            matched += 1
            i += 1
            j += 1
        elif ours[i].bytes_out < theirs[j].bytes_out:
            i += 1
        else:
            j += 1
    return matched


def compare(collectives: Sequence[Collective], predicted_peak_bytes: int, report: XlaReport, *,
            tolerance: float = DEFAULT_TOLERANCE, reduce_scatter: bool = False,
            loop_ops: frozenset[int] = frozenset()) -> Agreement:
    """Set predicted collectives and peak memory against what XLA compiled (``reduce_scatter``, ``loop_ops``:
    see ``predicted_transfers``; true for a backend that forms reduce-scatters). A collective in a loop body
    matches only one in a loop body."""
    predicted = predicted_transfers(collectives, reduce_scatter=reduce_scatter, loop_ops=loop_ops)
    actual = xla_transfers(report)
    live = report.live_peak
    groups: dict[tuple[bool, str, tuple[str, ...]], tuple[list[Transfer], list[Transfer]]] = {}
    for transfer in predicted:
        groups.setdefault((transfer.in_loop, transfer.kind, transfer.axes), ([], []))[0].append(transfer)
    for transfer in actual:
        groups.setdefault((transfer.in_loop, transfer.kind, transfer.axes), ([], []))[1].append(transfer)
    rows = []
    for (in_loop, kind, axes), (ours, theirs) in sorted(groups.items()):
        rows.append(KindRow(kind, axes, len(ours), len(theirs), sum(t.bytes_out for t in ours),
                            sum(t.bytes_out for t in theirs), match_count(ours, theirs, tolerance=tolerance), in_loop))
    return Agreement(
        numerics=report.numerics,
        rows=tuple(rows),
        matched=sum(r.matched for r in rows),
        predicted_count=len(predicted),
        xla_count=len(actual),
        predicted_peak_bytes=int(predicted_peak_bytes),
        xla_peak_bytes=live.bytes if live is not None else xla_footprint(report.memory),
        tolerance=tolerance,
        xla_footprint_bytes=xla_footprint(report.memory),
        xla_layout_copy_bytes=live.layout_copy_bytes if live is not None else 0,
        xla_collective_bytes=live.collective_bytes if live is not None else 0,
        worker_peaks=report.worker_peaks,
    )


def format_agreement(agreement: Agreement) -> str:
    """The agreement table and its summary lines, as ``toast validate`` prints them."""
    header = ("collective", "axes", "predicted", "XLA", "pred bytes", "XLA bytes", f"within {agreement.tolerance:.0%}")
    # A loop body's collectives run once per iteration; their bytes are one iteration's.
    body = [(r.kind + (" (loop body)" if r.in_loop else ""), "+".join(r.axes) or "-", str(r.predicted), str(r.xla),
             str(r.predicted_bytes), str(r.xla_bytes), str(r.matched)) for r in agreement.rows]
    widths = [max(len(row[k]) for row in [header, *body]) for k in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if k < 2 else cell.rjust(width) for k, (cell, width) in
                       enumerate(zip(row, widths, strict=True))).rstrip() for row in [header, *body]]
    numerics = agreement.numerics
    lines.append(f"collectives: {agreement.matched} of {max(agreement.predicted_count, agreement.xla_count)} agree "
                 f"({agreement.agreement:.0%}; predicted {agreement.predicted_count}, XLA {agreement.xla_count})")
    lines.append(f"peak memory per device: predicted {agreement.predicted_peak_bytes} B, XLA "
                 f"{agreement.xla_peak_bytes} B live at once ({agreement.peak_error:+.1%}; of it "
                 f"{agreement.xla_layout_copy_bytes} B layout copies, {agreement.xla_collective_bytes} B collective "
                 f"results); XLA allocates {agreement.xla_footprint_bytes} B")
    nans = (f"; {numerics.nan_values} NaN in the reference, {numerics.nan_mismatches} NaN on one side only"
            if numerics.nan_values or numerics.nan_mismatches else "")
    largest = (f", largest relative error {numerics.worst[0].relative_error:.3g} ({numerics.worst[0].name})"
               if numerics.match and numerics.worst else "")
    lines.append(f"numerics: {'match' if numerics.match else 'MISMATCH'} over {numerics.outputs} outputs "
                 f"(max abs error {numerics.max_abs_error:.3g}{largest}{nans})")
    if agreement.worker_peaks:
        stage, peak = max(agreement.worker_peaks, key=lambda item: item[1])
        lines.append(f"host memory of the check: {human_bytes(peak)} resident at most, while {stage}")
    if numerics.worst and not numerics.match:
        lines.append("worst outputs (max abs error over the output's largest magnitude: float32 rounding gives "
                     "1e-7 to 1e-5, a wrong sharding about 1):")
        for e in numerics.worst:
            nan = f"; {e.nan_mismatches} NaN on one side only" if e.nan_mismatches else ""
            lines.append(f"  {'MISMATCH' if not e.match else 'within':8}  {e.name}: relative error "
                         f"{e.relative_error:.3g} ({e.max_abs_error:.3g} of {e.scale:.3g}{nan})")
    return "\n".join(lines) + "\n"


def validate(model: ShardingModel, state: ShardingState, hardware: Hardware, *, seed: int = 0,
             tolerance: float = DEFAULT_TOLERANCE, timeout_s: float = 600.0) -> Agreement:
    """Estimate ``state``, have XLA compile and run its sharded module on ``mesh.devices`` host
    CPU devices (a worker process), and compare.

    The worker holds about ``mesh.devices`` times what XLA allocates per device (the sharded run), plus the
    unsharded outputs and JAX itself (0.7 GiB for a GPT-2-size step); it refuses to start the sharded run
    where the host has less memory available.

    Raises:
      toast.xla.worker.WorkerTimeout: the check ran past ``timeout_s`` seconds.
      ToastError: the module cannot be written, XLA rejects it, or the host lacks the memory to run it.
    """
    cost_model = CostModel(model, hardware)
    cost = cost_model.evaluate(state)
    text = sharded_module_text(model, state, communication=cost_model.communication)
    report = check_sharded_module(text, model.mesh.axes, seed=seed, timeout_s=timeout_s)
    loop_ops = frozenset(np.flatnonzero(cost_model.op_in_loop).tolist())
    return compare(cost.collectives, cost.peak_bytes, report, tolerance=tolerance, loop_ops=loop_ops)


def agreement_json(agreement: Agreement) -> dict[str, Any]:
    """The agreement as JSON (``toast validate --json``)."""
    return {
        "numerics": {"match": agreement.numerics.match, "max_abs_error": agreement.numerics.max_abs_error,
                     "outputs": agreement.numerics.outputs, "nan_values": agreement.numerics.nan_values,
                     "nan_mismatches": agreement.numerics.nan_mismatches,
                     "worst": [{"name": e.name, "match": e.match, "relative_error": _finite(e.relative_error),
                                "max_abs_error": e.max_abs_error, "scale": e.scale,
                                "nan_mismatches": e.nan_mismatches} for e in agreement.numerics.worst]},
        "collectives": [{"kind": r.kind, "axes": list(r.axes), "predicted": r.predicted, "xla": r.xla,
                         "predicted_bytes": r.predicted_bytes, "xla_bytes": r.xla_bytes, "matched": r.matched,
                         "in_loop": r.in_loop}
                        for r in agreement.rows],
        "matched": agreement.matched,
        "predicted_count": agreement.predicted_count,
        "xla_count": agreement.xla_count,
        "agreement": agreement.agreement,
        "tolerance": agreement.tolerance,
        "worker_peak_bytes": [{"stage": stage, "bytes": peak} for stage, peak in agreement.worker_peaks],
        "peak_bytes": {"predicted": agreement.predicted_peak_bytes, "xla": agreement.xla_peak_bytes,
                       "error": agreement.peak_error, "xla_footprint": agreement.xla_footprint_bytes,
                       "xla_layout_copies": agreement.xla_layout_copy_bytes,
                       "xla_collective_results": agreement.xla_collective_bytes},
    }


def _finite(number: float) -> float | None:
    """``number``, or None where it is infinite (JSON has no infinity)."""
    return number if math.isfinite(number) else None
