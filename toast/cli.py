"""``toast`` command line: ``analyze``, ``explain``, ``graph``, ``shard``, ``cost`` and ``validate``.

Problems the user can fix print one line ``toast: error: ...`` and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from toast.errors import ToastError
from toast.processes import Terminated, sigterm_as_interrupt


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def _positive_seconds(text: str) -> float:
    """An option's number of seconds: finite and above 0 (argparse reports an error in one line)."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"'{text}': give a finite number of seconds above 0")
    return value


MAX_MEMORY_GIB = float(1 << 30)  # an exbibyte per device: far above any accelerator, and exact in int64 bytes


def _memory_gib(text: str) -> float:
    """Memory per device in GiB: finite, above 0, at most ``MAX_MEMORY_GIB``."""
    value = _number(text)
    if not (math.isfinite(value) and 0 < value <= MAX_MEMORY_GIB):
        raise argparse.ArgumentTypeError(f"'{text}': give the memory per device in GiB, above 0 and at most "
                                         f"{MAX_MEMORY_GIB:.0f}")
    return value


def _count(minimum: int, what: str) -> Callable[[str], int]:
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


_PROCESSES = _count(0, "0 (one per core) or more")
_DEVICES = _count(1, "1 or more devices")
_SEED = _count(0, "a seed from 0 to 2**63 - 1")
_ROLLOUTS = _count(1, "1 or more rollouts")
_RESTARTS = _count(0, "0 or more restarts")
_MICROBATCHES = _count(1, "1 or more micro-batches per step")


