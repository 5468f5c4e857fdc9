"""The ITX inference example (``toast/examples/itx.py``): decode and prefill steps that the
analysis covers completely, a KV cache that is numerically right, roles that name the
program's arguments, and manual strategies (the paper's ITX baseline) that give valid states.
"""

from __future__ import annotations

import functools
import math
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast
import toast.examples.itx as itx_module
from toast.examples import op_counts
from toast.examples.itx import itx, itx_decode_step, itx_prefill, itx_prefill_small, itx_prefill_step, itx_small
from toast.sharding import load_roles
from toast.sharding.strategies import role_colors

ROLES_FILE = Path(itx_module.__file__).with_name("itx.roles.toml")
FACTORIES = {"decode": itx_small, "prefill": itx_prefill_small}
PROGRAMS = [(kind, scan) for kind in FACTORIES for scan in (False, True)]
STRATEGIES = ("data_parallel", "megatron", "fsdp")

# 916,850,688 parameters at the paper's sizes (L=32, D=2048, H=32, Dh=64, K=1, F=4096, V=50304):
#   per block: wq, wo   2048 * 32 * 64 = 4,194,304 each  ->  8,388,608
#              wk, wv   2048 *  1 * 64 =   131,072 each  ->    262,144
#              w_fc, w_proj  2048 * 4096 = 8,388,608 each -> 16,777,216
#              ln_1_scale, ln_2_scale  2048 each         ->      4,096
#              block total                                  25,432,064
#   32 blocks: 32 * 25,432,064                            = 813,826,048
#   wte: 50304 * 2048                                     = 103,022,592
#   ln_f_scale                                            =       2,048
#   total: 813,826,048 + 103,022,592 + 2,048              = 916,850,688
PAPER_PARAMETERS = 916_850_688


def _ids(kind: str, scan: bool) -> str:
    return f"{kind}-{'scan' if scan else 'unrolled'}"


@functools.cache
def _analysis(kind: str, scan: bool):
    fn, args = FACTORIES[kind](scan_layers=scan)
    return toast.analyze("itx", fn=fn, args=args, engine="embedded")


@functools.cache
def _counts(kind: str, scan: bool):
    fn, args = FACTORIES[kind](scan_layers=scan)
    return op_counts(jax.jit(fn).lower(*args).as_text())


def _names(analysis) -> list[str]:
    program = analysis.program
    return [program.values[v].name for v in program.arguments]


def _matches(analysis, pattern: str, dim: int) -> list[str]:
    """Arguments a roles entry names: ``pattern`` a glob where only ``*`` is special, ``dim``
    within the argument's rank (as ``toast.sharding.strategies`` reads roles)."""
    regex = re.compile(re.escape(pattern).replace(r"\*", ".*"))
    program = analysis.program
    return [program.values[v].name for v in program.arguments
            if regex.fullmatch(program.values[v].name) and dim < len(program.values[v].shape)]


def _parameters(tree) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree))


# --- the analysis ----------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "scan"), PROGRAMS, ids=[_ids(*p) for p in PROGRAMS])
def test_small_steps_have_no_unruled_op(kind, scan):
    analysis = _analysis(kind, scan)
    print(_names(analysis)[:6], analysis.stats["ops"], "ops")
    assert analysis.unruled_ops == (), analysis.unruled_ops
    assert analysis.invalid == ()


@pytest.mark.parametrize(("kind", "scan"), PROGRAMS, ids=[_ids(*p) for p in PROGRAMS])
def test_lowered_ops(kind, scan):
    counts = _counts(kind, scan)
    assert counts["stablehlo.dot_general"] > 0
    assert counts["stablehlo.sine"] > 0 and counts["stablehlo.cosine"] > 0  # RoPE
    assert counts["stablehlo.gather"] == 1  # the embedding lookup
    assert (counts["stablehlo.while"] == 1) == scan
    if kind == "decode":
        # Two cache writes (k, v) per layer unrolled; under scan one per carried cache
        # slice in the body plus the scan's own stacking of the new cache.
        assert counts["stablehlo.dynamic_update_slice"] >= 2
        assert counts["stablehlo.scatter"] == 0
    else:
        assert counts["stablehlo.pad"] > 0  # the prompt's keys and values padded to T


