"""Fused kernels are ops of their own (rules/ops/kernels.dl): a Pallas TPU kernel (@tpu_custom_call, its
kernel_name) and a Pallas GPU / Triton kernel (@__gpu$xla.gpu.triton, the name in its backend_config) get
identities, a kernel class and FLOPs from the rules, priced per device.

The programs are jax's own attention kernels, lowered here on a CPU-only machine (``lowering_platforms``: the
TPU kernels for "tpu", the Triton ones for "cuda"; neither needs the accelerator to lower) at small shapes:
batch 2, heads 2, sequence 128, head dim 64, f32. FLOPs are read back as the seconds at peak of each kernel on
a profile of 1e12 FLOP/s, and worked out by hand: an attention forward does 4 x B x H x Sq x Sk x D (Q K^T and
P V); the TPU dK dV kernel 8 x (Q K^T, dO V^T, P^T dO, dS^T Q), its dQ kernel 6 x (Q K^T, dO V^T, dS K), the
Triton backward 14 x (both loops). A kernel that carries its own cost_estimate (the TPU forward) is priced by it.

cuDNN's fused attention (@__cudnn$fmha*) lowers only where cuDNN is present: its programs are fixtures lowered on an
H100 (tests/fixtures/kernels, benchmarks/gpu_attention.py, jax 0.11.2; the calls are the same under this machine's
jax), priced at half the square where the call's mask_type is causal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ONE_LEVEL, engines, round_numbers_profile
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.gpu import attention as gpu_attention
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash

from toast import CostModel, ShardingModel, analyze, load_hardware, parse_mesh
from toast.errors import InputError, InvalidRules
from toast.facts.writer import program_facts
from toast.frontend.stablehlo import read_text
from toast.sharding.state import Action, InvalidState

B, H, S, D = 2, 2, 128, 64
SQUARE = B * H * S * S * D  # 4194304: one of the attention matmuls
TPU_QKV = [jax.ShapeDtypeStruct((B, H, S, D), jnp.float32)] * 3  # [batch, heads, seq, head dim]
GPU_QKV = [jax.ShapeDtypeStruct((B, S, H, D), jnp.float32)] * 3  # [batch, seq, heads, head dim]


def _tpu_flash_grad(q, k, v):
    return jax.grad(lambda q, k, v: tpu_flash.flash_attention(q, k, v).sum(), argnums=(0, 1, 2))(q, k, v)


def _gpu_mha_grad(q, k, v):
    return jax.grad(lambda q, k, v: gpu_attention.mha(q, k, v, segment_ids=None).sum(), argnums=(0, 1, 2))(q, k, v)


@pytest.fixture(scope="module")
def tpu_text() -> str:
    return jax.jit(_tpu_flash_grad).trace(*TPU_QKV).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)


@pytest.fixture(scope="module")
def gpu_text() -> str:
    # The Triton kernels lower for "cuda" on a machine without a GPU (no cuDNN call is made: jax's cuDNN
    # attention is a separate op, and would need cuDNN present).
    return jax.jit(_gpu_mha_grad).trace(*GPU_QKV).lower(lowering_platforms=("cuda",)).as_text(debug_info=True)


@pytest.fixture(scope="module")
def unit(tmp_path_factory):
    path = tmp_path_factory.mktemp("hw") / "unit.toml"
    path.write_text(round_numbers_profile("unit", ONE_LEVEL))
    return load_hardware(str(path))


def _kernels(analysis) -> dict[str, int]:
    """kernel name -> op id of the program's kernel calls."""
    return {str(op.attr("kernel")): op.id for op in analysis.program.ops if op.kind == "stablehlo.custom_call"}


def _work(analysis, unit, op_ids: dict[str, int], mesh: str = "d=1", shard: tuple[str, int] | None = None
          ) -> tuple[dict[str, float], dict[str, float], list]:
    """FLOPs and bytes per device of each kernel (its seconds at peak x 1e12, the bytes it moves) and the
    collectives, with the color of ``shard`` = (argument, dim) split along d."""
    model = ShardingModel(analysis, parse_mesh(mesh))
    state = model.initial()
    if shard is not None:
        state = model.apply(state, Action(int(analysis.color_of[analysis.dim_name(*shard)]), "d"))
    cost = CostModel(model, unit)
    at_peak, moved, _ = cost.kernel_work(state)
    kernels = {name: int(cost.plan.kernel_of_op[op]) for name, op in op_ids.items()}
    return ({name: float(at_peak[k]) * 1e12 for name, k in kernels.items()},
            {name: float(moved[k]) for name, k in kernels.items()}, cost.communication.collectives(state))


def _flops(analysis, unit, op_ids: dict[str, int], mesh: str = "d=1", shard: tuple[str, int] | None = None
           ) -> tuple[dict[str, float], list]:
    """FLOPs per device of each kernel and the collectives (``_work``)."""
    flops, _, collectives = _work(analysis, unit, op_ids, mesh, shard)
    return flops, collectives


def test_a_kernel_call_is_read_with_its_name_and_its_cost_estimate(tpu_text, gpu_text):
    program = read_text(tpu_text)
    calls = [op for op in program.ops if op.kind == "stablehlo.custom_call"]
    assert [op.attr("kernel") for op in calls] == [
        "_flash_attention_kernel", "_flash_attention_dkv_kernel", "_flash_attention_dq_kernel"]
    # The forward's backend_config (a JSON string) carries the estimate; the backward kernels carry none.
    flops = int(re.search(r"\\22flops\\22:(\d+)", tpu_text).group(1))
    assert calls[0].attr("kernel_cost_estimate")[0] == flops
    assert [op.attr("kernel_cost_estimate") for op in calls[1:]] == [None, None]
    # The Triton kernels name themselves in a dictionary attribute (mhlo.backend_config).
    assert [op.attr("kernel") for op in read_text(gpu_text).ops if op.kind == "stablehlo.custom_call"] == [
        "mha_forward", "mha_preprocess_backward", "mha_backward"]


