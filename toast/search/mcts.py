"""Monte Carlo Tree Search over the action space (TOAST section 4.1), guided by the cost model.

One **rollout** walks the tree from the round's root: UCT selection among tried actions, expansion of one
untried action (or the stop action), then a random default policy (stop with probability
``stop_probability`` at each step, at most ``max_depth`` actions in all), and evaluates the final state's
cost ``C(s) = RT(s) + MP(s)`` (``CostModel.evaluate(...).relative``). Its reward ``-(C(s) + length_penalty *
depth)`` prefers shorter trajectories among equally good ones; it is backed up along the tree path.

States are nodes of a **transposition table** keyed by the sharding itself (its atoms' masks, ``ActionSpace.step``): any
action order that reaches the same sharding is the same node, and no state is costed twice (a cost cache).

A **round** runs ``rollouts_per_round`` rollouts split over ``lanes`` independent trees (root
parallelism), each lane seeded from ``(seed, round, lane)``; the best trajectory over all lanes (lowest
cost, then fewest actions, then lowest lane) is kept, less the actions whose removal costs nothing
(``_trim``), and the next round searches on from its state. The search stops early when ``patience``
rounds in a row fail to improve the best cost, or when the rollout or
time budget is spent. Lanes run in worker processes that share nothing but their results, so the same seed
gives the same strategy on any number of workers (with a rollout budget; a time budget cuts rounds where
the clock says).

**Polish.** Rounds commit whole trajectories, so a random action taken early can hold a mesh axis that a
better plan needs (a channel dim on the axis the images' batch wants, on a U-Net). After its rounds, each
phase improves its actions by local search (``_polish``): add actions greedily, or remove one action and
descend greedily from what is left (first among the actions it blocked), and take the first such move that
lowers the cost, until none does.

**Phases** (the composite strategies of PartIR): a search may run in phases, each restricted to some mesh
axes and optimizing ``runtime`` (``C(s)``) or ``memory`` (peak bytes relative to the unsharded peak, runtime
breaking ties); each phase starts from the previous one's best state, with an equal share of the rollouts
left.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from toast.cost.model import Cost, CostModel
from toast.errors import ToastError
from toast.search.actions import ActionSpace, SearchAction
from toast.sharding.state import ShardingState

STOP = -1


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
      rollouts: total rollout budget (``None``: no limit; then ``seconds`` or convergence stops it).
      seconds: wall-clock budget (``None``: no limit).
      rollouts_per_round: rollouts per round, over all lanes.
      lanes: independent trees per round (fixed, whatever the number of workers).
      workers: worker processes (``0``: one per core, at most ``lanes``; ``1``: in this process).
      max_depth: most actions in one trajectory (the paper's 30).
      exploration: UCT's exploration constant.
      stop_probability: chance that the default policy stops at each step.
      length_penalty: reward subtracted per action (prefers shorter trajectories).
      patience: rounds in a row without improvement before stopping.
      min_names: actions touching fewer distinct dimension names are pruned (the paper's 10).
      mirror_layers: mirror actions over repeated layers (section 4.4).
      stored_parameters: offer stored actions (``SearchAction.stored``: parameters split where they are kept
        and updated, gathered where used; FSDP).
      polish: after each phase's rounds, improve its actions by local search (``_polish``); its costings
        come on top of the rollout budget (a time budget bounds them).
      phases: the phases, in order (default: one over all axes, runtime).
    """

    seed: int = 0
    rollouts: int | None = 2000
    seconds: float | None = None
    rollouts_per_round: int = 256
    lanes: int = 8
    workers: int = 0
    max_depth: int = 30
    exploration: float = 0.3
    stop_probability: float = 0.2
    length_penalty: float = 1e-3
    patience: int = 1
    min_names: int = 10
    mirror_layers: bool = True
    stored_parameters: bool = True
    polish: bool = True
    phases: tuple[Phase, ...] = (Phase(),)

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON (for the strategy file's ``search`` section)."""
        return {
            "seed": self.seed, "rollouts": self.rollouts, "seconds": self.seconds,
            "rollouts_per_round": self.rollouts_per_round, "lanes": self.lanes, "max_depth": self.max_depth,
            "exploration": self.exploration, "stop_probability": self.stop_probability,
            "length_penalty": self.length_penalty, "patience": self.patience, "min_names": self.min_names,
            "mirror_layers": self.mirror_layers, "stored_parameters": self.stored_parameters, "polish": self.polish,
            "phases": [{"axes": list(p.axes), "goal": p.goal} for p in self.phases],
        }


@dataclass(frozen=True, slots=True)
class RoundResult:
    """One round: its phase, the best cost after it, and the rollouts it ran (0: the phase's polish step,
    ``SearchSettings.polish``)."""

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
      rounds: the best cost after each round.
      rollouts: rollouts run.
      evaluations: states costed (each process costs a state once; lanes in different processes may both
        cost one).
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


@dataclass(frozen=True, slots=True)
class _LaneTask:
    root: bytes  # the round's root masks
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
    evaluations: int  # states this lane costed that its process had not costed before


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
        self.initial_peak = max(int(costs.initial[4]), 1)  # the unsharded program's peak, bytes

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

    def cost_of(self, key: bytes) -> Cost:
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = self.costs.evaluate(self.space.state(self.states[key]), collectives=False)
        return found

    def cost(self, atom_masks: np.ndarray) -> Cost:
        return self.cost_of(self.key(atom_masks))

    def score(self, key: bytes, goal: str) -> float:
        cost = self.cost_of(key)
        if goal == "memory":
            return cost.peak_bytes / self.initial_peak + 1e-3 * cost.relative
        return cost.relative


class _Edge:
    __slots__ = ("action", "child", "visits", "total")

    def __init__(self, action: int, child: bytes | None):
        self.action = action
        self.child = child  # the child state's key; None for the stop action
        self.visits = 0
        self.total = 0.0  # summed rewards


class _Node:
    __slots__ = ("untried", "edges", "visits")

    def __init__(self, untried: list[int]):
        self.untried = untried
        self.edges: list[_Edge] = []
        self.visits = 0


def _run_lane(space: ActionSpace, memo: _Memo, settings: SearchSettings, task: _LaneTask) -> _LaneResult:
    """One lane: ``task.rollouts`` rollouts on a fresh tree from ``task.root``; a pure function of its inputs
    (``memo`` only memoizes)."""
    rng = np.random.default_rng(list(task.seed))
    root_key = memo.key(np.frombuffer(task.root, dtype=np.uint8).copy())
    allowed = list(task.allowed)
    nodes: dict[bytes, _Node] = {}

    def node_for(key: bytes) -> _Node:
        node = nodes.get(key)
        if node is None:
            order = [allowed[i] for i in rng.permutation(len(allowed))]
            order.insert(int(rng.integers(0, len(order) + 1)), STOP)
            node = nodes[key] = _Node(order)
        return node

    root = node_for(root_key)
    best_score = memo.score(root_key, task.goal)
    best_actions: tuple[int, ...] = ()
    evaluated_before = len(memo.cache)
    done = 0
    for _ in range(task.rollouts):
        if task.deadline is not None and time.monotonic() > task.deadline:
            break
        done += 1
        node, key = root, root_key
        path: list[tuple[_Node, _Edge]] = []
        taken: list[int] = []
        stopped = False
        # Selection and expansion.
        while len(taken) < settings.max_depth:
            if node.untried:
                action = node.untried.pop()
                if action == STOP:
                    edge = _Edge(STOP, None)
                    node.edges.append(edge)
                    path.append((node, edge))
                    stopped = True
                    break
                child_key = memo.step(key, action)
                if child_key is None:
                    continue  # invalid here: dropped from this node
                edge = _Edge(action, child_key)
                node.edges.append(edge)
                path.append((node, edge))
                taken.append(action)
                node, key = node_for(child_key), child_key
                break
            if not node.edges:
                stopped = True
                break
            log_visits = math.log(max(node.visits, 1))
            edge = max(node.edges, key=lambda e: e.total / e.visits
                       + settings.exploration * math.sqrt(log_visits / e.visits))
            path.append((node, edge))
            if edge.child is None:
                stopped = True
                break
            taken.append(edge.action)
            node, key = nodes[edge.child], edge.child
        # Default policy.
        while not stopped and len(taken) < settings.max_depth and rng.random() >= settings.stop_probability:
            for _attempt in range(8):
                action = allowed[int(rng.integers(0, len(allowed)))] if allowed else STOP
                following = memo.step(key, action) if action != STOP else None
                if following is not None:
                    key = following
                    taken.append(action)
                    break
            else:
                break
        score = memo.score(key, task.goal)
        reward = -(score + settings.length_penalty * len(taken))
        for visited, edge in path:
            visited.visits += 1
            edge.visits += 1
            edge.total += reward
        if (score, len(taken)) < (best_score, len(best_actions)):
            best_score, best_actions = score, tuple(taken)
    return _LaneResult(best_score, best_actions, done, len(memo.cache) - evaluated_before)


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
    could block an axis a later round needs (a batch dim cannot take an axis a channel dim holds)."""
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


def _refill(space: ActionSpace, memo: _Memo, task: _RefillTask) -> tuple[float, tuple[int, ...], int]:
    """Greedy descent from the end of ``task.actions``: add the allowed action that lowers the score most
    (lowest index among equals) until none does; the score, the actions and the states this process costed
    anew. A pure function of its inputs (``memo`` only memoizes)."""
    evaluated_before = len(memo.cache)
    atoms = _replay(space, list(task.actions))
    if atoms is None:
        return math.inf, task.actions, 0
    key = memo.key(atoms)
    score, actions = memo.score(key, task.goal), list(task.actions)
    candidates = task.allowed if task.first is None else task.first
    while True:
        options = [(memo.score(following, task.goal), action) for action in candidates
                   if (following := memo.step(key, action)) is not None]
        candidates = task.allowed
        if not options:
            break
        best_score, best_action = min(options)
        if best_score >= score:
            break
        following = memo.step(key, best_action)
        assert following is not None
        score, key = best_score, following
        actions.append(best_action)
    return score, tuple(actions), len(memo.cache) - evaluated_before


def _worker_refill(task: _RefillTask) -> tuple[float, tuple[int, ...], int]:
    assert _WORKER is not None
    space, memo, _ = _WORKER
    return _refill(space, memo, task)


def _polish(space: ActionSpace, memo: _Memo, actions: list[int], *, keep: int, allowed: tuple[int, ...],
            goal: str, score: float, chunk: int, pool: Any, deadline: float | None) -> tuple[list[int], float, int]:
    """Local search on a phase's actions (past the first ``keep``): descend greedily (``_refill``), or remove
    one action and then descend; take the first move, latest position first, that lowers the score, and
    start over. Rounds commit whole trajectories, so an early random action can hold an axis that a better
    plan needs (a channel dim on the axis the batch wants); this undoes one at a time. Moves are tried
    ``chunk`` at a time in the workers (a fixed chunk, so the result does not depend on the number of
    workers). Returns the actions, their score and the states costed."""
    evaluations = 0

    def moves() -> list[_RefillTask]:
        # First a plain descent; then each removal, whose first step is among the actions the full
        # trajectory blocks (the others were there to take before, and were not taken).
        full = _replay(space, actions)
        assert full is not None
        blocked = tuple(a for a in allowed if space.step(full, a) is None)
        return [_RefillTask(tuple(actions), allowed, goal, None)] + [
            _RefillTask(tuple(actions[:p] + actions[p + 1:]), allowed, goal, blocked)
            for p in range(len(actions) - 1, keep - 1, -1)]

    pending = moves()
    while pending and (deadline is None or time.monotonic() <= deadline):
        tasks, pending = pending[:chunk], pending[chunk:]
        results = pool.map(_worker_refill, tasks, chunksize=1) if pool is not None else [
            _refill(space, memo, task) for task in tasks]
        evaluations += sum(result[2] for result in results)
        better = [result for result in results if result[0] < score - 1e-9]
        if better:
            score, actions = better[0][0], list(better[0][1])
            pending = moves()
    return actions, score, evaluations


# Worker processes are forked with the space, memo and settings in this global (nothing is pickled, and a
# user's script is not re-imported as spawned processes would); they send back only lane results.
_WORKER: tuple[ActionSpace, _Memo, SearchSettings] | None = None


def _worker_lane(task: _LaneTask) -> _LaneResult:
    assert _WORKER is not None
    space, memo, settings = _WORKER
    return _run_lane(space, memo, settings, task)


def _fork_pool(workers: int, context: tuple[ActionSpace, _Memo, SearchSettings]) -> Any:
    """A pool of forked workers holding ``context``, or ``None`` where the platform cannot fork."""
    import multiprocessing
    import warnings

    global _WORKER
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    _WORKER = context
    with warnings.catch_warnings():
        # JAX warns on any fork once it has started; the workers only run numpy on the cost model.
        warnings.simplefilter("ignore", RuntimeWarning)
        return multiprocessing.get_context("fork").Pool(workers)


DEFAULT_SETTINGS = SearchSettings()


def search(space: ActionSpace, costs: CostModel, *, settings: SearchSettings = DEFAULT_SETTINGS,
           progress: Callable[[RoundResult, int, float], None] | None = None) -> SearchResult:
    """Search for the sharding with the lowest cost.

    Args:
      space: the action space (with its pinned initial state).
      costs: the cost model (its ``device_memory`` and ``memory_penalty`` shape the reward).
      settings: budget, seed and the search's constants.
      progress: called after each round with ``(round, rollouts so far, seconds so far)``.

    Raises:
      ToastError: a budget of zero, or a phase naming an axis the mesh lacks.
    """
    if settings.rollouts is not None and settings.rollouts <= 0:
        raise ToastError(f"a rollout budget of {settings.rollouts}: give at least 1")
    if settings.seconds is not None and settings.seconds <= 0:
        raise ToastError(f"a time budget of {settings.seconds:g} s: give more than 0 seconds")
    if settings.lanes < 1 or settings.rollouts_per_round < 1:
        raise ToastError("lanes and rollouts_per_round must be at least 1")
    mesh_axes = [axis for axis, _ in space.model.mesh.axes]
    for phase in settings.phases:
        unknown = sorted(set(phase.axes) - set(mesh_axes))
        if unknown:
            raise ToastError(f"search phase names mesh axis '{unknown[0]}'; the mesh has {', '.join(mesh_axes)}")
        if phase.goal not in ("runtime", "memory"):
            raise ToastError(f"search phase goal '{phase.goal}': expected 'runtime' or 'memory'")
    start = time.monotonic()
    deadline = start + settings.seconds if settings.seconds is not None else None
    memo = _Memo(costs, space)
    workers = settings.workers or min(os.cpu_count() or 1, settings.lanes)
    workers = max(1, min(workers, settings.lanes))
    costs.prepare(space.partition)  # once, before the fork (a no-op when the caller did it)
    memo.cost(space.initial_atoms)
    pool = _fork_pool(workers, (space, memo, settings)) if workers > 1 else None
    try:
        state = space.initial_atoms
        trajectory: list[int] = []
        rounds: list[RoundResult] = []
        total_rollouts = 0
        evaluations = 1
        round_index = 0
        for phase_index, phase in enumerate(settings.phases):
            axes = set(phase.axes or mesh_axes)
            allowed = tuple(i for i, a in enumerate(space.actions) if a.axis in axes)
            best = memo.score(memo.key(state), phase.goal)
            phase_start = len(trajectory)  # trimming keeps the earlier phases' actions
            stale = 0
            # The rollout budget left is shared by the phases left (an early-stopping phase leaves its rest).
            phase_end = None if settings.rollouts is None else total_rollouts + (
                settings.rollouts - total_rollouts) // (len(settings.phases) - phase_index)
            while stale < settings.patience:
                remaining = None if phase_end is None else phase_end - total_rollouts
                if (remaining is not None and remaining <= 0) or (deadline is not None and time.monotonic() > deadline):
                    break
                per_round = settings.rollouts_per_round if remaining is None else min(remaining,
                                                                                      settings.rollouts_per_round)
                shares = [per_round // settings.lanes + (1 if lane < per_round % settings.lanes else 0)
                          for lane in range(settings.lanes)]
                tasks = [_LaneTask(state.tobytes(), allowed, phase.goal, (settings.seed, round_index, lane),
                                   share, deadline) for lane, share in enumerate(shares) if share]
                if pool is not None:
                    results = pool.map(_worker_lane, tasks, chunksize=1)
                else:
                    results = [_run_lane(space, memo, settings, task) for task in tasks]
                round_index += 1
                done = sum(r.rollouts for r in results)
                total_rollouts += done
                evaluations += sum(r.evaluations for r in results)
                winner = min(results, key=lambda r: (r.score, len(r.actions)))
                if winner.score < best - 1e-9:
                    evaluated_before = len(memo.cache)
                    trajectory, best = _trim(space, memo, trajectory + list(winner.actions), keep=phase_start,
                                             goal=phase.goal)
                    evaluations += len(memo.cache) - evaluated_before
                    replayed = _replay(space, trajectory)
                    assert replayed is not None, "a trimmed trajectory replays"
                    state = replayed
                    stale = 0
                else:
                    stale += 1
                cost = memo.cost(state)
                result = RoundResult(phase_index, cost.relative, cost.step_time_s, done)
                rounds.append(result)
                if progress is not None:
                    progress(result, total_rollouts, time.monotonic() - start)
                if done == 0:
                    break
            if settings.polish:
                polished, polished_score, costed = _polish(space, memo, trajectory, keep=phase_start,
                                                           allowed=allowed, goal=phase.goal, score=best,
                                                           chunk=settings.lanes, pool=pool,
                                                           deadline=deadline)
                evaluations += costed
                if polished_score < best:
                    trajectory, best = polished, polished_score
                    replayed = _replay(space, trajectory)
                    assert replayed is not None, "a polished trajectory replays"
                    state = replayed
                    cost = memo.cost(state)
                    result = RoundResult(phase_index, cost.relative, cost.step_time_s, 0)
                    rounds.append(result)
                    if progress is not None:
                        progress(result, total_rollouts, time.monotonic() - start)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    actions = tuple(space.actions[i] for i in trajectory)
    final = space.state(state, tuple(a for action in actions for a in action.as_actions()))
    return SearchResult(final, actions, costs.evaluate(final), tuple(rounds), total_rollouts, evaluations,
                        time.monotonic() - start, settings)
