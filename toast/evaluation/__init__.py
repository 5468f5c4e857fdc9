"""The paper's evaluation as a product (section 5): toast's search against the manual strategies on one
program (``compare``), optionally checked by XLA on host devices."""

from toast.evaluation.compare import CompareResult, StrategyRow, compare, comparison_json, comparison_table

__all__ = ["CompareResult", "StrategyRow", "compare", "comparison_json", "comparison_table"]