def _add_analysis_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a StableHLO .mlir file, or module:function naming a factory "
                        "that returns (fn, example_args), e.g. toast.examples.mlp:mlp")
    parser.add_argument("--engine", choices=("auto", "souffle", "embedded"), default="auto",
                        help="Datalog engine (auto: souffle when installed, else embedded)")
    parser.add_argument("--rules", metavar="DIR", help="directory of .dl files extending or overriding the rules")
    parser.add_argument("--variant", action="append", metavar="NAME",
                        help="analysis variant (rules/variants/NAME.toml) or TOML path (default: default); "
                        "`toast analyze` takes several and prints them side by side")
    parser.add_argument("--keep", metavar="DIR", help="keep facts, assembled program and engine outputs in DIR")
    parser.add_argument("--timeout", type=_positive_seconds, default=600.0, metavar="S",
                        help="engine time limit, seconds")
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
    analyze_parser.add_argument("--propose-roles", metavar="FILE", help="write the roles toast proposes from the "
                                "analysis (what autoshard and compare use without a roles file) as a roles file")
    roles_parser = commands.add_parser("roles", help="list the program's arguments and the roles toast proposes "
                                       "from the analysis; -o writes them as a roles file to edit")
    _add_analysis_options(roles_parser)
    roles_parser.add_argument("-o", "--output", metavar="FILE", help="write the proposed roles as a roles file "
                              "(TOML, for --roles)")
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
                              help="data_parallel, megatron, fsdp or sequence, or fsdp, megatron and sequence "
                              "combined with '+' (fsdp+megatron)")
    shard_parser.add_argument("--roles", metavar="FILE", help="roles file (TOML) naming the argument dims each "
                              "strategy shards; default: <module>.roles.toml beside a module:function's module")
    shard_parser.add_argument("--batch", metavar="ARG:DIM", help="the batch dim, e.g. ids:0 (enough for "
                              "data_parallel; replaces the roles file's batch role)")
    shard_parser.add_argument("-o", "--output", metavar="FILE", help="write the strategy JSON to FILE")
    shard_parser.add_argument("--emit", metavar="FILE", help="write the StableHLO annotated with the shardings "
                              "(Shardy form, as jax.jit lowers it) to FILE")
    shard_parser.add_argument("--donate", action="store_true", help="donate the arguments (jax.jit donate_argnums): "
                              "outputs may reuse their buffers; recorded in the strategy file")
    cost_parser = commands.add_parser("cost", help="estimate one device's step time and peak memory")
    _add_analysis_options(cost_parser)
    cost_parser.add_argument("--hardware", required=True, help="accelerator profile (hardware/NAME.toml) or a TOML "
                             "path")
    cost_parser.add_argument("--mesh", help="logical mesh, e.g. batch=4,model=2 (default: one device, unsharded)")
    cost_parser.add_argument("--strategy", metavar="NAME|FILE", help="a manual strategy (data_parallel, megatron, "
                             "fsdp, sequence, or a '+' combination such as fsdp+megatron; needs --mesh) or a "
                             "strategy file from `toast shard -o`")
    cost_parser.add_argument("--roles", metavar="FILE", help="roles file (TOML) for a manual strategy")
    cost_parser.add_argument("--donate", action="store_true", help="donate the arguments (jax.jit donate_argnums): "
                             "outputs may reuse their buffers")
    cost_parser.add_argument("--no-overlap", action="store_true", help="run collectives on the compute stream")
    _add_microbatches_option(cost_parser)
    cost_parser.add_argument("--json", metavar="FILE", help="write the estimate as JSON to FILE")
    autoshard_parser = commands.add_parser("autoshard", help="search a sharding (MCTS over the analysis's actions, "
                                           "guided by the cost model) and compare it with the manual strategies")
    _add_analysis_options(autoshard_parser)
    _add_search_options(autoshard_parser)
    autoshard_parser.add_argument("-o", "--output", metavar="FILE", help="write the strategy JSON to FILE")
    autoshard_parser.add_argument("--emit", metavar="FILE", help="write the StableHLO annotated with the "
                                  "shardings to FILE")
    autoshard_parser.add_argument("--report", metavar="FILE", help="write an HTML report (shardings, colors per "
                                  "axis, collectives, memory timeline, search rounds, strategies) to FILE")
    compare_parser = commands.add_parser("compare", help="toast's search against every manual strategy that "
                                         "applies: step time, peak per device, over memory, search seconds")
    _add_analysis_options(compare_parser)
    _add_search_options(compare_parser)
    compare_parser.add_argument("--validate", action="store_true", help="also compile and run every strategy "
                                "that applies with XLA on host CPU devices (numerics and collectives)")
    compare_parser.add_argument("--json", metavar="FILE", help="write the comparison as JSON to FILE")
    compare_parser.add_argument("--report", metavar="FILE", help="write an HTML report of the comparison to FILE")
    sweep_parser = commands.add_parser("sweep", help="run a sweep file's comparisons (models x meshes x hardware x "
                                       "memory x seeds) in parallel; one record per job and a summary table")
    sweep_parser.add_argument("sweep", metavar="FILE", help="sweep file (TOML, a [sweep] table)")
    sweep_parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder of the job records "
                              "(jobs/*.json; a rerun skips the jobs recorded there) and summary.csv, summary.md")
    sweep_parser.add_argument("--jobs", type=_PROCESSES, default=0, metavar="N", help="jobs at once on this machine "
                              "(default: one per core)")
    sweep_parser.add_argument("--report", metavar="FILE", help="write an HTML report (the summary, then every "
                              "job's comparison) to FILE")
    sweep_parser.add_argument("--job-timeout", type=_positive_seconds, metavar="SECONDS", help="stop a job that "
                              "runs longer and record it as timed out (default: no limit)")
    sweep_parser.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="run the jobs as tasks on "
                              "a Ray cluster: ADDRESS, or the one `ray start --head` runs here (auto); 'local' "
                              "starts one for this run")
    calibrate_parser = commands.add_parser("calibrate", help="fit a profile's collective parameters to your "
                                           "cluster's nccl-tests outputs and write it as a new profile")
    calibrate_parser.add_argument("--nccl-tests", nargs="+", default=[], metavar="LOG",
                                  help="outputs of all_reduce_perf, all_gather_perf, reduce_scatter_perf or "
                                  "alltoall_perf (with their '#  Rank' header lines), on one node or several")
    kernels = calibrate_parser.add_mutually_exclusive_group()
    kernels.add_argument("--kernels", action="store_true", help="run the kernel microbenchmarks on this machine's "
                         "accelerator (a few minutes) and measure the [kernels] numbers")
    kernels.add_argument("--kernels-from", metavar="JSON", help="the [kernels] numbers from a microbenchmark run "
                         "saved before (benchmarks/gpu_microbench.py OUT.json)")
    calibrate_parser.add_argument("--base", default="h100", help="the profile to start from: its bandwidths, node "
                                  "size and kernel numbers are kept (hardware/NAME.toml or a TOML path)")
    calibrate_parser.add_argument("-o", "--output", required=True, metavar="FILE",
                                  help="the new profile (a .toml file; load it with --hardware FILE)")
    validate_parser = commands.add_parser("validate", help="compile and run a strategy with XLA on host CPU "
                                          "devices; compare collectives and memory with the predictions")
    _add_analysis_options(validate_parser)
    validate_parser.add_argument("strategy", metavar="STRATEGY", help="strategy JSON from `toast shard -o`")
    validate_parser.add_argument("--devices", type=_DEVICES, required=True, metavar="N",
                                 help="host CPU devices (must equal the strategy's mesh size)")
    validate_parser.add_argument("--seed", type=_SEED, default=0, help="seed of the random inputs")
    validate_parser.add_argument("--hardware", metavar="NAME|FILE", help="price the predictions on this profile "
                                 "(default: the one the strategy file records)")
    validate_parser.add_argument("--json", metavar="FILE", help="write the agreement as JSON to FILE")
    try:
        options = parser.parse_args(argv)
    except SystemExit as exited:  # --help, or a usage error argparse has printed: its status, not an exception
        return exited.code if isinstance(exited.code, int) else 2
    # XLA's client logs its device count at INFO on stderr; keep stderr for toast's own lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        with sigterm_as_interrupt():
            return _run(options)
    except ToastError as err:
        print(f"toast: error: {err}", file=sys.stderr)
        return 2
    except Terminated:
        print("toast: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("toast: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def _calibrate(options: argparse.Namespace) -> int:
    import datetime
    import json

    from toast.cost.calibration import fit_collectives, read_nccl_tests
    from toast.cost.hardware import load_hardware
    from toast.output.files import Output, check_output, write_outputs
    from toast.output.profile_file import calibrated_profile_text
    from toast.output.report import human_seconds

    output = Path(options.output)
    if output.suffix != ".toml":
        raise ToastError(f"-o {options.output}: a profile is a .toml file")
    if not options.nccl_tests and not options.kernels and not options.kernels_from:
        raise ToastError("calibrate needs measurements: --nccl-tests LOG..., --kernels or --kernels-from JSON")
    check_output(output, option="-o")
    base = load_hardware(options.base)
    curves = [read_nccl_tests(path) for path in options.nccl_tests]
    document = None
    if options.kernels_from:
        try:
            document = json.loads(Path(options.kernels_from).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ToastError(f"{options.kernels_from}: not a microbenchmark document ({error.__class__.__name__})") \
                from None
    elif options.kernels:
        import jax

        platform = jax.devices()[0].platform
        if platform == "cpu":
            raise ToastError("--kernels measures this machine's accelerator, and jax sees none here (only the CPU); "
                             "run it where the GPU is, or give --kernels-from JSON")
        from toast.cost.microbench import measure_kernels

        document = measure_kernels(progress=lambda line: print(line, file=sys.stderr, flush=True))
    parameters: dict = {}
    if curves:
        print(f"fitting profile '{base.name}' to {len(curves)} nccl-tests output{'s' if len(curves) > 1 else ''}")
        fit = fit_collectives(curves, [base] * len(curves))
        parameters = fit.parameters
        for curve, ratios in zip(curves, fit.ratios, strict=True):
            print(f"{curve.source}: {curve.kind}, {curve.ranks} ranks on {curve.nodes} node{'s' * (curve.nodes > 1)}")
            print(f"  {'bytes':>12} {'measured':>10} {'model':>10} {'model/measured':>14}")
            for size, seconds, ratio in zip(curve.sizes, curve.seconds, ratios.tolist(), strict=True):
                print(f"  {size:>12} {human_seconds(seconds):>10} {human_seconds(seconds * ratio):>10} "
                      f"{ratio:>14.2f}")
        for (level, field), value in sorted(parameters.items()):
            print(f"interconnect[{level}] ({base.interconnect[level].name}).{field} = {value:.4g} "
                  f"(was {getattr(base.interconnect[level], field):.4g})")
    kernel_fields: dict[str, float] = {}
    if document is not None:
        from toast.cost.microbench import kernel_numbers

        kernel_fields = kernel_numbers(document, base)
        print(f"kernels measured on {document.get('device', 'an unnamed device')} ({document.get('date', 'no date')}):")
        for field, value in kernel_fields.items():
            print(f"  kernels.{field} = {value:.4g} (was {getattr(base, field):.4g})")
    measured = [Path(path).name for path in [*options.nccl_tests, *([options.kernels_from] if options.kernels_from
                                                                     else [])]]
    if options.kernels:
        measured.append("the kernel microbenchmarks")
    source = f"C1: toast calibrate on {', '.join(measured)} ({datetime.date.today().isoformat()})"
    text = calibrated_profile_text(base, parameters, name=output.stem, source=source, kernels=kernel_fields)
    write_outputs([Output("-o", output, text)])
    print(f"wrote {output}")
    return 0


def _output_options(options: argparse.Namespace) -> list[tuple[str, str]]:
    """``(option, path)`` of every file the command was asked to write."""
    named = (("--json", "json"), ("-o", "output"), ("--emit", "emit"), ("--report", "report"),
             ("--propose-roles", "propose_roles"))
    return [(flag, getattr(options, attr)) for flag, attr in named if getattr(options, attr, None)]


def _run(options: argparse.Namespace) -> int:
    from toast.analysis.explain import explain, format_explanation
    from toast.analysis.named_dimensions import analyze
    from toast.frontend.loading import parse_factory_arguments
    from toast.output.files import Output, check_output, json_text, write_outputs
    from toast.output.report import argument_table, summary, to_json, variant_table

    if options.command == "sweep":
        return _sweep(options)
    if options.command == "calibrate":
        return _calibrate(options)
    # Every file the command will write is checked before any work (and written all or none).
    named: dict[Path, str] = {}
    for option, path in _output_options(options):
        check_output(path, option=option)
        same = named.setdefault(Path(path).resolve(), option)
        if same != option:
            raise ToastError(f"{same} and {option} both name {path}: give each output its own file")
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
        # Without any roles, they are proposed from the analysis (and checked then).
        check_strategy(options.strategy, roles=roles if roles.dims else None, mesh=mesh)
    if options.command == "cost":
        cost_plan = _cost_plan(options)  # bad input fails before the analysis
    if options.command in ("autoshard", "compare"):
        autoshard_plan = _autoshard_plan(options)  # bad input fails before the analysis
    if options.command == "compare":
        from toast.evaluation.compare import check_host_validation

        check_host_validation(autoshard_plan[0], validate_on_host=options.validate)
    if options.command == "validate":
        from toast.cost.hardware import load_hardware
        from toast.output.strategy_file import read_strategy, strategy_hardware, strategy_mesh

        document = read_strategy(options.strategy)  # bad input fails before the analysis
        mesh = strategy_mesh(document, path=options.strategy)
        if options.devices != mesh.devices:
            raise ToastError(f"--devices {options.devices}, but the strategy's mesh {mesh.spec()} has "
                             f"{mesh.devices} devices")
        hardware = (load_hardware(options.hardware) if options.hardware
                    else strategy_hardware(document, path=options.strategy))
    if options.command == "graph":
        color = _parse_color(options.color)
        from toast.output.dimension_graph import graph_format as choose_format

        graph_format = choose_format(options.output, options.format)
        if graph_format == "svg":
            from toast.output.dimension_graph import require_graphviz

            require_graphviz()  # before the analysis: fail fast
    variants = _variants(options)  # bad input fails before the analysis
    if len(variants) > 1:
        analyses = [analyze(options.input, engine=options.engine, rules=options.rules, variant=variant,
                            timeout_s=options.timeout, factory_arguments=factory_arguments) for variant in variants]
        print(variant_table(analyses), end="")
        return 0
    analysis = analyze(options.input, engine=options.engine, rules=options.rules, variant=variants[0],
                       keep=options.keep, timeout_s=options.timeout, factory_arguments=factory_arguments)
    if options.command == "analyze":
        outputs = [Output("--json", Path(options.json), json_text(to_json(analysis)))] if options.json else []
        if options.propose_roles:
            from toast.sharding.propose import propose_roles

            outputs.append(Output("--propose-roles", Path(options.propose_roles), propose_roles(analysis).to_toml()))
        write_outputs(outputs)
        print(summary(analysis), end="")
        return 0
    if options.command == "roles":
        from toast.sharding.propose import propose_roles

        proposed = propose_roles(analysis).to_toml()
        if options.output:
            write_outputs([Output("-o", Path(options.output), proposed)])
        print(argument_table(analysis), end="")
        print(f"roles proposed from the analysis{f' (written to {options.output})' if options.output else ''}:")
        print(proposed, end="")
        return 0
    if options.command == "shard":
        return _shard(options, analysis, mesh, hardware, roles)
    if options.command == "cost":
        return _cost(options, analysis, *cost_plan)
    if options.command == "validate":
        return _validate(options, analysis, document, mesh, hardware)
    if options.command == "autoshard":
        return _autoshard(options, analysis, *autoshard_plan)
    if options.command == "compare":
        return _compare(options, analysis, *autoshard_plan)
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


def _shard(options: argparse.Namespace, analysis, mesh, hardware, roles) -> int:
    from toast.cost.model import CostModel
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes, human_seconds
    from toast.output.strategy_file import strategy_json
    from toast.sharding.state import ShardingModel
    from toast.sharding.strategies import manual_strategy

    model = ShardingModel(analysis, mesh)
    roles = _roles_or_proposed(options.strategy, roles, analysis, mesh)
    state, actions = manual_strategy(model, options.strategy, roles)
    donate = tuple(range(len(analysis.program.arguments))) if options.donate else ()
    cost = CostModel(model, hardware, donate=donate).evaluate(state)
    document = strategy_json(model, state, actions, cost, source=options.input, hardware=hardware,
                             name=options.strategy, donate=donate)
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
          f"{len(actions)} actions, {_roles_origin(roles)}")
    print(f"step time {human_seconds(cost.step_time_s)} ({cost.kernels} kernels), peak memory "
          f"{human_bytes(cost.peak_bytes)} per device")
    print("  " + ", ".join(f"{key.removesuffix('_s').replace('_', ' ')} {human_seconds(seconds)}"
                           for key, seconds in cost.breakdown.items()))
    print(f"relative cost {cost.relative:.3f}: the step time over the unsharded program's on one device"
          + (", plus the penalty for memory over the device's" if cost.peak_bytes > hardware.hbm_bytes else ""))
    print("collectives: " + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"))
    return 0


def _cost_plan(options: argparse.Namespace):
    """What ``toast cost`` will price, checked before the analysis: ``(hardware, mesh, strategy, roles,
    document)`` with ``strategy`` a manual strategy's name or ``None`` and ``document`` a strategy file's."""
    from toast.cost.hardware import load_hardware
    from toast.output.strategy_file import read_strategy, strategy_mesh
    from toast.sharding.mesh import parse_mesh
    from toast.sharding.roles import roles_for_input
    from toast.sharding.strategies import COMPOSITES, STRATEGIES, check_strategy, strategy_parts

    hardware = load_hardware(options.hardware)
    mesh = parse_mesh(options.mesh) if options.mesh else None
    strategy = options.strategy
    if strategy is None:
        return hardware, mesh or parse_mesh("device=1"), None, None, None
    if strategy.endswith(".json") or Path(strategy).is_file():
        document = read_strategy(strategy)
        file_mesh = strategy_mesh(document, path=strategy)
        if mesh is not None and mesh != file_mesh:
            raise ToastError(f"--mesh {options.mesh}, but the strategy file {strategy} is for mesh {file_mesh.spec()}")
        return hardware, file_mesh, None, None, document
    try:
        strategy_parts(strategy)
    except ToastError:
        raise ToastError(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES + COMPOSITES)}; or a "
                         "strategy file from `toast shard -o`)") from None
    if mesh is None:
        raise ToastError(f"--strategy {strategy} needs --mesh, e.g. --mesh batch=4,model=2")
    roles = roles_for_input(options.input, roles_path=options.roles)
    # Without any roles, they are proposed from the analysis (and checked then).
    check_strategy(strategy, roles=roles if roles.dims else None, mesh=mesh)
    return hardware, mesh, strategy, roles, None


