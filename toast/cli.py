"""``toast`` command line: ``analyze``, ``explain``, ``graph``, ``shard`` and ``validate``.

Problems the user can fix print one line ``toast: error: ...`` and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from toast.errors import ToastError


def _add_analysis_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a StableHLO .mlir file, or module:function naming a factory "
                        "that returns (fn, example_args), e.g. toast.examples.mlp:mlp")
    parser.add_argument("--engine", choices=("auto", "souffle", "embedded"), default="auto",
                        help="Datalog engine (auto: souffle when installed, else embedded)")
    parser.add_argument("--rules", metavar="DIR", help="directory of .dl files extending or overriding the rules")
    parser.add_argument("--variant", default="default", help="analysis variant (rules/variants/NAME.toml) or TOML path")
    parser.add_argument("--keep", metavar="DIR", help="keep facts, assembled program and engine outputs in DIR")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="engine time limit, seconds")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="keyword argument for a module:function factory, e.g. --arg layers=12 (repeatable; "
                        "also module:function?layers=12&batch=8)")


def _check_dim(text: str) -> str:
    """A dim as the user wrote it, after checking it reads as ``VALUE:DIM`` or ``VALUE[DIM]``."""
    from toast.analysis.naming import dim_spellings

    if not dim_spellings(text):
        raise ToastError(f"dimension '{text}' should be VALUE:DIM or VALUE[DIM], e.g. x:0, tok[1] or result[0]:1")
    return text


def _parse_color(text: str) -> int:
    if not text.isdigit():
        raise ToastError(f"--color {text}: a color is a number, as in the colors of `toast analyze`")
    return int(text)


class _Parser(argparse.ArgumentParser):
    """argparse with toast's one-line errors (``toast: error: ...``, exit 2) instead of usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"toast: error: {self.prog.removeprefix('toast ')}: {message}\n"
                     if self.prog != "toast" else f"toast: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="toast", description="Named-dimension analysis for SPMD sharding.")
    commands = parser.add_subparsers(dest="command", required=True)
    analyze_parser = commands.add_parser("analyze", help="find the colors of a program")
    _add_analysis_options(analyze_parser)
    analyze_parser.add_argument("--json", metavar="FILE", help="write the analysis as JSON to FILE")
    explain_parser = commands.add_parser("explain", help="why two dims share a color")
    _add_analysis_options(explain_parser)
    explain_parser.add_argument("dim_a", metavar="DIM_A",
                                help="VALUE:DIM as the JSON names it, e.g. x:0, or VALUE[DIM] as the summary prints it")
    explain_parser.add_argument("dim_b", metavar="DIM_B", help="VALUE:DIM, e.g. result[0]:0")
    graph_parser = commands.add_parser("graph", help="draw the dimension graph of a color with its conflicts")
    _add_analysis_options(graph_parser)
    graph_parser.add_argument("--color", required=True, metavar="C", help="color id (as in analyze's output)")
    graph_parser.add_argument("--format", default=None, metavar="{dot,svg}",
                              help="dot (plain text) or svg (needs Graphviz); default: from --output's "
                              "suffix, else dot")
    graph_parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    graph_parser.add_argument("--full", action="store_true", help="draw every node even of a big component (by "
                              "default one of more than 200 nodes is drawn as a summary: Graphviz may take minutes)")
    shard_parser = commands.add_parser("shard", help="apply a manual strategy on a mesh and estimate its cost")
    _add_analysis_options(shard_parser)
    shard_parser.add_argument("--mesh", required=True, help="logical mesh, e.g. batch=4,model=2")
    shard_parser.add_argument("--hardware", default="a100_80gb", help="accelerator profile (hardware/NAME.toml) "
                              "or a TOML path")
    shard_parser.add_argument("--strategy", default="data_parallel",
                              help="data_parallel, megatron, fsdp or sequence")
    shard_parser.add_argument("--roles", metavar="FILE", help="roles file (TOML) naming the argument dims each "
                              "strategy shards; default: <module>.roles.toml beside a module:function's module")
    shard_parser.add_argument("--batch", metavar="ARG:DIM", help="the batch dim, e.g. ids:0 (enough for "
                              "data_parallel; replaces the roles file's batch role)")
    shard_parser.add_argument("-o", "--output", metavar="FILE", help="write the strategy JSON to FILE")
    shard_parser.add_argument("--emit", metavar="FILE", help="write the StableHLO annotated with the shardings "
                              "(Shardy form, as jax.jit lowers it) to FILE")
    validate_parser = commands.add_parser("validate", help="compile and run a strategy with XLA on host CPU "
                                          "devices; compare collectives and memory with the predictions")
    _add_analysis_options(validate_parser)
    validate_parser.add_argument("strategy", metavar="STRATEGY", help="strategy JSON from `toast shard -o`")
    validate_parser.add_argument("--devices", type=int, required=True, metavar="N",
                                 help="host CPU devices (must equal the strategy's mesh size)")
    validate_parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    validate_parser.add_argument("--json", metavar="FILE", help="write the agreement as JSON to FILE")
    options = parser.parse_args(argv)
    # XLA's client logs its device count at INFO on stderr; keep stderr for toast's own lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        return _run(options)
    except ToastError as err:
        print(f"toast: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("toast: interrupted", file=sys.stderr)
        return 130


def _output_options(options: argparse.Namespace) -> list[tuple[str, str]]:
    """``(option, path)`` of every file the command was asked to write."""
    named = (("--json", "json"), ("-o", "output"), ("--emit", "emit"))
    return [(flag, getattr(options, attr)) for flag, attr in named if getattr(options, attr, None)]


def _run(options: argparse.Namespace) -> int:
    from toast.analysis.explain import explain, format_explanation
    from toast.analysis.named_dimensions import analyze
    from toast.frontend.loading import parse_factory_arguments
    from toast.output.files import Output, check_output, json_text, write_outputs
    from toast.output.report import summary, to_json

    # Every file the command will write is checked before any work (and written all or none).
    for option, path in _output_options(options):
        check_output(path, option=option)
    factory_arguments = {name: value for entry in options.arg for name, value in parse_factory_arguments(entry).items()}
    if options.command == "explain":
        dims = (_check_dim(options.dim_a), _check_dim(options.dim_b))
    if options.command == "shard":
        from toast.cost.hardware import load_hardware
        from toast.sharding.mesh import parse_mesh
        from toast.sharding.roles import roles_for_input
        from toast.sharding.strategies import check_strategy

        mesh = parse_mesh(options.mesh)  # bad input fails before the analysis
        hardware = load_hardware(options.hardware)
        roles = roles_for_input(options.input, roles_path=options.roles, batch=options.batch)
        check_strategy(options.strategy, roles=roles, mesh=mesh)
    if options.command == "validate":
        from toast.cost.hardware import load_hardware
        from toast.output.strategy_file import read_strategy, strategy_mesh

        document = read_strategy(options.strategy)  # bad input fails before the analysis
        mesh = strategy_mesh(document, path=options.strategy)
        if options.devices != mesh.devices:
            raise ToastError(f"--devices {options.devices}, but the strategy's mesh {mesh.spec()} has "
                             f"{mesh.devices} devices")
        hardware = load_hardware(str(document["hardware"]))
    if options.command == "graph":
        color = _parse_color(options.color)
        from toast.output.dimension_graph import graph_format as choose_format

        graph_format = choose_format(options.output, options.format)
        if graph_format == "svg":
            from toast.output.dimension_graph import require_graphviz

            require_graphviz()  # before the analysis: fail fast
    analysis = analyze(options.input, engine=options.engine, rules=options.rules, variant=options.variant,
                       keep=options.keep, timeout_s=options.timeout, factory_arguments=factory_arguments)
    if options.command == "analyze":
        if options.json:
            write_outputs([Output("--json", Path(options.json), json_text(to_json(analysis)))])
        print(summary(analysis), end="")
        return 0
    if options.command == "shard":
        return _shard(options, analysis, mesh, hardware, roles)
    if options.command == "validate":
        return _validate(options, analysis, document, mesh, hardware)
    if options.command == "graph":
        from toast.output.dimension_graph import dimension_graph_dot, render_svg

        text = dimension_graph_dot(analysis, color, full=options.full)
        if graph_format == "svg":
            text = render_svg(text)
        if options.output:
            write_outputs([Output("-o", Path(options.output), text)])
        else:
            sys.stdout.write(text)
        return 0
    from toast.analysis.naming import resolve_dim

    first, second = (resolve_dim(analysis, text) for text in dims)
    print(format_explanation(analysis, explain(analysis, first, second)))
    return 0


def _shard(options: argparse.Namespace, analysis, mesh, hardware, roles) -> int:
    from toast.cost.model import CostModel
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes, human_seconds
    from toast.output.strategy_file import strategy_json
    from toast.sharding.state import ShardingModel
    from toast.sharding.strategies import manual_strategy

    model = ShardingModel(analysis, mesh)
    state, actions = manual_strategy(model, options.strategy, roles)
    cost = CostModel(model, hardware).evaluate(state)
    document = strategy_json(model, state, actions, cost, source=options.input, hardware=hardware.name,
                             name=options.strategy)
    outputs = []
    if options.output:
        outputs.append(Output("-o", Path(options.output), json_text(document)))
    if options.emit:
        from toast.output.sharded_stablehlo import sharded_module_text

        outputs.append(Output("--emit", Path(options.emit), sharded_module_text(model, state)))
    write_outputs(outputs)
    kinds: dict[str, int] = {}
    for collective in cost.collectives:
        key = f"{collective.kind} over {'+'.join(collective.axes)}"
        kinds[key] = kinds.get(key, 0) + 1
    print(f"{analysis.program.name}: strategy {options.strategy} on mesh {mesh.spec()} ({hardware.name}), "
          f"{len(actions)} actions, roles from {roles.source}")
    print(f"step time {human_seconds(cost.step_time_s)} ({cost.kernels} kernels), peak memory "
          f"{human_bytes(cost.peak_bytes)} per device")
    print("  " + ", ".join(f"{key.removesuffix('_s').replace('_', ' ')} {human_seconds(seconds)}"
                           for key, seconds in cost.breakdown.items()))
    print(f"relative cost {cost.relative:.3f}: the step time over the unsharded program's on one device"
          + (", plus the penalty for memory over the device's" if cost.peak_bytes > hardware.hbm_bytes else ""))
    print("collectives: " + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"))
    return 0


def _validate(options: argparse.Namespace, analysis, document, mesh, hardware) -> int:
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.strategy_file import strategy_state
    from toast.sharding.state import ShardingModel
    from toast.xla.validate import agreement_json, format_agreement, validate

    model = ShardingModel(analysis, mesh)
    state = strategy_state(model, document, path=options.strategy)
    agreement = validate(model, state, hardware, seed=options.seed, timeout_s=options.timeout)
    print(f"{analysis.program.name}: strategy {document.get('strategy', '?')} on mesh {mesh.spec()}, "
          f"{mesh.devices} host CPU devices")
    print(format_agreement(agreement), end="")
    if options.json:
        write_outputs([Output("--json", Path(options.json), json_text(agreement_json(agreement)))])
    if not agreement.numerics.match:
        print("toast: error: the sharded program's outputs differ from the unsharded program's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
