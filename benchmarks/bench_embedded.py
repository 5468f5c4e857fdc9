"""Benchmark the embedded (pyDatalog) Datalog engine on a synthetic sharding-analysis workload.

The workload mimics toast's rule base: a chain of ops over values with named dimensions
(``op``, ``operand``, ``result``, ``def_dim``, ``use_dim`` and a few per-kind attribute
relations, 11 input relations), 39 non-recursive rules of 1-5 body atoms, most joining
3-5 (helpers, def-use edges, per-kind identities carrying ``__FILE__``/``__LINE__``,
negation, arithmetic comparisons), and outputs about as large as the input.

Run:  python benchmarks/bench_embedded.py [ROWS ...]   (default: 10000 30000 60000)

Prints, per size: rows in/out, seconds to parse, to load facts, to evaluate, in total, and
microseconds per input row (which should stay flat: the engine must scale linearly). With
``--assert-api`` it also compares the fact-loading APIs of pyDatalog.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyDatalog import pyDatalog, pyEngine  # noqa: E402

from toast.datalog import parse_text, run_embedded  # noqa: E402

ELEMENTWISE = 8
KINDS = ELEMENTWISE + 5  # + transpose, reduce, broadcast, dot, unruled
TRANSPOSE, REDUCE, BROADCAST, DOT, UNRULED = range(ELEMENTWISE, KINDS)

SCHEMA = """
.decl op(Op: number, Kind: number)
.decl operand(Op: number, Index: number, Use: number, Value: number)
.decl result(Op: number, Index: number, Value: number)
.decl def_dim(Name: number, Value: number, Dim: number, Size: number)
.decl use_dim(Name: number, Use: number, Dim: number)
.decl transpose_perm(Op: number, OutDim: number, InDim: number)
.decl reduce_keep(Op: number, InDim: number, OutDim: number)
.decl broadcast_map(Op: number, InDim: number, OutDim: number)
.decl dot_contract(Op: number, LhsDim: number, RhsDim: number)
.decl dot_free(Op: number, Operand: number, InDim: number, OutDim: number)
.decl kind_arity(Kind: number, Operands: number)
.input op, operand, result, def_dim, use_dim, transpose_perm, reduce_keep, broadcast_map
.input dot_contract, dot_free, kind_arity

.decl ident(A: number, B: number, Op: number, File: symbol, Line: number)
.decl m_edge(Def: number, Use: number)
.decl unruled_op(Op: number, Kind: number)
.decl invalid_ident_size(A: number, B: number, File: symbol, Line: number)
.output ident, m_edge, unruled_op, invalid_ident_size, out_dim

.decl out_dim(Op: number, Index: number, Dim: number, Name: number, Size: number)
.decl in_dim(Op: number, Index: number, Dim: number, Name: number, Size: number)
.decl elementwise_kind(Kind: number)
.decl ruled_kind(Kind: number)
.decl name_size(Name: number, Size: number)
.decl same_size(A: number, B: number)
.decl binary_op(Op: number)
"""

RULES = """
in_dim(Op, Index, Dim, Name, Size) :-
    operand(Op, Index, Use, Value), use_dim(Name, Use, Dim), def_dim(_, Value, Dim, Size).
out_dim(Op, Index, Dim, Name, Size) :- result(Op, Index, Value), def_dim(Name, Value, Dim, Size).
m_edge(Def, Use) :- operand(_, _, U, Value), use_dim(Use, U, Dim), def_dim(Def, Value, Dim, _).
ruled_kind(K) :- elementwise_kind(K).
ruled_kind({TRANSPOSE}). ruled_kind({REDUCE}). ruled_kind({BROADCAST}). ruled_kind({DOT}).
unruled_op(Op, Kind) :- op(Op, Kind), !ruled_kind(Kind).
binary_op(Op) :- op(Op, Kind), kind_arity(Kind, 2).
name_size(Name, Size) :- def_dim(Name, _, _, Size).
name_size(Name, Size) :- in_dim(_, _, _, Name, Size).
same_size(A, B) :- out_dim(Op, 0, 0, A, S), in_dim(Op, 0, 0, B, S).
invalid_ident_size(A, B, File, Line) :-
    ident(A, B, _, File, Line), name_size(A, SizeA), name_size(B, SizeB), SizeA != SizeB.
