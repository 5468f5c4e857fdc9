"""The search's contract: what every search takes (an action space, a cost model, ``SearchSettings``) and what it
gives back (``SearchResult``). ``SearchFn`` is its type; ``toast.search.mcts.search`` is the default one,
``toast.search.find.find_strategy`` runs any of them (``search=``). A new search is a module of this package
with a function of this type (``ARCHITECTURE.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from toast.cost.model import Cost, CostModel
from toast.errors import ToastError
from toast.search.actions import ActionSpace, SearchAction
from toast.sharding.state import ShardingState

__all__ = ["Phase", "Progress", "RoundResult", "SearchFn", "SearchResult", "SearchSettings"]


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of a search: the mesh axes its actions may use (empty: all) and what it optimizes
    (``"runtime"`` or ``"memory"``)."""

    axes: tuple[str, ...] = ()
    goal: str = "runtime"


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How the search runs (keyword-only everywhere; recorded in strategy files).

    Attributes:
      seed: the random seed.
      rollouts: total rollout budget, shared by the lanes (``None``: no limit; then ``seconds`` or
        ``restarts`` stops it). Spent in full unless every state is scored first.
      seconds: wall-clock budget (``None``: no limit).
      lanes: independent trees (fixed, whatever the number of workers), each with an equal share of the
        rollouts.
      workers: worker processes (``0``: one per core, at most ``lanes``; ``1``: in this process).
      max_depth: most actions in one trajectory (the paper's 30).
      exploration: UCT's exploration constant (rewards are minus relative step times).
      rave: how many visits of an action at a node its all-moves-as-first value weighs as much as its own
        (RAVE's equivalence parameter).
      stop_probability: chance that the default policy stops at each step (at a state that fits the memory
        limit: under a limit that binds, short random rollouts would rarely end in a state that fits).
      length_penalty: reward subtracted per action (prefers shorter trajectories).
      patience: rollouts in a row without a better state before a lane restarts its tree (below its best
        state, or afresh).
      restarts: restarts per lane before it stops early (``None``: no limit, the budget is spent).
      min_names: actions touching fewer distinct dimension names are pruned (the paper's 10).
      mirror_layers: mirror actions over repeated layers (section 4.4).
      stored_parameters: offer stored actions (``SearchAction.stored``: parameters split where they are kept
        and updated, gathered where used; FSDP).
      polish: after each phase's lanes, improve the best actions by local search (``_polish``); its costings
        come on top of the rollout budget (a time budget bounds them).
      polish_candidates: how many of the lanes' best trajectories and their trees' best (best first,
        distinct) are polished.
      polish_swaps: the polish also tries swapping each action for each other one (then a descent).
      polish_budget: states the polish may score per rollout of the phase's budget (shared by its candidates;
        with a rollout budget: then the polish's work is bounded in the budget, whatever the program).
      phases: the phases, in order (default: one over all axes, runtime).
    """

    seed: int = 0
    rollouts: int | None = 2000
    seconds: float | None = None
    lanes: int = 2
    workers: int = 0
    max_depth: int = 30
    exploration: float = 0.3
    rave: float = 100.0
    stop_probability: float = 0.2
    length_penalty: float = 1e-3
    patience: int = 200
    restarts: int | None = None
    min_names: int = 10
    mirror_layers: bool = True
    stored_parameters: bool = True
    polish: bool = True
    polish_candidates: int = 4
    polish_swaps: bool = True
    polish_budget: int = 10
    phases: tuple[Phase, ...] = (Phase(),)

    def __post_init__(self) -> None:
        """The one check of the search's knobs (the command line's types only refuse what is not a number).

        Raises:
          ToastError: a budget of zero or none at all, fewer than one lane or a patience below 1, a negative
            seed or worker count, no phase, or a phase goal other than runtime or memory.
        """
        if self.rollouts is not None and self.rollouts <= 0:
            raise ToastError(f"a rollout budget of {self.rollouts}: give at least 1")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ToastError(f"a time budget of {self.seconds:g} s: give more than 0 seconds")
        if self.rollouts is None and self.seconds is None and self.restarts is None:
            raise ToastError("no budget: give a number of rollouts, seconds, or a number of restarts")
        if self.lanes < 1 or self.patience < 1:
            raise ToastError("lanes and patience must be at least 1")
        if self.seed < 0 or self.workers < 0:
            raise ToastError(f"seed {self.seed} and workers {self.workers}: give 0 or more")
        if not self.phases:
            raise ToastError("no phase: give at least one (the default is one over all axes, runtime)")
        for phase in self.phases:
            if phase.goal not in ("runtime", "memory"):
                raise ToastError(f"search phase goal '{phase.goal}': expected 'runtime' or 'memory'")

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON (for the strategy file's ``search`` section)."""
        return {
            "seed": self.seed, "rollouts": self.rollouts, "seconds": self.seconds, "lanes": self.lanes,
            "max_depth": self.max_depth, "exploration": self.exploration, "rave": self.rave,
            "stop_probability": self.stop_probability, "length_penalty": self.length_penalty,
            "patience": self.patience, "restarts": self.restarts, "min_names": self.min_names,
            "mirror_layers": self.mirror_layers, "stored_parameters": self.stored_parameters, "polish": self.polish,
            "polish_candidates": self.polish_candidates, "polish_swaps": self.polish_swaps,
            "polish_budget": self.polish_budget,
            "phases": [{"axes": list(p.axes), "goal": p.goal} for p in self.phases],
        }


@dataclass(frozen=True, slots=True)
class RoundResult:
    """A step of the search as reported: its phase, the best cost so far, and the rollouts it ran (as each
    lane ends: that lane's; the phase's last, after its polish: the phase's)."""

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
      rounds: per phase, the best cost after its lanes and polish, and its rollouts.
      rollouts: rollouts run.
      evaluations: distinct states costed (scored by any lane or polish move: the same in every run with a
        rollout budget, on any number of workers).
      seconds: wall-clock time of the search.
      settings: the settings it ran with.
    """

    state: ShardingState
    actions: tuple[SearchAction, ...]
    cost: Cost
    rounds: tuple[RoundResult, ...]
    rollouts: int
    evaluations: int
    seconds: float
    settings: SearchSettings


Progress = Callable[[RoundResult, int, float], None]
"""Called as a search goes with ``(round, rollouts so far, seconds so far)``."""


class SearchFn(Protocol):
    """A search: the best state it finds in ``space`` under ``costs``, within ``settings``' budget.

    It starts from ``space``'s (pinned) initial state, never returns a state over ``costs.device_memory`` when
    it found one that fits, reports to ``progress`` when given, and is deterministic for a seed and a rollout
    budget. Raises ``ToastError`` for settings it cannot run with.
    """

    def __call__(self, space: ActionSpace, costs: CostModel, *, settings: SearchSettings = ...,
                 progress: Progress | None = None) -> SearchResult: ...
