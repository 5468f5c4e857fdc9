"""The MaxText-like training step (benchmarks/programs/maxtext.py) at tiny shapes: both decoder styles lower,
each attention choice lowers to its kernels (TPU Pallas for "tpu", Pallas GPU / Triton for "cuda", on this
CPU-only machine), remat "save:qkv" leaves MaxText's host-offload annotations, the op count does not grow
with the layers (a scan), toast rules and prices every op, and the maxtext.json row presets build the
published models.

Tiny shapes: ``D=128, H=4, K=2, Dh=64, F=256, V=256, L=2, B=4, S=128``; the kernels' shard_map splits the
batch over 2 shards.
"""

from __future__ import annotations

import functools
import json
import math
import re

import jax
import pytest
from conftest import assert_like

from benchmarks.programs import maxtext
from toast import Roles, ShardingModel, analyze, load_roles, manual_strategy, parse_mesh, read_text
from toast.errors import InputError
from toast.sharding.strategies import role_colors

ROLES = maxtext.__file__.replace(".py", ".roles.toml")
MT2023 = {"arch": "mt2023", "kv_heads": 4}  # multi-head attention: K = H = 4
LLAMA = {"arch": "llama"}  # grouped-query: H = 4, K = 2
KERNELS = {  # attention -> (its settings, the names of its kernels)
    "flash": ({**MT2023, "platform": "tpu"},
              ("_flash_attention_kernel", "_flash_attention_dkv_kernel", "_flash_attention_dq_kernel")),
    "splash": ({**LLAMA, "platform": "tpu"},
               ("splash_mha_fwd_residuals", "splash_mha_dkv_no_residuals", "splash_mha_dq_no_residuals")),
    "gpu_mha": ({**LLAMA, "platform": "gpu"}, ("mha_forward", "mha_preprocess_backward", "mha_backward")),
}
requires_published = pytest.mark.skipif(not maxtext.PUBLISHED.is_file(),
                                        reason="../shared/reference/published is not beside the checkout")


@functools.cache
def _text(**settings) -> str:
    return maxtext.stablehlo_text(shards=2, **settings)


@functools.cache
def _program(**settings):
    return read_text(_text(**settings))


@functools.cache
def _analysis(**settings):
    return analyze(_program(**settings), engine="embedded")


def _kernel_calls(program) -> list[str]:
    """The kernel names of the program's custom calls, in program order (annotations have none: 'None')."""
    return [str(op.attr("kernel")) for op in program.ops if op.kind == "stablehlo.custom_call"]


@pytest.mark.parametrize("arch", [MT2023, LLAMA], ids=["mt2023", "llama"])
def test_both_decoder_styles_step_to_new_params_and_state_like_the_old(arch):
    fn, (params, opt_state, tokens, targets) = maxtext.maxtext(**arch)
    loss, new_params, new_opt_state = jax.eval_shape(fn, params, opt_state, tokens, targets)
    assert (loss.shape, str(loss.dtype)) == ((), "float32")
    assert_like(new_params, params)
    assert_like(new_opt_state, opt_state)
    # mt2023 ties the logits to the embedding and has one norm per layer; llama has its own LM head and two.
    layers = set(params["layers"])
    if arch is MT2023:
        assert "lm_head" not in params and {"norm", "wi"} <= layers and "wi_0" not in layers
    else:
        assert params["lm_head"].shape == (128, 256) and {"attn_norm", "mlp_norm", "wi_0", "wi_1"} <= layers
    assert params["layers"]["wk"].shape == (2, 128, arch.get("kv_heads", 2), 64)  # [L, D, K, Dh]


@pytest.mark.parametrize("attention", sorted(KERNELS))
def test_each_kernel_attention_lowers_to_its_kernels_forward_twice_under_full_remat(attention):
    settings, names = KERNELS[attention]
    calls = _kernel_calls(_program(attention=attention, **settings))
    # Full remat saves nothing per layer: the forward kernel runs in the forward scan and again in the backward
    # scan (recomputing the layer), then the backward kernels once each.
    assert sorted(calls) == sorted([names[0], names[0], names[1], names[2]])


