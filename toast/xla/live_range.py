"""XLA's own live peak of a compiled module: the bytes live at once under its schedule.

``CompiledMemoryStats`` gives XLA's *footprint*: arguments + outputs + one block holding every
temporary, whose size is what XLA's heap packing reached. On the CPU backend that block is 3-10%
larger than the most bytes ever live at once (the packing's fragmentation), and the CPU backend
copies dot operands into a new layout before it multiplies them. Neither is what the cost model
predicts (the bytes live at once on an accelerator), so ``toast validate`` reads both apart:

- the live peak comes from XLA's ``HloLiveRange`` report, which the compiler writes as
  ``<module>.cpu_after_optimizations-live-range.txt`` when asked to dump
  (``xla_dump_to``, ``xla_dump_hlo_as_text``): after the schedule and the buffer live ranges it
  lists every value live at the peak as ``  name{index}: N bytes (cumulative: M bytes)`` under a
  ``  Live ranges at T (peak):`` heading (jaxlib 0.10.2 has no API that returns these ranges, and
  its ``serialized_buffer_assignment_proto`` carries no heap trace on CPU);
- a value is a *layout copy* when its instruction only moves data: a ``copy`` or ``transpose``, or a
  fusion whose fused computation holds nothing but ``copy``, ``transpose``, ``bitcast`` and
  ``reshape`` (read from the compiled ``HloModule``'s computations, see ``instruction_kinds``).

Pure text and structure readers; the worker (``toast.xla.worker``) runs the compile.
Tests: ``tests/test_validate.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toast.errors import ToastError
from toast.xla.hlo_text import parse_instruction

__all__ = ["LivePeak", "LiveValue", "classify", "instruction_kinds", "live_peak_from_dump", "read_live_range"]

# Opcodes that move data without computing (``HloOpcode.name`` without the ``k``).
_DATA_MOVEMENT = frozenset({"Copy", "Transpose", "Bitcast", "Reshape"})

_PEAK_HEADING = re.compile(r"\s*Live ranges at (\d+) \(peak\):\s*$")
_LIVE_VALUE = re.compile(r"\s+(\S+?)(\{[^}]*\})?: (\d+) bytes\b")

# Opcodes of collectives whose result is a buffer (an async ``*-start``'s result is held until its ``*-done``).
_COLLECTIVES = frozenset({"AllGather", "AllGatherStart", "AllGatherDone", "AllReduce", "AllReduceStart",
                          "AllReduceDone", "AllToAll", "RaggedAllToAll", "CollectivePermute", "CollectivePermuteStart",
                          "CollectivePermuteDone", "ReduceScatter", "CollectiveBroadcast"})

ARGUMENT, LAYOUT_COPY, COLLECTIVE, COMPUTED = "argument", "layout copy", "collective", "computed"


@dataclass(frozen=True, slots=True)
class LiveValue:
    """One value live at XLA's peak.

    Attributes:
      name: the HLO instruction that defines it, with its tuple index when it is a tuple part
        (``while.3{2}``); an index ``{}`` (the whole value) is left off.
      bytes: its size per device.
      kind: ``argument`` (an entry parameter), ``layout copy`` (see the module docstring),
        ``collective`` (a collective's result) or ``computed``.
    """

    name: str
    bytes: int
    kind: str


@dataclass(frozen=True, slots=True)
class LivePeak:
    """The values live at once at XLA's peak, largest first.

    Attributes:
      time: the position of the peak in XLA's flattened schedule.
      values: every value live there.
    """

    time: int
    values: tuple[LiveValue, ...]

    @property
    def bytes(self) -> int:
        """Bytes live at the peak, per device."""
        return sum(v.bytes for v in self.values)

    @property
    def layout_copy_bytes(self) -> int:
        """Bytes of the layout copies live at the peak, per device."""
        return sum(v.bytes for v in self.values if v.kind == LAYOUT_COPY)

    @property
    def collective_bytes(self) -> int:
        """Bytes of collectives' results live at the peak, per device."""
        return sum(v.bytes for v in self.values if v.kind == COLLECTIVE)


def read_live_range(text: str, *, source: str = "live-range report") -> tuple[int, list[tuple[str, int]]]:
    """The peak of an ``HloLiveRange`` report: its schedule position and ``(name, bytes)`` per value.

    Raises:
      ToastError: the text has no ``Live ranges at T (peak):`` section.
    """
    lines = text.splitlines()
    for at, line in enumerate(lines):
        heading = _PEAK_HEADING.match(line)
        if heading is None:
            continue
        values: list[tuple[str, int]] = []
        for value_line in lines[at + 1:]:
            value = _LIVE_VALUE.match(value_line)
            if value is None:
                break
            index = value.group(2) or "{}"
            values.append((value.group(1) + ("" if index == "{}" else index), int(value.group(3))))
        return int(heading.group(1)), values
    raise ToastError(f"{source}: no 'Live ranges at T (peak):' section")


def instruction_kinds(hlo_module: Any) -> dict[str, str]:
    """What each instruction of a compiled ``jaxlib`` ``HloModule`` makes, by name, where it is not
    ``computed``: ``argument`` for the entry computation's parameters (the entry is the one computation
    no instruction calls; a loop body's parameters are not arguments), ``collective``, and ``layout copy``
    for a ``copy``/``transpose`` or a fusion whose fused computation holds nothing but data movement."""
    computations = {computation.name: computation for computation in hlo_module.computations()}
    called: set[str] = set()
    kinds: dict[str, str] = {}
    for computation in computations.values():
        for instruction in computation.instructions():
            opcode = _opcode(instruction)
            attributes = parse_instruction(instruction.to_string()).attributes
            called.update(name for value in attributes.values() for name in re.findall(r"%?([\w.\-]+)", value)
                          if name in computations)
            if opcode in ("Copy", "Transpose"):
                kinds[instruction.name] = LAYOUT_COPY
            elif opcode in _COLLECTIVES:
                kinds[instruction.name] = COLLECTIVE
            elif opcode == "Fusion":
                fused = attributes.get("calls", "").removeprefix("%")
                if fused in computations and all(_opcode(i) in _DATA_MOVEMENT or _opcode(i) == "Parameter"
                                                 for i in computations[fused].instructions()):
                    kinds[instruction.name] = LAYOUT_COPY
    entries = [c for name, c in computations.items() if name not in called]
    if len(entries) != 1:
        raise ToastError(f"cannot tell the entry computation of module {hlo_module.name}: "
                         f"{len(entries)} computations are called by none")
    kinds.update((i.name, ARGUMENT) for i in entries[0].instructions() if _opcode(i) == "Parameter")
    return kinds


def live_peak_from_dump(dump_dir: Path, hlo_module: Any) -> LivePeak:
    """XLA's live peak of ``hlo_module``, read from the dump folder its compile wrote.

    Raises:
      ToastError: no live-range report for the module, or one without a peak.
    """
    reports = sorted(dump_dir.glob(f"*.{hlo_module.name}.*live-range.txt"))
    if not reports:
        raise ToastError(f"XLA wrote no live-range report for module {hlo_module.name} in {dump_dir}")
    report = reports[-1]
    time, values = read_live_range(report.read_text(), source=report.name)
    return classify(time, values, kinds=instruction_kinds(hlo_module))


def classify(time: int, values: Iterable[tuple[str, int]], *, kinds: dict[str, str]) -> LivePeak:
    """A ``LivePeak`` of ``(name, bytes)`` values, each marked by its instruction's kind (``computed``
    where ``kinds`` has no entry)."""
    live = [LiveValue(name, size, kinds.get(name.split("{", 1)[0], COMPUTED)) for name, size in values]
    return LivePeak(time, tuple(sorted(live, key=lambda v: (-v.bytes, v.name))))


def _opcode(instruction: Any) -> str:
    return str(instruction.opcode.name).removeprefix("k")