def _cost(options: argparse.Namespace, analysis, hardware, mesh, strategy, roles, document) -> int:
    from toast.cost.model import CostModel
    from toast.cost.network import mesh_group_span
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes, human_seconds
    from toast.output.strategy_file import cost_document, strategy_state
    from toast.sharding.state import ShardingModel, spec_entries
    from toast.sharding.strategies import manual_strategy

    model = ShardingModel(analysis, mesh)
    if document is not None:
        state = strategy_state(model, document, path=options.strategy)
        donate = tuple(document.get("donate", ()))
        label = f"strategy file {options.strategy}"
    elif strategy is not None:
        roles = _roles_or_proposed(strategy, roles, analysis, mesh)
        state, _ = manual_strategy(model, strategy, roles)
        donate = ()
        label = f"strategy {strategy} ({_roles_origin(roles)})"
    else:
        state, donate, label = model.initial(), (), "unsharded"
    if options.donate:
        donate = tuple(range(len(analysis.program.arguments)))
    costs = CostModel(model, hardware, donate=donate, overlap=not options.no_overlap,
                      microbatches=options.microbatches)
    cost = costs.evaluate(state)
    live = costs.live_at_peak(state)
    program = analysis.program
    breakdown = cost.breakdown
    print(f"{program.name}: {label} on mesh {mesh.spec()} ({hardware.name}){', arguments donated' if donate else ''}"
          f"{f', {options.microbatches} micro-batches' if options.microbatches > 1 else ''}")
    print(f"step time {human_seconds(cost.step_time_s)} per device: {cost.kernels} kernels, "
          f"{len(cost.collectives)} collectives")
    rows = (("compute-bound kernels", "compute_bound_s"), ("memory-bound kernels", "memory_bound_s"),
            ("launch overhead", "launch_overhead_s"), ("exposed communication", "exposed_communication_s"),
            ("hidden communication", "hidden_communication_s"))
    for label_text, key in rows:
        note = " (overlapped, not in the step time)" if key == "hidden_communication_s" else ""
        print(f"  {label_text:<22} {human_seconds(breakdown[key]):>10}{note}")
    if cost.communication_s:
        print(f"communication: {cost.collectives_launched} collectives launched after combining")
        for axis_set, seconds in cost.communication_s.items():
            exposed = cost.exposed_communication_by_axes_s.get(axis_set, 0.0)
            span = mesh_group_span(mesh.axes, axis_set.split("+"), hardware)
            print(f"  over {axis_set:<19} {human_seconds(seconds):>10}, {human_seconds(max(seconds - exposed, 0.0))} "
                  f"hidden ({span.devices} devices, {span.per_node} per node: {span.levels(hardware)})")
        for level, seconds in cost.communication_by_level_s.items():
            print(f"  on {level:<21} {human_seconds(seconds):>10}")
    print(f"peak memory {human_bytes(cost.peak_bytes)} per device; largest live buffers at the peak:")
    for buffer in live:
        shape = "x".join(str(d) for d in buffer.shape) or "scalar"
        axes = spec_entries(model.value_axes(state, buffer.value)) if buffer.shape else ()
        sharded = f" sharded {list(axes)}" if any(a is not None for a in axes) else ""
        print(f"  {human_bytes(buffer.bytes):>10}  {buffer.name} {buffer.dtype}[{shape}]{sharded}"
              f"{'  ' + buffer.loc if buffer.loc else ''}")
    if options.json:
        document_out = cost_document(
            cost, live, program=program.name, source=options.input, hardware=hardware.name, mesh_axes=mesh.axes,
            strategy=strategy or (options.strategy if document is not None else None), donate=donate,
            overlap=not options.no_overlap, microbatches=options.microbatches)
        write_outputs([Output("--json", Path(options.json), json_text(document_out))])
    return 0


