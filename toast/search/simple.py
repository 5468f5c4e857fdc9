"""The simple searches: random search and greedy descent, through the contract of ``toast.search.base`` like
MCTS, so that either can be chosen (``--search random``, ``--search greedy``) and a tree search is judged
against them at equal work (``benchmarks/bench_optimality.py``).

**Random search** takes random valid action sequences from the phase's start (before each action it stops
with probability ``stop_probability``; at most ``max_depth`` actions) and keeps the best state it reaches.
**Greedy descent** takes, from the phase's start, the action that lowers the score most (the lowest index
among equals) until none does; then again from the end of a random walk (random search's), and so on: the
best state any descent reached.

Both count their budget (``Budget.rollouts``) in states costed for the first time, the start state
included: a walk or a descent's step that reaches a state already costed is free, and a descent's step stops
where the budget does (taking the best neighbour scored so far, when it is better). Given a search's
``SearchResult.evaluations`` as their rollouts they cost as many distinct states as it did. They stop early
after ``attempts`` walks (descents) in a row found no new state: the space is exhausted, or nearly. Each
phase (``Budget.phases``) starts from the previous one's best state, on its mesh axes, with its goal and an
equal share of the budget left; a time budget gives each phase an equal share of the time left. One random
generator, seeded by ``Budget.seed``, serves every phase: the same seed and rollout budget give the same
strategy. They run in this process (``Budget.workers`` does not apply).

Scores are ``goal_score``'s: for the runtime goal a state over the memory limit never beats one that fits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from toast.cost.model import Cost, CostModel
from toast.errors import ToastError
from toast.search.actions import ActionSpace
from toast.search.base import Budget, Progress, RoundResult, Search, SearchResult, mesh_axes_of_phases
from toast.search.exhaustive import goal_score

__all__ = ["GREEDY", "RANDOM", "GreedySettings", "RandomSettings", "greedy_search", "random_search"]

PROGRESS_EVERY = 100  # new states costed between two progress reports


def _check_walk(stop_probability: float, max_depth: int, attempts: int) -> None:
    if not 0.0 <= stop_probability <= 1.0:
        raise ToastError(f"stop probability {stop_probability:g}: give a number from 0 to 1")
    if max_depth < 1 or attempts < 1:
        raise ToastError(f"max depth {max_depth} and attempts {attempts}: give at least 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class RandomSettings:
    """Random search's own settings (its budget is the ``Budget``).

    Attributes:
      stop_probability: chance that a walk stops before each action.
      max_depth: most actions in one walk.
      attempts: walks in a row that reach no new state before the search stops early.
    """

    stop_probability: float = 0.2
    max_depth: int = 30
    attempts: int = 100

    def __post_init__(self) -> None:
        """Raises ``ToastError`` for a stop probability outside 0..1, or a depth or attempts below 1."""
        _check_walk(self.stop_probability, self.max_depth, self.attempts)


@dataclass(frozen=True, slots=True, kw_only=True)
class GreedySettings:
    """Greedy descent's own settings: where its restarts begin (the end of a random walk from the phase's
    start) and when it stops early.

    Attributes:
      stop_probability: chance that a restart's walk stops before each action.
      max_depth: most actions in a restart's walk.
      attempts: descents in a row that reach no new state before the search stops early.
    """

    stop_probability: float = 0.2
    max_depth: int = 30
    attempts: int = 100

    def __post_init__(self) -> None:
        """Raises ``ToastError`` for a stop probability outside 0..1, or a depth or attempts below 1."""
        _check_walk(self.stop_probability, self.max_depth, self.attempts)


class _Scorer:
    """Costs each state once (``collectives=False``, as every search scores), counting the states costed."""

    def __init__(self, space: ActionSpace, costs: CostModel):
        self.space, self.costs = space, costs
        self.cache: dict[bytes, Cost] = {}

    def known(self, atoms: np.ndarray) -> bool:
        return atoms.tobytes() in self.cache

    def cost(self, atoms: np.ndarray) -> Cost:
        key = atoms.tobytes()
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = self.costs.evaluate(self.space.state(atoms), collectives=False)
        return found

    def score(self, atoms: np.ndarray, goal: str) -> float:
        cost = self.cost(atoms)
        return goal_score(cost.step_time_s, cost.peak_bytes, self.costs, goal)


@dataclass(frozen=True, slots=True)
class _Phase:
    """One phase as a simple search runs it: its start, the actions it may take, its goal and its limits."""

    atoms: np.ndarray
    actions: tuple[int, ...]  # the actions reaching ``atoms`` from the initial state
    allowed: tuple[int, ...]
    goal: str
    target: float  # stop once this many states are costed (all phases together)
    deadline: float | None


def _walk(space: ActionSpace, rng: np.random.Generator, phase: _Phase, *, stop_probability: float,
          max_depth: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """A random valid action sequence from the phase's start: its state and all its actions."""
    atoms, actions = phase.atoms, list(phase.actions)
    for _ in range(max_depth):
        if rng.random() < stop_probability:
            break
        for position in rng.permutation(len(phase.allowed)):
            action = phase.allowed[int(position)]
            following = space.step(atoms, action)
            if following is not None:
                atoms = following
                actions.append(action)
                break
        else:
            break
    return atoms, tuple(actions)