@pytest.mark.parametrize("engine", engines())
def test_tpu_flash_kernels_are_ruled_priced_and_split_by_batch_heads_and_one_sequence(engine, tpu_text, unit):
    analysis = analyze(read_text(tpu_text), engine=engine)
    assert analysis.invalid == () and analysis.unpriced_ops == ()
    assert [u for u in analysis.unruled_ops if "custom_call" in u.kind] == []
    ops = _kernels(analysis)
    estimate = int(re.search(r"\\22flops\\22:(\d+)", tpu_text).group(1))
    # jax's estimate counts the two matmuls (4 x SQUARE) and a little softmax work besides.
    assert 4 * SQUARE < estimate < 1.01 * 4 * SQUARE

    whole, collectives = _flops(analysis, unit, ops)
    assert whole == pytest.approx({"_flash_attention_kernel": estimate, "_flash_attention_dkv_kernel": 8 * SQUARE,
                                   "_flash_attention_dq_kernel": 6 * SQUARE})
    assert collectives == []

    # Heads split: every kernel does half, no collective.
    heads, collectives = _flops(analysis, unit, ops, "d=2", ("q", 1))
    assert heads == pytest.approx({name: flops / 2 for name, flops in whole.items()})
    assert collectives == []

    # The query sequence split: the forward and dQ kernels halve; dK dV reads every query row (q, dO and the
    # statistics are all-gathered for it) and does all its work on each device.
    seq, collectives = _flops(analysis, unit, ops, "d=2", ("q", 2))
    assert seq == pytest.approx({"_flash_attention_kernel": estimate / 2, "_flash_attention_dkv_kernel": 8 * SQUARE,
                                 "_flash_attention_dq_kernel": 3 * SQUARE})
    gathered = {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}
    dkv = ops["_flash_attention_dkv_kernel"]
    assert {(dkv, 0), (dkv, 5)} <= gathered  # q and dO
    assert not {(ops["_flash_attention_kernel"], k) for k in range(3)} & gathered

    # The key sequence split: the forward reads k and v whole (all-gathered), dK dV halves.
    keys, collectives = _flops(analysis, unit, ops, "d=2", ("k", 2))
    assert keys == pytest.approx({"_flash_attention_kernel": estimate, "_flash_attention_dkv_kernel": 4 * SQUARE,
                                  "_flash_attention_dq_kernel": 6 * SQUARE})
    forward = ops["_flash_attention_kernel"]
    assert {(forward, 1), (forward, 2)} <= {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}


# Flash attention with segment ids (as MaxText passed them): q, k, v [2, 2, 256, 64] f32 (a sequence of 256, not the 128
# lanes of the ids' broadcast), ids [2, 256] int32 arguments. Each kernel takes them after q, k, v: the query's
# broadcast along the lanes [2, 256, 128], the keys' along the sublanes [2, 8, 256].
SEG_S = 256
SEG_SQUARE = B * H * SEG_S * SEG_S * D  # 16777216
SEG_QKV = [jax.ShapeDtypeStruct((B, H, SEG_S, D), jnp.float32)] * 3 + [jax.ShapeDtypeStruct((B, SEG_S), jnp.int32)] * 2
# Bytes: q, k, v, o, dO, dQ, dK, dV [2, 2, 256, 64] f32; the ids [2, 256, 128] and [2, 8, 256] i32; the statistics
# l, m and di [2, 2, 256, 128] f32.
SEG_TENSOR, SEG_Q_IDS, SEG_KV_IDS, SEG_STATS = B * H * SEG_S * D * 4, B * SEG_S * 128 * 4, B * 8 * SEG_S * 4, \
    B * H * SEG_S * 128 * 4  # 262144, 262144, 16384, 524288


def _tpu_flash_segments_grad(q, k, v, q_ids, kv_ids):
    segments = tpu_flash.SegmentIds(q=q_ids, kv=kv_ids)
    return jax.grad(lambda q, k, v: tpu_flash.flash_attention(q, k, v, segment_ids=segments).sum(),
                    argnums=(0, 1, 2))(q, k, v)


@pytest.fixture(scope="module")
def segments_text() -> str:
    return jax.jit(_tpu_flash_segments_grad).trace(*SEG_QKV).lower(lowering_platforms=("tpu",)).as_text(
        debug_info=True)


