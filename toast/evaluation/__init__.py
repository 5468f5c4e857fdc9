"""The paper's evaluation as a product (section 5): toast's search against the manual strategies on one
program (``compare``), optionally checked by XLA on host devices, and many such comparisons in one batch
(``sweep``), locally or on a Ray cluster."""

from toast.evaluation.compare import CompareResult, StrategyRow, compare, comparison_json, comparison_table
from toast.evaluation.sweep import Job, Sweep, load_sweep, run_job, sweep

__all__ = ["CompareResult", "Job", "StrategyRow", "Sweep", "compare", "comparison_json", "comparison_table",
           "load_sweep", "run_job", "sweep"]