ident(A, B, Op, __FILE__, __LINE__) :-
    op(Op, K), transpose_perm(Op, OutDim, InDim), out_dim(Op, 0, OutDim, A, _), in_dim(Op, 0, InDim, B, _),
    K = {TRANSPOSE}.
ident(A, B, Op, __FILE__, __LINE__) :-
    reduce_keep(Op, InDim, OutDim), out_dim(Op, 0, OutDim, A, _), in_dim(Op, 0, InDim, B, _).
ident(A, B, Op, __FILE__, __LINE__) :-
    broadcast_map(Op, InDim, OutDim), out_dim(Op, 0, OutDim, A, _), in_dim(Op, 0, InDim, B, _).
ident(A, B, Op, __FILE__, __LINE__) :-
    dot_contract(Op, L, R), in_dim(Op, 0, L, A, _), in_dim(Op, 1, R, B, _).
ident(A, B, Op, __FILE__, __LINE__) :-
    dot_free(Op, I, InDim, OutDim), out_dim(Op, 0, OutDim, A, _), in_dim(Op, I, InDim, B, _).
"""

# One family of per-kind rules, repeated for each elementwise kind (3 rules per kind).
ELEMENTWISE_RULES = """
elementwise_kind({K}).
ident(A, B, Op, __FILE__, __LINE__) :-
    op(Op, {K}), out_dim(Op, 0, Dim, A, Size), in_dim(Op, 0, Dim, B, Size).
ident(A, B, Op, __FILE__, __LINE__) :-
    op(Op, {K}), binary_op(Op), out_dim(Op, 0, Dim, A, Size), in_dim(Op, 1, Dim, B, Size), Dim >= 0.
ident(A, B, Op, __FILE__, __LINE__) :-
    op(Op, {K}), in_dim(Op, 0, Dim, A, _), in_dim(Op, 1, Dim, B, _), !same_size(A, B), A < B.
