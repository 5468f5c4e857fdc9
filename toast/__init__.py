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

Names load on first use (PEP 562), so ``import toast`` and ``toast --help`` do not import every stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toast.lazy import lazy_names

if TYPE_CHECKING:
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
    from toast.errors import EngineError, InputError, InvalidRules, RuleError, ToastError
    from toast.evaluation import CompareResult, compare, load_sweep, sweep
    from toast.frontend import Program, load_program, read_callable, read_file, read_text
    from toast.output.autoshard import Strategy, autoshard, load_strategy
    from toast.output.dimension_graph import dimension_graph_dot
    from toast.output.report import summary, to_json
    from toast.output.sharded_jit import sharded_jit
    from toast.output.sharded_stablehlo import sharded_module_text
    from toast.output.strategy_file import strategy_json, strategy_state
    from toast.search import (
        SEARCHES,
        ActionSpace,
        Budget,
        GreedySettings,
        MctsSettings,
        Phase,
        RandomSettings,
        Search,
        SpaceSettings,
    )
    from toast.sharding import (
        COMPOSITES,
        EXPERT_STRATEGIES,
        STRATEGIES,
        STRATEGY_NAMES,
        Action,
        ExpertStrategy,
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

# Public name -> the module that defines it.
_SOURCES: dict[str, str] = {
    "Analysis": "toast.analysis",
    "Box": "toast.analysis",
    "Color": "toast.analysis",
    "ColorConflict": "toast.analysis",
    "CompatibilitySet": "toast.analysis",
    "Conflict": "toast.analysis",
    "ConflictSite": "toast.analysis",
    "Conflicts": "toast.analysis",
    "DimRef": "toast.analysis",
    "Explanation": "toast.analysis",
    "Identity": "toast.analysis",
    "ResolutionGroup": "toast.analysis",
    "Step": "toast.analysis",
    "UnruledOp": "toast.analysis",
    "analyze": "toast.analysis",
    "describe_name": "toast.analysis",
    "explain": "toast.analysis",
    "format_explanation": "toast.analysis",
    "Collective": "toast.cost",
    "Cost": "toast.cost",
    "CostModel": "toast.cost",
    "Hardware": "toast.cost",
    "InterconnectLevel": "toast.cost",
    "known_hardware": "toast.cost",
    "load_hardware": "toast.cost",
    "EngineError": "toast.errors",
    "InputError": "toast.errors",
    "InvalidRules": "toast.errors",
    "RuleError": "toast.errors",
    "ToastError": "toast.errors",
    "CompareResult": "toast.evaluation",
    "compare": "toast.evaluation",
    "load_sweep": "toast.evaluation",
    "sweep": "toast.evaluation",
    "Program": "toast.frontend",
    "load_program": "toast.frontend",
    "read_callable": "toast.frontend",
    "read_file": "toast.frontend",
    "read_text": "toast.frontend",
    "Strategy": "toast.output.autoshard",
    "autoshard": "toast.output.autoshard",
    "dimension_graph_dot": "toast.output.dimension_graph",
    "load_strategy": "toast.output.autoshard",
    "sharded_jit": "toast.output.sharded_jit",
    "sharded_module_text": "toast.output.sharded_stablehlo",
    "strategy_json": "toast.output.strategy_file",
    "strategy_state": "toast.output.strategy_file",
    "summary": "toast.output.report",
    "to_json": "toast.output.report",
    "ActionSpace": "toast.search",
    "Phase": "toast.search",
    "Budget": "toast.search",
    "GreedySettings": "toast.search",
    "MctsSettings": "toast.search",
    "RandomSettings": "toast.search",
    "SEARCHES": "toast.search",
    "Search": "toast.search",
    "SpaceSettings": "toast.search",
    "Action": "toast.sharding",
    "COMPOSITES": "toast.sharding",
    "EXPERT_STRATEGIES": "toast.sharding",
    "ExpertStrategy": "toast.sharding",
    "InvalidState": "toast.sharding",
    "Mesh": "toast.sharding",
    "Roles": "toast.sharding",
    "STRATEGIES": "toast.sharding",
    "STRATEGY_NAMES": "toast.sharding",
    "ShardingModel": "toast.sharding",
    "ShardingState": "toast.sharding",
    "load_roles": "toast.sharding",
    "manual_strategy": "toast.sharding",
    "parse_mesh": "toast.sharding",
    "roles_for_input": "toast.sharding",
    "Agreement": "toast.xla",
    "validate": "toast.xla",
}

__all__ = [
    "COMPOSITES",
    "EXPERT_STRATEGIES",
    "SEARCHES",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "CompareResult",
    "Action",
    "ActionSpace",
    "Budget",
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
    "ExpertStrategy",
    "Explanation",
    "GreedySettings",
    "Hardware",
    "Identity",
    "InputError",
    "InterconnectLevel",
    "InvalidRules",
    "InvalidState",
    "Mesh",
    "MctsSettings",
    "Phase",
    "Program",
    "RandomSettings",
    "ResolutionGroup",
    "Roles",
    "RuleError",
    "Search",
    "SpaceSettings",
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


__getattr__, __dir__ = lazy_names("toast", _SOURCES, globals())
