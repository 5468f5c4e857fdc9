"""Sharding annotations (rules/ops/sharding.dl) and the pins they record (``Analysis.pins``).

A constraint (``jax.lax.with_sharding_constraint``, ``sdy.reshard``, GSPMD's ``@Sharding``)
passes its value through dim for dim: a program analyzes with the colors of the same program
without constraints, and toast re-reads its own ``--emit`` output. The requested sharding is
recorded as a pin. Manual regions (shard_map) connect only the dims their manual axes leave
whole.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from conftest import analysis_of, engines
from jax.sharding import AbstractMesh, AxisType, PartitionSpec

from toast import ShardingModel, analyze, manual_strategy, parse_mesh, read_text, sharded_module_text
from toast.resources import resource_dir
from toast.sharding import roles_for_input

GPT = "toast.examples.gpt:gpt_small"
MESH = AbstractMesh((4, 2), ("batch", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
MLP_ARGS = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 32), jnp.float32),
            jax.ShapeDtypeStruct((32, 4), jnp.float32))


def _mlp_text(constrain: bool) -> str:
    """A two-layer MLP lowered on an abstract 4x2 mesh (no devices needed), with or without a
    ``with_sharding_constraint`` on the hidden activation."""

    def mlp(x, w1, w2):
        h = jnp.maximum(x @ w1, 0)
        if constrain:
            h = jax.lax.with_sharding_constraint(h, PartitionSpec("batch", "model"))
        return h @ w2

    with jax.sharding.use_abstract_mesh(MESH):
        return jax.jit(mlp).lower(*MLP_ARGS).as_text(debug_info=True)


def _interface_partition(analysis) -> set[frozenset[str]]:
    """The colors restricted to the dims of @main's arguments and results (names the two
    programs share), as a partition."""
    program = analysis.program
    interface = {program.values[v].name for v in program.arguments + program.results}
    parts = ({f"{d.value}:{d.dim}" for d in color.dims if d.value in interface} for color in analysis.colors)
    return {frozenset(p) for p in parts if p}


@pytest.mark.parametrize("engine", engines())
def test_with_sharding_constraint_keeps_the_colors_of_the_unconstrained_mlp(engine):
    plain = analyze(read_text(_mlp_text(False), source="mlp.mlir"), engine=engine)
    text = _mlp_text(True)
    assert "sdy.sharding_constraint" in text
    constrained = analyze(read_text(text, source="mlp_constrained.mlir"), engine=engine)
    assert constrained.unruled_ops == ()
    assert constrained.invalid == ()
    assert len(constrained.colors) == len(plain.colors) == 4
    assert _interface_partition(constrained) == _interface_partition(plain)
    (pin,) = constrained.pins
    assert pin.kind == "sdy.sharding_constraint"
    assert pin.axes == (("batch",), ("model",))
    assert pin.open == (False, False) and pin.tiles is None
    assert pin.sharding == '<@mesh, [{"batch"}, {"model"}]>'
    assert pin.loc.startswith(__file__)  # the user's with_sharding_constraint line
    assert constrained.program.values[pin.value_id].name == pin.value
    constraint = next(op for op in constrained.program.ops if op.kind == "sdy.sharding_constraint")
    assert constraint.results == (pin.value_id,)
    assert plain.pins == ()


def test_an_open_dim_of_a_constraint_is_recorded_open():
    text = _mlp_text(True).replace('[{"batch"}, {"model"}]', '[{"batch", ?}, {?}]')
    (pin,) = analyze(read_text(text), engine="embedded").pins
    assert pin.axes == (("batch",), ())
    assert pin.open == (True, True)
    assert pin.sharding == '<@mesh, [{"batch", ?}, {?}]>'


@pytest.mark.parametrize("engine", engines())
def test_toast_reads_its_own_emitted_gpt_small(engine):
    original = analysis_of(GPT)
    assert original.unruled_ops == ()
    model = ShardingModel(original, parse_mesh("batch=2,model=2"))
    state, _ = manual_strategy(model, "megatron", roles_for_input(GPT))
    text = sharded_module_text(model, state)
    constraints = text.count("sdy.sharding_constraint")
    assert constraints > 100
    emitted = analyze(read_text(text, source="gpt_small.sharded.mlir"), engine=engine)
    assert emitted.unruled_ops == ()
    assert emitted.invalid == ()
    assert len(emitted.colors) == len(original.colors)
    assert _interface_partition(emitted) == _interface_partition(original)
    # Every constraint toast wrote is a pin, asking for the state's axes.
    assert len(emitted.pins) == constraints
    axes_used = {axis for pin in emitted.pins for dim in pin.axes or () for axis in dim}
    assert axes_used == {"batch", "model"}
    for pin in emitted.pins[:50]:
        value = emitted.program.values[pin.value_id]
        assert len(pin.axes or ()) == len(value.shape)


# ---- one op per fixture ---------------------------------------------------------------------


def _module(signature: str, body: str) -> str:
    """A module with a 2x2 mesh and a ``@main``; ``%x: T`` arguments get ``loc("x")``."""
    arguments, results = signature.split(") -> (")
    named = ", ".join(f'{arg} loc("{arg.split(":")[0].strip()[1:]}")' for arg in arguments.split(", "))
    return ('module {\n  sdy.mesh @mesh = <["a"=2, "b"=2]>\n'
            f"  func.func @main({named}) -> ({results}) {{\n{body}\n  }}\n}}\n")


X = "%x: tensor<4x6xf32>) -> (tensor<4x6xf32>"
SAME = [{"x:0", "result[0]:0"}, {"x:1", "result[0]:1"}]

FIXTURES = {
    "sdy.reshard: pass-through, pinned": (
        _module(X, '    %0 = sdy.reshard %x <@mesh, [{"a"}, {"b"}]> : tensor<4x6xf32>\n'
                   "    return %0 : tensor<4x6xf32>"),
        SAME,
    ),
    "custom_call @Sharding (GSPMD): pass-through, pinned with tiles": (
        _module(X, '    %0 = stablehlo.custom_call @Sharding(%x) {mhlo.sharding = "{devices=[2,1,2]<=[4] '
                   'last_tile_dim_replicate}"} : (tensor<4x6xf32>) -> tensor<4x6xf32>\n'
                   "    return %0 : tensor<4x6xf32>"),
        SAME,
    ),
    "sdy.propagation_barrier: pass-through": (
        _module(X, "    %0 = sdy.propagation_barrier %x allowed_direction=NONE : tensor<4x6xf32>\n"
                   "    return %0 : tensor<4x6xf32>"),
        SAME,
    ),
    "sdy.all_gather: the global tensor keeps its dims": (
        _module(X, '    %0 = sdy.sharding_constraint %x <@mesh, [{"a"}, {"b"}]> : tensor<4x6xf32>\n'
                   '    %1 = sdy.all_gather [{}, {"b"}] %0 out_sharding=<@mesh, [{"a"}, {}]> : tensor<4x6xf32>\n'
                   "    return %1 : tensor<4x6xf32>"),
        [{"x:0", "%0:0", "result[0]:0"}, {"x:1", "%0:1", "result[0]:1"}],
    ),
    "sdy.sharding_group: members of one group alike, another group apart": (
        _module("%x: tensor<4x6xf32>, %y: tensor<4x6xf32>, %z: tensor<4x6xf32>) -> (tensor<4x6xf32>",
                "    sdy.sharding_group %x group_id=0 : tensor<4x6xf32>\n"
                "    sdy.sharding_group %y group_id=0 : tensor<4x6xf32>\n"
                "    sdy.sharding_group %z group_id=1 : tensor<4x6xf32>\n"
                "    return %z : tensor<4x6xf32>"),
        [{"x:0", "y:0"}, {"x:1", "y:1"}, {"z:0"}, {"z:1"}],
    ),
    "sdy.named_computation: operands to block args, sdy.return to results": (
        _module(X, '    %0 = sdy.named_computation<"f">(%x) (%l: tensor<4x6xf32>) {\n'
                   "      %1 = stablehlo.negate %l : tensor<4x6xf32>\n"
                   "      sdy.return %1 : tensor<4x6xf32>\n"
                   "    } : (tensor<4x6xf32>) -> tensor<4x6xf32>\n"
                   "    return %0 : tensor<4x6xf32>"),
        [{"x:0", "%arg1:0", "%1:0", "result[0]:0"}, {"x:1", "%arg1:1", "%1:1", "result[0]:1"}],
    ),
    "sdy.manual_computation: dims the manual axes leave whole are connected, split dims are not": (
        _module(X, '    %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"a"}, {}]>] '
                   'out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a"} (%l: tensor<2x6xf32>) {\n'
                   "      %1 = stablehlo.negate %l : tensor<2x6xf32>\n"
                   "      sdy.return %1 : tensor<2x6xf32>\n"
                   "    } : (tensor<4x6xf32>) -> tensor<4x6xf32>\n"
                   "    return %0 : tensor<4x6xf32>"),
        [{"x:1", "%arg1:1", "%1:1", "result[0]:1"}, {"x:0"}, {"%arg1:0", "%1:0"}, {"result[0]:0"}],
    ),
    "@SPMDFullToShardShape / @SPMDShardToFullShape: the same for the GSPMD form": (
        _module(X, '    %0 = stablehlo.custom_call @SPMDFullToShardShape(%x) {mhlo.sharding = "{manual}"} :'
                   " (tensor<4x6xf32>) -> tensor<2x6xf32>\n"
                   "    %1 = stablehlo.negate %0 : tensor<2x6xf32>\n"
                   '    %2 = stablehlo.custom_call @SPMDShardToFullShape(%1) {mhlo.sharding = "{devices=[2,1,2]<=[4] '
                   'last_tile_dim_replicate}"} : (tensor<2x6xf32>) -> tensor<4x6xf32>\n'
                   "    return %2 : tensor<4x6xf32>"),
        [{"x:1", "%0:1", "%1:1", "result[0]:1"}, {"x:0"}, {"%0:0", "%1:0"}, {"result[0]:0"}],
    ),
}


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("name", FIXTURES)
def test_sharding_op_fixture(name, engine):
    text, expected = FIXTURES[name]
    analysis = analyze(read_text(text, source="fixture.mlir"), engine=engine)
    assert analysis.invalid == ()
    assert analysis.unruled_ops == ()
    colors = {frozenset(f"{d.value}:{d.dim}" for d in color.dims) for color in analysis.colors if color.dims}
    assert colors == {frozenset(c) for c in expected}


def test_reshard_and_gspmd_sharding_are_pins():
    (reshard,) = analyze(read_text(FIXTURES["sdy.reshard: pass-through, pinned"][0]), engine="embedded").pins
    assert (reshard.kind, reshard.value, reshard.axes, reshard.tiles) == (
        "sdy.reshard", "result[0]", (("a",), ("b",)), None)
    gspmd = analyze(read_text(FIXTURES["custom_call @Sharding (GSPMD): pass-through, pinned with tiles"][0]),
                    engine="embedded")
    (pin,) = gspmd.pins
    assert (pin.kind, pin.axes, pin.tiles) == ("stablehlo.custom_call @Sharding", None, (2, 1))
    assert pin.sharding == "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"
    # shard_map's {manual} plumbing asks for nothing.
    manual = FIXTURES["@SPMDFullToShardShape / @SPMDShardToFullShape: the same for the GSPMD form"][0]
    assert analyze(read_text(manual), engine="embedded").pins == ()


def test_every_sdy_op_is_ruled():
    """Each op of the Shardy dialect the bindings know (but the module-level sdy.mesh) is named
    in rules/ops/sharding.dl and has a kernel class: a new sdy op fails here until it gets its semantics."""
    from jaxlib.mlir.dialects import sdy

    rules = (resource_dir("rules") / "ops" / "sharding.dl").read_text()
    named = set(re.findall(r'(?:sharding_pass_through|ruled_kind)\("(sdy\.[a-z_]+)"\)', rules))
    kinds = {getattr(sdy, n).OPERATION_NAME for n in dir(sdy) if n.endswith("Op")} - {"sdy.mesh"}
    assert kinds and kinds <= named, sorted(kinds - named)
    # ... and priced: each has a kernel class (the tables are by kind: any program's analysis holds them).
    classified = set(analyze("toast.examples.mlp:mlp", engine="embedded").kernel_class)
    assert kinds <= classified, sorted(kinds - classified)
