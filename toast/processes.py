"""One discipline for toast's worker processes (the search's forked pool and the sweep's spawned jobs).

A worker ignores Ctrl-C (the terminal sends SIGINT to the whole process group: the parent alone decides
what an interrupt means) and dies with its parent, even when the parent is killed with SIGKILL, so no
worker outlives the command that started it. The parent turns SIGTERM into the same exception as Ctrl-C
(``Terminated``, a ``KeyboardInterrupt``), so one cleanup path handles both: stop the workers, keep no
partial file, exit promptly.

And one for the memory of a process that builds a big program's structures: ``collector_paused``; and one for
its end: ``exit_at_once``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PARENT_POLL_S = 0.5


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived; handled like Ctrl-C (exit status 128 + 15 instead of 128 + 2)."""


def worker_setup(parent_pid: int) -> None:
    """Run first in a worker process: ignore SIGINT, and die when the process ``parent_pid`` does (the
    kernel's parent-death signal on Linux; elsewhere a thread that watches the parent id)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="toast-parent-watch").start()


@contextlib.contextmanager
def workers_starting() -> Iterator[None]:
    """Wrap the start of worker processes: they begin with SIGINT ignored (an ignored signal stays ignored
    across fork and exec, and Python then installs no KeyboardInterrupt handler), so a Ctrl-C that comes
    before ``worker_setup`` runs prints no traceback from a worker. In the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` in the main thread (elsewhere: a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Within the block, Python's cyclic garbage collector does not run; after it, it runs as before. toast builds
    millions of small objects that form no cycles (a 100k-op program's ops, values, dimension names, identities,
    a cost plan's tables): the collector's passes over them were a fifth of ``toast autoshard``'s CPU seconds on
    a 57k-op program, and freed nothing (its peak memory is the same without them). Worker processes forked
    within the block inherit the pause, so they do not touch every page they share with their parent either."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def exit_at_once(status: int) -> NoReturn:
    """End the process with ``status`` now: standard output and error flushed, ``logging``'s handlers closed,
    and not one of the process's objects freed. Python's own exit frees them one at a time (every module's
    globals: JAX's traces and caches, the MLIR modules, toast's tables): about a second of CPU after a
    70B-shaped step's ``toast autoshard`` (``benchmarks/bench_frontier.py``) for memory the kernel reclaims
    in one piece. mypy's command ends the same way.

    Only for a command that has finished: its files are written and closed, its temporary directories
    removed (toast removes each where it made it) and its worker pools closed (a worker left over dies with
    its parent: ``worker_setup``). The other exit handlers (JAX's, multiprocessing's) release what the
    kernel releases with the process."""
    import logging

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    logging.shutdown()
    os._exit(status)
