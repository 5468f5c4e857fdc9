"""``toast``'s entry point: the command table, and the one path every command takes: parse, check (every output
path tried and the command's own ``check``, before any work), analyze, run. Problems the user can fix print one
line ``toast: error: ...`` and exit 2; Ctrl-C exits 130 and SIGTERM 143, each with one line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from toast.cli.analysis_commands import ANALYSIS_COMMANDS
from toast.cli.batch_commands import BATCH_COMMANDS
from toast.cli.command import Command
from toast.cli.options import Parser, output_options
from toast.cli.strategy_commands import STRATEGY_COMMANDS
from toast.errors import ToastError
from toast.processes import Terminated, collector_paused, exit_at_once, sigterm_as_interrupt

__all__ = ["COMMANDS", "main", "run"]

# Every command, in ``toast --help``'s order.
COMMANDS: tuple[Command, ...] = (*ANALYSIS_COMMANDS, *STRATEGY_COMMANDS, *BATCH_COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toast`` with ``argv`` (default: the process's); returns the exit status."""
    parser = Parser(prog="toast", description="Named-dimension analysis for SPMD sharding.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.arguments(subparsers.add_parser(command.name, help=command.help))
    try:
        options = parser.parse_args(argv)
    except SystemExit as exited:  # --help, or a usage error argparse has printed: its status, not an exception
        return exited.code if isinstance(exited.code, int) else 2
    # XLA's client logs its device count at INFO on stderr; keep stderr for toast's own lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if argv is None:
        # The process's own command, numpy not yet imported: its BLAS would start a thread per core that spins
        # while the pool warms up (0.1 s of CPU for a cached analysis read back in 0.4 s); toast's arrays are
        # index bookkeeping, not linear algebra. A value the user set stays.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        with sigterm_as_interrupt(), collector_paused():
            return _run(next(c for c in COMMANDS if c.name == options.command), options)
    except ToastError as err:
        print(f"toast: error: {err}", file=sys.stderr)
        return 2
    except Terminated:
        print("toast: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("toast: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def run() -> NoReturn:
    """The ``toast`` command itself (its console script, ``python -m toast``): ``main`` on the process's arguments,
    then the process ends at once (``toast.processes.exit_at_once``: output flushed, nothing freed one object at a
    time). ``main`` is for callers that go on after it."""
    exit_at_once(main())


def _run(command: Command, options: argparse.Namespace) -> int:
    """Check, analyze, run (a command that analyzes nothing runs at once)."""
    from toast.analysis.named_dimensions import analyze
    from toast.frontend.loading import parse_factory_arguments
    from toast.output.files import check_output
    from toast.output.report import variant_table

    if not command.analyzes:
        return command.run(options)
    # Every file the command will write is checked before any work (and written all or none).
    named: dict[Path, str] = {}
    for option, path in output_options(options):
        check_output(path, option=option)
        same = named.setdefault(Path(path).resolve(), option)
        if same != option:
            raise ToastError(f"{same} and {option} both name {path}: give each output its own file")
    factory_arguments = {name: value for entry in options.arg for name, value in parse_factory_arguments(entry).items()}
    plan = command.check(options)  # bad input fails before the analysis
    variants = _variants(options)
    if len(variants) > 1:
        analyses = [analyze(options.input, engine=options.engine, rules=options.rules, variant=variant,
                            timeout_s=options.timeout, factory_arguments=factory_arguments, cache=options.cache)
                    for variant in variants]
        print(variant_table(analyses), end="")
        return 0
    analysis = analyze(options.input, engine=options.engine, rules=options.rules, variant=variants[0],
                       keep=options.keep, timeout_s=options.timeout, factory_arguments=factory_arguments,
                       cache=options.cache)
    return command.run(options, analysis, plan)


def _variants(options: argparse.Namespace) -> list[str]:
    """The ``--variant`` values (``["default"]`` when none), each read once: several only for ``toast analyze``
    without ``--json``, ``--propose-roles`` or ``--keep``, each once."""
    from toast.datalog.variants import load_variant

    variants = options.variant or ["default"]
    if len(variants) > 1:
        if options.command != "analyze":
            raise ToastError(f"--variant given {len(variants)} times: `toast {options.command}` takes one "
                             "(`toast analyze` compares several)")
        repeated = next((v for i, v in enumerate(variants) if v in variants[:i]), None)
        if repeated is not None:
            raise ToastError(f"--variant {repeated} given twice")
        given = [flag for flag, value in (("--json", options.json), ("--propose-roles", options.propose_roles),
                                          ("--keep", options.keep)) if value]
        if given:
            raise ToastError(f"{given[0]} writes one analysis: give one --variant with it")
    for variant in variants:
        load_variant(variant)
    return variants
