"""Run an assembled rule program on one of the two engines.

Both stages of the analysis (the named-dimension analysis, then conflicts) go through
``evaluate``: it writes the program to a working directory, runs Soufflé (subprocess) or the
embedded engine on the facts, checks the outputs' names and arity against ``toast.facts.schema``,
and on request keeps the program, facts and outputs for a user to rerun by hand.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from toast.datalog.souffle import run_souffle, souffle_binary, write_relations
from toast.datalog.variants import PROGRAM_NAME
from toast.errors import EngineError, ToastError
from toast.facts.schema import Relation, check_rows

EngineName = Literal["auto", "souffle", "embedded"]


def pick_engine(engine: EngineName) -> Literal["souffle", "embedded"]:
    """Resolve ``auto`` (Soufflé when on PATH) and validate the name."""
    if engine == "auto":
        return "souffle" if souffle_binary() else "embedded"
    if engine not in ("souffle", "embedded"):
        raise ToastError(f"unknown engine '{engine}' (choose auto, souffle or embedded)")
    return engine


def evaluate(text: str, facts: dict[str, list[tuple]], outputs: Sequence[Relation], *,
             engine: Literal["souffle", "embedded"], keep: Path | None = None,
             timeout_s: float = 600.0) -> dict[str, list[tuple]]:
    """Evaluate program ``text`` on ``facts``; return the ``outputs`` relations (rows sorted).

    Args:
      text: the assembled program (``#include``s with absolute paths).
      facts: rows per input relation.
      outputs: the output relations to read back (from ``toast.facts.schema``).
      engine: ``souffle`` or ``embedded`` (see ``pick_engine``).
      keep: directory to move ``program.dl``, ``facts/`` and ``out/`` into.
      timeout_s: limit for the engine's run, in seconds (Soufflé's one-time compile of a program
        has its own limit, ``souffle.COMPILE_TIMEOUT_S``).
    """
    output_types = {r.name: list(r.bases) for r in outputs}
    workdir = Path(tempfile.mkdtemp(prefix="toast-"))
    try:
        program_file = workdir / PROGRAM_NAME
        program_file.write_text(text)
        if engine == "souffle":
            results = run_souffle(program_file, facts, output_types, workdir=workdir, timeout_s=timeout_s)
        else:
            from toast.datalog import run_embedded_file

            with _time_limit(timeout_s, what="the embedded engine"):
                results = run_embedded_file(program_file, facts, list(output_types))
            if keep is not None:
                write_relations(facts, workdir / "facts", suffix=".facts")
                write_relations(results, workdir / "out", suffix=".csv")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for item in workdir.iterdir():
                target = keep / item.name
                if target.is_dir():
                    shutil.rmtree(target)
                shutil.move(str(item), target)
        return {name: sorted(check_rows(name, rows)) for name, rows in results.items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _TimeUp(BaseException):
    """Raised by the alarm inside a run that outlasts its limit. A ``BaseException``, like
    ``KeyboardInterrupt``, so that the engine's own ``except Exception`` does not take it."""


@contextlib.contextmanager
def _time_limit(seconds: float, *, what: str) -> Iterator[None]:
    """Stop the block after ``seconds`` with a one-line ``EngineError``. The embedded engine is
    pure Python, so the limit is an interval timer's signal; it holds in the main thread of a
    POSIX process (the command line), and elsewhere the block runs unlimited."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or seconds <= 0:
        yield
        return

    stopped = False

    def expire(_signum: int, _frame: Any) -> None:
        if not stopped:
            raise _TimeUp

    previous = signal.signal(signal.SIGALRM, expire)
    # The alarm repeats every 50 ms: an exception raised where Python swallows it (a garbage-collection
    # callback, a __del__) would otherwise leave the block running unlimited.
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield
    except _TimeUp:
        stopped = True
        raise EngineError(f"{what} timed out after {seconds:g} s; raise --timeout") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
