"""Model factories that misbehave, for the sweep's and the search's fault tests (``faulty_jobs:crash`` ...).

``good`` is the bundled MLP; ``crash`` kills its own process as the kernel's OOM killer would (SIGKILL);
``exits`` calls ``sys.exit(3)``; ``hangs`` never returns; ``slow`` returns the MLP after ``seconds``; ``scalars``
is a program with only scalar arguments.
"""

from __future__ import annotations

import os
import signal
import sys
import time

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
