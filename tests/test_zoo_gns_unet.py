"""The paper's GNS and U-Net training steps (``toast.examples.gns``, ``toast.examples.unet``).

For each model: the small size analyzes with no unruled op and lowers to the ops the model
promises (gathers and scatters; convolutions and attention's dot_generals); every entry of
its roles file names an argument dim; the manual strategies give valid states on a 2x2 mesh;
the full size's parameter count is the hand-computed one, and (``-m slow``) it lowers from
shapes alone.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest
from conftest import analysis_of, assert_like

import toast
from toast.examples import gns, op_counts, unet
from toast.sharding.strategies import role_colors

MODELS = {"gns": gns, "unet": unet}
FACTORIES = {"gns": (gns.gns_small, gns.gns), "unet": (unet.unet_small, unet.unet)}
STRATEGIES = ("data_parallel", "megatron", "fsdp")

# Hand-computed parameter counts. A linear layer i -> o has i*o + o; a LayerNorm or GroupNorm
# over c has 2c; a 3x3 conv i -> o has 9*i*o + o.
#
# GNS, small: Fn=8, Fe=4, L=16, Hd=32, O=3, 2 steps of 3-layer MLPs (i -> 32 -> 32 -> o):
#   node encoder  8*32+32 + 32*32+32 + 32*16+16 + 2*16 = 1904
#   edge encoder  4*32+32 + 1056 + 528 + 32              = 1776
#   per step: edge MLP 48*32+32 + 1056 + 528 + 32 = 3184, node MLP 32*32+32 + 1056 + 528 + 32 = 2672
#   processor     2 * (3184 + 2672)                      = 11712
#   decoder       16*32+32 + 1056 + 32*3+3               = 1699
#   total         1904 + 1776 + 11712 + 1699             = 17091
# GNS, full: Fn=16, Fe=4, L=2048, Hd=1024, O=3, 24 steps:
#   node encoder  16*1024+1024 + 1024*1024+1024 + 1024*2048+2048 + 2*2048 = 3170304
#   edge encoder  4*1024+1024 + 1049600 + 2099200 + 4096                   = 3158016
#   edge MLP      6144*1024+1024 + 1049600 + 2099200 + 4096                = 9445376
#   node MLP      4096*1024+1024 + 1049600 + 2099200 + 4096                = 7348224
#   processor     24 * (9445376 + 7348224)                                 = 403046400
#   decoder       2048*1024+1024 + 1049600 + 1024*3+3                      = 3150851
#   total         3170304 + 3158016 + 403046400 + 3150851                  = 412525571
#
# U-Net: a residual block i -> o with time-embedding width T has
#   rb(i, o) = 2i (norm1) + 9io+o (conv1) + To+o (temb) + 2o (norm2) + 9o*o+o (conv2)
#              [+ io+o (1x1 skip) when i != o].
# Small: C=3, base 8, T=32, widths 8, 16, one block per level, 4 heads over 16 channels:
#   time MLP 8*32+32 + 32*32+32 = 1344; conv_in 9*3*8+8 = 224; down rb(8,8) + rb(8,16) = 1464 + 4208;
#   downsample 9*8*8+8 = 584; middle 2 rb(16,16) = 2*5232; attention 4*16*16 + 6*16 = 1120;
#   up rb(32,16) + rb(24,16) + rb(24,8) + rb(16,8) = 8096 + 6800 + 2848 + 2192;
#   upsample 9*16*16+16 = 2320; out 2*8 + 9*8*3+3 = 235
#   total 1344 + 224 + 5672 + 584 + 10464 + 1120 + 19936 + 2320 + 235 = 41899
# Full: C=4, base 896, T=3584, widths a=896, b=1792, c=3584, 3 blocks per level, 32 heads:
#   time MLP 896*3584+3584 + 3584*3584+3584 = 16063488; conv_in 9*4*896+896 = 33152
#   down 3 rb(a,a) + rb(a,b) + 2 rb(b,b) + rb(b,c) + 2 rb(c,c)
#     = 3*17668224 + 51392768 + 2*64237824 + 192700928 + 2*244081152 = 913736320
#   downsample 9a*a+a + 9b*b+b = 36129408; middle 2 rb(c,c) = 488162304
#   attention 4c*c + 6c = 51401728
#   up 3 rb(2c,c) + rb(c+b,c) + rb(c+b,b) + 2 rb(2b,b) + rb(b+a,b) + rb(b+a,a) + 3 rb(2a,a)
#     = 3*385387520 + 321158656 + 131683328 + 2*99567104 + 83508992 + 34531840 + 3*26501888
#     = 2005685248
#   upsample 9c*c+c + 9b*b+b = 144512256; out 2*896 + 9*896*4+4 = 34052
#   total 16063488 + 33152 + 913736320 + 36129408 + 488162304 + 51401728 + 2005685248
#         + 144512256 + 34052 = 3655757956
PARAMETERS = {
    ("gns", "small"): 17091, ("gns", "full"): 412525571,
    ("unet", "small"): 41899, ("unet", "full"): 3655757956,
}

# What each model's lowered step must contain.
PROMISED_OPS = {
    "gns": ("stablehlo.gather", "stablehlo.scatter", "stablehlo.dot_general"),
    "unet": ("stablehlo.convolution", "stablehlo.dot_general", "stablehlo.reduce", "stablehlo.exponential"),
}


def _parameters(params) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params))


@pytest.fixture(scope="module", params=sorted(MODELS))
def small(request) -> SimpleNamespace:
    """The small step of one model: its function, arguments, lowering, analysis and roles."""
    name = request.param
    fn, args = FACTORIES[name][0]()
    lowered = jax.jit(fn).lower(*args)
    start = time.perf_counter()
    analysis = analysis_of(f"toast.examples.{name}:{name}_small")  # shared with the op-conformance suite
    print(f"{name} small: analysis {time.perf_counter() - start:.1f} s, {analysis.stats['ops']} ops")
    roles = toast.load_roles(Path(str(MODELS[name].__file__)).with_name(f"{name}.roles.toml"))
    return SimpleNamespace(name=name, fn=fn, args=args, lowered=lowered, analysis=analysis, roles=roles)


def test_small_step_has_no_unruled_ops_and_the_promised_ops(small):
    assert not small.analysis.unruled_ops, f"unruled ops: {small.analysis.unruled_ops}"
    counts = op_counts(small.lowered.as_text())
    for op in PROMISED_OPS[small.name]:
        assert counts[op] > 0, (op, counts)
    if small.name == "gns":
        # Per step, forward: 2 gathers (v[senders], v[receivers]) and 1 scatter (segment_sum);
        # backward turns each into the other: 3 of each per step, 2 steps.
        assert counts["stablehlo.gather"] == counts["stablehlo.scatter"] == 3 * 2
    else:
        # 20 convolutions (conv_in, 2 per residual block in 2 down, 2 middle and 4 up blocks, the
        # down- and up-sampler, conv_out), each with its kernel's gradient and, but conv_in,
        # its input's gradient.
        assert counts["stablehlo.convolution"] == 3 * 20 - 1
        assert counts["stablehlo.sine"] == counts["stablehlo.cosine"] == 1  # time features


def test_small_step_returns_loss_params_and_adam_state(small):
    params, opt_state = small.args[:2]
    assert set(opt_state) == {"count", "mu", "nu"}
    assert opt_state["count"].shape == () and opt_state["count"].dtype == "int32"
    loss, new_params, new_state = small.lowered.out_info
    assert loss.shape == ()
    assert_like((new_params, new_state), (params, opt_state))
    assert _parameters(params) == PARAMETERS[small.name, "small"]


def test_argument_names_read_like_the_docstrings(small):
    names = {small.analysis.program.values[v].name for v in small.analysis.program.arguments}
    expected = {
        "gns": ["params['processor'][1]['edge_w1']", "params['processor'][0]['node_ln_scale']",
                "opt_state['mu']['processor'][1]['edge_w1']", "opt_state['count']",
                "nodes", "edge_features", "senders", "receivers", "targets"],
        "unet": ["params['down'][1]['conv1_kernel']", "params['attention']['wq']",
                 "opt_state['nu']['up'][3]['skip_w']", "noisy_images", "timesteps", "noise"],
    }[small.name]
    for name in expected:
        assert name in names, (name, sorted(names)[:20])


def test_every_roles_entry_names_an_argument_dim(small):
    for role, entries in small.roles.dims.items():
        for entry in entries:
            one = toast.Roles({role: [entry]}, source=f"{small.name}.roles.toml {role} {entry}")
            assert role_colors(small.analysis, one, role)  # raises when it names nothing


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_manual_strategies_give_valid_states(small, strategy):
    model = toast.ShardingModel(small.analysis, toast.parse_mesh("batch=2,model=2"))
    state, actions = toast.manual_strategy(model, strategy, small.roles)
    assert actions
    assert model.problem(state) == ""


@pytest.mark.parametrize("name", sorted(MODELS))
def test_full_size_parameter_count(name):
    _, args = FACTORIES[name][1]()
    assert _parameters(args[0]) == PARAMETERS[name, "full"]
    assert _parameters(args[1]["mu"]) == _parameters(args[1]["nu"]) == PARAMETERS[name, "full"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_full_size_lowers_from_shapes(name):
    fn, args = FACTORIES[name][1]()
    for leaf in jax.tree_util.tree_leaves(args):
        assert isinstance(leaf, jax.ShapeDtypeStruct)
    start = time.perf_counter()
    text = jax.jit(fn).lower(*args).as_text()
    seconds = time.perf_counter() - start
    counts = op_counts(text)
    print(f"{name} full: lowered in {seconds:.1f} s, {sum(counts.values())} ops")
    for op in PROMISED_OPS[name]:
        assert counts[op] > 0, op