def _add_search_options(parser: argparse.ArgumentParser) -> None:
    """The mesh, hardware, search and roles options, shared by ``autoshard`` and ``compare``."""
    parser.add_argument("--mesh", required=True, help="logical mesh, e.g. batch=4,model=2 or data=2,seq=2,model=2")
    parser.add_argument("--hardware", default="a100_80gb", help="accelerator profile (hardware/NAME.toml) or a "
                        "TOML path")
    parser.add_argument("--roles", metavar="FILE", help="roles file for the manual strategies of the comparison "
                        "table (default: <module>.roles.toml beside the module)")
    parser.add_argument("--memory", type=_memory_gib, metavar="GiB", help="memory per device in GiB "
                                  "(default: the profile's HBM)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=_positive_seconds, metavar="SECONDS", help="stop searching after SECONDS")
    budget.add_argument("--rollouts", type=_ROLLOUTS, metavar="N", help="run N rollouts, fewer only when every state "
                        "has been scored (default 2000)")
    parser.add_argument("--seed", type=_SEED, default=0, help="search seed (same seed, same strategy)")
    parser.add_argument("--patience", type=_ROLLOUTS, metavar="N", help="rollouts without a better state before a tree "
                        "restarts below its best state (default: SearchSettings.patience)")
    parser.add_argument("--restarts", type=_RESTARTS, metavar="N", help="restarts per tree before it stops early "
                        "(default: no limit, the budget is spent)")
    _add_microbatches_option(parser)
    parser.add_argument("--workers", type=_PROCESSES, default=0, metavar="N", help="worker processes (default: "
                                  "one per core; the result does not depend on it)")
    parser.add_argument("--pin", action="append", default=[], metavar="NAME=AXES,...",
                                  help="keep an argument's sharding, e.g. 'tokens=batch,' (dim 0 on batch, dim 1 "
                                  "whole; 'x=batch+model,' splits dim 0 over both); repeatable")
    parser.add_argument("--phase", action="append", default=[], metavar="AXES:GOAL",
                                  help="search in phases, in order: the mesh axes a phase may use ('+'-separated) "
                                  "and its goal, runtime or memory, e.g. --phase model:memory --phase batch:runtime "
                                  "(PartIR's composite strategies); default: one phase, all axes, runtime")


def _add_microbatches_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--microbatches", type=_MICROBATCHES, default=1, metavar="K", help="gradient accumulation: the "
                        "program is one micro-batch's step, K of them make a step and the gradients are reduced "
                        "once, in the last (Megatron-LM's micro-batches; default 1)")


