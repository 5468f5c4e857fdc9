"""Reports of an ``Analysis``: the JSON contract and the short human summary.

JSON (scripts rely on it): top-level ``colors``, ``unruled_ops``, ``unpriced_ops``, ``color_conflicts``,
``conflicts``, ``compatibility_sets``, ``resolution_groups``, ``pins``, ``stats``.

- color: ``{"id", "size", "dims": [dim, ...]}``; ``size`` counts all its dimension names
  (definitions and uses), ``dims`` lists definition dims ``{"value", "dim", "size", "loc"}``.
- unruled op (no identity rule), unpriced op (no kernel class): ``{"op", "kind", "loc"}``.
- color conflict (section 3.3): ``{"color", "on": site}``; a site is ``{"value", "dims"}`` for a
  definition or ``{"value", "dims", "use": {"op", "kind", "operand"}}`` for a use.
- conflict (section 3.4): ``{"id", "color", "endpoints": [dim, dim], "on": [site, ...],
  "compatibility_set"}``. An endpoint is a dimension-graph node named by one of its dims, like
  the dims of a color; a node without a definition dim is named by a use dim, which then has
  a ``"use"`` key. A site's ``dims`` are the dims of endpoint 0 and endpoint 1 there.
- compatibility set (section 3.5): ``{"id", "conflicts", "resolution_group", "resolutions":
  [{"resolution": 0|1, "shard": [{"conflict", "endpoint", "dim"}, ...]}, ...]}``: what each of
  the two resolutions shards, per conflict.
- resolution group (section 3.6): ``{"id", "sets"}``; group ``id`` is bit ``id`` of an action's
  ``resolution_order``, and bit value r picks resolution r of every set in the group.
- pin (``Analysis.pins``, in program order): a sharding the program asks for on a value
  (``with_sharding_constraint``, ``sdy.reshard``, GSPMD ``@Sharding``): ``{"value", "kind",
  "loc", "axes", "open", "tiles", "sharding"}``; ``axes`` is per dim the list of mesh axes
  (major to minor) or ``null`` for a GSPMD sharding, ``open`` per dim whether more axes may be
  added, ``tiles`` per dim the GSPMD shard counts or ``null``, ``sharding`` the text as written.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from toast.analysis.conflicts import ConflictSite
from toast.analysis.named_dimensions import Analysis
from toast.resources import template


def to_json(analysis: Analysis) -> dict[str, Any]:
    """The JSON document of ``analysis`` (plain dicts and lists, deterministic order)."""
    return {
        "colors": [
            {
                "id": color.id,
                "size": color.size,
                "dims": [{"value": d.value, "dim": d.dim, "size": d.size, "loc": d.loc} for d in color.dims],
            }
            for color in analysis.colors
        ],
        "unruled_ops": [{"op": u.op, "kind": u.kind, "loc": u.loc} for u in analysis.unruled_ops],
        "unpriced_ops": [{"op": u.op, "kind": u.kind, "loc": u.loc} for u in analysis.unpriced_ops],
        **conflicts_json(analysis),
        "pins": [
            {"value": pin.value, "kind": pin.kind, "loc": pin.loc,
             "axes": None if pin.axes is None else [list(axes) for axes in pin.axes],
             "open": list(pin.open), "tiles": None if pin.tiles is None else list(pin.tiles),
             "sharding": pin.sharding}
            for pin in analysis.pins
        ],
        "stats": analysis.stats,
    }


def conflicts_json(analysis: Analysis) -> dict[str, Any]:
    """The ``color_conflicts``, ``conflicts``, ``compatibility_sets`` and ``resolution_groups``."""
    found = analysis.conflicts
    conflicts: list[dict[str, Any]] = [
        {
            "id": conflict.id,
            "color": conflict.color,
            "endpoints": [name_json(analysis, node) for node in conflict.nodes],
            "on": [site_json(analysis, site) for site in conflict.sites],
            "compatibility_set": found.set_of[conflict.id],
        }
        for conflict in found.conflicts
    ]
    sets = []
    for group_set in found.sets:
        resolutions = []
        for resolution in (0, 1):
            shard = [
                {"conflict": conflict_id, "endpoint": endpoint, "dim": conflicts[conflict_id]["endpoints"][endpoint]}
                for conflict_id, endpoint in zip(group_set.conflicts, group_set.sharded_endpoints(resolution),
                                                 strict=True)
            ]
            resolutions.append({"resolution": resolution, "shard": shard})
        sets.append({"id": group_set.id, "conflicts": list(group_set.conflicts),
                     "resolution_group": found.group_of[group_set.id], "resolutions": resolutions})
    return {
        "color_conflicts": [{"color": c.color, "on": site_json(analysis, c.site)} for c in found.color_conflicts],
        "conflicts": conflicts,
        "compatibility_sets": sets,
        "resolution_groups": [{"id": group.id, "sets": list(group.sets)} for group in found.groups],
    }


def name_json(analysis: Analysis, name: int) -> dict[str, Any]:
    """A dimension name as the JSON names dims: ``{"value", "dim", "size", "loc"}``, plus
    ``"use": {"op", "kind", "operand"}`` when it is the name of a use."""
    program = analysis.program
    if name < len(analysis.names.defs):
        value_id, dim = analysis.names.defs[name]
        value = program.values[value_id]
        return {"value": value.name, "dim": dim, "size": value.shape[dim], "loc": value.loc}
    op_id, operand, dim = analysis.names.uses[name - len(analysis.names.defs)]
    op = program.ops[op_id]
    value = program.values[op.operands[operand]]
    return {"value": value.name, "dim": dim, "size": value.shape[dim], "loc": op.loc,
            "use": {"op": program.op_label(op_id), "kind": op.kind, "operand": operand}}


def site_json(analysis: Analysis, site: ConflictSite) -> dict[str, Any]:
    """A definition ``{"value", "dims"}`` or a use ``{"value", "dims", "use": {...}}``."""
    document: dict[str, Any] = {"value": analysis.program.values[site.value].name, "dims": list(site.dims)}
    if site.kind == "use":
        op = analysis.program.ops[site.op]
        document["use"] = {"op": analysis.program.op_label(site.op), "kind": op.kind, "operand": site.operand}
    return document


# The counts ``variant_table`` sets side by side: (``Analysis.stats`` key, row label).
VARIANT_ROWS = (("colors", "colors"), ("resolution_bits", "resolution bits"), ("conflicts", "conflicts"),
                ("color_conflicts", "color conflicts"), ("compatibility_sets", "compatibility sets"),
                ("boxes", "boxes"), ("identities", "identities"), ("m_edges", "major-factor edges"),
                ("unruled_ops", "unruled ops"), ("unpriced_ops", "unpriced ops"),
                ("dimension_names", "dimension names"))


def variant_table(analyses: Sequence[Analysis]) -> str:
    """One program's analyses under several variants, side by side (``toast analyze --variant A --variant B``):
    a Markdown table, a row per count (``VARIANT_ROWS``) and the engines' seconds, a column per variant."""
    program = analyses[0].program
    header = [markdown_cell(str(a.stats.get("variant", "default"))) for a in analyses]
    lines = [f"{program.name}: {len(program.ops)} ops, {analyses[0].stats['dimension_names']} dimension names, "
             f"engine {analyses[0].stats.get('engine', '?')}",
             "| | " + " | ".join(header) + " |", "|---|" + "---|" * len(analyses)]
    for key, label in VARIANT_ROWS:
        cells = [str(a.stats.get(key, "-")) for a in analyses]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    seconds = [sum(a.stats.get("seconds", {}).values()) for a in analyses]
    lines.append("| seconds | " + " | ".join(f"{value:.2f}" for value in seconds) + " |")
    return "\n".join(lines) + "\n"


