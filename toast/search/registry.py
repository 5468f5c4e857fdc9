"""The searches toast knows by name: what ``--search NAME`` (``autoshard``, ``compare``, ``sweep``), a sweep
file's ``search`` key, ``find_strategy(..., search=)`` and ``toast.autoshard(..., search=)`` choose from.
A new search: a ``Search`` (``toast.search.base``) in a module of this package, listed here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from toast.errors import ToastError
from toast.search.base import Search
from toast.search.mcts import MCTS
from toast.search.simple import GREEDY, RANDOM

__all__ = ["DEFAULT_SEARCH", "SEARCHES", "resolve_search", "search_by_name"]

SEARCHES: Mapping[str, Search] = MappingProxyType({search.name: search for search in (MCTS, RANDOM, GREEDY)})
"""Every known search by name, the default (``DEFAULT_SEARCH``) first."""

DEFAULT_SEARCH = MCTS.name


def search_by_name(name: str) -> Search:
    """The search called ``name``.

    Raises:
      ToastError: no search has that name (one line listing the known ones).
    """
    found = SEARCHES.get(name)
    if found is None:
        raise ToastError(f"unknown search '{name}': the searches are {', '.join(SEARCHES)}")
    return found


def resolve_search(search: str | Search) -> Search:
    """``search`` itself, or the known search it names (``search_by_name``)."""
    return search if isinstance(search, Search) else search_by_name(search)