def test_argument_names_and_shapes():
    fn, (params, cache, position, tokens) = itx_small()
    assert len(params["blocks"]) == len(cache) == 2
    assert params["blocks"][0]["wq"].shape == (64, 4, 16)
    assert params["blocks"][0]["wk"].shape == params["blocks"][0]["wv"].shape == (64, 1, 16)
    assert params["blocks"][0]["wo"].shape == (4, 16, 64)
    assert cache[0]["k"].shape == (2, 16, 1, 16)
    assert position.shape == () and position.dtype == jnp.int32
    assert tokens.shape == (2,) and tokens.dtype == jnp.int32
    next_tokens, logits, new_cache = jax.eval_shape(fn, params, cache, position, tokens)
    assert next_tokens.shape == (2,) and next_tokens.dtype == jnp.int32
    assert logits.shape == (2, 128)
    assert jax.tree_util.tree_structure(new_cache) == jax.tree_util.tree_structure(cache)

    names = _names(_analysis("decode", False))
    for name in ["params['wte']", "params['blocks'][1]['wq']", "params['ln_f_scale']",
                 "cache[0]['k']", "cache[1]['v']", "position", "tokens"]:
        assert name in names
    assert {"params['blocks']['wq']", "cache['k']"} <= set(_names(_analysis("decode", True)))
    _, (_, scanned_cache, _, _) = itx_small(scan_layers=True)
    assert scanned_cache["k"].shape == (2, 2, 16, 1, 16)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="kv_heads"):
        itx_small(kv_heads=3)
    with pytest.raises(ValueError, match="even"):
        itx_small(head_dim=15)
    with pytest.raises(ValueError, match="prompt_length"):
        itx_prefill_small(prompt_length=17)


# --- the KV cache, numerically -----------------------------------------------------------------