@pytest.mark.parametrize("engine", engines())
def test_tpu_flash_with_segment_ids_is_the_same_kernel_its_ids_split_with_q_and_k(engine, segments_text, unit):
    analysis = analyze(read_text(segments_text), engine=engine)
    assert analysis.invalid == () and analysis.unpriced_ops == ()
    assert [u for u in analysis.unruled_ops if "custom_call" in u.kind] == []
    ops = _kernels(analysis)
    operands = {name: [analysis.program.values[v].shape for v in analysis.program.ops[op].operands]
                for name, op in ops.items()}
    assert operands["_flash_attention_kernel"][3:] == [(B, SEG_S, 128), (B, 8, SEG_S)]
    assert len(operands["_flash_attention_dkv_kernel"]) == len(operands["_flash_attention_dq_kernel"]) == 9
    estimate = int(re.search(r"\\22flops\\22:(\d+)", segments_text).group(1))
    assert 4 * SEG_SQUARE < estimate < 1.02 * 4 * SEG_SQUARE

    # FLOPs as without the ids (the forward's own estimate); bytes: the ids besides q, k, v and the statistics.
    flops, moved, collectives = _work(analysis, unit, ops)
    assert flops == pytest.approx({"_flash_attention_kernel": estimate, "_flash_attention_dkv_kernel": 8 * SEG_SQUARE,
                                   "_flash_attention_dq_kernel": 6 * SEG_SQUARE})
    ids = SEG_Q_IDS + SEG_KV_IDS
    backward = 3 * SEG_TENSOR + ids + 3 * SEG_STATS + SEG_TENSOR  # q, k, v, the ids, l, m, dO, di
    assert moved == {"_flash_attention_kernel": 4 * SEG_TENSOR + ids + 2 * SEG_STATS,  # -> o, l, m
                     "_flash_attention_dkv_kernel": backward + 2 * SEG_TENSOR, "_flash_attention_dq_kernel":
                     backward + SEG_TENSOR}
    assert moved["_flash_attention_kernel"] == 2375680 and collectives == []

    # The ids' batch and sequence dims are q's and k's.
    color = analysis.color_of
    for ids_arg, seq_of in (("q_ids", "q"), ("kv_ids", "k")):
        assert color[analysis.dim_name(ids_arg, 0)] == color[analysis.dim_name("q", 0)]
        assert color[analysis.dim_name(ids_arg, 1)] == color[analysis.dim_name(seq_of, 2)]
    # The batch: every kernel halves, no collective.
    batch, _, collectives = _work(analysis, unit, ops, "d=2", ("q", 0))
    assert batch == pytest.approx({name: value / 2 for name, value in flops.items()}) and collectives == []
    # The query sequence (with the query's ids): the forward and dQ halve; dK dV gathers q, its ids and the statistics.
    seq, _, collectives = _work(analysis, unit, ops, "d=2", ("q", 2))
    assert seq == pytest.approx({"_flash_attention_kernel": estimate / 2, "_flash_attention_dkv_kernel": 8 * SEG_SQUARE,
                                 "_flash_attention_dq_kernel": 3 * SEG_SQUARE})
    gathered = {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}
    dkv, forward = ops["_flash_attention_dkv_kernel"], ops["_flash_attention_kernel"]
    assert {(dkv, 0), (dkv, 3)} <= gathered and not {(forward, k) for k in range(5)} & gathered
    # The key sequence (with the keys' ids): dK dV halves; the forward gathers k, v and the keys' ids.
    keys, _, collectives = _work(analysis, unit, ops, "d=2", ("kv_ids", 1))
    assert keys == pytest.approx({"_flash_attention_kernel": estimate, "_flash_attention_dkv_kernel": 4 * SEG_SQUARE,
                                  "_flash_attention_dq_kernel": 6 * SEG_SQUARE})
    gathered = {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}
    assert {(forward, 1), (forward, 2), (forward, 4)} <= gathered and not {(dkv, k) for k in range(5)} & gathered


@pytest.mark.parametrize("engine", engines())
def test_triton_mha_kernels_are_priced_by_the_rules_formula(engine, gpu_text, unit):
    analysis = analyze(read_text(gpu_text), engine=engine)
    assert analysis.invalid == () and analysis.unpriced_ops == ()
    ops = _kernels(analysis)
    whole, _ = _flops(analysis, unit, ops)
    # No cost_estimate: 4 x SQUARE forward, 14 x SQUARE backward, no FLOPs for the preprocessing (bytes only).
    assert whole == pytest.approx({"mha_forward": 4 * SQUARE, "mha_preprocess_backward": 0,
                                   "mha_backward": 14 * SQUARE})
    heads, collectives = _flops(analysis, unit, ops, "d=2", ("q", 2))  # [batch, seq, heads, dim]
    assert heads == pytest.approx({name: flops / 2 for name, flops in whole.items()})
    assert collectives == []
    # The query sequence: the forward halves; the backward reduces over it, so reads it whole.
    seq, collectives = _flops(analysis, unit, ops, "d=2", ("q", 1))
    assert seq == pytest.approx({"mha_forward": 2 * SQUARE, "mha_preprocess_backward": 0,
                                 "mha_backward": 14 * SQUARE})
    assert (ops["mha_backward"], 0) in {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}


# A kernel of the user's: a Pallas TPU matmul of its rows, x [256, 128] @ w [128, 128].
def _rows_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...])


def _my_rows(x, w):
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype)
    return pl.pallas_call(_rows_kernel, out_shape=out, name="my_rows")(x, w)


ROWS_ARGS = [jax.ShapeDtypeStruct((256, 128), jnp.float32), jax.ShapeDtypeStruct((128, 128), jnp.float32)]
MY_ROWS = """\
kernel_form("tpu_custom_call", "my_rows", 2, __FILE__, __LINE__).
kernel_dim("tpu_custom_call", "my_rows", 2, "operand", 0, 0, "rows").
kernel_dim("tpu_custom_call", "my_rows", 2, "result", 0, 0, "rows").
kernel_splits("tpu_custom_call", "my_rows", "rows").
kernel_flops("tpu_custom_call", "my_rows", 2).
kernel_flop_dim("tpu_custom_call", "my_rows", 2, 0, 0).
kernel_flop_dim("tpu_custom_call", "my_rows", 2, 0, 1).
kernel_flop_dim("tpu_custom_call", "my_rows", 2, 1, 1).
kernel_call_class("tpu_custom_call", "my_rows", "library").
"""


@pytest.fixture(scope="module")
def rows_text() -> str:
    return jax.jit(_my_rows).trace(*ROWS_ARGS).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)


def _rules(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "my_rows.dl").write_text(text)
    return folder


@pytest.mark.parametrize("engine", ["embedded"])
def test_a_users_kernel_is_added_by_a_rule_file_and_an_unknown_one_stays_unpriced(engine, rows_text, unit, tmp_path):
    bare = analyze(read_text(rows_text), engine=engine)
    assert [u.kind for u in bare.unpriced_ops] == ["stablehlo.custom_call @tpu_custom_call"]
    assert [u.kind for u in bare.unruled_ops] == ["stablehlo.custom_call @tpu_custom_call"]
    assert _kernels(bare) == {"my_rows": 0} and bare.flop_scales == {}

    analysis = analyze(read_text(rows_text), engine=engine, rules=_rules(tmp_path, MY_ROWS))
    assert analysis.unpriced_ops == () and analysis.unruled_ops == () and analysis.invalid == ()
    ops = _kernels(analysis)
    # 2 x rows x 128 x 128: 8388608 on one device; the rows split on two, the other dims whole.
    assert _flops(analysis, unit, ops)[0] == pytest.approx({"my_rows": 2 * 256 * 128 * 128})
    rows, collectives = _flops(analysis, unit, ops, "d=2", ("x", 0))
    assert rows == pytest.approx({"my_rows": 2 * 128 * 128 * 128}) and collectives == []
    # Its inner dim is not split: sharded, x's columns are all-gathered for the kernel.
    inner, collectives = _flops(analysis, unit, ops, "d=2", ("x", 1))
    assert inner == pytest.approx({"my_rows": 2 * 256 * 128 * 128})
    assert [(c.kind, c.operand) for c in collectives] == [("all-gather", 0)]


