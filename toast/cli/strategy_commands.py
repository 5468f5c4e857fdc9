"""The commands on strategies: ``shard`` (a manual strategy), ``cost`` (one strategy priced), ``autoshard`` (the
search), ``compare`` (the search against every manual strategy) and ``validate`` (XLA's check on host devices)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toast.cli.command import Command
from toast.cli.options import (
    DEVICES,
    SEED,
    add_analysis_options,
    add_microbatches_option,
    add_search_options,
    add_slices_option,
)
from toast.errors import ToastError

__all__ = ["STRATEGY_COMMANDS"]


@dataclass(frozen=True)
class ShardPlan:
    """``toast shard``'s mesh, profile and roles (given ones checked against the strategy)."""

    mesh: Any
    hardware: Any
    roles: Any


def _shard_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    parser.add_argument("--mesh", required=True, help="logical mesh, e.g. batch=4,model=2")
    parser.add_argument("--hardware", default="a100_80gb", help="accelerator profile (hardware/NAME.toml) "
                        "or a TOML path")
    add_slices_option(parser)
    parser.add_argument("--strategy", default="data_parallel",
                        help="an expert strategy: data_parallel, megatron, fsdp, sequence, fsdp+megatron, "
                        "data_parallel_all, fsdp_all, maxtext, expert_parallel, ... (`toast compare` lists them all)")
    parser.add_argument("--roles", metavar="FILE", help="roles file (TOML) naming the argument dims each "
                        "strategy shards; default: <module>.roles.toml beside a module:function's module")
    parser.add_argument("--batch", metavar="ARG:DIM", help="the batch dim, e.g. ids:0 (enough for "
                        "data_parallel; replaces the roles file's batch role)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the strategy JSON to FILE")
    parser.add_argument("--emit", metavar="FILE", help="write the StableHLO annotated with the shardings "
                        "(Shardy form, as jax.jit lowers it) to FILE")
    parser.add_argument("--donate", action="store_true", help="donate the arguments (jax.jit donate_argnums): "
                        "outputs may reuse their buffers; recorded in the strategy file")


def _check_shard(options: argparse.Namespace) -> ShardPlan:
    from toast.cost.hardware import load_hardware
    from toast.cost.network import check_slices
    from toast.sharding.mesh import parse_mesh
    from toast.sharding.roles import roles_for_input
    from toast.sharding.strategies import check_strategy

    mesh = parse_mesh(options.mesh, slices=options.slices or 1)
    hardware = load_hardware(options.hardware)
    check_slices(mesh, hardware)
    roles = roles_for_input(options.input, roles_path=options.roles, batch=options.batch)
    # Without any roles, they are proposed from the analysis (and checked then).
    check_strategy(options.strategy, roles=roles if roles.dims else None, mesh=mesh)
    return ShardPlan(mesh, hardware, roles)