def _spent(score: _Scorer, phase: _Phase) -> bool:
    return len(score.cache) >= phase.target or (phase.deadline is not None and time.monotonic() > phase.deadline)


def _random_phase(space: ActionSpace, score: _Scorer, rng: np.random.Generator, phase: _Phase,
                  settings: RandomSettings, report: _Reporter) -> tuple[np.ndarray, tuple[int, ...]]:
    best, best_actions = phase.atoms, phase.actions
    best_score = score.score(best, phase.goal)
    fruitless = 0
    while not _spent(score, phase) and fruitless < settings.attempts:
        before = len(score.cache)
        atoms, actions = _walk(space, rng, phase, stop_probability=settings.stop_probability,
                               max_depth=settings.max_depth)
        value = score.score(atoms, phase.goal)
        fruitless = 0 if len(score.cache) > before else fruitless + 1
        if (value, len(actions)) < (best_score, len(best_actions)):
            best, best_actions, best_score = atoms, actions, value
        report(best)
    return best, best_actions


def _descend(space: ActionSpace, score: _Scorer, phase: _Phase, atoms: np.ndarray, actions: tuple[int, ...]
             ) -> tuple[np.ndarray, tuple[int, ...], float]:
    """Steepest descent from ``atoms`` within the phase's budget: each step scores every valid allowed action
    (cut short where the budget ends) and takes the one that lowers the score most, lowest index among equals."""
    value = score.score(atoms, phase.goal)
    taken = list(actions)
    while not _spent(score, phase):
        options = []
        for action in phase.allowed:
            following = space.step(atoms, action)
            if following is None:
                continue
            if _spent(score, phase) and not score.known(following):
                break  # the budget ends within this step: the best neighbour so far
            options.append((score.score(following, phase.goal), action))
        if not options or min(options)[0] >= value:
            break
        value, action = min(options)
        following = space.step(atoms, action)
        assert following is not None
        atoms = following
        taken.append(action)
    return atoms, tuple(taken), value


def _greedy_phase(space: ActionSpace, score: _Scorer, rng: np.random.Generator, phase: _Phase,
                  settings: GreedySettings, report: _Reporter) -> tuple[np.ndarray, tuple[int, ...]]:
    best, best_actions = phase.atoms, phase.actions
    best_score = score.score(best, phase.goal)
    start, start_actions = best, best_actions
    fruitless = 0
    while not _spent(score, phase) and fruitless < settings.attempts:
        before = len(score.cache)
        atoms, actions, value = _descend(space, score, phase, start, start_actions)
        if (value, len(actions)) < (best_score, len(best_actions)):
            best, best_actions, best_score = atoms, actions, value
        fruitless = 0 if len(score.cache) > before else fruitless + 1
        report(best)
        start, start_actions = _walk(space, rng, phase, stop_probability=settings.stop_probability,
                                     max_depth=settings.max_depth)
    return best, best_actions