def _random_params(spec_tree, seed: int = 0):
    """float32 arrays shaped like ``spec_tree`` (numpy's generator: no XLA program per shape):
    vectors (the norm scales) near 1, everything else N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda leaf: ((1.0 if leaf.ndim == 1 else 0.0) + 0.1 * rng.standard_normal(leaf.shape)).astype(np.float32),
        spec_tree)


def _compile(fn, args):
    """``jax.jit(fn)`` compiled for ``args`` with XLA's backend optimizations off: the same
    arithmetic in float32, in about half the compile time of these small programs."""
    options = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
    return jax.jit(fn).lower(*args).compile(compiler_options=options)


_CACHE_CASES = [
    pytest.param(1, False, 1, id="mqa-unrolled"),
    pytest.param(1, True, 2, id="mqa-scan-2-steps", marks=pytest.mark.slow),
    pytest.param(2, False, 2, id="gqa-unrolled-2-steps", marks=pytest.mark.slow),
    pytest.param(4, True, 1, id="mha-scan", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("kv_heads", "scan", "steps"), _CACHE_CASES)
def test_decode_after_prefill_matches_a_longer_prefill(kv_heads, scan, steps):
    """Prefill P tokens, then decode tokens P, P+1, ... through the cache: each step's logits,
    next tokens and cache must be those of a causal forward pass (the prefill) over all the
    tokens so far, computed without the cache. float32, random weights; ~1.5 s per compile, so
    the default run checks one step of the paper's configuration (multi-query, unrolled)."""
    sizes = dict(kv_heads=kv_heads, scan_layers=scan, dtype=jnp.float32)
    prompt = 8
    decode, decode_args = itx_small(**sizes)
    decode = _compile(decode, decode_args)
    prefill = {p: _compile(*itx_prefill_small(prompt_length=p, **sizes)) for p in range(prompt, prompt + steps + 1)}
    param_specs = decode_args[0]
    params = _random_params(param_specs)
    tokens = np.random.default_rng(1).integers(0, 128, size=(2, prompt + steps), dtype=np.int32)

    _, _, cache = prefill[prompt](params, tokens[:, :prompt])
    for position in range(prompt, prompt + steps):
        next_tokens, logits, cache = decode(params, cache, np.int32(position), tokens[:, position])
        ref_next, ref_logits, ref_cache = prefill[position + 1](params, tokens[:, :position + 1])
        np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(next_tokens, ref_next)
        np.testing.assert_array_equal(next_tokens, np.argmax(np.asarray(logits), axis=-1))
        for got, want in zip(jax.tree_util.tree_leaves(cache), jax.tree_util.tree_leaves(ref_cache), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Slots after the last position written still hold the prefill's zeros.
    for leaf in jax.tree_util.tree_leaves(cache):
        assert not np.asarray(leaf)[..., prompt + steps:, :, :].any()


# --- roles and manual strategies ---------------------------------------------------------------

def test_every_role_pattern_names_an_argument():
    roles = load_roles(ROLES_FILE)
    assert set(roles.dims) == {"batch", "heads", "mlp"}
    analyses = [_analysis(*p) for p in PROGRAMS]
    for role, pairs in roles.dims.items():
        for pattern, dim in pairs:
            assert any(_matches(a, pattern, dim) for a in analyses), (role, pattern, dim)
        for analysis in analyses:
            assert role_colors(analysis, roles, role)  # raises if the role names nothing
    # Multi-query attention: the query and output projections' heads share a color per layer.
    decode = _analysis("decode", False)
    for layer in range(2):
        assert (decode.color_of_dim(f"params['blocks'][{layer}]['wq']", 1)
                == decode.color_of_dim(f"params['blocks'][{layer}]['wo']", 0))
    assert decode.color_of_dim("tokens", 0) == decode.color_of_dim("cache[1]['k']", 0)


@pytest.mark.parametrize(("kind", "scan"), PROGRAMS, ids=[_ids(*p) for p in PROGRAMS])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_manual_strategies_are_valid(kind, scan, strategy):
    roles = load_roles(ROLES_FILE)
    model = toast.ShardingModel(_analysis(kind, scan), toast.parse_mesh("batch=2,model=2"))
    state, actions = toast.sharding.manual_strategy(model, strategy, roles)
    assert actions
    assert model.problem(state) == ""


# --- the paper's sizes -------------------------------------------------------------------------

@pytest.mark.parametrize("factory", [itx, itx_prefill])
def test_paper_sizes_lower_from_shapes(factory):
    start = time.perf_counter()
    fn, args = factory()
    for leaf in jax.tree_util.tree_leaves(args):
        assert isinstance(leaf, jax.ShapeDtypeStruct)
    text = jax.jit(fn).lower(*args).as_text()
    seconds = time.perf_counter() - start
    total = sum(op_counts(text).values())
    print(f"{factory.__name__}: lowered in {seconds:.2f} s, {total} ops")
    assert _parameters(args[0]) == PAPER_PARAMETERS
    assert args[0]["wte"].shape == (50304, 2048)
    assert len(args[0]["blocks"]) == 32
    assert args[-1].shape == ((32,) if factory is itx else (32, 1024))
    assert "tensor<32x2048x1x64xbf16>" in text  # the cache: B=32, T=2048, one kv head


def test_step_factories_default_to_the_paper_sizes():
    assert _parameters(itx_decode_step()[1][0]) == PAPER_PARAMETERS
    assert itx_prefill_step()[1][1].shape == (32, 1024)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("factory", [itx, itx_prefill])
def test_paper_sizes_analyze_and_take_the_manual_baselines(factory, scan):
    start = time.perf_counter()
    fn, args = factory(scan_layers=scan)
    analysis = toast.analyze("itx", fn=fn, args=args, engine="embedded")
    print(f"{factory.__name__} scan={scan}: analyzed in {time.perf_counter() - start:.1f} s, "
          f"{analysis.stats['ops']} ops")
    assert analysis.unruled_ops == (), analysis.unruled_ops
    assert analysis.invalid == ()
    roles = load_roles(ROLES_FILE)
    model = toast.ShardingModel(analysis, toast.parse_mesh("batch=8,model=4"))
    for strategy in STRATEGIES:
        state, _ = toast.sharding.manual_strategy(model, strategy, roles)
        assert model.problem(state) == "", strategy