def _run_shard(options: argparse.Namespace, analysis, plan: ShardPlan) -> int:
    from toast.cost.model import CostModel
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes, human_seconds
    from toast.output.strategy_file import strategy_json
    from toast.sharding.state import ShardingModel
    from toast.sharding.strategies import manual_strategy

    mesh, hardware, roles = plan.mesh, plan.hardware, plan.roles
    model = ShardingModel(analysis, mesh)
    roles = roles_or_proposed_for(options.strategy, roles, analysis, mesh)
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
    print(f"{analysis.program.name}: strategy {options.strategy} on mesh {mesh.label()} ({hardware.name}), "
          f"{len(actions)} actions, {roles_origin(roles)}")
    print(f"step time {human_seconds(cost.step_time_s)} ({cost.kernels} kernels), peak memory "
          f"{human_bytes(cost.peak_bytes)} per device")
    print("  " + ", ".join(f"{key.removesuffix('_s').replace('_', ' ')} {human_seconds(seconds)}"
                           for key, seconds in cost.breakdown.items()
                           if seconds or "host_transfer" not in key))  # host copies: where a program has them
    print(f"relative cost {cost.relative:.3f}: the step time over the unsharded program's on one device"
          + (", plus the penalty for memory over the device's" if cost.peak_bytes > hardware.hbm_bytes else ""))
    print("collectives: " + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"))
    return 0


@dataclass(frozen=True)
class CostPlan:
    """``toast cost``'s profile and mesh, and what it prices: a manual strategy (with its roles), a strategy
    file's document, or neither (the program unsharded)."""

    hardware: Any
    mesh: Any
    strategy: str | None
    roles: Any
    document: dict[str, Any] | None


def _cost_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    parser.add_argument("--hardware", required=True, help="accelerator profile (hardware/NAME.toml) or a TOML "
                        "path")
    parser.add_argument("--mesh", help="logical mesh, e.g. batch=4,model=2 (default: one device, unsharded)")
    add_slices_option(parser)
    parser.add_argument("--strategy", metavar="NAME|FILE", help="an expert strategy (data_parallel, megatron, "
                        "fsdp, sequence, fsdp+megatron, fsdp_all, maxtext, expert_parallel, ...; needs --mesh) or a "
                        "strategy file from `toast shard -o`")
    parser.add_argument("--roles", metavar="FILE", help="roles file (TOML) for a manual strategy")
    parser.add_argument("--donate", action="store_true", help="donate the arguments (jax.jit donate_argnums): "
                        "outputs may reuse their buffers")
    parser.add_argument("--no-overlap", action="store_true", help="run collectives on the compute stream")
    add_microbatches_option(parser)
    parser.add_argument("--json", metavar="FILE", help="write the estimate as JSON to FILE")


def _cost_plan(options: argparse.Namespace) -> CostPlan:
    """What ``toast cost`` will price, checked before the analysis: ``(hardware, mesh, strategy, roles,
    document)`` with ``strategy`` a manual strategy's name or ``None`` and ``document`` a strategy file's."""
    from toast.cost.hardware import load_hardware
    from toast.cost.network import check_slices
    from toast.output.strategy_file import read_strategy_document, strategy_mesh
    from toast.sharding.mesh import parse_mesh
    from toast.sharding.roles import roles_for_input
    from toast.sharding.strategies import STRATEGY_NAMES, check_strategy, strategy_parts

    hardware = load_hardware(options.hardware)
    mesh = parse_mesh(options.mesh, slices=options.slices or 1) if options.mesh else None
    if options.slices is not None and mesh is None and not options.strategy:
        raise ToastError(f"--slices {options.slices} needs --mesh (or a strategy file): the slices split a mesh")
    if mesh is not None:
        check_slices(mesh, hardware)
    strategy = options.strategy
    if strategy is None:
        return CostPlan(hardware, mesh or parse_mesh("device=1"), None, None, None)
    if strategy.endswith(".json") or Path(strategy).is_file():
        document = read_strategy_document(strategy)
        file_mesh = strategy_mesh(document, path=strategy)
        if mesh is not None and mesh.axes != file_mesh.axes:
            raise ToastError(f"--mesh {options.mesh}, but the strategy file {strategy} is for mesh {file_mesh.spec()}")
        if options.slices is not None:  # where the strategy runs is the user's to say; the file's by default
            file_mesh = parse_mesh(file_mesh.spec(), slices=options.slices)
        check_slices(file_mesh, hardware)
        return CostPlan(hardware, file_mesh, None, None, document)
    try:
        strategy_parts(strategy)
    except ToastError:
        raise ToastError(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGY_NAMES)}; or a "
                         "strategy file from `toast shard -o`)") from None
    if mesh is None:
        raise ToastError(f"--strategy {strategy} needs --mesh, e.g. --mesh batch=4,model=2")
    roles = roles_for_input(options.input, roles_path=options.roles)
    # Without any roles, they are proposed from the analysis (and checked then).
    check_strategy(strategy, roles=roles if roles.dims else None, mesh=mesh)
    return CostPlan(hardware, mesh, strategy, roles, None)


