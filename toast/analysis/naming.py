"""Dimension names in words, for people: errors, strategy files and drawings name dims this way."""

from __future__ import annotations

from toast.analysis.named_dimensions import Analysis


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