@pytest.mark.parametrize(("extra", "check", "detail"), [
    # A dim operand 1 ([128, 128]) lacks.
    ('kernel_dim("tpu_custom_call", "my_rows", 2, "operand", 1, 2, "cols").\n', "kernel_dim",
     "op 0 (my_rows of @tpu_custom_call): its operand 1 has no dim 2"),
    # An operand the form of 2 operands lacks.
    ('kernel_dim("tpu_custom_call", "my_rows", 2, "operand", 2, 0, "rows").\n', "kernel_dim_operand",
     "my_rows of @tpu_custom_call: no operand 2 in a form of 2 operands"),
    # x's 128 columns as the 256 rows.
    ('kernel_dim("tpu_custom_call", "my_rows", 2, "operand", 0, 1, "rows").\n', "kernel_role_size",
     "op 0 (my_rows of @tpu_custom_call): rows dims of 128 and 256 elements"),
])
def test_a_kernel_rule_that_contradicts_the_operands_is_invalid_at_its_file_and_line(
        extra, check, detail, rows_text, tmp_path):
    rules = _rules(tmp_path, MY_ROWS + extra)
    analysis = analyze(read_text(rows_text), engine="embedded", rules=rules, check_invariants=False)
    found = {(row.check, Path(row.file).name, row.line, row.detail) for row in analysis.invalid}
    assert found == {(check, "my_rows.dl", 1, detail)}  # line 1: its kernel_form row
    with pytest.raises(InvalidRules, match=re.escape("my_rows.dl:1")):
        analyze(read_text(rows_text), engine="embedded", rules=rules)


def test_kernel_ops_of_no_known_form_stay_unpriced(unit):
    # Flash attention with a bias (ab) has 4 operands: no form of the bundled rules, so it is reported.
    def forward(q, k, v, ab):
        return tpu_flash.flash_attention(q, k, v, ab=ab)

    bias = jax.ShapeDtypeStruct((B, H, S, S), jnp.float32)
    text = jax.jit(forward).trace(*TPU_QKV, bias).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)
    analysis = analyze(read_text(text), engine="embedded")
    assert [u.kind for u in analysis.unpriced_ops] == ["stablehlo.custom_call @tpu_custom_call"]
    assert analysis.flop_scales == {} and analysis.invalid == ()
    assert np.all(np.isfinite(CostModel(ShardingModel(analysis, parse_mesh("d=1")), unit).kernel_work(
        ShardingModel(analysis, parse_mesh("d=1")).initial())[1]))


def _my_rows_estimated(x, w):
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype)
    estimate = pl.CostEstimate(flops=1_000_000, transcendentals=0, bytes_accessed=0)
    return pl.pallas_call(_rows_kernel, out_shape=out, name="my_rows", cost_estimate=estimate)(x, w)


@pytest.fixture(scope="module")
def estimated_text() -> str:
    return jax.jit(_my_rows_estimated).trace(*ROWS_ARGS).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)


def test_a_kernels_own_cost_estimate_is_divided_by_the_dims_it_splits(estimated_text, unit, tmp_path):
    analysis = analyze(read_text(estimated_text), engine="embedded", rules=_rules(tmp_path, MY_ROWS))
    ops = _kernels(analysis)
    # The estimate, not the formula (2 x 256 x 128 x 128); halved where its rows split.
    assert _flops(analysis, unit, ops)[0] == pytest.approx({"my_rows": 1e6})
    assert _flops(analysis, unit, ops, "d=2", ("x", 0))[0] == pytest.approx({"my_rows": 5e5})
    # A kernel that splits nothing does all of its estimate on every device.
    unsplit = MY_ROWS.replace('kernel_splits("tpu_custom_call", "my_rows", "rows").\n', "")
    analysis = analyze(read_text(estimated_text), engine="embedded", rules=_rules(tmp_path, unsplit))
    assert _flops(analysis, unit, ops, "d=2", ("x", 0))[0] == pytest.approx({"my_rows": 1e6})


def test_a_malformed_cost_estimate_is_one_error_line(estimated_text):
    bad = estimated_text.replace("\\22flops\\22:1000000", "\\22flops\\22:-5")
    assert bad != estimated_text
    with pytest.raises(InputError, match=r"custom_call cost_estimate .* is not a set of non-negative integer counts"):
        read_text(bad)


# Splash attention as MaxText calls it: the kernel vmapped over the batch, inside a jax.shard_map over a mesh
# with the batch and heads split 2 ways each; a causal mask. Global q, k, v [8, 4, 256, 64] bf16: each device's
# kernels see [4, 2, 256, 64] (a vmapped batch of 4, 2 heads).
SPLASH_B, SPLASH_H = 8, 4
SPLASH_QKV = [jax.ShapeDtypeStruct((SPLASH_B, SPLASH_H, 256, D), jnp.bfloat16)] * 3