def _run_cost(options: argparse.Namespace, analysis, plan: CostPlan) -> int:
    from toast.cost.model import CostModel
    from toast.cost.network import mesh_group_span
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes, human_seconds
    from toast.output.strategy_file import cost_document, strategy_state
    from toast.sharding.state import ShardingModel, spec_entries
    from toast.sharding.strategies import manual_strategy

    hardware, mesh, strategy, roles, document = plan.hardware, plan.mesh, plan.strategy, plan.roles, plan.document
    model = ShardingModel(analysis, mesh)
    if document is not None:
        state = strategy_state(model, document, path=options.strategy)
        donate = tuple(document.get("donate", ()))
        label = f"strategy file {options.strategy}"
    elif strategy is not None:
        roles = roles_or_proposed_for(strategy, roles, analysis, mesh)
        state, _ = manual_strategy(model, strategy, roles)
        donate = ()
        label = f"strategy {strategy} ({roles_origin(roles)})"
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
    print(f"{program.name}: {label} on mesh {mesh.label()} ({hardware.name}){', arguments donated' if donate else ''}"
          f"{f', {options.microbatches} micro-batches' if options.microbatches > 1 else ''}")
    print(f"step time {human_seconds(cost.step_time_s)} per device: {cost.kernels} kernels, "
          f"{len(cost.collectives)} collectives")
    rows: tuple[tuple[str, str], ...] = (
        ("compute-bound kernels", "compute_bound_s"), ("memory-bound kernels", "memory_bound_s"),
        ("launch overhead", "launch_overhead_s"), ("exposed communication", "exposed_communication_s"),
        ("hidden communication", "hidden_communication_s"))
    if breakdown.get("exposed_host_transfer_s", 0.0) + breakdown.get("hidden_host_transfer_s", 0.0) > 0:
        rows += (("exposed host transfers", "exposed_host_transfer_s"),  # values offloaded to host memory
                 ("hidden host transfers", "hidden_host_transfer_s"))
    for label_text, key in rows:
        note = " (overlapped, not in the step time)" if key.startswith("hidden_") else ""
        print(f"  {label_text:<22} {human_seconds(breakdown[key]):>10}{note}")
    if cost.communication_s:
        print(f"communication: {cost.collectives_launched} collectives launched after combining")
        for axis_set, seconds in cost.communication_s.items():
            exposed = cost.exposed_communication_by_axes_s.get(axis_set, 0.0)
            span = mesh_group_span(mesh.axes, axis_set.split("+"), hardware, slices=mesh.slices)
            print(f"  over {axis_set:<19} {human_seconds(seconds):>10}, {human_seconds(max(seconds - exposed, 0.0))} "
                  f"hidden ({span.devices} devices, {span.per_node} per {'slice' if mesh.slices > 1 else 'node'}: "
                  f"{span.levels(hardware)})")
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
            overlap=not options.no_overlap, microbatches=options.microbatches, slices=mesh.slices)
        write_outputs([Output("--json", Path(options.json), json_text(document_out))])
    return 0


@dataclass(frozen=True)
class SearchPlan:
    """``toast autoshard``'s and ``toast compare``'s mesh, profile, search (a ``Search``, its ``Budget`` and its
    own settings) and pins."""

    mesh: Any
    hardware: Any
    search: Any
    budget: Any
    settings: Any
    pins: dict[str, tuple]


def _autoshard_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    add_search_options(parser)
    parser.add_argument("-o", "--output", metavar="FILE", help="write the strategy JSON to FILE")
    parser.add_argument("--emit", metavar="FILE", help="write the StableHLO annotated with the "
                        "shardings to FILE")
    parser.add_argument("--report", metavar="FILE", help="write an HTML report (shardings, colors per "
                        "axis, collectives, memory timeline, search rounds, strategies) to FILE")


def _search_plan(options: argparse.Namespace) -> SearchPlan:
    """``toast autoshard``'s (and ``compare``'s) plan, checked before the analysis."""
    from toast.cost.hardware import load_hardware
    from toast.cost.network import check_slices
    from toast.search.actions import parse_pins
    from toast.search.base import Budget, Phase
    from toast.search.registry import search_by_name
    from toast.sharding.mesh import parse_mesh

    mesh = parse_mesh(options.mesh, slices=options.slices or 1)
    hardware = load_hardware(options.hardware)
    check_slices(mesh, hardware)
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
    budget = Budget(seed=options.seed, rollouts=rollouts, seconds=options.budget, workers=options.workers,
                    phases=tuple(phases) or (Phase(),))
    search = search_by_name(options.search)
    knobs = {name: value for name, value in (("patience", options.patience), ("restarts", options.restarts))
             if value is not None}
    if knobs and search.name != "mcts":
        raise ToastError(f"--{next(iter(knobs))} is a setting of --search mcts, not of --search {search.name}")
    settings = search.settings_type(**knobs)
    return SearchPlan(mesh, hardware, search, budget, settings, pins)


def _given_roles(options: argparse.Namespace):
    """The roles file named (``--roles``) or found beside the module; ``None`` where there is none (the search
    then proposes roles from the analysis). A roles file the user names must be read, not replaced."""
    from toast.sharding.roles import roles_for_input

    try:
        return roles_for_input(options.input, roles_path=options.roles)
    except ToastError:
        if options.roles:
            raise
        return None


SHOWN_ARGUMENTS = 10  # sharded arguments `toast autoshard` prints before its table (a T5 has ~1,200; -o has all)


