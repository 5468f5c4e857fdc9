"""The dimension-graph component of one color, in Graphviz DOT (like Figure 5d of the paper).

``dimension_graph_dot`` renders ``templates/dimension_graph.dot.j2``: nodes are the classes of
dimension names under I alone, black arrows the M edges (definition to use), red lines the
conflicts. ``render_svg`` runs Graphviz's ``dot`` when it is installed.
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
    suffix = Path(output).suffix.lower() if output else ""
    from_suffix = GRAPH_SUFFIXES.get(suffix)
    if output and from_suffix is None:
        raise ToastError(f"-o {output}: toast writes .dot, .gv or .svg graphs, not '{suffix or 'no suffix'}' "
                         "(render other formats with Graphviz: dot -Tpng)")
    if given and from_suffix and given != from_suffix:
        raise ToastError(f"-o {output}: a {from_suffix} file name, but --format {given}")
    return given or from_suffix or "dot"


def dimension_graph_dot(analysis: Analysis, color: int) -> str:
    """DOT text of the dimension graph of ``color``: its nodes, M edges and conflict edges (if any)."""
    check_color(analysis, color)
    names = np.flatnonzero(analysis.color_of == color)
    node_of = analysis.node_of
    nodes = sorted({int(n) for n in node_of[names]})
    sizes = dict(zip(*np.unique(node_of[names], return_counts=True), strict=True))
    conflicts = [c for c in analysis.conflicts.conflicts if c.color == color]
    endpoints = {n for c in conflicts for n in c.nodes}
    m_edges = sorted({
        (int(node_of[d]), int(node_of[u])) for d, u in analysis.m_edges
        if analysis.color_of[d] == color and node_of[d] != node_of[u]
    })
    return template("dimension_graph.dot.j2", trim_blocks=True, lstrip_blocks=True).render(
        color=color,
        program=_quote(analysis.program.name),
        nodes=[{"id": n, "label": _quote(f"{describe_name(analysis, n)}\n({_count(sizes[n])})"),
                "in_conflict": n in endpoints} for n in nodes],
        m_edges=m_edges,
        conflict_edges=[{"id": c.id, "a": c.nodes[0], "b": c.nodes[1], "set": analysis.conflicts.set_of[c.id]}
                        for c in conflicts],
    )


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


def _count(names: int) -> str:
    return "1 name" if names == 1 else f"{names} names"
