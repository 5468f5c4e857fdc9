"""The Gemma-1 training step (``toast.examples.gemma``): the paper's T2B and T7B (section 5.1).

The small size must analyze with every op ruled, unrolled and scanned, and lower to the ops the
model promises; its roles file must name argument dims of both layouts, and the manual
strategies must give valid states on a ``batch=2,model=2`` mesh. The full sizes must have
Gemma's parameter counts (from the argument shapes alone) and lower from shapes (slow).
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
from conftest import assert_like

import toast
import toast.examples.gemma as gemma
from toast.examples import op_counts
from toast.examples.gemma import gemma_small, gemma_train_step, t2b, t7b
from toast.sharding import load_roles, manual_strategy, roles_for_input
from toast.sharding.strategies import role_colors

ROLES_FILE = Path(gemma.__file__).with_name("gemma.roles.toml")
LAYOUTS = {"unrolled": False, "scanned": True}
STRATEGIES = ("data_parallel", "megatron", "fsdp", "sequence")

# Hand-counted parameters (weights only; the Adam moments double and triple them).
# T2B: D=2048, L=18, H=8, K=1, Dh=256, F=16384, V=256128.
#   embed V*D = 256128*2048 = 524_550_144; final_norm D = 2_048;
#   per layer: wq D*H*Dh = 4_194_304, wk and wv D*K*Dh = 524_288 each, wo H*Dh*D = 4_194_304,
#   w_gate, w_up and w_down D*F = 33_554_432 each (100_663_296), two norms 2*D = 4_096:
#   110_104_576; times 18 = 1_981_882_368.
#   Total 524_550_144 + 2_048 + 1_981_882_368 = 2_506_434_560 (Gemma-2B: "2.5B").
T2B_PARAMETERS = 2_506_434_560
# T7B: D=3072, L=28, H=K=16, Dh=256, F=24576, V=256128.
#   embed V*D = 256128*3072 = 786_825_216; final_norm D = 3_072;
#   per layer: wq, wk, wv, wo D*H*Dh = 12_582_912 each (50_331_648), w_gate, w_up and w_down
#   D*F = 75_497_472 each (226_492_416), two norms 2*D = 6_144: 276_830_208; times 28 =
#   7_751_245_824.
#   Total 786_825_216 + 3_072 + 7_751_245_824 = 8_538_074_112 (Gemma-7B: "8.5B").
T7B_PARAMETERS = 8_538_074_112


@functools.cache
def _small(layout: str):
    """``(fn, args)`` of ``gemma_small`` in ``layout``."""
    return gemma_small(scan_layers=LAYOUTS[layout])


@functools.cache
def _analysis(layout: str):
    fn, args = _small(layout)
    return toast.analyze("gemma", fn=fn, args=args, engine="embedded")


@functools.cache
def _counts(layout: str):
    fn, args = _small(layout)
    return op_counts(jax.jit(fn).lower(*args).as_text())


def _argument_names(analysis) -> list[str]:
    program = analysis.program
    return [program.values[v].name for v in program.arguments]


def _parameter_count(params) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params))


# --- the small program --------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_small_step_analyzes_with_every_op_ruled(layout):
    analysis = _analysis(layout)
    unruled = [f"{u.kind} ({u.op} at {u.loc})" for u in analysis.unruled_ops]
    print(layout, "unruled ops:", unruled)
    assert analysis.unruled_ops == (), unruled


@pytest.mark.parametrize("layout", LAYOUTS)
def test_small_step_lowers_to_the_models_ops(layout):
    counts = _counts(layout)
    blocks = 1 if layout == "scanned" else 2  # blocks in the program text (the scan body once)
    # Per block q, k, v, scores, weighted values, wo, gate, up, down; then the unembedding:
    # forward, and the two gradients of each product backward.
    assert counts["stablehlo.dot_general"] == 3 * (9 * blocks + 1)
    assert counts["stablehlo.gather"] == 2  # the embedding and the targets' log-probabilities
    assert counts["stablehlo.scatter"] == 2  # their gradients
    assert counts["stablehlo.rsqrt"] >= 2 * blocks + 1  # two RMSNorms per block and the final one
    assert counts["stablehlo.sine"] == counts["stablehlo.cosine"] == 1  # the RoPE table, once
    assert counts["stablehlo.concatenate"] == 2 * blocks  # RoPE on q and k
    assert counts["stablehlo.tanh"] == blocks  # the GeGLU's tanh GELU
    assert counts["stablehlo.power"] >= 2  # Adam's bias corrections
    assert counts["stablehlo.sqrt"] > 0  # Adam's denominator
    assert counts["stablehlo.while"] == (2 if layout == "scanned" else 0)  # forward and backward
    assert not any(name.startswith("chlo.") for name in counts)


def test_small_step_argument_names_and_shapes():
    names = _argument_names(_analysis("unrolled"))
    for name in ["params['embed']", "params['final_norm']", "params['blocks'][1]['wq']",
                 "opt_state['mu']['blocks'][0]['w_gate']", "opt_state['nu']['embed']", "opt_state['step']",
                 "tokens", "targets"]:
        assert name in names, name
    assert len(names) == 3 * (2 * 9 + 2) + 3  # params, mu, nu; step, tokens, targets
    fn, (params, opt_state, tokens, targets) = _small("scanned")
    assert params["blocks"]["wq"].shape == (2, 64, 4, 16)
    assert params["blocks"]["wk"].shape == (2, 64, 1, 16)  # multi-query
    assert params["blocks"]["wo"].shape == (2, 4, 16, 64)
    assert tokens.shape == targets.shape == (4, 16) and tokens.dtype == jnp.int32
    loss, new_params, new_state = jax.eval_shape(fn, params, opt_state, tokens, targets)
    assert loss.shape == ()
    assert_like((new_params, new_state), (params, opt_state))


@pytest.mark.slow  # XLA's CPU compile of the step takes 10 s or more
def test_small_step_runs_and_its_first_adam_step_moves_each_weight_by_the_learning_rate():
    learning_rate = 1e-3
    fn, (params, opt_state, tokens, targets) = gemma_small(learning_rate=learning_rate)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda s: (0.1 * rng.standard_normal(s.shape)).astype(s.dtype), params)
    opt_state = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), opt_state)
    tokens = rng.integers(0, 256, tokens.shape, dtype=np.int32)
    targets = rng.integers(0, 256, targets.shape, dtype=np.int32)
    step = jax.jit(fn)
    loss, new_params, new_state = step(params, opt_state, tokens, targets)
    assert np.isfinite(loss) and abs(float(loss) - math.log(256)) < 1.0  # about uniform at first
    assert int(new_state["step"]) == 1
    # After one step from zero moments Adam moves each weight by lr * g / (|g| + eps): by lr
    # against the sign of its gradient, g = mu / (1 - b1), where |g| is well above eps.
    for old, new, mu in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(new_params),
                            jax.tree_util.tree_leaves(new_state["mu"]), strict=True):
        g = np.asarray(mu) / (1 - gemma.ADAM_B1)
        big = np.abs(g) > 1e-5
        np.testing.assert_allclose((np.asarray(new) - np.asarray(old))[big], -learning_rate * np.sign(g[big]),
                                   rtol=1e-2)
    for _ in range(3):
        later, new_params, new_state = step(new_params, new_state, tokens, targets)
    assert float(later) < float(loss)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_grouped_query_and_multi_head_attention_lower(kv_heads):
    fn, args = gemma_small(kv_heads=kv_heads, layers=1)
    assert args[0]["blocks"][0]["wk"].shape == (64, kv_heads, 16)
    counts = op_counts(jax.jit(fn).lower(*args).as_text())
    assert counts["stablehlo.dot_general"] == 3 * (9 + 1)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="does not divide"):
        gemma_small(kv_heads=3)
    with pytest.raises(ValueError, match="even"):
        gemma_small(head_dim=15)
    with pytest.raises(TypeError):
        gemma_small(2)  # keyword-only


# --- roles and manual strategies -------------------------------------------------------------

def test_roles_file_is_found_beside_the_module_and_every_pattern_names_an_argument():
    roles = roles_for_input("toast.examples.gemma:gemma_small")
    assert roles.source == str(ROLES_FILE)
    assert set(roles.dims) == {"batch", "sequence", "heads", "mlp"}
    names = {layout: _argument_names(_analysis(layout)) for layout in LAYOUTS}
    for role, pairs in roles.dims.items():
        for pattern, dim in pairs:
            regex = re.compile(re.escape(pattern).replace(r"\*", ".*"))
            matched = [(layout, n) for layout in LAYOUTS for n in names[layout] if regex.fullmatch(n)]
            assert matched, f"role {role}: {pattern}:{dim} names no argument"
            for layout, name in matched:
                shape = _analysis(layout).program.values[
                    _analysis(layout).program.arguments[names[layout].index(name)]].shape
                assert dim < len(shape), f"role {role}: {name} has no dim {dim}"
    for layout in LAYOUTS:
        for role in roles.dims:
            assert role_colors(_analysis(layout), roles, role), (layout, role)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_heads_and_mlp_roles_name_the_heads_and_hidden_colors(layout):
    analysis, roles = _analysis(layout), load_roles(ROLES_FILE)
    heads, mlp = role_colors(analysis, roles, "heads"), role_colors(analysis, roles, "mlp")
    assert len(heads) == len(mlp) == (1 if layout == "scanned" else 2)  # one per block in the text
    assert not set(heads) & set(mlp)
    assert not set(heads + mlp) & set(role_colors(analysis, roles, "batch") + role_colors(analysis, roles, "sequence"))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_manual_strategies_give_valid_states(layout, strategy):
    model = toast.ShardingModel(_analysis(layout), toast.parse_mesh("batch=2,model=2"))
    state, actions = manual_strategy(model, strategy, load_roles(ROLES_FILE))
    assert model.problem(state) == ""
    assert actions


# --- the paper's sizes -----------------------------------------------------------------------

@pytest.mark.parametrize(("factory", "expected"), [(t2b, T2B_PARAMETERS), (t7b, T7B_PARAMETERS)])
def test_full_sizes_have_gemmas_parameter_counts(factory, expected):
    for scan_layers in (False, True):
        _, (params, opt_state, tokens, _) = factory(scan_layers=scan_layers)
        count = _parameter_count(params)
        print(factory.__name__, "scanned" if scan_layers else "unrolled", f"{count:,} parameters")
        assert abs(count - expected) <= 0.05 * expected
        assert count == expected  # the arithmetic above, exactly
        assert _parameter_count(opt_state) == 2 * count + 1  # mu, nu and the step counter
        assert tokens.shape == (8, 2048)
    assert 2.4e9 < T2B_PARAMETERS < 2.6e9 and 8.4e9 < T7B_PARAMETERS < 8.6e9


def test_overrides_reach_the_full_sizes():
    _, (params, _, tokens, _) = t2b(batch=2, seq=512, layers=3)
    assert tokens.shape == (2, 512) and len(params["blocks"]) == 3
    assert params["blocks"][0]["wk"].shape == (2048, 1, 256)
    assert params["embed"].dtype == jnp.bfloat16
    _, (params, *_) = t7b(scan_layers=True, dtype=jnp.float32)
    assert params["blocks"]["wq"].shape == (28, 3072, 16, 256) and params["embed"].dtype == jnp.float32
    assert gemma_train_step.__kwdefaults__["dtype"] is jnp.bfloat16


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize(("factory", "layers"), [(t2b, 18), (t7b, 28)], ids=["t2b", "t7b"])
def test_full_sizes_lower_from_shapes(factory, layers, scan_layers):
    fn, args = factory(scan_layers=scan_layers)
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    seconds = time.perf_counter() - start
    counts = op_counts(lowered.as_text())
    layout = "scanned" if scan_layers else "unrolled"
    print(f"{factory.__name__} {layout}: lowered in {seconds:.2f} s, {sum(counts.values())} ops, "
          f"{counts['stablehlo.dot_general']} dot_general")
    blocks = 1 if scan_layers else layers
    assert counts["stablehlo.dot_general"] == 3 * (9 * blocks + 1)
    assert counts["stablehlo.while"] == (2 if scan_layers else 0)
