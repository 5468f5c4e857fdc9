"""``toast graph`` of a big component draws a summary (Graphviz takes minutes on the full graph),
and the analysis JSON lists the program's pins."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import analysis_of
from jax.sharding import AbstractMesh, AxisType, PartitionSpec

from toast import analyze
from toast.cli import main
from toast.output.dimension_graph import MAX_NODES, dimension_graph_dot
from toast.output.report import to_json
from toast.output.strategy_file import schema_problem

GPT = "toast.examples.gpt:gpt_small"
CONFLICT = re.compile(r"^\s*(\w+) -> (\w+) \[dir=none, color=red.*label=\"c(\d+)/s\d+\"", re.M)


def _biggest_color_with_conflicts(analysis) -> tuple[int, int]:
    """``(color, nodes)`` of the color with conflicts that has the most dimension-graph nodes."""
    colors = {c.color for c in analysis.conflicts.conflicts}
    sizes = {c: len(np.unique(analysis.node_of[analysis.color_of == c])) for c in colors}
    color = max(sizes, key=lambda c: sizes[c])
    return color, sizes[color]


def test_a_big_component_is_summarized_and_keeps_every_conflict():
    analysis = analysis_of(GPT)
    color, nodes = _biggest_color_with_conflicts(analysis)
    conflicts = [c.id for c in analysis.conflicts.conflicts if c.color == color]
    assert nodes > 50 and conflicts
    text = dimension_graph_dot(analysis, color, max_nodes=50)
    assert "// SUMMARY:" in text and "--full" in text
    assert f'label="summary of color {color}: {nodes} dimension-graph nodes' in text
    boxes = re.findall(r"^\s*(g\d+) \[label=", text, re.M)
    assert 0 < len(boxes) <= 50 and len(boxes) < nodes
    assert not re.search(r"^\s*n\d+ \[", text, re.M)  # no node of the full graph
    drawn = CONFLICT.findall(text)
    assert sorted(int(c) for _, _, c in drawn) == conflicts  # every conflict, once
    assert all(a in boxes and b in boxes for a, b, _ in drawn)
    # Deterministic, and grouping is by value when the values fit.
    assert dimension_graph_dot(analysis, color, max_nodes=50) == text
    values = len({analysis.names.defs[n][0] if n < len(analysis.names.defs) else -1 - n
                  for n in np.unique(analysis.node_of[analysis.color_of == color])})
    by_value = dimension_graph_dot(analysis, color, max_nodes=nodes - 1)
    assert "drawn as" in by_value and " values (" in by_value
    assert len(re.findall(r"^\s*g\d+ \[label=", by_value, re.M)) <= values
    assert sorted(int(c) for _, _, c in CONFLICT.findall(by_value)) == conflicts


def test_below_the_threshold_and_with_full_the_graph_is_drawn_in_full():
    analysis = analysis_of(GPT)
    color, nodes = _biggest_color_with_conflicts(analysis)
    for text in (dimension_graph_dot(analysis, color, max_nodes=nodes),
                 dimension_graph_dot(analysis, color, max_nodes=10, full=True)):
        assert "SUMMARY" not in text and "summary of color" not in text
        assert len(re.findall(r"^\s*n\d+ \[label=", text, re.M)) == nodes
        assert len(CONFLICT.findall(text)) == sum(c.color == color for c in analysis.conflicts.conflicts)
    assert MAX_NODES >= 100


def test_cli_full_flag(tmp_path, capsys):
    out = tmp_path / "g.dot"
    assert main(["graph", "toast.examples.mlp:mlp", "--engine", "embedded", "--color", "0", "--full",
                 "-o", str(out)]) == 0
    assert "digraph" in out.read_text() and "SUMMARY" not in out.read_text()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz (dot) is not installed")
def test_the_summary_renders_quickly():
    analysis = analysis_of(GPT)
    color, _ = _biggest_color_with_conflicts(analysis)
    text = dimension_graph_dot(analysis, color, max_nodes=50)
    done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "</svg>" in done.stdout


def _constrained_mlp_text() -> str:
    mesh = AbstractMesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    args = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 32), jnp.float32))

    def layer(x, w):
        return jax.lax.with_sharding_constraint(jnp.maximum(x @ w, 0), PartitionSpec("batch", None))

    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(layer).lower(*args).as_text(debug_info=True)


def test_the_analysis_json_lists_pins_and_validates(tmp_path, capsys):
    source = tmp_path / "constrained.mlir"
    source.write_text(_constrained_mlp_text())
    out = tmp_path / "a.json"
    assert main(["analyze", str(source), "--engine", "embedded", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert schema_problem(document, "analysis") == ""
    (pin,) = document["pins"]
    assert set(pin) == {"value", "kind", "loc", "axes", "open", "tiles", "sharding"}
    assert pin["kind"] == "sdy.sharding_constraint"
    assert pin["axes"] == [["batch"], []] and pin["open"] == [False, False] and pin["tiles"] is None
    assert pin["sharding"] == '<@mesh, [{"batch"}, {}]>'
    assert pin["loc"].startswith(__file__)
    # A program without constraints has an empty list, still valid.
    plain = to_json(analyze("toast.examples.mlp:mlp", engine="embedded"))
    assert plain["pins"] == [] and schema_problem(plain, "analysis") == ""
    assert schema_problem({**document, "pins": [{**pin, "axes": "batch"}]}, "analysis") != ""
