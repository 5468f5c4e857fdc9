"""The command line's options: argparse types that refuse bad numbers before any work, the option groups
several commands share, and the parser that keeps usage errors to one line."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

from toast.errors import ToastError


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def positive_seconds(text: str) -> float:
    """An option's number of seconds: finite and above 0 (argparse reports an error in one line)."""
    value = number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"'{text}': give a finite number of seconds above 0")
    return value


def memory_gib(text: str) -> float:
    """Memory per device in GiB: what the Python API takes (``toast.cost.hardware.memory_limit_gib``: finite, above
    0, at most ``MAX_MEMORY_GIB``)."""
    from toast.cost.hardware import MAX_MEMORY_GIB, memory_limit_gib

    value = number(text)
    try:
        memory_limit_gib(value)
    except ToastError:
        raise argparse.ArgumentTypeError(f"'{text}': give the memory per device in GiB, above 0 and at most "
                                         f"{MAX_MEMORY_GIB:.0f}") from None
    return value


def count(minimum: int, what: str) -> Callable[[str], int]:
    """An integer option of at least ``minimum`` (and at most 2**63 - 1: seeds and counts are int64)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if not minimum <= value < 1 << 63:
            raise argparse.ArgumentTypeError(f"{value}: give {what}")
        return value

    return parse


PROCESSES = count(0, "0 (one per core) or more")
DEVICES = count(1, "1 or more devices")
SEED = count(0, "a seed from 0 to 2**63 - 1")
ROLLOUTS = count(1, "1 or more rollouts")
RESTARTS = count(0, "0 or more restarts")
MICROBATCHES = count(1, "1 or more micro-batches per step")
SLICES = count(1, "1 or more slices")


def add_analysis_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a StableHLO .mlir file, or module:function naming a factory "
                        "that returns (fn, example_args), e.g. toast.examples.mlp:mlp, or "
                        "(torch.nn.Module, example_inputs): its training step (pip install 'toast[torch]')")
    parser.add_argument("--engine", choices=("auto", "souffle", "embedded"), default="auto",
                        help="Datalog engine (auto: souffle when installed, else embedded)")
    parser.add_argument("--rules", metavar="DIR", help="directory of .dl files extending or overriding the rules")
    parser.add_argument("--variant", action="append", metavar="NAME",
                        help="analysis variant (rules/variants/NAME.toml) or TOML path (default: default); "
                        "`toast analyze` takes several and prints them side by side")
    parser.add_argument("--keep", metavar="DIR", help="keep facts, assembled program and engine outputs in DIR")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="analyze afresh: neither read nor write the analysis cache (~/.cache/toast/analyses)")
    parser.add_argument("--timeout", type=positive_seconds, default=600.0, metavar="S",
                        help="time limit, seconds: of the Datalog engine, and of each XLA check (validate, "
                        "compare --validate)")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="keyword argument for a module:function factory, e.g. --arg layers=12 (repeatable; "
                        "also module:function?layers=12&batch=8)")


def check_dim(text: str) -> str:
    """A dim as the user wrote it, after checking it reads as ``VALUE:DIM`` or ``VALUE[DIM]``."""
    from toast.analysis.naming import dim_spellings

    if not dim_spellings(text):
        raise ToastError(f"dimension '{text}' should be VALUE:DIM or VALUE[DIM], e.g. x:0, tok[1] or result[0]:1")
    return text


def parse_color(text: str) -> int:
    if not text.isdigit():
        raise ToastError(f"--color {text}: a color is a number, as in the colors of `toast analyze`")
    return int(text)


class Parser(argparse.ArgumentParser):
    """argparse with toast's one-line errors (``toast: error: ...``, exit 2) instead of usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"toast: error: {self.prog.removeprefix('toast ')}: {message}\n"
                     if self.prog != "toast" else f"toast: error: {message}\n")


