"""A ``toast`` command as a row of the command table (``toast.cli.app.COMMANDS``): its help and options, what it
checks before any analysis (returning a small frozen plan), and its run. Bad input fails in the check, so a
command never analyzes a program only to refuse its options after."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Command"]


def _no_plan(options: argparse.Namespace) -> None:
    return None


@dataclass(frozen=True)
class Command:
    """One command.

    Attributes:
      name: what follows ``toast`` on the command line.
      help: one line for ``toast --help``.
      arguments: adds the command's options to its parser.
      run: ``run(options, analysis, plan) -> exit status`` for a command that ``analyzes`` (the analysis made
        after ``check``), else ``run(options) -> exit status``.
      check: ``check(options) -> plan``: reads and checks what the command needs before any analysis.
      analyzes: whether the command runs on the analysis of its ``INPUT``.
    """

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[..., int]
    check: Callable[[argparse.Namespace], Any] = _no_plan
    analyzes: bool = True
