#!/usr/bin/env python
"""Regenerate the engine goldens: Soufflé's outputs of both stages for the bundled examples.

    PATH=/path/to/souffle/bin:$PATH python tests/golden/regenerate.py            # every example
    PATH=/path/to/souffle/bin:$PATH python tests/golden/regenerate.py gpt_small  # some of them
    PATH=/path/to/souffle/bin:$PATH python tests/golden/regenerate.py --check    # compare only

For each example it runs ``toast.analyze(spec, engine="souffle", keep=DIR)`` and writes the
``.csv`` files Soufflé wrote for each output relation of each stage (``toast.facts.schema``)
as ``tests/golden/<example>/<stage>/<relation>.csv`` (stages ``nda`` and ``conflicts``),
made canonical: a ``File`` column (the rule file of a row of ``ident``) is written relative
to the project root (``rules/ops/elementwise.dl``), and rows are sorted by their typed columns
(numbers numerically). Goldens are written by Soufflé only: without ``souffle`` on PATH the
script refuses, it never falls back to the embedded engine.

This module is also the one definition of the golden format and of the comparison:
``tests/conftest.py`` loads it, ``tests/test_goldens.py`` checks both engines against the files.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from toast.facts.schema import STAGES, Relation
from toast.resources import project_root

GOLDEN_DIR = Path(__file__).resolve().parent
PROJECT_DIR = GOLDEN_DIR.parent.parent
COMMAND = "python tests/golden/regenerate.py"

# The bundled examples (keys of toast.examples.EXAMPLES) that have goldens.
EXAMPLES = ("mlp", "transpose_matmul", "attention", "ops_zoo", "gpt_small", "gpt_scan", "convnet", "gnn")

# Where ``toast.analyze(..., keep=DIR)`` leaves each stage's engine outputs, under DIR.
KEPT_OUTPUTS = {"nda": Path("out"), "conflicts": Path("conflicts") / "out"}

# stage -> relation -> canonical rows (tab-separated lines, sorted)
Outputs = dict[str, dict[str, list[str]]]


def canonical_rows(relation: Relation, lines: Iterable[str]) -> list[str]:
    """Rows of ``relation`` as written by an engine (tab-separated lines), in golden form:
    ``File`` columns relative to the project root, sorted by the typed columns."""
    root = project_root().resolve()
    rows = []
    for line in lines:
        fields = line.split("\t")
        if len(fields) != relation.arity:
            raise ValueError(f"{relation.name}: row {line!r} has {len(fields)} columns, expected {relation.arity}")
        row: list[int | str] = []
        for (column, _), kind, field in zip(relation.columns, relation.bases, fields, strict=True):
            if kind in ("number", "unsigned"):
                row.append(int(field))
            elif column == "File" and Path(field).is_absolute():
                path = Path(field).resolve()
                row.append(path.relative_to(root).as_posix() if path.is_relative_to(root) else field)
            else:
                row.append(field)
        rows.append(tuple(row))
    return ["\t".join(str(x) for x in row) for row in sorted(rows)]


def golden_text(rows: list[str]) -> str:
    """The exact text of a golden file holding ``rows`` (empty for no rows)."""
    return "".join(row + "\n" for row in rows)


def read_kept(keep: Path) -> Outputs:
    """The engine outputs of both stages under a ``keep`` directory, in golden form."""
    outputs: Outputs = {}
    for stage, subdir in KEPT_OUTPUTS.items():
        outputs[stage] = {}
        for relation in STAGES[stage].outputs:
            path = keep / subdir / f"{relation.name}.csv"
            if not path.is_file():
                raise FileNotFoundError(f"the engine wrote no {path}")
            outputs[stage][relation.name] = canonical_rows(relation, path.read_text().splitlines())
    return outputs


def analyze_kept(spec: str, engine: str):
    """``toast.analyze(spec, engine=engine)`` and its engine outputs of both stages (golden form); the rules'
    ``invalid`` rows are left in ``analysis.invalid`` for the caller to report."""
    from toast import analyze

    with tempfile.TemporaryDirectory(prefix="toast-golden-") as keep:
        analysis = analyze(spec, engine=engine, keep=keep, check_invariants=False)
        return analysis, read_kept(Path(keep))


def _shown(path: Path) -> str:
    return path.relative_to(PROJECT_DIR).as_posix() if path.is_relative_to(PROJECT_DIR) else str(path)


def _quoted(rows: list[str]) -> str:
    return ", ".join(repr(r) for r in rows)


def compare(example: str, outputs: Outputs, *, engine: str, root: Path = GOLDEN_DIR) -> list[str]:
    """Every difference between ``outputs`` (``engine``'s, golden form) and the goldens of
    ``example`` under ``root``: one message per golden file that is missing, stray or not
    exactly the text of the engine's rows. Empty when they match."""
    problems = []
    for stage, relations in outputs.items():
        directory = root / example / stage
        expected = {f"{name}.csv" for name in relations}
        present = {p.name for p in directory.iterdir()} if directory.is_dir() else set()
        for stray in sorted(present - expected):
            problems.append(f"{example} / {stage} / {stray}: stray file {_shown(directory / stray)} "
                            f"({stage} has no output relation of that name)")
        for name, rows in relations.items():
            path = directory / f"{name}.csv"
            where = f"{example} / {stage} / {name}.csv"
            if not path.is_file():
                problems.append(f"{where}: golden {_shown(path)} is missing ({engine} derives {len(rows)} rows)")
                continue
            text = path.read_text()
            if text == golden_text(rows):
                continue
            golden = text.split("\n")
            golden = golden[:-1] if golden[-1] == "" else golden
            first = next((k for k, (g, e) in enumerate(zip(golden, rows, strict=False)) if g != e),
                         min(len(golden), len(rows)))
            at = f"row {first + 1}: " + (f"golden {golden[first]!r}" if first < len(golden) else "golden ends")
            at += f", {engine} {rows[first]!r}" if first < len(rows) else f", {engine} ends"
            golden_set, engine_set = set(golden), set(rows)
            only_golden = [g for g in golden if g not in engine_set]
            only_engine = [e for e in rows if e not in golden_set]
            message = (f"{where}: {engine} differs from the golden {_shown(path)} "
                       f"({len(golden)} golden rows, {len(rows)} {engine} rows); first difference at {at}")
            if only_golden:
                more = " ..." if len(only_golden) > 3 else ""
                message += f"; only in the golden: {_quoted(only_golden[:3])}{more}"
            if only_engine:
                message += f"; only in {engine}: {_quoted(only_engine[:3])}" + (" ..." if len(only_engine) > 3 else "")
            if not only_golden and not only_engine:
                message += "; same rows, but not in canonical form (order, duplicates, whitespace or final newline)"
            problems.append(message)
    return problems


def failure_message(example: str, problems: list[str], *, engine: str) -> str:
    """An assertion message for ``compare``'s problems, saying how to regenerate."""
    return "\n".join([
        f"the {engine} engine does not reproduce the Soufflé goldens of '{example}':",
        *(f"  {p}" for p in problems),
        "If the rules, the facts or the example changed on purpose, regenerate the goldens with Soufflé "
        f"(souffle on PATH): `{COMMAND} {example}` (tests/golden/README.md). Never edit a golden by hand "
        "or write one from the embedded engine.",
    ])


def write_golden(example: str, outputs: Outputs, *, root: Path = GOLDEN_DIR) -> int:
    """Replace the goldens of ``example`` under ``root`` by ``outputs``; returns the bytes written."""
    written = 0
    for stage, relations in outputs.items():
        directory = root / example / stage
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.csv"):
            stale.unlink()
        for name, rows in relations.items():
            text = golden_text(rows)
            (directory / f"{name}.csv").write_text(text)
            written += len(text.encode())
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Write Soufflé's outputs of both stages for the bundled examples as the "
                                  "engine goldens under tests/golden/ (Soufflé only; souffle must be on PATH).")
    parser.add_argument("examples", nargs="*", metavar="EXAMPLE",
                        help=f"examples to regenerate (default: all of {', '.join(EXAMPLES)})")
    parser.add_argument("--check", action="store_true",
                        help="compare Soufflé's outputs with the goldens, write nothing; exit 1 on a difference")
    args = parser.parse_args(argv)
    unknown = [e for e in args.examples if e not in EXAMPLES]
    if unknown:
        parser.error(f"no goldens for {', '.join(unknown)} (examples: {', '.join(EXAMPLES)})")

    from toast.datalog.souffle import souffle_binary
    from toast.examples import EXAMPLES as SPECS

    if souffle_binary() is None:
        print(f"{COMMAND}: `souffle` is not on PATH. Goldens are written by Soufflé only, never by the "
              "embedded engine: build Soufflé from https://github.com/souffle-lang/souffle and put its "
              f"bin/ on PATH (e.g. `PATH=/opt/souffle/bin:$PATH {COMMAND}`).", file=sys.stderr)
        return 2
    failed = 0
    for example in args.examples or EXAMPLES:
        analysis, outputs = analyze_kept(SPECS[example], "souffle")
        rows = {stage: sum(len(r) for r in relations.values()) for stage, relations in outputs.items()}
        if args.check:
            problems = compare(example, outputs, engine="souffle")
            failed += bool(problems)
            print(failure_message(example, problems, engine="souffle") if problems else
                  f"{example}: matches ({rows['nda']} + {rows['conflicts']} rows)")
        elif analysis.invalid:
            failed += 1
            print(f"{example}: NOT written: Soufflé derived {len(analysis.invalid)} rows of the invalid "
                  f"invariants (first: {analysis.invalid[0]}); fix the rules first", file=sys.stderr)
        else:
            size = write_golden(example, outputs)
            print(f"{example}: {rows['nda']} nda rows, {rows['conflicts']} conflicts rows, {size} bytes "
                  f"-> {_shown(GOLDEN_DIR / example)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