@pytest.fixture(scope="module")
def splash_text() -> str:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
    from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

    mesh = AbstractMesh((2, 2), ("data", "heads"), axis_types=(AxisType.Auto, AxisType.Auto))
    blocks = splash.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128, block_kv_dkv=128,
                               block_kv_dkv_compute=128, block_q_dq=128, block_kv_dq=128)
    mask = splash_mask.MultiHeadMask(masks=(splash_mask.CausalMask(shape=(256, 256)),) * SPLASH_H)
    kernel = splash.make_splash_mha(mask=mask, head_shards=2, q_seq_shards=1, block_sizes=blocks)
    kernel_spec = kernel.manual_sharding_spec(NamedSharding(mesh, PartitionSpec("heads", None)))
    qkv = PartitionSpec("data", "heads", None, None)

    def attend(q, k, v, kernel):
        return jax.vmap(kernel)(q, k, v)

    sharded = jax.shard_map(attend, mesh=mesh, in_specs=(qkv, qkv, qkv, kernel_spec), out_specs=qkv, check_vma=False)

    def grad(q, k, v):
        return jax.grad(lambda q, k, v: sharded(q, k, v, kernel).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(grad).trace(*SPLASH_QKV).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)


def test_splash_kernels_in_shard_map_are_ruled_and_priced_per_device_at_the_querys_type(splash_text, tmp_path):
    analysis = analyze(read_text(splash_text), engine="embedded")
    assert analysis.invalid == () and analysis.unpriced_ops == ()
    assert [u for u in analysis.unruled_ops if "custom_call" in u.kind] == []
    ops = _kernels(analysis)
    assert set(ops) == {"splash_mha_fwd_residuals", "splash_mha_dkv_no_residuals", "splash_mha_dq_no_residuals"}
    program = analysis.program
    for op in ops.values():  # operand 0 is the int8 mask info; q (operand 2) is bf16, [local batch, heads, seq, dim]
        operands = [program.values[v] for v in program.ops[op].operands]
        assert (operands[0].dtype, operands[2].dtype, operands[2].shape) == ("i8", "bf16", (4, 2, 256, D))
    # A profile whose bf16 peak (2e12) is not the int8 (f32) one (1e12): FLOPs = seconds at peak x 2e12 only when
    # priced at q's type (operand 0's would read double).
    path = tmp_path / "bf16.toml"
    path.write_text(round_numbers_profile("bf16", ONE_LEVEL).replace("bf16 = 1e12", "bf16 = 2e12"))
    bf16 = load_hardware(str(path))
    local = 4 * 2 * 256 * 256 * D  # 33554432: one attention matmul on one device (batch 4, heads 2)
    whole, collectives = _flops(analysis, bf16, ops, "d=2")
    flops = {name: value / 1e12 * 2e12 for name, value in whole.items()}
    assert flops == pytest.approx({"splash_mha_fwd_residuals": 4 * local, "splash_mha_dkv_no_residuals": 8 * local,
                                   "splash_mha_dq_no_residuals": 6 * local})
    # The causal mask is in the mask-info operands' contents, which toast does not read: the full square is priced.
    assert 4 * local == 134217728 and collectives == []
    # The kernels' shapes are already per device: splitting the global batch (outside the region) along d leaves
    # their FLOPs alone, and their local batch is a color of its own (not the global dim's, split again).
    split, _ = _flops(analysis, bf16, ops, "d=2", ("q", 0))
    assert split == pytest.approx(whole)
    fwd = ops["splash_mha_fwd_residuals"]
    assert analysis.color_of[analysis.names.use_name(fwd, 2, 0)] != analysis.color_of[analysis.dim_name("q", 0)]
    # Within the region the kernel splits its vmapped batch and heads (one color with the forward's output's).
    out = program.ops[fwd].results[3]
    assert analysis.color_of[analysis.names.use_name(fwd, 2, 1)] == analysis.color_of[analysis.names.def_base[out] + 1]


# Grouped-query splash attention (make_splash_mha, as MaxText calls it without repeating k and v): q [2, 4, 256, 64],
# k and v [2, 2, 256, 64] bf16 (4 query heads over 2 key/value heads), the kernel vmapped over the batch, a causal
# mask, blocks of 128 (the mask info [1, 2, 2]: one mask for every head, 2 q blocks, 2 kv blocks); forward and
# backward. Operands: the 2 mask-info arrays, q, k, v, ...
GQA_B, GQA_H, GQA_K, GQA_S = 2, 4, 2, 256
GQA_SQUARE = GQA_B * GQA_H * GQA_S * GQA_S * D  # 33554432: one attention matmul of the 4 query heads
# Bytes: q, o, dO, dQ [2, 4, 256, 64] bf16; k, v, dK, dV [2, 2, 256, 64] bf16 (their own 2 heads); the mask info
# 2 x [1, 2, 2] i8; the forward's logsumexp [2, 4, 256, 128] f32, the backward's logsumexp and di [2, 4, 8, 256]
# (dK dV) and [2, 4, 1, 256] (dQ) f32; the mask's q_sequence [256, 128] i32 (forward, dQ) and [8, 256] (dK dV).
# The kernels' scratch results are unused: not written.
GQA_Q, GQA_KV, GQA_MASK = GQA_B * GQA_H * GQA_S * D * 2, GQA_B * GQA_K * GQA_S * D * 2, 2 * 4  # 262144, 131072, 8


