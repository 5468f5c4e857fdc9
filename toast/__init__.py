"""toast: automatic SPMD sharding by named-dimension analysis on a Datalog rule base.

Data path: StableHLO (``toast.stablehlo``) -> facts (``toast.facts``) -> Datalog rules
(``rules/``, run by ``toast.engine`` on Soufflé or ``toast.datalog``) -> classes
(``toast.classes``) -> conflicts stage (``rules/conflicts/``, ``toast.conflicts``,
``toast.layers``) -> ``Analysis``.

    >>> import toast
    >>> from toast.examples.mlp import mlp
    >>> fn, args = mlp()
    >>> analysis = toast.analyze("mlp", fn=fn, args=args, engine="embedded")
    >>> len(analysis.colors)
    4
"""

from toast.analysis import Analysis, Color, DimRef, Identity, UnruledOp, analyze
from toast.conflicts import (
    Box,
    ColorConflict,
    CompatibilitySet,
    Conflict,
    Conflicts,
    ConflictSite,
    ResolutionGroup,
)
from toast.errors import EngineError, InputError, RuleError, ToastError
from toast.explain import Explanation, Step, explain, format_explanation
from toast.graph import dimension_graph_dot
from toast.jax_sharding import sharded_jit
from toast.report import summary, to_json

__all__ = [
    "Analysis",
    "Box",
    "Color",
    "ColorConflict",
    "CompatibilitySet",
    "Conflict",
    "ConflictSite",
    "Conflicts",
    "DimRef",
    "EngineError",
    "Explanation",
    "Identity",
    "InputError",
    "ResolutionGroup",
    "RuleError",
    "Step",
    "ToastError",
    "UnruledOp",
    "analyze",
    "dimension_graph_dot",
    "explain",
    "format_explanation",
    "sharded_jit",
    "summary",
    "to_json",
]
