"""Tests for the bundled example programs (``toast.examples``).

Each factory must return ``(fn, args)`` with ``args`` made only of ``jax.ShapeDtypeStruct``,
and ``fn`` must lower with ``jax.jit(fn).lower(*args)``.  The paper's examples must lower to
the paper's ops; the op zoo must contain every op kind it promises.
"""

from __future__ import annotations

import collections
import functools
import inspect
import re

import jax
import pytest

from toast.examples import DESCRIPTIONS, EXAMPLES, load, op_counts, resolve

# Sizes that keep every lowering fast.
_SMALL = {
    "gpt": dict(layers=1, batch=2, seq=8, d_model=32, heads=2, vocab=64),
    # The zoo at full widths but one layer (their own tests lower every layer: tests/test_zoo_*.py).
    "t2b": dict(layers=1),
    "t7b": dict(layers=1),
    "itx": dict(layers=1),
    "itx_prefill": dict(layers=1),
    "gns": dict(steps=1),
    "unet": dict(blocks_per_level=1),
}


@functools.cache
def _text(name: str, **settings) -> str:
    fn, args = load(name, **{**_SMALL.get(name, {}), **settings})
    return jax.jit(fn).lower(*args).as_text(debug_info=True)


def _main(text: str) -> str:
    """The body of ``@main`` (up to the next function)."""
    start = text.index("func.func public @main")
    end = text.find("func.func private", start)
    return text[start:end if end >= 0 else len(text)]


def _main_ops(text: str) -> list[str]:
    """The op names defined in ``@main``, in order; constants and returns left out."""
    names = re.findall(r'=\s+"?(stablehlo\.[a-z_0-9]+|call)\b', _main(text))
    return [n for n in names if n != "stablehlo.constant"]


# --- registry ----------------------------------------------------------------------------

def test_registry_names_every_factory_with_a_description():
    assert set(EXAMPLES) == set(DESCRIPTIONS)
    for name in ["mlp", "transpose_matmul", "attention", "gpt", "gpt_small", "gpt_scan",
                 "convnet", "gnn", "ops_zoo"]:
        assert name in EXAMPLES
    for name, spec in EXAMPLES.items():
        assert re.fullmatch(r"toast\.examples\.\w+:\w+", spec), spec
        assert resolve(name) is resolve(spec)
        assert DESCRIPTIONS[name] and "\n" not in DESCRIPTIONS[name]


def test_unknown_example_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown example"):
        resolve("no_such_example")
    with pytest.raises(ValueError, match="has no function"):
        resolve("toast.examples.mlp:no_such_function")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_factory_takes_keyword_only_settings_with_defaults(name):
    for param in inspect.signature(resolve(name)).parameters.values():
        assert param.kind in (param.KEYWORD_ONLY, param.VAR_KEYWORD), (name, param)
        if param.kind is param.KEYWORD_ONLY:
            assert param.default is not param.empty, (name, param)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_lowers_from_shapes_only(name):
    fn, args = load(name, **_SMALL.get(name, {}))
    assert isinstance(args, tuple) and args
    for leaf in jax.tree_util.tree_leaves(args):
        assert isinstance(leaf, jax.ShapeDtypeStruct), (name, leaf)
    text = _text(name)
    assert "func.func public @main" in text
    assert sum(op_counts(text).values()) > 0


# --- the paper's examples ----------------------------------------------------------------

def test_mlp_is_figure_2a():
    text = _text("mlp")
    assert 'loc("x")' in text and 'loc("w1")' in text and 'loc("w2")' in text
    assert "tensor<256x32xf32>" in text and "tensor<32x64xf32>" in text
    assert "tensor<64x16xf32>" in text and "-> (tensor<256x16xf32>" in text
    assert _main_ops(text) == ["stablehlo.dot_general", "call", "stablehlo.dot_general"]
    assert op_counts(text) == collections.Counter({
        "stablehlo.dot_general": 2, "stablehlo.constant": 1,
        "stablehlo.broadcast_in_dim": 1, "stablehlo.maximum": 1})


def test_transpose_matmul_is_section_2_2_f():
    text = _text("transpose_matmul")
    assert 'loc("x")' in text and "tensor<32x4xf32>" in text
    assert _main_ops(text) == ["stablehlo.transpose", "stablehlo.dot_general"]
    assert "-> (tensor<32x32xf32>" in text


