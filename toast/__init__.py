"""toast: automatic SPMD sharding by named-dimension analysis on a Datalog rule base.

The data path, one subpackage per stage (``ARCHITECTURE.md``)::

    frontend -> facts -> datalog -> analysis -> sharding -> cost -> search -> output -> xla -> cli

This module is the public API of every stage:

    >>> import toast
    >>> from toast.examples.mlp import mlp
    >>> fn, args = mlp()
    >>> analysis = toast.analyze("mlp", fn=fn, args=args, engine="embedded")
    >>> len(analysis.colors)
    4
    >>> model = toast.ShardingModel(analysis, toast.parse_mesh("batch=4,model=2"))
    >>> roles = toast.Roles({"batch": [("x", 0)], "mlp": [("w1", 1)]})
    >>> state, actions = toast.manual_strategy(model, "megatron", roles)
    >>> cost = toast.CostModel(model, toast.load_hardware("a100_80gb")).evaluate(state)
    >>> [(c.kind, c.axes) for c in cost.collectives]
    [('all-reduce', ('model',))]
"""

from toast.analysis import (
    Analysis,
    Box,
    Color,
    ColorConflict,
    CompatibilitySet,
    Conflict,
    Conflicts,
    ConflictSite,
    DimRef,
    Explanation,
    Identity,
    ResolutionGroup,
    Step,
    UnruledOp,
    analyze,
    describe_name,
    explain,
    format_explanation,
)
from toast.cost import Collective, Cost, CostModel, Hardware, InterconnectLevel, known_hardware, load_hardware
from toast.errors import EngineError, InputError, RuleError, ToastError
from toast.evaluation import CompareResult, compare, load_sweep, sweep
from toast.frontend import Program, load_program, read_callable, read_file, read_text
from toast.output import (
    Strategy,
    autoshard,
    dimension_graph_dot,
    load_strategy,
    read_strategy,
    sharded_jit,
    sharded_module_text,
    strategy_json,
    strategy_state,
    summary,
    to_json,
)
from toast.search import ActionSpace, Phase, SearchSettings
from toast.sharding import (
    COMPOSITES,
    STRATEGIES,
    Action,
    InvalidState,
    Mesh,
    Roles,
    ShardingModel,
    ShardingState,
    load_roles,
    manual_strategy,
    parse_mesh,
    roles_for_input,
)
from toast.xla import Agreement, validate

__all__ = [
    "COMPOSITES",
    "STRATEGIES",
    "CompareResult",
    "Action",
    "ActionSpace",
    "Agreement",
    "Analysis",
    "Box",
    "Collective",
    "Color",
    "ColorConflict",
    "CompatibilitySet",
    "Conflict",
    "ConflictSite",
    "Conflicts",
    "Cost",
    "CostModel",
    "DimRef",
    "EngineError",
    "Explanation",
    "Hardware",
    "Identity",
    "InputError",
    "InterconnectLevel",
    "InvalidState",
    "Mesh",
    "Phase",
    "Program",
    "ResolutionGroup",
    "Roles",
    "RuleError",
    "SearchSettings",
    "ShardingModel",
    "ShardingState",
    "Step",
    "Strategy",
    "ToastError",
    "UnruledOp",
    "analyze",
    "autoshard",
    "compare",
    "describe_name",
    "dimension_graph_dot",
    "explain",
    "format_explanation",
    "known_hardware",
    "load_hardware",
    "load_program",
    "load_roles",
    "load_strategy",
    "load_sweep",
    "manual_strategy",
    "parse_mesh",
    "read_callable",
    "read_file",
    "read_strategy",
    "read_text",
    "roles_for_input",
    "sharded_jit",
    "sharded_module_text",
    "strategy_json",
    "strategy_state",
    "summary",
    "sweep",
    "to_json",
    "validate",
]
