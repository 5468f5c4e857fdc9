"""A syntax error in a user's ``--rules`` file that overrides a package file is reported at the
user's file and line, on both engines (issue 11)."""

from __future__ import annotations

import pytest
from conftest import engines

from toast.cli import main
from toast.resources import resource_dir


@pytest.mark.parametrize("engine", engines())
def test_error_in_an_overriding_rule_file_names_the_users_file(engine, tmp_path, capsys):
    user = tmp_path / "rules"
    (user / "ops").mkdir(parents=True)
    lines = (resource_dir("rules") / "ops" / "shape.dl").read_text().splitlines()
    lines[6] = "this is not datalog (("
    (user / "ops" / "shape.dl").write_text("\n".join(lines) + "\n")
    assert main(["analyze", "toast.examples.mlp:mlp", "--engine", engine, "--rules", str(user)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("toast: compiling")]
    assert len(err) == 1 and err[0].startswith(f"toast: error: {user / 'ops' / 'shape.dl'}:7: "), err