def _autoshard_plan(options: argparse.Namespace):
    """``(mesh, hardware, settings, pins)`` of ``toast autoshard``, checked before the analysis."""
    from toast.cost.hardware import load_hardware
    from toast.search.actions import parse_pins
    from toast.search.mcts import Phase, SearchSettings
    from toast.sharding.mesh import parse_mesh

    mesh = parse_mesh(options.mesh)
    hardware = load_hardware(options.hardware)
    pins: dict[str, tuple] = {}
    for name, entries in parse_pins(";".join(options.pin)).items():  # repeated --pin options: one list
        for entry in entries:
            for axis in (entry,) if isinstance(entry, str) else entry or ():
                mesh.index(axis)  # an unknown axis is named now
        pins[name] = entries
    phases = []
    for text in options.phase:
        axes_text, sep, goal = text.rpartition(":")
        if not sep or goal not in ("runtime", "memory"):
            raise ToastError(f"--phase {text}: expected AXES:GOAL with GOAL runtime or memory, e.g. model:memory")
        axes = tuple(a for a in axes_text.split("+") if a)
        for axis in axes:
            mesh.index(axis)  # an unknown axis is named now
        phases.append(Phase(axes, goal))
    rollouts = options.rollouts if options.rollouts is not None else (None if options.budget is not None else 2000)
    settings = SearchSettings(seed=options.seed, rollouts=rollouts, seconds=options.budget, workers=options.workers,
                              restarts=options.restarts, phases=tuple(phases) or (Phase(),),
                              **({} if options.patience is None else {"patience": options.patience}))
    return mesh, hardware, settings, pins


