"""Run an assembled rule program on one of the two engines.

Both stages of the analysis (the named-dimension analysis, then conflicts) go through
``evaluate``: it writes the program to a working directory, runs Soufflé (subprocess) or the
embedded engine on the facts, checks the outputs' names and arity against ``toast.facts.schema``,
and on request keeps the program, facts and outputs for a user to rerun by hand.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
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
        # Soufflé's rows come back sorted (``read_outputs``); the embedded engine's are sorted here.
        return {name: check_rows(name, rows) if engine == "souffle" else sorted(check_rows(name, rows))
                for name, rows in results.items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _TimeUp(BaseException):
    """Raised by the alarm inside a run that outlasts its limit. A ``BaseException``, like
    ``KeyboardInterrupt``, so that the engine's own ``except Exception`` does not take it."""


# How soon the alarm comes back when it lands where an exception would be swallowed, in seconds.
_RETRY_S = 0.005


@contextlib.contextmanager
def _time_limit(seconds: float, *, what: str) -> Iterator[None]:
    """Stop the block after ``seconds`` with a one-line ``EngineError``. The embedded engine is
    pure Python, so the limit is a one-shot interval timer's signal; it holds in the main thread of a
    POSIX process (the command line), and elsewhere the block runs unlimited.

    The alarm raises once, and only where the exception reaches the block: not inside a garbage-collection
    callback or a ``__del__`` (Python would print it as ignored and go on), where it comes back ``_RETRY_S``
    later instead. The cyclic collector is paused for the block, so that JAX's collection callback cannot run
    inside it; a ``_TimeUp`` swallowed anyway (a weakref callback) is taken from ``sys.unraisablehook`` and the
    alarm re-armed. Afterwards the timer is disarmed and a signal still pending taken before the previous
    handler returns: a late alarm must not kill the process (SIGALRM's default action); a caller's own timer
    (the one ``ITIMER_REAL``) is put back with what is left of it."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or seconds <= 0:
        yield
        return

    armed = True  # cleared when the alarm raises and when the block ends

    def expire(_signum: int, frame: FrameType | None) -> None:
        nonlocal armed
        if not armed:
            return  # a signal that was on its way when the block ended
        if _swallows_exceptions(frame):
            signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
            return
        armed = False
        raise _TimeUp

    def unraisable(report: Any) -> None:
        nonlocal armed
        if report.exc_type is _TimeUp:  # swallowed after all: the alarm comes back outside
            armed = True
            signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
            return
        previous_hook(report)

    collecting = gc.isenabled()
    gc.disable()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = unraisable
    previous = signal.signal(signal.SIGALRM, expire)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    except _TimeUp:
        raise EngineError(f"{what} timed out after {seconds:g} s; raise --timeout") from None
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        _take_pending_alarm()
        # signal.signal runs a handler whose signal has arrived (ours, now inert) before it swaps handlers.
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer_delay > 0:  # a caller's own alarm goes on: due when it was, or at once if that has passed
            left = outer_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), outer_interval)
        sys.unraisablehook = previous_hook
        if collecting:
            gc.enable()


def _swallows_exceptions(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a garbage-collection callback or a ``__del__``: Python reports an
    exception raised there as ignored and goes on."""
    callbacks = {getattr(getattr(callback, "__func__", callback), "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _take_pending_alarm() -> None:
    """Take a SIGALRM the timer raised just before it was disarmed that no thread has received yet (another
    thread, say one of XLA's, may be the one it is bound for). Needs ``sigtimedwait`` (Linux)."""
    if not hasattr(signal, "sigtimedwait"):
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        signal.sigtimedwait({signal.SIGALRM}, 0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # runs our handler if the signal came meanwhile
