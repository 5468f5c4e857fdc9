"""The XLA check (``toast.xla.worker``): XLA's SPMD partitioner on host CPU devices.

Worker-backed tests lower the two-layer MLP of ``toast.examples.mlp`` with JAX's own sharding
annotations (one worker call per lowering, cached per module) and check the text in a second
worker of 8 host devices; the parsers and the output comparison are tested in-process.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from toast.errors import ToastError
from toast.examples.mlp import mlp
from toast.xla.groups import group_axes, parse_groups
from toast.xla.hlo_text import HloShape, parse_instruction
from toast.xla.numerics import compare_outputs
from toast.xla.worker import (
    _strip_shardings,
    check_sharded_module,
    lower_sharded,
)

MESH = [("batch", 4), ("model", 2)]
BATCH_ONLY = ([["batch", None], [None, None], [None, None]], [["batch", None]])
MEGATRON = ([["batch", None], [None, "model"], ["model", None]], [["batch", None]])
SHARD_BYTES = 256 // 4 * 16 * 4  # one [64, 16] f32 shard of the output


def mlp_constrained():
    """The MLP with its hidden activation constrained to [batch, model] (a factory for the worker)."""
    _, args = mlp()

    def constrained(x, w1, w2):
        y = jax.lax.with_sharding_constraint(x @ w1, jax.sharding.PartitionSpec("batch", "model"))
        return jax.nn.relu(y) @ w2

    return constrained, args


def _lowered(source: str, specs: tuple, shardy: bool | None = None) -> str:
    """JAX's annotated text for ``source`` on ``MESH`` (one worker call per distinct request)."""
    frozen = tuple(tuple(tuple(spec) for spec in group) for group in specs)
    return _lowered_once(source, frozen, shardy)


@functools.cache
def _lowered_once(source: str, specs: tuple, shardy: bool | None) -> str:
    in_specs, out_specs = ([list(spec) for spec in group] for group in specs)
    return lower_sharded(source, MESH, in_specs=in_specs, out_specs=out_specs, shardy=shardy, timeout_s=300)


def test_batch_sharding_matches_without_collectives():
    text = _lowered("toast.examples.mlp:mlp", BATCH_ONLY)
    assert '#sdy.sharding<@mesh, [{"batch"}, {}]>' in text
    report = check_sharded_module(text, MESH, timeout_s=300)
    assert report.numerics.match and report.numerics.outputs == 1
    assert report.numerics.max_abs_error < 1e-5
    assert report.collectives == ()
    assert report.memory["argument_size_in_bytes"] > 0


def test_megatron_gives_one_all_reduce_over_model():
    text = _lowered("toast.examples.mlp:mlp", MEGATRON)
    report = check_sharded_module(text, MESH, seed=1, timeout_s=300)
    assert report.numerics.match
    [collective] = report.collectives
    assert collective.kind == "all-reduce"
    assert collective.axes == ("model",)
    assert collective.groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert (collective.dtype, collective.shape) == ("f32", (64, 16))
    assert collective.bytes_in == collective.bytes_out == SHARD_BYTES
    assert report.memory["argument_size_in_bytes"] > 0
    assert report.memory["output_size_in_bytes"] == SHARD_BYTES


def test_shardy_constraint_on_an_intermediate():
    text = _lowered("tests.test_xla_check:mlp_constrained", BATCH_ONLY)
    assert 'sdy.sharding_constraint %0 <@mesh, [{"batch"}, {"model"}]>' in text
    report = check_sharded_module(text, MESH, timeout_s=300)
    assert report.numerics.match
    assert [(c.kind, c.axes, c.bytes_out) for c in report.collectives] == [("all-reduce", ("model",), SHARD_BYTES)]


def test_gspmd_form_with_constraint():
    text = _lowered("tests.test_xla_check:mlp_constrained", MEGATRON, shardy=False)
    assert 'mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"' in text
    assert 'stablehlo.custom_call @Sharding(%0) {backend_config = "", mhlo.sharding = "{devices=[4,2]<=[8]}"}' in text
    report = check_sharded_module(text, MESH, timeout_s=300)
    assert report.numerics.match
    assert [(c.kind, c.axes, c.bytes_out) for c in report.collectives] == [("all-reduce", ("model",), SHARD_BYTES)]


