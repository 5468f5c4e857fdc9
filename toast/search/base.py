"""The search's contract: what every search takes (an action space, a cost model, a ``Budget`` and its own
settings) and what it gives back (``SearchResult``). A ``Search`` names an algorithm, its settings' type and the
function that runs it (a ``SearchFn``); ``toast.search.registry.SEARCHES`` holds the known ones (``mcts``, the
default; ``random``; ``greedy``), which ``find_strategy(..., search=)``, ``toast autoshard --search``, sweeps'
``search`` key and ``toast.autoshard(..., search=)`` select by name. A new search is a module of this package
with a ``Search``, listed in ``SEARCHES`` (``ARCHITECTURE.md``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toast.cost.model import Cost, CostModel
from toast.errors import ToastError
from toast.search.actions import ActionSpace, SearchAction
from toast.sharding.state import ShardingModel, ShardingState

__all__ = ["Budget", "Phase", "Progress", "RoundResult", "Search", "SearchFn", "SearchResult", "SpaceSettings",
           "mesh_axes_of_phases", "settings_json"]


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of a search: the mesh axes its actions may use (empty: all) and what it optimizes
    (``"runtime"`` or ``"memory"``)."""

    axes: tuple[str, ...] = ()
    goal: str = "runtime"


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """What a search may spend, whichever algorithm runs it (recorded in strategy files).

    Attributes:
      seed: the random seed: a search is deterministic for a seed and a rollout budget (on any number of workers).
      rollouts: the work budget, in rollouts (``None``: no limit; then ``seconds`` stops the search), spent in
        full unless the search has nothing new left to try. One unit for every algorithm: a rollout ends in
        one state the search scores. An MCTS rollout is one trajectory down its tree and on at random (its
        polish scores up to ``MctsSettings.polish_budget`` states more per rollout); a rollout of random
        search or greedy descent is one state costed for the first time (a walk or a descent's step that
        reaches a state already costed is free). So random search or greedy descent given a search's
        ``SearchResult.evaluations`` as its rollouts costs as many distinct states as that search did: the
        optimality benchmark compares the searches at equal cost evaluations this way.
      seconds: wall-clock budget, seconds (``None``: no limit).
      workers: worker processes (``0``: one per core; ``1``: in this process); a search that runs in one
        process ignores it. Never changes the result with a rollout budget.
      phases: the phases, in order, each starting from the previous one's best state with an equal share of
        what is left of the budget (default: one over all axes, runtime).
    """

    seed: int = 0
    rollouts: int | None = 2000
    seconds: float | None = None
    workers: int = 0
    phases: tuple[Phase, ...] = (Phase(),)

    def __post_init__(self) -> None:
        """The one check of the budget (the command line's types only refuse what is not a number).

        Raises:
          ToastError: a budget of zero or none at all, a negative seed or worker count, no phase, or a phase
            goal other than runtime or memory.
        """
        if self.rollouts is not None and self.rollouts <= 0:
            raise ToastError(f"a rollout budget of {self.rollouts}: give at least 1")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ToastError(f"a time budget of {self.seconds:g} s: give more than 0 seconds")
        if self.rollouts is None and self.seconds is None:
            raise ToastError("no budget: give a number of rollouts or seconds")
        if self.seed < 0 or self.workers < 0:
            raise ToastError(f"seed {self.seed} and workers {self.workers}: give 0 or more")
        if not self.phases:
            raise ToastError("no phase: give at least one (the default is one over all axes, runtime)")
        for phase in self.phases:
            if phase.goal not in ("runtime", "memory"):
                raise ToastError(f"search phase goal '{phase.goal}': expected 'runtime' or 'memory'")

    def to_json(self) -> dict[str, Any]:
        """The budget as JSON (the strategy file's ``search.budget``); the workers are left out: the result
        does not depend on them, and a file is the same in every run."""
        return {"seed": self.seed, "rollouts": self.rollouts, "seconds": self.seconds,
                "phases": [{"axes": list(p.axes), "goal": p.goal} for p in self.phases]}


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceSettings:
    """The action space every search explores (``ActionSpace``'s options; recorded in strategy files).

    Neither budget nor an algorithm's settings: they change the problem, not how it is solved or for how long.
    Every search gets the space already built from them, so two searches compared on one space (the
    optimality benchmark) share them whatever their algorithms.

    Attributes:
      min_names: actions touching fewer distinct dimension names are pruned (the paper's 10).
      mirror_layers: mirror actions over repeated layers (section 4.4).
      stored_parameters: offer stored actions (``SearchAction.stored``: parameters split where they are kept
        and updated, gathered where used; FSDP).
    """

    min_names: int = 10
    mirror_layers: bool = True
    stored_parameters: bool = True

    def action_space(self, model: ShardingModel, *, pinned: Mapping[str, Sequence] | None = None) -> ActionSpace:
        """The action space of ``model`` under these settings, with ``pinned`` arguments kept."""
        return ActionSpace(model, min_names=self.min_names, mirror_layers=self.mirror_layers,
                           stored_parameters=self.stored_parameters, pinned=pinned)

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON (the strategy file's ``search.space``)."""
        return settings_json(self)


def settings_json(settings: Any) -> dict[str, Any]:
    """A frozen dataclass of settings as JSON (its fields; tuples as lists)."""
    return json_ready(dataclasses.asdict(settings))


def json_ready(value: Any) -> Any:
    """``value`` with its tuples as lists (JSON's arrays), recursively."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def mesh_axes_of_phases(space: ActionSpace, budget: Budget) -> list[str]:
    """The mesh's axes; a ``ToastError`` when a phase names an axis the mesh lacks."""
    mesh_axes = [axis for axis, _ in space.model.mesh.axes]
    for phase in budget.phases:
        unknown = sorted(set(phase.axes) - set(mesh_axes))
        if unknown:
            raise ToastError(f"search phase names mesh axis '{unknown[0]}'; the mesh has {', '.join(mesh_axes)}")
    return mesh_axes


@dataclass(frozen=True, slots=True)
class RoundResult:
    """A step of the search as reported: its phase, the best cost so far, and the rollouts it ran (MCTS: as
    each lane ends, that lane's; a phase's last, after its polish, the phase's. Random and greedy: the phase's
    so far)."""

    phase: int
    best_relative: float
    best_step_time_s: float
    rollouts: int


@dataclass(frozen=True)
class SearchResult:
    """What a search found.

    Attributes:
      state: the best sharding state.
      actions: the actions that reach it from the (pinned) initial state, in order.
      cost: its cost.
      rounds: per phase, the best cost after it, and its rollouts.
      rollouts: rollouts run (``Budget.rollouts``' unit).
      evaluations: distinct states scored (the same in every run with a rollout budget, on any number of
        workers): costed, or priced far enough to know they are no better than one costed (MCTS's bounds).
      seconds: wall-clock time of the search.
      budget: the budget it ran with.
      algorithm: the search's name (``Search.name``: ``"mcts"``, ``"random"``, ``"greedy"``).
      settings: the algorithm's own settings it ran with (its ``Search.settings_type``).
    """

    state: ShardingState
    actions: tuple[SearchAction, ...]
    cost: Cost
    rounds: tuple[RoundResult, ...]
    rollouts: int
    evaluations: int
    seconds: float
    budget: Budget
    algorithm: str
    settings: Any


Progress = Callable[[RoundResult, int, float], None]
"""Called as a search goes with ``(round, rollouts so far, seconds so far)``."""


class SearchFn(Protocol):
    """A search algorithm: the best state it finds in ``space`` under ``costs``, within ``budget``.

    It starts from ``space``'s (pinned) initial state, spends at most ``budget`` (its rollouts, its seconds;
    its phases in order), never returns a state over ``costs.device_memory`` when it found one that fits,
    reports to ``progress`` when given, and is deterministic for a seed and a rollout budget. ``settings``
    are its own (its ``Search.settings_type``). Raises ``ToastError`` for a budget or settings it cannot run
    with (a phase naming an axis the mesh lacks: ``mesh_axes_of_phases``).
    """

    def __call__(self, space: ActionSpace, costs: CostModel, *, budget: Budget, settings: Any,
                 progress: Progress | None = None) -> SearchResult: ...


@dataclass(frozen=True)
class Search:
    """A search algorithm as it is chosen by name (``toast.search.registry.SEARCHES``).

    Attributes:
      name: what ``--search``, a sweep's ``search`` key and ``search=`` call it.
      settings_type: its settings: a frozen dataclass, keyword-only, whose defaults are the algorithm's.
      function: the search itself.
      description: one line for help texts.
    """

    name: str
    settings_type: type
    function: SearchFn
    description: str = ""

    def settings(self, given: Any = None) -> Any:
        """``given``, or the defaults where ``None``.

        Raises:
          ToastError: ``given`` is some other search's settings.
        """
        if given is None:
            return self.settings_type()
        if not isinstance(given, self.settings_type):
            raise ToastError(f"search '{self.name}' takes {self.settings_type.__name__}, not "
                             f"{type(given).__name__}")
        return given

    def run(self, space: ActionSpace, costs: CostModel, *, budget: Budget, settings: Any = None,
            progress: Progress | None = None) -> SearchResult:
        """Run the search (``SearchFn``) with ``settings`` (default: its own defaults)."""
        return self.function(space, costs, budget=budget, settings=self.settings(settings), progress=progress)
