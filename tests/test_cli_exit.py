"""The ``toast`` command ends at once once its work is done (``toast.cli.run``, ``toast.processes.exit_at_once``):
what it prints and writes must be the same as ``main``'s in a process that goes on, its exit status kept, and no
temporary file left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from toast.cli import main

MLP = "toast.examples.mlp:mlp"
AUTOSHARD = ["autoshard", MLP, "--mesh", "batch=2,model=2", "--rollouts", "30", "--seed", "3", "--engine",
             "embedded", "--no-cache"]


def _toast(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m toast ARGS`` with its output piped (fully buffered: only a flush gets it out) and its own empty
    temporary folder."""
    temporary = tmp_path / "tmp"
    temporary.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    env.update(TMPDIR=str(temporary), TOAST_NO_CACHE="1")
    return subprocess.run([sys.executable, "-m", "toast", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def _timeless(text: str) -> str:
    """``text`` without the search's seconds (``... costed, 0.1 s, seed 3``)."""
    return re.sub(r"[0-9.]+ s, seed", "_ s, seed", text)


def test_the_command_prints_and_writes_what_main_does(tmp_path, capsys, monkeypatch):
    """Two workers (a forked pool) and a strategy file: the command's output and file equal ``main``'s, byte for
    byte, and its temporary folder is empty after it."""
    done = _toast([*AUTOSHARD, "--workers", "2", "-o", "command.json"], tmp_path)
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOAST_NO_CACHE", "1")
    assert main([*AUTOSHARD, "--workers", "2", "-o", "main.json"]) == 0
    printed = capsys.readouterr().out
    assert _timeless(done.stdout.replace("command.json", "main.json")) == _timeless(printed)
    assert printed.count("\n") > 10  # the comparison table, to its last row
    command_file = json.loads((tmp_path / "command.json").read_text())
    main_file = json.loads((tmp_path / "main.json").read_text())
    for key in ("actions", "state", "arguments", "results", "collectives", "cost"):  # not the search's seconds
        assert command_file[key] == main_file[key], key
    assert list((tmp_path / "tmp").iterdir()) == []


def test_the_command_keeps_its_exit_status_and_error_line(tmp_path):
    done = _toast(["autoshard", "missing.mlir", "--mesh", "batch=2"], tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("toast: error: missing.mlir")
