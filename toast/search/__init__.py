"""Stage 7, search: finding a strategy (TOAST section 4). ``base``: the contract every search keeps (a
``Search``: a name, its settings' type and a ``SearchFn``: an action space, a cost model, a ``Budget`` and its
settings in, a ``SearchResult`` out; ``SpaceSettings``: the action space's options); ``actions``: the action
space (colors and mirror classes of repeated layers, resolution orders, mesh axes; pins); ``mcts``: the default
search (UCT-RAVE lanes, restarts, a transposition table, worker processes, polish; ``MctsSettings``);
``simple``: random search and greedy descent (``RandomSettings``, ``GreedySettings``); ``registry``: the
searches by name (``SEARCHES``); ``exhaustive``: every state of a small program; ``find``: a search with the
manual strategies as candidates, under one memory limit (``find_strategy``). A new search is a module of this
package with a ``Search``, listed in ``registry.SEARCHES``."""

from toast.search.actions import ActionSpace, SearchAction, argument_groups, mirror_classes, parse_pins
from toast.search.base import (
    Budget,
    Phase,
    Progress,
    RoundResult,
    Search,
    SearchFn,
    SearchResult,
    SpaceSettings,
)
from toast.search.find import Comparison, Found, find_strategy, price_manual_strategies
from toast.search.mcts import MCTS, MctsSettings, search
from toast.search.registry import SEARCHES, search_by_name
from toast.search.simple import GREEDY, RANDOM, GreedySettings, RandomSettings, greedy_search, random_search

__all__ = ["GREEDY", "MCTS", "RANDOM", "SEARCHES", "ActionSpace", "Budget", "Comparison", "Found",
           "GreedySettings", "MctsSettings", "Phase", "Progress", "RandomSettings", "RoundResult", "Search",
           "SearchAction", "SearchFn", "SearchResult", "SpaceSettings", "argument_groups", "find_strategy",
           "greedy_search", "mirror_classes", "parse_pins", "price_manual_strategies", "random_search", "search",
           "search_by_name"]
