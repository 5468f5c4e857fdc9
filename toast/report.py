"""Reports of an ``Analysis``: the JSON contract and the short human summary.

JSON (scripts rely on it): top-level ``colors``, ``unruled_ops``, ``stats``. Each color is
``{"id", "size", "dims": [{"value", "dim", "size", "loc"}, ...]}`` where ``size`` counts all
its dimension names (definitions and uses) and ``dims`` lists definition dims. Each unruled
op is ``{"op", "kind", "loc"}``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jinja2

from toast.analysis import Analysis
from toast.errors import ToastError
from toast.variants import TEMPLATES_DIR


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
        "stats": analysis.stats,
    }


def write_json_atomic(document: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``document`` to ``path`` through a temporary file and a rename (no partial file)."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ToastError(f"--json {path}: directory {directory} does not exist")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(document, out, indent=1)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def summary(analysis: Analysis, *, top: int = 10) -> str:
    """A short human summary: counts, the ``top`` largest colors, unruled ops, timings."""
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), trim_blocks=True,
                                     lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    largest = []
    for color in analysis.colors[:top]:
        shown = ", ".join(f"{d.value}[{d.dim}]" for d in color.dims[:3])
        more = f", ... ({len(color.dims)} definition dims)" if len(color.dims) > 3 else ""
        sizes = sorted({d.size for d in color.dims})
        largest.append({"id": color.id, "size": color.size, "dim_sizes": sizes, "examples": shown + more})
    text = environment.get_template("summary.txt.j2").render(
        program=analysis.program, stats=analysis.stats, largest=largest, unruled=analysis.unruled_ops,
    )
    return text.rstrip("\n") + "\n"
