"""Options and output paths are checked before any work: one line on stderr, exit 2, no file written.

What must hold: a number that is NaN, infinite, out of range or of the wrong kind is refused by the option
that takes it; a mesh size in digits that are not ASCII, or past any machine, is one line; every output path
is tried (its temporary name too, which is longer) before the analysis; a sweep's report may not be its own
folder, and a sweep whose folder cannot be made, or whose Ray cluster cannot be reached, writes nothing.
"""

from __future__ import annotations

import pytest

from toast.cli import main

MLP = "toast.examples.mlp:mlp"
SEARCH = ["--mesh", "batch=4,model=2", "--engine", "embedded", "--workers", "1", "--rollouts", "10"]


def _one_line(capsys, message: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err


@pytest.mark.parametrize("command", ["autoshard", "compare"])
@pytest.mark.parametrize("extra, message", [
    (["--memory", "nan"], "argument --memory: 'nan': give the memory per device in GiB"),
    (["--memory", "inf"], "argument --memory: 'inf'"),
    (["--memory", "1e300"], "argument --memory: '1e300'"),
    (["--memory", "lots"], "argument --memory: 'lots' is not a number"),
    (["--budget", "nan"], "argument --budget: 'nan': give a finite number of seconds above 0"),
    (["--budget=-inf"], "argument --budget: '-inf'"),
    (["--seed", "-1"], "argument --seed: -1: give a seed from 0 to 2**63 - 1"),
    (["--seed", "99999999999999999999999"], "argument --seed: 99999999999999999999999: give a seed"),
    (["--seed", "1.5"], "argument --seed: '1.5' is not a whole number"),
    (["--workers", "two"], "argument --workers: 'two' is not a whole number"),
    (["--microbatches", "0"], "argument --microbatches: 0: give 1 or more micro-batches per step"),
    (["--mesh", "batch=99999999999999999999999"], "--mesh batch=99999999999999999999999: axis 'batch' of "
     "99999999999999999999999 devices; at most 16,777,216 in all"),
    (["--mesh", "batch=4096,model=8192"], "--mesh batch=4096,model=8192: 33,554,432 devices; at most 16,777,216"),
    (["--mesh", "batch=²"], "--mesh batch=²: expected NAME=SIZE[,NAME=SIZE...]"),
    (["--pin", "x=batch,", "--pin", "x=model,"], "--pin: argument 'x' is pinned twice; pin each argument once"),
    (["--pin", "x=batch,;x=model,"], "--pin: argument 'x' is pinned twice"),
    (["--pin", "x=batch+batch,"], "pin 'x': mesh axis 'batch' appears twice; an axis splits at most one dim"),
    (["--pin", "x=batch,batch"], "pin 'x': mesh axis 'batch' appears twice"),
])
def test_bad_numbers_are_refused_before_the_work(command, extra, message, tmp_path, capsys):
    out = tmp_path / "out.json"
    output = ["-o", str(out)] if command == "autoshard" else ["--json", str(out)]
    assert main([command, MLP, *SEARCH, *extra, *output]) == 2
    _one_line(capsys, message)
    assert not out.exists()


@pytest.mark.parametrize("option", ["--timeout", "--budget"])
def test_engine_and_search_seconds_must_be_finite(option, capsys):
    assert main(["autoshard", MLP, *SEARCH[:2], option, "inf"]) == 2
    _one_line(capsys, f"argument {option}: 'inf': give a finite number of seconds above 0")


def test_a_name_too_long_for_the_temporary_file_is_refused_before_the_search(tmp_path, capsys):
    # 250 characters fit a file name (255) but not the temporary name the file is written under first.
    out = tmp_path / ("a" * 245 + ".json")
    assert main(["autoshard", MLP, *SEARCH, "-o", str(out)]) == 2
    _one_line(capsys, "cannot write in")
    assert list(tmp_path.iterdir()) == []  # not the file, nor a trial of its temporary


@pytest.mark.parametrize("second", ["--report", "--emit"])
def test_two_outputs_on_one_path_are_refused_before_the_search(second, tmp_path, capsys):
    out = tmp_path / "same.json"
    assert main(["autoshard", MLP, *SEARCH, "-o", str(out), second, str(out)]) == 2
    _one_line(capsys, f"-o and {second} both name {out}: give each output its own file")
    assert list(tmp_path.iterdir()) == []


def test_a_name_too_long_for_any_file_is_one_line(tmp_path, capsys):
    out = tmp_path / ("b" * 300 + ".json")
    assert main(["autoshard", MLP, *SEARCH, "-o", str(out)]) == 2
    _one_line(capsys, "File name too long")


SWEEP = '[sweep]\nmodels = ["mlp"]\nmeshes = ["batch=4,model=2"]\nrollouts = 10\n'


def test_a_sweep_report_that_is_the_sweep_folder_is_refused_before_the_jobs(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(SWEEP)
    out = tmp_path / "out"
    assert main(["sweep", str(tmp_path / "s.toml"), "-o", str(out), "--report", str(out)]) == 2
    _one_line(capsys, "is the sweep's folder (-o): give the report its own file")
    assert not out.exists()


@pytest.mark.parametrize("folder, message", [("a_file", "cannot make the sweep's folder: Not a directory"),
                                             ("/proc/toast_sweep", "cannot make the sweep's folder")])
def test_a_sweep_folder_that_cannot_be_made_is_one_line(folder, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SWEEP)
    (tmp_path / "a_file").write_text("")
    assert main(["sweep", "s.toml", "-o", f"{folder}/out"]) == 2
    _one_line(capsys, message)


def test_a_sweep_without_a_ray_cluster_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray", reason="Ray is not installed (pip install ray; .ci/run installs it)")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))  # where Ray looks for a running cluster: none
    (tmp_path / "s.toml").write_text(SWEEP)
    assert main(["sweep", str(tmp_path / "s.toml"), "-o", str(tmp_path / "out"), "--ray"]) == 2
    _one_line(capsys, "--ray auto: cannot connect to a Ray cluster")
    assert not (tmp_path / "out").exists()
