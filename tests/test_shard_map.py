"""A ``jax.shard_map`` region (``sdy.manual_computation``) inside a jitted program, as MaxText calls its attention
kernels: each device's shard enters the region as it is, so a batch already split outside moves nothing there
(rules/ops/sharding.dl ``manual_dim``)."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec

from toast import (
    Action,
    CostModel,
    InvalidState,
    Roles,
    ShardingModel,
    analyze,
    load_hardware,
    manual_strategy,
    parse_mesh,
)
from toast.frontend import read_text
from toast.search import ActionSpace

DEVICES, BATCH, WIDTH = 4, 16, 32


def _program_text() -> str:
    """``y = shard_map(tanh, batch split 4 ways)(x @ w) @ w``: the region splits dim 0 of its operand."""
    mesh = AbstractMesh((DEVICES,), ("shards",), axis_types=(AxisType.Auto,))

    def step(x, w):
        inner = jax.shard_map(jnp.tanh, mesh=mesh, in_specs=PartitionSpec("shards"),
                              out_specs=PartitionSpec("shards"))
        return inner(x @ w) @ w

    args = (jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32), jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32))
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(step).trace(*args).lower(lowering_platforms=("cpu",)).as_text(debug_info=True)


@pytest.mark.parametrize("engine", ["embedded", "souffle"])
def test_the_region_takes_the_split_batch_as_it_is(engine):
    """The region's operand dim 0 (16 rows globally, 4 per device inside) is a manual dim; data parallel over
    the same 4 devices needs no collective at all (before: an all-gather of the whole [16, 32] f32 operand, 2 KiB,
    into the region), and the region's result, split like its uses, is 1/4 of it per device."""
    if engine == "souffle" and shutil.which("souffle") is None:
        pytest.skip("Soufflé is not installed")
    analysis = analyze(read_text(_program_text(), source="shard_map"), engine=engine)
    program = analysis.program
    regions = [op for op in program.ops if op.kind == "sdy.manual_computation"]
    assert len(regions) == 1
    assert analysis.manual_dims == frozenset({(regions[0].id, 0, 0)})
    model = ShardingModel(analysis, parse_mesh(f"data={DEVICES}"))
    state, _ = manual_strategy(model, "data_parallel", Roles({"batch": [("x", 0)]}))
    cost = CostModel(model, load_hardware("h100")).evaluate(state)
    assert cost.collectives == ()


def test_the_region_s_axes_split_nothing_else_of_its_operand():
    """Inside the region each device already holds its quarter of the batch: the 4 devices of data are taken.
    Splitting the operand's width over data too would split it 16 ways on 4 devices: refused by the state's check
    and by the search's incremental one (no action puts data on that width)."""
    analysis = analyze(read_text(_program_text(), source="shard_map"), engine="embedded")
    model = ShardingModel(analysis, parse_mesh(f"data={DEVICES}"))
    region = next(op for op in analysis.program.ops if op.kind == "sdy.manual_computation")
    width = analysis.names.use_name(region.id, 0, 1)
    color = int(analysis.color_of[width])
    with pytest.raises(InvalidState, match="manual axes"):
        model.apply(model.initial(), Action(color, "data"))
    space = ActionSpace(model, min_names=1)
    on_width = [index for index, action in enumerate(space.actions) if color in action.colors and action.axis == "data"]
    assert on_width
    assert all(space.step(space.initial_atoms, index) is None for index in on_width)
