"""Engine goldens: both engines reproduce Soufflé's committed outputs of both stages exactly.

``tests/golden/<example>/<stage>/<relation>.csv`` hold Soufflé's outputs for the bundled
examples, written by ``python tests/golden/regenerate.py`` (Soufflé only; tests/golden/README.md).
The default run checks the embedded engine against them, so CI, which has no Soufflé, still
checks that the two engines agree; with ``souffle`` on PATH, Soufflé is checked against the
same files. The comparison is exact on every file's text, so a hand-edited golden fails.
"""

from __future__ import annotations

import shutil

import pytest
from conftest import SOUFFLE_MISSING, goldens, kept_analysis_of

from toast.datalog.souffle import souffle_binary
from toast.examples import EXAMPLES
from toast.facts.schema import STAGES


def _check(example: str, engine: str) -> None:
    _, outputs = kept_analysis_of(EXAMPLES[example], engine)
    problems = goldens.compare(example, outputs, engine=engine)
    assert not problems, goldens.failure_message(example, problems, engine=engine)


@pytest.mark.parametrize("example", goldens.EXAMPLES)
def test_embedded_engine_reproduces_the_souffle_goldens(example):
    _check(example, "embedded")


@pytest.mark.souffle
@pytest.mark.skipif(souffle_binary() is None, reason=SOUFFLE_MISSING)
@pytest.mark.parametrize("example", goldens.EXAMPLES)
def test_souffle_reproduces_its_goldens(example):
    _check(example, "souffle")


def test_goldens_cover_the_bundled_examples_and_every_output_relation():
    assert set(goldens.EXAMPLES) <= set(EXAMPLES)
    examples = {p.name for p in goldens.GOLDEN_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert examples == set(goldens.EXAMPLES), "golden folders without an example, or examples without goldens"
    for example in goldens.EXAMPLES:
        assert {p.name for p in (goldens.GOLDEN_DIR / example).iterdir()} == set(STAGES), example
        for stage in goldens.KEPT_OUTPUTS:
            files = {p.name for p in (goldens.GOLDEN_DIR / example / stage).iterdir()}
            assert files == {f"{r.name}.csv" for r in STAGES[stage].outputs}, (example, stage)


def test_goldens_are_canonical_and_hold_no_invariant_violations():
    """Sorted typed rows, rule files relative to the project, an empty ``invalid`` relation."""
    for example in goldens.EXAMPLES:
        for stage in goldens.KEPT_OUTPUTS:
            for relation in STAGES[stage].outputs:
                text = (goldens.GOLDEN_DIR / example / stage / f"{relation.name}.csv").read_text()
                rows = text.splitlines()
                assert goldens.golden_text(goldens.canonical_rows(relation, rows)) == text, (example, relation.name)
                if relation.name == "invalid":
                    assert rows == [], (example, relation.name)
    ident = (goldens.GOLDEN_DIR / "mlp" / "nda" / "ident.csv").read_text().splitlines()
    assert ident and all(row.split("\t")[3].startswith("rules/ops/") for row in ident)


# --- the checker itself: a hand edit of a real golden is reported --------------------------

def _change_a_row(rows):
    fields = rows[len(rows) // 2].split("\t")
    fields[-1] = str(int(fields[-1]) + 1)
    edited = "\t".join(fields)
    return goldens.golden_text(rows[:len(rows) // 2] + [edited] + rows[len(rows) // 2 + 1:]), \
        f"only in the golden: {edited!r}"


# Hand edits of a golden's rows: the edited text, and a part of the report it must give.
EDITS = {
    "change a row": _change_a_row,
    "drop a row": lambda rows: (goldens.golden_text(rows[:-1]), f"only in embedded: {rows[-1]!r}"),
    "duplicate a row": lambda rows: (goldens.golden_text(rows + rows[-1:]), "not in canonical form"),
    "reorder rows": lambda rows: (goldens.golden_text(rows[::-1]), "first difference at row 1"),
    "drop the final newline": lambda rows: (goldens.golden_text(rows)[:-1], "not in canonical form"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_hand_edited_golden_fails(tmp_path, edit):
    shutil.copytree(goldens.GOLDEN_DIR / "attention", tmp_path / "attention")
    _, outputs = kept_analysis_of(EXAMPLES["attention"], "embedded")
    assert goldens.compare("attention", outputs, engine="embedded", root=tmp_path) == []

    path = tmp_path / "attention" / "conflicts" / "box.csv"
    rows = path.read_text().splitlines()
    assert len(rows) > 2
    edited, reported = EDITS[edit](rows)
    path.write_text(edited)
    problems = goldens.compare("attention", outputs, engine="embedded", root=tmp_path)
    assert len(problems) == 1, problems
    assert problems[0].startswith("attention / conflicts / box.csv: embedded differs from the golden")
    assert reported in problems[0], problems[0]
    message = goldens.failure_message("attention", problems, engine="embedded")
    assert "python tests/golden/regenerate.py attention" in message


def test_a_missing_or_stray_golden_fails(tmp_path):
    shutil.copytree(goldens.GOLDEN_DIR / "mlp", tmp_path / "mlp")
    _, outputs = kept_analysis_of(EXAMPLES["mlp"], "embedded")
    (tmp_path / "mlp" / "nda" / "m_edge.csv").unlink()
    (tmp_path / "mlp" / "conflicts" / "extra.csv").write_text("")
    problems = goldens.compare("mlp", outputs, engine="embedded", root=tmp_path)
    assert len(problems) == 2, problems
    assert any(p.startswith("mlp / nda / m_edge.csv: golden") and "is missing" in p for p in problems)
    assert any(p.startswith("mlp / conflicts / extra.csv: stray file") for p in problems)
