"""A package's public names, each imported from its module on first use (PEP 562).

``toast`` and ``toast.datalog`` list their names this way, so that importing the package imports no stage
(``toast --help``, a cached analysis read back) until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, sources: Mapping[str, str], namespace: MutableMapping[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose ``namespace`` (its ``globals()``) lists
    ``__all__``: ``sources`` maps each public name to the module that defines it; a name, once imported, is
    kept in ``namespace``."""

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(namespace["__all__"])

    return __getattr__, __dir__
