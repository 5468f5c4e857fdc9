"""Stage 8, output: what toast writes for people, scripts and JAX: the analysis JSON and summary
(``report``), strategy files (``strategy_file``), sharded StableHLO (``sharded_stablehlo``),
``sharded_jit`` (``sharded_jit``), dimension graphs (``dimension_graph``), and whole-or-nothing
file writes (``files``), and ``autoshard``: search end to end, the ``Strategy`` it returns.

Names load on first use (PEP 562): a command that only writes a report does not import the search."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOME = {
    "Strategy": "autoshard", "autoshard": "autoshard", "load_strategy": "autoshard",
    "dimension_graph_dot": "dimension_graph", "summary": "report", "to_json": "report",
    "sharded_jit": "sharded_jit", "sharded_module_text": "sharded_stablehlo", "strategy_json": "strategy_file",
    "strategy_mesh": "strategy_file", "strategy_state": "strategy_file",
}

__all__ = ["Strategy", "autoshard", "dimension_graph_dot", "load_strategy", "sharded_jit", "sharded_module_text",
           "strategy_json", "strategy_mesh", "strategy_state", "summary", "to_json"]

if TYPE_CHECKING:
    from toast.output.autoshard import Strategy, autoshard, load_strategy
    from toast.output.dimension_graph import dimension_graph_dot
    from toast.output.report import summary, to_json
    from toast.output.sharded_jit import sharded_jit
    from toast.output.sharded_stablehlo import sharded_module_text
    from toast.output.strategy_file import strategy_json, strategy_mesh, strategy_state


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'toast.output' has no attribute '{name}'")
    return getattr(importlib.import_module(f"toast.output.{_HOME[name]}"), name)