@pytest.mark.parametrize("attention", sorted(KERNELS))
def test_the_tpu_kernels_see_a_shard_of_the_batch_and_the_gpu_kernel_the_global_batch(attention):
    settings, names = KERNELS[attention]
    program = _program(attention=attention, **settings)
    forward = next(op for op in program.ops if op.attr("kernel") == names[0])
    q = program.values[forward.operands[2 if attention == "splash" else 0]]  # splash: 2 mask-info arrays first
    # flash and splash in a shard_map over 2 shards: batch 4 / 2, [B, H, S, Dh]; Triton's at [B, S, H, Dh].
    assert q.shape == {"flash": (2, 4, 128, 64), "splash": (2, 4, 128, 64), "gpu_mha": (4, 128, 4, 64)}[attention]


def test_dot_attention_has_no_kernel():
    assert _kernel_calls(_program(attention="dot", **LLAMA)) == []


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_save_qkv_offloads_the_three_projections_to_pinned_host_and_back(platform):
    text = _text(attention="dot", remat="save:qkv", platform=platform, **LLAMA)
    placements = re.findall(r"custom_call @annotate_device_placement\(.*_xla_buffer_placement = \"(\w+)\"", text)
    # q, k and v of the layer go to the host in the forward scan and come back in the backward scan.
    assert sorted(placements) == ["device"] * 3 + ["pinned_host"] * 3
    assert "annotate_device_placement" not in _text(attention="dot", remat="full", platform=platform, **LLAMA)


def test_on_cpu_jax_drops_the_offload():
    assert "annotate_device_placement" not in _text(attention="dot", remat="save:qkv", platform="cpu", **LLAMA)


@pytest.mark.parametrize(("attention", "settings", "remat"),
                         [("dot", LLAMA, "save:qkv"), ("flash", KERNELS["flash"][0], "full")])
def test_the_op_count_does_not_grow_with_the_layers(attention, settings, remat):
    counts = {len(_program(attention=attention, layers=layers, remat=remat, **settings).ops) for layers in (2, 5)}
    assert len(counts) == 1


ANALYZED = [("dot", MT2023, {}), ("dot", LLAMA, {}), ("flash", KERNELS["flash"][0], {"remat": "save:qkv"}),
            ("splash", KERNELS["splash"][0], {"repeat_kv": True}), ("gpu_mha", KERNELS["gpu_mha"][0], {})]


@pytest.mark.parametrize(("attention", "settings", "more"), ANALYZED,
                         ids=["dot-mt2023", "dot-llama", "flash", "splash-repeated", "gpu_mha"])
def test_toast_rules_and_prices_every_op(attention, settings, more):
    analysis = _analysis(attention=attention, **settings, **more)
    assert analysis.unruled_ops == () and analysis.unpriced_ops == () and analysis.invalid == ()


def test_grouped_query_splash_is_ruled_with_the_key_value_heads_grouped_under_the_querys():
    # As MaxText calls it: k and v with their own K = 2 heads against the query's H = 4 (no repeat).
    analysis = _analysis(attention="splash", **KERNELS["splash"][0])
    assert analysis.unruled_ops == () and analysis.unpriced_ops == () and analysis.invalid == ()
    program = analysis.program
    forward = next(op for op in program.ops if op.attr("kernel") == "splash_mha_fwd_residuals")
    q, k, v = (program.values[forward.operands[i]] for i in (2, 3, 4))  # after the 2 mask-info arrays
    assert (q.shape, k.shape, v.shape) == ((2, 4, 128, 64), (2, 2, 128, 64), (2, 2, 128, 64))
    # The query's heads and the keys' are one name (split together, by a divisor of K).
    heads = {int(analysis.color_of[analysis.names.use_name(forward.id, operand, 1)]) for operand in (2, 3, 4)}
    assert len(heads) == 1