def _run_autoshard(options: argparse.Namespace, analysis, plan: SearchPlan) -> int:
    from toast.cost.model import Cost
    from toast.evaluation.compare import compare_manual
    from toast.output.autoshard import strategy_document
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes, human_seconds
    from toast.search.find import find_strategy

    mesh, hardware, settings, pins = plan.mesh, plan.hardware, plan.settings, plan.pins
    roles = _given_roles(options)
    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    found = find_strategy(analysis, mesh, hardware, pinned=pins, search=plan.search, budget=plan.budget,
                          settings=settings, memory_gib=options.memory, microbatches=options.microbatches,
                          roles=roles, progress=progress)
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
          f"{len(found.space)} ({len(found.space.classes)} color classes), {result.rollouts} rollouts "
          f"{f'in {settings.lanes} lanes' if plan.search.name == 'mcts' else f'of {plan.search.name} search'}, "
          f"{result.evaluations} states costed, {result.seconds:.1f} s, seed {plan.budget.seed}")
    if found.origin != "search":
        print(f"  the manual strategy {found.origin} ({roles_text(found.roles)}) beats what the search found: "
              f"toast's strategy is {found.origin}")
    sharded = [tensor for tensor in document["arguments"] if any(e is not None for e in tensor["partition_spec"])]
    for tensor in sharded[:SHOWN_ARGUMENTS]:
        print(f"  {tensor['name']}: {tensor['partition_spec']}")
    if len(sharded) > SHOWN_ARGUMENTS:
        rest = len(sharded) - SHOWN_ARGUMENTS
        where = f"all in {options.output}" if options.output else "write them all with -o FILE"
        print(f"  ... {rest} more sharded argument{'s' if rest > 1 else ''} ({where})")
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
              f"{human_bytes(result.cost.peak_bytes)}; {floor_text(found)}); the strategy file is flagged "
              "over_memory", file=sys.stderr)
        return 3
    return 0


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    add_search_options(parser)
    parser.add_argument("--validate", action="store_true", help="also compile and run every strategy "
                        "that applies with XLA on host CPU devices (numerics and collectives)")
    parser.add_argument("--json", metavar="FILE", help="write the comparison as JSON to FILE")
    parser.add_argument("--report", metavar="FILE", help="write an HTML report of the comparison to FILE")


def _check_compare(options: argparse.Namespace) -> SearchPlan:
    from toast.evaluation.compare import check_host_validation

    plan = _search_plan(options)
    check_host_validation(plan.mesh, validate_on_host=options.validate)
    return plan


def _run_compare(options: argparse.Namespace, analysis, plan: SearchPlan) -> int:
    from toast.evaluation.compare import compare, comparison_json, comparison_table
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import human_bytes

    mesh, hardware, pins = plan.mesh, plan.hardware, plan.pins
    roles = _given_roles(options)
    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    from toast.xla.worker import WorkerTimeout

    try:
        result = compare(analysis, mesh, hardware, source=options.input, roles=roles, budget=plan.budget,
                         search=plan.search, settings=plan.settings, memory_gib=options.memory, pinned=pins,
                         validate_on_host=options.validate,
                         microbatches=options.microbatches, progress=progress, validate_timeout_s=options.timeout)
    except WorkerTimeout as err:  # name the option this command takes, not the Python keyword
        raise WorkerTimeout(err.limit_s, err.stage, err.stuck, option="--timeout ") from None
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
          f"per device; roles: {roles_text(result.found.roles)})")
    print(comparison_table(result), end="")
    mismatched = [row.name for row in result.rows if row.agreement is not None and not row.agreement.numerics.match]
    if mismatched:
        print(f"toast: error: XLA's outputs differ from the unsharded program's for {', '.join(mismatched)}",
              file=sys.stderr)
        return 1
    if result.found.over_memory:
        print(f"toast: error: no strategy found fits {human_bytes(result.found.device_memory)} per device "
              f"({floor_text(result.found)})", file=sys.stderr)
        return 3
    return 0


@dataclass(frozen=True)
class ValidatePlan:
    """``toast validate``'s strategy file (read and checked), its mesh and the profile it is priced on."""

    document: dict[str, Any]
    mesh: Any
    hardware: Any


def _validate_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    parser.add_argument("strategy", metavar="STRATEGY", help="strategy JSON from `toast shard -o`")
    parser.add_argument("--devices", type=DEVICES, required=True, metavar="N",
                        help="host CPU devices (must equal the strategy's mesh size)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the random inputs")
    parser.add_argument("--hardware", metavar="NAME|FILE", help="price the predictions on this profile "
                        "(default: the one the strategy file records)")
    parser.add_argument("--json", metavar="FILE", help="write the agreement as JSON to FILE")


