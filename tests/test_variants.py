"""Analysis variants, user rule directories, --keep, and the schema's single source."""

from __future__ import annotations

import pytest

from toast import RuleError, ToastError, analyze
from toast.datalog import assemble, load_variant, parse_text
from toast.facts.schema import CONFLICTS, INPUTS, NDA, OUTPUTS, STAGES, schema_dl
from toast.resources import resource_dir

RULES_DIR = resource_dir("rules")
SCHEMA_FILE = RULES_DIR / "schema.dl"

MLP = "toast.examples.mlp:mlp"


def test_schema_dl_is_generated_from_toast_schema():
    assert SCHEMA_FILE.read_text() == schema_dl(), "run: python -m toast.facts > rules/schema.dl"
    assert (RULES_DIR / CONFLICTS.schema_file).read_text() == schema_dl(CONFLICTS), (
        "run: python -m toast.facts conflicts > rules/conflicts/schema.dl")


@pytest.mark.parametrize("stage", list(STAGES.values()), ids=list(STAGES))
def test_rules_declare_each_relation_once_with_the_schema_arity(stage):
    assembled = assemble(load_variant("default"), stage=stage)
    program = parse_text(assembled.text, path=str(RULES_DIR / "program.dl"))
    assert NDA.inputs == INPUTS and NDA.outputs == OUTPUTS
    for relation in stage.inputs:
        assert relation.name in program.inputs
    for relation in stage.outputs:
        assert relation.name in program.outputs, relation.name
        assert program.relations[relation.name].arity == relation.arity
    # Every relation declared has a doc comment for users reading the rules.
    undocumented = [name for name, decl in program.relations.items() if not decl.doc.strip()]
    assert undocumented == []


def test_variants_extend_the_default():
    default, no_box, no_layers = (load_variant(n) for n in ("default", "no_box", "no_layers"))
    assert no_box.rules == default.rules and no_layers.rules == default.rules
    assert "conflicts/boxes.dl" in default.conflict_rules and "conflicts/boxes.dl" not in no_box.conflict_rules
    assert default.layer_heuristic and no_box.layer_heuristic and not no_layers.layer_heuristic
    assert no_box.name == "no_box" and no_box.description != default.description


def test_variant_extending_itself(tmp_path):
    loop = tmp_path / "loop.toml"
    loop.write_text(f'extends = "{loop}"\nrules = ["nda.dl"]\n')
    with pytest.raises(RuleError, match="loop.toml: variant extends itself"):
        load_variant(str(loop))


def test_user_conflict_rules_go_to_the_conflicts_stage(tmp_path):
    """A user file under conflicts/ extends the conflicts stage: here an extra invariant that
    fires on the attention's conflicts, and shows up in Analysis.invalid."""
    rules = tmp_path / "rules"
    (rules / "conflicts").mkdir(parents=True)
    (rules / "conflicts" / "mine.dl").write_text(
        'invalid("mine", __FILE__, __LINE__, cat("value ", to_string(V))) :- conflict_def(_, _, V, _, _).\n')
    analysis = analyze("toast.examples.attention:attention", engine="embedded", rules=rules, check_invariants=False)
    assert {(i.check, i.line) for i in analysis.invalid} == {("mine", 1)}
    assert len(analysis.invalid) == 3  # the conflicts on the definitions of a, c and d