def summary(analysis: Analysis, *, top: int = 10) -> str:
    """A short human summary: counts, the ``top`` largest colors, unruled ops, timings."""
    largest = []
    for color in analysis.colors[:top]:
        shown = ", ".join(f"{d.value}[{d.dim}]" for d in color.dims[:3])
        more = f", ... ({len(color.dims)} definition dims)" if len(color.dims) > 3 else ""
        sizes = sorted({d.size for d in color.dims})
        largest.append({"id": color.id, "size": color.size, "dim_sizes": sizes, "examples": shown + more})
    program = analysis.program
    arguments = [(program.values[v].name, list(program.values[v].shape), program.values[v].dtype)
                 for v in program.arguments]
    text = template("summary.txt.j2", trim_blocks=True, lstrip_blocks=True).render(
        program=program, stats=analysis.stats, largest=largest, unruled=analysis.unruled_ops,
        unpriced=analysis.unpriced_ops,
        variant=analysis.stats.get("variant", ""), arguments=arguments, shown_arguments=ARGUMENTS_SHOWN,
    )
    return text.rstrip("\n") + "\n"


ARGUMENTS_SHOWN = 12  # in the summary; `toast roles` lists them all


def argument_table(analysis: Analysis) -> str:
    """Every argument of the program, one per line: its name as roles files and pins spell it, its shape
    and element type."""
    program = analysis.program
    rows = [(program.values[v].name, "[" + ", ".join(map(str, program.values[v].shape)) + "]", program.values[v].dtype)
            for v in program.arguments]
    width = max((len(name) for name, _, _ in rows), default=0)
    lines = [f"arguments of {program.name} ({len(rows)}):"]
    lines += [f"  {name.ljust(width)}  {shape} {dtype}" for name, shape, dtype in rows]
    return "\n".join(lines) + "\n"


def markdown_cell(text: object) -> str:
    """``text`` as one Markdown table cell: ``|`` escaped, HTML's ``&``, ``<``, ``>`` as entities (a
    renderer shows them as written, and runs no markup from a model name or an error), newlines as spaces."""
    return html.escape(" ".join(str(text).splitlines()), quote=False).replace("|", "\\|")


def human_bytes(count: float) -> str:
    """Bytes in the unit that fits: ``512 B``, ``30.0 KiB``, ``1.31 MiB``, ``2.00 GiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.3g} {unit}" if count / size < 100 else f"{count / size:.0f} {unit}"
    return f"{count:.0f} B"


def human_seconds(seconds: float) -> str:
    """Seconds in the unit that fits: ``3.2 µs``, ``41.7 ms``, ``1.25 s``."""
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns" if seconds else "0 s"