def _check_validate(options: argparse.Namespace) -> ValidatePlan:
    from toast.cost.hardware import load_hardware
    from toast.output.strategy_file import read_strategy_document, strategy_hardware, strategy_mesh

    document = read_strategy_document(options.strategy)
    mesh = strategy_mesh(document, path=options.strategy)
    if options.devices != mesh.devices:
        raise ToastError(f"--devices {options.devices}, but the strategy's mesh {mesh.spec()} has "
                         f"{mesh.devices} devices")
    hardware = (load_hardware(options.hardware) if options.hardware
                else strategy_hardware(document, path=options.strategy))
    return ValidatePlan(document, mesh, hardware)


def _run_validate(options: argparse.Namespace, analysis, plan: ValidatePlan) -> int:
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.strategy_file import strategy_state
    from toast.sharding.state import ShardingModel
    from toast.xla.validate import agreement_json, format_agreement, validate
    from toast.xla.worker import WorkerTimeout

    document, mesh, hardware = plan.document, plan.mesh, plan.hardware
    model = ShardingModel(analysis, mesh)
    state = strategy_state(model, document, path=options.strategy)
    try:
        agreement = validate(model, state, hardware, seed=options.seed, timeout_s=options.timeout)
    except WorkerTimeout as err:  # name the option this command takes, not the Python keyword
        raise WorkerTimeout(err.limit_s, err.stage, err.stuck, option="--timeout ") from None
    print(f"{analysis.program.name}: strategy {document.get('strategy', '?')} on mesh {mesh.spec()}, "
          f"{mesh.devices} host CPU devices")
    print(format_agreement(agreement), end="")
    if options.json:
        write_outputs([Output("--json", Path(options.json), json_text(agreement_json(agreement)))])
    if not agreement.numerics.match:
        print("toast: error: the sharded program's outputs differ from the unsharded program's", file=sys.stderr)
        return 1
    return 0


def roles_or_proposed_for(strategy: str, roles, analysis, mesh):
    """``roles``, or where none were given, roles proposed from the analysis; checked against what
    ``strategy`` needs (given roles were checked before the analysis: proposed ones can be only now)."""
    from toast.sharding.propose import roles_or_proposed
    from toast.sharding.strategies import check_strategy

    roles = roles_or_proposed(roles, analysis)
    check_strategy(strategy, roles=roles, mesh=mesh)
    return roles


def roles_origin(roles) -> str:
    """``roles from FILE``, or the proposed roles listed (``roles_text``)."""
    from toast.sharding.propose import PROPOSED_SOURCE

    return roles_text(roles) if roles.source == PROPOSED_SOURCE else f"roles from {roles.source}"


def roles_text(roles) -> str:
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


def floor_text(found) -> str:
    """What the memory floor says about a limit nothing found fits (``Found.floor_bytes``)."""
    from toast.output.report import human_bytes

    devices = found.model.mesh.devices
    if found.floor_bytes > found.device_memory:
        return (f"no sharding over {devices} devices can fit: the buffers live at the unsharded peak, split "
                f"{devices} ways, take {human_bytes(found.floor_bytes)}")
    return (f"the floor, the buffers live at the unsharded peak split {devices} ways, is "
            f"{human_bytes(found.floor_bytes)}")


class Progress:
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


STRATEGY_COMMANDS = (
    Command("shard", arguments=_shard_arguments, run=_run_shard, check=_check_shard,
            help="apply a manual strategy on a mesh and estimate its cost"),
    Command("cost", arguments=_cost_arguments, run=_run_cost, check=_cost_plan,
            help="estimate one device's step time and peak memory"),
    Command("autoshard", arguments=_autoshard_arguments, run=_run_autoshard, check=_search_plan,
            help="search a sharding (MCTS over the analysis's actions, guided by the cost model, or --search "
                 "random / greedy) and compare it with the manual strategies"),
    Command("compare", arguments=_compare_arguments, run=_run_compare, check=_check_compare,
            help="toast's search against every manual strategy that applies: step time, peak per device, over "
                 "memory, search seconds"),
    Command("validate", arguments=_validate_arguments, run=_run_validate, check=_check_validate,
            help="compile and run a strategy with XLA on host CPU devices; compare collectives and memory with "
                 "the predictions"),
)
