"""``toast compare``: toast's search against every manual strategy that applies, on one program, mesh and
accelerator profile (the rows of the paper's Figure 8), with the XLA check on host devices on request.

Each row has the estimated step time and peak per device (``toast.CostModel``), whether it is over the
memory limit, and for toast's row the search's seconds; every expert strategy of
``toast.sharding.strategies.EXPERT_STRATEGIES`` has a row (the reason, where it does not apply). Under the
table, toast's gain (``Gains``): the step time of the best expert strategy that fits over toast's, and of FSDP
over all devices (``fsdp_all``). With ``validate``, every strategy that applies is
compiled and run by XLA on ``mesh.devices`` host CPU devices (``toast.xla.validate``; once per distinct
state): the outputs must equal the unsharded program's, and the collectives XLA inserted are compared with the
predicted ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toast.cost.hardware import Hardware
from toast.cost.model import Cost
from toast.errors import ToastError
from toast.output.autoshard import strategy_document
from toast.output.report import human_bytes, human_seconds, markdown_cell
from toast.search.base import Budget, Progress, Search
from toast.search.find import Comparison, Found, find_strategy, price_manual_strategies
from toast.sharding.mesh import Mesh
from toast.sharding.roles import Roles
from toast.sharding.state import ShardingState
from toast.xla.validate import Agreement, validate

# Host validation runs the whole program on CPU devices forced by XLA; more than this is a mesh for a
# cluster, not for a check on one machine.
MAX_HOST_DEVICES = 64
FSDP_ALL = "fsdp_all"  # the expert strategy toast's gain is also given over: FSDP over all devices


@dataclass(frozen=True)
class StrategyRow:
    """One strategy of the comparison.

    Attributes:
      name: ``"toast"`` or a manual strategy's name (``"fsdp+megatron"``).
      cost: its estimated cost; ``None`` when it does not apply.
      over_memory: its peak per device exceeds the memory limit.
      reason: why it does not apply (empty when it does).
      search_seconds: the search's wall-clock seconds (toast's row only).
      agreement: XLA's check, when asked for and the strategy applies.
      state: the sharding state (``None`` when it does not apply).
    """

    name: str
    cost: Cost | None
    over_memory: bool
    reason: str = ""
    search_seconds: float | None = None
    agreement: Agreement | None = None
    state: ShardingState | None = None


@dataclass(frozen=True)
class CompareResult:
    """A comparison: the search's outcome, its strategy file's document (``strategy_document``) and one row
    per strategy (toast's first)."""

    found: Found
    rows: tuple[StrategyRow, ...]
    document: dict[str, Any]


@dataclass(frozen=True)
class Gains:
    """toast's gain over the expert strategies: their estimated step time over toast's (1.07: theirs is 7%
    longer; below 1, toast's is the longer).

    Attributes:
      best: the fastest expert strategy that fits the memory (where none fits, the fastest that applies; the
        first in the table among equals); ``None`` where none applies.
      over_best: toast's gain over ``best`` (``None`` with it).
      over_fsdp_all: toast's gain over ``fsdp_all``; ``None`` where it does not apply.
      fsdp_all_over_memory: ``fsdp_all`` is over the memory limit.
    """

    best: str | None
    over_best: float | None
    over_fsdp_all: float | None
    fsdp_all_over_memory: bool = False


def compare_manual(found: Found, roles: Roles | None = None) -> list[Comparison]:
    """Every manual strategy priced under the search's model and memory limit
    (``toast.search.find.price_manual_strategies``), from ``roles`` (default: the search's candidates',
    ``found.roles``: the rows the search weighed, not priced again)."""
    if roles is None or roles is found.roles:
        return list(found.manual) if found.roles is not None else []
    return price_manual_strategies(found.model, found.costs, roles)


def check_host_validation(mesh: Mesh, *, validate_on_host: bool) -> None:
    """Raises ``ToastError`` when host validation is asked for on a mesh of more than ``MAX_HOST_DEVICES``."""
    if validate_on_host and mesh.devices > MAX_HOST_DEVICES:
        raise ToastError(f"--validate: mesh {mesh.spec()} has {mesh.devices} devices; host validation runs up to "
                         f"{MAX_HOST_DEVICES} (compare without --validate, or validate a smaller mesh)")


def compare(analysis, mesh: Mesh, hardware: Hardware, *, source: str, roles: Roles | None,
            budget: Budget, search: str | Search = "mcts", settings: Any = None, memory_gib: float | None = None,
            pinned: Mapping[str, Sequence] | None = None, validate_on_host: bool = False, microbatches: int = 1,
            progress: Progress | None = None, validate_timeout_s: float = 600.0) -> CompareResult:
    """Search a strategy and price every manual strategy that applies under the same model and memory limit.

    Args:
      analysis: the program's analysis.
      mesh: the logical mesh.
      hardware: the accelerator profile.
      source: what the program was read from (recorded in the strategy file).
      roles: the roles of the manual strategies (``None``: proposed from the analysis); they are candidates
        for toast's row too (``find_strategy``).
      budget: what the search may spend (seed, rollouts, seconds, workers, phases).
      search: the search (``toast.search.registry.SEARCHES``' name, or a ``Search``; default MCTS).
      settings: the search's own settings (default: its defaults).
      memory_gib: memory per device in GiB (default: the profile's HBM).
      pinned: argument name -> PartitionSpec entries toast's search keeps (the manual strategies ignore them).
      validate_on_host: also compile and run every strategy that applies with XLA on host CPU devices.
      microbatches: micro-batches per step (gradient accumulation), for the search and every strategy.
      progress: the search's progress callback.
      validate_timeout_s: the time limit of each strategy's XLA check, seconds.

    Raises:
      ToastError: ``validate_on_host`` with a mesh of more than ``MAX_HOST_DEVICES`` devices (before any
        search), or the search's own errors.
    """
    check_host_validation(mesh, validate_on_host=validate_on_host)
    found = find_strategy(analysis, mesh, hardware, pinned=pinned, search=search, budget=budget, settings=settings,
                          memory_gib=memory_gib, microbatches=microbatches, roles=roles, progress=progress)
    result = comparison_result(found, compare_manual(found), source=source)
    if not validate_on_host:
        return result
    agreements: dict[bytes, Agreement] = {}  # strategies that shard alike (maxtext and megatron, often) run once
    for row in result.rows:
        if row.state is not None and row.state.key() not in agreements:
            agreements[row.state.key()] = validate(found.model, row.state, hardware, seed=budget.seed,
                                                   timeout_s=validate_timeout_s)
    return dataclasses.replace(result, rows=tuple(row if row.state is None else dataclasses.replace(
        row, agreement=agreements[row.state.key()]) for row in result.rows))


def comparison_result(found: Found, manual: Sequence[Comparison], *, source: str) -> CompareResult:
    """toast's row (from the search) then the manual strategies' rows (``compare_manual``); ``source``: what
    the program was read from (recorded in the strategy document)."""
    rows = [StrategyRow("toast", found.result.cost, found.over_memory, search_seconds=found.result.seconds,
                        state=found.result.state)]
    rows += [StrategyRow(row.name, row.cost, row.over_memory, row.reason, state=row.state) for row in manual]
    return CompareResult(found, tuple(rows), strategy_document(found, source=source))


def gains(rows: Sequence[StrategyRow]) -> Gains:
    """toast's gain (``Gains``) from a comparison's rows, toast's first."""
    toast_row, manual = rows[0], [row for row in rows[1:] if row.cost is not None]
    toast_s = toast_row.cost.step_time_s if toast_row.cost is not None else 0.0

    def gain(row: StrategyRow) -> float | None:
        return row.cost.step_time_s / toast_s if row.cost is not None and toast_s > 0 else None

    fitting = [row for row in manual if not row.over_memory] or manual
    best = min(fitting, key=lambda row: row.cost.step_time_s if row.cost is not None else 0.0, default=None)
    fsdp_all = next((row for row in manual if row.name == FSDP_ALL), None)
    return Gains(best.name if best else None, gain(best) if best else None,
                 gain(fsdp_all) if fsdp_all else None, fsdp_all.over_memory if fsdp_all else False)


def gains_line(rows: Sequence[StrategyRow]) -> str:
    """toast's gains (``gains``) in words, under the table: ``gain over the best expert strategy (fsdp+megatron):
    1.070x; over FSDP over all devices (fsdp_all): 1.120x``."""
    found = gains(rows)
    best = (f"gain over the best expert strategy ({found.best}): {found.over_best:.3f}x"
            if found.best is not None and found.over_best is not None else
            "gain over the best expert strategy: none applies")
    fsdp_all = (f"over FSDP over all devices ({FSDP_ALL}): {found.over_fsdp_all:.3f}x"
                + (" (over memory)" if found.fsdp_all_over_memory else "")
                if found.over_fsdp_all is not None else f"FSDP over all devices ({FSDP_ALL}) does not apply")
    return f"{best}; {fsdp_all}"


def comparison_table(result: CompareResult) -> str:
    """The comparison as a Markdown table (what ``toast compare`` prints), toast's gains under it
    (``gains_line``)."""
    validated = any(row.agreement is not None for row in result.rows)
    header = "| strategy | step time | peak per device | over memory | relative cost | search s |"
    rule = "|---|---|---|---|---|---|"
    if validated:
        header += " XLA on host devices |"
        rule += "---|"
    lines = [header, rule]
    # Strategies that do not apply for one reason are one row (all eight, where the batch role is missing).
    reasons: dict[str, list[str]] = {}
    for row in result.rows:
        if row.cost is None:
            reasons.setdefault(row.reason.replace(f"strategy '{row.name}' ", ""), []).append(row.name)
    for row in result.rows:
        seconds = f"{row.search_seconds:.1f}" if row.search_seconds is not None else ""
        if row.cost is None:
            reason = row.reason.replace(f"strategy '{row.name}' ", "")
            names = reasons.pop(reason, None)
            if names is None:
                continue  # shown with the first strategy of its reason
            line = f"| {markdown_cell(', '.join(names))} | - | - | - | does not apply: {markdown_cell(reason)} | |"
        else:
            line = (f"| {markdown_cell(row.name)} | {human_seconds(row.cost.step_time_s)} | "
                    f"{human_bytes(row.cost.peak_bytes)} | "
                    f"{'yes' if row.over_memory else 'no'} | {row.cost.relative:.3f} | {seconds} |")
        if validated:
            line += f" {_agreement_cell(row.agreement)} |"
        lines.append(line)
    return "\n".join(lines) + "\n\n" + gains_line(result.rows) + "\n"


def comparison_json(result: CompareResult) -> dict[str, Any]:
    """The comparison as JSON (``toast compare --json``): costs in the keys of ``toast cost``."""
    found = result.found
    rows = []
    for row in result.rows:
        entry: dict[str, Any] = {"strategy": row.name, "applies": row.cost is not None}
        if row.cost is None:
            entry["reason"] = row.reason
        else:
            entry.update({"step_time_s": row.cost.step_time_s, "peak_bytes": row.cost.peak_bytes,
                          "over_memory": row.over_memory, "relative": row.cost.relative})
        if row.search_seconds is not None:
            entry["search_seconds"] = row.search_seconds
        if row.agreement is not None:
            entry["xla"] = {"numerics_match": row.agreement.numerics.match, "collectives_agree": row.agreement.matched,
                            "collectives": max(row.agreement.predicted_count, row.agreement.xla_count),
                            "peak_error": row.agreement.peak_error}
        rows.append(entry)
    gained = gains(result.rows)
    return {"program": found.model.analysis.program.name, "mesh": found.model.mesh.spec(),
            "hardware": result.document["hardware"], "device_memory_bytes": found.device_memory,
            "strategies": rows, "gains": {"best_expert": gained.best, "over_best_expert": gained.over_best,
                                          "over_fsdp_all": gained.over_fsdp_all},
            "toast": result.document}


def _agreement_cell(agreement: Agreement | None) -> str:
    if agreement is None:
        return ""
    numerics = "numerics match" if agreement.numerics.match else "numerics MISMATCH"
    total = max(agreement.predicted_count, agreement.xla_count)
    return f"{numerics}; collectives {agreement.matched}/{total} agree; peak {agreement.peak_error:+.0%}"
