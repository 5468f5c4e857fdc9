"""Output files are written whole, all of a command's or none, with the usual file mode; a bad
output path is one error line naming the option, before any analysis."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from toast.cli import main
from toast.errors import ToastError
from toast.output.files import Output, check_output, write_outputs


def test_outputs_get_the_usual_file_mode(tmp_path):
    mask = os.umask(0o022)
    try:
        target = tmp_path / "out.json"
        write_outputs([Output("-o", target, "{}\n")])
        assert target.read_text() == "{}\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind
    finally:
        os.umask(mask)


def test_one_unwritable_output_writes_none(tmp_path):
    good = tmp_path / "s.json"
    with pytest.raises(ToastError, match=r"^--emit /proc/toast-test\.mlir: cannot write"):
        write_outputs([Output("-o", good, "{}\n"), Output("--emit", Path("/proc/toast-test.mlir"), "x")])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d, "is a directory"),
    (lambda d: d / "missing" / "out.json", "does not exist"),
])
def test_bad_output_paths_are_refused_before_work(tmp_path, make, message):
    with pytest.raises(ToastError, match=message):
        check_output(make(tmp_path), option="--json")


def _fail_if_analyzed(*_args, **_kwargs):
    raise AssertionError("the analysis ran before the output paths were checked")


@pytest.mark.parametrize(("argv", "option"), [
    (["analyze", "toast.examples.mlp:mlp", "--json", "{dir}"], "--json"),
    (["graph", "toast.examples.mlp:mlp", "--color", "0", "-o", "{dir}/no/such/g.dot"], "-o"),
    (["shard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "-o", "{dir}/s.json",
      "--emit", "{dir}/nonexistent/s.mlir"], "--emit"),
    (["shard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "-o", "{dir}"], "-o"),
])
def test_cli_checks_every_output_first_and_writes_none(tmp_path, capsys, monkeypatch, argv, option):
    monkeypatch.setattr("toast.analysis.named_dimensions.analyze", _fail_if_analyzed)
    assert main([a.replace("{dir}", str(tmp_path)) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"toast: error: {option} "), lines
    assert list(tmp_path.iterdir()) == []


def test_shard_writes_both_files_together(tmp_path, capsys):
    strategy, emitted = tmp_path / "s.json", tmp_path / "s.mlir"
    assert main(["shard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "-o", str(strategy), "--emit", str(emitted)]) == 0
    assert strategy.read_text().startswith("{") and "sdy.mesh" in emitted.read_text()
