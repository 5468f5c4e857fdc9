"""Dimension names in words, for people: errors, strategy files and drawings name dims this way."""

from __future__ import annotations

from toast.analysis.named_dimensions import Analysis
from toast.errors import ToastError


def describe_name(analysis: Analysis, name: int) -> str:
    """A dimension name in words: ``x[0]`` or ``use of x[0] by stablehlo.add %3 (operand 1)``."""
    program = analysis.program
    if name < len(analysis.names.defs):
        value_id, dim = analysis.names.defs[name]
        return f"{program.values[value_id].name}[{dim}]"
    op_id, index, dim = analysis.names.uses[name - len(analysis.names.defs)]
    op = program.ops[op_id]
    value = program.values[op.operands[index]].name
    return f"{value}[{dim}] as operand {index} of {op.kind} {analysis.program.op_label(op_id)}"


def dim_spellings(text: str) -> list[tuple[str, int]]:
    """The ``(value, dim)`` readings of a dim as users write it: ``VALUE:DIM`` (the JSON's and
    ``toast explain``'s form) or ``VALUE[DIM]`` (the summary's form); empty when neither parses.
    ``result[0]:1`` reads one way; ``result[0]`` could be dim 0 of ``result``."""
    readings = []
    value, sep, dim = text.rpartition(":")
    if sep and value and dim.isdigit():
        readings.append((value, int(dim)))
    if text.endswith("]") and "[" in text:
        value, _, dim = text[:-1].rpartition("[")
        if value and dim.isdigit():
            readings.append((value, int(dim)))
    return readings


def resolve_dim(analysis: Analysis, text: str) -> tuple[str, int]:
    """The ``(value, dim)`` of ``text`` (see ``dim_spellings``) that names a dim of ``analysis``.

    Raises:
      ToastError: no reading names a dim of the program (the first reading's error).
    """
    readings = dim_spellings(text)
    if not readings:
        raise ToastError(f"dimension '{text}' should be VALUE:DIM or VALUE[DIM], e.g. x:0 or result[0]:1")
    for value, dim in readings:
        try:
            analysis.dim_name(value, dim)
        except ToastError:
            continue
        return value, dim
    value, dim = readings[0]
    analysis.dim_name(value, dim)  # raises the first reading's error
    raise AssertionError("unreachable")  # pragma: no cover
