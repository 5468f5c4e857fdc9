"""Tests of the embedded pyDatalog engine (toast.datalog.embedded).

Expected results are worked out by hand in each test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toast.datalog import parse_text, run_embedded, run_embedded_file
from toast.errors import EngineError

GRAPH = """
.decl edge(a: number, b: number)
.input edge
"""
PATH_DECL = ".decl path(a: number, b: number)\n.output path\n"


def run(text: str, facts: dict | None = None, outputs: list[str] | None = None, path: str = "t.dl") -> dict:
    return run_embedded(parse_text(text, path), facts or {}, outputs)


def test_join_with_constants_and_wildcards() -> None:
    text = """
    .decl person(id: number, name: symbol)
    .decl works(id: number, dept: symbol, years: number)
    .input person, works
    .decl in_dept(name: symbol, dept: symbol)
    .decl senior_ml(name: symbol)
    .decl employed(id: number)
    .output in_dept, senior_ml, employed
    in_dept(N, D) :- person(I, N), works(I, D, _).
    senior_ml(N) :- works(I, "ml", 5), person(I, N).
    employed(I) :- works(I, _, _).
    """
    facts = {
        "person": [(1, "ada"), (2, "bob"), (3, "cy")],
        "works": [(1, "ml", 5), (2, "ml", 1), (2, "ops", 5), (4, "ml", 5)],
    }
    result = run(text, facts)
    assert result == {
        "in_dept": [("ada", "ml"), ("bob", "ml"), ("bob", "ops")],
        "senior_ml": [("ada",)],
        "employed": [(1,), (2,), (4,)],
    }


def test_repeated_variable_in_an_atom() -> None:
    result = run(
        GRAPH + ".decl loop(x: number)\n.output loop\nloop(X) :- edge(X, X).\n", {"edge": [(1, 1), (1, 2), (3, 3)]}
    )
    assert result == {"loop": [(1,), (3,)]}


def test_negation_with_and_without_wildcards() -> None:
    text = (
        GRAPH
        + """
    .decl node(n: number)
    .input node
    .decl source(n: number)
    .decl not_pointing_to_3(n: number)
    .output source, not_pointing_to_3
    source(N) :- node(N), !edge(_, N).
    not_pointing_to_3(N) :- node(N), !edge(N, 3).
    """
    )
    result = run(text, {"node": [(1,), (2,), (3,), (4,)], "edge": [(1, 2), (2, 3), (4, 3)]})
    assert result == {"source": [(1,), (4,)], "not_pointing_to_3": [(1,), (3,)]}


def test_negation_of_a_derived_relation_and_of_an_empty_one() -> None:
    text = (
        GRAPH
        + """
    .decl reach(a: number, b: number)
    .decl unreachable(a: number, b: number)
    .decl nothing(a: number)
    .decl all_nodes(a: number)
    .output unreachable, all_nodes
    reach(X, Y) :- edge(X, Y).
    reach(X, Z) :- reach(X, Y), edge(Y, Z).
    unreachable(X, Y) :- edge(X, _), edge(_, Y), !reach(X, Y).
    all_nodes(X) :- edge(X, _), !nothing(X).
    """
    )
    result = run(text, {"edge": [(1, 2), (2, 3), (3, 1), (4, 5)]})
    # 1, 2, 3 reach each other (and themselves); 4 reaches only 5.
    assert result["unreachable"] == [(1, 5), (2, 5), (3, 5), (4, 1), (4, 2), (4, 3)]
    assert result["all_nodes"] == [(1,), (2,), (3,), (4,)]


@pytest.mark.parametrize(
    "recursive_body",
    ["path(X, Y), edge(Y, Z)", "edge(X, Y), path(Y, Z)", "path(X, Y), path(Y, Z)"],
    ids=["left-linear", "right-linear", "non-linear"],
)
def test_transitive_closure_of_a_chain_of_200_nodes(recursive_body: str) -> None:
    text = GRAPH + f"{PATH_DECL}path(X, Y) :- edge(X, Y).\npath(X, Z) :- {recursive_body}.\n"
    result = run(text, {"edge": [(i, i + 1) for i in range(199)]})["path"]
    assert len(result) == 200 * 199 // 2
    assert result[0] == (0, 1) and result[-1] == (198, 199)
    assert (0, 199) in result and (5, 5) not in result and (6, 5) not in result


def test_mutual_recursion() -> None:
    text = (
        GRAPH
        + """
    .decl even(a: number, b: number)
    .decl odd(a: number, b: number)
    .output even, odd
    odd(X, Y) :- edge(X, Y).
    even(X, Z) :- odd(X, Y), edge(Y, Z).
    odd(X, Z) :- even(X, Y), edge(Y, Z).
    """
    )
    result = run(text, {"edge": [(0, 1), (1, 2), (2, 3)]})
    assert result == {"even": [(0, 2), (1, 3)], "odd": [(0, 1), (0, 3), (1, 2), (2, 3)]}


def test_recursion_with_negation_of_a_lower_stratum() -> None:
    text = (
        GRAPH
        + """
    .decl blocked(n: number)
    .input blocked
    .decl reach(n: number)
    .output reach
    reach(0).
    reach(Y) :- reach(X), edge(X, Y), !blocked(Y).
    """
    )
    result = run(text, {"edge": [(0, 1), (1, 2), (0, 3), (3, 4), (4, 5)], "blocked": [(3,)]})
    assert result == {"reach": [(0,), (1,), (2,)]}


def test_arithmetic_has_c_semantics_and_wraps_at_32_bits() -> None:
    text = """
    .decl n(x: number)
    .input n
    .decl r(x: number, q: number, m: number, w: number, neg: number)
    .output r
    r(X, X / 2, X % 2, X * 2147483647, -X) :- n(X).
    """
    result = run(text, {"n": [(7,), (-7,), (-2147483648,)]})
    assert result == {
        "r": [
            # -2147483648 * 2147483647 = -2^62 + 2^31, which is 2^31 modulo 2^32: wraps to -2^31;
            # -(-2^31) wraps to -2^31 too.
            (-2147483648, -1073741824, 0, -2147483648, -2147483648),
            # -7 / 2 truncates to -3; -7 % 2 is -1; -7 * (2^31 - 1) = -4 * 2^32 + 2147483655 wraps to
            # 2147483655 - 2^32.
            (-7, -3, -1, -2147483641, 7),
            (7, 3, 1, 2147483641, -7),  # 7 * (2^31 - 1) = 15032385529 = 3 * 2^32 + 2147483641
        ]
    }


def test_unsigned_arithmetic_wraps_modulo_2_to_the_32() -> None:
    text = ".decl u(x: unsigned)\n.input u\n.decl d(x: unsigned)\n.output d\nd(X - 3) :- u(X).\n"
    assert run(text, {"u": [(1,), (10,)]}) == {"d": [(7,), (4294967294,)]}


def test_arithmetic_constraints() -> None:
    text = """
    .decl n(x: number)
    .input n
    .decl pair(x: number, y: number)
    .output pair
    pair(X, Y) :- n(X), n(Y), X < Y, Y - X >= 2, (X + Y) % 3 != 0, Z = X * 10, Z <= 30.
    """
    # X < Y, Y - X >= 2 and X <= 3: (1,3), (1,4), (1,5), (2,4), (2,5), (3,5); the sums of
    # (1,5) and (2,4) are multiples of 3.
    assert run(text, {"n": [(1,), (2,), (3,), (4,), (5,)]}) == {"pair": [(1, 3), (1, 4), (2, 5), (3, 5)]}


def test_equality_binds_variables_in_either_direction() -> None:
    text = """
    .decl n(x: number)
    .input n
    .decl r(x: number, y: number, z: number)
    .output r
    r(X, Y, Z) :- n(X), Y = X + 1, X * 3 = Z, 1 = 1.
    """
    assert run(text, {"n": [(2,)]}) == {"r": [(2, 3, 6)]}


def test_division_by_zero_is_an_engine_error() -> None:
    text = ".decl n(x: number)\n.input n\n.decl r(x: number)\n.output r\n\nr(100 / X) :- n(X).\n"
    with pytest.raises(EngineError) as info:
        run(text, {"n": [(1,), (0,)]}, path="div.dl")
    assert str(info.value) == "div.dl:6: division by zero in a rule for 'r'"


def test_a_head_is_computed_only_for_rows_the_whole_body_accepts() -> None:
    """As in Soufflé, 6 / 0 is never computed: the row (6, 0) fails b(Y) (the planner reads a, its 2 rows,
    before b, its 3, so a head computed as soon as X and Y were bound would divide by zero)."""
    text = """
    .decl a(x: number, y: number)
    .decl b(y: number)
    .input a, b
    .decl p(z: number, w: symbol)
    .output p
    p(X / Y, cat("y=", to_string(Y))) :- a(X, Y), b(Y).
    """
    assert run(text, {"a": [(6, 0), (6, 3)], "b": [(3,), (4,), (5,)]}) == {"p": [(2, "y=3")]}


def test_a_failed_run_leaves_no_table_behind() -> None:
    """The tables answer pyDatalog through its registry of Python resolvers, which outlives a run: a run that
    fails half-way (a division by zero in a recursive rule, while a semi-naive delta table is up) puts it back
    as it was."""
    from pyDatalog import pyEngine

    before = dict(pyEngine.Python_resolvers)
    text = GRAPH + PATH_DECL + """
    path(A, B) :- edge(A, B).
    path(A, C) :- path(A, B), edge(B, C), 100 / (C - 3) > 0.
    """
    with pytest.raises(EngineError, match="division by zero"):
        run(text, {"edge": [(1, 2), (2, 3)]})
    assert pyEngine.Python_resolvers == before
    assert run(text, {"edge": [(1, 2), (2, 4)]}) == {"path": [(1, 2), (1, 4), (2, 4)]}


def test_file_and_line_in_a_head(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "ops.dl").write_text(
        "// op rules\n"
        "why(X, __FILE__, __LINE__) :- edge(X, _).\n"
        "\n"
        "why(Y, __FILE__, __LINE__) :-\n"
        "    edge(_, Y).\n"
    )
    main = tmp_path / "main.dl"
    main.write_text(GRAPH + '.decl why(x: number, file: symbol, line: number)\n.output why\n#include "rules/ops.dl"\n')
    result = run_embedded_file(main, {"edge": [(1, 2)]})
    ops = str(rules / "ops.dl")
    assert result == {"why": [(1, ops, 2), (2, ops, 4)]}


def test_facts_in_the_program_and_set_semantics() -> None:
    text = """
    .decl a(x: number, s: symbol)
    .input a
    .decl b(x: number, s: symbol)
    .output a, b
    a(1, "x"). a(1, "x"). a(2 + 3, "y").
    b(X, S) :- a(X, S).
    b(X, S) :- a(X, S), X > 0.
    """
    result = run(text, {"a": [(1, "x"), (1, "x"), (7, "z")]})
    assert result == {"a": [(1, "x"), (5, "y"), (7, "z")], "b": [(1, "x"), (5, "y"), (7, "z")]}


def test_odd_relation_names_and_symbols() -> None:
    text = """
    .decl ns.in?put(x: symbol)
    .input ns.in?put
    .decl ns.out(x: symbol, y: symbol)
    .output ns.out
    ns.out(X, "~neg") :- ns.in?put(X).
    """
    strings = ["X", "_pyD_query1", "a.b", "", 'it\'s "quoted"', "ünï"]
    result = run(text, {"ns.in?put": [(s,) for s in strings]})
    assert result == {"ns.out": sorted((s, "~neg") for s in strings)}


def test_nullary_relations() -> None:
    text = GRAPH + ".decl has_loop()\n.decl flag()\n.output has_loop, flag\nhas_loop() :- edge(X, X).\nflag().\n"
    assert run(text, {"edge": [(1, 2), (3, 3)]}) == {"has_loop": [()], "flag": [()]}
    assert run(text, {"edge": [(1, 2)]}) == {"has_loop": [], "flag": [()]}


def test_input_relation_with_rules_and_explicit_outputs() -> None:
    text = GRAPH + ".decl sym(a: number, b: number)\nedge(Y, X) :- edge(X, Y).\nsym(X, Y) :- edge(X, Y), X < Y.\n"
    result = run(text, {"edge": [(1, 2), (4, 3)]}, outputs=["edge", "sym"])
    assert result == {"edge": [(1, 2), (2, 1), (3, 4), (4, 3)], "sym": [(1, 2), (3, 4)]}


def test_numpy_integers_are_accepted() -> None:
    text = GRAPH + ".decl out(a: number)\n.output out\nout(X + Y) :- edge(X, Y).\n"
    result = run(text, {"edge": [(np.int64(2), np.int32(3))]})
    assert result == {"out": [(5,)]} and type(result["out"][0][0]) is int


def test_two_consecutive_runs_are_independent() -> None:
    text = GRAPH + f"{PATH_DECL}path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n"
    program = parse_text(text, "t.dl")
    first = run_embedded(program, {"edge": [(1, 2), (2, 3)]})
    second = run_embedded(program, {"edge": [(7, 8)]})
    third = run_embedded(program, {})
    assert first == {"path": [(1, 2), (1, 3), (2, 3)]}
    assert second == {"path": [(7, 8)]}
    assert third == {"path": []}


@pytest.mark.parametrize(
    ("facts", "outputs", "message"),
    [
        ({"nope": [(1,)]}, None, "embedded engine: facts given for undeclared relation 'nope'"),
        ({"path": [(1, 2)]}, None, "embedded engine: facts given for 'path', which is not an .input relation"),
        ({"edge": [(1,)]}, None, "embedded engine: row (1,) of 'edge' has 1 values, expected 2"),
        (
            {"edge": [(1, "2")]},
            None,
            "embedded engine: row (1, '2') of 'edge': 'str' object cannot be interpreted as an integer",
        ),
        ({"edge": [(1, True)]}, None, "embedded engine: row (1, True) of 'edge': column 'b' is a number, got True"),
        (
            {"edge": [(1, 2**31)]},
            None,
            "embedded engine: row (1, 2147483648) of 'edge': 2147483648 is out of range for the number column 'b'",
        ),
        ({}, ["nothere"], "embedded engine: output relation 'nothere' is not declared"),
    ],
)
def test_bad_facts_and_outputs(facts: dict, outputs: list[str] | None, message: str) -> None:
    text = GRAPH + ".decl path(a: number, b: number)\n.output path\npath(X, Y) :- edge(X, Y).\n"
    with pytest.raises(EngineError) as info:
        run(text, facts, outputs)
    assert str(info.value) == message


def test_symbol_column_rejects_numbers() -> None:
    text = ".decl s(x: symbol)\n.input s\n.output s\n"
    with pytest.raises(EngineError) as info:
        run(text, {"s": [(3,)]})
    assert str(info.value) == "embedded engine: row (3,) of 's': column 'x' is a symbol, got 3"


def test_missing_rule_file_is_a_rule_error(tmp_path: Path) -> None:
    from toast.errors import RuleError

    with pytest.raises(RuleError):
        run_embedded_file(tmp_path / "absent.dl", {})


def test_a_failed_run_leaves_nothing_behind() -> None:
    text = (GRAPH + f"{PATH_DECL}.decl bad(x: number)\n.output bad\npath(X, Y) :- edge(X, Y).\n"
            "bad(X / 0) :- edge(X, _).\n")
    program = parse_text(text, "t.dl")
    with pytest.raises(EngineError):
        run_embedded(program, {"edge": [(1, 2)]})
    assert run_embedded(program, {"edge": [(3, 4)]}, ["path"]) == {"path": [(3, 4)]}


def test_only_relations_the_outputs_depend_on_are_evaluated() -> None:
    text = (GRAPH + ".decl ok(x: number)\n.decl bad(x: number)\n.output ok, bad\nok(X) :- edge(X, _).\n"
            "bad(X / 0) :- ok(X).\n")
    assert run(text, {"edge": [(1, 2)]}, outputs=["ok"]) == {"ok": [(1,)]}


def test_cat_and_to_string_build_symbols_as_souffle_does() -> None:
    """Soufflé 2.5 prints these rows for this program (checked by hand)."""
    text = """
    .decl op(o: number, k: symbol)
    .input op
    .decl d(s: symbol)
    .output d
    d(cat("op ", to_string(O), ": ", K)) :- op(O, K).
    d(S) :- op(O, _), S = cat(to_string(O + 1), "!").
    d(cat(K)) :- op(_, K).
    d(cat(to_string(K), "?")) :- op(_, K).
    """
    result = run(text, {"op": [(1, "add"), (22, "mul")]})
    assert result["d"] == [("2!",), ("23!",), ("add",), ("add?",), ("mul",), ("mul?",), ("op 1: add",),
                           ("op 22: mul",)]
