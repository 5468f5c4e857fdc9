"""The command line: JSON contract, explain, and one clear line for each kind of bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toast.cli import main

MLP = "toast.examples.mlp:mlp"


def _run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_analyze_writes_the_json_contract(tmp_path, capsys):
    out = tmp_path / "mlp.json"
    code, stdout, _ = _run(["analyze", MLP, "--engine", "embedded", "--json", str(out)], capsys)
    assert code == 0
    assert "4 colors" in stdout and "unruled ops: none" in stdout and "unpriced ops: none" in stdout
    document = json.loads(out.read_text())
    assert set(document) == {"colors", "unruled_ops", "unpriced_ops", "color_conflicts", "conflicts",
                             "compatibility_sets", "resolution_groups", "pins", "stats"}
    assert len(document["colors"]) == 4
    color = document["colors"][0]
    assert set(color) == {"id", "size", "dims"}
    assert set(color["dims"][0]) == {"value", "dim", "size", "loc"}
    x0 = [c for c in document["colors"] if {"value": "x", "dim": 0, "size": 256, "loc": ""} in c["dims"]]
    assert len(x0) == 1
    assert any(d["value"] == "result" and d["dim"] == 0 for d in x0[0]["dims"])
    # Sizes count definitions and uses: more names than listed definition dims.
    assert x0[0]["size"] > len(x0[0]["dims"])
    assert document["unruled_ops"] == [] and document["unpriced_ops"] == []


def test_explain_mlp_batch_chain(capsys):
    code, stdout, _ = _run(["explain", MLP, "x:0", "result:0", "--engine", "embedded"], capsys)
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0].startswith("x:0 and result:0 share color")
    steps = lines[1:]
    # x -> its use by the first dot (M), dot rule (I), ... , the last dot's result.
    assert steps[0].split(": ", 1)[1].startswith("definition flows to its use (M)")
    assert any("rules/ops/contraction.dl:" in s and "mlp.py:" in s for s in steps)
    assert any("rules/ops/elementwise.dl:" in s for s in steps)  # through relu's maximum
    assert steps[-1].split(" -> ")[1].startswith("result[0]")


def test_explain_different_colors(capsys):
    code, stdout, _ = _run(["explain", MLP, "x:0", "x:1", "--engine", "embedded"], capsys)
    assert code == 0
    assert "have different colors" in stdout


def _fails_with_one_line(argv, capsys, pattern):
    code, stdout, stderr = _run(argv, capsys)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("toast: error: ")
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in stderr
    return lines[0]


def test_malformed_mlir(tmp_path, capsys):
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
                   "  %0 = stablehlo.add %a, %b : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}\n")
    out = tmp_path / "out.json"
    _fails_with_one_line(["analyze", str(bad), "--json", str(out)], capsys, "bad.mlir:2:26:")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]  # no partial or temporary JSON left behind


def test_dynamic_shape(tmp_path, capsys):
    dyn = tmp_path / "dyn.mlir"
    dyn.write_text("func.func @main(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {\n  return %a : tensor<?x4xf32>\n}\n")
    _fails_with_one_line(["analyze", str(dyn)], capsys, "dynamic shape")


def test_syntax_error_in_user_rules(tmp_path, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "mine.dl").write_text("// my rules\n\nident(A, B, Op, __FILE__, __LINE__) :- op(Op, \"x\"\n")
    out = tmp_path / "out.json"
    _fails_with_one_line(["analyze", MLP, "--engine", "embedded", "--rules", str(rules), "--json", str(out)],
                                capsys, "mine.dl:3")
    assert not out.exists()


def test_missing_souffle(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    _fails_with_one_line(["analyze", MLP, "--engine", "souffle"], capsys, "souffle")


def test_unknown_module_and_bad_dim(capsys):
    _fails_with_one_line(["analyze", "no_such_module:f"], capsys, "cannot import module")
    _fails_with_one_line(["explain", MLP, "x", "x:1"], capsys, "VALUE:DIM")
    _fails_with_one_line(["explain", MLP, "nope:0", "x:1", "--engine", "embedded"], capsys, "no value named 'nope'")


def test_console_script_exits_nonzero_without_traceback(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("this is not mlir\n")
    done = subprocess.run([sys.executable, "-m", "toast.cli", "analyze", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("toast: error: ") and "bad.mlir:1:" in done.stderr


def _fake_souffle(directory: Path, body: str) -> None:
    script = directory / "souffle"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)


def test_souffle_failure_reports_its_stderr(tmp_path, monkeypatch, capsys):
    _fake_souffle(tmp_path, 'echo "Error: syntax error, unexpected ( in file x.dl at line 3" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    _fails_with_one_line(["analyze", MLP, "--engine", "souffle"], capsys,
                         "x.dl:3: syntax error, unexpected ( (souffle)")


def test_souffle_timeout(tmp_path, monkeypatch, capsys):
    _fake_souffle(tmp_path, "sleep 10")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    _fails_with_one_line(["analyze", MLP, "--engine", "souffle", "--timeout", "0.5"], capsys, "timed out after 0.5 s")


ATTENTION = "toast.examples.attention:attention"


def test_analyze_json_has_conflicts_sets_and_groups(tmp_path, capsys):
    out = tmp_path / "attention.json"
    code, stdout, _ = _run(["analyze", ATTENTION, "--engine", "embedded", "--json", str(out)], capsys)
    assert code == 0
    assert "5 conflict edges" in stdout and "1 independent resolution bit" in stdout
    document = json.loads(out.read_text())
    conflicts = document["conflicts"]
    assert len(conflicts) == 5
    first = conflicts[0]
    assert set(first) == {"id", "color", "endpoints", "on", "compatibility_set"}
    # The first conflict is a = k @ qt's two dims, named like the dims of a color.
    assert first["endpoints"] == [{"value": "%4", "dim": d, "size": 128, "loc": first["endpoints"][d]["loc"]}
                                  for d in (0, 1)]
    assert first["on"] == [{"value": "%4", "dims": [0, 1]}]
    # The reduce's use of a is a conflict whose second endpoint is named by a use dim.
    assert conflicts[1]["endpoints"][1]["use"] == {"op": "%5", "kind": "stablehlo.reduce", "operand": 0}
    (only,) = document["compatibility_sets"]
    assert only["conflicts"] == [0, 1, 2, 3, 4] and only["resolution_group"] == 0
    zero, one = only["resolutions"]
    assert [s["endpoint"] for s in zero["shard"]] == [1 - s["endpoint"] for s in one["shard"]]
    assert one["shard"][0]["dim"]["dim"] == 1  # resolution 1 shards a's last dim (Figure 5b)
    assert document["resolution_groups"] == [{"id": 0, "sets": [0]}]
    assert {"value": "%4", "dims": [0, 1]} in [c["on"] for c in document["color_conflicts"]]


def test_graph_writes_dot_with_conflict_edges(tmp_path, capsys):
    out = tmp_path / "s.dot"
    code, stdout, _ = _run(["graph", ATTENTION, "--color", "0", "--engine", "embedded", "-o", str(out)], capsys)
    assert code == 0 and stdout == ""
    text = out.read_text()
    assert text.count("color=red, style=bold") == 5  # the five conflict edges, drawn apart from M
    assert text.count(" -> ") - 5 == len({line for line in text.splitlines() if "->" in line and "red" not in line})
    assert 'label="%4[0]' in text and 'label="%4[1]' in text


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz (dot) is not installed")
def test_graph_svg_with_graphviz(tmp_path, capsys):
    out = tmp_path / "s.svg"
    code, _, _ = _run(["graph", ATTENTION, "--color", "0", "--engine", "embedded", "-o", str(out)], capsys)
    assert code == 0 and out.read_text().lstrip().startswith("<?xml") and "</svg>" in out.read_text()


def test_graph_bad_colors(capsys):
    _fails_with_one_line(["graph", ATTENTION, "--color", "9", "--engine", "embedded"], capsys,
                         "--color 9: no such color (this program has colors 0..3)")
    _fails_with_one_line(["graph", ATTENTION, "--color", "seq", "--engine", "embedded"], capsys,
                         "--color seq: a color is a number")


def test_graph_svg_without_graphviz(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` there
    out = tmp_path / "s.svg"
    _fails_with_one_line(["graph", ATTENTION, "--color", "0", "--engine", "embedded", "-o", str(out)], capsys,
                         "--format svg: Graphviz is not installed; install Graphviz")
    assert list(tmp_path.iterdir()) == []


def test_graph_of_a_color_without_conflicts(capsys):
    code, out, _ = _run(["graph", ATTENTION, "--color", "1", "--engine", "embedded"], capsys)
    assert code == 0 and "digraph \"color_1\"" in out and "color=red" not in out


@pytest.mark.parametrize(("name", "extra", "message"), [
    ("g.png", [], "toast writes .dot, .gv or .svg graphs, not '.png'"),
    ("g.dot", ["--format", "svg"], "a dot file name, but --format svg"),
])
def test_graph_refuses_an_output_it_would_not_write_faithfully(tmp_path, capsys, monkeypatch, name, extra, message):
    monkeypatch.setattr("toast.analysis.named_dimensions.analyze", lambda *a, **k: pytest.fail("analyzed"))
    out = tmp_path / name
    _fails_with_one_line(["graph", ATTENTION, "--color", "0", "-o", str(out), *extra], capsys, message)
    assert list(tmp_path.iterdir()) == []
