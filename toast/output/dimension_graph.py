"""The dimension-graph component of one color, in Graphviz DOT (like Figure 5d of the paper).

``dimension_graph_dot`` renders ``templates/dimension_graph.dot.j2``: nodes are the classes of
dimension names under I alone, black arrows the M edges (definition to use), red lines the
conflicts. ``render_svg`` runs Graphviz's ``dot`` when it is installed.

Graphviz's layout is far from linear: the main color of a 2-layer GPT-2 step (715 nodes, 960
edges) does not render in 5 minutes. A component of more than ``max_nodes`` nodes (default
``MAX_NODES``) is drawn as a *summary* unless ``full=True`` (``toast graph --full``): one box
per value (the dimension-graph nodes whose smallest name is a dim of that value's definition or
of a use of it), or, when that is still more than ``max_nodes`` boxes, one box per line of the
user's Python (values without a source line stay boxes of their own). An arrow joins two boxes
where M edges join their nodes, labeled with how many; every conflict is kept as a red line
between the boxes holding its endpoints (a loop when both are in one box). The DOT text says in
a comment and in the graph's label that it is a summary, of how many nodes, and how to get the
full graph. Grouping is one pass over the color's names and M edges.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from toast.analysis.named_dimensions import Analysis
from toast.analysis.naming import describe_name
from toast.errors import ToastError
from toast.resources import template

MAX_NODES = 200
"""The most dimension-graph nodes drawn in full: a GPT-2-size component of 715 nodes takes Graphviz
over 5 minutes, one of 200 a few seconds; bigger ones are summarized (see the module docstring)."""

GRAPHVIZ_HINT = "install Graphviz (e.g. `apt install graphviz`) so that `dot` is on PATH, or use --format dot"


def check_color(analysis: Analysis, color: int) -> None:
    """Raise a one-line ``ToastError`` unless ``color`` exists."""
    if not 0 <= color < len(analysis.colors):
        raise ToastError(f"--color {color}: no such color (this program has colors 0..{len(analysis.colors) - 1})")


GRAPH_SUFFIXES = {".dot": "dot", ".gv": "dot", ".svg": "svg"}


def graph_format(output: str | None, given: str | None) -> str:
    """``dot`` or ``svg``: ``given`` (``--format``), else from the suffix of ``output``, else ``dot``.

    Raises:
      ToastError: the suffix is not one Graphviz output toast writes, or contradicts ``given``.
    """
    if given is not None and given not in ("dot", "svg"):
        raise ToastError(f"--format {given}: toast writes dot or svg (render other formats with Graphviz: dot -Tpng)")
    suffix = Path(output).suffix.lower() if output else ""
    from_suffix = GRAPH_SUFFIXES.get(suffix)
    if output and from_suffix is None:
        raise ToastError(f"-o {output}: toast writes .dot, .gv or .svg graphs, not '{suffix or 'no suffix'}' "
                         "(render other formats with Graphviz: dot -Tpng)")
    if given and from_suffix and given != from_suffix:
        raise ToastError(f"-o {output}: a {from_suffix} file name, but --format {given}")
    return given or from_suffix or "dot"


def dimension_graph_dot(analysis: Analysis, color: int, *, max_nodes: int = MAX_NODES, full: bool = False) -> str:
    """DOT text of the dimension graph of ``color``: its nodes, M edges and conflict edges (if any).

    A component of more than ``max_nodes`` nodes is drawn as a summary (see the module
    docstring) unless ``full``.
    """
    check_color(analysis, color)
    names = np.flatnonzero(analysis.color_of == color)
    node_of = analysis.node_of
    node_ids, counts = np.unique(node_of[names], return_counts=True)
    sizes = {int(n): int(c) for n, c in zip(node_ids, counts, strict=True)}
    nodes = sorted(sizes)
    conflicts = [c for c in analysis.conflicts.conflicts if c.color == color]
    endpoints = {n for c in conflicts for n in c.nodes}
    edges = np.asarray(analysis.m_edges, dtype=np.int64).reshape(-1, 2)
    edges = edges[analysis.color_of[edges[:, 0]] == color]
    node_edges = np.stack([node_of[edges[:, 0]], node_of[edges[:, 1]]], axis=1) if len(edges) else edges
    node_edges = node_edges[node_edges[:, 0] != node_edges[:, 1]]
    set_of = analysis.conflicts.set_of
    if full or len(nodes) <= max_nodes:
        m_edges = sorted({(int(a), int(b)) for a, b in node_edges})
        return _render(
            color=color, program=analysis.program.name, summary=None,
            nodes=[{"id": f"n{n}", "label": f"{describe_name(analysis, n)}\n({_count(sizes[n], 'name')})",
                    "in_conflict": n in endpoints} for n in nodes],
            m_edges=[{"a": f"n{a}", "b": f"n{b}", "label": ""} for a, b in m_edges],
            conflict_edges=[{"id": c.id, "a": f"n{c.nodes[0]}", "b": f"n{c.nodes[1]}", "set": set_of[c.id]}
                            for c in conflicts],
        )
    return _summary(analysis, color, nodes, sizes, node_edges, conflicts, endpoints, max_nodes)


def _summary(analysis: Analysis, color: int, nodes: list[int], sizes: dict[int, int], node_edges: np.ndarray,
             conflicts: list, endpoints: set[int], max_nodes: int) -> str:
    """The summary of a big component: one box per value, or per source line when there are
    more than ``max_nodes`` values (see the module docstring)."""
    program = analysis.program
    value_of = {n: _value_of(analysis, n) for n in nodes}
    by = "value"
    group_of: dict[int, str | int] = dict(value_of)
    if len(set(value_of.values())) > max_nodes:
        by = "source line"
        group_of = {n: program.values[v].loc or v for n, v in value_of.items()}
    index: dict[str | int, int] = {}
    members: list[list[int]] = []
    for n in nodes:  # boxes in the order of their smallest node: deterministic
        key = group_of[n]
        if key not in index:
            index[key] = len(members)
            members.append([])
        members[index[key]].append(n)
    box = {n: index[group_of[n]] for n in nodes}
    arrows: dict[tuple[int, int], int] = {}
    for a, b in node_edges:
        pair = (box[int(a)], box[int(b)])
        if pair[0] != pair[1]:
            arrows[pair] = arrows.get(pair, 0) + 1
    boxes = []
    for i, group in enumerate(members):
        values = sorted({value_of[n] for n in group})
        first = program.values[values[0]]
        if by == "value" or not first.loc:
            producer = program.producer[first.id]
            title = first.name + (f" = {program.ops[producer].kind}" if producer >= 0 else " (argument)")
        else:
            title = f"{Path(first.loc.rsplit(':', 1)[0]).name}:{first.loc.rsplit(':', 1)[-1]}"
            title += f"\n{_count(len(values), 'value')}: {', '.join(program.values[v].name for v in values[:3])}"
            title += ", ..." if len(values) > 3 else ""
        names = sum(sizes[n] for n in group)
        boxes.append({"id": f"g{i}", "label": f"{title}\n({_count(len(group), 'node')}, {_count(names, 'name')})",
                      "in_conflict": any(n in endpoints for n in group)})
    set_of = analysis.conflicts.set_of
    unit = "values" if by == "value" else "source lines"
    summary = {
        "nodes": len(nodes), "groups": len(members), "by": by, "unit": unit, "max_nodes": max_nodes,
        "label": (f"summary of color {color}: {len(nodes)} dimension-graph nodes drawn as {len(members)} {unit} "
                  f"(more than {max_nodes} nodes); toast graph --full draws every node"),
    }
    return _render(
        color=color, program=program.name, summary=summary, nodes=boxes,
        m_edges=[{"a": f"g{a}", "b": f"g{b}", "label": f"{count}" if count > 1 else ""}
                 for (a, b), count in sorted(arrows.items())],
        conflict_edges=[{"id": c.id, "a": f"g{box[c.nodes[0]]}", "b": f"g{box[c.nodes[1]]}", "set": set_of[c.id]}
                        for c in conflicts],
    )


def _value_of(analysis: Analysis, node: int) -> int:
    """The value a dimension-graph node belongs to: the value of its smallest name's definition,
    or the value a use names (a node of use dims only)."""
    defs = analysis.names.defs
    if node < len(defs):
        return defs[node][0]
    op_id, operand, _ = analysis.names.uses[node - len(defs)]
    return analysis.program.ops[op_id].operands[operand]


def _render(*, color: int, program: str, summary: dict | None, nodes: list[dict], m_edges: list[dict],
            conflict_edges: list[dict]) -> str:
    for node in nodes:
        node["label"] = _quote(node["label"])
    return template("dimension_graph.dot.j2", trim_blocks=True, lstrip_blocks=True).render(
        color=color, program=_quote(program), summary=summary, nodes=nodes, m_edges=m_edges,
        conflict_edges=conflict_edges)


def require_graphviz() -> str:
    """Path of Graphviz's ``dot``; a one-line ``ToastError`` when it is not on PATH."""
    dot = shutil.which("dot")
    if dot is None:
        raise ToastError(f"--format svg: Graphviz is not installed; {GRAPHVIZ_HINT}")
    return dot


def render_svg(dot_text: str, *, timeout_s: float = 120.0) -> str:
    """SVG of ``dot_text`` by Graphviz ``dot -Tsvg``."""
    dot = require_graphviz()
    try:
        done = subprocess.run([dot, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToastError(f"Graphviz dot timed out after {timeout_s:g} s; use --format dot") from None
    if done.returncode != 0:
        first = done.stderr.strip().splitlines()[0] if done.stderr.strip() else f"exit {done.returncode}"
        raise ToastError(f"Graphviz dot failed: {first}")
    return done.stdout


def _quote(text: str) -> str:
    """Text for a double-quoted DOT string: backslashes and quotes escaped, newlines as \\n."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _count(count: int, noun: str) -> str:
    return f"1 {noun}" if count == 1 else f"{count} {noun}s"
