"""Stage 4, analysis: colors (``named_dimensions``, ``classes``), conflicts with the box and layer
heuristics (``conflicts``, ``dimension_graph``, ``layers``), why two dims share a color
(``explain``), and dimension names in words (``naming``)."""

from toast.analysis.conflict_types import (
    Box,
    ColorConflict,
    CompatibilitySet,
    Conflict,
    Conflicts,
    ConflictSite,
    ResolutionGroup,
)
from toast.analysis.explain import Explanation, Step, explain, format_explanation
from toast.analysis.named_dimensions import Analysis, Color, DimRef, Identity, UnruledOp, analyze
from toast.analysis.naming import describe_name

__all__ = ["Analysis", "Box", "Color", "ColorConflict", "CompatibilitySet", "Conflict", "ConflictSite", "Conflicts",
           "DimRef", "Explanation", "Identity", "ResolutionGroup", "Step", "UnruledOp", "analyze", "describe_name",
           "explain", "format_explanation"]