def add_search_options(parser: argparse.ArgumentParser) -> None:
    """The mesh, hardware, search and roles options, shared by ``autoshard`` and ``compare``."""
    parser.add_argument("--mesh", required=True, help="logical mesh, e.g. batch=4,model=2 or data=2,seq=2,model=2")
    parser.add_argument("--hardware", default="a100_80gb", help="accelerator profile (hardware/NAME.toml) or a "
                        "TOML path")
    parser.add_argument("--roles", metavar="FILE", help="roles file for the manual strategies of the comparison "
                        "table (default: <module>.roles.toml beside the module)")
    parser.add_argument("--memory", type=memory_gib, metavar="GiB", help="memory per device in GiB "
                                  "(default: the profile's HBM)")
    add_slices_option(parser)
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=positive_seconds, metavar="SECONDS", help="stop searching after SECONDS")
    budget.add_argument("--rollouts", type=ROLLOUTS, metavar="N", help="run N rollouts, fewer only when every state "
                        "has been scored (default 2000)")
    parser.add_argument("--seed", type=SEED, default=0, help="search seed (same seed, same strategy)")
    add_search_option(parser)
    parser.add_argument("--patience", type=ROLLOUTS, metavar="N", help="mcts: rollouts without a better state before "
                        "a tree restarts below its best state (default: MctsSettings.patience)")
    parser.add_argument("--restarts", type=RESTARTS, metavar="N", help="mcts: restarts per tree before it stops early "
                        "(default: no limit, the budget is spent)")
    add_microbatches_option(parser)
    parser.add_argument("--workers", type=PROCESSES, default=0, metavar="N", help="worker processes (default: "
                                  "one per core; the result does not depend on it)")
    parser.add_argument("--pin", action="append", default=[], metavar="NAME=AXES,...",
                                  help="keep an argument's sharding, e.g. 'tokens=batch,' (dim 0 on batch, dim 1 "
                                  "whole; 'x=batch+model,' splits dim 0 over both); repeatable")
    parser.add_argument("--phase", action="append", default=[], metavar="AXES:GOAL",
                                  help="search in phases, in order: the mesh axes a phase may use ('+'-separated) "
                                  "and its goal, runtime or memory, e.g. --phase model:memory --phase batch:runtime "
                                  "(PartIR's composite strategies); default: one phase, all axes, runtime")


def add_search_option(parser: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    """``--search NAME``: checked against ``toast.search.registry.SEARCHES`` by the command (one line naming the
    known searches), so that ``toast --help`` does not import the search stage. ``sweep``: every job's search
    where the sweep file names none (default: the file's, else mcts)."""
    names = ("mcts (Monte Carlo Tree Search, the default), random (random action sequences) or greedy (steepest "
             "descent restarted from random states)")
    parser.add_argument("--search", default=None if sweep else "mcts", metavar="NAME", help=(
        f"every job's search where the sweep file has no search key: {names}" if sweep else
        f"the search: {names}; each spends the rollout budget, and the strategy file records it (search.algorithm)"))


def add_slices_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slices", type=SLICES, metavar="N", help="the devices lie on N slices joined by the "
                        "profile's outermost level (TPU slices over DCN): numbered row-major, the mesh's leading "
                        "axes cross slices, as mesh_utils.create_hybrid_device_mesh lays them out (MaxText's "
                        "dcn_data_parallelism 2 x ici_fsdp_parallelism 64: --mesh data=2,fsdp=64 --slices 2); "
                        "default 1, or what a strategy file records")


def add_microbatches_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--microbatches", type=MICROBATCHES, default=1, metavar="K", help="gradient accumulation: the "
                        "program is one micro-batch's step, K of them make a step and the gradients are reduced "
                        "once, in the last (Megatron-LM's micro-batches; default 1)")


def output_options(options: argparse.Namespace) -> list[tuple[str, str]]:
    """``(option, path)`` of every file the command was asked to write."""
    named = (("--json", "json"), ("-o", "output"), ("--emit", "emit"), ("--report", "report"),
             ("--propose-roles", "propose_roles"))
    return [(flag, getattr(options, attr)) for flag, attr in named if getattr(options, attr, None)]