class _Reporter:
    """Calls ``progress`` with the phase's best so far every ``PROGRESS_EVERY`` new states costed."""

    def __init__(self, score: _Scorer, progress: Progress | None, start: float):
        self.score, self.progress, self.start = score, progress, start
        self.phase, self.phase_start, self.reported = 0, 0, 0

    def begin(self, phase: int) -> None:
        self.phase, self.phase_start = phase, len(self.score.cache)

    def __call__(self, best: np.ndarray) -> None:
        done = len(self.score.cache)
        if self.progress is None or done - self.reported < PROGRESS_EVERY:
            return
        self.reported = done
        cost = self.score.cost(best)
        self.progress(RoundResult(self.phase, cost.relative, cost.step_time_s, done - self.phase_start), done,
                      time.monotonic() - self.start)


_PhaseFn = Callable[[ActionSpace, _Scorer, np.random.Generator, _Phase, Any, _Reporter],
                    tuple[np.ndarray, tuple[int, ...]]]


def _run(name: str, run_phase: _PhaseFn, space: ActionSpace, costs: CostModel, budget: Budget, settings: Any,
         progress: Progress | None) -> SearchResult:
    """A simple search, phase after phase (``budget.phases``, each run by ``run_phase``); its result."""
    mesh_axes = mesh_axes_of_phases(space, budget)
    start = time.monotonic()
    costs.prepare(space.partition)
    score = _Scorer(space, costs)
    rng = np.random.default_rng(budget.seed)
    report = _Reporter(score, progress, start)
    atoms: np.ndarray = space.initial_atoms
    actions: tuple[int, ...] = ()
    score.cost(atoms)  # the start state: the first state costed
    rounds: list[RoundResult] = []
    for index, goal_phase in enumerate(budget.phases):
        left = len(budget.phases) - index
        phase_start = time.monotonic()
        report.begin(index)
        axes = set(goal_phase.axes or mesh_axes)
        done = len(score.cache)
        target = math.inf if budget.rollouts is None else done + (budget.rollouts - done) // left
        deadline = None if budget.seconds is None else phase_start + (budget.seconds - (phase_start - start)) / left
        phase = _Phase(atoms, actions, tuple(i for i, a in enumerate(space.actions) if a.axis in axes),
                       goal_phase.goal, target, deadline)
        atoms, actions = run_phase(space, score, rng, phase, settings, report)
        cost = score.cost(atoms)
        rounds.append(RoundResult(index, cost.relative, cost.step_time_s, len(score.cache) - report.phase_start))
        if progress is not None:
            progress(rounds[-1], len(score.cache), time.monotonic() - start)
    taken = tuple(space.actions[i] for i in actions)
    final = space.state(atoms, tuple(a for action in taken for a in action.as_actions()))
    return SearchResult(final, taken, costs.evaluate(final), tuple(rounds), len(score.cache), len(score.cache),
                        time.monotonic() - start, budget, name, settings)


DEFAULT_BUDGET = Budget()


def random_search(space: ActionSpace, costs: CostModel, *, budget: Budget = DEFAULT_BUDGET,
                  settings: RandomSettings | None = None, progress: Progress | None = None) -> SearchResult:
    """Random search (``toast.search.base.SearchFn``): random valid action sequences until ``budget.rollouts``
    distinct states are costed; the best state reached."""
    return _run("random", _random_phase, space, costs, budget, settings or RandomSettings(), progress)


def greedy_search(space: ActionSpace, costs: CostModel, *, budget: Budget = DEFAULT_BUDGET,
                  settings: GreedySettings | None = None, progress: Progress | None = None) -> SearchResult:
    """Greedy descent (``toast.search.base.SearchFn``): steepest descent from the start, then from the ends of
    random walks, until ``budget.rollouts`` distinct states are costed; the best state any descent reached."""
    return _run("greedy", _greedy_phase, space, costs, budget, settings or GreedySettings(), progress)


RANDOM = Search("random", RandomSettings, random_search, "random valid action sequences, the best state reached")
GREEDY = Search("greedy", GreedySettings, greedy_search, "steepest descent, restarted from the ends of random walks")