def _autoshard(options: argparse.Namespace, analysis, mesh, hardware, settings, pins) -> int:
    from toast.cost.model import Cost
    from toast.evaluation.compare import compare_manual
    from toast.output.autoshard import strategy_document
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes, human_seconds
    from toast.search.find import find_strategy
    from toast.sharding.roles import roles_for_input

    try:
        roles = roles_for_input(options.input, roles_path=options.roles)
    except ToastError:
        if options.roles:
            raise  # a roles file the user names must be read, not replaced by proposed roles
        roles = None
    progress = _Progress(sys.stderr) if sys.stderr.isatty() else None
    found = find_strategy(analysis, mesh, hardware, pinned=pins, settings=settings, memory_gib=options.memory,
                          microbatches=options.microbatches, roles=roles, progress=progress)
    if progress is not None:
        progress.finish()
    manual = compare_manual(found)
    document = strategy_document(found, source=options.input)
    outputs = []
    if options.output:
        outputs.append(Output("-o", Path(options.output), json_text(document)))
    if options.report:
        from toast.evaluation.compare import comparison_result
        from toast.evaluation.report import report_html, report_section

        section = report_section(comparison_result(found, manual, source=options.input))
        outputs.append(Output("--report", Path(options.report), report_html(
            [section], title=f"toast autoshard: {analysis.program.name} on {mesh.spec()}")))
    if options.emit:
        from toast.output.sharded_stablehlo import sharded_module_text

        outputs.append(Output("--emit", Path(options.emit), sharded_module_text(found.model, found.result.state)))
    write_outputs(outputs)
    result = found.result
    print(f"{analysis.program.name}: toast's strategy on mesh {mesh.spec()} ({hardware.name}, "
          f"{human_bytes(found.device_memory)} per device): {len(result.actions)} actions from "
          f"{len(found.space)} ({len(found.space.classes)} color classes), {result.rollouts} rollouts in "
          f"{settings.lanes} lanes, {result.evaluations} states costed, {result.seconds:.1f} s, seed "
          f"{settings.seed}")
    if found.origin != "search":
        print(f"  the manual strategy {found.origin} ({_roles_text(found.roles)}) beats what the search found: "
              f"toast's strategy is {found.origin}")
    for tensor in document["arguments"]:
        if any(entry is not None for entry in tensor["partition_spec"]):
            print(f"  {tensor['name']}: {tensor['partition_spec']}")
    rows: list[tuple[str, Cost | None, bool, str]] = [("toast", result.cost, found.over_memory, "")]
    rows += [(row.name, row.cost, row.over_memory, row.reason) for row in manual]
    print("| strategy | step time | peak per device | over memory | relative cost |")
    print("|---|---|---|---|---|")
    for name, cost, over, reason in rows:
        if cost is None:
            print(f"| {name} | - | - | - | does not apply: {reason} |")
        else:
            print(f"| {name} | {human_seconds(cost.step_time_s)} | {human_bytes(cost.peak_bytes)} | "
                  f"{'yes' if over else 'no'} | {cost.relative:.3f} |")
    if found.over_memory:
        print(f"toast: error: no strategy found fits {human_bytes(found.device_memory)} per device (best: "
              f"{human_bytes(result.cost.peak_bytes)}; {_floor_text(found)}); the strategy file is flagged "
              "over_memory", file=sys.stderr)
        return 3
    return 0