def test_mesh_that_does_not_fit_the_module_is_one_line_error():
    text = _lowered("toast.examples.mlp:mlp", MEGATRON)
    expected = r"^XLA check worker failed: the module is partitioned for 8 devices, the mesh has 4$"
    with pytest.raises(ToastError, match=expected):
        check_sharded_module(text, [("batch", 2), ("model", 2)], timeout_s=300)


# ---- in-process: parsers and comparison ------------------------------------------------


def test_parse_groups_explicit_empty_and_iota():
    assert parse_groups("{{0,2},{1,3}}", 4) == ((0, 2), (1, 3))
    assert parse_groups("{}", 4) == ((0, 1, 2, 3),)
    assert parse_groups("[4,2]<=[8]", 8) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert parse_groups("[2,4]<=[4,2]T(1,0)", 8) == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_parse_groups_mesh_axes_form():
    # XLA's own mesh (axis_0/1/2), iota or with device_ids, and Shardy sub-axes.
    assert parse_groups("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}", 8) == ((0, 2, 4, 6), (1, 3, 5, 7))
    with_ids = "mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}"
    assert parse_groups(with_ids, 8) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert parse_groups("mesh['a'=8] {'a':(1)2}", 8) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert parse_groups("mesh['a'=8] {'a':(2)2}", 8) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert parse_groups("mesh['a'=4,'b'=2] {}", 8) == tuple((i,) for i in range(8))
    line = ("%all-gather = f32[32,64]{1,0} all-gather(%param.1), channel_id=2, replica_groups=mesh['axis_0'=2,"
            "'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, dimensions={0}, use_global_device_ids=true")
    attributes = parse_instruction(line).attributes
    assert attributes["replica_groups"] + ", device_ids=" + attributes["device_ids"] == with_ids


def test_strip_shardings_leaves_a_one_device_module():
    from jax.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    text = _lowered("tests.test_xla_check:mlp_constrained", MEGATRON)
    context = jax_mlir.make_ir_context()
    with context:
        stripped = _strip_shardings(ir.Module.parse(text))
    assert "sdy" not in stripped and "mhlo.sharding" not in stripped
    assert "mhlo.num_partitions = 1 : i32" in stripped
    assert stripped.count("stablehlo.dot_general") == 2


def test_group_axes_follow_row_major_mesh():
    assert group_axes([(0, 1), (2, 3), (4, 5), (6, 7)], MESH) == ("model",)
    assert group_axes([(0, 2, 4, 6), (1, 3, 5, 7)], MESH) == ("batch",)
    assert group_axes([tuple(range(8))], MESH) == ("batch", "model")
    assert group_axes([(0,), (1,)], MESH) == ()
    assert group_axes([(0, 1), (1, 2)], MESH) == ("batch", "model")  # permute pairs


def test_parse_instruction_tuple_shape_and_attributes():
    line = ('ROOT %ag-start = (f32[64,16]{1,0}, f32[256,16]{1,0}) all-gather-start(%p), channel_id=3, '
            'replica_groups={{0,2,4,6},{1,3,5,7}}, dimensions={0}, metadata={op_name="a, b=c" source_line=2}')
    parsed = parse_instruction(line)
    assert parsed.name == "ag-start" and parsed.opcode == "all-gather-start"
    assert parsed.shapes == (HloShape("f32", (64, 16)), HloShape("f32", (256, 16)))
    assert parsed.attributes["replica_groups"] == "{{0,2,4,6},{1,3,5,7}}"
    assert parsed.attributes["dimensions"] == "{0}"
    assert HloShape("bf16", (3, 5)).nbytes == 30 and HloShape("pred", ()).nbytes == 1


def test_compare_flags_a_wrong_shard():
    from jaxlib import xla_client

    device = jax.devices("cpu")[0]
    reference = np.arange(12, dtype=np.float32).reshape(3, 4)
    replicated = [xla_client.HloSharding.replicate().to_proto()]
    good = compare_outputs([[jax.device_put(reference, device)]], [reference], replicated, [device])
    assert good == {"match": True, "max_abs_error": 0.0, "outputs": 1, "nan_values": 0, "nan_mismatches": 0}
    bad = compare_outputs([[jax.device_put(reference + 1e-2, device)]], [reference], replicated, [device])
    assert not bad["match"] and bad["max_abs_error"] == pytest.approx(1e-2, rel=1e-2)
