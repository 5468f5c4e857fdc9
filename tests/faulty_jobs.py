"""Model factories that misbehave, for the sweep's and the search's fault tests (``faulty_jobs:crash`` ...).

``good`` is the bundled MLP; ``crash`` kills its own process as the kernel's OOM killer would (SIGKILL);
``exits`` calls ``sys.exit(3)``; ``hangs`` never returns; ``slow`` returns the MLP after ``seconds``; ``scalars``
is a program with only scalar arguments. ``descendants`` and ``alive`` find processes by PID (Linux ``/proc``),
for the checks that no worker outlives its parent.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from toast.examples.mlp import mlp


def good(**sizes):
    return mlp(**sizes)


def crash(**_ignored):  # keyword arguments only make jobs of distinct keys
    os.kill(os.getpid(), signal.SIGKILL)


def exits():
    sys.exit(3)


def hangs(**_ignored):
    while True:
        time.sleep(1)


def slow(seconds: float = 5):
    time.sleep(seconds)
    return mlp()


def scalars():
    """A program whose arguments are all scalars: nothing to shard."""
    import jax.numpy as jnp

    return (lambda a, b: a * b + a), (jnp.float32(1.0), jnp.float32(2.0))


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'
        found[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return found


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` now (children, their children, ...)."""
    parents = _parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie has ended: only its parent has not reaped it)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            running.add(pid)
    return running
