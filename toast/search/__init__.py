"""Stage 7, search: the Monte Carlo Tree Search over actions (TOAST section 4), guided by the cost
model. ``actions``: the action space (colors and mirror classes of repeated layers, resolution orders,
mesh axes; pins); ``mcts``: the search (UCT, rollouts, rounds, a transposition table, worker processes).
A new search strategy is a module of this package with a ``search(space, costs, *, settings)`` function."""

from toast.search.actions import ActionSpace, SearchAction, argument_groups, mirror_classes, parse_pins
from toast.search.mcts import Phase, RoundResult, SearchResult, SearchSettings, search

__all__ = ["ActionSpace", "Phase", "RoundResult", "SearchAction", "SearchResult", "SearchSettings",
           "argument_groups", "mirror_classes", "parse_pins", "search"]
