"""One line of XLA's HLO text: its name, result shape, opcode and attributes.

jaxlib 0.10.2's ``HloInstruction`` (from ``LoadedExecutable.hlo_modules()``) gives names, opcodes,
operands and users, but neither an instruction's shape nor its attributes (``replica_groups``,
``calls``, ...); ``HloInstruction.to_string()`` prints them, and ``parse_instruction`` reads that line:
``[ROOT] %name = shape opcode(operands), key=value, ...``. Pure; tests: ``tests/test_xla_check.py``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from toast.errors import ToastError

__all__ = ["HloInstructionText", "HloShape", "parse_instruction", "skip_balanced"]


@dataclass(frozen=True)
class HloShape:
    """An HLO array shape: element type and dimensions (dynamic bounds read as their bound)."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of one such array, dense (sub-byte types rounded up to a whole byte)."""
        return (math.prod(self.dims) * _hlo_bits(self.dtype) + 7) // 8


def _hlo_bits(element_type: str) -> int:
    """Bits of one element of an HLO primitive type. HLO names carry the width: ``s4``, ``u8``,
    ``bf16``, ``f8e4m3fn``, ``c64`` (the two parts together); ``pred`` is a byte, ``token`` none."""
    if element_type == "pred":
        return 8
    if element_type == "token":
        return 0
    width = re.match(r"[a-z]+?(\d+)", element_type)
    if width is None:
        raise ToastError(f"unknown HLO element type '{element_type}' (no width in its name)")
    return int(width.group(1))


@dataclass(frozen=True)
class HloInstructionText:
    """What ``_parse_instruction`` reads off one HLO instruction line.

    Attributes:
      name: instruction name without ``%``.
      shapes: the result's array shapes, flattened (one for an array, several for a tuple).
      opcode: the opcode as printed (``all-reduce``).
      attributes: top-level ``key=value`` attributes after the operand list, values verbatim.
    """

    name: str
    shapes: tuple[HloShape, ...]
    opcode: str
    attributes: dict[str, str]


def parse_instruction(line: str) -> HloInstructionText:
    """Parse ``[ROOT] %name = shape opcode(operands), key=value, ...`` (one HLO line)."""
    match = re.match(r"\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*", line)
    if match is None:
        raise ToastError(f"cannot read HLO instruction line: {line[:80]!r}")
    shapes, at = _parse_shape(line, match.end())
    opcode_match = re.compile(r"\s*([\w\-.]+)\(").match(line, at)
    if opcode_match is None:
        raise ToastError(f"cannot find the opcode in HLO line: {line[:80]!r}")
    close = skip_balanced(line, opcode_match.end() - 1)
    return HloInstructionText(name=match.group(1), shapes=tuple(shapes), opcode=opcode_match.group(1),
                              attributes=_parse_attributes(line[close:]))


def _parse_shape(text: str, at: int) -> tuple[list[HloShape], int]:
    """Parse the shape starting at ``text[at]``; return its flattened arrays and the end."""
    at = _skip_blank(text, at, " ")
    if text.startswith("(", at):
        shapes: list[HloShape] = []
        at += 1
        while True:
            at = _skip_blank(text, at, " ,")
            if text[at] == ")":
                return shapes, at + 1
            inner, at = _parse_shape(text, at)
            shapes.extend(inner)
    match = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]").match(text, at)
    if match is None:
        raise ToastError(f"cannot read an HLO shape at: {text[at:at + 40]!r}")
    dims = tuple(int(d.strip().removeprefix("<=")) for d in match.group(2).split(",") if d.strip())
    at = match.end()
    if text.startswith("{", at):  # layout
        at = skip_balanced(text, at)
    return [HloShape(match.group(1), dims)], at


def _skip_blank(text: str, at: int, blanks: str) -> int:
    """Index of the first character from ``at`` that is not in ``blanks`` nor in a ``/*...*/``
    comment (XLA numbers long tuples: ``(f32[2], /*index=5*/f32[2])``)."""
    while at < len(text):
        if text[at] in blanks:
            at += 1
        elif text.startswith("/*", at):
            end = text.find("*/", at + 2)
            if end < 0:
                raise ToastError(f"unclosed comment in HLO text: {text[at:at + 40]!r}")
            at = end + 2
        else:
            break
    return at


def skip_balanced(text: str, at: int) -> int:
    """Index just past the bracket group opening at ``text[at]`` (quotes respected)."""
    closing = {"(": ")", "[": "]", "{": "}"}
    stack: list[str] = []
    quoted = False
    for i in range(at, len(text)):
        char = text[i]
        if quoted:
            if char == "\\":
                continue
            quoted = char != '"'
        elif char == '"':
            quoted = True
        elif char in closing:
            stack.append(closing[char])
        elif stack and char == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    raise ToastError(f"unbalanced brackets in HLO text: {text[at:at + 40]!r}")


def _parse_attributes(text: str) -> dict[str, str]:
    """``, key=value, key=value`` (values may nest brackets and quotes) as a dict."""
    attributes: dict[str, str] = {}
    at = 0
    key_pattern = re.compile(r"\s*,\s*([\w.\-]+)=")
    while True:
        match = key_pattern.match(text, at)
        if match is None:
            return attributes
        at = start = match.end()
        while at < len(text) and text[at] != ",":
            at = skip_balanced(text, at) if text[at] in "({[\"" else at + 1
        attributes[match.group(1)] = text[start:at].strip()
