"""Finding a strategy for an analyzed program: a search (any ``Search``; MCTS by default) with the manual
strategies as candidates, under one cost model and memory limit. What ``toast autoshard``, ``toast compare``,
sweeps and ``toast.autoshard`` run; the strategy file is written from a ``Found`` in ``toast.output.autoshard``
(``strategy_document``), the comparison table in ``toast.evaluation.compare``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from toast.cost.hardware import Hardware, memory_limit_gib
from toast.cost.model import Cost, CostModel
from toast.errors import ToastError
from toast.search.actions import ActionSpace
from toast.search.base import Budget, Progress, Search, SearchResult, SpaceSettings
from toast.search.exhaustive import search_score
from toast.search.registry import DEFAULT_SEARCH, resolve_search
from toast.sharding.mesh import Mesh
from toast.sharding.propose import roles_or_proposed
from toast.sharding.roles import Roles
from toast.sharding.state import ShardingModel, ShardingState

__all__ = ["GIB", "Comparison", "Found", "find_strategy", "price_manual_strategies"]

GIB = 2 ** 30
DEFAULT_BUDGET = Budget()
DEFAULT_SPACE = SpaceSettings()


@dataclass(frozen=True)
class Comparison:
    """One row of the table against manual strategies: the strategy's name, its cost, and whether it is over
    the memory limit (``cost`` is ``None`` and ``reason`` says why when the strategy does not apply)."""

    name: str
    cost: Cost | None
    over_memory: bool
    reason: str = ""
    state: ShardingState | None = None


@dataclass(frozen=True)
class Found:
    """A search's outcome with everything needed to report it.

    Attributes:
      result: the search's result; where a manual strategy beat it, that strategy's state and cost (and no
        search actions).
      origin: ``"search"``, or the manual strategy chosen instead (``"fsdp+megatron"``).
      floor_bytes: no sharding's peak per device is below this: the buffers live at the unsharded program's
        peak, each split over every device.
      roles: the roles whose manual strategies were candidates: the ones given, else proposed from the
        analysis (``toast.sharding.propose``; ``roles.source`` says which).
      searched: the search's own result, whether or not a manual strategy beat it (``result`` otherwise).
      pinned: the pins the search kept (argument name -> PartitionSpec entries).
      microbatches: micro-batches per step the costs assume.
      manual: every manual strategy priced under ``roles`` (``price_manual_strategies``), as the search weighed
        them; empty where they were not candidates.
      space_settings: the settings ``space`` was built with.
    """

    model: ShardingModel
    space: ActionSpace
    result: SearchResult
    costs: CostModel
    device_memory: float
    origin: str = "search"
    floor_bytes: float = 0.0
    roles: Roles | None = None
    searched: SearchResult | None = None
    pinned: Mapping[str, Sequence] = dataclasses.field(default_factory=dict)
    microbatches: int = 1
    manual: tuple[Comparison, ...] = ()
    space_settings: SpaceSettings = DEFAULT_SPACE

    @property
    def over_memory(self) -> bool:
        return self.result.cost.peak_bytes > self.device_memory


def find_strategy(analysis, mesh: Mesh, hardware: Hardware, *,
                  pinned: Mapping[str, Sequence] | None = None, search: str | Search = DEFAULT_SEARCH,
                  budget: Budget = DEFAULT_BUDGET, settings: object = None,
                  space_settings: SpaceSettings = DEFAULT_SPACE,
                  memory_gib: float | None = None, microbatches: int = 1, roles: Roles | None = None,
                  manual_candidates: bool = True, progress: Progress | None = None) -> Found:
    """Search a strategy for an analyzed program (what ``toast autoshard`` and ``autoshard`` run).

    Args:
      analysis: the program's analysis.
      mesh: the logical mesh.
      hardware: the accelerator profile.
      pinned: argument name -> PartitionSpec entries the search keeps.
      search: the search to run: a name (``toast.search.registry.SEARCHES``: ``"mcts"``, the default,
        ``"random"``, ``"greedy"``) or a ``Search``.
      budget: what the search may spend (seed, rollouts, seconds, workers, phases).
      settings: the search's own settings (its ``Search.settings_type``; default: its defaults).
      space_settings: the action space's options.
      memory_gib: memory per device in GiB (default: the profile's HBM).
      microbatches: micro-batches per step, the gradients reduced once (``CostModel``'s gradient accumulation).
      roles: the program's roles: the manual strategies and their combinations that apply (and keep the pins)
        are candidates too, and one that beats the search's strategy (``search_score``: faster, or fitting
        where the search's does not) is returned instead, named in ``Found.origin`` and the file's
        ``search.origin``. ``None`` or roles naming nothing (no roles file): roles proposed from the analysis
        (``propose_roles``), so the guarantee holds on any program.
      manual_candidates: ``False``: the search's strategy alone (``Found.roles`` is then ``None``), to judge
        the search itself.
      progress: called as the search goes (``toast.search.base.Progress``).

    Raises:
      ToastError: an unknown search, settings of another search, or the search's own errors.
    """
    chosen = resolve_search(search)
    settings = chosen.settings(settings)  # before any work
    memory_gib = memory_limit_gib(memory_gib)
    device_memory = float(memory_gib * GIB) if memory_gib is not None else float(hardware.hbm_bytes)
    model = ShardingModel(analysis, mesh)
    space = space_settings.action_space(model, pinned=pinned)
    costs = CostModel(model, hardware, device_memory=device_memory, microbatches=microbatches)
    costs.prepare(space.partition)
    result = searched = chosen.run(space, costs, budget=budget, settings=settings, progress=progress)
    origin = "search"
    manual: tuple[Comparison, ...] = ()
    if manual_candidates:
        roles = roles_or_proposed(roles, analysis)
        manual = tuple(price_manual_strategies(model, costs, roles))
        result, origin = _best_of_manual(result, manual, costs, space)
    else:
        roles = None
    floor = float(costs.initial.peak_bytes) / mesh.devices
    return Found(model, space, result, costs, device_memory, origin, floor, roles, searched, dict(pinned or {}),
                 microbatches, manual, space_settings)


def _best_of_manual(result: SearchResult, manual: Sequence[Comparison], costs: CostModel,
                    space: ActionSpace) -> tuple[SearchResult, str]:
    """The search's result, or the manual strategy (``price_manual_strategies``' order; the first among equals) that
    keeps the pins and beats it under ``search_score``, as a result with no search actions, and its name."""
    best, origin = search_score(result.cost, costs), "search"
    for row in manual:
        if row.cost is None or row.state is None or not space.keeps_pins(row.state):
            continue
        score = search_score(row.cost, costs)
        if score < best - 1e-12:
            best, origin = score, row.name
            result = dataclasses.replace(result, state=row.state, actions=(), cost=row.cost)
    return result, origin


def price_manual_strategies(model: ShardingModel, costs: CostModel, roles: Roles) -> list[Comparison]:
    """Every expert strategy (a row of ``toast.sharding.strategies.EXPERT_STRATEGIES``, in its order) priced under
    ``costs`` (its model and memory limit); one that does not apply (a role the roles lack, a mesh it cannot place
    its roles on, an invalid state) has its reason instead of a cost. Strategies that shard alike (``fsdp_all``
    and ``fsdp`` on one axis) are priced once."""
    from toast.sharding.strategies import EXPERT_STRATEGIES, manual_strategy

    rows = []
    priced: dict[bytes, Cost] = {}
    for strategy in EXPERT_STRATEGIES:
        try:
            state, _ = manual_strategy(model, strategy.name, roles)
        except ToastError as err:
            rows.append(Comparison(strategy.name, None, False, str(err).split(";")[0]))
            continue
        cost = priced.get(state.key())
        if cost is None:
            cost = priced[state.key()] = costs.evaluate(state)
        rows.append(Comparison(strategy.name, cost, cost.peak_bytes > costs.device_memory, state=state))
    return rows
