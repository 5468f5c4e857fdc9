"""What XLA made of a sharded module, as the check worker reports it: numerics, collectives, memory and its
live peak (``XlaReport``), and the reply's JSON read back (``report_from_json``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toast.xla.live_range import LivePeak, LiveValue

__all__ = ["Numerics", "XlaCollective", "XlaReport", "report_from_json"]


@dataclass(frozen=True)
class Numerics:
    """Sharded outputs against the 1-device reference.

    Attributes:
      match: every output shard on every device is close to the reference (``numpy.allclose``
        with rtol=1e-4, atol=1e-5 + rtol·max|reference| for f32/f64, rtol=atol=1e-2 (plus the
        same scaled term) for f16/bf16, exact for integers: sharding reorders sums, whose
        rounding error follows the output's magnitude).
        A NaN matches a NaN at the same place (a program that makes NaN makes it sharded or not); a
        NaN on one side only is a mismatch.
      max_abs_error: the largest absolute difference over all outputs and devices, where neither side is
        NaN or infinite.
      outputs: how many outputs ``@main`` returns.
      nan_values: NaN elements of the reference outputs.
      nan_mismatches: output elements NaN on one side only (over all devices' shards).
    """

    match: bool
    max_abs_error: float
    outputs: int
    nan_values: int = 0
    nan_mismatches: int = 0


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
    """

    numerics: Numerics
    collectives: tuple[XlaCollective, ...]
    memory: dict[str, int]
    live_peak: LivePeak | None = None


def report_from_json(reply: dict[str, Any]) -> XlaReport:
    """The ``XlaReport`` of a check worker's JSON reply."""
    numerics = reply["numerics"]
    return XlaReport(
        numerics=Numerics(match=bool(numerics["match"]), max_abs_error=float(numerics["max_abs_error"]),
                          outputs=int(numerics["outputs"]), nan_values=int(numerics.get("nan_values", 0)),
                          nan_mismatches=int(numerics.get("nan_mismatches", 0))),
        collectives=tuple(
            XlaCollective(kind=c["kind"], axes=tuple(c["axes"]), groups=tuple(tuple(g) for g in c["groups"]),
                          dtype=c["dtype"], shape=tuple(c["shape"]), bytes_in=int(c["bytes_in"]),
                          bytes_out=int(c["bytes_out"]), name=c["name"],
                          parts=tuple((int(i), int(o)) for i, o in c.get("parts", ())))
            for c in reply["collectives"]
        ),
        memory={str(k): int(v) for k, v in reply["memory"].items()},
        live_peak=(LivePeak(time=int(reply["live_peak"]["time"]),
                            values=tuple(LiveValue(str(n), int(b), str(k)) for n, b, k in reply["live_peak"]["values"]))
                   if reply.get("live_peak") else None),
    )
