"""Stage 8, output: what toast writes for people, scripts and JAX: the analysis JSON and summary
(``report``), strategy files (``strategy_file``), sharded StableHLO (``sharded_stablehlo``),
``sharded_jit`` (``sharded_jit``), dimension graphs (``dimension_graph``), and whole-or-nothing
file writes (``files``), and ``autoshard``: search end to end, the ``Strategy`` it returns."""

from toast.output.autoshard import Strategy, autoshard, load_strategy
from toast.output.dimension_graph import dimension_graph_dot
from toast.output.report import summary, to_json
from toast.output.sharded_jit import sharded_jit
from toast.output.sharded_stablehlo import sharded_module_text
from toast.output.strategy_file import strategy_json, strategy_mesh, strategy_state

__all__ = ["Strategy", "autoshard", "dimension_graph_dot", "load_strategy", "sharded_jit",
           "sharded_module_text", "strategy_json",
           "strategy_mesh", "strategy_state", "summary", "to_json"]
