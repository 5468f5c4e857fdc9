"""Monte Carlo Tree Search over the action space (TOAST section 4.1), guided by the cost model.

One **rollout** walks a tree from its root: selection among the node's actions (UCT blended with
all-moves-as-first values, RAVE), down to a state not yet in the tree, then a random default policy (stop with
probability ``stop_probability`` at each step, but never at a state over the memory limit; at most
``max_depth`` actions in all), and scores the final state (``search_score``: its step time relative to the
unsharded program's where it fits the memory limit; a state over the limit never beats one that fits). Its
reward ``-(score + length_penalty * depth)`` prefers shorter trajectories among equally good ones; it is
backed up along the tree path, and into the all-moves-as-first statistics of every action the rollout took
below each node. A sharding is a set of actions whose order matters little, so those statistics let a rollout
go below a node before it has tried every action there.

States are keyed by the sharding itself (its atoms' masks, ``ActionSpace.step``): any action order that
reaches the same sharding is the same node of the tree, and no state is costed twice (a cost cache). Where the
search needs less than a state's cost, it prices the state only up to its schedule (``CostModel.priced_rows``,
about two thirds of the work): whether a rollout may stop at a state needs only its peak (``_Memo.fits``), and a
descent's step needs only its best move, so moves whose lower bound (``CostModel.step_time_bound``) is worse
than a move costed are left bounded (``_Memo.best_step``); the results are the same as costing every state. A node
whose every action is invalid, already scored (the stop action) or leads to an exhausted node is
**exhausted**; a tree whose root is exhausted has scored every state below it, and its lane stops early.

**Lanes** are independent trees (root parallelism), each with an equal share of the rollout budget and
seeded from ``(seed, phase, lane)``; a lane keeps its tree for the whole budget, and after ``patience``
rollouts without a better state it **restarts** (below its best state, or afresh from the start when the
tree was already there), so the budget is spent unless the space is exhausted (``restarts`` bounds the
restarts for an early stop). Lanes run in worker processes that share their results, and the numbers each
worker prices for a state (``toast.search.shared_states``: what one priced, the others do not), so the same seed gives
the same strategy on any number of workers (with a rollout budget; a time budget gives each wave of lanes its
share of the time).

**Polish.** The lanes' best trajectories, and the best of each of their trees (each restart is a tree: a basin
other than the lane's best), ``polish_candidates`` of them, best first, are each improved by local search
(``_polish``): descend greedily, remove one action and descend again (the descent may pass through states over
the memory limit: after removing one stored action, the other classes' stored actions one at a time), or swap
one action for another (moving an action to another mesh axis first) and descend; the first such move that
lowers the score is taken, until none does or the polish has scored ``polish_budget`` states per rollout (each
descent stops at its share, so a big action space cannot overrun it). Candidates that trim to one state are
polished once, and a polish that reaches a state an earlier one went on from stops there. Under a binding
memory limit each descent first relaxes the limit (a penalty per byte over it, rising, ``LIMIT_PENALTIES``):
over the limit, the limit itself would make it take the step that frees the most memory (storing
parameters), which keeps it beside the basin it started in.

**Kicks.** The polish moves one or two actions at a time, and under a binding memory limit basins differ in
several at once (`gns_small`: which axis splits the graph's edges, and so which parameters are stored
split). So the best ``kicks`` polished states are each kicked: their actions on one mesh axis removed (each
axis in turn), the rest rebuilt by a relaxed descent (once free to take the removed actions again, once not
while relaxed; the better is kept), and polished; further rounds kick the best states not kicked yet. The kicks
have ``kick_share`` of the polish's budget and what the candidates left. The best state of all is the phase's
result.

**Phases** (the composite strategies of PartIR): a search may run in phases, each restricted to some mesh
axes and optimizing ``runtime`` or ``memory`` (peak bytes relative to the unsharded peak, runtime breaking
ties); each phase starts from the previous one's best state, with an equal share of the rollouts left.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from toast.cost.model import Cost, CostModel, PricedRows
from toast.errors import ToastError
from toast.processes import worker_setup, workers_starting
from toast.search.actions import ActionSpace
from toast.search.base import Budget, Phase, Progress, RoundResult, Search, SearchResult, mesh_axes_of_phases
from toast.search.exhaustive import OVER_MEMORY, score_of
from toast.search.shared_states import SharedStates

__all__ = ["MCTS", "MctsSettings", "search"]

POLISH_CHUNK = 8  # polish moves tried at once (fixed: the result must not depend on the workers)
POLISH_TIME_SHARE = 0.2  # of a phase's time budget, kept for the polish
# Penalties per byte over the memory limit (relative to the unsharded peak), in relative step time, that a
# relaxed descent rises through before the limit itself binds (``_descend``): from memory nearly free to far
# dearer than any time saved (measured on gns_small and unet_small: starting lower, the first stage runs to
# data parallelism's peak and never comes back; fewer stages end beside the basin they start in).
LIMIT_PENALTIES = (0.25, 1.0, 4.0, 16.0, 64.0)
KICK_ROUNDS = 3  # rounds of kicks at most (each from the best states not kicked yet)


@dataclass(frozen=True, slots=True, kw_only=True)
class MctsSettings:
    """MCTS's own settings (its budget is the ``Budget``; recorded in strategy files).

    Attributes:
      lanes: independent trees (fixed, whatever the number of workers), each with an equal share of the
        rollouts.
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
      polish: after each phase's lanes, improve the best actions by local search (``_polish``); its costings
        come on top of the rollout budget (a time budget bounds them).
      polish_candidates: how many of the lanes' best trajectories and their trees' best (best first,
        distinct) are polished.
      polish_swaps: the polish also tries swapping each action for each other one (then a descent).
      polish_budget: states the polish may score per rollout of the phase's budget (shared by its candidates
        and kicks; with a rollout budget: then the polish's work is bounded in the budget, whatever the
        program).
      kicks: after the candidates' polish, the best this many polished states are each kicked: without their
        actions on one mesh axis (each axis in turn), rebuilt by a relaxed descent and polished (``_kick``);
        0: no kicks.
      kick_share: the share of the polish's budget kept for the kicks (with what the candidates left).
      relax_limit: the polish's descents relax a binding memory limit first (``LIMIT_PENALTIES``: a penalty
        per byte over it, rising; ``_descend``); the kicks' descents always do.
    """

    lanes: int = 2
    max_depth: int = 30
    exploration: float = 0.3
    rave: float = 100.0
    stop_probability: float = 0.2
    length_penalty: float = 1e-3
    patience: int = 200
    restarts: int | None = None
    polish: bool = True
    polish_candidates: int = 4
    polish_swaps: bool = True
    polish_budget: int = 10
    kicks: int = 2
    kick_share: float = 0.5
    relax_limit: bool = True

    def __post_init__(self) -> None:
        """Raises ``ToastError`` for fewer than one lane, a patience below 1, a negative number of kicks or a
        kick share outside [0, 1)."""
        if self.lanes < 1 or self.patience < 1:
            raise ToastError("lanes and patience must be at least 1")
        if self.kicks < 0:
            raise ToastError(f"kicks {self.kicks}: give 0 or more")
        if not 0 <= self.kick_share < 1:
            raise ToastError(f"kick share {self.kick_share:g}: give at least 0 and less than 1")


@dataclass(frozen=True, slots=True)
class _LaneTask:
    root: bytes  # the phase's starting masks
    allowed: tuple[int, ...]  # action indices this phase may take
    goal: str
    seed: tuple[int, ...]
    rollouts: int
    deadline: float | None


@dataclass(frozen=True, slots=True)
class _LaneResult:
    score: float
    actions: tuple[int, ...]
    rollouts: int
    scored: frozenset[int]  # the states this lane scored (hashes of their keys)
    exhausted: bool  # the lane's tree scored every state below its root
    # The best (score, actions) of each of the lane's trees (one per restart), best first, distinct: the
    # polish's candidates from other basins than the lane's best.
    tops: tuple[tuple[float, tuple[int, ...]], ...] = ()


# What a worker tells the others of a state: its key, step time (seconds: a lower bound where not costed), peak
# (bytes) and whether it was costed.
_Learned = tuple[bytes, float, int, bool]


class _Memo:
    """What one process has learned about states, shared by its lanes (it only memoizes, so results do not
    depend on it): each state once (keyed by its atoms' masks, ``ActionSpace.step``; one bytes object per
    state so its hash is computed once), each transition ``(state, action) -> state or None`` once, each
    state's cost once. A rollout step is a dictionary lookup or a step over the action's atoms, whatever the
    program's depth; only costing a state reads the whole program."""

    def __init__(self, costs: CostModel, space: ActionSpace):
        self.costs, self.space = costs, space
        self.keys: dict[bytes, bytes] = {}
        self.states: dict[bytes, np.ndarray] = {}
        self.transitions: dict[tuple[bytes, int], bytes | None] = {}
        self.cache: dict[bytes, Cost] = {}
        # The peak (bytes) of states priced, not costed, and a lower bound of their step time (seconds; None where
        # only ``fits`` asked): ``best_step``.
        self.bounds: dict[bytes, tuple[float | None, int]] = {}
        # The states last priced up to their schedule, with their rows (``ROWS_KEPT`` at most, the least recent
        # dropped; a state's rows go once it is costed): a rollout asks whether a state fits before it stops there,
        # and then costs it; a descent costs a move it bounded a step or two before.
        self._rows: collections.OrderedDict[bytes, PricedRows] = collections.OrderedDict()
        # (step time, peak) of states other worker processes costed (their polish moves' states, sent with
        # the next moves), and, in a worker sharing them, the states it costed or bounded since ``take_fresh``
        # (``_Learned``).
        self.known: dict[bytes, tuple[float, int]] = {}
        self.sharing = False
        # The table every worker of a search reads and writes at once (made before they are forked; ``None``
        # in one process): ``_recall`` reads it before a state is priced, ``cost_of`` and ``_priced`` write it.
        self.shared: SharedStates | None = None
        self.fresh: list[_Learned] = []
        self.scored: set[int] = set()  # hashes of the keys scored since ``recording`` began
        self.initial_peak = max(int(costs.initial.peak_bytes), 1)  # the unsharded program's peak, bytes

    def key(self, atom_masks: np.ndarray) -> bytes:
        """The state's canonical key (registering the state)."""
        fresh = atom_masks.tobytes()
        key = self.keys.setdefault(fresh, fresh)
        self.states.setdefault(key, atom_masks)
        return key

    def step(self, key: bytes, action: int) -> bytes | None:
        """The key of the state after ``action``, ``None`` where it is invalid."""
        if (key, action) in self.transitions:
            return self.transitions[(key, action)]
        following = self.space.step(self.states[key], action)
        result = None if following is None else self.key(following)
        self.transitions[(key, action)] = result
        return result

    @contextlib.contextmanager
    def recording(self) -> Iterator[set[int]]:
        """The states scored within the block, as hashes of their keys (the same in forked workers: one hash
        seed); the set of all a search scores is the same whatever process scored which, so its size, the
        states costed, is the same on any number of workers and in every run."""
        outer, self.scored = self.scored, set()
        inner = self.scored
        try:
            yield inner
        finally:
            self.scored = outer
            outer |= inner

    def cost_of(self, key: bytes) -> Cost:
        self.scored.add(hash(key))
        found = self.cache.get(key)
        if found is None:
            found = self._costed(key, self._evaluate(key, self._rows.get(key)))
        return found

    def _evaluate(self, key: bytes, rows: PricedRows | None) -> Cost:
        """The state's cost (no collectives listed): from its priced rows where they are at hand."""
        if rows is None:
            return self.costs.evaluate(self.space.state(self.states[key]), collectives=False)
        return self.costs.evaluate_rows(rows, collectives=False)

    def _costed(self, key: bytes, cost: Cost) -> Cost:
        """Keep the state's cost (its rows no longer), and tell the other workers (``fresh``, ``shared``)."""
        self.cache[key] = cost
        self._rows.pop(key, None)
        if self.sharing:
            self.fresh.append((key, cost.step_time_s, cost.peak_bytes, True))
        if self.shared is not None:
            self.shared.add_costed(key, cost.step_time_s, cost.peak_bytes)
        return cost

    def _recall(self, key: bytes) -> None:
        """What another worker learned of a state this process has not costed (``shared``): its cost into
        ``known``, its bound into ``bounds``."""
        if self.shared is None:
            return
        costed, bounded = self.shared.find(key)
        if costed is not None:
            self.known[key] = costed
            self.bounds.pop(key, None)
        elif bounded is not None and self.bounds.get(key, (None, 0))[0] is None:
            self.bounds[key] = bounded

    def take_fresh(self) -> tuple[_Learned, ...]:
        """The states this process costed or bounded since the last call."""
        fresh, self.fresh = tuple(self.fresh), []
        return fresh

    def learn(self, entries: Iterable[_Learned]) -> None:
        """States another process costed (their step time and peak: the same numbers costing them gives) or
        bounded (``best_step``)."""
        for key, step_time_s, peak_bytes, costed in entries:
            if key in self.cache or key in self.known:
                continue
            if costed:
                self.known[key] = (step_time_s, peak_bytes)
                self.bounds.pop(key, None)
            elif self.bounds.get(key, (None, 0))[0] is None:
                self.bounds[key] = (step_time_s, peak_bytes)

    def cost(self, atom_masks: np.ndarray) -> Cost:
        return self.cost_of(self.key(atom_masks))

    def time_and_peak(self, key: bytes) -> tuple[float, int]:
        """The state's step time (seconds) and peak (bytes per device), scoring it."""
        learned = self.known.get(key)
        if learned is None and key not in self.cache:
            self._recall(key)
            learned = self.known.get(key)
        if learned is None:
            cost = self.cost_of(key)
            return cost.step_time_s, cost.peak_bytes
        self.scored.add(hash(key))
        return learned

    def penalized(self, key: bytes, goal: str, penalty: float | None) -> float:
        """``score``; for ``runtime`` with a ``penalty``, the memory limit relaxed (a Lagrangian relaxation):
        the step time relative to the unsharded program's plus ``penalty`` times the bytes over the limit
        relative to the unsharded peak."""
        return self._score(*self.time_and_peak(key), goal, penalty)

    def score(self, key: bytes, goal: str) -> float:
        """The state's score (lower is better): ``search_score`` (relative step time, memory a constraint)
        for ``runtime``; for ``memory``, the peak relative to the unsharded one, step time breaking ties."""
        return self._score(*self.time_and_peak(key), goal, None)

    def _score(self, step_time_s: float, peak_bytes: int, goal: str, penalty: float | None) -> float:
        """``penalized`` of a state with this step time (seconds) and peak (bytes); never lower for a longer
        step (so a lower bound of the step time gives one of the score)."""
        if penalty is not None and goal == "runtime":
            initial_time = float(self.costs.initial.step_time_s)
            relative = step_time_s / initial_time if initial_time > 0 else 1.0
            return relative + penalty * max(0.0, peak_bytes - self.costs.device_memory) / self.initial_peak
        runtime = score_of(step_time_s, peak_bytes, self.costs)
        if goal == "memory":
            return peak_bytes / self.initial_peak + 1e-3 * min(runtime, OVER_MEMORY)
        return runtime

    def fits(self, key: bytes) -> bool:
        """Whether the state's peak is within the memory limit, scoring it: from its cost where it has one, else
        from a floor of its peak (``CostModel.peak_floor``) where that is over the limit, else priced up to its
        schedule only (``CostModel.priced_rows``): a rollout asks before it stops at a state, and where the state
        does not fit it goes on, never costing it."""
        self.scored.add(hash(key))
        if key not in self.cache and key not in self.known and key not in self.bounds:
            self._recall(key)
        learned = self.known.get(key)
        cost = self.cache.get(key)
        if learned is not None:
            peak = learned[1]
        elif cost is not None:
            peak = cost.peak_bytes
        else:
            bound = self.bounds.get(key)
            if bound is None and self.costs.peak_floor(self.space.state(self.states[key])) > self.costs.device_memory:
                return False  # its arguments alone are over the limit (most states a rollout passes, under one)
            peak = bound[1] if bound is not None else self._priced(key, timed=False)[0][1]
        return peak <= self.costs.device_memory

    def _bound(self, key: bytes) -> tuple[tuple[float, int], PricedRows | None]:
        """A lower bound of the state's step time (seconds) and its peak (bytes), with its priced rows where they
        are at hand (made now, or kept: ``_rows``; else ``None``)."""
        bound = self.bounds.get(key)
        if bound is not None and bound[0] is not None:
            return (bound[0], bound[1]), self._rows.get(key)
        (step_bound, peak), rows = self._priced(key, timed=True)
        assert step_bound is not None
        return (step_bound, peak), rows

    def _priced(self, key: bytes, *, timed: bool) -> tuple[tuple[float | None, int], PricedRows]:
        """The state priced up to its schedule: its peak, and (``timed``) a lower bound of its step time, kept in
        ``bounds`` (and told to the other workers); its rows kept (``_rows``: costing it may need them)."""
        rows = self.costs.priced_rows(self.space.state(self.states[key]))
        step_bound = self.costs.step_time_bound(rows) if timed else None
        self.bounds[key] = (step_bound, rows.peak)
        self._rows[key] = rows
        if len(self._rows) > ROWS_KEPT:
            self._rows.popitem(last=False)
        if self.sharing and step_bound is not None:
            self.fresh.append((key, step_bound, rows.peak, False))
        if self.shared is not None and step_bound is not None:
            self.shared.add_bounded(key, step_bound, rows.peak)
        return (step_bound, rows.peak), rows

    def best_step(self, following: list[tuple[int, bytes]], goal: str, penalty: float | None) -> tuple[float, int]:
        """``min((penalized(key, goal, penalty), action) for action, key in following)``, scoring every state
        (``recording`` holds them all), but costing in full only those that could be the least: the others
        are priced up to their schedule (``CostModel.priced_rows``), and a lower bound of their step time
        (``CostModel.step_time_bound``) shows them worse than one costed, lowest bound first. A descent's
        step needs only its best move (most of its moves add collectives the stream cannot hide); the result
        is the same as costing each."""
        best = (math.inf, -1)
        bounded: list[tuple[float, int, bytes, PricedRows | None]] = []
        for action, key in following:
            if key not in self.cache and key not in self.known:
                self._recall(key)
            if key in self.cache or key in self.known:
                best = min(best, (self.penalized(key, goal, penalty), action))
                continue
            bound, rows = self._bound(key)
            bounded.append((self._score(*bound, goal, penalty), action, key, rows))
        bounded.sort(key=lambda entry: (entry[0], entry[1]))
        for low, action, key, rows in bounded:
            self.scored.add(hash(key))
            # A bound within rounding of the best (the step times agree to 1e-12) is costed: it could tie.
            if low - best[0] > _BOUND_MARGIN * abs(best[0]):
                continue
            cost = self.cache.get(key)  # two actions may lead to one state
            if cost is None:
                cost = self._costed(key, self._evaluate(key, rows))
            best = min(best, (self._score(cost.step_time_s, cost.peak_bytes, goal, penalty), action))
        return best


