"""What XLA made of a sharded module, as the check worker reports it: numerics, collectives, memory and its
live peak (``XlaReport``), and the reply's JSON read back (``report_from_json``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from toast.xla.live_range import LivePeak, LiveValue

__all__ = ["Numerics", "OutputError", "XlaCollective", "XlaReport", "report_from_json"]


@dataclass(frozen=True)
class OutputError:
    """How far one output of the sharded run is from the reference.

    Attributes:
      name: the output as toast names results: its ``jax.result_info`` path (``result[1]['w']``), else
        ``result[i]``.
      match: every shard within the tolerance (see ``Numerics``).
      max_abs_error: the largest absolute difference over its shards, where neither side is NaN or infinite.
      scale: the largest finite magnitude of the reference output (what the tolerance scales with).
      nan_mismatches: elements NaN on one side only.
    """

    name: str
    match: bool
    max_abs_error: float
    scale: float
    nan_mismatches: int = 0

    @property
    def relative_error(self) -> float:
        """``max_abs_error / scale``: about 1e-7 to 1e-5 for float32 rounding (sums reordered), order one
        for a wrong sharding; infinite for an error on an output whose reference is all zero."""
        if self.scale > 0:
            return self.max_abs_error / self.scale
        return math.inf if self.max_abs_error > 0 else 0.0


@dataclass(frozen=True)
class Numerics:
    """Sharded outputs against the 1-device reference.

    Attributes:
      match: every output shard on every device is close to the reference: ``|got - want| <=
        atol + rtol * scale`` with ``scale`` the output's largest finite magnitude, rtol=1e-4, atol=1e-5
        for f32/f64, rtol=atol=1e-2 for f16/bf16, exact for integers (sharding reorders sums, whose
        rounding error follows the output's magnitude, not each element's).
        A NaN matches a NaN at the same place (a program that makes NaN makes it sharded or not); a
        NaN on one side only is a mismatch.
      max_abs_error: the largest absolute difference over all outputs and devices, where neither side is
        NaN or infinite.
      outputs: how many outputs ``@main`` returns.
      nan_values: NaN elements of the reference outputs.
      nan_mismatches: output elements NaN on one side only (over all devices' shards).
      worst: the outputs furthest from the reference (at most 3): mismatched ones first, then by relative
        error; outputs equal to the reference are left out.
    """

    match: bool
    max_abs_error: float
    outputs: int
    nan_values: int = 0
    nan_mismatches: int = 0
    worst: tuple[OutputError, ...] = ()


@dataclass(frozen=True)
class XlaCollective:
    """One collective of XLA's partitioned module (an async start/done pair counts once).

    Attributes:
      kind: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
        ``ragged-all-to-all``, ``collective-permute`` or ``collective-broadcast``.
      axes: the mesh axes the device groups vary along, in mesh order (``("model",)``);
        empty when every group is one device.
      groups: the device groups (partition ids), or ``(source, target)`` pairs for a
        collective-permute; exact where ``axes`` is coarse (a group over part of an axis).
      dtype: HLO element type of the first operand (``f32``, ``s32``, ``bf16``, ...).
      shape: per-device shape of the first operand.
      bytes_in: per-device bytes of all operands (the shards sent in).
      bytes_out: per-device bytes of the result (the shard that comes out).
      name: the instruction's name in the HLO module.
      parts: ``(bytes_in, bytes_out)`` per operand when XLA combined several collectives into
        one variadic instruction (its all-reduce/all-gather combiners), else one pair.
      in_loop: it runs in a ``while`` loop's body (once per iteration), directly or in a computation called there.
    """

    kind: str
    axes: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    dtype: str
    shape: tuple[int, ...]
    bytes_in: int
    bytes_out: int
    name: str
    parts: tuple[tuple[int, int], ...] = ()
    in_loop: bool = False


@dataclass(frozen=True)
class XlaReport:
    """What XLA made of a sharded module.

    Attributes:
      numerics: the sharded run against the unsharded reference.
      collectives: the collectives of the compiled module, in instruction order of the
        module's computations.
      memory: per-device sizes in bytes from ``CompiledMemoryStats``, under XLA's names
        (``argument_size_in_bytes``, ``output_size_in_bytes``, ``temp_size_in_bytes``,
        ``generated_code_size_in_bytes``, ``alias_size_in_bytes``, ``peak_memory_in_bytes``
        and the ``host_*`` ones).
      live_peak: the values live at once at the peak of XLA's schedule (``toast.xla.live_range``);
        None in a reply that has none.
      worker_peaks: the check worker's own peak resident memory per stage, ``(stage, bytes)`` in the order
        run (``reading the module``, ``compiling the reference``, ``running the reference``, ``compiling the
        sharded module``, ``running the sharded module``, ``comparing the outputs``): what the check costs the
        host, not the program's memory.
    """

    numerics: Numerics
    collectives: tuple[XlaCollective, ...]
    memory: dict[str, int]
    live_peak: LivePeak | None = None
    worker_peaks: tuple[tuple[str, int], ...] = ()


def report_from_json(reply: dict[str, Any]) -> XlaReport:
    """The ``XlaReport`` of a check worker's JSON reply."""
    numerics = reply["numerics"]
    return XlaReport(
        numerics=Numerics(match=bool(numerics["match"]), max_abs_error=float(numerics["max_abs_error"]),
                          outputs=int(numerics["outputs"]), nan_values=int(numerics.get("nan_values", 0)),
                          nan_mismatches=int(numerics.get("nan_mismatches", 0)),
                          worst=tuple(OutputError(name=str(w["name"]), match=bool(w["match"]),
                                                  max_abs_error=float(w["max_abs_error"]), scale=float(w["scale"]),
                                                  nan_mismatches=int(w.get("nan_mismatches", 0)))
                                      for w in numerics.get("worst", ()))),
        collectives=tuple(
            XlaCollective(kind=c["kind"], axes=tuple(c["axes"]), groups=tuple(tuple(g) for g in c["groups"]),
                          dtype=c["dtype"], shape=tuple(c["shape"]), bytes_in=int(c["bytes_in"]),
                          bytes_out=int(c["bytes_out"]), name=c["name"],
                          parts=tuple((int(i), int(o)) for i, o in c.get("parts", ())),
                          in_loop=bool(c.get("in_loop", False)))
            for c in reply["collectives"]
        ),
        memory={str(k): int(v) for k, v in reply["memory"].items()},
        live_peak=(LivePeak(time=int(reply["live_peak"]["time"]),
                            values=tuple(LiveValue(str(n), int(b), str(k)) for n, b, k in reply["live_peak"]["values"]))
                   if reply.get("live_peak") else None),
        worker_peaks=tuple((str(stage), int(peak)) for stage, peak in reply.get("worker_peaks", ())),
    )
