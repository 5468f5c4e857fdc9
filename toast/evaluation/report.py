"""``--report report.html``: one self-contained HTML page (a Jinja2 template, ``templates/report.html.j2``) of
what a search found, for ``autoshard``, ``compare`` and ``sweep``.

Per program (a *section*): every argument's sharding, the colors each mesh axis took, the collectives with
their estimated seconds, the memory timeline of one device (an inline SVG plot: bytes live before, during and
after each kernel), the search's best cost after each round (inline SVG), and the strategies side by side
(toast's gain over the best expert strategy and over FSDP over all devices under them). A
sweep's page starts with its summary table. Sections are plain JSON (``report_section``), so a sweep keeps
them in its job records and draws its page from those; nothing is loaded from elsewhere (no scripts, no
fonts, no images).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np

from toast.analysis.naming import describe_name
from toast.evaluation.compare import CompareResult, gains_line
from toast.output.report import human_bytes, human_seconds
from toast.resources import template

MAX_POINTS = 400  # a timeline longer than this is drawn by the maximum of equal buckets (the peak stays)
MAX_COLLECTIVES = 200  # rows of the collectives table; the rest are counted


def report_section(result: CompareResult) -> dict[str, Any]:
    """The page's section of one comparison, as JSON."""
    found = result.found
    model, costs, search = found.model, found.costs, found.result
    analysis = model.analysis
    program = analysis.program
    axis_colors: dict[str, list[dict[str, Any]]] = {axis: [] for axis, _ in model.mesh.axes}
    for action in search.actions:
        stored = set(action.stored)
        for color in action.colors:
            names = model.names_of_color(color)
            if stored:  # only the parameters' names (and their update chains) of the color
                names = names[np.isin(analysis.node_of[names], np.fromiter(stored, dtype=np.int64))]
                if not len(names):
                    continue
            axis_colors[action.axis].append({"color": color, "names": int(len(names)), "stored": bool(stored),
                                             "example": describe_name(analysis, int(names[0]))})
    collectives = [{"kind": c.kind, "axes": "+".join(c.axes), "value": program.values[c.value].name,
                    "op": program.ops[c.op].kind, "bytes_in": c.bytes_in, "bytes_out": c.bytes_out,
                    "seconds": costs.collective_time(c)} for c in search.cost.collectives]
    timeline = costs.memory_timeline(search.state)
    step = max(1, -(-len(timeline) // MAX_POINTS))
    drawn = np.maximum.reduceat(timeline, np.arange(0, len(timeline), step)) if len(timeline) else timeline
    return {
        "program": program.name,
        "source": result.document["source"],
        "mesh": model.mesh.spec(),
        "hardware": result.document["hardware"],
        "device_memory_bytes": found.device_memory,
        "arguments": result.document["arguments"],
        "axis_colors": axis_colors,
        "collectives": collectives,
        "timeline": {"positions_per_point": step, "bytes": [int(b) for b in drawn]},
        "rounds": [{"phase": r.phase, "best_relative": r.best_relative, "best_step_time_s": r.best_step_time_s,
                    "rollouts": r.rollouts} for r in search.rounds],
        "strategies": [{"strategy": row.name, "applies": row.cost is not None, "reason": row.reason,
                        "step_time_s": row.cost.step_time_s if row.cost else None,
                        "peak_bytes": row.cost.peak_bytes if row.cost else None,
                        "over_memory": row.over_memory, "relative": row.cost.relative if row.cost else None,
                        "search_seconds": row.search_seconds} for row in result.rows],
        "gains": gains_line(result.rows),
    }


def report_html(sections: Sequence[dict[str, Any]], *, title: str,
                summary: Sequence[dict[str, Any]] | None = None) -> str:
    """The page: ``summary`` (a sweep's rows, ``toast.evaluation.sweep.summary_row``) then the sections."""
    pages = []
    for section in sections:
        timeline = section["timeline"]
        per_point = timeline["positions_per_point"]
        memory_plot = line_svg([(k * per_point, b) for k, b in enumerate(timeline["bytes"])],
                               x_label="position (kernels in program order)", y_label="live bytes per device",
                               y_text=human_bytes, limit=section["device_memory_bytes"], limit_label="memory limit")
        rounds = section["rounds"]
        rounds_plot = line_svg([(k + 1, r["best_step_time_s"]) for k, r in enumerate(rounds)], x_label="round",
                               y_label="best step time", y_text=human_seconds, markers=True)
        pages.append({**section, "memory_plot": memory_plot, "rounds_plot": rounds_plot,
                      "shown_collectives": section["collectives"][:MAX_COLLECTIVES],
                      "more_collectives": max(0, len(section["collectives"]) - MAX_COLLECTIVES)})
    return template("report.html.j2", autoescape=True, trim_blocks=True, lstrip_blocks=True).render(
        title=title, sections=pages, summary=list(summary or []), human_bytes=human_bytes,
        human_seconds=human_seconds)


def line_svg(points: Sequence[tuple[float, float]], *, x_label: str, y_label: str, y_text, width: int = 720,
             height: int = 260, limit: float | None = None, limit_label: str = "", markers: bool = False) -> str:
    """An inline SVG line plot of ``points`` (x ascending), the y axis from 0 labelled with ``y_text``; a
    dashed line at ``limit`` when it is within twice the data's range."""
    left, right, top, bottom = 90, 20, 20, 45
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [float(x) for x, _ in points] or [0.0]
    ys = [float(y) for _, y in points] or [0.0]
    x_min, x_max = min(xs), max(xs)
    y_max = max(max(ys), 1e-30)
    show_limit = limit is not None and 0 < limit <= 2 * y_max
    if show_limit and limit is not None:
        y_max = max(y_max, limit)
    y_max *= 1.05

    def x_at(x: float) -> float:
        return left + (plot_w * (x - x_min) / (x_max - x_min) if x_max > x_min else plot_w / 2)

    def y_at(y: float) -> float:
        return top + plot_h * (1 - y / y_max)

    label = html.escape(f"{y_label} by {x_label}")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{label}">',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#888"/>']
    for fraction in (0.0, 0.5, 1.0):
        value = fraction * y_max / 1.05
        y = y_at(value)
        parts.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#888"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
                     f'{html.escape(y_text(value))}</text>')
    for x in sorted({x_min, x_max}):
        parts.append(f'<text x="{x_at(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle" font-size="11">'
                     f'{x:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="12">'
                 f'{html.escape(x_label)}</text>')
    parts.append(f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" font-size="12" '
                 f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{html.escape(y_label)}</text>')
    if show_limit and limit is not None:
        parts.append(f'<line x1="{left}" y1="{y_at(limit):.1f}" x2="{left + plot_w}" y2="{y_at(limit):.1f}" '
                     f'stroke="#c33" stroke-dasharray="6 4"/><text x="{left + plot_w - 4}" y="{y_at(limit) - 4:.1f}" '
                     f'text-anchor="end" font-size="11" fill="#c33">{html.escape(limit_label)}</text>')
    coordinates = " ".join(f"{x_at(x):.1f},{y_at(y):.1f}" for x, y in zip(xs, ys, strict=True))
    parts.append(f'<polyline fill="none" stroke="#2463b0" stroke-width="1.5" points="{coordinates}"/>')
    if markers:
        parts += [f'<circle cx="{x_at(x):.1f}" cy="{y_at(y):.1f}" r="3" fill="#2463b0"/>'
                  for x, y in zip(xs, ys, strict=True)]
    parts.append("</svg>")
    return "".join(parts)