def _compare(options: argparse.Namespace, analysis, mesh, hardware, settings, pins) -> int:
    from toast.evaluation.compare import compare, comparison_json, comparison_table
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes
    from toast.sharding.roles import roles_for_input

    try:
        roles = roles_for_input(options.input, roles_path=options.roles)
    except ToastError:
        if options.roles:
            raise
        roles = None
    progress = _Progress(sys.stderr) if sys.stderr.isatty() else None
    result = compare(analysis, mesh, hardware, source=options.input, roles=roles, settings=settings,
                     memory_gib=options.memory, pinned=pins, validate_on_host=options.validate,
                     microbatches=options.microbatches, progress=progress)
    if progress is not None:
        progress.finish()
    outputs = []
    if options.json:
        outputs.append(Output("--json", Path(options.json), json_text(comparison_json(result))))
    if options.report:
        from toast.evaluation.report import report_html, report_section

        outputs.append(Output("--report", Path(options.report), report_html(
            [report_section(result)], title=f"toast compare: {analysis.program.name} on {mesh.spec()}")))
    write_outputs(outputs)
    print(f"{analysis.program.name} on mesh {mesh.spec()} ({hardware.name}, {human_bytes(result.found.device_memory)} "
          f"per device; roles: {_roles_text(result.found.roles)})")
    print(comparison_table(result), end="")
    mismatched = [row.name for row in result.rows if row.agreement is not None and not row.agreement.numerics.match]
    if mismatched:
        print(f"toast: error: XLA's outputs differ from the unsharded program's for {', '.join(mismatched)}",
              file=sys.stderr)
        return 1
    if result.found.over_memory:
        print(f"toast: error: no strategy found fits {human_bytes(result.found.device_memory)} per device "
              f"({_floor_text(result.found)})", file=sys.stderr)
        return 3
    return 0


