"""Building the cost plan (``toast.cost.plan.cost_plan``) once per program: linear passes, numpy over arrays built
once, a lookup per kind rather than per op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from toast import analyze
from toast.analysis.kernel_semantics import KernelSemantics
from toast.cost.collectives import _unique_rows
from toast.cost.kernels import KernelPlan


def test_equal_rows_are_one_class_named_by_their_first_row_in_lexicographic_order():
    key = np.asarray([[2, -1], [0, 5], [2, -1], [0, 3], [-4, 9]], dtype=np.int64)
    first, inverse = _unique_rows(key)
    # Distinct rows in order: [-4, 9] (row 4), [0, 3] (row 3), [0, 5] (row 1), [2, -1] (rows 0 and 2: the first).
    assert first.tolist() == [4, 3, 1, 0]
    assert inverse.tolist() == [3, 2, 3, 1, 0]
    assert first.dtype == inverse.dtype == np.int64
    empty_first, empty_inverse = _unique_rows(np.zeros((0, 3), dtype=np.int64))
    assert empty_first.tolist() == empty_inverse.tolist() == []


def test_the_kernel_plan_asks_the_rules_for_each_op_kinds_class_once(monkeypatch):
    """``tanh(tanh(x @ w) @ w.T)``: two matmuls and two tanh, each kind's class asked for once."""
    analysis = analyze("twice", fn=lambda x, w: jnp.tanh(jnp.tanh(x @ w) @ w.T),
                       args=[jax.ShapeDtypeStruct((256, 512), jnp.float32),
                             jax.ShapeDtypeStruct((512, 256), jnp.float32)], engine="embedded")
    kinds = [op.kind for op in analysis.program.ops]
    assert kinds.count("stablehlo.dot_general") == 2 and kinds.count("stablehlo.tanh") == 2
    asked: list[str] = []
    original = KernelSemantics.class_of
    monkeypatch.setattr(KernelSemantics, "class_of", lambda self, op: asked.append(op.kind) or original(self, op))
    plan = KernelPlan(analysis.program, semantics=analysis.kernel_semantics)
    assert sorted(asked) == sorted(set(kinds))
    assert [k.kind for k in plan.kernels].count("matmul") == 2
