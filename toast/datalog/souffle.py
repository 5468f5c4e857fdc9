"""Run the rule program on Soufflé through a subprocess.

Facts go to tab-separated ``<relation>.facts`` files, results come back from
``<relation>.csv`` files, all in a working directory the caller owns (``--keep`` keeps it).
Compile mode (the default) builds a native binary with ``souffle -o`` once per distinct
program text and caches it under ``$XDG_CACHE_HOME/toast/souffle/<sha256>``; interpreter
mode runs ``souffle -F facts -D out``.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from toast.datalog.preprocess import preprocess_text
from toast.errors import EngineError, RuleError

if TYPE_CHECKING:
    import numpy as np

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
        if not lines:
            results[name] = []
            continue
        width = len(numeric)
        tabs = set(map(_TABS, lines))
        if tabs != {width - 1}:
            first = next(line.count("\t") for line in lines if line.count("\t") != width - 1)  # the first bad row's
            raise EngineError(f"{path}: row of {first + 1} columns, expected {width}")
        # Every row has every column: the fields in one split, each column a slice of them, converted in C loops
        # (a million rows; a split per line took most of the time).
        table = _integer_table(lines, width) if all(numeric) else None
        if table is not None:
            columns = [table[:, k].tolist() for k in range(width)]
        else:
            fields = "\t".join(lines).split("\t")
            columns = [list(map(int, fields[k::width])) if is_number else fields[k::width]
                       for k, is_number in enumerate(numeric)]
        results[name] = sorted(zip(*columns, strict=True))
    return results


_TABS = operator.methodcaller("count", "\t")


def _integer_table(lines: list[str], width: int) -> np.ndarray | None:
    """``int64[len(lines), width]``: rows of ``width`` tab-separated integers, parsed in one C loop; ``None`` where
    a field is anything else or outside int64 (``int`` then reads the fields one by one, and says which)."""
    # Imported here: importing numpy starts its BLAS threads, which take signals this module's importers time
    # with (``engine._time_limit``); the reading of outputs needs it, not the import.
    import numpy as np

    int64 = np.iinfo(np.int64)
    try:
        numbers = np.fromstring("\n".join(lines), dtype=np.int64, sep="\t")
    except ValueError:
        return None
    if len(numbers) != len(lines) * width or numbers.max() == int64.max or numbers.min() == int64.min:
        return None  # an empty field, or a number numpy clipped to int64
    return numbers.reshape(len(lines), width)


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
    program counts towards ``timeout_s``; the compile itself has ``COMPILE_TIMEOUT_S``.

    Soufflé's preprocessed program (0.2 CPU s for the default rules, on every run) is asked once per distinct
    sources (``_sources_key``: the souffle executable, the program text and the text of every file it includes);
    ``keys/<key>`` keeps the digest it gave."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "toast" / "souffle"
    key = _sources_key(souffle, program_file)
    known = cache / "keys" / key if key else None
    digest = ""
    if known is not None:
        digest = _read_key(known)
    # A digest as this function writes it (24 hex digits), never a path out of the cache.
    if re.fullmatch(r"[0-9a-f]{24}", digest) and (cache / digest / "program").is_file():
        return cache / digest / "program"
    preprocessed = _run([souffle, "--show=transformed-datalog", str(program_file)], what="souffle",
                        timeout_s=timeout_s, cwd=workdir, sources=included_files(program_file))
    digest = hashlib.sha256((souffle + "\0" + preprocessed).encode()).hexdigest()[:24]
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
    if known is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written: asked again next time
            known.parent.mkdir(parents=True, exist_ok=True)
            partial = known.with_name(f"{known.name}.tmp{os.getpid()}")
            partial.write_text(digest)
            os.replace(partial, known)
    return binary


def _read_key(path: Path) -> str:
    """A key file's digest: at most its first 64 bytes, never through a link (a planted one could name a device
    that never ends); ``""`` where it cannot be read so."""
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return ""
    try:
        return os.read(handle, 64).decode("ascii", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(handle)


def _sources_key(souffle: str, program_file: Path) -> str:
    """A digest of all Soufflé's preprocessed program depends on: the souffle executable (path, size, modification
    time), the program text and ``(path, text)`` of every file it includes, as toast's preprocessor finds them
    (the analysis cache's key holds the same); ``""`` where they cannot be read (Soufflé is then asked)."""
    try:
        text = program_file.read_text()
        files = preprocess_text(text, program_file).files
        stat = os.stat(souffle)
    except (RuleError, OSError, UnicodeDecodeError):
        return ""
    digest = hashlib.sha256()
    for part in (souffle, f"{stat.st_size}:{stat.st_mtime_ns}", text, *(f"{path}\0{body}" for path, body in files)):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0\0")
    return digest.hexdigest()[:32]


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