def test_user_rules_extend_and_override(tmp_path):
    base = analyze(MLP, engine="embedded")
    assert len(base.colors) == 4
    rules = tmp_path / "rules"
    (rules / "ops").mkdir(parents=True)
    # Override: an elementwise table without maximum, so relu no longer maps its dims ...
    elementwise = (RULES_DIR / "ops/elementwise.dl").read_text()
    (rules / "ops/elementwise.dl").write_text(elementwise.replace('elementwise_kind("stablehlo.maximum").\n', ""))
    overridden = analyze(MLP, engine="embedded", rules=rules)
    assert [u.kind for u in overridden.unruled_ops] == ["stablehlo.maximum"]
    assert len(overridden.colors) > 4
    # ... and extend: a rule of one's own for it, in a new file, makes the 4 colors again.
    (rules / "maximum.dl").write_text(
        'ruled_kind("stablehlo.maximum").\n'
        "ident(A, B, Op, __FILE__, __LINE__) :-\n"
        '    op(Op, "stablehlo.maximum"), out_dim(Op, 0, Dim, A, Size), in_dim(Op, _, Dim, B, Size).\n'
    )
    extended = analyze(MLP, engine="embedded", rules=rules)
    assert extended.unruled_ops == ()
    assert [c.dims for c in extended.colors] == [c.dims for c in base.colors]
    assert any(i.file == str((rules / "maximum.dl").resolve()) and i.line == 2 for i in extended.identities)


def test_keep_holds_facts_program_and_outputs(tmp_path):
    keep = tmp_path / "keep"
    analysis = analyze(MLP, engine="embedded", keep=keep)
    assert (keep / "program.dl").read_text().count("#include") == 1 + len(load_variant().rules)
    assert (keep / "facts" / "def_dim.facts").read_text().count("\n") == analysis.stats["definition_dims"]
    assert (keep / "out" / "ident.csv").read_text().count("\n") == analysis.stats["identities"]
    assert "conflicts/boxes.dl" in (keep / "conflicts" / "program.dl").read_text()
    assert (keep / "conflicts" / "out" / "conflict_def.csv").is_file()


def test_unknown_variant_and_malformed_variant(tmp_path):
    with pytest.raises(ToastError, match="unknown analysis variant 'nope' .*default"):
        load_variant("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\nrules = 3\n")
    with pytest.raises(RuleError, match="bad.toml: variant needs 'rules'"):
        load_variant(str(bad))


def test_variant_with_missing_rule_file(tmp_path):
    variant = tmp_path / "v.toml"
    variant.write_text('name = "v"\nrules = ["nda.dl", "ops/nope.dl"]\n')
    with pytest.raises(RuleError, match="ops/nope.dl: rule file of variant 'v' is missing"):
        assemble(load_variant(str(variant)))


ATTENTION = "toast.examples.attention:attention"


def test_analyze_sets_variants_side_by_side(capsys):
    """``toast analyze --variant default --variant no_box``: one table, a column per variant in the order given,
    each cell the count a single-variant analysis gives. Without box compatibility attention's boxes are gone
    (0) and each of its compatibility sets is a bit of its own."""
    from toast.cli import main

    assert main(["analyze", ATTENTION, "--engine", "embedded", "--variant", "default", "--variant", "no_box"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "| | default | no_box |"
    cells = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")[1:] for line in lines[3:]}
    for column, variant in enumerate(("default", "no_box")):
        stats = analyze(ATTENTION, engine="embedded", variant=variant).stats
        for key, label in (("colors", "colors"), ("resolution_bits", "resolution bits"), ("boxes", "boxes"),
                           ("unruled_ops", "unruled ops")):
            assert cells[label][column] == str(stats[key]), (variant, label)
    assert cells["boxes"][1] == "0" and cells["resolution bits"][1] == cells["compatibility sets"][1]


@pytest.mark.parametrize("argv, message", [
    (["cost", MLP, "--hardware", "h100", "--variant", "default", "--variant", "no_box"],
     "--variant given 2 times: `toast cost` takes one"),
    (["analyze", MLP, "--variant", "no_box", "--variant", "no_box"], "--variant no_box given twice"),
    (["analyze", MLP, "--variant", "default", "--variant", "no_box", "--json", "x.json"],
     "--json writes one analysis: give one --variant with it"),
    (["analyze", MLP, "--variant", "default", "--variant", "nope"], "nope"),
])
def test_several_variants_only_where_they_can_be_compared(argv, message, capsys):
    from toast.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
