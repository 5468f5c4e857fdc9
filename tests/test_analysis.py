"""Golden results of the analysis on the bundled examples (the paper's figures)."""

from __future__ import annotations

import functools

import pytest
from conftest import analysis_of, engines

from toast import analyze
from toast.examples.gpt import gpt_train_step


def _color_sets(analysis, values):
    """For each color: the set of (value, dim) among ``values`` it holds (non-empty only)."""
    found = {}
    for color in analysis.colors:
        dims = frozenset((d.value, d.dim) for d in color.dims if d.value in values)
        if dims:
            found[color.id] = dims
    return set(found.values())


@pytest.mark.parametrize("engine", engines())
def test_mlp_has_exactly_the_four_colors_of_figure_4c(engine):
    analysis = analysis_of("toast.examples.mlp:mlp", engine)
    assert len(analysis.colors) == 4
    # x:[B,X], w1:[X,U], w2:[U,W], result:[B,W]
    assert _color_sets(analysis, {"x", "w1", "w2", "result"}) == {
        frozenset({("x", 0), ("result", 0)}),  # B
        frozenset({("x", 1), ("w1", 0)}),  # X
        frozenset({("w1", 1), ("w2", 0)}),  # U
        frozenset({("w2", 1), ("result", 1)}),  # W
    }
    assert analysis.unruled_ops == ()
    assert analysis.invalid == ()


def test_transpose_matmul_puts_both_dims_of_z_in_one_color():
    analysis = analysis_of("toast.examples.transpose_matmul:transpose_matmul")
    z = analysis.program.values[analysis.program.results[0]].name
    assert analysis.color_of_dim(z, 0) == analysis.color_of_dim(z, 1)  # the conflict of section 3.3
    assert analysis.color_of_dim("x", 0) == analysis.color_of_dim(z, 0)
    assert analysis.color_of_dim("x", 1) != analysis.color_of_dim("x", 0)


def test_attention_sequence_color_spans_a_c_d():
    analysis = analysis_of("toast.examples.attention:attention")
    s = analysis.color_of_dim("x", 0)
    ranks = {}
    for d in s.dims:
        ranks.setdefault(d.value, set()).add(d.dim)
    # a, c, d of Figure 5a have S twice: some [S,S] value holds both dims in the S color.
    assert any(dims == {0, 1} for dims in ranks.values())
    assert analysis.color_of_dim("wq", 1) == analysis.color_of_dim("wk", 1)  # H1
    assert analysis.color_of_dim("wv", 1) != analysis.color_of_dim("wq", 1)  # H2


# Sizes chosen pairwise distinct so a dim's size says which logical dim it is.
ENGINE = "embedded"
B, S, D, H, F, V = 3, 10, 28, 4, 44, 50


@functools.cache
def _gpt():
    fn, args = gpt_train_step(layers=2, batch=B, seq=S, d_model=D, heads=H, vocab=V, d_ff=F)
    return analyze("gpt", fn=fn, args=args, engine=ENGINE)


def test_gpt_batch_color_spans_every_activation():
    analysis = _gpt()
    batch = analysis.color_of_dim("tokens", 0)
    assert analysis.color_of_dim("targets", 0) == batch
    size_b = [(d.value, d.dim) for c in analysis.colors for d in c.dims if d.size == B]
    assert len(size_b) > 100
    outside = [vd for vd in size_b if analysis.color_of_dim(*vd) != batch]
    assert outside == []


def test_gpt_head_color_reaches_attention_weights_through_reshape():
    analysis = _gpt()
    head = analysis.color_of_dim("params['blocks'][0]['wq']", 1)
    members = {(d.value, d.dim) for d in head.dims}
    for weight in ("wk", "wv"):
        assert (f"params['blocks'][0]['{weight}']", 1) in members
    assert ("params['blocks'][0]['wo']", 0) in members
    # ... and the per-head dims of the attention tensors (size H) are in it.
    assert sum(1 for d in head.dims if d.size == H) >= 4
    # The reshape records that an axis sharding D through the head must divide H.
    assert H in analysis.major_factors.values()
    # Layers are distinct colors (the unrolled layers do not share weights).
    assert analysis.color_of_dim("params['blocks'][1]['wq']", 1) != head


def test_gpt_mlp_hidden_dims_of_both_weights_share_a_color():
    analysis = _gpt()
    hidden = analysis.color_of_dim("params['blocks'][0]['w_fc']", 1)
    assert analysis.color_of_dim("params['blocks'][0]['w_proj']", 0) == hidden
    assert analysis.color_of_dim("params['blocks'][0]['b_fc']", 0) == hidden
    assert all(d.size == F for d in hidden.dims)


def test_gpt_has_no_unruled_op_and_no_invariant_violation():
    analysis = _gpt()
    assert analysis.unruled_ops == ()
    assert analysis.invalid == ()


def test_scan_over_layers_shares_names_across_iterations():
    analysis = analysis_of("toast.examples.gpt:gpt_scan")
    assert analysis.unruled_ops == ()
    # The stacked weights: the layer dim 0 and the hidden dim 2 of w_fc / w_proj.
    hidden = analysis.color_of_dim("params['blocks']['w_fc']", 2)
    assert analysis.color_of_dim("params['blocks']['w_proj']", 1) == hidden
    assert analysis.color_of_dim("tokens", 0) == analysis.color_of_dim("targets", 0)


@pytest.mark.slow
def test_gpt2_sized_12_layer_step_has_no_unruled_op():
    fn, args = gpt_train_step(layers=12)
    analysis = analyze("gpt12", fn=fn, args=args, engine="embedded")
    assert analysis.unruled_ops == ()
    assert analysis.invalid == ()
    assert analysis.stats["ops"] > 5000
