"""Sharding conflicts, compatibility sets and resolution groups (paper sections 3.3-3.6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import analysis_of, engines

from toast import analyze
from toast.examples.gpt import gpt_small

ATTENTION = "toast.examples.attention:attention"
F = "toast.examples.transpose_matmul:transpose_matmul"


def _op_defining(analysis, value_name: str) -> int:
    for op in analysis.program.ops:
        if any(analysis.program.values[v].name == value_name for v in op.results):
            return op.id
    raise AssertionError(f"no op defines {value_name}")


def _sharded(analysis, name: int, unsharded: frozenset[int]) -> bool:
    return int(analysis.node_of[name]) not in unsharded


@pytest.mark.parametrize("engine", engines())
def test_attention_has_five_conflicts_in_one_set(engine):
    analysis = analysis_of(ATTENTION, engine)
    found = analysis.conflicts
    assert len(found.conflicts) == 5
    sequence = analysis.color_of_dim("x", 0).id
    assert {c.color for c in found.conflicts} == {sequence}
    assert len(found.sets) == 1 and found.sets[0].conflicts == (0, 1, 2, 3, 4)
    assert found.resolution_bits == 1
    # The three conflicts of Figure 5a's tensors a, c and d (definitions) are among them.
    defined = {analysis.program.values[s.value].name for c in found.conflicts for s in c.sites if s.kind == "def"}
    a, c, d = "%4", "%6", "%7"
    assert {a, c, d} <= defined


def test_attention_resolutions_are_figure_5b_and_the_other_one():
    """Resolution 1 is the sequence sharding of Figure 5b: k is all-gathered before the
    score matmul, and the output is reduce-scattered. Resolution 0 needs two all-gathers."""
    analysis = analysis_of(ATTENTION)
    found = analysis.conflicts
    sequence = analysis.color_of_dim("x", 0).id
    score, final = _op_defining(analysis, "%4"), _op_defining(analysis, "result")
    ret = next(op.id for op in analysis.program.ops if op.kind == "func.return")

    def shards(value, dim, unsharded):
        return _sharded(analysis, analysis.dim_name(value, dim), unsharded)

    def use_shards(op, operand, dim, unsharded):
        return _sharded(analysis, analysis.use_dim_name(op, operand, dim), unsharded)

    figure_5b = found.unsharded_nodes(sequence, [1])
    # a : [S, S{s}], c : [S, S{s}], d : [S, S{s}], b : [S{s}].
    assert [shards("%4", 1, figure_5b), shards("%4", 0, figure_5b)] == [True, False]
    assert [shards("%6", 1, figure_5b), shards("%6", 0, figure_5b)] == [True, False]
    assert [shards("%7", 1, figure_5b), shards("%7", 0, figure_5b)] == [True, False]
    assert shards("%5", 0, figure_5b)
    # k = %0 is defined sharded on S but used unsharded by the score matmul: all_gather {s} k.
    assert shards("%0", 0, figure_5b) and not use_shards(score, 0, 0, figure_5b)
    # qt = %3 is used as defined (sharded on its S dim): no communication.
    assert shards("%3", 1, figure_5b) and use_shards(score, 1, 1, figure_5b)
    # z = d @ v contracts the sharded S (partial sums), z's rows are not sharded where it is
    # defined but are where it is returned: reduce_scatter {s} z.
    assert use_shards(final, 0, 1, figure_5b) and use_shards(final, 1, 0, figure_5b)
    assert not shards("result", 0, figure_5b) and use_shards(ret, 0, 0, figure_5b)

    other = found.unsharded_nodes(sequence, [0])
    assert [shards("%4", 0, other), shards("%4", 1, other)] == [True, False]
    # Two all_gathers: qt before the score matmul and v before the last one.
    assert shards("%3", 1, other) and not use_shards(score, 1, 1, other)
    assert shards("%1", 0, other) and not use_shards(final, 1, 0, other)
    # ... and k and the output need none.
    assert use_shards(score, 0, 0, other) and shards("result", 0, other)


def test_function_f_reports_the_conflict_on_z():
    analysis = analysis_of(F)
    z = "result"
    color = analysis.color_of_dim(z, 0).id
    on_z = [c for c in analysis.conflicts.color_conflicts
            if c.site.kind == "def" and analysis.program.values[c.site.value].name == z]
    assert [(c.color, c.site.dims) for c in on_z] == [(color, (0, 1))]
    # In the dimension graph: the edge between z's two dims, and the one on z's use by return.
    edges = analysis.conflicts.conflicts
    assert [[(s.kind, analysis.program.values[s.value].name, s.dims) for s in c.sites] for c in edges] == [
        [("def", z, (0, 1))], [("use", z, (0, 1))],
    ]
    assert len(analysis.conflicts.sets) == 1  # a box: z and its use resolved alike


def test_mlp_has_no_conflicts():
    analysis = analysis_of("toast.examples.mlp:mlp")
    assert analysis.conflicts.conflicts == () and analysis.conflicts.resolution_bits == 0


def _crossing(x):
    a = x @ x.T
    return a * a.T


def _box(x):
    a = x @ x.T
    return a * a


@pytest.mark.parametrize("engine", engines())
def test_a_path_across_the_box_is_not_compatible(engine):
    """a * a.T: a's dim 0 reaches the multiply's dim 1 through the transpose (Figure 6, middle),
    so the box of a's conflict and its use by the multiply is crossed. The sets still join
    through the transpose's boxes, which orient a's dim 0 with the multiply's dim 1."""
    x = jax.ShapeDtypeStruct((16, 4), jnp.float32)
    crossing = analyze("crossing", fn=_crossing, args=(x,), engine=engine)
    plain = analyze("box", fn=_box, args=(x,), engine=engine)

    def box_and_orientation(analysis):
        a = next(op for op in analysis.program.ops if op.kind == "stablehlo.dot_general").results[0]
        multiply = next(op for op in analysis.program.ops if op.kind == "stablehlo.multiply")
        found = analysis.conflicts
        on_def = next(c for c in found.conflicts if any(s.kind == "def" and s.value == a for s in c.sites))
        on_use = next(c for c in found.conflicts
                      if any(s.kind == "use" and s.op == multiply.id and s.operand == 0 for s in c.sites))
        box = next(b for b in found.boxes if (b.def_conflict, b.use_conflict) == (on_def.id, on_use.id))
        group_set = found.sets[found.set_of[on_def.id]]
        assert found.set_of[on_use.id] == group_set.id
        sides = dict(zip(group_set.conflicts, group_set.sharded_endpoints(0), strict=True))
        def_dim = next(s for s in on_def.sites if s.kind == "def").dims[sides[on_def.id]]
        use_dim = next(s for s in on_use.sites if s.kind == "use" and s.op == multiply.id).dims[sides[on_use.id]]
        return box.crossed, (def_dim, use_dim)

    assert box_and_orientation(crossing) == (True, (0, 1))
    assert box_and_orientation(plain) == (False, (0, 0))
    assert crossing.stats["crossed_boxes"] == 1 and plain.stats["crossed_boxes"] == 0


