"""The analysis's fast paths (issue 38: the 70B step's analysis in fewer CPU seconds) give what the plain code gave.

Each test states its expected values by hand; the ones on a mechanism (a body walked once, Soufflé's preprocessed
program asked once, the fast constructor) fail on the code before it.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toast.analysis.dimension_graph import _crossed
from toast.analysis.named_dimensions import Identity, analyze
from toast.datalog import souffle
from toast.datalog.engine import evaluate
from toast.datalog.variants import assemble, load_variant
from toast.errors import EngineError
from toast.facts.numbering import number_names
from toast.facts.schema import NDA
from toast.facts.writer import _ATTRIBUTE_KINDS, _attribute_facts, program_facts
from toast.frontend import stablehlo
from toast.frontend.ir import Op, Program, Value
from toast.frontend.loading import load_program
from toast.frozen import constructor

# ---- toast.frozen.constructor


def test_the_fast_constructor_builds_the_object_the_class_does():
    make_identity, make_op = constructor(Identity), constructor(Op)
    built = make_identity(3, 7, 2, "rules/ops/elementwise.dl", 116)
    assert built == Identity(3, 7, 2, "rules/ops/elementwise.dl", 116)
    assert type(built) is Identity
    assert pickle.dumps(built) == pickle.dumps(Identity(3, 7, 2, "rules/ops/elementwise.dl", 116))
    op = make_op(4, "stablehlo.add", (1, 2), (3,), (), "f.py:9", (0, 1), ())
    assert op == Op(4, "stablehlo.add", (1, 2), (3,), loc="f.py:9", parent=(0, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.a = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        make_identity(3, 7, 2, "x.dl")


def test_the_fast_constructor_refuses_a_class_whose_constructor_does_more():
    with pytest.raises(TypeError, match="Program: its constructor does more than set its fields"):
        constructor(Program)  # its __post_init__ computes the producer map


# ---- reading StableHLO: each function's body walked once


def test_each_called_functions_body_is_walked_once(monkeypatch):
    def f(x):
        return jax.nn.relu(x) + jax.nn.relu(x * 2) + jax.nn.relu(x * 3)

    walked: list[str] = []
    original = stablehlo._Reader._operations

    def operations(self, function):
        walked.append(function.attributes["sym_name"].value)
        return original(self, function)

    monkeypatch.setattr(stablehlo._Reader, "_operations", operations)
    program = stablehlo.read_callable(f, [jax.ShapeDtypeStruct((4, 3), jnp.float32)])
    assert sorted(walked) == ["main", "relu"]  # relu is called three times, walked once
    maxima = [op for op in program.ops if op.kind == "stablehlo.maximum"]
    assert [program.values[m.results[0]].name for m in maxima] == ["@relu#0:%1", "@relu#1:%1", "@relu#2:%1"]
    # Each call's body sits in region 0 of its call, right after it.
    calls = [op for op in program.ops if op.kind == "func.call"]
    assert [m.parent for m in maxima] == [(c.id, 0) for c in calls]


def test_a_while_inside_a_called_function_keeps_its_nesting():
    @jax.jit
    def count(x):
        return jax.lax.fori_loop(0, 3, lambda i, y: y * 2.0, x)

    def f(x):
        return count(x) + count(x + 1.0)

    program = stablehlo.read_callable(f, [jax.ShapeDtypeStruct((2,), jnp.float32)])
    whiles = [op for op in program.ops if op.kind == "stablehlo.while"]
    calls = [op for op in program.ops if op.kind == "func.call" and op.attr("callee") == "count"]
    assert len(whiles) == 2 and len(calls) == 2
    for call, loop in zip(calls, whiles, strict=True):
        assert loop.parent == (call.id, 0)
        condition = [op.kind for op in program.ops if op.parent == (loop.id, 0)]
        body = [op.kind for op in program.ops if op.parent == (loop.id, 1)]
        assert condition[-1] == body[-1] == "stablehlo.return" and "stablehlo.compare" in condition
    assert len({program.values[loop.results[0]].name for loop in whiles}) == 2  # @count#0:..., @count#1:...
    # Ops come parents first, each op's regions' ops right after it and before the next op of its block.
    for op in program.ops:
        if op.parent is not None:
            assert op.parent[0] < op.id


# ---- facts


def test_numbering_by_hand():
    # v0: [2, 3] argument, v1: scalar argument, v2 = op0(v0, v1, v0): [3]; op1 returns v2.
    values = (Value(0, "x", (2, 3), "f32", 32, ""), Value(1, "s", (), "f32", 32, ""),
              Value(2, "%0", (3,), "f32", 32, ""))
    ops = (Op(0, "stablehlo.custom_call", (0, 1, 0), (2,)), Op(1, "func.return", (2,), ()))
    names = number_names(Program("p", values, ops, (0, 1), (2,)))
    assert names.defs == ((0, 0), (0, 1), (2, 0))
    assert names.def_base == (0, 2, 2)
    # Uses: op0's operand 0 (names 3, 4), operand 1 (scalar: none, first name 5), operand 2 (5, 6); op1's (7).
    assert names.uses == ((0, 0, 0), (0, 0, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0))
    assert [tuple(site) for site in names.use_sites] == [(0, 0, 0, 3), (0, 1, 1, 5), (0, 2, 0, 5), (1, 0, 2, 7)]
    assert names.use_sites[1].first_name == 5 and type(names.use_sites[1]).__name__ == "UseSite"
    facts, _ = program_facts(Program("p", values, ops, (0, 1), (2,)))
    assert facts["def_dim"] == [(0, 0, 0, 2), (1, 0, 1, 3), (2, 2, 0, 3)]
    assert facts["operand"] == [(0, 0, 0, 0), (0, 1, 1, 1), (0, 2, 2, 0), (1, 0, 3, 2)]
    assert facts["use_dim"] == [(3, 0, 0), (4, 0, 1), (5, 2, 0), (6, 2, 1), (7, 3, 0)]


def test_only_the_kinds_with_attribute_facts_are_asked_for_them():
    program = load_program("toast.examples.ops_zoo:ops_zoo_extras")
    seen = set()
    for op in program.ops:
        kind = op.kind.removeprefix("stablehlo.")
        rows = list(_attribute_facts(op, program))
        if kind not in _ATTRIBUTE_KINDS:
            assert rows == [], op.kind  # skipped by program_facts: it must write nothing
        elif rows:
            seen.add(kind)
    # The zoo has an op of each kind that writes attribute rows, but sort, reverse, convolution... by name:
    assert {"dot_general", "transpose", "broadcast_in_dim", "reduce", "reshape", "concatenate", "gather",
            "scatter", "pad", "reduce_window", "convolution"} <= seen


# ---- Datalog: Soufflé's outputs read back, its preprocessed program asked once


@pytest.mark.parametrize(("text", "types", "expected"), [
    # Sorted rows, numbers as ints, symbols as text (an empty symbol kept).
    ("3\t/r/a.dl\t7\n1\t\t2\n1\t/r/b.dl\t1\n", ["number", "symbol", "number"],
     [(1, "", 2), (1, "/r/b.dl", 1), (3, "/r/a.dl", 7)]),
    # All numbers: beyond int64 (read by int, not clipped), a sign, an underscore, blanks as int() takes them.
    ("99999999999999999999\t-3\n1_0\t+4\n 5\t6\n", ["number", "number"],
     [(5, 6), (10, 4), (99999999999999999999, -3)]),
    ("9223372036854775807\t-9223372036854775808\n", ["number", "number"],
     [(9223372036854775807, -9223372036854775808)]),
    ("", ["number", "number"], []),
    ("7\n", ["unsigned"], [(7,)]),
])
def test_souffle_outputs_read_back(tmp_path, text, types, expected):
    (tmp_path / "rel.csv").write_text(text)
    rows = souffle.read_outputs(tmp_path, {"rel": types})["rel"]
    assert rows == expected
    assert all(type(field) is type(want) for row, want_row in zip(rows, expected, strict=True)
               for field, want in zip(row, want_row, strict=True))


@pytest.mark.parametrize(("text", "error"), [
    ("1\t\n", "invalid literal for int() with base 10: ''"),
    ("5 6\t7\n", "invalid literal for int() with base 10: '5 6'"),
])
def test_souffle_output_field_that_is_no_number(tmp_path, text, error):
    (tmp_path / "rel.csv").write_text(text)
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        souffle.read_outputs(tmp_path, {"rel": ["number", "number"]})


def test_souffle_output_row_of_other_width_among_many(tmp_path):
    (tmp_path / "edge.csv").write_text("".join(f"{k}\t{k + 1}\n" for k in range(1000)) + "7\t8\t9\n")
    with pytest.raises(EngineError, match=r"edge.csv: row of 3 columns, expected 2"):
        souffle.read_outputs(tmp_path, {"edge": ["number", "number"]})


def test_the_preprocessed_programs_key_follows_the_included_files(tmp_path):
    rules = tmp_path / "rules.dl"
    rules.write_text(".decl a(x: number)\n")
    program = tmp_path / "program.dl"
    program.write_text(f'#include "{rules}"\n')
    executable = str(Path(shutil.which("python3") or "/bin/sh").resolve())
    first = souffle._sources_key(executable, program)
    assert first and souffle._sources_key(executable, program) == first
    rules.write_text(".decl a(x: number, y: number)\n")  # an included file changed: another program
    assert souffle._sources_key(executable, program) not in ("", first)
    program.write_text('#include "missing.dl"\n')  # unreadable: no key, Soufflé is asked
    assert souffle._sources_key(executable, program) == ""


def test_a_planted_key_cannot_point_out_of_the_cache(monkeypatch, tmp_path):
    """A key file names the digest of a compiled program in the cache; one naming anything else (a path out of the
    cache, where a planted ``program`` waits) is ignored: Soufflé is asked for the preprocessed program again."""
    import hashlib

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "toast" / "souffle"
    program = tmp_path / "program.dl"
    program.write_text(".decl a(x: number)\n")
    executable = str(Path(shutil.which("python3") or "/bin/sh").resolve())
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "program").write_text("#!/bin/sh\n")
    (cache / "keys").mkdir(parents=True)
    (cache / "keys" / souffle._sources_key(executable, program)).write_text("../../../planted")
    digest = hashlib.sha256((executable + "\0" + "preprocessed").encode()).hexdigest()[:24]
    (cache / digest).mkdir()
    (cache / digest / "program").write_text("")  # compiled before: no compile now
    asked: list[list[str]] = []
    monkeypatch.setattr(souffle, "_run", lambda command, **kwargs: asked.append(command) or "preprocessed")
    found = souffle._compiled_binary(executable, program, workdir=tmp_path, timeout_s=10.0)
    assert found == cache / digest / "program"
    assert [command[1] for command in asked] == ["--show=transformed-datalog"]
    assert (cache / "keys" / souffle._sources_key(executable, program)).read_text() == digest  # the key mended


def test_a_key_file_is_read_without_links_and_within_a_limit(tmp_path):
    """A key file is read at most 64 bytes and never through a link: a link to a device that never ends, or to a
    digest elsewhere, reads as no key (Soufflé is then asked)."""
    digest = "0123456789abcdef01234567"
    (tmp_path / "plain").write_text(digest + "\n")
    assert souffle._read_key(tmp_path / "plain") == digest
    (tmp_path / "elsewhere").write_text(digest)
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    assert souffle._read_key(tmp_path / "linked") == ""
    (tmp_path / "endless").symlink_to("/dev/zero")
    assert souffle._read_key(tmp_path / "endless") == ""
    (tmp_path / "long").write_text("f" * 10_000)
    assert souffle._read_key(tmp_path / "long") == "f" * 64
    assert souffle._read_key(tmp_path / "missing") == ""


@pytest.mark.skipif(shutil.which("souffle") is None, reason="needs Soufflé on PATH")
def test_souffle_is_asked_for_the_preprocessed_program_once(monkeypatch):
    program = load_program("toast.examples.mlp:mlp")
    facts, _ = program_facts(program)
    text = assemble(load_variant("default"), stage=NDA).text
    evaluate(text, facts, NDA.outputs, engine="souffle")  # compiled (and its key kept) if it was not yet
    commands: list[list[str]] = []
    original = souffle._run

    def run(command, **kwargs):
        commands.append(command)
        return original(command, **kwargs)

    monkeypatch.setattr(souffle, "_run", run)
    outputs = evaluate(text, facts, NDA.outputs, engine="souffle")
    assert [c[1] for c in commands] == ["-F"]  # the compiled program's run only
    assert outputs == evaluate(text, facts, NDA.outputs, engine="embedded")


# ---- the crossing check and the analysis's counts


def test_box_crossing_by_hand():
    # Edges 1 -> 2 -> 1 (a cycle), 2 -> 3, 5 -> 6; node 7 lies in a box only.
    sources, targets = [1, 2, 2, 5], [2, 1, 3, 6]
    boxes = [(1, 5, 6, 3),  # 1 reaches 3 (through the cycle)
             (5, 1, 3, 6),  # 5 reaches 6
             (3, 6, 1, 5),  # 3 reaches nothing, 6 nothing
             (2, 5, 7, 1),  # 2 reaches 1 (the cycle)
             (1, 3, 5, 7)]  # 1 does not reach 7, 3 not 5
    assert _crossed(sources, targets, boxes) == [True, True, False, True, False]
    assert _crossed([], [], [(1, 2, 3, 4)]) == [False]


def test_the_analysis_counts_dimension_graph_nodes_and_colors():
    analysis = analyze("toast.examples.mlp:mlp", engine="embedded", cache=False)
    assert analysis.stats["dimension_graph_nodes"] == len(np.unique(analysis.node_of))
    assert analysis.stats["colors"] == len(np.unique(analysis.color_of)) == 4  # Figure 2a: 4 colors
    assert analysis.m_edges == tuple(sorted(analysis.m_edges)) and all(type(e) is tuple for e in analysis.m_edges)