# The priced rows a memo keeps (``_Memo._rows``): about 0.3-0.5 MB each on a 70B-shaped step.
ROWS_KEPT = 64

# Relative margin by which a state's bounded score must exceed the best costed one for ``_Memo.best_step`` to leave it
# uncosted (far above the 1e-12 the bound and the cost may differ by in rounding).
_BOUND_MARGIN = 1e-9


class _Node:
    """A state in a lane's tree: per position (the phase's allowed actions, then the stop action) its child's
    key (``_UNKNOWN`` until stepped; ``None``: invalid here), visits, summed rewards, and all-moves-as-first
    statistics (rollouts through this node that took the action at any later point); ``dead`` marks
    positions with nothing left to learn (invalid, a stop already scored, a child whose subtree is
    exhausted)."""

    __slots__ = ("children", "visits", "counts", "totals", "amaf_counts", "amaf_totals", "dead", "exhausted")

    def __init__(self, width: int):
        self.children: list[Any] = [_UNKNOWN] * width
        self.visits = 0
        self.counts = np.zeros(width)
        self.totals = np.zeros(width)
        self.amaf_counts = np.zeros(width)
        self.amaf_totals = np.zeros(width)
        self.dead = np.zeros(width, dtype=bool)
        self.exhausted = False


_UNKNOWN: Any = object()  # a child not yet stepped to


