"""The whole state space of a small program, and the scores every search ranks states by.

``enumerate_states`` walks every state the action space reaches from its initial state (breadth first, each
state once: states are keyed by their atoms' masks, ``ActionSpace.step``) and costs each;
``StateSpace.optimum`` is the best one under a memory limit (what ``benchmarks/bench_optimality.py`` measures
the searches against; random search and greedy descent are searches of their own, ``toast.search.simple``).

Scores are ``CostModel.evaluate``'s relative step time with memory as a constraint (``search_score``): a state
over the limit never beats one that fits; a phase whose goal is memory ranks by peak (``goal_score``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toast.cost.model import Cost, CostModel
from toast.errors import ToastError
from toast.search.actions import ActionSpace

# A state over the memory limit scores this much above the relative step time of any state that fits (the
# unsharded program's is 1; a sharding 1000x slower than that is not a candidate anyway).
OVER_MEMORY = 1000.0


def search_score(cost: Cost, costs: CostModel) -> float:
    """A state's score for the search (lower is better): its step time relative to the unsharded program's
    where its peak fits ``costs.device_memory``, else ``OVER_MEMORY`` plus its excess over the limit relative
    to the unsharded peak (among states that do not fit, the smaller peak wins; then the faster)."""
    return score_of(cost.step_time_s, cost.peak_bytes, costs)


def score_of(step_time_s: float, peak_bytes: float, costs: CostModel) -> float:
    """``search_score`` of a cost with this step time (seconds) and peak per device (bytes)."""
    initial_time, initial_peak = float(costs.initial.step_time_s), float(costs.initial.peak_bytes)
    relative_time = step_time_s / initial_time if initial_time > 0 else 1.0
    if peak_bytes <= costs.device_memory:
        return relative_time
    return OVER_MEMORY + (peak_bytes - costs.device_memory) / max(initial_peak, 1.0) + 1e-3 * relative_time


def goal_score(step_time_s: float, peak_bytes: float, costs: CostModel, goal: str) -> float:
    """A state's score under a phase's goal (lower is better): ``score_of`` for ``"runtime"``; for
    ``"memory"``, its peak relative to the unsharded program's, ``score_of`` breaking ties."""
    runtime = score_of(step_time_s, peak_bytes, costs)
    if goal == "memory":
        return peak_bytes / max(int(costs.initial.peak_bytes), 1) + 1e-3 * min(runtime, OVER_MEMORY)
    return runtime


@dataclass(frozen=True)
class StateSpace:
    """Every state an action space reaches, costed.

    Attributes:
      atoms: ``uint8[states, atoms]``, the states' atom masks (row 0: the initial state), breadth-first order.
      depth: ``int64[states]``, fewest actions reaching each state.
      step_time_s: ``float64[states]``, estimated step time, seconds.
      peak_bytes: ``int64[states]``, estimated peak memory per device, bytes.
      seconds: wall-clock time of the enumeration and costing.
    """

    atoms: np.ndarray
    depth: np.ndarray
    step_time_s: np.ndarray
    peak_bytes: np.ndarray
    seconds: float

    def __len__(self) -> int:
        return len(self.depth)

    def optimum(self, device_memory: float) -> int | None:
        """The index of the fastest state whose peak fits ``device_memory`` bytes (fewest actions, then
        breadth-first order, among equals); ``None`` when none fits."""
        fits = np.flatnonzero(self.peak_bytes <= device_memory)
        if not len(fits):
            return None
        order = np.lexsort((fits, self.depth[fits], self.step_time_s[fits]))
        return int(fits[order[0]])


def enumerate_states(space: ActionSpace, costs: CostModel, *, limit: int = 1_000_000,
                     progress: Callable[[int], None] | None = None) -> StateSpace:
    """Every state ``space`` reaches, each costed once (``costs.evaluate(..., collectives=False)``).

    Raises:
      ToastError: more than ``limit`` states (the space is too big to enumerate).
    """
    start = time.monotonic()
    costs.prepare(space.partition)
    initial = space.initial_atoms
    seen: dict[bytes, int] = {initial.tobytes(): 0}
    atoms: list[np.ndarray] = [initial]
    depth: list[int] = [0]
    frontier = 0
    while frontier < len(atoms):
        here = atoms[frontier]
        for action in range(len(space)):
            following = space.step(here, action)
            if following is None:
                continue
            key = following.tobytes()
            if key in seen:
                continue
            if len(atoms) >= limit:
                raise ToastError(f"more than {limit} states: too many to enumerate")
            seen[key] = len(atoms)
            atoms.append(following)
            depth.append(depth[frontier] + 1)
        frontier += 1
    step = np.empty(len(atoms))
    peak = np.empty(len(atoms), dtype=np.int64)
    for index, masks in enumerate(atoms):
        cost = costs.evaluate(space.state(masks), collectives=False)
        step[index], peak[index] = cost.step_time_s, cost.peak_bytes
        if progress is not None and index % 1000 == 999:
            progress(index + 1)
    return StateSpace(np.stack(atoms), np.asarray(depth, dtype=np.int64), step, peak, time.monotonic() - start)
