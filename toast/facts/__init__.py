"""Stage 2, facts: the relations Python and the rules exchange (``schema``), the one numbering
of dimension names and uses (``numbering``), and the facts of a program (``writer``)."""

from toast.facts.numbering import DimensionNames, UseSite, number_names
from toast.facts.schema import CONFLICTS, NDA, STAGES, Relation, Stage
from toast.facts.writer import program_facts

__all__ = ["CONFLICTS", "NDA", "STAGES", "DimensionNames", "Relation", "Stage", "UseSite", "number_names",
           "program_facts"]