def _gqa_splash_grad(q, k, v):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

    blocks = splash.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128, block_kv_dkv=128,
                               block_kv_dkv_compute=128, block_q_dq=128, block_kv_dq=128)
    mask = splash_mask.MultiHeadMask(masks=(splash_mask.CausalMask(shape=(GQA_S, GQA_S)),) * GQA_H)
    kernel = splash.make_splash_mha(mask=mask, head_shards=1, q_seq_shards=1, block_sizes=blocks)
    return jax.grad(lambda q, k, v: jax.vmap(kernel)(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)


@pytest.fixture(scope="module")
def gqa_splash_text() -> str:
    q = jax.ShapeDtypeStruct((GQA_B, GQA_H, GQA_S, D), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((GQA_B, GQA_K, GQA_S, D), jnp.bfloat16)
    return jax.jit(_gqa_splash_grad).trace(q, kv, kv).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)


@pytest.mark.parametrize("engine", engines())
def test_grouped_query_splash_prices_the_query_heads_and_splits_them_with_the_key_value_heads(
        engine, gqa_splash_text, unit):
    analysis = analyze(read_text(gqa_splash_text), engine=engine)
    assert analysis.invalid == () and analysis.unpriced_ops == ()
    assert [u for u in analysis.unruled_ops if "custom_call" in u.kind] == []
    ops = _kernels(analysis)
    fwd, dkv, dq = "splash_mha_fwd_residuals", "splash_mha_dkv_no_residuals", "splash_mha_dq_no_residuals"
    assert set(ops) == {fwd, dkv, dq}
    program = analysis.program
    assert [program.values[v].shape for v in program.ops[ops[fwd]].operands][:5] == [
        (1, 2, 2), (1, 2, 2), (GQA_B, GQA_H, GQA_S, D), (GQA_B, GQA_K, GQA_S, D), (GQA_B, GQA_K, GQA_S, D)]

    # FLOPs of the 4 query heads (the unit profile's bf16 peak is 1e12, no cost estimate); k and v at their own size.
    flops, moved, collectives = _work(analysis, unit, ops)
    assert flops == pytest.approx({fwd: 4 * GQA_SQUARE, dkv: 8 * GQA_SQUARE, dq: 6 * GQA_SQUARE})
    assert moved == {
        fwd: GQA_MASK + GQA_Q + 2 * GQA_KV + GQA_S * 128 * 4 + GQA_Q + GQA_B * GQA_H * GQA_S * 128 * 4,  # -> o, lse
        dkv: GQA_MASK + GQA_Q + 2 * GQA_KV + 2 * GQA_B * GQA_H * 8 * GQA_S * 4 + GQA_Q + 8 * GQA_S * 4 + 2 * GQA_KV,
        dq: GQA_MASK + GQA_Q + 2 * GQA_KV + 2 * GQA_B * GQA_H * GQA_S * 4 + GQA_Q + GQA_S * 128 * 4 + GQA_Q}
    assert moved[fwd] == 1966088 and collectives == []

    # The query heads split with the key/value heads (query head h reads key/value head h // 2): half of every
    # kernel's work, no collective.
    color = analysis.color_of
    assert color[analysis.dim_name("q", 1)] == color[analysis.dim_name("k", 1)] == color[analysis.dim_name("v", 1)]
    heads, _, collectives = _work(analysis, unit, ops, "d=2", ("q", 1))
    assert heads == pytest.approx({name: value / 2 for name, value in flops.items()}) and collectives == []
    # Over 4 devices a device would hold half a key/value head.
    model = ShardingModel(analysis, parse_mesh("d=4"))
    with pytest.raises(InvalidState, match=re.escape("k[1] has 2 elements, not divisible by the 4 devices")):
        model.apply(model.initial(), Action(int(color[analysis.dim_name("q", 1)]), "d"))

    # The query sequence: the forward and dQ halve (their mask info's q blocks split with it); dK dV reads every query
    # row (q, dO and the statistics are gathered for it).
    seq, _, collectives = _work(analysis, unit, ops, "d=2", ("q", 2))
    assert seq == pytest.approx({fwd: 2 * GQA_SQUARE, dkv: 8 * GQA_SQUARE, dq: 3 * GQA_SQUARE})
    gathered = {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}
    assert {(ops[dkv], 2), (ops[dkv], 6)} <= gathered
    assert not {(ops[op], k) for op in (fwd, dq) for k in range(6)} & gathered
    # An axis splitting the query sequence divides the 2 q blocks: 4 devices would split a block.
    with pytest.raises(InvalidState, match="has 2 elements, not divisible by the 4 devices"):
        model.apply(model.initial(), Action(int(color[analysis.dim_name("q", 2)]), "d"))

    # The key sequence splits in no kernel: k is gathered for each, the work is whole.
    keys, _, collectives = _work(analysis, unit, ops, "d=2", ("k", 2))
    assert keys == pytest.approx(flops)
    assert {(ops[fwd], 3), (ops[dkv], 3)} <= {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}


def _mqa_splash_text(block: int) -> str:
    """make_splash_mqa's forward, blocks of ``block`` rows: q [4, 256, 64], one key/value head, k and v [256, 64]
    bf16 (no heads dim to group)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

    blocks = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    mask = splash_mask.MultiHeadMask(masks=(splash_mask.CausalMask(shape=(GQA_S, GQA_S)),) * GQA_H)
    kernel = splash.make_splash_mqa(mask=mask, head_shards=1, q_seq_shards=1, block_sizes=blocks)

    def attend(q, k, v):
        return kernel(q, k, v)

    q = jax.ShapeDtypeStruct((GQA_H, GQA_S, D), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((GQA_S, D), jnp.bfloat16)
    return jax.jit(attend).trace(q, kv, kv).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)


def test_multi_query_splash_splits_its_heads_freely_and_its_forward_the_query_sequence_of_blocks(unit):
    analysis = analyze(read_text(_mqa_splash_text(128)), engine="embedded")
    assert analysis.invalid == () and analysis.unpriced_ops == ()
    ops = _kernels(analysis)
    assert set(ops) == {"splash_mqa_fwd_no_residuals"}
    whole = 4 * GQA_H * GQA_S * GQA_S * D  # 67108864
    assert _flops(analysis, unit, ops)[0] == pytest.approx({"splash_mqa_fwd_no_residuals": whole})
    # The 4 heads over 4 devices: a quarter each, k and v whole on every device.
    heads, collectives = _flops(analysis, unit, ops, "d=4", ("q", 0))
    assert heads == pytest.approx({"splash_mqa_fwd_no_residuals": whole / 4}) and collectives == []
    # The query sequence over 2 (one q block each): half.
    seq, collectives = _flops(analysis, unit, ops, "d=2", ("q", 1))
    assert seq == pytest.approx({"splash_mqa_fwd_no_residuals": whole / 2}) and collectives == []

    # One block of the whole sequence: the call cannot split it (its local sequence would be shorter than its
    # block), and does not forbid the split elsewhere: q is gathered for it, its work whole.
    analysis = analyze(read_text(_mqa_splash_text(GQA_S)), engine="embedded")
    assert analysis.invalid == () and analysis.unpriced_ops == () and analysis.major_factors == {}
    ops = _kernels(analysis)
    seq, collectives = _flops(analysis, unit, ops, "d=2", ("q", 1))
    assert seq == pytest.approx({"splash_mqa_fwd_no_residuals": whole})
    assert [(c.kind, c.op, c.operand) for c in collectives] == [("all-gather", ops["splash_mqa_fwd_no_residuals"], 2)]


# cuDNN's fused attention: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn") lowered on an
# H100 (benchmarks/gpu_attention.py), bf16, q [2, 256, 8, 64] ([batch, seq, heads, head dim]: BTNH), k and v
# [2, 256, 2, 64] (2 key/value heads: grouped-query attention, 4 query heads per key/value head), forward
# (cudnn_fmha_fwd.mlir) and value_and_grad (cudnn_fmha_grad.mlir: the forward with its statistics, then the backward);
# cudnn_fmha_variants.json: the other forms at those shapes. The arguments are %arg0 (q), %arg1 (k), %arg2 (v).
KERNELS = Path(__file__).parent / "fixtures" / "kernels"
FWD, BWD = "__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"
CUDNN_SQUARE = 2 * 8 * 256 * 256 * 64  # 67108864: one S x S attention matmul of the 8 query heads (B H S S D)
# Bytes: q, o, dO, dQ [2, 256, 8, 64] bf16; k, v, dK, dV [2, 256, 2, 64]; the statistics [2, 8, 256] f32; the
# workspace u8[0] none.
Q_BYTES, KV_BYTES, STATS_BYTES = 2 * 256 * 8 * 64 * 2, 2 * 256 * 2 * 64 * 2, 2 * 8 * 256 * 4  # 524288, 131072, 16384


def _cudnn_text(name: str) -> str:
    if name in ("fwd", "grad"):
        return (KERNELS / f"cudnn_fmha_{name}.mlir").read_text()
    return json.loads((KERNELS / "cudnn_fmha_variants.json").read_text())["cases"][name]


def _cudnn_calls(analysis) -> dict[str, int]:
    """call target -> op id of the program's cuDNN calls."""
    return {str(op.attr("call_target_name")): op.id for op in analysis.program.ops
            if str(op.attr("call_target_name", "")).startswith("__cudnn$fmha")}


def _kernel_collectives(collectives: list, ops: dict[str, int]) -> list:
    """The collectives of the kernels' operands (not of the loss's sum, all-reduced where its dims split)."""
    return [c for c in collectives if c.op in ops.values()]


def test_a_cudnn_call_is_read_with_its_backend_config():
    program = read_text(_cudnn_text("grad"))
    calls = [op for op in program.ops if op.kind == "stablehlo.custom_call"]
    assert [op.attr("call_target_name") for op in calls] == [FWD, BWD]
    forward, backward = (dict(op.attr("kernel_config")) for op in calls)
    # Read from the JSON: the mask, and the query's batch dims of a dot each computes (jax writes ["0", "2"]).
    assert forward["mask_type"] == backward["mask_type"] == "CAUSAL"
    assert forward["bmm1_dot_dimension_numbers.lhs_batch_dimensions"] == "0,2"
    assert backward["bmm2_grad_gemm2_dot_dimension_numbers.lhs_batch_dimensions"] == "0,2"
    assert (forward["fmha_scale"], forward["is_flash_attention"], forward["sliding_window_length"]) == (
        "0.125", "true", "0")
    facts, _ = program_facts(program)
    assert (calls[0].id, "mask_type", "CAUSAL") in facts["kernel_config"]
    # The BNTH layout's query is [batch, heads, seq, dim]: batch dims 0 and 1.
    bnth = [op for op in read_text(_cudnn_text("grad_bnth")).ops if op.kind == "stablehlo.custom_call"]
    assert dict(bnth[0].attr("kernel_config"))["bmm1_dot_dimension_numbers.lhs_batch_dimensions"] == "0,1"


@pytest.mark.parametrize("engine", engines())
def test_cudnn_causal_attention_is_half_the_square_and_splits_batch_and_heads(engine, unit):
    analysis = analyze(read_text(_cudnn_text("grad")), engine=engine)
    assert analysis.invalid == () and analysis.unpriced_ops == () and analysis.unruled_ops == ()
    ops = _cudnn_calls(analysis)
    # Causal: each matmul over half the S x S square. Forward: Q K^T and P V; backward: Q K^T (recomputed), dO V^T,
    # P^T dO, dS K and dS^T Q; 2 x CUDNN_SQUARE each over the whole square.
    flops, moved, collectives = _work(analysis, unit, ops)
    assert flops == pytest.approx({FWD: 2 * CUDNN_SQUARE, BWD: 5 * CUDNN_SQUARE})
    assert 2 * CUDNN_SQUARE == 134217728  # 2 B H S^2 D
    # Forward: q, k, v -> o, the statistics. Backward: q, k, v, the statistics, dO, o -> dQ, dK, dV.
    assert moved == {FWD: 2 * Q_BYTES + 2 * KV_BYTES + STATS_BYTES, BWD: 4 * Q_BYTES + 4 * KV_BYTES + STATS_BYTES}
    assert moved == {FWD: 1327104, BWD: 2637824} and collectives == []

    half = {name: value / 2 for name, value in flops.items()}
    # The batch: half of everything, no collective at the kernels.
    batch, batch_moved, collectives = _work(analysis, unit, ops, "d=2", ("%arg0", 0))
    assert batch == pytest.approx(half) and batch_moved == {name: value / 2 for name, value in moved.items()}
    assert _kernel_collectives(collectives, ops) == []
    # The query's heads: the key/value heads split with them (query head h reads key/value head h // 4): each device
    # holds 4 query heads and their 1 key/value head, half of everything, no collective.
    assert analysis.color_of[analysis.dim_name("%arg0", 2)] == analysis.color_of[analysis.dim_name("%arg1", 2)]
    heads, heads_moved, collectives = _work(analysis, unit, ops, "d=2", ("%arg0", 2))
    assert heads == pytest.approx(half) and heads_moved == {name: value / 2 for name, value in moved.items()}
    assert _kernel_collectives(collectives, ops) == []
    # The query sequence: a causal mask is of absolute rows (a split call would mask by its local ones), so the
    # forward reads q whole (all-gathered) and does all its work on each device; the backward reduces over it.
    seq, _, collectives = _work(analysis, unit, ops, "d=2", ("%arg0", 1))
    assert seq == pytest.approx(flops)
    assert (ops[FWD], 0) in {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}
    # The key sequence: both reduce over it; k is all-gathered.
    keys, _, collectives = _work(analysis, unit, ops, "d=2", ("%arg1", 1))
    assert keys == pytest.approx(flops)
    assert (ops[FWD], 1) in {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}


def test_cudnn_attention_without_a_mask_is_the_whole_square_and_its_forward_splits_the_query_sequence(unit):
    analysis = analyze(read_text(_cudnn_text("grad_nomask")), engine="embedded")
    assert analysis.invalid == () and analysis.unpriced_ops == () and analysis.unruled_ops == ()
    ops = _cudnn_calls(analysis)
    flops, _, _ = _work(analysis, unit, ops)
    assert flops == pytest.approx({FWD: 4 * CUDNN_SQUARE, BWD: 10 * CUDNN_SQUARE})
    # Each query row on its own: the forward halves with no collective; the backward reads q whole.
    seq, _, collectives = _work(analysis, unit, ops, "d=2", ("%arg0", 1))
    assert seq == pytest.approx({FWD: 2 * CUDNN_SQUARE, BWD: 10 * CUDNN_SQUARE})
    gathered = {(c.op, c.operand) for c in collectives if c.kind == "all-gather"}
    assert (ops[BWD], 0) in gathered and not {(ops[FWD], k) for k in range(3)} & gathered


@pytest.mark.parametrize(("case", "heads_dim", "targets"), [
    ("fwd", 2, (FWD,)),  # inference: o and the workspace, no statistics
    ("grad_bias", 2, ("__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaScaleBiasSoftmaxBackward")),  # dBias result
    ("grad_padding", 2, (FWD, BWD)),  # PADDING_CAUSAL, sequence lengths [2] i32 after the tensors
    ("grad_window", 2, (FWD, BWD)),  # a sliding window of 64: priced as the half square (not modelled)
    ("grad_dropout", 2, ("__cudnn$fmhaSoftmaxDropout", "__cudnn$fmhaSoftmaxDropoutBackward")),
    ("grad_bnth", 1, (FWD, BWD)),  # q [2, 8, 256, 64]
    # FP8 (f8E4M3FN): q, k, v [2, 256, 4, 128] (head dim 128 for FP8 training): 2 x 4 x 256 x 256 x 128 is
    # CUDNN_SQUARE too. Six scale factors forward, twelve backward; amax results.
    ("fwd_fp8", 2, ("__cudnn$fmhaSoftmaxF8",)),
    ("grad_fp8", 2, ("__cudnn$fmhaSoftmaxF8", "__cudnn$fmhaSoftmaxBackwardF8")),
])
def test_each_cudnn_form_is_ruled_priced_causal_and_split_by_heads(case, heads_dim, targets, unit):
    analysis = analyze(read_text(_cudnn_text(case)), engine="embedded")
    assert analysis.invalid == () and analysis.unpriced_ops == () and analysis.unruled_ops == ()
    ops = _cudnn_calls(analysis)
    assert tuple(ops) == targets
    flops, _, _ = _work(analysis, unit, ops)
    causal = dict(zip(targets, (2 * CUDNN_SQUARE, 5 * CUDNN_SQUARE), strict=False))
    assert flops == pytest.approx(causal)
    heads, _, collectives = _work(analysis, unit, ops, "d=2", ("%arg0", heads_dim))
    assert heads == pytest.approx({name: value / 2 for name, value in causal.items()})
    assert _kernel_collectives(collectives, ops) == []


def test_grouped_query_heads_split_only_by_a_divisor_of_the_key_value_heads():
    analysis = analyze(read_text(_cudnn_text("fwd")), engine="embedded")
    model = ShardingModel(analysis, parse_mesh("d=4"))
    # 8 query heads over 4 devices would leave half a key/value head (of 2) to each: k's heads split with them.
    with pytest.raises(InvalidState, match=re.escape("%arg1[2] has 2 elements, not divisible by the 4 devices")):
        model.apply(model.initial(), Action(int(analysis.color_of[analysis.dim_name("%arg0", 2)]), "d"))


@pytest.mark.parametrize(("kv_heads", "rules", "check", "detail"), [
    # 3 key/value heads for 8 query heads.
    (3, "", "kernel_group",
     "op 2 (BTNH of @__cudnn$fmhaSoftmax): heads dims of 8 elements grouped over kv_heads dims of 3"),
    # A user's second, odd coefficient: a causal call cannot halve it.
    (2, 'attention_flops("__cudnn$fmhaSoftmax", "BTNH", 5).\n', "causal_flops_odd",
     "op 2 (BTNH of @__cudnn$fmhaSoftmax): causal, coefficient 5"),
])
def test_a_cudnn_call_the_rules_cannot_price_is_invalid_at_its_kernel_form(kv_heads, rules, check, detail, tmp_path):
    text = _cudnn_text("fwd").replace("2x256x2x64xbf16", f"2x256x{kv_heads}x64xbf16")
    analysis = analyze(read_text(text), engine="embedded", rules=_rules(tmp_path, rules) if rules else None,
                       check_invariants=False)
    kernels = (Path(__file__).parent.parent / "rules" / "ops" / "kernels.dl").read_text().splitlines()
    line = 1 + next(n for n, text in enumerate(kernels) if text.startswith("kernel_form(") and "cudnn_form" in text)
    assert {(row.check, Path(row.file).name, row.line, row.detail) for row in analysis.invalid} == {
        (check, "kernels.dl", line, detail)}