_FIGURE_5A = [
    "stablehlo.dot_general",     # k = matmul(x, wk)
    "stablehlo.dot_general",     # v = matmul(x, wv)
    "stablehlo.dot_general",     # q = matmul(x, wq)
    "stablehlo.transpose",       # qt = transpose(q)
    "stablehlo.dot_general",     # a = matmul(k, qt)
    "stablehlo.reduce",          # b = reduce_{1,add}(a)
    "stablehlo.broadcast_in_dim",  # c = broadcast_0(b)
    "stablehlo.divide",          # d = div(a, c)
    "stablehlo.dot_general",     # z = matmul(d, v)
]


@pytest.mark.parametrize("reduce_axis", [0, 1])
def test_attention_is_exactly_figure_5a(reduce_axis):
    text = _text("attention", reduce_axis=reduce_axis)
    assert _main_ops(text) == _FIGURE_5A
    # The multiset of all op names (the reduce body's add included), constants aside.
    counts = op_counts(text)
    del counts["stablehlo.constant"]
    assert counts == collections.Counter({
        "stablehlo.dot_general": 5, "stablehlo.transpose": 1, "stablehlo.reduce": 1,
        "stablehlo.add": 1, "stablehlo.broadcast_in_dim": 1, "stablehlo.divide": 1})
    assert f"across dimensions = [{reduce_axis}]" in text
    assert re.search(rf"broadcast_in_dim %\d+, dims = \[{1 - reduce_axis}\]", text)
    for name in ["x", "wq", "wk", "wv"]:
        assert f'loc("{name}")' in text
    assert "tensor<128x64xf32>" in text and "-> (tensor<128x32xf32>" in text


def test_attention_rejects_other_axes():
    with pytest.raises(ValueError):
        load("attention", reduce_axis=2)


# --- GPT -------------------------------------------------------------------------------

def _total_ops(text: str) -> int:
    return sum(op_counts(text).values())


def test_gpt_step_op_count_grows_linearly_with_layers():
    totals = [_total_ops(_text("gpt", layers=n)) for n in (1, 2, 3)]
    assert totals[0] < totals[1] < totals[2]
    assert totals[2] - totals[1] == totals[1] - totals[0]  # every block adds the same ops


def test_gpt_step_shapes_names_and_outputs():
    fn, (params, tokens, targets) = load("gpt_small")
    assert len(params["blocks"]) == 2
    assert tokens.shape == targets.shape == (2, 16) and tokens.dtype == "int32"
    loss, new_params = jax.eval_shape(fn, params, tokens, targets)
    assert loss.shape == ()
    assert jax.tree_util.tree_structure(new_params) == jax.tree_util.tree_structure(params)
    for new, old in zip(jax.tree_util.tree_leaves(new_params), jax.tree_util.tree_leaves(params), strict=True):
        assert (new.shape, new.dtype) == (old.shape, old.dtype)
    text = _text("gpt_small")
    for name in ["tokens", "targets", "params['wte']", "params['blocks'][1]['wq']",
                 "params['ln_f']['scale']"]:
        assert f'loc("{name}")' in text
    counts = op_counts(text)
    for op in ["dot_general", "gather", "scatter", "reduce", "reshape", "transpose",
               "exponential", "log", "tanh", "rsqrt", "select", "iota"]:
        assert counts[f"stablehlo.{op}"] > 0, op
    assert "stablehlo.while" not in counts
    assert not any(name.startswith("chlo.") for name in counts)


def test_gpt_scan_lowers_to_while_and_does_not_grow_with_layers():
    text = _text("gpt_scan")
    assert op_counts(text)["stablehlo.while"] == 2  # forward and backward
    assert _total_ops(_text("gpt_scan", layers=4)) == _total_ops(text)
    fn, (params, _, _) = load("gpt_scan", layers=3)
    assert params["blocks"]["wq"].shape == (3, 64, 64)


def test_gpt_rejects_bad_heads():
    with pytest.raises(ValueError, match="divisible"):
        load("gpt", d_model=30, heads=4)


# --- convnet, gnn --------------------------------------------------------------------------