"""


def program_text() -> str:
    """The synthetic rule program: 39 rules and 12 facts."""
    constants = {"TRANSPOSE": TRANSPOSE, "REDUCE": REDUCE, "BROADCAST": BROADCAST, "DOT": DOT}
    text = SCHEMA + RULES.format(**constants)
    text += "".join(ELEMENTWISE_RULES.format(K=k) for k in range(ELEMENTWISE))
    return text


def workload(target_rows: int, seed: int = 0) -> dict[str, list[tuple[int, ...]]]:
    """Facts for a chain of ops totalling about ``target_rows`` input rows."""
    rng = random.Random(seed)
    facts: dict[str, list[tuple[int, ...]]] = {
        name: []
        for name in (
            "op operand result def_dim use_dim transpose_perm reduce_keep broadcast_map dot_contract dot_free "
            "kind_arity"
        ).split()
    }
    facts["kind_arity"] = [(k, 2 if k < ELEMENTWISE // 2 or k == DOT else 1) for k in range(KINDS)]
    names = iter(range(10**9))
    values: list[tuple[int, list[int]]] = []  # (value id, dim sizes)
    next_value = iter(range(10**9))
    next_use = iter(range(10**9))

    def define(op: int, sizes: list[int]) -> None:
        value = next(next_value)
        facts["result"].append((op, 0, value))
        for dim, size in enumerate(sizes):
            facts["def_dim"].append((next(names), value, dim, size))
        values.append((value, sizes))

    def use(op: int, index: int, value: int, sizes: list[int]) -> None:
        use_id = next(next_use)
        facts["operand"].append((op, index, use_id, value))
        for dim in range(len(sizes)):
            facts["use_dim"].append((next(names), use_id, dim))

    op = 0
    for _ in range(4):  # a few sources
        facts["op"].append((op, UNRULED))
        define(op, [rng.choice((128, 256)), rng.choice((512, 1024)), 64])
        op += 1
    while sum(len(rows) for rows in facts.values()) < target_rows:
        kind = rng.randrange(KINDS)
        facts["op"].append((op, kind))
        lhs_value, lhs = values[-1]
        rhs_value, rhs = values[-1 - rng.randrange(min(len(values), 3))]
        if kind < ELEMENTWISE:
            use(op, 0, lhs_value, lhs)
            if facts["kind_arity"][kind][1] == 2:
                use(op, 1, lhs_value if len(rhs) != len(lhs) else rhs_value, lhs if len(rhs) != len(lhs) else rhs)
            define(op, list(lhs))
        elif kind == TRANSPOSE:
            use(op, 0, lhs_value, lhs)
            perm = list(range(len(lhs)))
            rng.shuffle(perm)
            facts["transpose_perm"].extend((op, out, inp) for out, inp in enumerate(perm))
            define(op, [lhs[i] for i in perm])
        elif kind == REDUCE:
            use(op, 0, lhs_value, lhs)
            dropped = rng.randrange(len(lhs))
            kept = [d for d in range(len(lhs)) if d != dropped] + [dropped]
            facts["reduce_keep"].extend((op, inp, out) for out, inp in enumerate(kept))
            define(op, [lhs[i] for i in kept])
        elif kind == BROADCAST:
            use(op, 0, lhs_value, lhs)
            facts["broadcast_map"].extend((op, d, d) for d in range(len(lhs)))
            define(op, list(lhs))
        elif kind == DOT:
            use(op, 0, lhs_value, lhs)
            use(op, 1, lhs_value, lhs)
            last = len(lhs) - 1
            facts["dot_contract"].append((op, last, last))
            facts["dot_free"].extend((op, o, d, d) for o in (0, 1) for d in range(last))
            define(op, list(lhs))
        else:
            use(op, 0, lhs_value, lhs)
            define(op, list(lhs))
        op += 1
    return facts


def bench(target_rows: int) -> None:
    """Time one run at about ``target_rows`` input rows."""
    facts = workload(target_rows)
    rows_in = sum(len(rows) for rows in facts.values())
    start = time.perf_counter()
    program = parse_text(program_text(), "bench.dl")
    parsed = time.perf_counter()
    result = run_embedded(program, facts)
    done = time.perf_counter()
    rows_out = sum(len(rows) for rows in result.values())
    total = done - start
    print(
        f"{rows_in:>7} rows in  {rows_out:>7} rows out  parse {parsed - start:5.2f}s  "
        f"run {done - parsed:6.2f}s  total {total:6.2f}s  {1e6 * total / rows_in:5.1f} us/row",
        flush=True,
    )


def bench_assert_apis(rows: int) -> None:
    """Compare pyDatalog's fact-loading entry points on ``rows`` 4-column facts."""
    data = [(i, i % 7, i % 13, i // 3) for i in range(rows)]
    gc.disable()
    try:
        pyDatalog.clear()
        start = time.perf_counter()
        for row in data:
            pyDatalog.assert_fact("f", *row)
        print(f"pyDatalog.assert_fact:            {time.perf_counter() - start:6.2f}s for {rows} rows")
        pyDatalog.clear()
        start = time.perf_counter()
        for row in data:
            pyEngine.assert_(pyEngine.Clause(pyEngine.Literal("f", [pyEngine.Const(v) for v in row]), []))
        print(f"pyEngine.assert_ (name lookup):   {time.perf_counter() - start:6.2f}s for {rows} rows")
        pyDatalog.clear()
        pred = pyEngine.Pred("f", 4)
        pred.prearity = 4
        start = time.perf_counter()
        for row in data:
            pyEngine.assert_(pyEngine.Clause(pyEngine.Literal(pred, [pyEngine.Const(v) for v in row]), []))
        print(f"pyEngine.assert_ (Pred object):   {time.perf_counter() - start:6.2f}s for {rows} rows")
    finally:
        pyDatalog.clear()
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", type=int, default=[10_000, 30_000, 60_000])
    parser.add_argument("--assert-api", action="store_true", help="also compare fact-loading APIs")
    args = parser.parse_args()
    if args.assert_api:
        bench_assert_apis(60_000)
    for rows in args.rows:
        bench(rows)


if __name__ == "__main__":
    main()