@dataclass
class _Tree:
    """One lane's tree, rooted at ``root`` (reached by ``prefix`` from the phase's start)."""

    root: bytes
    prefix: tuple[int, ...]
    nodes: dict[bytes, _Node]


def _tree_score(score: float) -> float:
    """The score a rollout backs up: states over the memory limit (``OVER_MEMORY`` and more) squeezed to just
    above the unsharded program's 1, so they do not swamp the averages of the states that fit."""
    if score < OVER_MEMORY:
        return score
    return 1.5 + min(score - OVER_MEMORY, 1.0)


def _run_lane(space: ActionSpace, memo: _Memo, settings: MctsSettings, task: _LaneTask) -> _LaneResult:
    """One lane: up to ``task.rollouts`` rollouts from ``task.root`` on one tree (restarted below the lane's
    best state after ``settings.patience`` rollouts without improvement), stopping early only when the
    tree has seen every state; a pure function of its inputs (``memo`` only memoizes).

    Selection is UCT blended with all-moves-as-first values (RAVE): the state is a set of actions, mostly
    independent of their order, so a rollout that took an action anywhere below a node says something about
    taking it at the node. Unvisited actions are valued by those statistics (or by the node's mean), so a
    rollout goes below a node before it has tried every action there."""
    with memo.recording() as scored:
        return _lane(space, memo, settings, task, scored)


