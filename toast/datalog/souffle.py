"""Run the rule program on Soufflé through a subprocess.

Facts go to tab-separated ``<relation>.facts`` files, results come back from
``<relation>.csv`` files, all in a working directory the caller owns (``--keep`` keeps it).
Compile mode (the default) builds a native binary with ``souffle -o`` once per distinct
program text and caches it under ``$XDG_CACHE_HOME/toast/souffle/<sha256>``; interpreter
mode runs ``souffle -F facts -D out``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from toast.errors import EngineError

# Soufflé's one-time compile of a rule program to C++ and a binary: not part of ``--timeout``,
# which limits the run.
COMPILE_TIMEOUT_S = 1800.0

INSTALL_HINT = (
    "install Soufflé (https://souffle-lang.github.io/install, e.g. build it from "
    "github.com/souffle-lang/souffle) so that `souffle` is on PATH, or use --engine embedded"
)


def souffle_binary() -> str | None:
    """Path of the ``souffle`` executable on PATH, or ``None``."""
    return shutil.which("souffle")


def write_relations(relations: Mapping[str, Sequence[tuple]], directory: Path, *, suffix: str) -> None:
    """Write each relation as ``directory/<name><suffix>`` (tab-separated, one row a line),
    the format Soufflé reads (``.facts``) and writes (``.csv``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in relations.items():
        # One %-format per row (what str() writes of each field), the text joined whole: a 100k-op program's
        # million rows in a third of the time of a join per row.
        line = "\t".join(["%s"] * len(rows[0])) + "\n" if rows else ""
        try:
            if not all(type(row) is tuple for row in rows):  # % reads a tuple's items, another row as one
                raise TypeError
            text = "".join(map(line.__mod__, rows))
        except TypeError:  # rows not tuples, or of other lengths
            text = "".join("\t".join(map(str, row)) + "\n" for row in rows)
        with open(directory / f"{name}{suffix}", "w") as out:
            out.write(text)


def read_outputs(directory: Path, types: Mapping[str, Sequence[str]]) -> dict[str, list[tuple]]:
    """Read ``directory/<name>.csv`` for each output, converting columns by their types."""
    results: dict[str, list[tuple]] = {}
    for name, column_types in types.items():
        path = directory / f"{name}.csv"
        if not path.is_file():
            raise EngineError(f"souffle wrote no output for relation '{name}' ({path})")
        numeric = [t in ("number", "unsigned") for t in column_types]
        with open(path) as file:
            lines = file.read().split("\n")
        if lines[-1] == "":  # the last row's newline
            lines.pop()
        split = [line.split("\t") for line in lines]
        widths = set(map(len, split))
        if widths - {len(numeric)}:
            width = min(widths - {len(numeric)}, key=[len(fields) for fields in split].index)  # the first row's
            raise EngineError(f"{path}: row of {width} columns, expected {len(numeric)}")
        if not split:
            results[name] = []
            continue
        # Column by column (every row has them all): a million rows converted in C loops, not a call per field.
        columns = [list(map(int, column)) if is_number else list(column)
                   for column, is_number in zip(zip(*split, strict=True), numeric, strict=True)]
        results[name] = sorted(zip(*columns, strict=True))
    return results


def run_souffle(
    program_file: Path,
    facts: Mapping[str, Sequence[tuple]],
    output_types: Mapping[str, Sequence[str]],
    *,
    workdir: Path,
    compiled: bool = True,
    timeout_s: float = 600.0,
    jobs: int = 1,
) -> dict[str, list[tuple]]:
    """Evaluate ``program_file`` on ``facts``; return the ``output_types`` relations, sorted.

    Raises:
      EngineError: Soufflé missing, failing (with its stderr) or past ``timeout_s``.
    """
    souffle = souffle_binary()
    if souffle is None:
        raise EngineError(f"--engine souffle: `souffle` is not on PATH; {INSTALL_HINT}")
    facts_dir, out_dir = workdir / "facts", workdir / "out"
    write_relations(facts, facts_dir, suffix=".facts")
    out_dir.mkdir(parents=True, exist_ok=True)
    run_args = ["-F", str(facts_dir), "-D", str(out_dir), "-j", str(jobs)]
    if compiled:
        binary = _compiled_binary(souffle, program_file, workdir=workdir, timeout_s=timeout_s)
        command = [str(binary), *run_args]
    else:
        command = [souffle, *run_args, str(program_file)]
    _run(command, what="souffle", timeout_s=timeout_s, cwd=workdir, sources=included_files(program_file))
    return read_outputs(out_dir, output_types)


def _compiled_binary(souffle: str, program_file: Path, *, workdir: Path, timeout_s: float) -> Path:
    """Compile once per distinct (souffle, preprocessed program) and reuse the binary. Reading the
    program counts towards ``timeout_s``; the compile itself has ``COMPILE_TIMEOUT_S``."""
    preprocessed = _run([souffle, "--show=transformed-datalog", str(program_file)], what="souffle",
                        timeout_s=timeout_s, cwd=workdir, sources=included_files(program_file))
    digest = hashlib.sha256((souffle + "\0" + preprocessed).encode()).hexdigest()[:24]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "toast" / "souffle"
    binary = cache / digest / "program"
    if not binary.is_file():
        build = cache / f"{digest}.tmp{os.getpid()}"
        build.mkdir(parents=True, exist_ok=True)
        # The one-time compile is slow (about a minute): say so, and where the binary is kept.
        print(f"toast: compiling the rule program with Soufflé (once per rule set; cached in {cache / digest})",
              file=sys.stderr, flush=True)
        _run([souffle, "-o", str(build / "program"), str(program_file)], what="souffle compile",
             timeout_s=COMPILE_TIMEOUT_S, cwd=build)
        if not (build / "program").is_file():
            raise EngineError(f"souffle compile wrote no binary ({build / 'program'})")
        (cache / digest).mkdir(parents=True, exist_ok=True)
        os.replace(build / "program", binary)
        shutil.rmtree(build, ignore_errors=True)
    return binary


def _run(command: list[str], *, what: str, timeout_s: float, cwd: Path, sources: Sequence[Path] = ()) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise EngineError(f"{what} timed out after {timeout_s:g} s ({' '.join(command[:2])} ...)") from None
    except OSError as err:
        raise EngineError(f"{what}: cannot run {command[0]}: {err.strerror}") from None
    if done.returncode != 0 or "Error:" in done.stderr:
        lines = [line.strip() for line in done.stderr.strip().splitlines() if line.strip()]
        raise EngineError(_error_line(what, lines, sources) if lines else f"{what} failed: exit {done.returncode}")
    return done.stdout


_WHERE = re.compile(r"^Error: (?P<message>.*) in file (?P<file>\S+) at line (?P<line>\d+)$")


def _error_line(what: str, lines: Sequence[str], sources: Sequence[Path]) -> str:
    """One line for Soufflé's error output: ``path:line: message`` when Soufflé names a file,
    which it does by base name only, resolved against the files the program includes (the
    user's override of a package file, not the package file), else its first lines."""
    found = _WHERE.match(lines[0])
    if found:
        matches = [s for s in sources if s.name == found["file"]]
        where = str(matches[0]) if len(matches) == 1 else found["file"]
        return f"{where}:{found['line']}: {found['message']} (souffle)"
    return f"{what} failed: {' | '.join(lines[:3])}"


def included_files(program_file: Path) -> list[Path]:
    """The files an assembled program ``#include``s (``templates/program.dl.j2`` writes one
    absolute path per line)."""
    return [Path(m.group(1)) for m in re.finditer(r'^#include "([^"]+)"$', program_file.read_text(), re.M)]
