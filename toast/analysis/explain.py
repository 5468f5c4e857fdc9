"""Why do two dimensions share a color? The chain of identities that joined them.

The color graph has the dimension names as nodes and one edge per row of I (labeled by the
op and the ``.dl`` rule that produced it) and of M (a definition flowing to a use). A
breadth-first search finds a shortest chain between the two names; it is linear in the size
of the graph.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from toast.analysis.named_dimensions import Analysis
from toast.analysis.naming import describe_name


@dataclass(frozen=True, slots=True)
class Step:
    """One link of a chain: from name ``source`` to name ``target``.

    Attributes:
      kind: ``"I"`` (an op rule's identity) or ``"M"`` (a definition flowing to a use).
      op: the op's kind and result name, e.g. ``stablehlo.dot_general %0``.
      op_loc: ``file:line`` of the user's Python for that op.
      rule: ``file:line`` of the ``.dl`` rule (``""`` for M steps).
    """

    source: int
    target: int
    kind: str
    op: str
    op_loc: str
    rule: str


@dataclass(frozen=True, slots=True)
class Explanation:
    """The answer: ``same_color`` and, when true, the chain from the first dim to the second."""

    first: str
    second: str
    same_color: bool
    steps: tuple[Step, ...]


def explain(analysis: Analysis, first: tuple[str, int], second: tuple[str, int]) -> Explanation:
    """The chain of I and M steps joining ``first`` and ``second`` (``(value, dim)`` pairs)."""
    start = analysis.dim_name(*first)
    goal = analysis.dim_name(*second)
    labels = (f"{first[0]}:{first[1]}", f"{second[0]}:{second[1]}")
    if analysis.color_of[start] != analysis.color_of[goal]:
        return Explanation(*labels, same_color=False, steps=())
    adjacency: dict[int, list[tuple[int, int]]] = {}
    edges: list[tuple[str, int, str]] = []  # (kind, op id, rule)
    for identity in analysis.identities:
        edge = len(edges)
        edges.append(("I", identity.op, f"{identity.file}:{identity.line}"))
        adjacency.setdefault(identity.a, []).append((identity.b, edge))
        adjacency.setdefault(identity.b, []).append((identity.a, edge))
    use_ops = analysis.names.uses
    def_count = len(analysis.names.defs)
    for definition, use in analysis.m_edges:
        edge = len(edges)
        edges.append(("M", use_ops[use - def_count][0], ""))
        adjacency.setdefault(definition, []).append((use, edge))
        adjacency.setdefault(use, []).append((definition, edge))
    came_from: dict[int, tuple[int, int]] = {start: (-1, -1)}
    queue = deque([start])
    while queue and goal not in came_from:
        node = queue.popleft()
        for neighbor, edge in adjacency.get(node, ()):
            if neighbor not in came_from:
                came_from[neighbor] = (node, edge)
                queue.append(neighbor)
    chain: list[Step] = []
    node = goal
    while node != start:
        previous, edge = came_from[node]
        kind, op_id, rule = edges[edge]
        op = analysis.program.ops[op_id]
        chain.append(Step(previous, node, kind, f"{op.kind} {analysis.program.op_label(op_id)}", op.loc, rule))
        node = previous
    return Explanation(*labels, same_color=True, steps=tuple(reversed(chain)))


def format_explanation(analysis: Analysis, explanation: Explanation) -> str:
    """Human text: one line per step, with the op's Python location and the rule's."""
    if not explanation.same_color:
        a = analysis.color_of_dim(*_split(explanation.first)).id
        b = analysis.color_of_dim(*_split(explanation.second)).id
        return f"{explanation.first} (color {a}) and {explanation.second} (color {b}) have different colors"
    color = analysis.color_of_dim(*_split(explanation.first)).id
    lines = [f"{explanation.first} and {explanation.second} share color {color}: "
             f"{len(explanation.steps)} step(s)"]
    for number, step in enumerate(explanation.steps, 1):
        where = f" at {step.op_loc}" if step.op_loc else ""
        if step.kind == "I":
            why = f"identified by {step.op}{where}, rule {step.rule}"
        else:
            why = f"definition flows to its use (M) by {step.op}{where}"
        lines.append(f"  {number}. {describe_name(analysis, step.source)} -> "
                     f"{describe_name(analysis, step.target)}: {why}")
    return "\n".join(lines)


def _split(label: str) -> tuple[str, int]:
    value, _, dim = label.rpartition(":")
    return value, int(dim)