def _lane(space: ActionSpace, memo: _Memo, settings: MctsSettings, task: _LaneTask, scored: set[int]
          ) -> _LaneResult:
    rng = np.random.default_rng(list(task.seed))
    start_key = memo.key(np.frombuffer(task.root, dtype=np.uint8).copy())
    allowed = list(task.allowed)
    width = len(allowed) + 1
    stop = width - 1
    position = {action: index for index, action in enumerate(allowed)}
    best_score = memo.score(start_key, task.goal)
    best_actions: tuple[int, ...] = ()
    tree = _Tree(start_key, (), {start_key: _Node(width)})
    done = since_best = restarts = 0
    exhausted = False
    tops: dict[tuple[int, ...], float] = {}
    tree_best: tuple[float, tuple[int, ...]] = (math.inf, ())
    while done < task.rollouts:
        if task.deadline is not None and time.monotonic() > task.deadline:
            break
        root = tree.nodes[tree.root]
        if root.exhausted or since_best >= settings.patience:
            if root.exhausted and tree.root == start_key:
                exhausted = True  # every state below the start is scored
                break
            if settings.restarts is not None and restarts >= settings.restarts:
                break
            restarts += 1
            since_best = 0
            tops.setdefault(tree_best[1], tree_best[0])
            tree_best = (math.inf, ())
            # Below the best state when the tree was not there yet; else afresh from the start.
            if best_actions and tuple(best_actions) != tree.prefix and not root.exhausted:
                replayed = _replay_key(memo, start_key, best_actions)
                tree = _Tree(replayed, tuple(best_actions), {replayed: _Node(width)})
            else:
                tree = _Tree(start_key, (), {start_key: _Node(width)})
            continue
        done += 1
        since_best += 1
        path: list[tuple[_Node, int]] = []
        taken: list[int] = list(tree.prefix)
        key, stopped = _select(tree, memo, settings, allowed, rng, path, taken)
        if not stopped:
            key = _roll_out(key, memo, settings, task, allowed, rng, taken)
        score = memo.score(key, task.goal)
        reward = -(_tree_score(score) + settings.length_penalty * len(taken))
        _back_up(tree, path, [position[action] for action in taken[len(tree.prefix):]], reward, stop)
        if (score, len(taken)) < (tree_best[0], len(tree_best[1])):
            tree_best = (score, tuple(taken))
        if (score, len(taken)) < (best_score, len(best_actions)):
            best_score, best_actions = score, tuple(taken)
            since_best = 0
    tops.setdefault(tree_best[1], tree_best[0])
    tops[best_actions] = best_score
    ranked = sorted(((score, actions) for actions, score in tops.items() if score < math.inf),
                    key=lambda top: (top[0], len(top[1]), top[1]))
    return _LaneResult(best_score, best_actions, done, frozenset(scored), exhausted,
                       tuple(ranked[:settings.polish_candidates]))


def _select(tree: _Tree, memo: _Memo, settings: MctsSettings, allowed: list[int], rng: np.random.Generator,
            path: list[tuple[_Node, int]], taken: list[int]) -> tuple[bytes, bool]:
    """Selection: UCT-RAVE among each node's live positions, from the tree's root down to a node not yet in
    the tree. Appends the ``(node, position)`` steps to ``path`` and the actions to ``taken``; returns the key
    reached and whether the lane stops there (the stop action, the depth limit, nothing live)."""
    width = len(allowed) + 1
    stop = width - 1
    node, key = tree.nodes[tree.root], tree.root
    while True:
        if len(taken) >= settings.max_depth:
            return key, True
        live = ~node.dead
        if not live.any():
            node.exhausted = True
            return key, True
        counts = node.counts
        mean = node.totals.sum() / max(node.visits, 1) if node.visits else 0.0
        value = np.where(counts > 0, node.totals / np.maximum(counts, 1), mean)
        amaf = np.where(node.amaf_counts > 0, node.amaf_totals / np.maximum(node.amaf_counts, 1), value)
        beta = np.sqrt(settings.rave / (3.0 * counts + settings.rave))
        bonus = settings.exploration * np.sqrt(math.log(node.visits + 1) / (counts + 1))
        priority = (1 - beta) * value + beta * amaf + bonus + rng.random(width) * 1e-9
        priority[~live] = -np.inf
        choice = int(np.argmax(priority))
        if choice == stop:
            node.dead[stop] = True  # its reward is the node's own score: once is enough
            path.append((node, choice))
            return key, True
        child = node.children[choice]
        if child is _UNKNOWN:
            child = node.children[choice] = memo.step(key, allowed[choice])
        if child is None:
            node.dead[choice] = True
            continue
        child_node = tree.nodes.get(child)
        if child_node is not None and child_node.exhausted:
            node.dead[choice] = True
            continue
        path.append((node, choice))
        taken.append(allowed[choice])
        key = child
        if child_node is None:
            tree.nodes[child] = _Node(width)
            return key, False
        node = child_node