def test_convnet_has_convolutions_pooling_and_its_gradient():
    counts = op_counts(_text("convnet"))
    assert counts["stablehlo.convolution"] >= 3   # 2 forward, their gradients backward
    assert counts["stablehlo.reduce_window"] == 1
    assert counts["stablehlo.select_and_scatter"] == 1


def test_gnn_has_gathers_and_scatters_both_ways():
    text = _text("gnn")
    counts = op_counts(text)
    assert counts["stablehlo.gather"] == 2   # nodes[senders]; gradient of segment_sum
    assert counts["stablehlo.scatter"] == 2  # segment_sum; gradient of the gather
    for name in ["senders", "receivers", "nodes", "labels"]:
        assert f'loc("{name}")' in text


# --- op zoo --------------------------------------------------------------------------------

_ZOO_OPS = """
    negate abs exponential log sqrt rsqrt tanh sine cosine tan floor ceil sign cbrt
    exponential_minus_one log_plus_one round_nearest_even round_nearest_afz is_finite
    add subtract multiply divide maximum minimum power remainder atan2
    and or xor not shift_left shift_right_arithmetic shift_right_logical
    popcnt count_leading_zeros
    compare select clamp convert bitcast_convert reduce_precision
    broadcast_in_dim transpose reshape dot_general reduce reduce_window select_and_scatter
    convolution concatenate slice dynamic_slice dynamic_update_slice pad gather scatter
    iota sort reverse case while optimization_barrier rng_bit_generator constant custom_call
""".split()


def test_ops_zoo_covers_every_op_kind():
    text = _text("ops_zoo")
    counts = op_counts(text)
    missing = [op for op in _ZOO_OPS if counts[f"stablehlo.{op}"] == 0]
    assert not missing
    assert not any(name.startswith("chlo.") for name in counts)
    assert counts["stablehlo.case"] == 2     # lax.cond and lax.switch
    # Particular forms.
    assert re.search(r"stablehlo.dot_general .*batching_dims = \[0\] x \[0\]", text)
    assert re.search(r"stablehlo.constant dense<\"0x[0-9A-F]+\"> : tensor<1000xf32>", text)
    assert re.search(r"%\S+:2 = \"stablehlo.sort\"\(", text)       # two-operand sort
    assert re.search(r"%\S+:2 = stablehlo.reduce\(", text)           # argmax: two results
    assert re.search(r"\"stablehlo.case\"\(.*\n(.*\n)*?\s*\}, \{\n(.*\n)*?\s*\}, \{", text)
    if jax.default_backend() == "cpu":  # the targets are platform-specific
        assert "stablehlo.custom_call @lapack_spotrf_ffi" in text
        assert "stablehlo.custom_call @lapack_strsm_ffi" in text
    assert re.search(r"call @cumsum", text) and re.search(r"call @relu", text)


def test_ops_zoo_extras_add_chlo_and_complex_ops():
    counts = op_counts(_text("ops_zoo_extras"))
    for op in ["chlo.square", "chlo.erfc", "chlo.top_k", "chlo.lgamma", "chlo.sinh",
               "stablehlo.fft", "stablehlo.real", "stablehlo.imag", "stablehlo.complex"]:
        assert counts[op] > 0, op


# --- the op counter ---------------------------------------------------------------------

def test_op_counts_walks_regions_and_generic_forms():
    text = """
    func.func @main(%a: tensor<2xf32>, %i: tensor<1x1xi32>) -> tensor<f32> {
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %0 = stablehlo.add %a, %a : tensor<2xf32>
      %1 = "stablehlo.gather"(%0, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [1],
          start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1>}>
          : (tensor<2xf32>, tensor<1x1xi32>) -> tensor<1x1xf32>
      %2 = stablehlo.reduce(%1 init: %c) applies stablehlo.add across dimensions = [0, 1]
          : (tensor<1x1xf32>, tensor<f32>) -> tensor<f32>
      %3 = stablehlo.atan2 %2, %2 : tensor<f32>
      return %3 : tensor<f32>
    }
    """
    assert op_counts(text) == collections.Counter({
        "stablehlo.add": 2, "stablehlo.gather": 1, "stablehlo.reduce": 1,
        "stablehlo.atan2": 1, "stablehlo.constant": 1})
