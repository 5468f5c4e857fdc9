"""The collectives of XLA's compiled, partitioned module (``LoadedExecutable.hlo_modules()``), each with the
mesh axes its device groups vary along and its per-device bytes. Runs in the check worker."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from toast.xla.groups import device_count, group_axes, parse_groups
from toast.xla.hlo_text import HloShape, parse_instruction
from toast.xla.report import XlaCollective

__all__ = ["hlo_collectives"]


# Collective opcode name (``HloOpcode.name`` without the leading ``k``) -> reported kind.
_COLLECTIVE_KINDS: dict[str, str] = {
    "AllReduce": "all-reduce",
    "AllReduceStart": "all-reduce",
    "AllGather": "all-gather",
    "AllGatherStart": "all-gather",
    "ReduceScatter": "reduce-scatter",
    "AllToAll": "all-to-all",
    "RaggedAllToAll": "ragged-all-to-all",
    "CollectivePermute": "collective-permute",
    "CollectivePermuteStart": "collective-permute",
    "CollectiveBroadcast": "collective-broadcast",
}


# The ``*-start`` opcodes -> the ``*-done`` opcode that carries the result.
_DONE_OF_START: dict[str, str] = {
    "AllReduceStart": "AllReduceDone",
    "AllGatherStart": "AllGatherDone",
    "CollectivePermuteStart": "CollectivePermuteDone",
}


def _opcode_name(instruction: Any) -> str:
    """``AllReduce`` for ``HloOpcode.kAllReduce``."""
    return instruction.opcode.name.removeprefix("k")


def hlo_collectives(hlo_module: Any, mesh_axes: Sequence[tuple[str, int]]) -> list[XlaCollective]:
    """The collectives of a compiled ``HloModule``, each once.

    ``*-done`` instructions are skipped (their ``*-start`` is reported, with the done's result
    as ``bytes_out``); an ``async-start`` is resolved to its wrapped collective; instruction
    names (unique in a module) deduplicate the wrapped computation's own copy.
    """
    found: dict[str, XlaCollective] = {}
    in_loops = _loop_computations(hlo_module)
    for computation in hlo_module.computations():
        in_loop = computation.name in in_loops
        for instruction in computation.instructions():
            opcode = _opcode_name(instruction)
            if opcode == "AsyncStart":
                instruction = instruction.async_wrapped_root()
                opcode = _opcode_name(instruction)
            if opcode in _COLLECTIVE_KINDS:
                name = instruction.name
                if name not in found:
                    found[name] = dataclasses.replace(_collective(instruction, opcode, mesh_axes), in_loop=in_loop)
    return list(found.values())


# Attributes of an HLO instruction that name the computations it runs.
_CALLED = ("body", "condition", "calls", "to_apply", "branch_computations", "true_computation", "false_computation")


def _loop_computations(hlo_module: Any) -> set[str]:
    """The names of the computations a ``while`` runs, directly (its body and condition) or through calls."""
    called: dict[str, list[str]] = {}
    roots: list[str] = []
    for computation in hlo_module.computations():
        targets = called.setdefault(computation.name, [])
        for instruction in computation.instructions():
            opcode = _opcode_name(instruction)
            if opcode not in ("While", "Call", "Conditional", "Fusion", "AsyncStart"):
                continue
            attributes = parse_instruction(instruction.to_string()).attributes
            names = [name.strip().lstrip("%") for key in _CALLED for name in
                     attributes.get(key, "").strip("{}").split(",") if name.strip()]
            if opcode == "While":
                roots.extend(names)
            targets.extend(names)
    inside: set[str] = set()
    while roots:
        name = roots.pop()
        if name not in inside:
            inside.add(name)
            roots.extend(called.get(name, ()))
    return inside


def _collective(instruction: Any, opcode: str, mesh_axes: Sequence[tuple[str, int]]) -> XlaCollective:
    """One ``XlaCollective`` from an HLO instruction (``opcode`` as ``_opcode_name`` gives it)."""
    parsed = parse_instruction(instruction.to_string())
    operands = [shape for operand in instruction.operands()
                for shape in parse_instruction(operand.to_string()).shapes]
    result = parsed.shapes
    done = _DONE_OF_START.get(opcode)
    if done is not None:
        users = [user for user in instruction.users() if _opcode_name(user) == done]
        if users:
            result = parse_instruction(users[0].to_string()).shapes
    count = device_count(mesh_axes)
    if parsed.attributes.get("replica_groups", "").startswith("mesh[") and "device_ids" in parsed.attributes:
        # ``mesh[...], device_ids=(...) {axes}``: the comma split one value in two.
        parsed.attributes["replica_groups"] += ", device_ids=" + parsed.attributes.pop("device_ids")
    if "source_target_pairs" in parsed.attributes:
        groups = parse_groups(parsed.attributes["source_target_pairs"], count)
    else:
        groups = parse_groups(parsed.attributes.get("replica_groups", "{}"), count)
    first = operands[0] if operands else (result[0] if result else HloShape("token", ()))
    return XlaCollective(
        kind=_COLLECTIVE_KINDS[opcode],
        axes=group_axes(groups, mesh_axes),
        groups=groups,
        dtype=first.dtype,
        shape=first.dims,
        bytes_in=sum(s.nbytes for s in operands),
        bytes_out=sum(s.nbytes for s in result),
        name=parsed.name,
        parts=(tuple((i.nbytes, o.nbytes) for i, o in zip(operands, result, strict=True))
               if len(operands) == len(result)
               else ((sum(s.nbytes for s in operands), sum(s.nbytes for s in result)),)),
    )