def _roll_out(key: bytes, memo: _Memo, settings: MctsSettings, task: _LaneTask, allowed: list[int],
              rng: np.random.Generator, taken: list[int]) -> bytes:
    """Default policy: random valid actions (appended to ``taken``), stopping with probability
    ``stop_probability`` at each step, but not at a state over the memory limit (no sharding that stops there
    fits: one more action may). Returns the key reached."""
    while len(taken) < settings.max_depth:
        if rng.random() < settings.stop_probability and (task.goal != "runtime" or memo.fits(key)):
            break
        for _attempt in range(8):
            action = allowed[int(rng.integers(0, len(allowed)))]
            following = memo.step(key, action)
            if following is not None:
                key = following
                taken.append(action)
                break
        else:
            break
    return key


def _back_up(tree: _Tree, path: list[tuple[_Node, int]], later: list[int], reward: float, stop: int) -> None:
    """Adds ``reward`` to the visits along ``path`` and to the all-moves-as-first statistics of the positions
    ``later`` taken below each node; marks nodes whose positions are all dead exhausted, up the path."""
    for depth, (visited, choice) in enumerate(path):
        visited.visits += 1
        visited.counts[choice] += 1
        visited.totals[choice] += reward
        seen = np.unique(later[depth:] or [stop])
        visited.amaf_counts[seen] += 1
        visited.amaf_totals[seen] += reward
    # A node whose positions are all dead is exhausted; so is its position in the parent.
    for visited, choice in reversed(path):
        child = visited.children[choice] if choice != stop else None
        child_node = tree.nodes.get(child) if child is not None and child is not _UNKNOWN else None
        if child_node is not None and child_node.exhausted:
            visited.dead[choice] = True
        if visited.dead.all():
            visited.exhausted = True
        else:
            break


def _replay_key(memo: _Memo, key: bytes, actions: tuple[int, ...]) -> bytes:
    for action in actions:
        following = memo.step(key, action)
        assert following is not None, "a lane's best trajectory replays"
        key = following
    return key


def _replay(space: ActionSpace, actions: list[int]) -> np.ndarray | None:
    """The atoms' masks after ``actions`` from the initial state; ``None`` where one is invalid."""
    atoms = space.initial_atoms
    for action in actions:
        following = space.step(atoms, action)
        if following is None:
            return None
        atoms = following
    return atoms


def _trim(space: ActionSpace, memo: _Memo, actions: list[int], *, keep: int, goal: str
          ) -> tuple[list[int], float]:
    """``actions`` without those (past the first ``keep``) whose removal costs nothing, last first, and the
    score of what is left. A winning trajectory carries random actions that happen not to hurt; kept, they
    could block an axis the polish needs (a batch dim cannot take an axis a channel dim holds)."""
    atoms = _replay(space, actions)
    assert atoms is not None, "a committed trajectory replays"
    score = memo.score(memo.key(atoms), goal)
    for position in range(len(actions) - 1, keep - 1, -1):
        shorter = actions[:position] + actions[position + 1:]
        atoms = _replay(space, shorter)
        if atoms is None:
            continue
        shorter_score = memo.score(memo.key(atoms), goal)
        if shorter_score <= score:
            actions, score = shorter, shorter_score
    return actions, score


@dataclass(frozen=True, slots=True)
class _RefillTask:
    actions: tuple[int, ...]  # the trajectory, or it with one action removed
    allowed: tuple[int, ...]
    goal: str
    first: tuple[int, ...] | None  # the first step's candidates (None: every allowed action)
    limit: int | None = None  # states it may score: a step that would pass it is not taken (the first always is)
    # States the other workers costed in the previous round of moves (``_Memo.learn``): only saves costing them.
    known: tuple[_Learned, ...] = ()
    # Descend first with the memory limit relaxed by these penalties, in order (``_Memo.penalized``), then with
    # the limit itself.
    penalties: tuple[float, ...] = ()
    barred: tuple[int, ...] = ()  # actions the relaxed stages may not take (the limit's own stage may)


_RefillResult = tuple[float, tuple[int, ...], frozenset[int], int]


def _refill(space: ActionSpace, memo: _Memo, task: _RefillTask) -> _RefillResult:
    """Greedy descent from the end of ``task.actions``: add the allowed action that lowers the score most
    (lowest index among equals) until none does; with ``task.penalties``, first under the memory limit
    relaxed by each penalty in turn (``_Memo.penalized``), until a stage ends where the state fits (where
    the last ends over the limit, the descent is made again without them). The
    score, the actions, the states it scored (hashes of their keys, ``_Memo.recording``) and how many
    scorings it made (states scored again included: what the polish's budget counts, the same on any number
    of workers). A pure function of its inputs (``memo`` only memoizes).

    Why the relaxation: under a binding limit, a descent from a state over it takes the step that frees the
    most memory (a stored action), so it ends beside the basin it started in. Relaxed, the first steps are
    those that save time and memory together (a channel split where another axis held the edges), and the
    rising penalty then adds the cheapest memory savings until the state fits."""
    with memo.recording() as recorded:
        score, actions, scored = _descend(space, memo, task)
    return score, actions, frozenset(recorded), scored


def _descend(space: ActionSpace, memo: _Memo, task: _RefillTask) -> tuple[float, tuple[int, ...], int]:
    atoms = _replay(space, list(task.actions))
    if atoms is None:
        return math.inf, task.actions, 0
    start = memo.key(atoms)
    key, actions, scored = _stages(memo, task, start, task.penalties, 1)
    if task.penalties and memo.score(key, task.goal) >= OVER_MEMORY:
        # Relaxed, it ended over the limit where no step frees memory (8-way data parallelism of an MLP whose
        # weights do not fit whole): descend again under the limit itself.
        key, actions, scored = _stages(memo, task, start, (), scored)
    return memo.score(key, task.goal), tuple(actions), scored


