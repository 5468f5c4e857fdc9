"""Stage 7, search: the Monte Carlo Tree Search over actions (TOAST section 4), guided by the cost
model. Reserved: the search lands here, between cost and output, and may import any earlier
stage (a new search strategy is a module of this package)."""

__all__: list[str] = []