def test_variants_switch_the_heuristics():
    """Resolution bits of the attention with and without each heuristic."""
    bits = {variant: analyze(ATTENTION, engine="embedded", variant=variant).conflicts
            for variant in ("default", "no_box", "no_layers", "no_heuristics")}
    assert [len(bits[v].sets) for v in bits] == [1, 5, 1, 5]
    assert [bits[v].resolution_bits for v in bits] == [1, 5, 1, 5]
    # Without the box heuristic no boxes are derived at all.
    assert bits["no_box"].stats["boxes"] == 0 and bits["default"].stats["boxes"] == 4


@pytest.mark.parametrize("layers", [2, 6, pytest.param(12, marks=pytest.mark.slow)])  # L=12: 16 s
def test_gpt_resolution_bits_do_not_grow_with_layers(layers):
    """Recorded count: 1 bit at every L. Why: each layer's attention conflicts (scores,
    softmax, causal mask, in the forward pass and their uses in the backward pass, which
    reads the saved probabilities) are joined by boxes into one compatibility set per layer,
    and the layers' sets are isomorphic, so the layer heuristic groups all of them."""
    fn, args = gpt_small(layers=layers)
    analysis = analyze(f"gpt L={layers}", fn=fn, args=args)
    found = analysis.conflicts
    assert len(found.sets) == layers  # one set per layer ...
    assert found.resolution_bits == 1  # ... all resolved by one bit
    assert found.groups[0].sets == tuple(range(layers))
    assert analysis.invalid == ()
    # Without the layer heuristic the bits grow with L: the grouping does the work.
    if layers == 2:
        plain = analyze(f"gpt L={layers}", fn=fn, args=args, variant="no_layers")
        assert plain.conflicts.resolution_bits == layers


def test_grouped_sets_are_oriented_alike():
    """Bit r picks corresponding endpoints in every layer: the same dims of the same op kinds."""
    fn, args = gpt_small(layers=3)
    analysis = analyze("gpt L=3", fn=fn, args=args)
    found = analysis.conflicts
    per_layer = []
    for set_id in found.groups[0].sets:
        group_set = found.sets[set_id]
        shards = []
        for conflict_id, endpoint in zip(group_set.conflicts, group_set.sharded_endpoints(1), strict=True):
            site = found.conflicts[conflict_id].sites[0]
            kind = analysis.program.ops[site.op].kind if site.kind == "use" else "def"
            shards.append((kind, site.dims[endpoint]))
        per_layer.append(shards)
    assert per_layer[0] == per_layer[1] == per_layer[2]
    assert len({d for _, d in per_layer[0]}) == 2  # both dims occur: not a trivial orientation