def _stages(memo: _Memo, task: _RefillTask, key: bytes, penalties: tuple[float, ...], scored: int
            ) -> tuple[bytes, list[int], int]:
    """``_descend``'s descent from ``key`` (after ``task.actions``) under each of ``penalties`` in turn, then
    under the limit itself, stopping at a stage that ends where the state fits; the state it ends at, the
    actions, and the scorings made (``scored`` before it)."""
    actions = list(task.actions)
    barred = set(task.barred) if penalties else set()
    unbarred = tuple(a for a in task.allowed if a not in barred)
    candidates = task.allowed if task.first is None else task.first
    for stage, penalty in enumerate((*penalties, None)):
        if stage and memo.score(key, task.goal) < OVER_MEMORY:
            # It fits: no step lowers its score under this penalty (a larger one only adds to the others'
            # scores), nor under the limit itself.
            break
        score = memo.penalized(key, task.goal, penalty)
        if penalty is not None and barred:
            candidates = tuple(a for a in candidates if a not in barred)
        while True:
            if task.limit is not None and scored > 1 and scored + len(candidates) > task.limit:
                break
            options = [(action, following) for action in candidates
                       if (following := memo.step(key, action)) is not None]
            scored += len(options)
            candidates = unbarred if penalty is not None else task.allowed
            if not options:
                break
            best_score, best_action = memo.best_step(options, task.goal, penalty)
            if best_score >= score:
                break
            following = memo.step(key, best_action)
            assert following is not None
            score, key = best_score, following
            actions.append(best_action)
    return key, actions, scored


def _worker_refill(task: _RefillTask) -> tuple[_RefillResult, tuple[_Learned, ...]]:
    """``_refill`` in a worker, which learns ``task.known`` first; with the states it costed."""
    assert _WORKER is not None
    space, memo, _ = _WORKER
    memo.learn(task.known)
    # From the polish on (what its lane costed stays with this worker), unless the workers share a table.
    memo.sharing = memo.shared is None
    result = _refill(space, memo, task)
    return result, memo.take_fresh()


