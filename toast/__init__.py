"""toast: automatic SPMD sharding by named-dimension analysis on a Datalog rule base.

Data path: StableHLO (``toast.stablehlo``) -> facts (``toast.facts``) -> Datalog rules
(``rules/``, run by ``toast.datalog``) -> classes (``toast.classes``) -> ``Analysis``.

    >>> import toast
    >>> from toast.examples.mlp import mlp
    >>> fn, args = mlp()
    >>> analysis = toast.analyze("mlp", fn=fn, args=args, engine="embedded")
    >>> len(analysis.colors)
    4
"""

from toast.analysis import Analysis, Color, DimRef, Identity, UnruledOp, analyze
from toast.errors import EngineError, InputError, RuleError, ToastError
from toast.explain import Explanation, Step, explain, format_explanation
from toast.report import summary, to_json

__all__ = [
    "Analysis",
    "Color",
    "DimRef",
    "EngineError",
    "Explanation",
    "Identity",
    "InputError",
    "RuleError",
    "Step",
    "ToastError",
    "UnruledOp",
    "analyze",
    "explain",
    "format_explanation",
    "summary",
    "to_json",
]
