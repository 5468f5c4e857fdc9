"""Stage 7, search: finding a strategy (TOAST section 4). ``base``: the contract every search keeps (``SearchFn``:
an action space and a cost model in, a ``SearchResult`` out; ``SearchSettings``); ``actions``: the action space
(colors and mirror classes of repeated layers, resolution orders, mesh axes; pins); ``mcts``: the default
search (UCT-RAVE lanes, restarts, a transposition table, worker processes, polish); ``exhaustive``: every state
of a small program; ``find``: a search with the manual strategies as candidates, under one memory limit
(``find_strategy``). A new search is a module of this package with a ``SearchFn``, passed as
``find_strategy(..., search=)``."""

from toast.search.actions import ActionSpace, SearchAction, argument_groups, mirror_classes, parse_pins
from toast.search.base import Phase, Progress, RoundResult, SearchFn, SearchResult, SearchSettings
from toast.search.find import Comparison, Found, find_strategy, price_manual_strategies
from toast.search.mcts import search

__all__ = ["ActionSpace", "Comparison", "Found", "Phase", "Progress", "RoundResult", "SearchAction", "SearchFn",
           "SearchResult", "SearchSettings", "argument_groups", "find_strategy", "mirror_classes", "parse_pins",
           "price_manual_strategies", "search"]