def _polish(space: ActionSpace, memo: _Memo, actions: list[int], *, keep: int, allowed: tuple[int, ...],
            goal: str, score: float, chunk: int, pool: Any, deadline: float | None, swaps: bool = False,
            budget: int | None = None, penalties: tuple[float, ...] = (),
            reached: set[bytes] | None = None) -> tuple[list[int], float, int]:
    """Local search on a phase's actions (past the first ``keep``): descend greedily (``_refill``), remove
    one action and then descend, or (``swaps``) swap one for another and descend; take the first move that
    lowers the score (in that order, latest position first), and start over. A trajectory from a rollout
    carries random actions, and one can hold an axis that a better plan needs (a channel dim on the axis the
    batch wants); this undoes one at a time. Moves are tried ``chunk`` at a time in the workers (a fixed
    chunk, so the result does not depend on the number of workers) until ``budget`` states have been scored.
    Each descent relaxes the memory limit first by ``penalties`` (``_descend``). A move that reaches a state
    in ``reached`` (where an earlier polish went on from) ends it; the states it moves to are added.
    Returns the actions, their score and the states scored (counted as the budget counts them; they are
    added to ``memo.scored``)."""

    def moves() -> list[_RefillTask]:
        # First a plain descent; then each removal and a descent whose first step is not the removed action
        # (a step may have to go through states over the memory limit: after removing a stored action, the
        # other classes' stored actions one by one).
        positions = range(len(actions) - 1, keep - 1, -1)
        found = [_RefillTask(tuple(actions), allowed, goal, None, penalties=penalties)] + [
            _RefillTask(tuple(actions[:p] + actions[p + 1:]), allowed, goal,
                        tuple(a for a in allowed if a != actions[p]), penalties=penalties)
            for p in positions]
        if swaps:
            # Then each swap of one action for another, and a descent: first the swaps that move an action's
            # colors to another mesh axis (under a tight memory limit the states that fit split nearly every
            # class on some axis, and which axis each takes is what a random trajectory gets wrong), then the
            # others (one stored action for another class's, where neither alone is a step down).
            pairs = [(p, a) for p in positions for a in allowed if a not in actions]
            pairs.sort(key=lambda pair: space.actions[pair[1]].colors != space.actions[actions[pair[0]]].colors)
            found += [_RefillTask(tuple(actions[:p] + actions[p + 1:] + [a]), allowed, goal, None, penalties=penalties)
                      for p, a in pairs]
        return found

    pending = moves()
    scored = 0
    # In workers, each round's moves carry the states the previous round costed (a worker's memo holds only
    # what it costed itself: neighbouring moves in two workers would cost the same states).
    learned: tuple[_Learned, ...] = ()
    while pending and (deadline is None or time.monotonic() <= deadline) and (budget is None or scored < budget):
        tasks, pending = pending[:chunk], pending[chunk:]
        if budget is not None:  # each descent stops at its share of what is left (the first step is always taken)
            tasks = [dataclasses.replace(task, limit=(budget - scored) // len(tasks)) for task in tasks]
        if pool is not None:
            answers = pool.map(_worker_refill, [dataclasses.replace(task, known=learned) for task in tasks],
                               chunksize=1)
            results = [result for result, _ in answers]
            learned = tuple(entry for _, fresh in answers for entry in fresh)
            memo.learn(learned)
        else:
            results = [_refill(space, memo, task) for task in tasks]
        for result in results:
            memo.scored |= result[2]
        scored += sum(result[3] for result in results)
        better = [result for result in results if result[0] < score - 1e-9]
        if better:
            score, actions = better[0][0], list(better[0][1])
            pending = moves()
            if reached is not None:
                key = _replay_key(memo, memo.key(space.initial_atoms), tuple(actions))
                if key in reached:
                    break  # an earlier polish went on from this state
                reached.add(key)
    return actions, score, scored


# Worker processes are forked with the space, memo and settings in this global (nothing is pickled, and a
# user's script is not re-imported as spawned processes would); they send back only lane results.
_WORKER: tuple[ActionSpace, _Memo, MctsSettings] | None = None


def _worker_lane(task: _LaneTask) -> _LaneResult:
    assert _WORKER is not None
    space, memo, settings = _WORKER
    return _run_lane(space, memo, settings, task)


def _fork_pool(workers: int, context: tuple[ActionSpace, _Memo, MctsSettings]) -> Any:
    """A pool of forked workers holding ``context``, or ``None`` where the platform cannot fork."""
    import multiprocessing
    import warnings

    global _WORKER
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    _WORKER = context
    forking = multiprocessing.get_context("fork")
    context[1].shared = SharedStates(context=forking)  # before the fork: the workers map the same memory
    with warnings.catch_warnings():
        # JAX warns on any fork once it has started; the workers only run numpy on the cost model.
        warnings.simplefilter("ignore", RuntimeWarning)
        with workers_starting():
            return forking.Pool(workers, initializer=worker_setup, initargs=(os.getpid(),))


DEFAULT_SETTINGS = MctsSettings()
DEFAULT_BUDGET = Budget()


def _lane_tasks(settings: MctsSettings, seed: int, state: np.ndarray, allowed: tuple[int, ...], phase: Phase,
                phase_index: int, *, budget: int | None, workers: int, phase_start_time: float,
                phase_seconds: float | None) -> list[_LaneTask]:
    """A phase's lanes: its rollout ``budget`` shared by them; run in waves of ``workers``, with a time budget
    each wave has its share of the phase's time (less the polish's share). A lane of no rollouts is left out."""
    shares = [None] * settings.lanes if budget is None else [
        budget // settings.lanes + (1 if lane < budget % settings.lanes else 0) for lane in range(settings.lanes)]
    waves = -(-settings.lanes // workers)
    lane_seconds = None if phase_seconds is None else phase_seconds * (
        1 - POLISH_TIME_SHARE if settings.polish else 1)
    return [_LaneTask(state.tobytes(), allowed, phase.goal, (seed, phase_index, lane),
                      share if share is not None else 2 ** 62,
                      None if lane_seconds is None else phase_start_time + lane_seconds * (lane // workers + 1) / waves)
            for lane, share in enumerate(shares) if share != 0]


def _refine(space: ActionSpace, memo: _Memo, settings: MctsSettings, found: list[_LaneResult],
            trajectory: list[int], best: float, phase: Phase, *, allowed: tuple[int, ...], keep: int,
            budget: int | None, deadline: float | None, pool: Any) -> tuple[float, list[int]]:
    """The lanes' best trajectories and the best of each of their trees, best first, trimmed after
    ``trajectory`` (whose first ``keep`` actions, the earlier phases', stay), each state once: the first
    ``polish_candidates`` of them polished, then the best polished states kicked (``_kick``). The best of
    them all and of ``trajectory`` itself (scored ``best``), as ``(score, actions)``.

    The polish scores at most ``polish_budget`` states per rollout of the phase: the candidates share
    ``1 - kick_share`` of it, the kicks the rest and what the candidates left."""
    tops = {actions: score for r in found for score, actions in ((r.score, r.actions), *r.tops)}
    candidates = sorted(((score, actions) for actions, score in tops.items()),
                        key=lambda top: (top[0], len(top[1]), top[1]))
    refined: list[tuple[float, int, list[int]]] = [(best, len(trajectory), trajectory)]
    count = settings.polish_candidates if settings.polish else 1
    starts: list[tuple[float, list[int]]] = []
    seen: set[bytes] = set()  # candidates that trim to one state are polished once
    initial = memo.key(space.initial_atoms)
    for _, candidate in candidates:
        if len(starts) == count:
            break
        actions, score = _trim(space, memo, trajectory + list(candidate), keep=keep, goal=phase.goal)
        key = _replay_key(memo, initial, tuple(actions))
        if key not in seen:
            seen.add(key)
            starts.append((score, actions))
    kicking = settings.polish and settings.kicks > 0
    total = None if budget is None else settings.polish_budget * budget
    share = None if total is None else max(1, int(total * (1 - (settings.kick_share if kicking else 0)))
                                           // max(1, len(starts)))
    penalties = LIMIT_PENALTIES if settings.relax_limit else ()
    reached: set[bytes] = set()
    spent = 0
    for rank, (score, actions) in enumerate(starts):
        if deadline is not None and time.monotonic() > deadline and rank:
            break
        if settings.polish:
            actions, score, used = _polish(space, memo, actions, keep=keep, allowed=allowed, goal=phase.goal,
                                           score=score, chunk=POLISH_CHUNK, pool=pool, deadline=deadline,
                                           swaps=settings.polish_swaps, budget=share, penalties=penalties,
                                           reached=reached)
            spent += used
        refined.append((score, len(actions), actions))
    if kicking:
        _kick(space, memo, settings, refined, phase, allowed=allowed, keep=keep, total=total, spent=spent,
              deadline=deadline, pool=pool, reached=reached)
    phase_best, _, chosen = min(refined, key=lambda r: (r[0], r[1], tuple(r[2])))
    return phase_best, chosen


def _kick(space: ActionSpace, memo: _Memo, settings: MctsSettings, refined: list[tuple[float, int, list[int]]],
          phase: Phase, *, allowed: tuple[int, ...], keep: int, total: int | None, spent: int,
          deadline: float | None, pool: Any, reached: set[bytes]) -> None:
    """Kicks (iterated local search): the best ``settings.kicks`` states of ``refined`` (``(score, length,
    actions)``, distinct), each without its phase's actions on one mesh axis, rebuilt by a descent that
    relaxes the memory limit first (``LIMIT_PENALTIES``), and polished; appended to ``refined``. Each round
    (at most ``KICK_ROUNDS``) kicks the best states not kicked yet, until the polish's budget (``total``
    states scored, ``spent`` of them already) is spent.

    The polish moves one or two actions at a time; under a binding memory limit, the basins the lanes end in
    can differ in several actions at once (which axis splits the edges of a graph network, and so which
    parameters must be stored split to fit), and no such move leaves one: removing a whole axis's actions
    does, and the relaxed descent refills the axis with the time-saving splits first."""
    axes = [axis for axis, _ in space.model.mesh.axes if any(space.actions[a].axis == axis for a in allowed)]
    initial = memo.key(space.initial_atoms)
    kicked: set[bytes] = set()  # the states kicked (each once, whatever the order of its actions)
    for _ in range(KICK_ROUNDS):
        if (deadline is not None and time.monotonic() > deadline) or (total is not None and spent >= total):
            return
        ranked = sorted(refined, key=lambda r: (r[0], r[1], tuple(r[2])))
        bases: list[list[int]] = []
        for score, _, actions in ranked:
            if len(bases) == settings.kicks:
                break
            key = _replay_key(memo, initial, tuple(actions))
            if len(actions) > keep and score < OVER_MEMORY and key not in kicked:
                kicked.add(key)
                bases.append(actions)
        starts = [(base[:keep] + [a for a in base[keep:] if space.actions[a].axis != axis],
                   tuple(a for a in base[keep:] if space.actions[a].axis == axis))
                  for base in bases for axis in axes if any(space.actions[a].axis == axis for a in base[keep:])]
        if not starts:
            return
        # Each start is rebuilt twice, free to take the removed actions again and not while relaxed (else the
        # cheapest way back under the limit is often the basin it left); the better of the two is polished.
        limit = None if total is None else max(1, (total - spent) // (2 * len(starts)))
        tasks = [_RefillTask(tuple(start), allowed, phase.goal, None, limit=limit, penalties=LIMIT_PENALTIES,
                             barred=barred) for start, removed in starts for barred in ((), removed)]
        if pool is not None:
            answers = pool.map(_worker_refill, tasks, chunksize=1)
            rebuilt = [result for result, _ in answers]
            memo.learn(entry for _, fresh in answers for entry in fresh)
        else:
            rebuilt = [_refill(space, memo, task) for task in tasks]
        for result in rebuilt:
            memo.scored |= result[2]
            spent += result[3]
        results = [min(pair, key=lambda r: (r[0], len(r[1]), r[1]))
                   for pair in zip(rebuilt[::2], rebuilt[1::2], strict=True)]
        for index, (score, rebuilt_actions, _, _) in enumerate(results):
            actions = list(rebuilt_actions)
            if score < OVER_MEMORY and (deadline is None or time.monotonic() <= deadline):
                share = None if total is None else max(1, (total - spent) // (len(results) - index))
                actions, score, used = _polish(space, memo, actions, keep=keep, allowed=allowed, goal=phase.goal,
                                               score=score, chunk=POLISH_CHUNK, pool=pool, deadline=deadline,
                                               swaps=settings.polish_swaps, budget=share,
                                               penalties=LIMIT_PENALTIES if settings.relax_limit else (),
                                               reached=reached)
                spent += used
            refined.append((score, len(actions), actions))


def search(space: ActionSpace, costs: CostModel, *, budget: Budget = DEFAULT_BUDGET,
           settings: MctsSettings = DEFAULT_SETTINGS, progress: Progress | None = None) -> SearchResult:
    """Search for the sharding with the lowest cost (``toast.search.base.SearchFn``).

    Args:
      space: the action space (with its pinned initial state).
      costs: the cost model (its ``device_memory`` is the memory limit: a state over it never beats one that
        fits).
      budget: seed, rollouts, seconds, workers and phases.
      settings: the search's constants.
      progress: called as each lane ends, and after each polish, with ``(round, rollouts so far, seconds so
        far)``.

    Raises:
      ToastError: a phase naming an axis the mesh lacks (budget and settings checked themselves when made).
    """
    mesh_axes = mesh_axes_of_phases(space, budget)
    start = time.monotonic()
    memo = _Memo(costs, space)
    workers = budget.workers or min(os.cpu_count() or 1, settings.lanes)
    workers = max(1, min(workers, settings.lanes))
    costs.prepare(space.partition)  # once, before the fork (a no-op when the caller did it)
    memo.cost(space.initial_atoms)
    pool = _fork_pool(workers, (space, memo, settings)) if workers > 1 else None
    try:
        state = space.initial_atoms
        trajectory: list[int] = []
        rounds: list[RoundResult] = []
        total_rollouts = 0
        for phase_index, phase in enumerate(budget.phases):
            phase_start_time = time.monotonic()
            phases_left = len(budget.phases) - phase_index
            axes = set(phase.axes or mesh_axes)
            allowed = tuple(i for i, a in enumerate(space.actions) if a.axis in axes)
            best = memo.score(memo.key(state), phase.goal)
            phase_start = len(trajectory)  # trimming keeps the earlier phases' actions
            # The budget left is shared by the phases left.
            rollouts = None if budget.rollouts is None else (budget.rollouts - total_rollouts) // phases_left
            phase_seconds = None if budget.seconds is None else (
                budget.seconds - (phase_start_time - start)) / phases_left
            tasks = _lane_tasks(settings, budget.seed, state, allowed, phase, phase_index, budget=rollouts,
                                workers=workers,
                                phase_start_time=phase_start_time, phase_seconds=phase_seconds)
            lane_results = pool.imap(_worker_lane, tasks, chunksize=1) if pool is not None else (
                _run_lane(space, memo, settings, task) for task in tasks)
            found: list[_LaneResult] = []
            phase_rollouts = 0
            for result in lane_results:
                phase_rollouts += result.rollouts
                total_rollouts += result.rollouts
                memo.scored |= result.scored
                found.append(result)
                if progress is not None:
                    leader = min(found, key=lambda r: (r.score, len(r.actions)))
                    cost = memo.cost_of(_replay_key(memo, memo.key(state), leader.actions))
                    progress(RoundResult(phase_index, cost.relative, cost.step_time_s, result.rollouts),
                             total_rollouts, time.monotonic() - start)
            deadline = None if phase_seconds is None else phase_start_time + phase_seconds
            phase_best, chosen = _refine(space, memo, settings, found, trajectory, best, phase, allowed=allowed,
                                         keep=phase_start, budget=rollouts, deadline=deadline, pool=pool)
            if phase_best < best:
                trajectory, best = chosen, phase_best
                replayed = _replay(space, trajectory)
                assert replayed is not None, "a refined trajectory replays"
                state = replayed
            cost = memo.cost(state)
            rounds.append(RoundResult(phase_index, cost.relative, cost.step_time_s, phase_rollouts))
            if progress is not None:
                progress(rounds[-1], total_rollouts, time.monotonic() - start)
    except BaseException:
        if pool is not None:  # Ctrl-C, SIGTERM or an error: stop the workers now, not after their tasks
            pool.terminate()
            pool.join()
        raise
    if pool is not None:
        pool.close()
        pool.join()
    taken = tuple(space.actions[i] for i in trajectory)
    final = space.state(state, tuple(a for action in taken for a in action.as_actions()))
    return SearchResult(final, taken, costs.evaluate(final), tuple(rounds), total_rollouts, len(memo.scored),
                        time.monotonic() - start, budget, MCTS.name, settings)


MCTS = Search("mcts", MctsSettings, search, "Monte Carlo Tree Search (UCT-RAVE lanes, restarts, polish; the "
              "default)")