def _roles_or_proposed(strategy: str, roles, analysis, mesh):
    """``roles``, or where none were given, roles proposed from the analysis; checked against what
    ``strategy`` needs (given roles were checked before the analysis: proposed ones can be only now)."""
    from toast.sharding.propose import roles_or_proposed
    from toast.sharding.strategies import check_strategy

    roles = roles_or_proposed(roles, analysis)
    check_strategy(strategy, roles=roles, mesh=mesh)
    return roles


def _roles_origin(roles) -> str:
    """``roles from FILE``, or the proposed roles listed (``_roles_text``)."""
    from toast.sharding.propose import PROPOSED_SOURCE

    return _roles_text(roles) if roles.source == PROPOSED_SOURCE else f"roles from {roles.source}"


def _roles_text(roles) -> str:
    """Where the manual strategies' roles come from; proposed ones are listed (``toast analyze
    --propose-roles FILE`` writes them as a roles file to edit)."""
    from toast.sharding.propose import PROPOSED_SOURCE

    if roles is None:
        return "none"
    if roles.source != PROPOSED_SOURCE:
        return roles.source
    listed = "; ".join(f"{role} {', '.join(f'{name}:{dim}' for name, dim in pairs[:3])}"
                       + (f" (+{len(pairs) - 3})" if len(pairs) > 3 else "") for role, pairs in roles.dims.items())
    return f"{PROPOSED_SOURCE}: {listed or 'none'}"


def _floor_text(found) -> str:
    """What the memory floor says about a limit nothing found fits (``Found.floor_bytes``)."""
    from toast.output.report import human_bytes

    devices = found.model.mesh.devices
    if found.floor_bytes > found.device_memory:
        return (f"no sharding over {devices} devices can fit: the buffers live at the unsharded peak, split "
                f"{devices} ways, take {human_bytes(found.floor_bytes)}")
    return (f"the floor, the buffers live at the unsharded peak split {devices} ways, is "
            f"{human_bytes(found.floor_bytes)}")


def _sweep(options: argparse.Namespace) -> int:
    from toast.evaluation.sweep import load_sweep, sweep

    plan = load_sweep(options.sweep)

    def progress(record, done: int, total: int) -> None:
        outcome = "ok" if record["status"] == "ok" else f"error: {record['error']}"
        print(f"[{done}/{total}] {record['job']}: {outcome} ({record['job_seconds']:.1f} s)", file=sys.stderr,
              flush=True)

    if options.report:
        from toast.output.files import check_output

        check_output(options.report, option="--report")
        if Path(options.report).resolve() == Path(options.output).resolve():
            raise ToastError(f"--report {options.report} is the sweep's folder (-o): give the report its own file")
    records = sweep(plan.jobs, options.output, workers=options.jobs, ray_address=options.ray,
                    job_timeout=options.job_timeout, progress=progress)
    if options.report:
        from toast.evaluation.report import report_html
        from toast.evaluation.sweep import summary_row
        from toast.output.files import Output, write_outputs

        sections = [record["report"] for record in records if record["status"] == "ok"]
        write_outputs([Output("--report", Path(options.report), report_html(
            sections, title=f"toast sweep: {plan.source} ({len(records)} jobs)",
            summary=[summary_row(record) for record in records]))])
    print((Path(options.output) / "summary.md").read_text(), end="")
    failed = [record["job"] for record in records if record["status"] != "ok"]
    if failed:
        print(f"toast: {len(failed)} of {len(records)} jobs failed (their errors are in the table)", file=sys.stderr)
        return 1
    return 0


class _Progress:
    """One self-rewriting line on a terminal: best step time, rollouts and their rate, seconds."""

    def __init__(self, stream):
        self.stream = stream

    def __call__(self, round_result, rollouts: int, seconds: float) -> None:
        from toast.output.report import human_seconds

        rate = rollouts / seconds if seconds > 0 else 0.0
        self.stream.write(f"\rsearch: best step {human_seconds(round_result.best_step_time_s)} (relative "
                          f"{round_result.best_relative:.3f}), {rollouts} rollouts, {rate:.0f}/s, {seconds:.1f} s   ")
        self.stream.flush()

    def finish(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


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