@pytest.mark.parametrize("arch", [MT2023, LLAMA], ids=["mt2023", "llama"])
def test_the_roles_file_names_every_role_in_both_archs(arch):
    analysis = _analysis(attention="dot", **arch)
    roles = load_roles(ROLES)
    for role in ("batch", "sequence", "heads", "mlp"):
        assert role_colors(analysis, roles, role)
    # FSDP (the runs' strategy) on 2 devices: the batch split, every parameter stored split.
    model = ShardingModel(analysis, parse_mesh("data=2"))
    state, actions = manual_strategy(model, "fsdp", roles)
    assert len(actions) > 1 and state != model.initial()
    assert manual_strategy(model, "fsdp", Roles({"batch": [("tokens", 0)]}))[0] != model.initial()


@pytest.mark.parametrize(("settings", "message"), [
    ({"attention": "ring"}, "attention 'ring': give one of dot, flash, splash, gpu_mha"),
    ({"attention": "flash"}, "attention flash is a tpu kernel; give platform=tpu (got cpu)"),
    ({"attention": "gpu_mha", "platform": "tpu"}, "attention gpu_mha is a gpu kernel; give platform=gpu (got tpu)"),
    ({"arch": "mt2023"}, "arch mt2023 is multi-head attention: kv_heads (2) must equal heads (4)"),
    ({"kv_heads": 3}, "need kv_heads | heads and an even head_dim; got heads=4, kv_heads=3, head_dim=64"),
    ({"layers": 0}, "layers 0: give a whole number, 1 or more"),
    ({"shards": 3}, "splits the batch (4) over 3 shards, which do not divide it"),
    ({"attention": "splash", "platform": "tpu", "seq": 192}, "seq 192 is not a multiple of 128"),
    ({"remat": "minimal"}, "remat 'minimal': give one of full, save:qkv"),
])
def test_bad_settings_are_one_input_error_line(settings, message):
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        maxtext.maxtext(**settings)
    assert "\n" not in str(caught.value)


# maxtext.json's rows at their global shapes: the json's settings, word for word.
ROW_SETTINGS = {
    "T6": ("mt2023", "flash", "full", "tpu", 256, 1536),
    "T15": ("mt2023", "dot", "full", "tpu", 128, 2048),
    "T11": ("llama", "splash", "save:qkv", "tpu", 256, 512),
    "G1": ("llama", "gpu_mha", "full", "gpu", 128, 256),
}


@requires_published
@pytest.mark.parametrize("row_id", sorted(ROW_SETTINGS))
def test_a_row_preset_builds_the_published_model_with_its_parameter_count(row_id):
    settings = maxtext.row_settings(row_id)
    assert tuple(settings[k] for k in ("arch", "attention", "remat", "platform", "shards", "batch")) == \
        ROW_SETTINGS[row_id]
    _, (params, *_) = maxtext.row(row_id)
    published = {entry["id"]: entry for entry in json.loads(maxtext.PUBLISHED.read_text())["rows"]}
    # The json's N (its authors' count from MaxText's config: the tied embedding once) is this program's.
    assert sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params)) == \
        published[row_id]["config"]["params"]


@pytest.mark.slow  # a global-shape lowering per row; the tiny programs show the same without the json
@requires_published
@pytest.mark.parametrize("row_id", ["T6", "T15"])
def test_a_row_lowers_to_the_op_count_of_the_tiny_program(row_id):
    settings = maxtext.row_settings(row_id)
    tiny = {"arch": settings["arch"], "attention": settings["attention"], "remat": settings["remat"],
            "platform": settings["platform"]}
    if settings["arch"] == "mt2023":
        tiny["kv_heads"] = 4
    assert len(read_text(maxtext.row_text(row_id)).ops) == len(_program(**tiny).ops)


def test_an_unknown_row_is_one_error_line_and_exit_2(tmp_path, capsys):
    published = tmp_path / "maxtext.json"
    published.write_text(json.dumps({"rows": [{"id": "T6"}]}))
    assert maxtext.main(["--row", "T7", "--published", str(published), "-o", str(tmp_path / "t7.mlir")]) == 2
    assert capsys.readouterr().err == "toast: error: maxtext: no row 'T7' in maxtext.json (rows: T6)\n"
    assert not (tmp_path / "t7.mlir").exists()
